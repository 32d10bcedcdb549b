"""A round-robin tournament of checkpoints of any script (and a random policy) on a two-team env: who beats whom,
and how sure we are.

    python results/tournament.py --env-id battle_v4 --player mappo0=runs/a/last.pt --player iql0=runs/b/last.pt@red \
        --random --battles 200
    python results/tournament.py --env-id battle_v4 --runs results/runs/battle_v4/*/seed*   # each run dir's last.pt

* Every ordered pair (A, B), A != B, plays `--battles` battles with A as the env's first group (red) and B as the
  second (blue), so each pair meets on both sides. Battle i of every pair starts from env seed `--seed + i`: pairs
  meet on the same start states. Players act greedily (`--sample`: they sample), through the `actor()` of the
  script that wrote their checkpoint (runtime.opponents), on the env the checkpoints were trained on.
* A battle is won by the team with more agents alive at its end, drawn if equal. Kills are the opposing agents
  that died. A battle that ends because a team was wiped out flags every agent (MAgent2), so there the survivors
  are those alive before the last step, and the team with fewer of them (or, if equal, the lower reward in that
  step) is the one wiped out.
* Output in `--out` (default results/<env>/): tournament.json (every pair's outcomes, the command, the commit),
  tournament.md: the score matrix (wins + draws / 2 over both sides, with 95% Wilson intervals), wins / draws /
  losses, Bradley-Terry ratings on the Elo scale (random = 0 when it plays) and mean kills per battle; and
  tournament.png, the score matrix as a heatmap.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import envs
from runtime.checkpoint import read_checkpoint
from runtime.opponents import Frozen, load_actor, parse_opponent, random_actor

RESULTS_DIR = Path(__file__).resolve().parent
RANDOM = "random"


def source_group(ckpt: dict, side: str, fixed: str | None, path: str) -> str:
    """The checkpoint's group that plays `side`: the one named after @, else `side` itself if it learned there,
    else its only trained group."""
    trained = [g for g in ckpt["signature"] if g != "state_shape"]
    if fixed:
        return fixed
    if side in trained:
        return side
    if len(trained) == 1:
        return trained[0]
    raise ValueError(f"{path} has the trained groups {trained} and none is {side!r}: name one with PATH@GROUP")


def players_from(args) -> dict[str, tuple[str | None, str | None]]:
    """name -> (checkpoint path, its group after @ or None); random -> (None, None)."""
    players: dict[str, tuple[str | None, str | None]] = {}
    for spec in args.player:
        name, path, source = parse_opponent(spec)
        players[name] = (path, source if path != spec.partition("=")[2] else None)  # None: no @GROUP given
    for run_dir in args.runs:
        path = Path(run_dir) / "last.pt"
        if not path.is_file():
            raise ValueError(f"--runs {run_dir}: it holds no last.pt")
        ckpt = read_checkpoint(str(path))
        players[f"{ckpt['algo']}/{Path(run_dir).name}"] = (str(path), None)
    if args.random:
        players[RANDOM] = (None, None)
    if len(players) < 2:
        raise ValueError("a tournament needs at least two players: --player NAME=PATH, --runs DIR, --random")
    return players


def maker(players, name, spec, side, env_id, sample):
    """(make, group it reads) for player `name` on `side`."""
    path, fixed = players[name]
    if path is None:
        return random_actor(spec), side
    source = source_group(read_checkpoint(path), side, fixed, path)
    return load_actor(path, env_id, spec, source, torch.device("cpu"), greedy=not sample), source


def battles(make_env, sides, red, blue, n, seed, num_envs):
    """n battles of red vs blue ((make, source) each): per battle [red survivors, blue survivors, red kills, blue
    kills, red return, blue return]."""
    out = []
    for lo in range(0, n, num_envs):
        k = min(num_envs, n - lo)
        env = make_env(k, seed + lo)
        try:
            size = {g: env.groups[g].n_agents for g in sides}
            frozen = Frozen({sides[0]: red, sides[1]: blue}, k, seed + lo)
            obs, done, rows = env.reset(), None, [None] * k
            while any(r is None for r in rows):
                before = {g: obs.agent_mask[g].sum(1) for g in sides}
                step = env.step(frozen.actions(obs, done))
                for ep in step.episodes:
                    i = ep.env_index
                    if rows[i] is not None:
                        continue
                    if step.truncated[i]:  # the time limit: the flags are the deaths
                        alive = {g: size[g] - int(step.terminated[g][i].sum()) for g in sides}
                    else:  # wiped out: every agent is flagged; the team with fewer left before the step lost
                        alive = {g: int(before[g][i]) for g in sides}
                        last = [step.rewards[g][i].mean() for g in sides]
                        loser = int(np.argmin([alive[sides[0]], alive[sides[1]]])) if alive[sides[0]] != alive[
                            sides[1]] else int(np.argmin(last))  # fmt: skip
                        alive[sides[loser]] = 0
                    kills = [size[sides[1]] - alive[sides[1]], size[sides[0]] - alive[sides[0]]]
                    rows[i] = [alive[sides[0]], alive[sides[1]], *kills, *(ep.group_returns[g] for g in sides)]
                obs, done = step.next, step.done
        finally:
            env.close()
        out += rows
    return out


def wilson(score: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a rate `score` observed over n battles."""
    if n == 0:
        return (0.0, 1.0)
    centre = (score + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(score * (1 - score) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def bradley_terry(wins: np.ndarray, iterations: int = 1000) -> np.ndarray:
    """Strengths from a matrix of (fractional) wins[i, j] of i over j, by the MM algorithm (Hunter 2004); a tiny
    prior of half a win against every other player keeps unbeaten or winless players finite."""
    n = len(wins)
    w = wins + 0.5 * (1 - np.eye(n)) / max(n - 1, 1)
    games = w + w.T
    p = np.ones(n)
    for _ in range(iterations):
        p_new = w.sum(1) / (games / (p[:, None] + p[None, :])).sum(1)
        p_new /= np.exp(np.log(p_new).mean())
        if np.allclose(p_new, p, rtol=1e-10):
            break
        p = p_new
    return p


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", "--env", required=True, help="a two-team env id, e.g. battle_v4")
    parser.add_argument("--player", action="append", default=[], help="NAME=PATH or NAME=PATH@GROUP (repeatable)")
    parser.add_argument("--runs", nargs="*", default=[], help="run directories: each last.pt plays, named algo/dir")
    parser.add_argument("--random", action="store_true", help="add a uniformly random player")
    parser.add_argument("--battles", type=int, default=200, help="battles per ordered pair (default 200)")
    parser.add_argument("--seed", type=int, default=20_000, help="env seed of battle 0 (battle i: seed + i)")
    parser.add_argument("--num-envs", type=int, default=50, help="battles played side by side")
    parser.add_argument("--backend", default="auto", help="env backend (auto: native for MAgent2)")
    parser.add_argument("--env-kwargs", default="{}", help="env keyword arguments as JSON, e.g. '{\"map_size\": 45}'")
    parser.add_argument("--sample", action="store_true", help="players sample their actions (default: greedy)")
    parser.add_argument("--out", default=None, help="output directory (default results/<env>/)")
    args = parser.parse_args(argv)
    try:
        if args.battles < 1 or args.num_envs < 1:
            raise ValueError("--battles and --num-envs must be positive integers")
        kwargs = json.loads(args.env_kwargs)
        players = players_from(args)
        probe = envs.make(args.env_id, 1, 0, backend=args.backend, **kwargs)
        sides, groups = list(probe.groups), probe.groups
        probe.close()
        if len(sides) != 2:
            raise ValueError(f"{args.env_id} has the groups {sides}: a tournament needs two teams")
    except (ValueError, ImportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    make_env = lambda n, seed: envs.make(args.env_id, n, seed, backend=args.backend, **kwargs)  # noqa: E731
    names, start = list(players), time.time()
    outcomes = {}
    for a in names:
        for b in names:
            if a == b:
                continue
            try:
                red = maker(players, a, groups[sides[0]], sides[0], args.env_id, args.sample)
                blue = maker(players, b, groups[sides[1]], sides[1], args.env_id, args.sample)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            outcomes[f"{a} vs {b}"] = battles(make_env, sides, red, blue, args.battles, args.seed, args.num_envs)
            print(f"{a} ({sides[0]}) vs {b} ({sides[1]}): {summary(outcomes[f'{a} vs {b}'])}", flush=True)
    report = tables(names, sides, outcomes, args)
    out = Path(args.out) if args.out else RESULTS_DIR / args.env_id
    out.mkdir(parents=True, exist_ok=True)
    command = "python results/tournament.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    record = dict(env_id=args.env_id, commit=commit(), sides=sides, players={k: v[0] for k, v in players.items()},
                  battles=args.battles, seed=args.seed, env_kwargs=kwargs, sample=args.sample, command=command,
                  seconds=round(time.time() - start, 1), outcomes=outcomes,
                  columns=[f"{g} {k}" for k in ("alive", "kills", "return") for g in sides])  # fmt: skip
    (out / "tournament.json").write_text(json.dumps(record) + "\n")
    header = f"# Tournament on {args.env_id}\n\nCommand: `{command}` (commit {record['commit']}).\n\n"
    (out / "tournament.md").write_text(header + f"![score matrix](tournament.png)\n\n{report}")
    heatmap(names, outcomes, out / "tournament.png", args.env_id)
    print(report)
    return 0


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=RESULTS_DIR).stdout.strip() or "unknown"  # fmt: skip
    except OSError:
        return "unknown"


def scores(names, outcomes):
    """score[i, j]: player i's wins + draws / 2 against j over both sides; wins, draws; battles[i, j]."""
    n = len(names)
    score, wins, draws, played = (np.zeros((n, n)) for _ in range(4))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i == j:
                continue
            r = np.asarray(outcomes[f"{a} vs {b}"], float)  # a is the first side
            won, drawn = (r[:, 0] > r[:, 1]).sum(), (r[:, 0] == r[:, 1]).sum()
            lost = len(r) - won - drawn
            score[i, j] += won + drawn / 2
            score[j, i] += lost + drawn / 2
            wins[i, j] += won
            wins[j, i] += lost
            draws[i, j] += drawn
            draws[j, i] += drawn
            played[i, j] += len(r)
            played[j, i] += len(r)
    return score, wins, draws, played


def heatmap(names, outcomes, path, env_id):
    """The score matrix as a PNG: row player's score against the column player."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    score, _, _, played = scores(names, outcomes)
    rate = np.where(played > 0, score / np.maximum(played, 1), np.nan)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 + 0.9 * len(names)), max(3.5, 1.0 + 0.8 * len(names))))
    im = ax.imshow(rate, vmin=0, vmax=1, cmap="RdBu")
    for i in range(len(names)):
        for j in range(len(names)):
            if i != j:
                ax.text(j, i, f"{rate[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_title(f"{env_id}\nscore of the row player (wins + draws / 2)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary(rows) -> str:
    r = np.asarray(rows, float)
    return (f"red wins {int((r[:, 0] > r[:, 1]).sum())}, blue wins {int((r[:, 0] < r[:, 1]).sum())}, draws "
            f"{int((r[:, 0] == r[:, 1]).sum())}; kills {r[:, 2].mean():.1f} vs {r[:, 3].mean():.1f}")  # fmt: skip


def tables(names, sides, outcomes, args) -> str:
    """The score matrix with intervals, ratings and kills, as markdown."""
    n = len(names)
    score, wins, draws, played = scores(names, outcomes)
    kills, battles_of = np.zeros(n), np.zeros(n)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i != j:
                r = np.asarray(outcomes[f"{a} vs {b}"], float)
                kills[i] += r[:, 2].sum()
                kills[j] += r[:, 3].sum()
                battles_of[i] += len(r)
                battles_of[j] += len(r)
    strength = bradley_terry(score)
    elo = 400 * np.log10(strength)
    elo -= elo[names.index(RANDOM)] if RANDOM in names else elo.mean()
    lines = [f"{args.battles} battles per ordered pair ({sides[0]} first), both sides pooled: the row player's score "
             f"(wins + draws / 2) against the column player, with its 95% Wilson interval.", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---|" * n]  # fmt: skip
    for i, a in enumerate(names):
        cells = []
        for j in range(n):
            if i == j:
                cells.append("—")
                continue
            rate = score[i, j] / played[i, j]
            lo, hi = wilson(rate, int(played[i, j]))
            cells.append(f"{rate:.2f} [{lo:.2f}, {hi:.2f}]")
        lines.append(f"| **{a}** | " + " | ".join(cells) + " |")
    lines += ["", "| player | rating (Elo scale, Bradley-Terry) | score over all battles | wins / draws / losses | "
              "mean kills per battle |", "|---|---|---|---|---|"]  # fmt: skip
    for i in np.argsort(-elo):
        w, d = int(wins[i].sum()), int(draws[i].sum())
        lines.append(f"| {names[i]} | {elo[i]:+.0f} | {score[i].sum() / played[i].sum():.3f} | "
                     f"{w} / {d} / {int(played[i].sum()) - w - d} | {kills[i] / battles_of[i]:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
