"""envs/warehouse_numba.py equals rware 2.0.0: the same step from the same state (a delivery's new request aside,
which each draws from its own stream), through chains, cycles and ties of robots."""

import numpy as np
import pytest
from rware.warehouse import Direction, Warehouse

import envs
from envs.warehouse import TASKS, task_kwargs
from envs.warehouse_numba import WarehouseVecEnv, _pyset_order, _tuple_hash

EXTRA = ["rware-tiny-8ag", "rware-small-12ag-hard"]  # crowded: chains, cycles and ties everywhere
EXTRA += ["rware-medium-1ag", "rware-large-19ag-easy"]  # the ends of the range of tasks built by name


def package(task, max_cycles=500):
    return Warehouse(**{**task_kwargs(task), "max_steps": max_cycles})


def crowd(wh, rng):
    """Often put a robot, carrying a requested shelf, above a goal facing it (random moves seldom deliver); its
    observations."""
    H = wh.grid_size[0]
    if rng.random() < 0.6:
        agent, (gx, gy) = wh.agents[rng.integers(len(wh.agents))], wh.goals[rng.integers(len(wh.goals))]
        cell = (int(gx), int(gy) - 1)
        free = all((a.x, a.y) != cell for a in wh.agents) and all((s.x, s.y) != cell for s in wh.shelfs)
        if free and agent.carrying_shelf is None and wh.grid[1, agent.y, agent.x] == 0:
            shelf = wh.request_queue[rng.integers(len(wh.request_queue))]
            if all(a.carrying_shelf is not shelf for a in wh.agents) and shelf.y < H - 1:
                agent.x, agent.y, agent.dir = *cell, Direction.DOWN
                shelf.x, shelf.y, agent.carrying_shelf = *cell, shelf
    wh._recalc_grid()
    return tuple(wh._make_obs(a) for a in wh.agents)


def state(wh):
    return ([(a.x, a.y, a.dir.value, 0 if a.carrying_shelf is None else a.carrying_shelf.id) for a in wh.agents],
            [(s.x, s.y) for s in wh.shelfs])  # fmt: skip


def ours_state(env):
    w = env.worlds
    agents = list(zip(w.ax[0].tolist(), w.ay[0].tolist(), w.adir[0].tolist(), w.load[0].tolist(), strict=True))
    return agents, list(zip(w.sx[0].tolist(), w.sy[0].tolist(), strict=True))


def test_cpythons_set_order_is_rebuilt_exactly():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        cells = list(
            dict.fromkeys((int(rng.integers(0, 12)), int(rng.integers(0, 40))) for _ in range(rng.integers(1, 16)))
        )
        assert all(np.uint64(hash(c) % 2**64) == _tuple_hash(*c) for c in cells)
        built = set()
        for c in cells:
            built.add(c)
        hashes = np.array([_tuple_hash(*c) for c in cells], np.uint64)
        order = np.empty(len(cells), np.int64)
        _pyset_order(np.arange(len(cells)), hashes, len(cells), np.empty((2, 128), np.int64), order)
        assert [cells[k] for k in order] == list(set(iter(built)))  # networkx's show_nodes(nbunch_iter(c))


@pytest.mark.parametrize("task", [*TASKS, *EXTRA])
def test_every_step_equals_the_packages_from_the_same_state(task):
    wh, ours = package(task, max_cycles=100), WarehouseVecEnv(task, 1, max_cycles=100, autoreset=False)
    rng = np.random.default_rng(0)
    N = ours.task.agents
    wh.reset(seed=0)
    obs = crowd(wh, rng)
    steps = deliveries = blocked = 0
    while steps < 1500:
        ours.set_from(0, wh)
        while True:
            assert np.array_equal(ours.observe().obs["agent"][0], np.stack(obs)), (task, steps)
            actions = np.where(rng.random(N) < 0.5, 1, rng.integers(0, 5, N))  # forward often: queues and cycles
            before = state(wh)[0]
            obs, rewards, done, _, _ = wh.step(actions.tolist())
            result = ours.step({"agent": actions[None]})
            steps += 1
            assert result.rewards["agent"][0].tolist() == np.float32(rewards).tolist(), (task, steps)
            assert ours_state(ours) == state(wh), (task, steps)
            blocked += sum(a == 1 and b[:2] == c[:2] for a, b, c in zip(actions, before, state(wh)[0], strict=True))
            if sum(rewards) > 0:  # the new requests were drawn by each from its own stream: take the package's
                deliveries += 1
                ours.worlds.queue[0] = [s.id for s in wh.request_queue]
            assert result.truncated[0] == done and not result.terminated["agent"].any()
            if done:
                wh.reset()
                obs = crowd(wh, rng)
                break
            if rng.random() < 0.05:
                obs = crowd(wh, rng)
                break
    assert deliveries > 5 and blocked > 50  # deliveries and refused moves were exercised


def test_start_states_and_new_requests_come_from_the_packages_distribution():
    from scipy.stats import chi2_contingency

    task, n = "rware-tiny-4ag", 2000
    wh, ours = package(task), WarehouseVecEnv(task, n, seed=0)
    wh.reset(seed=0)
    ours.reset()
    w = ours.worlds
    theirs = {"cells": [], "dirs": [], "queue": []}
    for _ in range(n):
        wh.reset()
        theirs["cells"] += [a.y * wh.grid_size[1] + a.x for a in wh.agents]
        theirs["dirs"] += [a.dir.value for a in wh.agents]
        theirs["queue"] += [s.id for s in wh.request_queue]
    mine = {"cells": (w.ay * ours.task.width + w.ax).ravel().tolist(), "dirs": w.adir.ravel().tolist(),
            "queue": w.queue.ravel().tolist()}  # fmt: skip
    for key in theirs:
        values = sorted(set(theirs[key]) | set(mine[key]))
        table = np.array([[theirs[key].count(v) for v in values], [mine[key].count(v) for v in values]])
        assert chi2_contingency(table)[1] > 1e-4, key


def test_the_numba_backend_is_auto_for_the_warehouse_and_refuses_bad_actions():
    env = envs.make("rware-tiny-2ag", 3, 0, backend="auto")
    assert isinstance(env, WarehouseVecEnv)
    env.reset()
    with pytest.raises(ValueError, match=r"actions\['agent'\] has values in \[5, 5\]; expected"):
        env.step({"agent": np.full((3, 2), 5)})
