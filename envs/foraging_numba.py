"""Level-Based Foraging in Numba: E envs of one task stepped by one compiled call (`--backend numba`).

An env is a few integer arrays batched over envs: the field of food levels (E, S, S), the players' cells (E, P, 2)
and levels (E, P), the step count, the food level spawned at the reset (the reward's normaliser) and one SplitMix64
stream per env (envs.mpe.physics). `step_envs` applies lbforaging 2.0.0's rules operation by operation:

* an action that is not valid in the current state (a move off the field or onto food, a load beside no food) is
  NONE;
* every player claims a cell, its own for NONE and LOAD: a player moves only where it is the only claimant (two
  players may swap cells, as in the package);
* each food with loading players beside it (no cell is beside two foods: foods spawn at least 3 cells apart) is
  collected when their levels sum to at least its level, each scoring level * food / (sum * food spawned);
* the episode terminates when the field is empty and is truncated at `max_cycles`;
* observations are the package's vectors: the foods in sight in row-major order, then the player itself and the
  other players in sight, as (row, col, level) relative to the sight window's corner, (-1, -1, 0) where none.

Resets draw from the package's distribution (players anywhere free, level 1 or 2, each avoiding the cells the
others hold, including the previous episode's cells of those not yet placed, as the package's check does; foods
inside the border, never within one cell or two in a line of another food, at the sum of the three lowest player
levels (`-coop`) or uniform up to it), not from its random stream. tests/test_foraging_numba.py holds the steps
equal to the package's from the same state, bit for bit, and the start states to the package's distribution.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from envs.foraging import task_kwargs
from envs.mpe.physics import integer
from envs.team_vec_env import TeamVecEnv, accept_max_cycles_only

NONE, NORTH, SOUTH, WEST, EAST, LOAD = range(6)
ATTEMPTS = 1000  # the package's tries to place a player or a food


class Task(NamedTuple):
    """What stays fixed over a task's episodes."""

    size: int  # the field is size x size
    players: int
    foods: int  # max_num_food
    sight: int
    coop: bool  # force_coop: every food at the maximum level
    max_steps: int


class Worlds(NamedTuple):
    """E envs' state: `pos` and `level` keep the last episode's values through a reset, which reads them."""

    field: np.ndarray  # (E, S, S) int64 food levels
    pos: np.ndarray  # (E, P, 2) int64 (row, col); -1 before the first reset
    level: np.ndarray  # (E, P) int64
    steps: np.ndarray  # (E,) int64
    spawned: np.ndarray  # (E,) float64: the field's sum at the reset
    rng: np.ndarray  # (E,) uint64 SplitMix64 states


def new_worlds(task: Task, num_envs: int) -> Worlds:
    E, S, P = num_envs, task.size, task.players
    return Worlds(
        np.zeros((E, S, S), np.int64),
        np.full((E, P, 2), -1, np.int64),
        np.zeros((E, P), np.int64),
        np.zeros(E, np.int64),
        np.zeros(E, np.float64),
        np.zeros(E, np.uint64),
    )


# --- reset ---------------------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _held(pos, e, row, col, skip):
    """Whether a player other than `skip` holds (row, col) (a player not yet placed: its previous cell)."""
    for q in range(pos.shape[1]):
        if q != skip and pos[e, q, 0] == row and pos[e, q, 1] == col:
            return True
    return False


@njit(cache=True, inline="always")
def _food_near(field, e, row, col):
    """The package's spawn test: food in the 3 x 3 block around (row, col), or within 2 cells in its row or column."""
    S = field.shape[1]
    for r in range(max(row - 1, 0), min(row + 2, S)):
        for c in range(max(col - 1, 0), min(col + 2, S)):
            if field[e, r, c] > 0:
                return True
    for r in range(max(row - 2, 0), min(row + 3, S)):
        if field[e, r, col] > 0:
            return True
    for c in range(max(col - 2, 0), min(col + 3, S)):
        if field[e, row, c] > 0:
            return True
    return False


