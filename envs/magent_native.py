"""MAgent2 at engine speed: step magent2's GridWorld through its team handles, with batched per-team arrays.

PettingZoo's MAgent2 envs wrap one C++ `GridWorld`. Their `step` builds a dict per agent for actions, observations,
rewards and flags, and their `state()` asks the engine for every team's observations again. `MagentRunner` keeps the
PettingZoo env for what happens once per episode (reset: the engine's reset and the map generation, which draw from
the env's random generator) and drives the engine itself for every step, a few C calls per team: set the actions,
step, read the rewards, alive flags and observations, clear the dead, then read the living agents' ids and cells
(for the next step's order, `Observation.positions` and the state). It calls the engine's C functions directly,
with buffers and pointers made once per team (`_Team`), because magent2's Python getters build a new array and a
ctypes pointer on every call, which costs more than most of the engine's own work. While a team is whole, the
engine writes its observations straight into our batch row.

It writes the same arrays, bit for bit, as `EnvRunner` over the PettingZoo env does (tests/test_magent_native.py
holds the two equal over 1,000 random steps per id): the same agent order, observations (with the minimap and
extra feature planes where the env has them), rewards, terminations, truncations at `max_cycles`, dead-agent
masks and global state, including its zeros once a team is wiped out. `SyncVecEnv` and `SubprocVecEnv` take it in
place of `EnvRunner` (`envs.make(..., backend="native")`, the default for MAgent2 ids under `backend="auto"`).
"""

import ctypes
import warnings

import numpy as np
from magent2.c_lib import _LIB  # the engine's C functions, called with buffers and pointers made once

from envs.api import EpisodeStats
from envs.pettingzoo_env import EnvRunner, role_of

__all__ = ["MagentRunner"]


class _Team:
    """One acting team (an engine handle, one of our groups): its engine buffers, made once at the group's size, and
    C pointers to them. magent2's Python getters build a new array and a ctypes pointer on every call, which costs
    more than the engine's own work for most of them; a step here calls the C functions directly."""

    def __init__(self, world, handle, group: int, size: int, index_in_group: np.ndarray, obs_row=None):
        self.handle, self.group, self.size, self.index_in_group = handle, group, size, index_in_group
        view_shape, feature_shape = world.view_space[handle.value], world.feature_space[handle.value]
        self.x, self.y = view_shape[0] // 2, view_shape[1] // 2  # the view's centre: the agent's own cell
        self.ids, self.actions = np.zeros(size, np.int32), np.zeros(size, np.int32)
        self.rewards, self.alive = np.zeros(size, np.float32), np.zeros(size, bool)
        self.pos = np.zeros((size, 2), np.int32)
        self.view = np.zeros((size, *view_shape), np.float32)
        self.features = np.zeros((size, *feature_shape), np.float32)
        self._num = ctypes.c_int32()
        self.p_num = ctypes.pointer(self._num)
        self.p_ids, self.p_actions, self.p_rewards, self.p_alive, self.p_pos = (
            ctypes.c_void_p(a.ctypes.data) for a in (self.ids, self.actions, self.rewards, self.alive, self.pos)
        )
        self.p_observation = (ctypes.c_void_p * 2)(self.view.ctypes.data, self.features.ctypes.data)
        # while the whole team lives, the engine's rows are the group's rows in order: it writes our batch row
        direct = obs_row is not None and obs_row.dtype == np.float32 and obs_row.flags.c_contiguous
        self.direct = (ctypes.c_void_p * 2)(obs_row.ctypes.data, self.features.ctypes.data) if direct else None
        self.n, self.rows = 0, np.zeros(0, np.intp)

    def read_agents(self, game) -> None:
        """The team's living agents (after clear_dead): how many, their rows in the group in engine order, cells."""
        _LIB.env_get_info(game, self.handle, b"num", self.p_num)
        n = self.n = self._num.value
        if n > self.size:
            raise RuntimeError(f"a MAgent2 team grew to {n} agents, past its {self.size} at the start; the native "
                               "backend cannot follow it: use backend='pettingzoo'")  # fmt: skip
        _LIB.env_get_info(game, self.handle, b"id", self.p_ids)
        _LIB.env_get_info(game, self.handle, b"pos", self.p_pos)
        self.rows = self.index_in_group[self.ids[:n]]


