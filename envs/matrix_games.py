"""Cooperative matrix games: two agents, three actions each, one shared payoff; played once or repeated.

The games on which value factorisation is known to fail or succeed:

* `matrix_qtran`: the QTRAN paper's non-monotonic game (Son et al. 2019, Table 1a): 8 for both agents' first
  action, -12 where only one of them takes it, 0 elsewhere. VDN and QMIX cannot represent it and settle on a 0.
* `matrix_climbing`: the climbing game (Claus and Boutilier 1998): the optimum 11 sits beside -30 penalties, so
  independent learners that average over the other's exploration climb to the safe 7 or 5 instead (relative
  overgeneralization).
* `matrix_penalty`: the penalty game (Claus and Boutilier 1998): 10 on either diagonal corner, `k` (default -100)
  when the agents pick opposite corners, 2 for the safe middle.

Every agent observes the step's one-hot index (a single 1 in the one-step game); each step both receive the
payoff of the joint action. The game ends after `episode_length` steps (1: the one-step game): a termination,
since the game is over, not a time limit.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

PAYOFFS = {
    "matrix_qtran": [[8, -12, -12], [-12, 0, 0], [-12, 0, 0]],
    "matrix_climbing": [[11, -30, 0], [-30, 7, 6], [0, 0, 5]],
    "matrix_penalty": [[10, 0, "k"], [0, 2, 0], ["k", 0, 10]],
}
TASKS = tuple(PAYOFFS)


def payoff(task: str, k: float = -100.0) -> np.ndarray:
    """The (3, 3) payoff matrix of a task: rows the first agent's action, columns the second's."""
    if task not in PAYOFFS:
        raise ValueError(f"{task!r} is not a matrix game: {', '.join(TASKS)}")
    return np.array([[k if v == "k" else v for v in row] for row in PAYOFFS[task]], np.float32)


class MatrixGame(ParallelEnv):
    """A two-agent cooperative matrix game as a PettingZoo parallel env (agents agent_0 and agent_1)."""

    metadata = {"name": "matrix_game", "render_modes": [], "is_parallelizable": True}

    def __init__(self, task: str, episode_length: int = 1, k: float = -100.0, render_mode: str | None = None):
        if episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {episode_length}")
        self.task, self.matrix, self.max_cycles = task, payoff(task, k), int(episode_length)
        self.render_mode = render_mode
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self._obs_space = spaces.Box(0.0, 1.0, (self.max_cycles,), np.float32)
        self._act_space = spaces.Discrete(3)
        self.t = 0

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _observe(self) -> dict:
        obs = np.zeros(self.max_cycles, np.float32)
        obs[min(self.t, self.max_cycles - 1)] = 1.0
        return {a: obs.copy() for a in self.possible_agents}

    def reset(self, seed: int | None = None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        reward = float(self.matrix[int(actions["agent_0"]), int(actions["agent_1"])])
        self.t += 1
        over = self.t >= self.max_cycles
        agents = self.agents
        if over:
            self.agents = []
        return (
            self._observe(),
            {a: reward for a in agents},
            {a: over for a in agents},
            {a: False for a in agents},
            {a: {} for a in agents},
        )

    def render(self):
        raise NotImplementedError(f"{self.task} has no picture: leave out --capture-video")


def parallel_env(task: str, episode_length: int = 1, k: float = -100.0, render_mode: str | None = None):
    return MatrixGame(task, episode_length, k, render_mode)
