"""envs/magent_native.py: MAgent2 stepped through its engine's team handles gives the PettingZoo path's numbers, bit
for bit: observations, rewards, terminations, truncations, dead-agent masks, agent order, global state, episode
statistics, over 1,000 random steps per id from the same seed (with truncations, deaths and wiped-out teams)."""

import numpy as np
import pytest
from test_envs import MAGENT_SMALL, assert_same, rollout

import envs

STEPS = 1000


@pytest.mark.parametrize("env_id", sorted(MAGENT_SMALL))
def test_native_backend_equals_the_pettingzoo_path(env_id):
    kwargs = MAGENT_SMALL[env_id] | {"max_cycles": 40}  # short episodes: many resets, truncations and deaths
    native = envs.make(env_id, num_envs=1, seed=3, backend="native", **kwargs)
    slow = envs.make(env_id, num_envs=1, seed=3, backend="pettingzoo", **kwargs)
    a, b = rollout(native, STEPS, seed=7), rollout(slow, STEPS, seed=7)
    assert_same(a, b)
    episodes = sum(isinstance(x, tuple) for step in a[1:] for x in step)  # each step's finished-episode records
    assert episodes >= STEPS // 40 - 1  # the comparison spans many episodes


def test_auto_picks_the_native_backend_for_magent_and_refuses_it_elsewhere():
    vec = envs.make("battle_v4", num_envs=1, backend="auto", map_size=12)
    assert type(vec.runners[0]).__name__ == "MagentRunner"
    with pytest.raises(ValueError, match="steps MAgent2 envs only"):
        envs.make("simple_spread_v3", backend="native")


def test_subprocess_workers_run_the_native_backend_with_the_same_numbers():
    kwargs = {"map_size": 12, "max_cycles": 30}
    sub = envs.make("battle_v4", num_envs=3, seed=1, backend="native", vector="subproc", num_workers=2, **kwargs)
    try:
        a = rollout(sub, 100, seed=2)
    finally:
        sub.close()
    assert_same(a, rollout(envs.make("battle_v4", num_envs=3, seed=1, backend="pettingzoo", **kwargs), 100, seed=2))
    assert any(isinstance(x, tuple) for step in a[1:] for x in step)  # episodes ended and were reset


@pytest.mark.parametrize("backend", ["native", "pettingzoo"])
def test_positions_are_the_engines_cells_of_the_living_and_zeros_for_the_dead(backend):
    vec = envs.make("tiger_deer_v4", num_envs=2, seed=0, backend=backend, map_size=10, max_cycles=200)
    rng, deaths = np.random.default_rng(0), 0
    obs = vec.reset()
    for _ in range(400):
        runner = vec.runners[0]
        world, handles = runner.env.unwrapped.env, runner.env.unwrapped.handles
        cells = {tuple(xy) for h in handles for xy in world.get_pos(h).tolist()}
        for g, pos in obs.positions.items():
            alive = obs.agent_mask[g][0]
            assert {tuple(xy) for xy in pos[0][alive].tolist()} <= cells  # env 0's living agents, where they stand
            assert (pos[~obs.agent_mask[g]] == 0).all()
            assert ((pos >= 0) & (pos < 10)).all()
        step = vec.step({g: rng.integers(0, s.action_dim, (2, s.n_agents)) for g, s in vec.groups.items()})
        deaths += sum(int(t.sum()) for t in step.terminated.values())
        obs = step.next
    assert set(obs.positions) == set(vec.groups) and deaths > 0


@pytest.mark.parametrize("backend", ["native", "pettingzoo"])
def test_final_positions_are_where_the_episode_ended(backend):
    vec = envs.make("battle_v4", num_envs=2, seed=0, backend=backend, map_size=12, max_cycles=6)
    rng = np.random.default_rng(1)
    first = vec.reset().positions["red"].copy()  # battle's formation: every episode starts here
    for _ in range(6):
        step = vec.step({g: rng.integers(0, s.action_dim, (2, s.n_agents)) for g, s in vec.groups.items()})
    assert step.done.all()
    np.testing.assert_array_equal(step.next.positions["red"], first)  # the next episode's start
    assert not np.array_equal(step.final.positions["red"], first)  # where the last one ended (agents moved)
