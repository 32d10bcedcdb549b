"""The Multi-Robot Warehouse (rware 2.0.0, its envs' version v2) by task name, e.g. `rware-tiny-2ag`.

A task is rware's registered id without the `-v2`: `rware-<size>-<N>ag[-easy|-hard]` with its arguments (8-cell
columns, sensor range 1, no messages, a request queue of N x the difficulty, individual rewards of 1 per delivery),
and 500 steps. Every episode of these tasks ends at the time limit: a truncation. Any id rware registers is a
task here (`GRAMMAR`); `TASKS` are the EPyMARL benchmark's, the ones with published rows.
"""

from __future__ import annotations

import re

import numpy as np

from envs import grid_render as draw
from envs.gym_multiagent import TupleParallelEnv

TASK = re.compile(r"rware-(tiny|small|medium|large)-\d+ag(-easy|-hard)?")
GRAMMAR = "rware-<tiny|small|medium|large>-<N>ag[-easy|-hard] with N 1-19"
TASKS = ("rware-tiny-2ag", "rware-tiny-4ag", "rware-small-4ag")


def task_kwargs(task: str) -> dict:
    """rware's Warehouse arguments for a task name (its own registration)."""
    import gymnasium
    import rware  # noqa: F401  (registers the ids)

    if TASK.fullmatch(task) is None:
        raise ValueError(f"{task!r} is not a Multi-Robot Warehouse task name such as rware-tiny-2ag")
    try:
        return dict(gymnasium.spec(f"{task}-v2").kwargs)
    except gymnasium.error.Error:
        raise ValueError(f"{task!r} is not a task rware 2.0.0 registers: {GRAMMAR}") from None


HEADINGS = {0: (-1, 0), 1: (1, 0), 2: (0, -1), 3: (0, 1)}  # rware's Direction (UP, DOWN, LEFT, RIGHT) as (drow, dcol)


def frame(env) -> np.ndarray:
    """A picture of a rware env's state, coloured as rware draws it: goals dark, shelves slate blue (requested ones
    teal), robots orange (red when loaded), numbered from 1, with a notch on the side they face."""
    picture = draw.canvas(*env.grid_size)
    for x, y in env.goals:
        draw.square(picture, y, x, draw.GOAL, pad=0)
    requested = {id(shelf) for shelf in env.request_queue}
    for shelf in env.shelfs:
        draw.square(picture, shelf.y, shelf.x, draw.REQUESTED if id(shelf) in requested else draw.SHELF)
    for i, robot in enumerate(env.agents):
        draw.disc(picture, robot.y, robot.x, draw.LOADED if robot.carrying_shelf else draw.ROBOT)
        draw.number(picture, robot.y, robot.x, i + 1)
        draw.arrow(picture, robot.y, robot.x, HEADINGS[robot.dir.value])
    return picture


def parallel_env(task: str, max_cycles: int = 500, render_mode: str | None = None) -> TupleParallelEnv:
    """One RWARE env; an episode is truncated at `max_cycles` (rware's max_inactivity_steps stays off)."""
    from rware.warehouse import Warehouse

    env = Warehouse(**{**task_kwargs(task), "max_steps": max_cycles})
    return TupleParallelEnv(env, max_cycles, lambda e: False, task, render_mode, frame)
