"""The Numba MPE backend (envs.mpe) against mpe2 itself.

Fidelity: for every scenario and both action types, E=2 of our worlds mirror two mpe2 parallel
envs. At every (re)set the mpe2 world is copied into ours; then both take the same random actions
and observations, state, rewards, terminations and truncations must agree (1e-5) at every step.
Also: spaces and agent order, reset distributions (statistics over 2,000 resets), auto-reset and
episode statistics, action validation and clipping, PettingZoo's parallel_api_test, rendering.
"""

import warnings

import numpy as np
import pytest

from envs.api import Observation, StepResult
from envs.mpe import SCENARIOS, make_vec, parallel_env
from envs.mpe.mpe2_bridge import mpe2_module, read_mpe2_world

NAMES = list(SCENARIOS)
TOL = 1e-5
MAX_ERRORS: dict[str, float] = {}  # (scenario, mode) -> largest |ours - mpe2| seen, printed at the end


def mpe2_parallel(name, **kwargs):
    return mpe2_module(name).parallel_env(**kwargs)


def copy_world(ours, e, ref, name):
    w = read_mpe2_world(name, ref)
    ours.set_world(e, w["pos"], w["vel"], w["comm"], w["goal"])


def batched_actions(ours, refs, rng):
    """Random actions in each mpe2 env's action spaces, and the same actions batched by group."""
    per_env = []
    for ref in refs:
        acts = {}
        for a in ref.possible_agents:
            space = ref.action_space(a)
            if ours.continuous:
                acts[a] = rng.uniform(0.0, 1.0, space.shape).astype(np.float32)
            else:
                acts[a] = int(rng.integers(space.n))
        per_env.append(acts)
    batched = {g: np.array([[acts[a] for a in spec.agents] for acts in per_env]) for g, spec in ours.groups.items()}
    return per_env, batched


def compare_obs(ours, obs: Observation, e, ref, ref_obs) -> float:
    err = 0.0
    for g, spec in ours.groups.items():
        for k, a in enumerate(spec.agents):
            assert obs.obs[g][e, k].shape == ref_obs[a].shape
            err = max(err, float(np.abs(obs.obs[g][e, k] - ref_obs[a]).max(initial=0.0)))
    err = max(err, float(np.abs(obs.state[e] - ref.state()).max(initial=0.0)))
    return err