@njit(cache=True)
def reset_env(task, w, e):
    S, P = task.size, task.players
    w.field[e] = 0
    for p in range(P):
        for _ in range(ATTEMPTS):
            row, col = integer(w.rng, e, S), integer(w.rng, e, S)
            if not _held(w.pos, e, row, col, p):
                w.pos[e, p, 0], w.pos[e, p, 1] = row, col
                w.level[e, p] = 1 + integer(w.rng, e, 2)
                break
    levels = np.sort(w.level[e])
    top = levels[: min(3, P)].sum()  # the foods' maximum level: the three lowest players together
    low = top if task.coop else 1
    count = 0
    for _ in range(ATTEMPTS):
        if count == task.foods:
            break
        row, col = 1 + integer(w.rng, e, S - 2), 1 + integer(w.rng, e, S - 2)
        if _food_near(w.field, e, row, col) or _held(w.pos, e, row, col, -1):
            continue
        w.field[e, row, col] = low if low == top else low + integer(w.rng, e, top - low + 1)
        count += 1
    w.spawned[e] = w.field[e].sum()
    w.steps[e] = 0


# --- step ----------------------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _valid(w, e, p, action):
    """lbforaging's _is_valid_action in the current state."""
    S = w.field.shape[1]
    row, col = w.pos[e, p, 0], w.pos[e, p, 1]
    f = w.field
    if action == NORTH:
        return row > 0 and f[e, row - 1, col] == 0
    if action == SOUTH:
        return row < S - 1 and f[e, row + 1, col] == 0
    if action == WEST:
        return col > 0 and f[e, row, col - 1] == 0
    if action == EAST:
        return col < S - 1 and f[e, row, col + 1] == 0
    if action == LOAD:  # adjacent_food: the four neighbours, clamped to the field
        adjacent = f[e, max(row - 1, 0), col] + f[e, min(row + 1, S - 1), col]
        return adjacent + f[e, row, max(col - 1, 0)] + f[e, row, min(col + 1, S - 1)] > 0
    return True


@njit(cache=True, inline="always")
def _food_beside(w, e, row, col):
    """lbforaging's adjacent_food_location, with its bounds as written (north needs row > 1, west col > 1)."""
    S, f = w.field.shape[1], w.field
    if row > 1 and f[e, row - 1, col] > 0:
        return row - 1, col
    if row < S - 1 and f[e, row + 1, col] > 0:
        return row + 1, col
    if col > 1 and f[e, row, col - 1] > 0:
        return row, col - 1
    if col < S - 1 and f[e, row, col + 1] > 0:
        return row, col + 1
    return -1, -1


@njit(cache=True, inline="always")
def step_env(task, w, e, actions, rewards, act, target, done):
    """One step of env e: actions (P,) -> rewards (P,), with scratch arrays act (P,), target (P, 2) and done (P,)."""
    P = task.players
    for p in range(P):
        act[p] = actions[p] if _valid(w, e, p, actions[p]) else NONE
        row, col = w.pos[e, p, 0], w.pos[e, p, 1]
        a = act[p]
        target[p, 0] = row - 1 if a == NORTH else row + 1 if a == SOUTH else row
        target[p, 1] = col - 1 if a == WEST else col + 1 if a == EAST else col
        rewards[p] = 0.0
    # a player moves where it is the only one to claim the cell
    for p in range(P):
        alone = True
        for q in range(P):
            if q != p and target[q, 0] == target[p, 0] and target[q, 1] == target[p, 1]:
                alone = False
        if alone:
            w.pos[e, p, 0], w.pos[e, p, 1] = target[p, 0], target[p, 1]
    # loading: the players beside each food load it together
    done[:] = False
    for p in range(P):
        if act[p] != LOAD or done[p]:
            continue
        frow, fcol = _food_beside(w, e, w.pos[e, p, 0], w.pos[e, p, 1])
        food = w.field[e, frow, fcol]
        total = 0
        for q in range(P):
            dr, dc = abs(w.pos[e, q, 0] - frow), abs(w.pos[e, q, 1] - fcol)
            if act[q] == LOAD and not done[q] and (dr == 1 and dc == 0 or dc == 1 and dr == 0):
                done[q] = True
                total += w.level[e, q]
        if total < food:
            continue  # not collected (no penalty in the benchmark's tasks)
        for q in range(P):
            dr, dc = abs(w.pos[e, q, 0] - frow), abs(w.pos[e, q, 1] - fcol)
            if act[q] == LOAD and (dr == 1 and dc == 0 or dc == 1 and dr == 0):
                rewards[q] = float(w.level[e, q] * food) / float(total * w.spawned[e])
        w.field[e, frow, fcol] = 0
    w.steps[e] += 1


