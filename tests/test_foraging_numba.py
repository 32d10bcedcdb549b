"""envs/foraging_numba.py equals lbforaging 2.0.0: the same step from the same state, bit for bit, and start states
from the same distribution."""

import numpy as np
import pytest
from lbforaging.foraging.environment import ForagingEnv
from scipy.stats import chi2_contingency

import envs
from envs.foraging import TASKS, task_kwargs
from envs.foraging_numba import ForagingVecEnv

EXTRA = ["Foraging-8x8-4p-4f", "Foraging-2s-12x12-5p-4f-coop"]  # crowded: collisions and shared loads
EXTRA += ["Foraging-5x5-2p-1f", "Foraging-2s-19x19-9p-4f-coop"]  # the ends of the range of tasks built by name


def package(task, max_cycles=50):
    return ForagingEnv(**task_kwargs(task), max_episode_steps=max_cycles)


def crowd(ref, rng):
    """Move most players of a package env beside a food, often all beside one (random actions alone seldom load,
    and a `-coop` food needs every player); returns its observations."""
    S = ref.field.shape[0]
    rows, cols = np.nonzero(ref.field)
    same = rng.integers(len(rows)) if len(rows) and rng.random() < 0.5 else None
    for player in ref.players:
        if len(rows) and rng.random() < 0.8:
            k = same if same is not None else rng.integers(len(rows))
            dr, dc = [(-1, 0), (1, 0), (0, -1), (0, 1)][rng.integers(4)]
            cell = (int(rows[k] + dr), int(cols[k] + dc))
            if 0 <= min(cell) and max(cell) < S and ref._is_empty_location(*cell):
                player.position = cell
    ref._gen_valid_moves()
    return ref._make_gym_obs()


@pytest.mark.parametrize("task", [*TASKS, *EXTRA])
def test_every_step_equals_the_packages_from_the_same_state(task):
    ref, ours = package(task), ForagingVecEnv(task, 1, autoreset=False)
    rng = np.random.default_rng(0)
    P = ours.task.players
    ref.reset(seed=1)
    obs = crowd(ref, rng)
    steps = loads = collected = 0
    while steps < 3000:
        ours.set_from(0, ref)
        while True:
            assert np.array_equal(ours.observe().obs["agent"][0], np.stack(obs)), (task, steps)
            actions = np.where(rng.random(P) < 0.5, 5, rng.integers(0, 6, P))  # loads often
            obs, rewards, done, _, _ = ref.step(actions.tolist())
            result = ours.step({"agent": actions[None]})
            steps, loads = steps + 1, loads + sum(r > 0 for r in rewards)
            assert result.rewards["agent"][0].tolist() == np.float32(rewards).tolist()
            assert np.array_equal(ours.worlds.field[0], ref.field)
            assert ours.worlds.pos[0].tolist() == [list(p.position) for p in ref.players]
            cleared = ref.field.sum() == 0
            assert result.terminated["agent"][0].all() == cleared and result.truncated[0] == (done and not cleared)
            if done:
                collected += cleared
                assert np.array_equal(result.final.obs["agent"][0], np.stack(obs))
                ref.reset()
                obs = crowd(ref, rng)
                break
    assert loads > 30  # the loading rules were exercised, and failed loads too


def _starts(make_reset, n):
    """Histograms of n start states: player cells, food cells, player levels, food levels, foods placed."""
    cells, foods, levels, food_levels, counts = [], [], [], [], []
    for i in range(n):
        field, pos, level = make_reset(i)
        cells += [r * field.shape[1] + c for r, c in pos]
        rows, cols = np.nonzero(field)
        foods += (rows * field.shape[1] + cols).tolist()
        levels += list(level)
        food_levels += field[rows, cols].tolist()
        counts.append(len(rows))
    return cells, foods, levels, food_levels, counts


@pytest.mark.parametrize(
    "task", ["Foraging-8x8-2p-2f-coop", "Foraging-10x10-3p-3f", "Foraging-15x15-4p-5f", "Foraging-5x5-2p-1f"]
)
def test_start_states_come_from_the_packages_distribution(task):
    ref = package(task)
    ref.reset(seed=0)

    def theirs(_):
        ref.reset()
        return ref.field.copy(), [p.position for p in ref.players], [p.level for p in ref.players]

    n = 3000
    ours = ForagingVecEnv(task, n, seed=0)
    ours.reset()
    w = ours.worlds
    mine = _starts(lambda i: (w.field[i], w.pos[i].tolist(), w.level[i].tolist()), n)
    for a, b in zip(_starts(theirs, n), mine, strict=True):
        values = sorted(set(a) | set(b))
        table = np.array([[a.count(v) for v in values], [b.count(v) for v in values]])
        table = table[:, table.sum(0) > 0]
        if table.shape[1] > 1:
            assert chi2_contingency(table)[1] > 1e-4, (task, values[:5])


def test_the_numba_backend_is_auto_for_foraging_and_refuses_bad_actions_like_the_others():
    env = envs.make("Foraging-8x8-2p-2f-coop", 4, 0, backend="auto")
    assert isinstance(env, ForagingVecEnv)
    env.reset()
    with pytest.raises(ValueError, match=r"actions\['agent'\] has values in \[6, 6\]; expected"):
        env.step({"agent": np.full((4, 2), 6)})
    with pytest.raises(ValueError, match=r"actions\['agent'\] has shape \(4,\)"):
        env.step({"agent": np.zeros(4, np.int64)})
    # the same sentence as the package's and the MPE's refusal: the names, then what it accepts
    refusal = r"^Foraging-8x8-2p-2f-coop got unexpected argument\(s\) grid, sight; it accepts: max_cycles$"
    with pytest.raises(envs.EnvArgumentError, match=refusal):
        envs.make("Foraging-8x8-2p-2f-coop", 1, 0, backend="numba", sight=3, grid=1)