def run_mirrored(name, continuous, steps, seed=0, **kwargs) -> float:
    """Step ours and mpe2 side by side for `steps` steps; return the largest error seen."""
    E = 2
    ours = make_vec(name, num_envs=E, seed=seed, continuous_actions=continuous, **kwargs)
    refs = [mpe2_parallel(name, continuous_actions=continuous, **kwargs) for _ in range(E)]
    ours.reset()
    ref_obs = []
    for e, ref in enumerate(refs):
        o, _ = ref.reset(seed=seed + 100 * e)
        ref_obs.append(o)
        copy_world(ours, e, ref, name)
    obs = ours.observe()
    err = max(compare_obs(ours, obs, e, ref, ref_obs[e]) for e, ref in enumerate(refs))
    rng = np.random.default_rng(seed)
    for t in range(steps):
        per_env, batched = batched_actions(ours, refs, rng)
        res: StepResult = ours.step(batched)
        reset_any = False
        for e, ref in enumerate(refs):
            o, r, term, trunc, _ = ref.step(per_env[e])
            for g, spec in ours.groups.items():
                for k, a in enumerate(spec.agents):
                    err = max(err, abs(float(res.rewards[g][e, k]) - r[a]))
                    assert bool(res.terminated[g][e, k]) == term[a], (name, t, a)
                    assert bool(res.truncated[e]) == trunc[a], (name, t, a)
            ended = any(term.values()) or any(trunc.values())
            assert bool(res.done[e]) == ended
            err = max(err, compare_obs(ours, res.final, e, ref, o))
            if ended:  # mpe2 resets (its own draw), and ours takes mpe2's new world
                ref_obs[e], _ = ref.reset()
                copy_world(ours, e, ref, name)
                reset_any = True
            else:
                ref_obs[e] = o
                assert res.next.state[e] is not None
        if reset_any:
            obs = ours.observe()
            for e, ref in enumerate(refs):
                err = max(err, compare_obs(ours, obs, e, ref, ref_obs[e]))
        else:
            for e, ref in enumerate(refs):
                err = max(err, compare_obs(ours, res.next, e, ref, ref_obs[e]))
        assert err < TOL, (name, continuous, t, err)
    return err


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
@pytest.mark.parametrize("name", NAMES)
def test_matches_mpe2_step_by_step(name, continuous):
    err = run_mirrored(name, continuous, steps=300 if continuous else 1000)  # mpe2 is the slow side
    MAX_ERRORS[f"{name} {'continuous' if continuous else 'discrete'}"] = err


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("simple_spread_v3", {"N": 5, "local_ratio": 0.2, "max_cycles": 40}),
        ("simple_spread_v3", {"num_agent_neighbors": 1, "num_landmark_neighbors": 2}),
        ("simple_spread_v3", {"num_agent_neighbors": 4, "num_landmark_neighbors": 5}),  # padded
        ("simple_spread_v3", {"N": 2, "terminate_on_success": True}),
        ("simple_reference_v3", {"local_ratio": 0.9}),
        ("simple_adversary_v3", {"N": 3, "num_agent_neighbors": 2, "num_landmark_neighbors": 1}),
        ("simple_tag_v3", {"num_good": 2, "num_adversaries": 2, "num_obstacles": 3}),
        ("simple_tag_v3", {"num_good": 2, "num_adversaries": 3, "num_agent_neighbors": 2}),
        ("simple_tag_v3", {"num_adversaries": 4, "terminate_on_success": True, "max_cycles": 50}),
        ("simple_world_comm_v3", {"num_good": 3, "num_adversaries": 3, "num_food": 3, "num_forests": 3}),
    ],
)
def test_matches_mpe2_with_options(name, kwargs):
    for continuous in (False, True):
        err = run_mirrored(name, continuous, steps=150, seed=3, **kwargs)
        MAX_ERRORS[f"{name} {kwargs} {'continuous' if continuous else 'discrete'}"] = err


@pytest.mark.parametrize(
    "name, kwargs, place",
    [
        ("simple_spread_v3", {"N": 2}, lambda pos: pos.__setitem__(slice(0, 2), pos[2:4])),  # agents on landmarks
        ("simple_tag_v3", {}, lambda pos: pos.__setitem__(slice(0, 3), pos[3] + [[0.03, 0], [-0.03, 0], [0, 0.03]])),
    ],
)
def test_terminate_on_success(name, kwargs, place):
    ours = make_vec(name, num_envs=1, seed=0, terminate_on_success=True, **kwargs)
    ref = mpe2_parallel(name, terminate_on_success=True, **kwargs)
    ours.reset()
    ref.reset(seed=0)
    w = read_mpe2_world(name, ref)
    place(w["pos"])
    for entity, p in zip(ref.unwrapped.world.entities, w["pos"], strict=True):
        entity.state.p_pos = p.copy()
    ours.set_world(0, w["pos"], w["vel"], w["comm"], w["goal"])
    noop = {a: 0 for a in ref.possible_agents}
    o, r, term, trunc, _ = ref.step(noop)
    res = ours.step({g: np.zeros((1, s.n_agents), np.int64) for g, s in ours.groups.items()})
    assert all(term.values()) and not any(trunc.values())
    assert all(t.all() for t in res.terminated.values()) and res.done[0] and not res.truncated[0]
    assert res.episodes[0].length == 1
    assert compare_obs(ours, res.final, 0, ref, o) < TOL


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
@pytest.mark.parametrize("name", NAMES)
def test_spaces_and_agents(name, continuous):
    ours = make_vec(name, num_envs=3, seed=0, continuous_actions=continuous)
    ref = mpe2_parallel(name, continuous_actions=continuous)
    assert ours.agents == ref.possible_agents
    assert [a for spec in ours.groups.values() for a in spec.agents] == ref.possible_agents
    assert ours.state_shape == ref.state_space.shape
    assert ours.max_steps == 25
    for g, spec in ours.groups.items():
        assert g == spec.agents[0].rsplit("_", 1)[0]
        for a in spec.agents:
            assert spec.obs_shape == ref.observation_space(a).shape
            space = ref.action_space(a)
            if continuous:
                assert not spec.discrete and (spec.action_dim,) == space.shape
                np.testing.assert_array_equal(spec.action_low, space.low)
                np.testing.assert_array_equal(spec.action_high, space.high)
            else:
                assert spec.discrete and spec.action_dim == space.n
    obs = ours.reset()
    assert obs.state.dtype == np.float32 and obs.state.shape == (3, *ours.state_shape)
    for g, spec in ours.groups.items():
        assert obs.obs[g].shape == (3, spec.n_agents, *spec.obs_shape)
        assert obs.agent_mask[g].all()


