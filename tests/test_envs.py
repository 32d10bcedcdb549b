"""Tests of `envs`: groups, shapes and dtypes, seeding, sync == subprocess, auto-reset with final
observations, dead agents, episode statistics, error messages, video, and the Gymnasium side.

Kept small (a few envs, a few dozen steps each) so the file runs in well under a minute on 2 cores.
`ScriptedEnv` below is a tiny PettingZoo parallel env whose every step is known in advance; the
tests reach it through the `"module:function"` id form.
"""

import os
import re
import sys
import time
import types

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

import envs
from envs.registry import REGISTRY, env_factory

MPE_IDS = [name for name, entry in REGISTRY.items() if entry.family == "mpe"]
MAGENT_SMALL = {
    "battle_v4": {"map_size": 12},
    "adversarial_pursuit_v4": {"map_size": 9},
    "tiger_deer_v4": {"map_size": 10},
    "gather_v5": {},
    "combined_arms_v6": {"map_size": 16},
    "battlefield_v5": {"map_size": 46},
}
MPE_GROUPS = {
    "simple_spread_v3": ["agent"],
    "simple_adversary_v3": ["adversary", "agent"],
    "simple_tag_v3": ["adversary", "agent"],
    "simple_speaker_listener_v4": ["speaker", "listener"],
    "simple_crypto_v3": ["eve", "bob", "alice"],
    "simple_world_comm_v3": ["leadadversary", "adversary", "agent"],
}


# --- a scripted env, reached as "test_envs:make_scripted_env" --------------------------------


class ScriptedEnv(ParallelEnv):
    """Three units with Discrete(4) actions and action masks; `unit_2` dies at step `die_at`.

    Reward of a unit = its action + 1. Observation = [step, unit index]. The env checks that it
    receives actions for exactly its living agents and only masked-in actions. Seeded with
    `crash_seed`, its step fails in the way `crash` says ("raise", "exit" or "hang").
    """

    metadata = {"name": "scripted_v0", "render_fps": 5}

    def __init__(self, max_cycles=6, die_at=2, crash_seed=None, crash="raise", dict_obs=False, render_mode=None):
        self.possible_agents = ["unit_0", "unit_1", "unit_2"]
        self.max_cycles, self.die_at = max_cycles, die_at
        self.crash_seed, self.crash, self.dict_obs = crash_seed, crash, dict_obs
        self.render_mode = render_mode
        self.seed_ = None
        box = spaces.Box(0.0, 100.0, (2,), np.float32)
        self._obs_space = spaces.Dict({"observation": box, "action_mask": spaces.MultiBinary(4)}) if dict_obs else box

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return spaces.Discrete(4)

    @staticmethod
    def mask(t, i):
        return np.array([1, (t + i) % 2, 1, 0], dtype=np.int8)

    def _observe(self):
        obs, infos = {}, {}
        for a in self.agents:
            i = self.possible_agents.index(a)
            o = np.array([self.t, i], np.float32)
            if self.dict_obs:
                obs[a], infos[a] = {"observation": o, "action_mask": self.mask(self.t, i)}, {}
            else:
                obs[a], infos[a] = o, {"action_mask": self.mask(self.t, i)}
        return obs, infos

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed_ = seed
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._observe()

    def step(self, actions):
        if self.seed_ == self.crash_seed:
            if self.crash == "exit":
                os._exit(3)
            if self.crash == "hang":
                time.sleep(60)
            raise RuntimeError("scripted crash")
        if sorted(actions) != sorted(self.agents):
            raise AssertionError(f"actions for {sorted(actions)}, living agents {self.agents}")
        for a, act in actions.items():
            if not self.mask(self.t, self.possible_agents.index(a))[act]:
                raise AssertionError(f"{a} took masked-out action {act}")
        self.t += 1
        rewards = {a: float(actions[a] + 1) for a in self.agents}
        terms = {a: a == "unit_2" and self.t == self.die_at for a in self.agents}
        truncs = {a: self.t >= self.max_cycles for a in self.agents}
        obs, infos = self._observe()
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def state(self):
        raise NotImplementedError

    def render(self):
        return np.full((16, 16, 3), 60 * self.t, np.uint8)


def make_scripted_env(**kwargs):
    return ScriptedEnv(**kwargs)


SCRIPTED = f"{__name__}:make_scripted_env"


# --- helpers ------------------------------------------------------------------------------------


def random_actions(vec, rng):
    """Uniform actions for every group (respecting action masks where there are any)."""
    return {g: random_group_actions(spec, vec.num_envs, rng) for g, spec in vec.groups.items()}


def random_group_actions(spec, num_envs, rng, avail=None):
    if not spec.discrete:
        return rng.uniform(-0.5, 1.5, (num_envs, spec.n_agents, spec.action_dim)).astype(np.float32)
    if avail is None:
        return rng.integers(0, spec.action_dim, (num_envs, spec.n_agents))
    scores = rng.random(avail.shape) + avail  # available actions always score higher
    return scores.argmax(-1)


