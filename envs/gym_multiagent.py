"""Gymnasium multi-agent envs (Tuple spaces, per-agent lists) as PettingZoo parallel envs.

Level-Based Foraging (`lbforaging`) and the Multi-Robot Warehouse (`rware`) are Gymnasium envs whose
observation and action spaces are Tuples with one entry per agent, whose `step` takes a list of
actions and returns lists of observations and rewards, and one `done` for the whole team. Both say
`done=True` at their time limit too. `TupleParallelEnv` turns such an env into a PettingZoo parallel
env, so that it runs behind the same vectorized interface as every other family, and splits that
`done` into its two meanings: `terminated` where the task says the episode is over (`terminal(env)`:
LBF's field is empty), `truncated` where only the time limit ended it, so that every script
bootstraps there. (EPyMARL's runner stores the time limit as a terminal state.)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pettingzoo import ParallelEnv


class TupleParallelEnv(ParallelEnv):
    """A Gymnasium env with per-agent Tuple spaces as a PettingZoo parallel env (agents `agent_0`, ...).

    Args:
        env: the Gymnasium env (not wrapped by `gymnasium.make`: its checks cost more than LBF's step).
        max_cycles: the env's time limit, as our other families name it.
        terminal: `terminal(env) -> bool`, whether an episode that ended did so by the task's own end.
        name: what error messages call the env.
        frame: `frame(env) -> (H, W, 3) uint8`, a picture of the env's state (`render_mode="rgb_array"`); the
            packages' own renderers open a pyglet window, which a run without a display cannot.
    """

    metadata = {"name": "gym_multiagent", "render_modes": ["rgb_array"], "is_parallelizable": True, "render_fps": 5}

    def __init__(self, env, max_cycles: int, terminal: Callable, name: str, render_mode=None, frame=None):
        self.env, self.max_cycles, self.terminal, self.name = env, int(max_cycles), terminal, name
        self.render_mode, self.frame = render_mode, frame
        n = len(env.action_space)
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.agents: list[str] = []
        self._obs = {a: env.observation_space[i] for i, a in enumerate(self.possible_agents)}
        self._act = {a: env.action_space[i] for i, a in enumerate(self.possible_agents)}

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]

    def reset(self, seed: int | None = None, options=None):
        obs, _ = self.env.reset(seed=seed)
        self.agents = list(self.possible_agents)
        observations = {a: np.asarray(o, np.float32) for a, o in zip(self.agents, obs, strict=True)}
        return observations, {a: {} for a in self.agents}

    def step(self, actions: dict):
        obs, rewards, done, _, _ = self.env.step([int(actions[a]) for a in self.agents])
        terminated = bool(done) and bool(self.terminal(self.env))
        truncated = bool(done) and not terminated
        agents = self.agents
        if done:
            self.agents = []
        return (
            {a: np.asarray(o, np.float32) for a, o in zip(agents, obs, strict=True)},
            {a: float(r) for a, r in zip(agents, rewards, strict=True)},
            {a: terminated for a in agents},
            {a: truncated for a in agents},
            {a: {} for a in agents},
        )

    def render(self):
        if self.frame is None:
            raise NotImplementedError(f"{self.name} has no picture here: leave out --capture-video")
        return self.frame(self.env) if self.render_mode == "rgb_array" else None

    def close(self):
        self.env.close()
