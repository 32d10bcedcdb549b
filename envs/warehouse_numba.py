"""The Multi-Robot Warehouse in Numba: E envs of one task stepped by one compiled call (`--backend numba`).

An env is the robots' cells, directions and loads, the shelves' cells, the request queue and two occupancy grids
(agent ids, shelf ids), batched over envs, with one SplitMix64 stream per env. `step_envs` applies rware 2.0.0's
rules operation by operation:

* a loaded robot whose forward cell holds a standing shelf (no robot carrying it) does nothing;
* every robot asks for an edge of a graph from its cell to the cell it wants (its own, unless it moves forward),
  and rware commits robots per weakly connected component: the robots on the component's cycle (none if the cycle
  is a swap of two), else the robots on its longest path, the others stay. Which of two equally long paths wins
  follows networkx: the first in the order its subgraph copy lists the nodes, which is Python's iteration order of
  the component's node set when the component holds less than half of the graph's nodes. That order is rebuilt
  here exactly: CPython's tuple hash of a cell and its set table (`_pyset_*`), as networkx 3 builds the set by a
  breadth-first search and copies it;
* moves, turns, loads (a shelf under an empty-handed robot) and unloads (off the highways) follow;
* a requested shelf on a goal cell is delivered: its robot gets 1, and a shelf drawn uniformly from those not
  requested replaces it in the queue (from our stream: a delivery's draw is the one thing not bit-equal);
* episodes are truncated at `max_cycles`; observations are rware's flattened vectors (71 floats at sensor range 1).

tests/test_warehouse_numba.py holds every step equal to the package's from the same state, queue draws aside.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from envs.mpe.physics import integer
from envs.team_vec_env import TeamVecEnv, accept_max_cycles_only
from envs.warehouse import task_kwargs

NOOP, FORWARD, LEFT, RIGHT, TOGGLE = range(5)
UP, DOWN, WEST, EAST = range(4)  # rware's Direction values: UP, DOWN, LEFT, RIGHT
TURN_RIGHT = np.array([EAST, WEST, UP, DOWN])  # wraplist [UP, RIGHT, DOWN, LEFT]: the next one
TURN_LEFT = np.array([WEST, EAST, DOWN, UP])


class Task(NamedTuple):
    height: int
    width: int
    agents: int
    queue: int
    max_steps: int
    highway: np.ndarray  # (H, W) bool
    goals: np.ndarray  # (G, 2) int64 (x, y)
    shelf_home: np.ndarray  # (S, 2) int64 (x, y): the shelves' cells at a reset, ids 1..S in this order


class Worlds(NamedTuple):
    ax: np.ndarray  # (E, N) int64
    ay: np.ndarray
    adir: np.ndarray
    load: np.ndarray  # (E, N) int64: the carried shelf's id, 0 for none
    sx: np.ndarray  # (E, S) int64
    sy: np.ndarray
    grid_a: np.ndarray  # (E, H, W) int64 agent ids (0: none)
    grid_s: np.ndarray  # (E, H, W) int64 shelf ids (0: none)
    queue: np.ndarray  # (E, Q) int64 requested shelf ids, in rware's order
    steps: np.ndarray  # (E,) int64
    rng: np.ndarray  # (E,) uint64


def layout(task_name: str, max_cycles: int) -> Task:
    """rware's grid for a task, from the package's own layout code (the highways and goals it computes)."""
    from rware.warehouse import Warehouse

    kw = task_kwargs(task_name)
    w = Warehouse(**{**kw, "max_steps": max_cycles})
    H, W = w.grid_size
    highway = w.highways.astype(bool)
    homes = [(x, y) for y in range(H) for x in range(W) if not highway[y, x]]
    return Task(
        H,
        W,
        kw["n_agents"],
        kw["request_queue_size"],
        int(max_cycles),
        highway,
        np.array(w.goals, np.int64),
        np.array(homes, np.int64),
    )


def new_worlds(task: Task, E: int) -> Worlds:
    N, S, H, W = task.agents, len(task.shelf_home), task.height, task.width
    z = lambda *shape: np.zeros(shape, np.int64)  # noqa: E731
    return Worlds(
        z(E, N),
        z(E, N),
        z(E, N),
        z(E, N),
        z(E, S),
        z(E, S),
        z(E, H, W),
        z(E, H, W),
        z(E, task.queue),
        z(E),
        np.zeros(E, np.uint64),
    )


# --- CPython's set order, which decides rware's ties -----------------------------------------------------------------

_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P5 = np.uint64(2870177450012600261)


@njit(cache=True, inline="always")
def _tuple_hash(x, y):
    """hash((x, y)) of two non-negative ints, as CPython 3.8+ computes it (xxHash-based tuple hash)."""
    acc = _P5
    for lane in (np.uint64(x), np.uint64(y)):
        acc = acc + lane * _P2
        acc = (acc << np.uint64(31)) | (acc >> np.uint64(33))
        acc = acc * _P1
    acc = acc + (np.uint64(2) ^ (_P5 ^ np.uint64(3527539)))
    return np.uint64(1546275796) if acc == np.uint64(0xFFFFFFFFFFFFFFFF) else acc


@njit(cache=True)
def _pyset_insert(table, mask, h, key):
    """CPython's insertion of a new key into a set table: 9 linear probes where they fit, then perturbation."""
    i = h & np.uint64(mask)
    perturb = h
    while True:
        probes = 9 if i + np.uint64(9) <= np.uint64(mask) else 0
        for j in range(probes + 1):
            if table[i + np.uint64(j)] < 0:
                table[i + np.uint64(j)] = key
                return
        perturb = perturb >> np.uint64(5)
        i = (i * np.uint64(5) + np.uint64(1) + perturb) & np.uint64(mask)