def rollout(vec, steps, seed=0):
    """Reset, then `steps` random steps; every array of every result, for exact comparison."""
    rng = np.random.default_rng(seed)
    out = [flatten(vec.reset())]
    for _ in range(steps):
        result = vec.step(random_actions(vec, rng))
        out.append(
            flatten(result.next)
            + flatten(result.final)
            + [a for g in vec.groups for a in (result.rewards[g], result.terminated[g])]
            + [result.truncated, result.done]
            + [(e.env_index, e.length, e.episode_return, sorted(e.group_returns.items())) for e in result.episodes]
        )
    return out


def flatten(o):
    return (
        [o.state]
        + [o.obs[g] for g in o.obs]
        + [o.agent_mask[g] for g in o.obs]
        + list(o.avail_actions.values())
        + list(o.positions.values())
    )


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        for u, v in zip(x, y, strict=True):
            if isinstance(u, np.ndarray):
                assert u.dtype == v.dtype
                np.testing.assert_array_equal(u, v)
            else:
                assert u == v


def check_shapes(vec, result_or_obs, num_envs):
    o = getattr(result_or_obs, "next", result_or_obs)
    assert list(o.obs) == list(vec.groups)
    for g, spec in vec.groups.items():
        assert o.obs[g].shape == (num_envs, spec.n_agents, *spec.obs_shape)
        assert o.obs[g].dtype == spec.obs_dtype
        assert o.agent_mask[g].shape == (num_envs, spec.n_agents) and o.agent_mask[g].dtype == bool
    assert o.state.shape == (num_envs, *vec.state_shape)
    if hasattr(result_or_obs, "rewards"):
        r = result_or_obs
        for g, spec in vec.groups.items():
            assert r.rewards[g].shape == (num_envs, spec.n_agents) and r.rewards[g].dtype == np.float32
            assert r.terminated[g].shape == (num_envs, spec.n_agents) and r.terminated[g].dtype == bool
        assert r.truncated.shape == (num_envs,) and r.truncated.dtype == bool
        assert r.done.shape == (num_envs,) and r.done.dtype == bool


# --- groups, shapes, dtypes -------------------------------------------------------------------


@pytest.mark.parametrize("env_id", MPE_IDS)
def test_mpe_groups_shapes_and_dtypes(env_id):
    vec = envs.make(env_id, num_envs=2, seed=0)
    raw = REGISTRY[env_id]
    raw_env = __import__(raw.module, fromlist=["parallel_env"]).parallel_env()
    raw_obs, _ = raw_env.reset(seed=0)
    # Every agent in exactly one group, groups and agents in the env's order.
    assert [a for spec in vec.groups.values() for a in spec.agents] == raw_env.possible_agents
    if env_id in MPE_GROUPS:
        assert list(vec.groups) == MPE_GROUPS[env_id]
    for spec in vec.groups.values():
        assert spec.discrete and spec.obs_dtype == np.float32 and not spec.has_action_mask
        assert spec.action_dim == raw_env.action_space(spec.agents[0]).n
        assert spec.obs_shape == raw_env.observation_space(spec.agents[0]).shape
    assert vec.max_steps == 25
    obs = vec.reset()
    check_shapes(vec, obs, 2)
    # Env 0 reset with seed 0 is the raw env reset with seed 0; state is mpe2's own state().
    for g, spec in vec.groups.items():
        for j, agent in enumerate(spec.agents):
            np.testing.assert_array_equal(obs.obs[g][0, j], raw_obs[agent])
    np.testing.assert_array_equal(obs.state[0], raw_env.state())
    rng = np.random.default_rng(0)
    for _ in range(3):
        result = vec.step(random_actions(vec, rng))
        check_shapes(vec, result, 2)
        assert all(m.all() for m in result.next.agent_mask.values())
    vec.close()


@pytest.mark.parametrize("env_id", ["simple_spread_v3", "simple_speaker_listener_v4"])
def test_mpe_continuous_actions(env_id):
    vec = envs.make(env_id, num_envs=2, seed=0, continuous_actions=True)
    for spec in vec.groups.values():
        assert not spec.discrete
        assert spec.action_low.shape == spec.action_high.shape == (spec.action_dim,)
    vec.reset()
    rng = np.random.default_rng(0)
    actions = random_actions(vec, rng)  # partly outside [0, 1]: clipped, not an error
    result = vec.step(actions)
    check_shapes(vec, result, 2)
    for g, spec in vec.groups.items():
        np.testing.assert_array_equal(vec._buffers.actions[g], np.clip(actions[g], spec.action_low, spec.action_high))
    if env_id == "simple_spread_v3":
        with pytest.raises(ValueError, match=r"has shape \(2, 3\); expected .*\(2, 3, 5\) finite floats"):
            vec.step({"agent": np.zeros((2, 3), np.float32)})
    vec.close()


