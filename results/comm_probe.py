"""Does a policy communicate? A probe of simple_reference_v3 checkpoints (issue 23's diagnosis).

    python results/comm_probe.py results/runs/simple_reference_v3/mappo/seed0/last.pt ... [--episodes 1000]

In simple_reference_v3 each of the two agents sees the colour of the landmark its partner must reach, and its
partner's last symbol (one of 10); it cannot see its own target. A team that does not communicate can do no
better than both agents waiting at a point between the three landmarks. For each checkpoint (and a uniformly
random policy, for the floor) the probe plays the protocol-v2 episodes (env i seeded 10000 + i), greedily, and
reports from the agents' own observations:

* `return`: the episode return (the mean over agents, as in results/), for comparison with the rows there.

* `reach`: the fraction of (episode, agent) where the agent ends nearest to its target landmark. A policy that
  ignores its partner's symbol ends nearest to its target by chance: about 1/3.
* `dist_target`, `dist_other`: its mean final distance to its target and to the two other landmarks.
* `symbol_bits`: the information the symbols an agent sends carry about the target it sees, I(symbol; colour) in
  bits over every step (the most is log2(3) = 1.58). Zero: the symbols say nothing, whatever the listener does.

A third row, `scripted`, is a hand-written team that communicates: each agent sends the colour it sees as its
symbol and walks to the landmark its partner's symbol names. It is the task's communicating ceiling for this
probe, and what the test holds the probe to. One JSON line per policy goes to stdout; --out writes the list.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from envs import make  # noqa: E402
from runtime.checkpoint import read_checkpoint  # noqa: E402
from runtime.opponents import load_actor, random_actor  # noqa: E402

ENV_ID = "simple_reference_v3"
MOVES, SYMBOLS, LANDMARKS = 5, 10, 3
# observation layout (mpe2's Scenario.observation): velocity 2, landmark offsets 3 x 2, target colour 3, symbol 10
OFFSETS, COLOUR, HEARD = slice(2, 8), slice(8, 11), slice(11, 21)


def scripted_actor(spec):
    """The communicating team (discrete actions): symbol = the colour seen; move along the axis of the larger offset
    to the landmark the partner names (mpe2's moves: 1 -x, 2 +x, 3 -y, 4 +y), none before the first symbol."""

    def make(num_envs, rng):
        def act(obs, done):
            o = obs.obs[spec.name]
            heard = o[..., HEARD]
            offset = np.take_along_axis(o[..., OFFSETS].reshape(*o.shape[:2], LANDMARKS, 2),
                                        np.argmax(heard, -1)[..., None, None], -2)[..., 0, :]  # fmt: skip
            axis = np.argmax(np.abs(offset), -1)
            toward = np.take_along_axis(offset, axis[..., None], -1)[..., 0] > 0
            move = np.where(heard.any(-1) & (np.abs(offset).max(-1) > 0.05), 1 + 2 * axis + toward, 0)
            return {spec.name: np.argmax(o[..., COLOUR], -1) * MOVES + move}

        return act

    return make


def symbols_of(actions: np.ndarray, discrete: bool) -> np.ndarray:
    """The symbol each agent sent: mpe2 decodes Discrete(50) as move = a % 5, symbol = a // 5; a continuous action
    holds the move (5) then the signal (10), whose largest entry we take as the symbol."""
    return actions // MOVES if discrete else np.argmax(actions[..., MOVES : MOVES + SYMBOLS], -1)


def mutual_information_bits(x: np.ndarray, y: np.ndarray, nx: int, ny: int) -> float:
    """I(x; y) of two integer samples from their joint counts (plug-in estimate, in bits)."""
    joint = np.bincount(x * ny + y, minlength=nx * ny).reshape(nx, ny) / len(x)
    px, py = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log2(joint[nz] / (px @ py)[nz])).sum())


def probe(make_actor, spec, episodes: int) -> dict:
    """Play `episodes` episodes with one actor for the group and measure what its agents' symbols do."""
    env = make(ENV_ID, num_envs=episodes, seed=10000, backend="numba")
    act = make_actor(episodes, np.random.default_rng(0))
    obs, done, sent, colour, ret = env.reset(), None, [], [], np.zeros(episodes)
    while True:
        with torch.no_grad():
            actions = act(obs, done)
        own = obs.obs[spec.name]  # (E, 2, 21)
        sent.append(symbols_of(np.asarray(actions[spec.name]), spec.discrete))
        colour.append(np.argmax(own[..., COLOUR], -1))  # the partner's target, which this agent sees
        step = env.step(actions)
        ret += step.rewards[spec.name].mean(-1)
        done = step.done
        if done.all():
            final = step.final.obs[spec.name]
            break
        obs = step.next
    env.close()
    # agent a's target is the colour its partner sees (two agents: the partner of 0 is 1 and vice versa)
    target = np.argmax(final[..., COLOUR], -1)[:, ::-1]  # (E, 2)
    dist = np.linalg.norm(final[..., OFFSETS].reshape(episodes, 2, LANDMARKS, 2), axis=-1)  # (E, 2, 3)
    at_target = np.take_along_axis(dist, target[..., None], -1)[..., 0]
    other = (dist.sum(-1) - at_target) / (LANDMARKS - 1)
    sent, colour = np.concatenate(sent).ravel(), np.concatenate(colour).ravel()
    return {
        "return": float(ret.mean()),
        "reach": float((dist.argmin(-1) == target).mean()),
        "dist_target": float(at_target.mean()),
        "dist_other": float(other.mean()),
        "symbol_bits": mutual_information_bits(sent, colour, SYMBOLS, LANDMARKS),
        "episodes": episodes,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", help="checkpoints (last.pt) of any script on simple_reference_v3")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--out", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for path in ["random", "scripted", *args.checkpoints]:
        ckpt = None if path in ("random", "scripted") else read_checkpoint(path)
        discrete = True if ckpt is None else not ckpt["args"].get("continuous_actions", False)
        env = make(ENV_ID, num_envs=1, seed=0, backend="numba", continuous_actions=not discrete)
        spec = next(iter(env.groups.values()))
        env.close()
        if ckpt is None:
            make_actor = {"random": random_actor, "scripted": scripted_actor}[path](spec)
        else:
            make_actor = load_actor(path, ENV_ID, spec, spec.name, torch.device("cpu"), greedy=True, ckpt=ckpt)
        row = {"policy": path, "algo": ckpt["algo"] if ckpt else path, **probe(make_actor, spec, args.episodes)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
