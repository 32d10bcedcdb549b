"""Does a policy communicate? A probe of simple_reference_v3 and simple_speaker_listener_v4 checkpoints (issue 23).

    python probes/comm_probe.py results/runs/simple_reference_v3/mappo/seed0/last.pt ... [--episodes 1000]
    python probes/comm_probe.py --env-id simple_speaker_listener_v4 <run dir>/last.pt ...

In simple_reference_v3 each of the two agents sees the colour of the landmark its partner must reach, and its
partner's last symbol (one of 10); it cannot see its own target. In simple_speaker_listener_v4 the speaker sees
only the colour of the listener's target and says one of 3 symbols; the listener sees the landmarks and the symbol,
and moves. A team that does not communicate can do no better than waiting at a point between the three landmarks.
For each checkpoint (and a uniformly random policy, for the floor) the probe plays the final evaluation's episodes
of protocol v2 (mpe2's env i seeded 10000 + i), greedily, every group of the checkpoint together as it was trained
(`runtime.opponents.load_team`: the speaker and the listener of dcg.py on one graph, of the communication scripts on
one channel of messages), and reports from the agents' own observations:

* `return`: the episode return (the mean over agents), equal to the seed's final-policy number in results/.
* `reach`: the fraction of (episode, mover) where the agent that must reach a target (both agents of
  simple_reference, the listener) ends nearest to it. One that ignores the symbols ends there by chance: about 1/3.
* `dist_target`, `dist_other`: its mean final distance to its target and to the two other landmarks.
* `symbol_bits`: the information the symbols sent carry about the target colour the sender sees, I(symbol; colour)
  in bits over every step (the most is log2(3) = 1.58). Zero: the symbols say nothing, whatever the listener does.
* `code`: per colour, the symbol sent most often and its share of the steps: a code uses a symbol per colour.

A third row, `scripted`, is a hand-written team that communicates: the sender's symbol is the colour it sees, and
the mover walks to the landmark the symbol names. It is the task's communicating ceiling for this probe, and what
the test holds the probe to. One JSON line per policy goes to stdout; --out writes the list.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.host import out_file  # noqa: E402
from envs import make  # noqa: E402
from runtime.checkpoint import CheckpointError, read_checkpoint  # noqa: E402
from runtime.evaluation import FINAL_SEED  # noqa: E402
from runtime.opponents import load_team, random_actor  # noqa: E402

MOVES, LANDMARKS = 5, 3  # mpe2's discrete moves (1 -x, 2 +x, 3 -y, 4 +y) and the tasks' landmarks


class Reference:
    """simple_reference_v3: one group of two agents, each a sender and a mover. Observation (mpe2's
    Scenario.observation): velocity 2, landmark offsets 3 x 2, the partner's target colour 3, the heard symbol 10;
    a Discrete(50) action is move = a % 5, symbol = a // 5 (continuous: the move (5) then the signal (10))."""

    env_id, symbols = "simple_reference_v3", 10
    OFFSETS, COLOUR, HEARD = slice(2, 8), slice(8, 11), slice(11, 21)

    def __init__(self, specs):
        self.group = next(iter(specs))
        self.discrete = specs[self.group].discrete

    def scripted(self):  # the symbol is the colour seen; walk to the landmark the partner names
        def act(obs, done):
            o = obs.obs[self.group]
            return {self.group: np.argmax(o[..., self.COLOUR], -1) * MOVES + walk(o[..., self.OFFSETS],
                                                                                     o[..., self.HEARD])}  # fmt: skip

        return {self.group: act}

    def sent(self, obs, actions):  # -> (symbol sent, the target colour its sender sees), per sender
        a = np.asarray(actions[self.group])
        symbol = a // MOVES if self.discrete else np.argmax(a[..., MOVES : MOVES + self.symbols], -1)
        return symbol, np.argmax(obs.obs[self.group][..., self.COLOUR], -1)

    def movers(self, final):  # -> (landmark offsets (E, M, 3, 2), target (E, M)): agent a's target is what its
        o = final.obs[self.group]  # partner sees (two agents: the partner of 0 is 1 and vice versa)
        return o[..., self.OFFSETS].reshape(*o.shape[:2], LANDMARKS, 2), np.argmax(o[..., self.COLOUR], -1)[:, ::-1]


class SpeakerListener:
    """simple_speaker_listener_v4: the speaker sees the target's colour 3 and says one of 3 symbols; the listener
    sees velocity 2, landmark offsets 3 x 2 and the heard symbol 3, and moves (Discrete(5) or a continuous 5)."""

    env_id, symbols = "simple_speaker_listener_v4", 3
    OFFSETS, HEARD = slice(2, 8), slice(8, 11)

    def __init__(self, specs):
        self.discrete = specs["speaker"].discrete

    def scripted(self):
        return {"speaker": lambda obs, done: {"speaker": np.argmax(obs.obs["speaker"], -1)},
                "listener": lambda obs, done: {"listener": walk(obs.obs["listener"][..., self.OFFSETS],
                                                                obs.obs["listener"][..., self.HEARD])}}  # fmt: skip

    def sent(self, obs, actions):
        a = np.asarray(actions["speaker"])
        return (a if self.discrete else np.argmax(a, -1)), np.argmax(obs.obs["speaker"], -1)

    def movers(self, final):  # the target is the colour the speaker sees (landmarks in the same order)
        o = final.obs["listener"]
        return o[..., self.OFFSETS].reshape(*o.shape[:2], LANDMARKS, 2), np.argmax(final.obs["speaker"], -1)