@pytest.mark.parametrize("env_id", list(MAGENT_SMALL))
def test_magent_groups_shapes_and_dtypes(env_id):
    vec = envs.make(env_id, num_envs=1, seed=0, max_cycles=10, **MAGENT_SMALL[env_id])
    expected = {
        "battle_v4": ["red", "blue"],
        "battlefield_v5": ["red", "blue"],
        "adversarial_pursuit_v4": ["predator", "prey"],
        "tiger_deer_v4": ["deer", "tiger"],
        "gather_v5": ["omnivore"],
        "combined_arms_v6": ["redmelee", "redranged", "bluemelee", "blueranged"],
    }[env_id]
    assert list(vec.groups) == expected
    assert all(spec.obs_dtype == np.float32 and len(spec.obs_shape) == 3 for spec in vec.groups.values())
    assert vec.spec.state_from_env and len(vec.state_shape) == 3
    check_shapes(vec, vec.reset(), 1)
    rng = np.random.default_rng(0)
    for _ in range(2):
        check_shapes(vec, vec.step(random_actions(vec, rng)), 1)
    vec.close()


def test_battle_shapes_at_small_map():
    vec = envs.make("battle_v4", num_envs=2, seed=0, map_size=12)
    assert [spec.agents for spec in vec.groups.values()] == [("red_0", "red_1"), ("blue_0", "blue_1")]
    obs = vec.reset()
    assert obs.obs["red"].shape == (2, 2, 13, 13, 5) and obs.obs["red"].dtype == np.float32
    assert obs.state.shape == (2, 12, 12, 5) and vec.max_steps == 1000
    vec.close()


def test_butterfly_envs_or_a_clear_missing_package_error():
    for env_id in ("knights_archers_zombies_v11", "cooperative_pong_v6", "pistonball_v6"):
        try:
            vec = envs.make(env_id, num_envs=1, seed=0)
        except envs.EnvNotAvailableError as err:
            assert env_id in str(err) and "missing" in str(err)
            continue
        obs = vec.reset()
        check_shapes(vec, obs, 1)
        check_shapes(vec, vec.step(random_actions(vec, np.random.default_rng(0))), 1)
        vec.close()


# --- seeding and vectorization ------------------------------------------------------------------


def test_same_seed_same_trajectory_and_other_seed_differs():
    a = rollout(envs.make("simple_spread_v3", num_envs=2, seed=3, max_cycles=10), 25)
    b = rollout(envs.make("simple_spread_v3", num_envs=2, seed=3, max_cycles=10), 25)
    assert_same(a, b)
    c = rollout(envs.make("simple_spread_v3", num_envs=2, seed=4, max_cycles=10), 25)
    assert not np.array_equal(a[0][0], c[0][0])
    # Env 1 of seed 3 starts like env 0 of seed 4: env i is seeded with seed + i.
    np.testing.assert_array_equal(a[0][0][1], c[0][0][0])
    # Auto-resets continue each env's generator: the second episode differs from the first.
    vec = envs.make("simple_spread_v3", num_envs=1, seed=3, max_cycles=2)
    first = vec.reset().state
    rng = np.random.default_rng(0)
    vec.step(random_actions(vec, rng))
    second = vec.step(random_actions(vec, rng)).next.state
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(vec.reset().state, first)  # reset() reseeds with make's seed


def test_sync_equals_subproc_mpe_with_torch_imported():
    torch = pytest.importorskip("torch")
    torch.ones(64, 64) @ torch.ones(64, 64)  # start torch's thread pool before forking
    kwargs = dict(num_envs=3, seed=7, max_cycles=8)
    sync = envs.make("simple_tag_v3", vector="sync", **kwargs)
    sub = envs.make("simple_tag_v3", vector="subproc", **kwargs)
    assert isinstance(sub, envs.SubprocVecEnv)
    assert_same(rollout(sync, 20), rollout(sub, 20))
    frame = sub.render(2)
    assert frame.shape == (700, 700, 3) and frame.dtype == np.uint8
    sub.close()
    assert not any(p.is_alive() for p in sub._procs)


