"""MAgent2 at engine speed: step magent2's GridWorld through its team handles, with batched per-team arrays.

PettingZoo's MAgent2 envs wrap one C++ `GridWorld`. Their `step` builds a dict per agent for actions, observations,
rewards and flags, and their `state()` asks the engine for every team's observations again. `MagentRunner` keeps the
PettingZoo env for what happens once per episode (reset: the engine's reset and the map generation, which draw from
the env's random generator) and drives the engine itself for every step, one call per team:
`set_action(handle, actions)`, `step()`, `get_alive`, `get_reward`, `get_observation`, `clear_dead()`, then the
state and the agents' cells (`Observation.positions`) from one `get_pos` per team.

It writes the same arrays, bit for bit, as `EnvRunner` over the PettingZoo env does (tests/test_magent_native.py
holds the two equal over 1,000 random steps per id): the same agent order, observations (with the minimap and
extra feature planes where the env has them), rewards, terminations, truncations at `max_cycles`, dead-agent
masks and global state, including its zeros once a team is wiped out. `SyncVecEnv` and `SubprocVecEnv` take it in
place of `EnvRunner` (`envs.make(..., backend="native")`, the default for MAgent2 ids under `backend="auto"`).
"""

import warnings

import numpy as np

from envs.api import EpisodeStats
from envs.pettingzoo_env import EnvRunner, role_of

__all__ = ["MagentRunner"]


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
        self.index_in_group = np.array([j for _, _, j in spec.agents])
        first = {}
        for agent, g, _ in spec.agents:
            first.setdefault(g, agent)
        teams = list(dict.fromkeys(role_of(a) for a in env.possible_agents))
        self.handle_groups = [next(g for g, agent in first.items() if role_of(agent) == team) for team in teams]
        sizes = [spec.groups[g].n_agents for g in names]
        self._active_np = [np.zeros(n, bool) for n in sizes]
        self._dead_np = [np.zeros(n, bool) for n in sizes]
        self._returns_np = [np.zeros(n, np.float64) for n in sizes]
        self._frames = 0

    def reset(self, seed=None):
        super().reset(seed)  # the PettingZoo env's reset: engine reset, map, first observations (once per episode)
        for k, (_, g, j) in enumerate(self.spec.agents):  # EnvRunner's per-agent flags, as arrays per group
            self._active_np[g][j], self._dead_np[g][j] = self._active[k], self._dead[k]
        for returns in self._returns_np:
            returns[:] = 0.0
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
        world = self.world
        ids = [world.get_agent_id(h) for h in self.handles]
        # each team's actions in engine order (the arrays stay alive until step(), which reads them)
        actions = [np.ascontiguousarray(self._actions[g][self.index_in_group[k]], dtype=np.int32)
                   for g, k in zip(self.handle_groups, ids, strict=True)]  # fmt: skip
        if self._frames == 0:
            # PettingZoo's MAgent2 reads its team sizes before the map is generated, so on the first step after a
            # reset it hands every team a zero-length slice at offset 0 of all the actions, and the engine reads
            # each team's actions from there: every team acts the first agents' actions. Kept, so the numbers stay
            # PettingZoo's (tests/test_magent_native.py).
            flat = np.concatenate(actions)
            actions = [flat[: len(a)] for a in actions]
        for h, a in zip(self.handles, actions, strict=True):
            world.set_action(h, a)
        self._frames += 1
        step_done = world.step()
        del actions
        truncate = self._frames >= self.max_cycles
        any_truncated, n_active, seen = False, 0, {}
        for h, g, k in zip(self.handles, self.handle_groups, ids, strict=True):
            j = self.index_in_group[k]
            active, dead, returns = self._active_np[g], self._dead_np[g], self._returns_np[g]
            rewards = np.zeros(len(active), np.float32)
            rewards[j] = world.get_reward(h)
            returns[j] += rewards[j]
            alive = world.get_alive(h)
            died = np.ones(len(j), bool) if step_done else ~alive  # a finished game ends every agent
            terminated = dead.copy()
            terminated[j] = died
            obs, mask = self._obs[g], self._mask[g]
            lived, gone = j[~died], j[died]
            if len(j):  # one observation query per team, for the observations and the state
                view, features = world.get_observation(h)
                x, y = view.shape[1] // 2, view.shape[2] // 2  # the state keeps each agent's own hit points: its
                seen[h.value] = (view[alive, x, y, 2], features[alive] if self.extra else None)  # view's centre
                if lived.size:
                    composed = self._compose(view, features)
                    if len(j) == len(obs):  # the whole team stepped (most steps): rows in order, one copy
                        obs[...] = composed
                    else:
                        obs[j] = composed
            obs[gone] = 0
            mask[gone] = False
            active[gone] = False
            dead[gone] = True
            if truncate and lived.size:
                active[lived] = False
                any_truncated = True
            n_active += int(active.sum())
            self._rewards[g][...] = rewards
            self._terminated[g][...] = terminated
        world.clear_dead()
        finished = n_active == 0
        self._length += 1
        teams = [(h, world.get_pos(h)) for h in self.all_handles]  # after clear_dead: the living agents' cells
        self._write_state(finished, seen, teams)
        self._write_positions([(h, xy) for h, xy in teams if h.value in self.acting])
        return self._end_step(finished, any_truncated)

    def _write_state(self, finished, seen=None, teams=None):
        """The PettingZoo env's `state()` (after clear_dead), from the step's own observation queries (a team that
        does not act, such as gather's food, is asked here); zeros once a team has no agent left, where `state()`
        itself fails and `EnvRunner` writes zeros."""
        if seen is None:  # at a reset: the PettingZoo env's own state()
            super()._write_state(finished)
            return
        pz, state, world = self.env, self._state, self.world
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