TASKS = {task.env_id: task for task in (Reference, SpeakerListener)}


def walk(offsets, heard):
    """Scripted moves: along the axis of the larger offset to the landmark the heard symbol names (symbol i:
    landmark i); none before the first symbol or once there."""
    offset = np.take_along_axis(offsets.reshape(*offsets.shape[:-1], LANDMARKS, 2),
                                np.argmax(heard, -1)[..., None, None], -2)[..., 0, :]  # fmt: skip
    axis = np.argmax(np.abs(offset), -1)
    toward = np.take_along_axis(offset, axis[..., None], -1)[..., 0] > 0
    return np.where(heard.any(-1) & (np.abs(offset).max(-1) > 0.05), 1 + 2 * axis + toward, 0)


def mutual_information_bits(x: np.ndarray, y: np.ndarray, nx: int, ny: int) -> float:
    """I(x; y) of two integer samples from their joint counts (plug-in estimate, in bits)."""
    joint = np.bincount(x * ny + y, minlength=nx * ny).reshape(nx, ny) / len(x)
    px, py = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log2(joint[nz] / (px @ py)[nz])).sum())


def code(sent: np.ndarray, colour: np.ndarray, symbols: int) -> list:
    """Per target colour: the symbol sent most often, and its share of the steps ([symbol, share] per colour). A
    code is a different symbol per colour; one symbol for every colour says nothing."""
    counts = np.stack([np.bincount(sent[colour == c], minlength=symbols) for c in range(LANDMARKS)])
    return [[int(c.argmax()), round(float(c.max() / max(c.sum(), 1)), 3)] for c in counts]


def probe(task, actors: dict, episodes: int) -> dict:
    """Play `episodes` episodes with `actors` ({group: act(obs, done) -> {group: actions}}) and measure what the
    symbols sent do."""
    env = make(
        task.env_id,
        num_envs=episodes,
        seed=FINAL_SEED,
        backend="pettingzoo",
        vector="sync",
        continuous_actions=not task.discrete,
    )  # the final evaluation's episodes (runtime.evaluation)
    obs, done, sent, colour, ret = env.reset(), None, [], [], np.zeros(episodes)
    while True:
        with torch.no_grad():
            actions = {g: a for act in actors.values() for g, a in act(obs, done).items()}
        symbol, seen = task.sent(obs, actions)
        sent.append(symbol)
        colour.append(seen)
        step = env.step(actions)
        ret += np.concatenate([step.rewards[g] for g in env.groups], -1).mean(-1)
        done = step.done
        if done.all():
            final = step.final
            break
        obs = step.next
    env.close()
    offsets, target = task.movers(final)
    dist = np.linalg.norm(offsets, axis=-1)  # (E, movers, 3)
    at_target = np.take_along_axis(dist, target[..., None], -1)[..., 0]
    other = (dist.sum(-1) - at_target) / (LANDMARKS - 1)
    sent, colour = np.concatenate(sent).ravel(), np.concatenate(colour).ravel()
    return {
        "return": float(ret.mean()),
        "reach": float((dist.argmin(-1) == target).mean()),
        "dist_target": float(at_target.mean()),
        "dist_other": float(other.mean()),
        "symbol_bits": mutual_information_bits(sent, colour, task.symbols, LANDMARKS),
        "code": code(sent, colour, task.symbols),
        "episodes": episodes,
    }


def actors_of(path, env_id, specs, episodes, ckpt=None):
    """{group: act} of one policy: "random", "scripted", or a checkpoint's greedy actors (every group of it;
    `ckpt`: the checkpoint already read, else read here)."""
    task = TASKS[env_id](specs)
    if path == "scripted":
        return task, task.scripted()
    rng = np.random.default_rng(0)
    if path == "random":
        return task, {g: random_actor(spec)(episodes, rng) for g, spec in specs.items()}
    team = load_team(path, env_id, specs, torch.device("cpu"), greedy=True, ckpt=ckpt)  # every group as trained
    return task, {"team": team(episodes, rng)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", help="checkpoints (last.pt) of any script on --env-id")
    parser.add_argument("--env-id", default=Reference.env_id, choices=sorted(TASKS))
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--out", type=out_file, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: must be >= 1")
    torch.set_num_threads(1)
    rows = []
    for path in ["random", "scripted", *args.checkpoints]:
        try:
            ckpt = None if path in ("random", "scripted") else read_checkpoint(path)
        except CheckpointError as e:
            parser.error(str(e))
        continuous = bool(ckpt and ckpt["args"].get("continuous_actions", False))
        env = make(args.env_id, num_envs=1, seed=0, backend="numba", continuous_actions=continuous)
        specs = dict(env.groups)
        env.close()
        task, actors = actors_of(path, args.env_id, specs, args.episodes, ckpt)
        row = {"policy": path, "algo": ckpt["algo"] if ckpt else path, **probe(task, actors, args.episodes)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