def test_sync_equals_subproc_battle_and_scripted():
    kwargs = dict(num_envs=2, seed=1, map_size=12, max_cycles=15)
    assert_same(
        rollout(envs.make("battle_v4", **kwargs), 20), rollout(envs.make("battle_v4", vector="subproc", **kwargs), 20)
    )
    sync = envs.make(SCRIPTED, num_envs=2, seed=0)
    sub = envs.make(SCRIPTED, num_envs=2, seed=0, vector="subproc")
    runs = []
    for vec in (sync, sub):
        rng = np.random.default_rng(0)
        o = vec.reset()
        steps = [flatten(o)]
        for _ in range(8):
            r = vec.step({"unit": random_group_actions(vec.groups["unit"], 2, rng, o.avail_actions["unit"])})
            o = r.next
            steps.append(flatten(r.next) + flatten(r.final) + [r.rewards["unit"], r.done])
        runs.append(steps)
        vec.close()
    assert_same(*runs)


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_sync_equals_subproc_whatever_the_number_of_workers(workers):
    kwargs = dict(num_envs=5, seed=3, max_cycles=6)
    sub = envs.make("simple_adversary_v3", vector="subproc", num_workers=workers, **kwargs)
    assert sub.num_workers == workers and len(sub._procs) == workers
    assert_same(rollout(envs.make("simple_adversary_v3", **kwargs), 15), rollout(sub, 15))
    assert sub.render(4).shape == (700, 700, 3)  # env 4 lives in the last worker
    with pytest.raises(ValueError, match=r"env_index must be in \[0, 5\), got 5"):
        sub.render(5)
    sub.close()
    assert not any(p.is_alive() for p in sub._procs)
    with pytest.raises(ValueError, match=r"num_workers must be in \[1, num_envs=2\], got 3"):
        envs.make("simple_v3", num_envs=2, vector="subproc", num_workers=3)
    default = envs.make("simple_v3", num_envs=64, vector="subproc")  # default: one worker per CPU, at most E
    assert default.num_workers == min(64, len(os.sched_getaffinity(0)))
    default.close()


def test_subproc_with_spawn_start_method():
    factory = env_factory("simple_spread_v3", max_cycles=5)
    sub = envs.SubprocVecEnv(factory, 2, seed=5, state_from_obs=True, start_method="spawn")
    sync = envs.SyncVecEnv(factory, 2, seed=5, state_from_obs=True)
    assert_same(rollout(sync, 7), rollout(sub, 7))
    sub.close()


# --- auto-reset, final observations, dead agents, episode stats -----------------------------------


def test_auto_reset_keeps_the_final_observation():
    vec = envs.make("simple_spread_v3", num_envs=1, seed=11, max_cycles=5)
    raw = envs.registry.build_parallel_env("simple_spread_v3", max_cycles=5)
    agents = raw.possible_agents
    obs = vec.reset()
    raw_obs, _ = raw.reset(seed=11)
    np.testing.assert_array_equal(obs.obs["agent"][0], np.stack([raw_obs[a] for a in agents]))
    rng = np.random.default_rng(0)
    for t in range(1, 6):
        actions = rng.integers(0, 5, (1, 3))
        result = vec.step({"agent": actions})
        raw_obs, raw_rew, raw_term, raw_trunc, _ = raw.step(dict(zip(agents, actions[0].tolist(), strict=True)))
        raw_final = np.stack([raw_obs[a] for a in agents])
        np.testing.assert_array_equal(result.final.obs["agent"][0], raw_final)
        np.testing.assert_array_equal(result.final.state[0], raw.state())
        np.testing.assert_allclose(result.rewards["agent"][0], [raw_rew[a] for a in agents], rtol=1e-6)
        assert not result.terminated["agent"].any()
        if t < 5:
            assert not result.done[0] and not result.truncated[0] and result.final is result.next
            continue
        # Time limit: truncated, reset in place; `next` is the new episode (raw env continues its RNG).
        assert all(raw_trunc.values()) and result.done[0] and result.truncated[0]
        assert result.final.agent_mask["agent"].all()
        assert not np.array_equal(result.final.obs["agent"], result.next.obs["agent"])
        new_obs, _ = raw.reset()
        np.testing.assert_array_equal(result.next.obs["agent"][0], np.stack([new_obs[a] for a in agents]))
        np.testing.assert_array_equal(result.next.state[0], raw.state())
        (episode,) = result.episodes
        assert episode.env_index == 0 and episode.length == 5


@pytest.mark.parametrize("vector", ["sync", "subproc"])
def test_held_results_never_change(vector):
    """The vector env hands out copies: a held result, a view into one and a tensor over one keep their values
    through later steps and resets."""
    torch = pytest.importorskip("torch")
    vec = envs.make("battle_v4", num_envs=2, seed=0, map_size=12, max_cycles=9, vector=vector)
    rng = np.random.default_rng(0)
    try:
        first = vec.reset()
        kept = vec.step(random_actions(vec, rng))
        view = vec.step(random_actions(vec, rng)).next.obs["red"][1]  # keeps its array alive through `.base`
        tensor = torch.from_numpy(vec.step(random_actions(vec, rng)).next.obs["blue"])
        snapshots = [[a.copy() for a in flatten(first)], [a.copy() for a in flatten(kept.next)], view.copy(),
                     tensor.clone()]  # fmt: skip
        for _ in range(30):  # past resets (episodes of 9 steps)
            vec.step(random_actions(vec, rng))
        assert_same([flatten(first), flatten(kept.next)], snapshots[:2])
        np.testing.assert_array_equal(view, snapshots[2])
        assert torch.equal(tensor, snapshots[3])
    finally:
        vec.close()