def reset_samples(name, n):
    """World arrays of n resets: ours (n envs, seed 0) and mpe2 (one env reset n times)."""
    ours = make_vec(name, num_envs=n, seed=0)
    ours.reset()
    mine = [ours.get_world(e) for e in range(n)]
    ref = mpe2_module(name).raw_env()
    ref.reset(seed=0)
    theirs = []
    for _ in range(n):
        theirs.append(read_mpe2_world(name, ref))
        ref.reset()
    return {k: np.stack([w[k] for w in mine]) for k in ("pos", "vel", "comm", "goal")}, {
        k: np.stack([w[k] for w in theirs]) for k in ("pos", "vel", "comm", "goal")
    }


@pytest.mark.parametrize("name", NAMES)
def test_reset_distribution(name):
    n = 2000
    ours, ref = reset_samples(name, n)
    # positions: per entity and coordinate, uniform over the same range
    for stat, tol in ((np.mean, 0.08), (np.std, 0.04), (np.min, 0.02), (np.max, 0.02)):
        np.testing.assert_allclose(stat(ours["pos"], axis=0), stat(ref["pos"], axis=0), atol=tol, err_msg=stat.__name__)
    assert not ours["vel"].any() and not ref["vel"].any()
    assert not ours["comm"].any() and not ref["comm"].any()
    # goal / key choices: same frequencies
    assert ours["goal"].shape == ref["goal"].shape
    for k in range(ours["goal"].shape[1]):
        m = max(ours["goal"][:, k].max(), ref["goal"][:, k].max()) + 1
        f_ours = np.bincount(ours["goal"][:, k], minlength=m) / n
        f_ref = np.bincount(ref["goal"][:, k], minlength=m) / n
        np.testing.assert_allclose(f_ours, f_ref, atol=0.06)


def test_seeding():
    a = make_vec("simple_tag_v3", num_envs=4, seed=7)
    b = make_vec("simple_tag_v3", num_envs=4, seed=7)
    np.testing.assert_array_equal(a.reset().state, b.reset().state)
    s1 = a.reset(seed=3).state
    c = make_vec("simple_tag_v3", num_envs=5, seed=0)
    s2 = c.reset(seed=2).state
    np.testing.assert_array_equal(s1[0], s2[1])  # env i is seeded with seed + i
    assert not np.array_equal(s1[0], s1[1])
    np.testing.assert_array_equal(s1, a.reset(seed=3).state)
    assert not np.array_equal(a.reset().state, s1)  # an unseeded reset continues the streams


def test_autoreset_and_episode_stats():
    E, T = 3, 10
    env = make_vec("simple_adversary_v3", num_envs=E, seed=1, max_cycles=T)
    obs = env.reset()
    rng = np.random.default_rng(0)
    total = np.zeros((E, 3))
    for t in range(T):
        before = obs.state.copy()
        actions = {g: rng.integers(0, s.action_dim, (E, s.n_agents)) for g, s in env.groups.items()}
        res = env.step(actions)
        np.testing.assert_array_equal(before, obs.state)  # a step never overwrites what it handed out
        total += np.concatenate([res.rewards["adversary"], res.rewards["agent"]], axis=1)
        assert res.rewards["agent"].dtype == np.float32 and res.terminated["agent"].dtype == np.bool_
        assert not any(v.any() for v in res.terminated.values())
        if t < T - 1:
            assert not res.truncated.any() and not res.done.any() and res.episodes == []
            assert res.final is res.next
        else:
            assert res.truncated.all() and res.done.all()
            assert [ep.env_index for ep in res.episodes] == list(range(E))
            for ep in res.episodes:
                assert ep.length == T
                np.testing.assert_allclose(ep.group_returns["adversary"], total[ep.env_index, 0], rtol=1e-5)
                np.testing.assert_allclose(ep.group_returns["agent"], total[ep.env_index, 1:].mean(), rtol=1e-5)
                np.testing.assert_allclose(ep.episode_return, total[ep.env_index].mean(), rtol=1e-5)
            # next: first observation of the new episode; final: the last of the old one
            assert not np.array_equal(res.final.state, res.next.state)
            np.testing.assert_array_equal(res.next.state, env.observe().state)
            np.testing.assert_array_equal(
                res.final.state, np.concatenate([res.final.obs[g].reshape(E, -1) for g in env.groups], 1)
            )
            assert all(env.get_world(e)["steps"] == 0 for e in range(E))
        obs = res.next