@njit(cache=True)
def _pyset_size(minused):
    size = 8
    while size <= minused:
        size <<= 1
    return size


@njit(cache=True)
def _pyset_table(order, hashes, buf):
    """The slot table (key or -1) of a set built by adding the keys `order` in turn, with CPython's probing and its
    resizes (at 3/5 full, to the smallest power of 2 above 4x the keys), in the two rows of `buf`; returns the row
    and the size of the final table."""
    row, size = 0, 8
    buf[row, :size] = -1
    for k in range(order.shape[0]):
        _pyset_insert(buf[row], size - 1, hashes[order[k]], order[k])
        if (k + 1) * 5 >= (size - 1) * 3:
            new_size = _pyset_size((k + 1) * 4)
            buf[1 - row, :new_size] = -1
            for s in range(size):
                if buf[row, s] >= 0:
                    _pyset_insert(buf[1 - row], new_size - 1, hashes[buf[row, s]], buf[row, s])
            row, size = 1 - row, new_size
    return row, size


@njit(cache=True)
def _pyset_order(keys, hashes, n, buf, out):
    """The iteration order of the node set of networkx's subgraph view, into out[:n]: the component's set s (keys
    added in BFS order), then set(iter(s)) built again key by key (nx.filters.show_nodes over nbunch_iter)."""
    for k in range(n):
        out[k] = k
    for _ in range(2):
        row, size = _pyset_table(out[:n], hashes, buf)
        m = 0
        for s in range(size):
            if buf[row, s] >= 0:
                out[m] = buf[row, s]
                m += 1
    for k in range(n):
        out[k] = keys[out[k]]


# --- the collision resolution --------------------------------------------------------------------------------------