def test_magent_dead_agents_are_masked_zeroed_and_skipped():
    vec = envs.make("battle_v4", num_envs=1, seed=0, map_size=12, max_cycles=400)
    obs = vec.reset()
    assert all(m.all() for m in obs.agent_mask.values())
    rng = np.random.default_rng(0)
    died = None
    for t in range(400):
        # Red charges (action 7 moves it towards blue) and attacks, blue attacks: someone dies soon.
        red = np.where(rng.random((1, 2)) < 0.5, 7, rng.integers(13, 21, (1, 2)))
        result = vec.step({"red": red, "blue": rng.integers(13, 21, (1, 2))})
        if result.done[0]:
            break
        dead = {g: ~m for g, m in result.next.agent_mask.items()}
        if died is None and any(d.any() for d in dead.values()):
            died = t
            for g, d in dead.items():
                # Died this step: terminated, masked and zeroed, with the death penalty as reward.
                np.testing.assert_array_equal(result.terminated[g], d)
                assert not result.next.obs[g][d].any()
                assert result.next.obs[g][~d].any()
            dead_at_death = dead
        elif died is not None:
            for g, d in dead_at_death.items():
                assert (~result.next.agent_mask[g][d]).all()  # stays dead
                assert (result.rewards[g][d] == 0).all() and result.terminated[g][d].all()
                assert not result.next.obs[g][d].any()
    assert died is not None, "no agent died in 400 steps"
    assert result.done[0], "the battle did not end"
    (episode,) = result.episodes
    assert episode.length == t + 1
    # After the reset every agent is back.
    assert all(m.all() for m in result.next.agent_mask.values())
    vec.close()


def test_scripted_env_masks_dead_agents_and_action_masks():
    for dict_obs in (False, True):
        vec = envs.make(SCRIPTED, num_envs=2, seed=0, die_at=2, max_cycles=4, dict_obs=dict_obs)
        (spec,) = vec.groups.values()
        assert spec.name == "unit" and spec.has_action_mask and spec.action_dim == 4
        assert vec.state_shape == (6,)  # state() raises: the concatenated observations
        o = vec.reset()
        assert o.avail_actions["unit"].shape == (2, 3, 4) and o.avail_actions["unit"].dtype == bool
        np.testing.assert_array_equal(o.avail_actions["unit"][0], [ScriptedEnv.mask(0, i) for i in range(3)])
        returns = np.zeros((2, 3))
        rng = np.random.default_rng(0)
        for t in range(1, 5):
            # ScriptedEnv raises if it gets an action of a dead agent or a masked-out action.
            actions = random_group_actions(spec, 2, rng, o.avail_actions["unit"])
            r = vec.step({"unit": actions})
            returns += r.rewards["unit"]
            np.testing.assert_array_equal(r.rewards["unit"][:, 2], 0.0 if t > 2 else actions[:, 2] + 1)
            if t == 2:
                np.testing.assert_array_equal(r.terminated["unit"], [[False, False, True]] * 2)
            if 2 <= t < 4:
                np.testing.assert_array_equal(r.next.agent_mask["unit"], [[True, True, False]] * 2)
                assert not r.next.obs["unit"][:, 2].any() and r.next.avail_actions["unit"][:, 2].all()
                np.testing.assert_array_equal(r.next.state[:, 4:], 0)
            o = r.next
        assert r.done.all() and r.truncated.all()
        np.testing.assert_array_equal(r.final.agent_mask["unit"], [[True, True, False]] * 2)
        np.testing.assert_array_equal(r.final.obs["unit"][:, :2], [[[4, 0], [4, 1]]] * 2)
        assert r.next.agent_mask["unit"].all() and not r.next.obs["unit"][:, :, 0].any()
        for e in r.episodes:
            assert e.length == 4
            assert e.group_returns["unit"] == pytest.approx(returns[e.env_index].mean())
        vec.close()


def test_episode_return_is_the_sum_of_step_rewards():
    vec = envs.make("simple_adversary_v3", num_envs=2, seed=2, max_cycles=6)
    vec.reset()
    sums = {g: np.zeros((2, spec.n_agents)) for g, spec in vec.groups.items()}
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(12):
        result = vec.step(random_actions(vec, rng))
        for g in sums:
            sums[g] += result.rewards[g]
        for e in result.episodes:
            i = e.env_index
            for g in sums:
                assert e.group_returns[g] == pytest.approx(sums[g][i].mean(), rel=1e-5)
            everyone = np.concatenate([sums[g][i] for g in sums])
            assert e.episode_return == pytest.approx(everyone.mean(), rel=1e-5)
            assert e.length == 6
            episodes.append(e)
        for g in sums:
            sums[g][result.done] = 0
    assert len(episodes) == 4 and any(e.group_returns["adversary"] != 0 for e in episodes)


