"""Copy worlds between this backend and live mpe2 environments.

`read_mpe2_world` extracts what our `WorldState` holds from an mpe2 env (the fidelity tests start
both from the same world); `write_mpe2_world` does the opposite, goals and goal-dependent colors
included, so mpe2's own pygame renderer can draw one of our worlds (`Renderer`).
"""

from __future__ import annotations

import importlib

import numpy as np


def mpe2_module(name: str):
    """The mpe2 environment module, e.g. mpe2.simple_spread_v3."""
    return importlib.import_module(f"mpe2.{name}")


def _index(items, item) -> int:
    return next(j for j, x in enumerate(items) if x is item)


def read_mpe2_world(name: str, env) -> dict[str, np.ndarray]:
    """pos (N, 2), vel (N, 2), comm (A, dim_c), goal (G,) of an mpe2 env (any wrapper around it)."""
    world = env.unwrapped.world
    agents, landmarks = world.agents, world.landmarks
    entities = agents + landmarks
    comm = np.zeros((len(agents), world.dim_c))
    for i, a in enumerate(agents):
        if a.state.c is not None and not a.silent:
            comm[i] = a.state.c
    if name == "simple_reference_v3":
        goal = [_index(landmarks, agents[0].goal_b), _index(landmarks, agents[1].goal_b)]
    elif name == "simple_speaker_listener_v4":
        goal = [_index(landmarks, agents[0].goal_b)]
    elif name in ("simple_adversary_v3", "simple_push_v3"):
        goal = [_index(landmarks, agents[0].goal_a)]
    elif name == "simple_crypto_v3":
        goal = [_index(landmarks, agents[0].goal_a), int(np.argmax(agents[2].key))]
    else:
        goal = []
    return {
        "pos": np.array([e.state.p_pos for e in entities], np.float64),
        "vel": np.array([e.state.p_vel for e in entities], np.float64),
        "comm": comm,
        "goal": np.array(goal, np.int64),
    }


def write_mpe2_world(name: str, env, pos, vel, comm, goal) -> None:
    """Put a world into an mpe2 env that has been reset once (so its static colors are set)."""
    world = env.unwrapped.world
    agents, landmarks = world.agents, world.landmarks
    for e, entity in enumerate(agents + landmarks):
        entity.state.p_pos = np.array(pos[e], np.float64)
        entity.state.p_vel = np.array(vel[e], np.float64)
    for i, a in enumerate(agents):
        a.state.c = np.array(comm[i], np.float64)
    # goals, and the colors scenario.reset_world derives from them
    if name == "simple_reference_v3":
        for i in range(2):
            agents[i].goal_b = landmarks[goal[i]]
            agents[1 - i].color = landmarks[goal[i]].color  # goal_a (the other agent) wears it
    elif name == "simple_speaker_listener_v4":
        agents[0].goal_b = landmarks[goal[0]]
        agents[1].color = landmarks[goal[0]].color + np.array([0.45, 0.45, 0.45])
    elif name == "simple_adversary_v3":
        for j, lm in enumerate(landmarks):
            lm.color = np.array([0.15, 0.65, 0.15]) if j == goal[0] else np.array([0.15, 0.15, 0.15])
        for a in agents:
            a.goal_a = landmarks[goal[0]]
    elif name == "simple_push_v3":
        for a in agents:
            a.goal_a = landmarks[goal[0]]
            if not a.adversary:
                a.color = np.array([0.25, 0.25, 0.25])
                a.color[goal[0] + 1] += 0.5
    elif name == "simple_crypto_v3":
        for a in agents:
            a.goal_a = landmarks[goal[0]]
        agents[1].color = landmarks[goal[0]].color
        agents[2].key = landmarks[goal[1]].color


class Renderer:
    """Draws our worlds with an mpe2 env of the same scenario and options (render_mode="rgb_array")."""

    def __init__(self, name: str, env_kwargs: dict):
        kwargs = {k: v for k, v in env_kwargs.items() if k != "render_mode"}
        self.name = name
        self.env = mpe2_module(name).raw_env(render_mode="rgb_array", **kwargs)
        self.env.reset(seed=0)

    def render(self, world: dict) -> np.ndarray:
        """(H, W, 3) uint8 frame of a world as returned by `MPEVecEnv.get_world`."""
        write_mpe2_world(self.name, self.env, world["pos"], world["vel"], world["comm"], world["goal"])
        self.env.original_cam_range = world["cam_range"]  # the zoom reference of mpe2's draw()
        return self.env.render()

    def close(self) -> None:
        self.env.close()
