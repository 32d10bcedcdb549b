"""A PettingZoo `ParallelEnv` of one Numba-stepped world: a drop-in for `mpe2.<env>.parallel_env`.

It wraps a one-env `MPEVecEnv` without auto-reset. After truncation (or termination) `agents`
empties, as in PettingZoo; `reset` starts again. Spaces, observations, rewards and `state()`
match mpe2's parallel env built with the same keyword arguments.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from envs.mpe.vec_env import MPEVecEnv


class MPEParallelEnv(ParallelEnv):
    metadata = {"render_modes": ["rgb_array"], "is_parallelizable": True, "render_fps": 10}

    def __init__(self, env_id: str, render_mode: str | None = None, **env_kwargs):
        self._vec = MPEVecEnv(env_id, num_envs=1, seed=None, autoreset=False, **env_kwargs)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'rgb_array'")
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "name": self._vec.scenario.name}
        self.possible_agents = list(self._vec.agents)
        self.agents: list[str] = []
        self.max_cycles = self._vec.max_steps
        n_act, dims = self._vec.spec.n_actions, self._vec.obs_dims
        self._observation_spaces = {
            a: spaces.Box(-np.float32(np.inf), np.float32(np.inf), shape=(dims[i],), dtype=np.float32)
            for i, a in enumerate(self.possible_agents)
        }
        if self._vec.continuous:
            self._action_spaces = {
                a: spaces.Box(low=0.0, high=1.0, shape=(int(n_act[i]),), dtype=np.float32)
                for i, a in enumerate(self.possible_agents)
            }
        else:
            self._action_spaces = {a: spaces.Discrete(int(n_act[i])) for i, a in enumerate(self.possible_agents)}
        S = self._vec.state_shape[0]
        self.state_space = spaces.Box(-np.float32(np.inf), np.float32(np.inf), shape=(S,), dtype=np.float32)
        self._offsets = self._vec.spec.obs_offset
        self._state = np.zeros(S, np.float32)
        self._first_reset = True

    def observation_space(self, agent):
        return self._observation_spaces[agent]

    def action_space(self, agent):
        return self._action_spaces[agent]

    def _split(self, state: np.ndarray) -> dict[str, np.ndarray]:
        o = self._offsets
        return {a: state[o[i] : o[i + 1]].copy() for i, a in enumerate(self.possible_agents)}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is None and self._first_reset:  # unseeded, like mpe2's first reset
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._first_reset = False
        self._state = self._vec.reset(seed=seed).state[0]
        self.agents = self.possible_agents[:]
        return self._split(self._state), {a: {} for a in self.agents}

    def step(self, actions: dict):
        if not self.agents:
            return {}, {}, {}, {}, {}
        vec = self._vec
        batched = {}
        for g, spec in vec.groups.items():
            batched[g] = np.stack([np.asarray(actions[a]) for a in spec.agents])[None]
        vec.max_steps = self.max_cycles
        result = vec.step(batched)
        self._state = result.next.state[0]
        obs = self._split(self._state)
        rewards, terminations = {}, {}
        for g, spec in vec.groups.items():
            for k, a in enumerate(spec.agents):
                rewards[a] = float(result.rewards[g][0, k])
                terminations[a] = bool(result.terminated[g][0, k])
        truncated = bool(result.truncated[0])
        truncations = {a: truncated for a in self.agents}
        infos = {a: {} for a in self.agents}
        if result.done[0]:
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        return self._state.copy()

    def render(self):
        if self.render_mode is None:
            return None
        return self._vec.render(0)

    def close(self):
        self._vec.close()


def parallel_env(env_id: str, **env_kwargs) -> MPEParallelEnv:
    """A PettingZoo ParallelEnv of the mpe2 environment `env_id`, stepped by the Numba kernels."""
    return MPEParallelEnv(env_id, **env_kwargs)