@njit(cache=True)
def _commit(task, w, e, committed, scratch, hashes, table):
    """rware's committed robots: networkx's components, cycles and longest paths, with networkx's tie order.
    The robots' cells and targets are scratch rows 1-4 (see step_env); rows 5-15 are this function's."""
    N = task.agents
    sx_, sy_, tx_, ty_ = scratch[1, :N], scratch[2, :N], scratch[3, :N], scratch[4, :N]
    # the graph's nodes in insertion order: each robot adds its cell, then its target
    nx_, ny_, start, target = scratch[5], scratch[6], scratch[7, :N], scratch[8, :N]
    n = 0
    for i in range(2 * N):
        a = i // 2
        x, y = (sx_[a], sy_[a]) if i % 2 == 0 else (tx_[a], ty_[a])
        k = -1
        for j in range(n):
            if nx_[j] == x and ny_[j] == y:
                k = j
        if k < 0:
            nx_[n], ny_[n], k = x, y, n
            n += 1
        if i % 2 == 0:
            start[a] = k
        else:
            target[a] = k
    agent_at, comp, bfs = scratch[9, :n], scratch[10, :n], scratch[11, :n]
    dist, best, seen_at, order = scratch[12, :n], scratch[13, :n], scratch[14, :n], scratch[15]
    agent_at[:] = -1
    for i in range(N):
        agent_at[start[i]] = i
    comp[:] = -1
    committed[:] = False
    ncomp = 0
    for root in range(n):
        if comp[root] >= 0:
            continue
        # networkx's _plain_bfs: each node's successor, then its predecessors in edge order
        size, head = 1, 0
        bfs[0], comp[root] = root, ncomp
        while head < size:
            v = bfs[head]
            head += 1
            if agent_at[v] >= 0:
                u = target[agent_at[v]]
                if comp[u] < 0:
                    comp[u], bfs[size] = ncomp, u
                    size += 1
            for i in range(N):
                if target[i] == v and comp[start[i]] < 0:
                    comp[start[i]], bfs[size] = ncomp, start[i]
                    size += 1
        # the subgraph copy's node order: set order when the component is under half the graph, else insertion order
        if size == 1:
            order[0] = bfs[0]
        elif 2 * size < n:
            for k in range(size):
                hashes[k] = _tuple_hash(nx_[bfs[k]], ny_[bfs[k]])
            _pyset_order(bfs[:size], hashes, size, table, order)
        else:
            m = 0
            for v in range(n):
                if comp[v] == ncomp:
                    order[m] = v
                    m += 1
        # a cycle? follow the out-edges from any node: a component holds at most one cycle
        seen_at[:] = -1
        v, t = order[0], 0
        while agent_at[v] >= 0 and seen_at[v] < 0:
            seen_at[v], t = t, t + 1
            v = target[agent_at[v]]
        if agent_at[v] >= 0:  # v is on the cycle
            length, u = 1, target[agent_at[v]]
            while u != v:
                length, u = length + 1, target[agent_at[u]]
            if length != 2:  # a swap of two is physically impossible: nobody moves
                committed[agent_at[v]] = True
                u = target[agent_at[v]]
                while u != v:
                    committed[agent_at[u]] = True
                    u = target[agent_at[u]]
        else:  # a tree into its sink v: the longest path, ties to the first predecessor in the copy's order
            for k in range(size):
                dist[order[k]] = -1
            changed = True
            while changed:  # depths: a node's is one more than its deepest predecessor's
                changed = False
                for k in range(size):
                    u = order[k]
                    d, b = 0, -1
                    for kk in range(size):
                        p = order[kk]
                        if agent_at[p] >= 0 and target[agent_at[p]] == u and p != u:
                            if dist[p] < 0:
                                d = -2
                                break
                            if b < 0 or dist[p] + 1 > d:
                                d, b = dist[p] + 1, p
                    if d >= 0 and dist[u] != d:
                        dist[u], best[u], changed = d, b, True
            u = v
            while best[u] >= 0 and dist[u] > 0:
                u = best[u]
                committed[agent_at[u]] = True
        ncomp += 1


# --- reset, step, observe ------------------------------------------------------------------------------------------


@njit(cache=True)
def _regrid(task, w, e):
    w.grid_a[e] = 0
    w.grid_s[e] = 0
    for s in range(w.sx.shape[1]):
        w.grid_s[e, w.sy[e, s], w.sx[e, s]] = s + 1
    for i in range(task.agents):
        w.grid_a[e, w.ay[e, i], w.ax[e, i]] = i + 1


@njit(cache=True)
def _requested(w, e, shelf):
    for q in range(w.queue.shape[1]):
        if w.queue[e, q] == shelf:
            return True
    return False


@njit(cache=True)
def reset_env(task, w, e):
    """Shelves home, robots on distinct cells anywhere (under shelves too) facing anywhere, a uniform request queue."""
    H, W, N, S = task.height, task.width, task.agents, len(task.shelf_home)
    for s in range(S):
        w.sx[e, s], w.sy[e, s] = task.shelf_home[s, 0], task.shelf_home[s, 1]
    for i in range(N):
        while True:
            cell = integer(w.rng, e, H * W)
            free = True
            for j in range(i):
                if w.ay[e, j] * W + w.ax[e, j] == cell:
                    free = False
            if free:
                break
        w.ay[e, i], w.ax[e, i] = cell // W, cell % W
        w.adir[e, i] = integer(w.rng, e, 4)
        w.load[e, i] = 0
    w.queue[e] = 0
    for q in range(task.queue):
        while True:
            shelf = 1 + integer(w.rng, e, S)
            if not _requested(w, e, shelf):
                break
        w.queue[e, q] = shelf
    w.steps[e] = 0
    _regrid(task, w, e)