@pytest.mark.parametrize("name", ["simple_spread_v3", "simple_world_comm_v3"])
def test_a_saved_state_put_into_a_fresh_env_steps_on_as_the_original(name):
    """get_state/set_state (what a resumed run restores): mid-episode and across the auto-reset, a fresh env given
    the state steps on bit for bit as the env it came from (positions, rewards, episode stats, the reset streams)."""
    E, T = 3, 7
    env, rng = make_vec(name, num_envs=E, seed=5, max_cycles=T), np.random.default_rng(0)
    env.reset()

    def actions():
        return {g: rng.integers(0, s.action_dim, (E, s.n_agents)) for g, s in env.groups.items()}

    for _ in range(4):
        obs = env.step(actions()).next
    copy = make_vec(name, num_envs=E, seed=99, max_cycles=T)
    restored = copy.set_state(env.get_state())
    np.testing.assert_array_equal(restored.state, obs.state)
    for _ in range(2 * T):  # two auto-resets: the worlds' random streams came along
        a = actions()
        one, two = env.step(a), copy.step(a)
        np.testing.assert_array_equal(one.next.state, two.next.state)
        np.testing.assert_array_equal(one.final.state, two.final.state)
        assert all((one.rewards[g] == two.rewards[g]).all() for g in one.rewards)
        assert one.episodes == two.episodes
    with pytest.raises(ValueError, match="does not fit this .* env of 4 envs: saved with other env flags or another"):
        make_vec(name, num_envs=4).set_state(env.get_state())


def test_actions_are_validated_and_clipped():
    env = make_vec("simple_spread_v3", num_envs=2, seed=0)
    env.reset()
    with pytest.raises(ValueError):
        env.step({"agent": np.array([[0, 1, 2], [0, 5, 0]])})
    cont = [make_vec("simple_world_comm_v3", num_envs=2, seed=0, continuous_actions=True) for _ in range(2)]
    for env in cont:
        env.reset()
    rng = np.random.default_rng(0)
    for _ in range(5):
        wide = {
            g: rng.uniform(-0.5, 1.5, (2, s.n_agents, s.action_dim)).astype(np.float32)
            for g, s in cont[0].groups.items()
        }
        clipped = {g: np.clip(a, 0, 1) for g, a in wide.items()}
        np.testing.assert_array_equal(cont[0].step(wide).next.state, cont[1].step(clipped).next.state)


E2 = 2  # envs in the bad-input cases
INT = np.zeros((E2, 3), np.int64)
FLOAT = np.full((E2, 3, 5), 0.5, np.float32)