# --- errors -------------------------------------------------------------------------------------


def test_unknown_id_lists_the_known_ones():
    with pytest.raises(envs.UnknownEnvError) as info:
        envs.make("simple_sprad_v3")
    message = str(info.value)
    assert "simple_sprad_v3" in message and "module:function" in message
    for known in ("simple_spread_v3", "battle_v4", "knights_archers_zombies_v11"):
        assert known in message
    assert isinstance(info.value, ValueError)
    with pytest.raises(envs.UnknownEnvError, match="has no function"):
        envs.make("mpe2.simple_v3:no_such_function")


def test_unknown_id_says_in_one_line_why_an_id_would_be_refused_before_anything_is_built():
    """The check behind --env-id / --envs in results/run.py, crossplay.py and bench_sweep_cost.py."""
    for env_id in ("simple_spread_v3", "battle_v4", "Foraging-8x8-2p-2f-coop", "Foraging-6x6-2p-1f", "rware-tiny-2ag",
                   "mpe2.simple_v3:parallel_env"):  # fmt: skip
        assert envs.unknown_id(env_id) is None, env_id
    typo = envs.unknown_id("simple_sprad_v3")
    assert str(typo) == "'simple_sprad_v3' is not an env id of envs.make (envs.known_ids())" and not typo.near_miss
    said = envs.unknown_id("Foraging-4x4-2p-1f")  # the LBF grammar, outside the package's range: what it builds
    assert said.near_miss
    said = str(said)
    assert said.startswith("'Foraging-4x4-2p-1f' is outside the Level-Based Foraging tasks here") and "S 5-19" in said
    with pytest.raises(envs.UnknownEnvError):
        envs.make("Foraging-4x4-2p-1f")  # the same id, refused by make too
    hint = "'rware-tiny-2ag-v2' is the package's Gymnasium id; envs.make names the task without its version: "
    hint += "'rware-tiny-2ag'"
    versioned = envs.unknown_id("rware-tiny-2ag-v2")  # EPyMARL's key, as its users type it
    assert str(versioned) == hint and versioned.near_miss
    with pytest.raises(envs.UnknownEnvError, match="^" + re.escape(hint) + "$") as refused:
        envs.make("rware-tiny-2ag-v2")
    assert refused.value.near_miss
    with pytest.raises(envs.UnknownEnvError, match="^unknown env id 'simple_sprad_v3'. Known ids:") as refused:
        envs.make("simple_sprad_v3")
    assert not refused.value.near_miss
    assert str(envs.unknown_id("simple_spread_v3-v2")).endswith("is not an env id of envs.make (envs.known_ids())")