@njit(cache=True)
def step_env(task, w, e, actions, rewards, committed, scratch, hashes, table):
    """One step of env e: actions (N,) -> rewards (N,); returns whether a shelf was delivered. Scratch rows 0-4 hold
    the requests, the robots' cells and their targets (int64 (16, 2N); hashes uint64 (2N,); table int64 (2, T), T a
    power of 2 above 8N: the set tables of the tie order)."""
    H, W, N = task.height, task.width, task.agents
    req, sx_, sy_, tx_, ty_ = scratch[0, :N], scratch[1, :N], scratch[2, :N], scratch[3, :N], scratch[4, :N]
    req[:], sx_[:], sy_[:] = actions, w.ax[e], w.ay[e]
    tx_[:], ty_[:] = sx_, sy_
    for i in range(N):
        if req[i] == FORWARD:
            d = w.adir[e, i]
            if d == UP:
                ty_[i] = max(0, sy_[i] - 1)
            elif d == DOWN:
                ty_[i] = min(H - 1, sy_[i] + 1)
            elif d == WEST:
                tx_[i] = max(0, sx_[i] - 1)
            else:
                tx_[i] = min(W - 1, sx_[i] + 1)
        moves = tx_[i] != sx_[i] or ty_[i] != sy_[i]
        if w.load[e, i] > 0 and moves and w.grid_s[e, ty_[i], tx_[i]] > 0:
            other = w.grid_a[e, ty_[i], tx_[i]]
            if not (other > 0 and w.load[e, other - 1] > 0):  # a standing shelf there: it cannot go
                req[i], tx_[i], ty_[i] = NOOP, sx_[i], sy_[i]
    _commit(task, w, e, committed, scratch, hashes, table)
    for i in range(N):
        rewards[i] = 0.0
        if not committed[i]:
            req[i] = NOOP
    for i in range(N):
        if req[i] == FORWARD:
            w.ax[e, i], w.ay[e, i] = tx_[i], ty_[i]
            if w.load[e, i] > 0:
                w.sx[e, w.load[e, i] - 1], w.sy[e, w.load[e, i] - 1] = tx_[i], ty_[i]
        elif req[i] == LEFT:
            w.adir[e, i] = TURN_LEFT[w.adir[e, i]]
        elif req[i] == RIGHT:
            w.adir[e, i] = TURN_RIGHT[w.adir[e, i]]
        elif req[i] == TOGGLE and w.load[e, i] == 0:
            w.load[e, i] = w.grid_s[e, w.ay[e, i], w.ax[e, i]]  # the grid before this step's moves, as rware reads it
        elif req[i] == TOGGLE and not task.highway[w.ay[e, i], w.ax[e, i]]:
            w.load[e, i] = 0
    _regrid(task, w, e)
    delivered = False
    S = w.sx.shape[1]
    for g in range(task.goals.shape[0]):
        gx, gy = task.goals[g, 0], task.goals[g, 1]
        shelf = w.grid_s[e, gy, gx]
        if shelf == 0 or not _requested(w, e, shelf):
            continue
        delivered = True
        while True:  # a shelf not requested, uniformly
            new = 1 + integer(w.rng, e, S)
            if not _requested(w, e, new):
                break
        for q in range(task.queue):
            if w.queue[e, q] == shelf:
                w.queue[e, q] = new
                break
        rewards[w.grid_a[e, gy, gx] - 1] += 1.0
    w.steps[e] += 1
    return delivered