@pytest.mark.parametrize("backend", ["numba", "pettingzoo"])
@pytest.mark.parametrize(
    "continuous, actions, message",
    [
        (False, {"agent": INT.T.copy()}, r"has shape \(3, 2\); expected \(num_envs, n_agents\) = \(2, 3\)"),
        (False, {"agent": INT.astype(np.float32)}, "has dtype float32; expected .* integers in \\[0, 5\\)"),
        (False, {"agent": INT - 1}, r"has values in \[-1, -1\]; expected .* integers in \[0, 5\)"),
        (False, {"agent": INT + 5}, r"has values in \[5, 5\]"),
        (False, {"agent": (INT + 7).astype(np.int32)}, r"has values in \[7, 7\]"),
        (False, {"agent": INT, "zombie": INT}, r"unknown group\(s\) \['zombie'\]"),
        (False, {}, "missing group 'agent'"),
        (False, [INT], "must be a dict group -> array"),
        (True, {"agent": FLOAT[:, :, :4]}, r"has shape \(2, 3, 4\); expected .* = \(2, 3, 5\) finite floats"),
        (True, {"agent": np.where(np.eye(5, dtype=bool)[0], np.nan, FLOAT)}, "holds NaN or infinite values"),
        (True, {"agent": np.full((E2, 3, 5), np.inf)}, "holds NaN or infinite values"),
        (True, {"agent": FLOAT.astype(bool)}, "has dtype bool"),
    ],
)
def test_every_bad_action_is_refused_as_the_pettingzoo_backend_refuses_it(backend, continuous, actions, message):
    from envs import make

    env = make("simple_spread_v3", E2, 0, backend=backend, continuous_actions=continuous)
    env.reset()
    with pytest.raises(ValueError, match=message):
        env.step(actions)
    good = {"agent": FLOAT.astype(np.float64)} if continuous else {"agent": INT.astype(np.int32)}
    env.step(good)  # the env is still usable, and other good dtypes pass
    env.close()


@pytest.mark.parametrize("backend", ["numba", "pettingzoo"])
def test_a_step_before_reset_or_after_close_is_refused(backend):
    from envs import make

    env = make("simple_spread_v3", E2, 0, backend=backend)
    with pytest.raises(RuntimeError, match=r"call reset\(\) before the first step\(\)"):
        env.step({"agent": INT})
    env.reset()
    env.step({"agent": INT})
    env.close()
    with pytest.raises(RuntimeError, match="the vector env is closed"):
        env.step({"agent": INT})
    with pytest.raises(RuntimeError, match="the vector env is closed"):
        env.reset()


def test_make_vec_arguments():
    assert make_vec("mpe2/simple_spread_v3", 1).scenario.name == "simple_spread_v3"
    assert make_vec("simple_tag", 1).scenario.name == "simple_tag_v3"
    with pytest.raises(ValueError):
        make_vec("simple_nonsense_v1", 1)
    with pytest.raises(TypeError):
        make_vec("simple_v3", 1, N=3)
    with pytest.raises(NotImplementedError):
        make_vec("simple_spread_v3", 1, curriculum=True)


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
@pytest.mark.parametrize("name", NAMES)
def test_parallel_api(name, continuous):
    from pettingzoo.test import parallel_api_test

    env = parallel_env(name, continuous_actions=continuous)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(env)  # 1,000 cycles, twice
    ref = mpe2_parallel(name, continuous_actions=continuous)
    assert env.possible_agents == ref.possible_agents
    for a in env.possible_agents:
        assert env.observation_space(a) == ref.observation_space(a)
        assert env.action_space(a) == ref.action_space(a)
    assert env.state_space == ref.state_space


def test_parallel_env_episode():
    env = parallel_env("simple_speaker_listener_v4", max_cycles=5)
    obs, infos = env.reset(seed=1)
    assert set(obs) == set(env.possible_agents) and obs["listener_0"].shape == (11,)
    for t in range(5):
        obs, rew, term, trunc, infos = env.step({a: env.action_space(a).sample() for a in env.agents})
        assert rew["speaker_0"] == rew["listener_0"]
        assert all(trunc.values()) == (t == 4)
    assert env.agents == []
    assert env.state().shape == (14,)


def test_render():
    env = make_vec("simple_world_comm_v3", num_envs=2, seed=0)
    env.reset()
    env.step({g: np.zeros((2, s.n_agents), np.int64) for g, s in env.groups.items()})
    frame = env.render(1)
    assert frame.shape == (700, 700, 3) and frame.dtype == np.uint8
    assert len(np.unique(frame.reshape(-1, 3), axis=0)) > 3  # not blank
    pz = parallel_env("simple_crypto_v3", render_mode="rgb_array")
    pz.reset(seed=0)
    assert pz.render().shape == (700, 700, 3)
    env.close()
    pz.close()


def test_zz_report_max_errors():
    """Prints the largest deviation from mpe2 per scenario (run with -s to see it)."""
    for key, err in MAX_ERRORS.items():
        print(f"max |ours - mpe2| {key}: {err:.2e}")