def test_wrong_env_arguments_are_clear():
    with pytest.raises(envs.EnvArgumentError, match=r"unexpected argument\(s\) bogus.*max_cycles"):
        envs.make("simple_spread_v3", bogus=1)
    with pytest.raises(envs.EnvArgumentError, match="map_size >= 12"):
        envs.make("battle_v4", map_size=8)
    with pytest.raises(envs.EnvArgumentError, match="map_size"):
        envs.make("gather_v5", map_size=20)
    with pytest.raises(envs.EnvArgumentError, match="magic"):
        envs.make(SCRIPTED, magic=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_envs="4"), "num_envs must be an integer >= 1, got '4'"),  # was "'<' not supported between ..."
        (dict(num_envs=2.5), "num_envs must be an integer >= 1, got 2.5"),
        (dict(num_envs=0), "num_envs must be an integer >= 1, got 0"),
        (dict(seed=-1), "seed must be an integer >= 0, got -1"),  # was gymnasium's Error, not a ValueError
        (dict(seed="a", backend="numba"), "seed must be an integer >= 0, got 'a'"),
    ],
)
def test_a_bad_env_count_or_seed_is_one_value_error(kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        envs.make("simple_spread_v3", **kwargs)
    assert envs.make("simple_spread_v3", np.int64(2), np.int64(3), backend="numba").num_envs == 2


@pytest.mark.parametrize(
    "env_id, backend, kwargs, message",
    [
        ("simple_spread_v3", "numba", {"N": 0}, "simple_spread_v3's N must be at least 1, got 0"),  # "need at least
        ("simple_spread_v3", "pettingzoo", {"N": -1}, "simple_spread_v3's N must be at least 1, got -1"),  # one array"
        ("simple_spread_v3", "numba", {"N": 2.5}, "simple_spread_v3's N must be a whole number, got 2.5"),
        ("simple_spread_v3", "numba", {"continuous_actions": "yes"}, "continuous_actions must be true or false, got"),
        ("simple_spread_v3", "pettingzoo", {"local_ratio": "x"}, "simple_spread_v3's local_ratio must be a number"),
        ("Foraging-8x8-2p-2f-coop", "numba", {"max_cycles": 0}, "max_cycles must be at least 1, got 0"),  # ran: 0.00
        ("rware-tiny-2ag", "numba", {"max_cycles": 2.5}, "rware-tiny-2ag's max_cycles must be a whole number, got 2.5"),
        ("battle_v4", "native", {"map_size": "big"}, "battle_v4's map_size must be a whole number, got 'big'"),
    ],
)
def test_an_env_argument_of_the_wrong_kind_is_named(env_id, backend, kwargs, message):
    """Each was a cryptic error from deep in the env, a traceback (battle's '<' between str and int) or, for
    max_cycles 0 and 2.5 on the ports and continuous_actions 'yes' on the MPE, a run that went ahead."""
    with pytest.raises(envs.EnvArgumentError, match=re.escape(message)):
        envs.make(env_id, 1, 0, backend=backend, **kwargs)
    envs.make("simple_spread_v3", 1, 0, backend="numba", N=4, local_ratio=1).close()  # an int is a number


def test_env_kwargs_pass_through():
    vec = envs.make("simple_spread_v3", N=5, max_cycles=7, local_ratio=0.0)
    assert vec.groups["agent"].n_agents == 5 and vec.max_steps == 7 and vec.state_shape == (5 * 30,)
    vec.reset()
    rewards = vec.step({"agent": np.zeros((1, 5), np.int64)}).rewards["agent"]
    assert np.all(rewards == rewards[0, 0])  # local_ratio=0: every agent gets the global reward
    vec = envs.make("battle_v4", map_size=16, max_cycles=3)
    assert vec.groups["red"].n_agents == 6 and vec.max_steps == 3 and vec.state_shape == (16, 16, 5)


def test_wrong_actions_raise_a_clear_error():
    vec = envs.make("simple_adversary_v3", num_envs=2, seed=0)
    vec.reset()
    good = {"adversary": np.zeros((2, 1), np.int64), "agent": np.zeros((2, 2), np.int64)}
    vec.step(good)
    with pytest.raises(ValueError, match=r"actions\['agent'\] has shape \(2,\); expected .*\(2, 2\)"):
        vec.step({**good, "agent": np.zeros(2, np.int64)})
    with pytest.raises(ValueError, match=r"actions\['agent'\] has values in \[0, 5\].*\[0, 5\)"):
        vec.step({**good, "agent": np.array([[0, 5], [1, 2]])})
    with pytest.raises(ValueError, match=r"actions\['adversary'\] has values in \[-1, 0\]"):
        vec.step({**good, "adversary": np.array([[-1], [0]])})
    with pytest.raises(ValueError, match=r"actions\['agent'\] has dtype float32"):
        vec.step({**good, "agent": np.zeros((2, 2), np.float32)})
    with pytest.raises(ValueError, match="missing group 'adversary'"):
        vec.step({"agent": good["agent"]})
    with pytest.raises(ValueError, match="unknown group"):
        vec.step({**good, "red": good["agent"]})
    fresh = envs.make("simple_v3")
    with pytest.raises(RuntimeError, match="reset"):
        fresh.step({"agent": np.zeros((1, 1), np.int64)})


@pytest.mark.parametrize(
    ("crash", "workers", "named", "expected"),
    [
        ("raise", 3, "env 1", "scripted crash"),
        ("exit", 3, "env 1", "died"),
        ("raise", 1, "env 1", "scripted crash"),  # one worker holds all three: the env that raised is named
        ("exit", 2, "envs 0-1", "died"),  # a dead worker: the envs it held are named
    ],
)
def test_crashed_worker_names_the_env(crash, workers, named, expected):
    vec = envs.make(SCRIPTED, num_envs=3, seed=10, vector="subproc", num_workers=workers, crash_seed=11, crash=crash)
    assert vec.num_workers == workers
    vec.reset()
    start = time.perf_counter()
    with pytest.raises(envs.EnvWorkerError, match=f"(?s){named}\\b.*{expected}") as info:
        vec.step({"unit": np.zeros((3, 3), np.int64)})
    assert time.perf_counter() - start < 10
    assert "env 0" not in str(info.value) and "env 2" not in str(info.value)
    assert not any(p.is_alive() for p in vec._procs)  # the failure stopped every worker
    with pytest.raises(RuntimeError, match="closed"):
        vec.step({"unit": np.zeros((3, 3), np.int64)})


def test_hanging_worker_times_out():
    factory = env_factory(SCRIPTED, crash_seed=0, crash="hang")
    vec = envs.SubprocVecEnv(factory, 1, seed=0, timeout=0.5)
    vec.reset()
    with pytest.raises(envs.EnvWorkerError, match=r"env 0: .*no answer within 0.5 s"):
        vec.step({"unit": np.zeros((1, 3), np.int64)})


def test_numba_backend_delegates_or_fails_clearly(monkeypatch):
    monkeypatch.setitem(sys.modules, "envs.mpe", None)  # as if envs/mpe did not exist
    with pytest.raises(envs.EnvNotAvailableError, match="the Numba MPE backend is not available"):
        envs.make("simple_spread_v3", backend="numba")
    calls, vec = [], types.SimpleNamespace(groups={})  # a backend's env, whose (no) groups make declares a layout on
    fake = types.SimpleNamespace(make_vec=lambda *args, **kwargs: calls.append((args, kwargs)) or vec)
    monkeypatch.setitem(sys.modules, "envs.mpe", fake)
    assert envs.make("simple_spread_v3", num_envs=4, seed=2, backend="numba", N=5) is vec
    assert calls == [(("simple_spread_v3", 4, 2), {"N": 5})]
    with pytest.raises(ValueError, match="unknown backend"):
        envs.make("simple_spread_v3", backend="jax")


# --- video ----------------------------------------------------------------------------------------


def test_record_episode_writes_every_frame(tmp_path):
    import imageio.v2 as imageio

    def act(o):
        return {"agent": np.ones((1, 3), np.int64)}

    path, stats = envs.record_episode("simple_spread_v3", act, tmp_path / "ep.mp4", seed=0, max_cycles=5)
    assert os.path.getsize(path) > 0
    assert stats.length == 5
    with imageio.get_reader(path) as reader:
        frames = [f for f in reader]
    assert len(frames) == 6  # the first observation and one per step, including the last
    assert frames[0].shape == (700, 700, 3)
    # The scripted env draws its step counter; the final frame is drawn before the auto-reset.
    path, stats = envs.record_episode(
        SCRIPTED, lambda o: {"unit": np.zeros((1, 3), np.int64)}, tmp_path / "s.mp4", max_cycles=3
    )
    with imageio.get_reader(path) as reader:
        counters = [int(round(f.mean() / 60)) for f in reader]
    assert stats.length == 3 and counters == [0, 1, 2, 3]


# --- single-agent Gymnasium ------------------------------------------------------------------------


def test_make_gym_po_cartpole_same_step_autoreset_and_stats(tmp_path):
    vec = envs.make_gym(envs.PO_CARTPOLE_ID, num_envs=2, seed=0, capture_video=True, run_dir=tmp_path)
    obs, _ = vec.reset()
    assert obs.shape == (2, 2) and vec.single_observation_space.shape == (2,)
    full = gym.make("CartPole-v1")
    full_obs, _ = full.reset(seed=0)
    np.testing.assert_array_equal(obs[0], full_obs[[0, 2]])  # env 0 seeded with 0; velocities hidden
    returns = np.zeros(2)
    finished, env0_finished = 0, False
    while finished < 3 or not env0_finished:
        actions = vec.action_space.sample()
        obs, rewards, terminations, truncations, infos = vec.step(actions)
        returns += rewards
        done = terminations | truncations
        if done.any():
            assert infos["_final_obs"].tolist() == done.tolist() and infos["_episode"].tolist() == done.tolist()
            for i in np.flatnonzero(done):
                assert infos["final_obs"][i].shape == (2,)
                assert not np.array_equal(infos["final_obs"][i], obs[i])  # obs[i] is the new episode
                assert infos["episode"]["r"][i] == pytest.approx(returns[i])
                returns[i] = 0
                finished += 1
                env0_finished |= i == 0
    vec.close()
    videos = os.listdir(tmp_path / "videos")
    assert any(name.endswith("episode-0.mp4") for name in videos)
    # Same seed, same observations, without passing a seed to reset().
    a = envs.make_gym("CartPole-v1", num_envs=2, seed=5)
    b = envs.make_gym("CartPole-v1", num_envs=2, seed=5)
    np.testing.assert_array_equal(a.reset()[0], b.reset()[0])
    np.testing.assert_array_equal(a.step(np.array([0, 1]))[0], b.step(np.array([0, 1]))[0])


def test_auto_backend_picks_numba_for_mpe_ids_it_implements_and_pettingzoo_otherwise():
    from envs.registry import _numba_ids

    spread = envs.make("simple_spread_v3", num_envs=1, seed=0, backend="auto")
    expected = "MPEVecEnv" if "simple_spread_v3" in _numba_ids() else "SyncVecEnv"
    assert type(spread).__name__ == expected
    assert type(envs.make("battle_v4", num_envs=1, seed=0, backend="auto", map_size=12)).__name__ == "SyncVecEnv"
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        envs.make("simple_spread_v3", backend="fast")