class MagentRunner(EnvRunner):
    """Steps one MAgent2 env through its engine's team handles and writes row `index` of the batch arrays."""

    def __init__(self, env, spec, buffers, index):
        super().__init__(env, spec, buffers, index)
        self.world = env.env  # the C++ GridWorld behind the PettingZoo env
        self.handles, self.all_handles = list(env.handles), list(env._all_handles)
        self.acting = {h.value for h in self.handles}  # gather's food is a team that does not act
        self.minimap, self.extra = env.minimap_mode, env.extra_features
        self.max_cycles = env.max_cycles
        # engine id k is PettingZoo's possible_agents[k] (magent_parallel_env indexes observations by it); each
        # active handle is one team, which is one of our groups
        names = list(spec.groups)
        index_in_group = np.array([j for _, _, j in spec.agents])
        first = {}
        for agent, g, _ in spec.agents:
            first.setdefault(g, agent)
        teams = list(dict.fromkeys(role_of(a) for a in env.possible_agents))
        handle_groups = [next(g for g, agent in first.items() if role_of(agent) == team) for team in teams]
        plain = not (self.minimap or self.extra)  # observations are the view alone: no feature planes to append
        self.teams = [
            _Team(self.world, h, g, spec.groups[names[g]].n_agents, index_in_group, self._obs[g] if plain else None)
            for h, g in zip(self.handles, handle_groups, strict=True)
        ]
        sizes = [spec.groups[g].n_agents for g in names]
        self._active_np = [np.zeros(n, bool) for n in sizes]
        self._dead_np = [np.zeros(n, bool) for n in sizes]
        self._returns_np = [np.zeros(n, np.float64) for n in sizes]
        self._step_done = ctypes.c_int32()
        self._p_done = ctypes.pointer(self._step_done)
        self._frames = 0

    def reset(self, seed=None):
        super().reset(seed)  # the PettingZoo env's reset: engine reset, map, first observations (once per episode)
        for k, (_, g, j) in enumerate(self.spec.agents):  # EnvRunner's per-agent flags, as arrays per group
            self._active_np[g][j], self._dead_np[g][j] = self._active[k], self._dead[k]
        for returns in self._returns_np:
            returns[:] = 0.0
        for t in self.teams:
            t.read_agents(self.world.game)
        self._frames = 0

    def _compose(self, view, features):
        """Observations as the PettingZoo env composes them: the view, then feature planes where the env has them."""
        if self.minimap and not self.extra:
            features = features[:, -2:]
        if self.minimap or self.extra:
            planes = np.tile(features[:, None, None, :], (1, view.shape[1], view.shape[2], 1))
            view = np.concatenate([view, planes], axis=-1)
        return view

    def step(self):
        """Apply this env's row of `buffers.actions`; return the episode's stats if it finished."""
        game, teams = self.world.game, self.teams
        for t in teams:  # each team's actions in engine order
            t.actions[: t.n] = self._actions[t.group][t.rows]
        if self._frames == 0:
            # PettingZoo's MAgent2 reads its team sizes before the map is generated, so on the first step after a
            # reset it hands every team a zero-length slice at offset 0 of all the actions, and the engine reads
            # each team's actions from there: every team acts the first agents' actions. Kept, so the numbers stay
            # PettingZoo's (tests/test_magent_native.py).
            flat = np.concatenate([t.actions[: t.n] for t in teams])
            for t in teams:
                t.actions[: t.n] = flat[: t.n]
        for t in teams:
            _LIB.env_set_action(game, t.handle, t.p_actions)
        self._frames += 1
        _LIB.env_step(game, self._p_done)
        step_done = bool(self._step_done.value)
        truncate = self._frames >= self.max_cycles
        any_truncated, n_active, seen = False, 0, {}
        for t in teams:
            g, n, j = t.group, t.n, t.rows
            active, dead, returns = self._active_np[g], self._dead_np[g], self._returns_np[g]
            rewards = self._rewards[g]
            rewards[...] = 0.0
            _LIB.env_get_reward(game, t.handle, t.p_rewards)
            rewards[j] = t.rewards[:n]
            returns[j] += rewards[j]
            _LIB.env_get_info(game, t.handle, b"alive", t.p_alive)
            alive = t.alive[:n]
            died = np.ones(n, bool) if step_done else ~alive  # a finished game ends every agent
            terminated = self._terminated[g]
            terminated[...] = dead
            terminated[j] = died
            obs, mask = self._obs[g], self._mask[g]
            lived, gone = j[~died], j[died]
            if n:  # one observation query per team, for the observations and the state
                direct = n == len(obs) and t.direct is not None  # the whole team: the engine writes our rows
                _LIB.env_get_observation(game, t.handle, t.direct if direct else t.p_observation)
                view, features = (obs, t.features[:n]) if direct else (t.view[:n], t.features[:n])
                seen[t.handle.value] = (view[alive, t.x, t.y, 2], features[alive] if self.extra else None)
                if lived.size and not direct:
                    obs[j] = self._compose(view, features)
            obs[gone] = 0
            mask[gone] = False
            active[gone] = False
            dead[gone] = True
            if truncate and lived.size:
                active[lived] = False
                any_truncated = True
            n_active += int(np.count_nonzero(active))
        _LIB.gridworld_clear_dead(game)
        finished = n_active == 0
        self._length += 1
        for t in teams:  # after clear_dead: the living agents, their cells, next step's order
            t.read_agents(game)
        self._write_state(finished, seen)
        for t in teams:
            pos = self._pos[t.group]
            pos[...] = 0
            pos[t.rows] = t.pos[: t.n]
        return self._end_step(finished, any_truncated)

    def _write_state(self, finished, seen=None):
        """The PettingZoo env's `state()` (after clear_dead), from the step's own observation queries (a team that
        does not act, such as gather's food, is asked here); zeros once a team has no agent left, where `state()`
        itself fails and `EnvRunner` writes zeros."""
        if seen is None:  # at a reset: the PettingZoo env's own state()
            super()._write_state(finished)
            return
        pz, state, world = self.env, self._state, self.world
        cells = {t.handle.value: t.pos[: t.n] for t in self.teams}
        teams = [(h, cells[h.value] if h.value in cells else world.get_pos(h)) for h in self.all_handles]
        if any(len(pos) == 0 for _, pos in teams):
            state[...] = 0
            if not finished and not self._warned_state:
                warnings.warn("a team has no agents left mid-episode; using a zero state", stacklevel=2)
                self._warned_state = True
            return
        state[...] = pz.base_state
        n_teams = len(pz.team_sizes)
        for h, pos in teams:
            if h.value in seen:
                hp, features = seen[h.value]
            else:
                view, features = world.get_observation(h)
                hp = view[:, view.shape[1] // 2, view.shape[2] // 2, 2]
            x, y = pos[:, 0], pos[:, 1]
            state[x, y, 1 + h.value * 2] = 1
            state[x, y, 2 + h.value * 2] = hp
            if self.extra:
                m = pz._minimap_features
                pad = np.zeros((len(features), state.shape[2] - (1 + n_teams * 2 + features.shape[1] - m)))
                actions = np.concatenate([features[:, : -1 - m], pad], axis=1)
                state[x, y, 1 + n_teams * 2 :] = np.hstack([actions, features[:, -1 - m][:, None]])

    def _episode_stats(self):
        group_returns = {name: sum(r.tolist()) / len(r) for name, r in zip(self.spec.groups, self._returns_np,
                                                                           strict=True)}  # fmt: skip
        everyone = [x for r in self._returns_np for x in r.tolist()]
        return EpisodeStats(self.index, group_returns, sum(everyone) / len(everyone), self._length)
