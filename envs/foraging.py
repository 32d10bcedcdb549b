"""Level-Based Foraging (lbforaging 2.0.0, its envs' version v3) by task name, e.g. `Foraging-2s-8x8-2p-2f-coop`.

A task name reads as lbforaging registers its ids (without the `-v3`): `Foraging[-2s]-<S>x<S>-<P>p-<F>f[-coop]`,
a field of S x S cells, P players of level 1 or 2, F foods whose level is at most the sum of the three lowest
player levels (`-coop`: exactly that, so that every food needs every player), sight 2 with `-2s` (else the whole
field), 50 steps. Any such name in lbforaging's registered range is a task here (fields of 5 x 5 to 19 x 19,
2 to 9 players, 1 to 4 foods), and up to 5 foods: lbforaging registers at most 4, and the same formula builds the
benchmark's `-5f` tasks. `TASKS` are the benchmark's, the ones with published rows.
"""

from __future__ import annotations

import re

import numpy as np

from envs import grid_render as draw
from envs.gym_multiagent import TupleParallelEnv

TASK = re.compile(r"Foraging(?P<po>-2s)?-(?P<size>\d+)x(?P=size)-(?P<players>\d+)p-(?P<foods>\d+)f(?P<coop>-coop)?")
SIZES, PLAYERS, FOODS = range(5, 20), range(2, 10), range(1, 6)  # lbforaging's registered range, and 5 foods
GRAMMAR = "Foraging[-2s]-<S>x<S>-<P>p-<F>f[-coop] with S 5-19, P 2-9, F 1-5"
# the EPyMARL benchmark's tasks (Papoudakis et al. 2021)
TASKS = (
    "Foraging-8x8-2p-2f-coop",
    "Foraging-2s-8x8-2p-2f-coop",
    "Foraging-10x10-3p-3f",
    "Foraging-2s-10x10-3p-3f",
    "Foraging-15x15-3p-5f",
    "Foraging-15x15-4p-3f",
    "Foraging-15x15-4p-5f",
)


def task_kwargs(task: str) -> dict:
    """lbforaging's ForagingEnv arguments for a task name (its registration's formula)."""
    match = TASK.fullmatch(task)
    if match is None:
        raise ValueError(f"{task!r} is not a Level-Based Foraging task name such as Foraging-2s-8x8-2p-2f-coop")
    size, players, foods = int(match["size"]), int(match["players"]), int(match["foods"])
    if size not in SIZES or players not in PLAYERS or foods not in FOODS:
        why = "lbforaging's registered range, and 5 foods for the benchmark's -5f tasks"
        raise ValueError(f"{task!r} is outside the Level-Based Foraging tasks here: {GRAMMAR} ({why})")
    return dict(
        players=players,
        min_player_level=1,
        max_player_level=2,
        field_size=(size, size),
        min_food_level=1,
        max_food_level=None,
        max_num_food=foods,
        sight=2 if match["po"] else size,
        force_coop=bool(match["coop"]),
        grid_observation=False,
        penalty=0.0,
    )


def frame(env) -> np.ndarray:
    """A picture of a lbforaging env's state: foods green with their level, players coloured with theirs; with a
    limited sight (`-2s`), the cells no player sees shaded."""
    picture = draw.canvas(*env.field.shape)
    rows, cols = np.indices(env.field.shape)
    seen = np.zeros(env.field.shape, bool)
    for player in env.players:
        seen |= np.maximum(abs(rows - player.position[0]), abs(cols - player.position[1])) <= env.sight
    draw.shade(picture, ~seen, draw.UNSEEN)
    for row, col in zip(*np.nonzero(env.field), strict=True):
        draw.square(picture, row, col, draw.FOOD)
        draw.number(picture, row, col, env.field[row, col])
    for i, player in enumerate(env.players):
        draw.disc(picture, *player.position, draw.PALETTE[i % len(draw.PALETTE)])
        draw.number(picture, *player.position, player.level)
    return picture


def parallel_env(task: str, max_cycles: int = 50, render_mode: str | None = None) -> TupleParallelEnv:
    """One LBF env; an episode terminates when every food is collected and is truncated at `max_cycles`."""
    from lbforaging.foraging.environment import ForagingEnv

    env = ForagingEnv(**task_kwargs(task), max_episode_steps=max_cycles)
    return TupleParallelEnv(env, max_cycles, lambda e: e.field.sum() == 0, task, render_mode, frame)
