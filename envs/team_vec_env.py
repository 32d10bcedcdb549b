"""`TeamVecEnv`: the `envs.api.VecEnv` around a Numba port of a one-team task (envs/foraging_numba.py,
envs/warehouse_numba.py).

A port supplies its task (what stays fixed), its worlds (E envs' state arrays, with one SplitMix64 stream per env
in `worlds.rng`) and three compiled functions over all E envs: `reset(task, worlds, obs)`, `observe(task, worlds,
obs)` and `step(task, worlds, actions, autoreset, obs, final, rewards, terminated, truncated, ep_return,
ep_length)`, which writes every agent's observation vector into a row of `obs`, and for an env whose episode ended
its last one into `final` before resetting it. This class does the rest, the same for every port: seeding, the
checks of the actions, the group arrays, episode statistics and the final observations.
"""

from __future__ import annotations

import numpy as np

from envs.api import EpisodeStats, GroupSpec, Observation, StepResult, VecEnv, check_actions, refused_arguments
from envs.mpe.vec_env import seed_states


class TeamVecEnv(VecEnv):
    """E envs of one task whose agents form one group, `agent`, of `n_agents` with `width`-float observations and
    `n_actions` discrete actions; subclasses set `reset_kernel`, `observe_kernel` and `step_kernel`."""

    reset_kernel = observe_kernel = step_kernel = None

    def __init__(
        self,
        name: str,
        task,
        worlds,
        num_envs: int,
        seed: int,
        max_cycles: int,
        autoreset: bool,
        n_agents: int,
        width: int,
        n_actions: int,
    ):
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        self.name, self.task, self.worlds, self.num_envs = name, task, worlds, num_envs
        self.autoreset, self.max_steps, self.width = autoreset, int(max_cycles), width
        agents = tuple(f"agent_{i}" for i in range(n_agents))
        self.groups = {"agent": GroupSpec("agent", agents, (width,), np.dtype(np.float32), True, n_actions)}
        self.state_shape = (n_agents * width,)
        self._seed, self._seeded, self._needs_reset = int(seed), False, True
        self._mask = np.ones((num_envs, n_agents), np.bool_)
        self._mask.flags.writeable = False
        self._return = np.zeros((num_envs, n_agents))
        self._length = np.zeros(num_envs, np.int64)

    def reset(self, seed: int | None = None) -> Observation:
        """Reset every env; env i is seeded with seed + i (None: the seed given at construction, once)."""
        if seed is not None or not self._seeded:
            self.worlds.rng[:] = seed_states(self._seed if seed is None else int(seed), self.num_envs)
            self._seeded = True
        obs = np.empty((self.num_envs, *self.state_shape), np.float32)
        type(self).reset_kernel(self.task, self.worlds, obs)
        self._return[:], self._length[:] = 0.0, 0
        self._needs_reset = False
        return self._observation(obs)

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        if self._needs_reset:
            raise RuntimeError("call reset() before the first step()")
        act = check_actions(actions, self.groups, self.num_envs)["agent"].astype(np.int64, copy=False)
        E, N = self._mask.shape
        obs, final = np.empty((E, *self.state_shape), np.float32), np.empty((E, *self.state_shape), np.float32)
        rewards, terminated = np.empty((E, N), np.float64), np.empty((E, N), np.bool_)
        truncated = np.empty(E, np.bool_)
        type(self).step_kernel(
            self.task,
            self.worlds,
            act,
            self.autoreset,
            obs,
            final,
            rewards,
            terminated,
            truncated,
            self._return,
            self._length,
        )
        done = terminated[:, 0] | truncated
        nxt = last = self._observation(obs)
        episodes = []
        if done.any():
            ended = np.flatnonzero(done)
            if self.autoreset:  # else the next observation is the last one
                final_obs = obs.copy()
                final_obs[ended] = final[ended]
                last = self._observation(final_obs)
            means = self._return[ended].mean(1)
            episodes = [
                EpisodeStats(int(e), {"agent": float(r)}, float(r), int(n))
                for e, r, n in zip(ended, means, self._length[ended], strict=True)
            ]
            self._return[ended], self._length[ended] = 0.0, 0
        return StepResult(
            nxt, {"agent": rewards.astype(np.float32)}, {"agent": terminated}, truncated, done, last, episodes
        )

    def observe(self) -> Observation:
        """The current observations of every env (what the last reset/step returned as `next`)."""
        obs = np.empty((self.num_envs, *self.state_shape), np.float32)
        type(self).observe_kernel(self.task, self.worlds, obs)
        return self._observation(obs)

    def started(self, env_index: int) -> None:
        """Env `env_index` was given a state from outside (a package's, by a port's bridge): a new episode."""
        self._return[env_index], self._length[env_index] = 0.0, 0
        self._needs_reset = False

    def close(self) -> None:
        pass

    def render(self, env_index: int = 0) -> np.ndarray:
        raise NotImplementedError(f"{self.name} has no renderer here: leave out --capture-video")

    def _observation(self, obs: np.ndarray) -> Observation:
        per_agent = obs.reshape(self.num_envs, *self._mask.shape[1:], self.width)
        return Observation({"agent": per_agent}, obs, {"agent": self._mask})


def accept_max_cycles_only(env_id: str, max_cycles, kwargs: dict) -> None:
    """A port's `make_vec` takes `max_cycles` alone, a whole number >= 1: `render_mode` is accepted and ignored,
    anything else refused."""
    kwargs.pop("render_mode", None)
    if refusal := refused_arguments(env_id, kwargs | {"max_cycles": max_cycles}, {"max_cycles": int}):
        raise TypeError(refusal)