@njit(cache=True, inline="always")
def observe_env(task, w, e, out, food):
    """Every player's observation vector of env e into out (P * (3F + 3P),), with a scratch array food (F, 3);
    returns how many foods are left on the field."""
    S, P, F, s = task.size, task.players, task.foods, task.sight
    n = 0  # the foods in row-major order: the order in which a sight window lists them
    for r in range(S):
        for c in range(S):
            if w.field[e, r, c] > 0:
                food[n, 0], food[n, 1], food[n, 2] = r, c, w.field[e, r, c]
                n += 1
    width = 3 * (F + P)
    for p in range(P):
        o = p * width
        for k in range(F + P):
            out[o + 3 * k], out[o + 3 * k + 1], out[o + 3 * k + 2] = -1.0, -1.0, 0.0
        row, col = w.pos[e, p, 0], w.pos[e, p, 1]
        r0, c0 = row - min(s, row), col - min(s, col)  # the sight window's corner
        k = o
        for i in range(n):
            if r0 <= food[i, 0] <= row + s and c0 <= food[i, 1] <= col + s:
                out[k], out[k + 1], out[k + 2] = food[i, 0] - r0, food[i, 1] - c0, food[i, 2]
                k += 3
        k = o + 3 * F
        for i in range(-1, P):  # itself first, then the others in order
            q = p if i < 0 else i
            if i == p:
                continue
            y, x = w.pos[e, q, 0] - r0, w.pos[e, q, 1] - c0
            if min(y, x) >= 0 and max(y, x) <= 2 * s:
                out[k], out[k + 1], out[k + 2] = y, x, w.level[e, q]
                k += 3
    return n


@njit(cache=True)
def step_envs(task, w, actions, autoreset, obs, final, rewards, terminated, truncated, ep_return, ep_length):
    """Step all envs; an env whose episode ended writes its last observations to `final` and resets."""
    P = task.players
    act, target, done = np.empty(P, np.int64), np.empty((P, 2), np.int64), np.empty(P, np.bool_)
    food = np.empty((task.foods, 3), np.int64)
    for e in range(actions.shape[0]):
        step_env(task, w, e, actions[e], rewards[e], act, target, done)
        cleared = observe_env(task, w, e, obs[e], food) == 0
        truncated[e] = not cleared and w.steps[e] >= task.max_steps
        terminated[e, :] = cleared
        ep_return[e] += rewards[e]
        ep_length[e] += 1
        if autoreset and (cleared or truncated[e]):
            final[e] = obs[e]
            reset_env(task, w, e)
            observe_env(task, w, e, obs[e], food)


@njit(cache=True)
def reset_envs(task, w, obs):
    food = np.empty((task.foods, 3), np.int64)
    for e in range(obs.shape[0]):
        reset_env(task, w, e)
        observe_env(task, w, e, obs[e], food)


@njit(cache=True)
def observe_envs(task, w, obs):
    food = np.empty((task.foods, 3), np.int64)
    for e in range(obs.shape[0]):
        observe_env(task, w, e, obs[e], food)


# --- the VecEnv ----------------------------------------------------------------------------------------------------


class ForagingVecEnv(TeamVecEnv):
    """`num_envs` copies of one Level-Based Foraging task (envs/foraging.py's names), stepped together."""

    reset_kernel, observe_kernel, step_kernel = reset_envs, observe_envs, step_envs

    def __init__(self, task: str, num_envs: int = 1, seed: int = 0, max_cycles: int = 50, autoreset: bool = True):
        kw = task_kwargs(task)
        spec = Task(
            kw["field_size"][0], kw["players"], kw["max_num_food"], kw["sight"], kw["force_coop"], int(max_cycles)
        )
        width = 3 * (spec.foods + spec.players)
        super().__init__(
            task, spec, new_worlds(spec, num_envs), num_envs, seed, max_cycles, autoreset, spec.players, width, 6
        )

    def set_from(self, env_index: int, lbf) -> None:
        """Copy the state of a lbforaging ForagingEnv into env `env_index` (a new episode from there: steppable)."""
        w = self.worlds
        w.field[env_index] = lbf.field
        w.pos[env_index] = [p.position for p in lbf.players]
        w.level[env_index] = [p.level for p in lbf.players]
        w.steps[env_index], w.spawned[env_index] = lbf.current_step, float(lbf._food_spawned)
        self.started(env_index)


def make_vec(env_id: str, num_envs: int = 1, seed: int = 0, max_cycles: int = 50, **kwargs) -> ForagingVecEnv:
    """`num_envs` Numba copies of a Level-Based Foraging task; `render_mode` is accepted and ignored."""
    accept_max_cycles_only(env_id, max_cycles, kwargs)
    return ForagingVecEnv(env_id, num_envs, seed, max_cycles)
