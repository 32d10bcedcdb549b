"""A round-robin tournament of checkpoints of any script (and a random policy) on a two-team env: who beats whom,
and how sure we are.

    python results/tournament.py --env-id battle_v4 --player mappo0=runs/a/last.pt --player iql0=runs/b/last.pt@red \
        --random --battles 200
    python results/tournament.py --env-id battle_v4 --runs results/runs/battle_v4/*/seed*   # each run dir's last.pt

* Every ordered pair (A, B), A != B, plays `--battles` battles with A as the env's first group (red) and B as the
  second (blue), so each pair meets on both sides. Battle i of every pair starts from env seed `--seed + i`: pairs
  meet on the same start states. Players act greedily, or sample their actions (`--sample`: every player;
  `--sample-scripts mfac,ippo`: the players of those scripts, e.g. the actor-critics, as the mean-field paper's
  battles let MF-AC sample and MF-Q act greedily), through the `actor()` of the script that wrote their
  checkpoint (runtime.opponents), on the env the checkpoints were trained on.
* A battle is won by the team with more agents alive at its end, drawn if equal. Kills are the opposing agents
  that died. A battle that ends because a team was wiped out flags every agent (MAgent2), so there the survivors
  are those alive before the last step, and the team with fewer of them (or, if equal, the lower reward in that
  step) is the one wiped out.
* A player's script is the algorithm that wrote its checkpoint; several checkpoints of one script are its seeds.
  Per script, pooled over its seeds: the score against each other script and the Bradley-Terry rating, each with a
  95% interval from a bootstrap over seeds (every script's seeds resampled with replacement, 2,000 times), which
  carries the spread between seeds that a Wilson interval over the pooled battles would hide. Per player (a seed
  pair's battles): the score with its 95% Wilson interval and the rating. Seed by seed, per two scripts: how many
  seed pairs each script's seed wins, how many are level, how many go against the scripts' pooled score (the odds
  that a one-seed-each comparison names the other winner), and which side won the battles.
* Output in `--out` (default results/<env>/): tournament.json (every pair's outcomes, the command, the commit, each
  checkpoint's sha256, each launch's seconds and pairs played), tournament.md: the tables above, wins / draws /
  losses and mean kills per battle (ratings on the Elo scale, random = 0 when it plays); and tournament.png, the two
  score matrices as heatmaps.
* `--keep DIR` copies every checkpoint player to `DIR/<player name>/last.pt` (weights and flags; the optimizer
  states, which no player needs, are dropped) and exits: run directories are not kept, and a tournament played from
  `--runs DIR/*/*` can be played again, and joined by new players, from the copies.
* Pairs play in `--workers` processes (one torch thread each). Each finished pair is appended to
  `<out>/tournament.partial.jsonl` at once; a tournament launched again with the same settings reuses the pairs
  there and in an earlier tournament.json whose checkpoints are unchanged (sha256), so a stopped tournament goes on
  where it stopped and a new player plays only its own pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import shlex
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import torch

import envs
from runtime.checkpoint import copy_policy, read_checkpoint
from runtime.opponents import Frozen, load_actor, parse_opponent, random_actor

RESULTS_DIR = Path(__file__).resolve().parent
RANDOM = "random"
PARTIAL = "tournament.partial.jsonl"
BOOTSTRAP = 2000  # resamples of the seeds for the script-level intervals
LEVEL = 0.03  # a seed pair scoring within 0.5 +- LEVEL is level: neither seed wins it
ONE_SIDED = 0.9  # a player winning over this share of its battles on the first side "wins as red"


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
        name, path, source = parse_opponent(spec, "--player", "NAME", "mappo0")
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


def env_kwargs(text: str) -> dict:
    """--env-kwargs as keyword arguments of the env; a ValueError in the words of the scripts' own check otherwise."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--env-kwargs is not valid JSON ({e}); use e.g. '{{\"map_size\": 45}}'") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"--env-kwargs must be a JSON object such as '{{\"map_size\": 45}}', not {text!r}")
    return kwargs


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
    parser.add_argument("--sample-scripts", default="", help="comma-separated scripts whose players sample their "
                        "actions, the others acting greedily (e.g. mfac,ippo,mappo)")  # fmt: skip
    parser.add_argument("--out", default=None, help="output directory (default results/<env>/)")
    parser.add_argument("--workers", type=int, default=1, help="pairs played side by side, one process each")
    parser.add_argument("--keep", type=Path, default=None, help="copy each checkpoint player (no optimizer states) to "
                        "KEEP/<player name>/last.pt and exit")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if args.battles < 1 or args.num_envs < 1 or args.workers < 1:
            raise ValueError("--battles, --num-envs and --workers must be positive integers")
        kwargs = env_kwargs(args.env_kwargs)
        players = players_from(args)
        if args.keep:
            for path in keep(players, args.keep):
                print(f"kept {path}")
            return 0
        probe = envs.make(args.env_id, 1, 0, backend=args.backend, **kwargs)
        sides, groups = list(probe.groups), probe.groups
        probe.close()
        if len(sides) != 2:
            raise ValueError(f"{args.env_id} has the groups {sides}: a tournament needs two teams")
        scripts = {name: script_of(path) for name, (path, _) in players.items()}
        sampled = sorted(a for a in args.sample_scripts.split(",") if a)
        args.samples = {name: args.sample or script in sampled for name, script in scripts.items()}
        for name in players:  # every player must fit both sides before any battle
            for side in sides:
                maker(players, name, groups[side], side, args.env_id, args.samples[name])
    except (ValueError, ImportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names, start = list(players), time.time()
    out = Path(args.out) if args.out else RESULTS_DIR / args.env_id
    out.mkdir(parents=True, exist_ok=True)
    digests = {name: sha256(path) for name, (path, _) in players.items()}
    settings = dict(env_id=args.env_id, battles=args.battles, seed=args.seed, backend=args.backend, env_kwargs=kwargs,
                    sample=args.sample, sample_scripts=sampled)  # fmt: skip
    keys = {(a, b): pair_key(settings, players[a], players[b], digests[a], digests[b]) for a in names for b in names}
    outcomes, earlier = reusable(out, keys)
    todo = [(a, b) for a in names for b in names if a != b and f"{a} vs {b}" not in outcomes]
    if outcomes:
        print(f"{len(outcomes)} pairs reused from {out} (same checkpoints and settings), {len(todo)} to play")
    task = dict(players=players, groups=groups, sides=sides, args=vars(args), kwargs=kwargs)
    try:
        with open(out / PARTIAL, "a") as partial:
            for (a, b), rows in play(task, todo, args.workers):
                outcomes[f"{a} vs {b}"] = rows
                partial.write(json.dumps({"pair": f"{a} vs {b}", "key": keys[a, b], "rows": rows}) + "\n")
                partial.flush()
                print(f"{a} ({sides[0]}) vs {b} ({sides[1]}): {summary(rows)}", flush=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    outcomes = {f"{a} vs {b}": outcomes[f"{a} vs {b}"] for a in names for b in names if a != b}  # in order
    report, seconds = tables(names, sides, outcomes, args, scripts), round(time.time() - start, 1)
    command = "python results/tournament.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    record = dict(env_id=args.env_id, commit=commit(), sides=sides, players={k: v[0] for k, v in players.items()},
                  scripts=scripts, sha256=digests, battles=args.battles, seed=args.seed, env_kwargs=kwargs,
                  backend=args.backend, sample=args.sample, sampling=args.samples,
                  command=command, seconds=seconds,
                  launches=earlier + [dict(commit=commit(), seconds=seconds, pairs=len(todo))],
                  pair_keys={f"{a} vs {b}": keys[a, b] for a in names for b in names if a != b}, outcomes=outcomes,
                  columns=[f"{g} {k}" for k in ("alive", "kills", "return") for g in sides])  # fmt: skip
    (out / "tournament.json").write_text(json.dumps(record) + "\n")
    header = f"# Tournament on {args.env_id}\n\nCommand: `{command}` (commit {record['commit']}).\n\n"
    (out / "tournament.md").write_text(header + f"![score matrices](tournament.png)\n\n{report}")
    heatmap(names, outcomes, out / "tournament.png", args.env_id, scripts)
    (out / PARTIAL).unlink(missing_ok=True)  # everything it held is in tournament.json now
    print(report)
    return 0


def keep(players: dict, directory: Path) -> list[Path]:
    """Copies of the checkpoint players without their optimizer states, at `directory/<player name>/last.pt`."""
    kept = [(path, directory / name / "last.pt") for name, (path, _) in players.items() if path is not None]
    for path, copy in kept:
        copy_policy(path, str(copy))
    return [copy for _, copy in kept]


def sha256(path: str | None) -> str | None:
    """The checkpoint's digest (None for the random player)."""
    return None if path is None else hashlib.sha256(Path(path).read_bytes()).hexdigest()


def script_of(path: str | None) -> str:
    """The algorithm that wrote a checkpoint: its player's script (random for the random player)."""
    return RANDOM if path is None else str(read_checkpoint(path)["algo"])


def pair_key(settings: dict, a: tuple, b: tuple, digest_a: str | None, digest_b: str | None) -> str:
    """What a pair's outcomes depend on: the settings, both checkpoints (by content) and the groups they play."""
    text = json.dumps([settings, digest_a, a[1], digest_b, b[1]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reusable(out: Path, keys: dict) -> tuple[dict, list[dict]]:
    """Outcomes already played with the same key, in an earlier tournament.json and in the partial file; and the
    launches that played the earlier tournament.json when it shares a pair with this one (commit, seconds, pairs), so
    that a tournament played over several launches, or launched again to write its tables anew, keeps every launch's
    cost (a record from before this list was kept: one launch, its pairs unknown)."""
    wanted = {f"{a} vs {b}": key for (a, b), key in keys.items() if a != b}
    found, launched = {}, []
    try:
        earlier = json.loads((out / "tournament.json").read_text())
        for pair, key in earlier.get("pair_keys", {}).items():
            if wanted.get(pair) == key:
                found[pair] = earlier["outcomes"][pair]
        if found:
            old = dict(commit=earlier.get("commit"), seconds=earlier.get("seconds"), pairs=None)
            launched = earlier.get("launches") or [old]
    except (OSError, ValueError, KeyError):
        pass
    try:
        for line in (out / PARTIAL).read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a line cut short by a kill
                continue
            if wanted.get(entry.get("pair")) == entry.get("key"):
                found[entry["pair"]] = entry["rows"]
    except OSError:
        pass
    return found, launched


def play_pair(task: dict, a: str, b: str) -> tuple[tuple[str, str], list]:
    """The battles of one ordered pair, in this process (one torch thread: the workers run side by side)."""
    torch.set_num_threads(1)
    args, players, groups, sides = task["args"], task["players"], task["groups"], task["sides"]
    red = maker(players, a, groups[sides[0]], sides[0], args["env_id"], args["samples"][a])
    blue = maker(players, b, groups[sides[1]], sides[1], args["env_id"], args["samples"][b])
    make_env = lambda n, seed: envs.make(args["env_id"], n, seed, backend=args["backend"], **task["kwargs"])  # noqa: E731
    return (a, b), battles(make_env, sides, red, blue, args["battles"], args["seed"], args["num_envs"])


def play(task: dict, pairs: list, workers: int):
    """Yield ((a, b), rows) for every pair as it finishes: here, or in `workers` processes."""
    if workers <= 1:
        for a, b in pairs:
            yield play_pair(task, a, b)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for future in as_completed([pool.submit(play_pair, task, a, b) for a, b in pairs]):
            yield future.result()


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


def script_scores(names, outcomes, scripts):
    """The players' score and battle matrices, the scripts in order of appearance, and each script's players."""
    score, _, _, played = scores(names, outcomes)
    order = list(dict.fromkeys(scripts[n] for n in names))
    members = [[i for i, n in enumerate(names) if scripts[n] == s] for s in order]
    return score, played, order, members


def pooled(score, played, members, weights):
    """Script-level score and battle matrices: the players' matrices summed over each script's seeds, each seed
    counted `weights[i]` times (1 for the seeds as they are; a bootstrap resample's multiplicities)."""
    m = np.zeros((len(members), len(weights)))
    for k, idx in enumerate(members):
        m[k, idx] = weights[idx]
    s, p = m @ score @ m.T, m @ played @ m.T
    np.fill_diagonal(s, 0.0)  # a script's seeds against one another: not a score against another script
    np.fill_diagonal(p, 0.0)
    return s, p


def elo_of(score, names):
    """Bradley-Terry ratings on the Elo scale, random = 0 where it plays (else the mean = 0)."""
    elo = 400 * np.log10(bradley_terry(score))
    return elo - (elo[names.index(RANDOM)] if RANDOM in names else elo.mean())


def bootstrap_scripts(score, played, order, members, resamples=BOOTSTRAP, seed=0):
    """95% percentile intervals over seeds of the pooled score matrix and the scripts' ratings: each resample
    draws every script's seeds with replacement (numpy.random.default_rng(seed))."""
    rng = np.random.default_rng(seed)
    rates, elos = [], []
    for _ in range(resamples):
        weights = np.zeros(len(score))
        for idx in members:
            np.add.at(weights, rng.choice(idx, len(idx)), 1.0)
        s, p = pooled(score, played, members, weights)
        rates.append(np.divide(s, p, out=np.zeros_like(s), where=p > 0))  # 0 on the diagonal, never shown
        elos.append(elo_of(s, order))
    rate_ci = np.percentile(np.array(rates), [2.5, 97.5], axis=0)
    elo_ci = np.percentile(np.array(elos), [2.5, 97.5], axis=0)
    return rate_ci, elo_ci


def heatmap(names, outcomes, path, env_id, scripts=None):
    """The score matrices as a PNG: per script pooled over seeds (left, when a script has several players) and per
    player (right): the row's score (wins + draws / 2) against the column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scripts = scripts or {n: n for n in names}
    score, played, order, members = script_scores(names, outcomes, scripts)
    panels = [(names, score, played)]
    if len(order) < len(names):
        s, p = pooled(score, played, members, np.ones(len(names)))
        panels.insert(0, (order, s, p))
    size = [max(4.0, 1.2 + 0.45 * len(labels)) for labels, _, _ in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(size), max(size) * 0.85), squeeze=False)
    for ax, (labels, s, p) in zip(axes[0], panels, strict=True):
        rate = np.where(p > 0, s / np.maximum(p, 1), np.nan)
        im = ax.imshow(rate, vmin=0, vmax=1, cmap="RdBu")
        font = 8 if len(labels) <= 8 else 5
        for i in range(len(labels)):
            for j in range(len(labels)):
                if i != j and not np.isnan(rate[i, j]):
                    ax.text(j, i, f"{rate[i, j]:.2f}", ha="center", va="center", fontsize=font)
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=font + 1)
        ax.set_yticks(range(len(labels)), labels, fontsize=font + 1)
        what = "per script, pooled over seeds" if labels is order else "per player"
        ax.set_title(f"{env_id}: score of the row ({what})", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary(rows) -> str:
    r = np.asarray(rows, float)
    return (f"red wins {int((r[:, 0] > r[:, 1]).sum())}, blue wins {int((r[:, 0] < r[:, 1]).sum())}, draws "
            f"{int((r[:, 0] == r[:, 1]).sum())}; kills {r[:, 2].mean():.1f} vs {r[:, 3].mean():.1f}")  # fmt: skip


def kill_matrix(names, outcomes):
    """kills[i, j]: the agents player i killed in its battles against j, over both sides."""
    kills = np.zeros((len(names), len(names)))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i != j:
                r = np.asarray(outcomes[f"{a} vs {b}"], float)  # a is the first side
                kills[i, j] += r[:, 2].sum()
                kills[j, i] += r[:, 3].sum()
    return kills


def tables(names, sides, outcomes, args, scripts=None) -> str:
    """The score matrices with intervals, ratings and kills, as markdown: per script (when a script has several
    players), then per player."""
    n = len(names)
    scripts = scripts or {name: name for name in names}
    score, wins, draws, played = scores(names, outcomes)
    kills = kill_matrix(names, outcomes)
    lines = []
    _, _, order, members = script_scores(names, outcomes, scripts)
    if len(order) < n:
        lines += script_tables(score, wins, draws, played, kills, order, members)
        lines += seed_pair_tables(names, sides, outcomes, scripts)
    elo = elo_of(score, names)
    lines += [f"Per player: {args.battles} battles per ordered pair ({sides[0]} first), both sides pooled: the row "
              f"player's score (wins + draws / 2) against the column player, with its 95% Wilson interval.", "",
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
        w, d, n_i = int(wins[i].sum()), int(draws[i].sum()), played[i].sum()
        row = f"| {names[i]} | {elo[i]:+.0f} | {score[i].sum() / n_i:.3f} | {w} / {d} / {int(n_i) - w - d}"
        lines.append(f"{row} | {kills[i].sum() / n_i:.2f} |")
    return "\n".join(lines) + "\n"


def script_tables(score, wins, draws, played, kills, order, members) -> list[str]:
    """Per script, pooled over its seeds (against the other scripts only): the score matrix and the ratings, with
    95% bootstrap intervals over seeds."""
    ones = np.ones(len(score))
    s, p = pooled(score, played, members, ones)
    w, d, k = (pooled(x, played, members, ones)[0] for x in (wins, draws, kills))
    rate_ci, elo_ci = bootstrap_scripts(score, played, order, members)
    elo = elo_of(s, order)
    seeds = ", ".join(f"{name} {len(idx)}" for name, idx in zip(order, members, strict=True))
    lines = [f"Per script, pooled over its seeds ({seeds}): the row script's score (wins + draws / 2) against the "
             f"column script over every battle of their seeds, both sides, with a 95% interval from {BOOTSTRAP:,} "
             "bootstrap resamples of each script's seeds.", "",
             "| | " + " | ".join(order) + " |", "|---|" + "---|" * len(order)]  # fmt: skip
    for i, a in enumerate(order):
        cells = ["—" if i == j else f"{s[i, j] / p[i, j]:.2f} [{rate_ci[0, i, j]:.2f}, {rate_ci[1, i, j]:.2f}]"
                 for j in range(len(order))]  # fmt: skip
        lines.append(f"| **{a}** | " + " | ".join(cells) + " |")
    lines += ["", "| script | seeds | rating (Elo scale, Bradley-Terry) [95% over seeds] | score against the other "
              "scripts | wins / draws / losses | mean kills per battle |", "|---|---|---|---|---|---|"]  # fmt: skip
    for i in np.argsort(-elo):
        n, won, drawn = p[i].sum(), w[i].sum(), d[i].sum()
        lines.append(f"| {order[i]} | {len(members[i])} | {elo[i]:+.0f} [{elo_ci[0, i]:+.0f}, {elo_ci[1, i]:+.0f}] | "
                     f"{s[i].sum() / n:.3f} | {int(won)} / {int(drawn)} / {int(n - won - drawn)} | "
                     f"{k[i].sum() / n:.2f} |")  # fmt: skip
    return lines + [""]


def seed_pair_tables(names, sides, outcomes, scripts) -> list[str]:
    """Seed by seed, for every two learning scripts (random left out): how many of their seed pairs each script's
    seed wins (score beyond 0.5 +- LEVEL), how many are level, how many go against the pooled score, and the kills a
    battle; then which side won the battles between learning players, and in how many seed pairs each player wins
    its battles on the first side: a one-seed-each comparison's odds, and what the side swap is for."""
    learners = [n for n in names if n != RANDOM]
    score, played, order, members = script_scores(learners, outcomes, scripts)
    kills = kill_matrix(learners, outcomes)
    lines = [f"Seed by seed, learning scripts only: a seed pair is won by a seed scoring above {0.5 + LEVEL:.2f} "
             f"against the other, level within 0.5 +- {LEVEL}; \"against\" counts the seed pairs won by the seed of "
             "the script that loses the pooled score (its score beyond 0.5 +- the same margin).", "",
             "| row script | column script | pooled score | seed pairs | row seed wins / level / column seed wins | "
             "against | kills a battle (row : column) |", "|---|---|---:|---:|---|---:|---|"]  # fmt: skip
    total = against_all = level_all = 0
    for a in range(len(order)):
        for b in range(a + 1, len(order)):
            pairs = [(i, j) for i in members[a] for j in members[b]]
            rates = np.array([score[i, j] / played[i, j] for i, j in pairs])
            won, lost = int((rates > 0.5 + LEVEL).sum()), int((rates < 0.5 - LEVEL).sum())
            level = len(pairs) - won - lost
            n = sum(played[i, j] for i, j in pairs)
            pooled_rate = sum(score[i, j] for i, j in pairs) / n
            against = lost if pooled_rate > 0.5 + LEVEL else won if pooled_rate < 0.5 - LEVEL else 0
            row_kills, column_kills = (sum(kills[i, j] for i, j in pairs) / n, sum(kills[j, i] for i, j in pairs) / n)
            total, against_all, level_all = total + len(pairs), against_all + against, level_all + level
            lines.append(f"| {order[a]} | {order[b]} | {pooled_rate:.2f} | {len(pairs)} | {won} / {level} / {lost} | "
                         f"{against} | {row_kills:.1f} : {column_kills:.1f} |")  # fmt: skip

    def first_side(a, b):  # each battle of a (first side) against b: did the first side win, did it lose
        r = np.asarray(outcomes[f"{a} vs {b}"], float)
        return r[:, 0] > r[:, 1], r[:, 0] < r[:, 1]

    decided = [first_side(a, b) for a in learners for b in learners if a != b]
    red, blue = (np.concatenate([d[k] for d in decided]).mean() for k in (0, 1))
    meetings = [(a, b) for x, a in enumerate(learners) for b in learners[x + 1 :]]
    one_sided = sum(min(first_side(a, b)[0].mean(), first_side(b, a)[0].mean()) > ONE_SIDED for a, b in meetings)
    return lines + [
        "",
        f"Of the {total} seed pairs between two learning scripts, {against_all} go against their "
        f"scripts' pooled score and {level_all} are level. Sides, over every battle between two learning "
        f"players: {sides[0]} (first) won {red:.1%}, {sides[1]} {blue:.1%}, drawn {1 - red - blue:.1%}; "
        f"in {one_sided} of the {len(meetings)} seed pairs of learning players (one script's seeds among "
        f"themselves included) each player wins over {ONE_SIDED:.0%} of its battles as {sides[0]}.",
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())
