"""What a policy does on simple_spread_v3 at N agents: how many landmarks it covers and how, step by step, for the
diagnosis of issue 46 (more agents).

    python probes/spread_behaviour.py --agents 6 --checkpoint results/runs/simple_spread_v3/mappo-n6/seed0/last.pt
    python probes/spread_behaviour.py --agents 6 --policy scripted      # or nearest, no-op (probes/spread_levels.py)
    python probes/spread_behaviour.py --agents 6 --relations --checkpoint <a run with --relations>/last.pt

Each policy plays greedily the first --episodes episodes of protocol v2's fixed set on mpe2's own env. Where the
last step (25 of 25) left the agents it reports, averaged over episodes:
* covered: landmarks with an agent within --radius (MPE's agents have size 0.15);
* claimed: distinct landmarks that are some agent's nearest (N when every agent heads for its own);
* landmark distance: the mean over landmarks of the distance to the nearest agent (the reward's term, per landmark);
* agent distance: the mean over agents of the distance to its nearest landmark;
* to the centroid: the mean distance of the agents to the landmarks' centroid, which a policy that learned only
  "go to the middle" brings near 0;
* speed: the mean speed of the agents (0 for standing still).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "probes"))

from spread_levels import distances  # noqa: E402
from spread_levels import policy as scripted_policy  # noqa: E402

from runtime.args import MultiAgentArgs, make_eval_env  # noqa: E402  (the checkout's own layer)
from runtime.checkpoint import CheckpointError  # noqa: E402
from runtime.evaluation import FINAL_SEED  # noqa: E402
from runtime.opponents import load_actor  # noqa: E402

ENV_ID = "simple_spread_v3"


def measures(obs: np.ndarray, radius: float) -> dict:
    """(E, N, 6N) simple_spread observations -> each measure's mean over the E envs."""
    vel, pos = obs[..., 0:2], obs[..., 2:4]
    landmarks, dist = distances(obs)  # (E, N, 2), (E, agents, landmarks)
    nearest = dist.argmin(-1)  # (E, agents): each agent's nearest landmark
    claimed = [len(np.unique(row)) for row in nearest]
    centroid = landmarks.mean(1, keepdims=True)
    return {
        "covered": float((dist.min(1) < radius).sum(-1).mean()),
        "claimed": float(np.mean(claimed)),
        "landmark_distance": float(dist.min(1).mean()),
        "agent_distance": float(dist.min(2).mean()),
        "to_centroid": float(np.linalg.norm(pos - centroid, axis=-1).mean()),
        "speed": float(np.linalg.norm(vel, axis=-1).mean()),
    }


def standard_env(n: int, num_envs: int, seed: int, relations: bool = False):
    """mpe2's simple_spread_v3 with N agents (protocol v2's env), with --relations if `relations`."""
    args = MultiAgentArgs(env_id=ENV_ID, env_kwargs=json.dumps({"N": n}), relations=relations)
    return make_eval_env(args, num_envs, seed)


def behaviour(make_policy, n: int, episodes: int, radius: float, relations: bool = False) -> dict:
    """Play `episodes` fixed episodes at once (one per env) and measure where their last step left the agents."""
    env = standard_env(n, episodes, FINAL_SEED, relations)
    group = next(iter(env.groups))
    act = make_policy(episodes, np.random.default_rng(0))
    obs, done, returns = env.reset(), None, np.zeros(episodes)
    with torch.no_grad():
        while done is None or not done.all():  # simple_spread's episodes all last max_cycles steps
            step = env.step(act(obs, done))
            returns += step.rewards[group].mean(-1)
            obs, done = step.next, step.done
    seen = step.final.obs[group][..., : 6 * n]  # what the last step reached, before the reset (without relations)
    env.close()
    return {"return": float(returns.mean()), **measures(seen, radius)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=6, help="N, the number of agents and landmarks")
    parser.add_argument("--checkpoint", action="append", default=[], help="a checkpoint of any script (repeatable)")
    parser.add_argument("--policy", action="append", default=[], help="scripted, nearest or no-op (repeatable)")
    parser.add_argument("--episodes", type=int, default=200, help="of protocol v2's fixed set (first K)")
    parser.add_argument("--radius", type=float, default=0.15, help="a landmark is covered with an agent this near")
    parser.add_argument("--relations", action="store_true", help="checkpoints trained with --relations")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.episodes < 1 or args.radius <= 0:
        parser.error("--agents and --episodes must be >= 1 and --radius > 0")
    if bad := [p for p in args.policy if p not in ("scripted", "nearest", "no-op")]:
        parser.error(f"--policy {bad[0]!r}: expected scripted, nearest or no-op")
    if not args.checkpoint and not args.policy:
        parser.error("give at least one --checkpoint or --policy")
    probe = standard_env(args.agents, 1, 0, args.relations)
    spec = next(iter(probe.groups.values()))
    probe.close()
    rows = {}
    for name in args.policy:
        rows[name] = behaviour(
            scripted_policy(name, spec.name), args.agents, args.episodes, args.radius, args.relations
        )
    for path in args.checkpoint:
        try:
            make = load_actor(path, ENV_ID, spec, spec.name, torch.device("cpu"))
        except (CheckpointError, OSError) as e:
            parser.error(str(e))
        rows[path] = behaviour(make, args.agents, args.episodes, args.radius, args.relations)
    keys = list(next(iter(rows.values())))
    print(f"simple_spread_v3 N={args.agents}, {args.episodes} fixed episodes, at the end of the episode:")
    print("| policy | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.2f}" for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
