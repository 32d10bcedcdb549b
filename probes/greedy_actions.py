"""What a checkpoint's greedy policy does: each group's share of every action, and its return (issue 42).

    python probes/greedy_actions.py results/runs/rware-tiny-2ag/iql/seed0/last.pt ... [--episodes 100]

A row whose final policy scores nothing does not say why: agents that act at random, agents that stand still and
agents that turn in place all score zero on a sparse task. For each checkpoint (any script with discrete actions,
on the env it was trained on) the probe plays the first `--episodes` of evaluation protocol v2's final episodes
(env i seeded 10000 + i, one greedy episode each, on the package unless --backend says otherwise), every group of
the checkpoint together as it was trained (`runtime.opponents.load_team`), and prints one JSON line:

* `return`: the mean over episodes of the episode return (the mean over agents, as results/ reports it); with
  `--episodes 1000` on the package it is the seed's final-policy number.
* `team`: the same as the team's total (the return times the number of agents).
* `actions`: per group, the share of each action over the steps its live agents took in those episodes (only the
  first episode of each env; named for Level-Based Foraging and the Multi-Robot Warehouse, else by number).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import envs  # noqa: E402
from bench.host import out_file  # noqa: E402
from envs import lookup  # noqa: E402
from runtime.args import checkpoint_args, env_kwargs  # noqa: E402
from runtime.checkpoint import CheckpointError, read_checkpoint  # noqa: E402
from runtime.evaluation import FINAL_SEED, evaluate  # noqa: E402
from runtime.opponents import load_team, script_module  # noqa: E402

ACTION_NAMES = {  # the packages' Action enums (lbforaging.foraging.environment, rware.warehouse)
    "lbf": ("none", "north", "south", "west", "east", "load"),
    "rware": ("noop", "forward", "left", "right", "toggle_load"),
}


def counting(make, counts: dict):
    """`make` (a MakePolicy) whose actions are also added to `counts` (group -> (n,) int), for every live agent of
    an env still in its first episode."""

    def make_counting(num_envs, rng):
        act, first = make(num_envs, rng), np.ones(num_envs, bool)

        def act_fn(obs, done):
            if done is not None:
                first[done] = False
            actions = act(obs, done)
            for g, a in actions.items():
                live = obs.agent_mask[g] & first[:, None]
                counts[g] += np.bincount(np.asarray(a)[live], minlength=len(counts[g]))
            return actions

        return act_fn

    return make_counting


def probe(path: str, episodes: int, backend: str) -> dict:
    """Play the checkpoint at `path` greedily on `episodes` final episodes and measure what it does."""
    ckpt = read_checkpoint(path)
    if not {"algo", "env_id", "args"} <= set(ckpt):
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of these scripts (it lacks algo, env_id or args)")
    env_id, flags = ckpt["env_id"], checkpoint_args(script_module(ckpt["algo"]).Args, ckpt["args"])  # the run's flags
    if flags.continuous_actions:
        raise CheckpointError(f"{path} acts with continuous actions; the probe counts discrete ones")

    def make_env(n, seed):
        return envs.make(env_id, num_envs=n, seed=seed, backend=backend, vector="sync", **env_kwargs(flags))

    env = make_env(1, 0)
    specs = dict(env.groups)
    env.close()
    counts = {g: np.zeros(spec.action_dim, np.int64) for g, spec in specs.items()}
    team = load_team(path, env_id, specs, torch.device("cpu"), greedy=True, ckpt=ckpt)
    returns, _ = evaluate(make_env, counting(team, counts), episodes, FINAL_SEED)
    family = entry.family if (entry := lookup(env_id)) is not None else None
    names = ACTION_NAMES.get(family)
    shares = {
        g: {
            (names[i] if names and len(names) == len(c) else str(i)): round(float(x), 3)
            for i, x in enumerate(c / c.sum())
        }
        for g, c in counts.items()
    }
    n_agents = sum(spec.n_agents for spec in specs.values())
    return {"policy": path, "algo": ckpt["algo"], "env_id": env_id, "episodes": episodes,
            "return": float(returns.mean()), "team": float(returns.mean() * n_agents), "actions": shares}  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="checkpoints (last.pt) of any script with discrete actions")
    parser.add_argument("--episodes", type=int, default=100, help="the first n of the 1,000 final episodes")
    parser.add_argument("--backend", default="pettingzoo", choices=["pettingzoo", "numba"],
                        help="the package (evaluation's env) or the Numba port (equal step for step)")  # fmt: skip
    parser.add_argument("--out", type=out_file, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {args.episodes}")
    torch.set_num_threads(1)
    rows = []
    for path in args.checkpoints:
        try:
            row = probe(path, args.episodes, args.backend)
        except CheckpointError as e:
            raise SystemExit(str(e)) from None
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