@njit(cache=True)
def observe_env(task, w, e, out):
    """rware's flattened observation of every robot (sensor range 1): itself, then the 3 x 3 cells around it."""
    H, W, N = task.height, task.width, task.agents
    width = 8 + 9 * 7
    for i in range(N):
        o = i * width
        x, y = w.ax[e, i], w.ay[e, i]
        out[o], out[o + 1], out[o + 2] = x, y, 1.0 if w.load[e, i] > 0 else 0.0
        for d in range(4):
            out[o + 3 + d] = 1.0 if w.adir[e, i] == d else 0.0
        out[o + 7] = 1.0 if task.highway[y, x] else 0.0
        k = o + 8
        for yy in range(y - 1, y + 2):
            for xx in range(x - 1, x + 2):
                inside = 0 <= yy < H and 0 <= xx < W
                a = w.grid_a[e, yy, xx] if inside else 0
                s = w.grid_s[e, yy, xx] if inside else 0
                out[k] = 1.0 if a > 0 else 0.0
                for d in range(4):
                    out[k + 1 + d] = (1.0 if d == UP else 0.0) if a == 0 else (1.0 if w.adir[e, a - 1] == d else 0.0)
                out[k + 5] = 1.0 if s > 0 else 0.0
                out[k + 6] = 1.0 if s > 0 and _requested(w, e, s) else 0.0
                k += 7


@njit(cache=True)
def step_envs(task, w, actions, autoreset, obs, final, rewards, terminated, truncated, ep_return, ep_length):
    """Step all envs; an env whose episode ended (always at the time limit) writes its last observations to `final`
    and resets."""
    terminated[:] = False
    committed = np.empty(task.agents, np.bool_)
    scratch, hashes = np.empty((16, 2 * task.agents), np.int64), np.empty(2 * task.agents, np.uint64)
    table = np.empty((2, _pyset_size(8 * task.agents)), np.int64)
    for e in range(actions.shape[0]):
        step_env(task, w, e, actions[e], rewards[e], committed, scratch, hashes, table)
        truncated[e] = w.steps[e] >= task.max_steps
        ep_return[e] += rewards[e]
        ep_length[e] += 1
        observe_env(task, w, e, obs[e])
        if autoreset and truncated[e]:
            final[e] = obs[e]
            reset_env(task, w, e)
            observe_env(task, w, e, obs[e])


@njit(cache=True)
def reset_envs(task, w, obs):
    for e in range(obs.shape[0]):
        reset_env(task, w, e)
        observe_env(task, w, e, obs[e])


@njit(cache=True)
def observe_envs(task, w, obs):
    for e in range(obs.shape[0]):
        observe_env(task, w, e, obs[e])


# --- the VecEnv ----------------------------------------------------------------------------------------------------


class WarehouseVecEnv(TeamVecEnv):
    """`num_envs` copies of one RWARE task (envs/warehouse.py's names), stepped together."""

    reset_kernel, observe_kernel, step_kernel = reset_envs, observe_envs, step_envs

    def __init__(self, task: str, num_envs: int = 1, seed: int = 0, max_cycles: int = 500, autoreset: bool = True):
        spec = layout(task, max_cycles)
        super().__init__(
            task, spec, new_worlds(spec, num_envs), num_envs, seed, max_cycles, autoreset, spec.agents, 8 + 9 * 7, 5
        )

    def set_from(self, env_index: int, wh) -> None:
        """Copy the state of an rware Warehouse into env `env_index` (a new episode from there: steppable)."""
        w, e = self.worlds, env_index
        for i, a in enumerate(wh.agents):
            w.ax[e, i], w.ay[e, i], w.adir[e, i] = a.x, a.y, a.dir.value
            w.load[e, i] = 0 if a.carrying_shelf is None else a.carrying_shelf.id
        for s, shelf in enumerate(wh.shelfs):
            w.sx[e, s], w.sy[e, s] = shelf.x, shelf.y
        w.queue[e] = [s.id for s in wh.request_queue]
        w.steps[e] = wh._cur_steps
        _regrid(self.task, w, e)
        self.started(e)


def make_vec(env_id: str, num_envs: int = 1, seed: int = 0, max_cycles: int = 500, **kwargs) -> WarehouseVecEnv:
    """`num_envs` Numba copies of an RWARE task; `render_mode` is accepted and ignored."""
    accept_max_cycles_only(env_id, max_cycles, kwargs)
    return WarehouseVecEnv(env_id, num_envs, seed, max_cycles)
