"""Cross-play on a competitive MPE task: each script's trained team against each script's opposing team.

    python results/crossplay.py --env-id simple_tag_v3 --algos mappo,ippo,maddpg,matd3,iddpg
    python results/crossplay.py --env-id simple_crypto_v3 --teams eve/alice,bob --algos ...

A matrix row (`<task>/<script>-3m.json`) gives each group's return when the script's groups play one another, its own
equilibrium: it does not say whose adversaries are better. Here team 1 of script X meets team 2 of script Y, seed s
of X against seed s of Y (`--seeds`, default 0,1,2: the matrix's), each pair on protocol v2's final episodes (1000,
env i seeded FINAL_SEED + i, greedy), and every team's return is averaged over the seed pairs. The diagonal is
then the matrix row's own per-group numbers, which the script checks: exactly on the rows' own episodes, up to
sampling noise with fewer `--episodes` or `--backend numba` (ours: the same physics, faster, other start states).
Checkpoints: `<runs>/<task>/<script>-<variant>/seed<s>/last.pt`. `--keep DIR` copies them (weights and flags, no
optimizer states) to the same layout under DIR and exits: run directories live in a sweep's clone and are not kept,
so the published cross-play is played, and joined by a new script, from the copies in results/policies
(`--runs results/policies`).

mpe2 has one action space per env. A pair of a discrete and a continuous script plays in the continuous env, the
discrete team's action a sent as its continuous twin: the one-hot e_a, or for a group that moves and speaks
(simple_world_comm_v3's leadadversary: 20 actions = 5 moves x 4 words, 9 dimensions) [e_(a % 5), e_(a // 5)], which
mpe2 turns into the same force and message as the discrete action (tests/test_opponents.py checks it step by step
on every competitive task). A group with no such twin is left out of the pairs that need it ("—"), with a line
saying why.

A pair whose checkpoints are unchanged since the last `<out>/crossplay.json` (same settings; each checkpoint's
sha256 is recorded) keeps its returns there, and the commit that played it (`pair_commits`): a script joining the
cross-play plays only its own pairs. `--fresh` plays every pair.

Writes `<out>/crossplay.json` (every pair, the command, the commit, and `launches`: each launch that played its
pairs, with its commit, seconds and number of pairs played) and `crossplay.md`: one matrix per team of its
mean return (rows: team 1's script, columns: team 2's), and each script's mean over its opponents. make_readme.py
nests each crossplay.md in results/README.md under one table of every task's teams (`summary()`, from the JSONs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from collect import git_commit  # noqa: E402

import envs  # noqa: E402
from runtime.checkpoint import copy_policy, read_checkpoint  # noqa: E402
from runtime.evaluation import FINAL_EPISODES, FINAL_SEED, evaluate  # noqa: E402
from runtime.opponents import Frozen, load_actor, script_module  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent


def make(env_id: str, n: int, seed: int, continuous: bool, backend: str = "pettingzoo"):
    """Protocol v2's evaluation env (PettingZoo's mpe2; `backend` "numba": ours, faster, other start states), in the
    given action space."""
    return envs.make(env_id, n, seed, vector="sync", backend=backend, continuous_actions=continuous)


def split_teams(text: str | None, groups: list[str]) -> tuple[list[str], list[str]]:
    """'a/b,c' -> (['a'], ['b', 'c']); None: the env's two groups. Every group on exactly one team."""
    if len(groups) < 2:
        raise ValueError(f"the env has one group {groups}: cross-play needs two teams (a competitive env, e.g. "
                         f"simple_tag_v3 or battle_v4)")  # fmt: skip
    if text is None:
        if len(groups) != 2:
            raise ValueError(f"the env has the groups {groups}: name the two teams, e.g. --teams {groups[0]}/"
                             f"{','.join(groups[1:])}")  # fmt: skip
        return [groups[0]], [groups[1]]
    one, sep, two = text.partition("/")
    teams = ([g for g in one.split(",") if g], [g for g in two.split(",") if g])
    if not sep or not all(teams) or sorted(teams[0] + teams[1]) != sorted(groups):
        raise ValueError(f"--teams {text!r}: give every group of the env {groups} once, as TEAM1/TEAM2 with "
                         f"commas inside a team")  # fmt: skip
    return teams


class Unmappable(ValueError):
    """A discrete team that cannot play in the continuous env (no continuous twin of its actions), or a team of
    several groups whose script acts for them jointly: the pair is left out."""


MOVES = 5  # mpe2's movement actions: none, -x, +x, -y, +y


def continuous_twin(n: int, d: int):
    """mpe2's continuous form of its discrete actions (n of them) for a group with d continuous dimensions, as a map
    of action arrays, or None. A group that only moves or only speaks: a -> e_a (n == d). One that moves and speaks
    (mpe2 decodes a as move a % 5, word a // 5): a -> [e_(a % 5), e_(a // 5)] (n == 5 * (d - 5))."""
    if n == d:
        return lambda a: np.eye(d, dtype=np.float32)[a]
    if d > MOVES and n == MOVES * (d - MOVES):
        return lambda a: np.concatenate([np.eye(MOVES, dtype=np.float32)[a % MOVES],
                                         np.eye(d - MOVES, dtype=np.float32)[a // MOVES]], -1)  # fmt: skip
    return None


def in_continuous_env(make_actor, twin):
    """A discrete group's actor acting in the continuous env: its actions sent through `twin`."""

    def make_(num_envs, rng):
        act = make_actor(num_envs, rng)

        def act_(obs, done):
            return {g: twin(a) for g, a in act(obs, done).items()}

        return act_

    return make_


def team_actors(path: Path, env_id: str, team: list[str], specs: dict, continuous_env: bool) -> dict:
    """group -> (make, the checkpoint's group it reads) for every group of `team`, from the checkpoint at `path`."""
    ckpt = read_checkpoint(str(path))
    continuous = bool(ckpt["args"].get("continuous_actions"))
    if len(team) > 1 and hasattr(script_module(ckpt["algo"]), "team_actor"):
        raise Unmappable(f"{path}: {ckpt['algo']}'s agents act jointly across the groups {team} (runtime.opponents."
                         f"load_team), and cross-play plays a team group by group")  # fmt: skip
    actors = {}
    for g in team:
        own, played = specs[continuous][g], specs[continuous_env][g]
        make_actor = load_actor(str(path), env_id, own, g, torch.device("cpu"), greedy=True, ckpt=ckpt)
        if continuous != continuous_env:
            if (twin := continuous_twin(own.action_dim, played.action_dim)) is None:
                raise Unmappable(f"{path}: group {g!r} has {own.action_dim} discrete actions but {played.action_dim}"
                                 f" continuous action dimensions, so it cannot play in the continuous env")  # fmt: skip
            make_actor = in_continuous_env(make_actor, twin)
        actors[g] = (make_actor, g)
    return actors


def play(env_id: str, actors: dict, continuous: bool, episodes: int, backend: str) -> dict[str, float]:
    """Mean return per group over protocol v2's final episodes (`episodes` of them, env i seeded FINAL_SEED + i),
    the teams acted for by `actors` (greedy: the actors' random streams are never drawn)."""
    make_env = lambda n, seed: make(env_id, n, seed, continuous, backend)  # noqa: E731
    _, groups = evaluate(make_env, lambda n, rng: Frozen(dict(actors), n, FINAL_SEED).actions, episodes, FINAL_SEED)
    return {g: float(np.mean(r)) for g, r in groups.items()}


def check_diagonal(rows: Path, label: str, cell: dict, seeds: list[int]) -> str | None:
    """How far a self-play cell is from the matrix row `rows/<label>.json`'s per-group final policies of the same
    seeds (the same episodes and policies: any difference is a defect); None without that row."""
    try:
        per_seed = {p["seed"]: p for p in json.loads((rows / f"{label}.json").read_text())["per_seed"]}
        groups = [per_seed[s]["final_policy"]["per_group"] for s in seeds]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    gap = max(abs(np.mean([pg[g] for pg in groups]) - v) for g, v in cell.items())
    return f"`{label}` against itself is within {gap:.2g} of its row's per-group final policies ({label}.json)"


def digest(path: Path) -> str:
    """A checkpoint's bytes, in 16 hex digits: a pair is played again only where one of its checkpoints changed."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def earlier_pairs(path: Path, settings: dict, digests: dict[str, str]) -> tuple[dict[str, tuple[list, str]], list]:
    """The pairs of an earlier crossplay.json made with the same settings whose checkpoints are all unchanged:
    pair -> (its per-seed returns, the commit that played it), and, when it has any, the launches that played that
    record (commit, seconds, pairs; one launch of unknown pairs for a record from before the list was kept), so a
    cross-play played over several launches keeps each one's cost. Nothing from a record without digests; a record
    that cannot be read, or lacks a field it needs, is named in a line and every pair is played again."""
    if not path.is_file():
        return {}, []
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return unusable(path, f"unreadable ({e})")
    if not isinstance(old, dict):
        return unusable(path, "not a JSON object")
    if any(old.get(k) != v for k, v in settings.items()) or not isinstance(old.get("digests"), dict):
        return {}, []
    per_seed, commits = old.get("per_seed"), old.get("pair_commits", {})
    if not isinstance(per_seed, dict) or not all(isinstance(runs, list) for runs in per_seed.values()):
        return unusable(path, "no 'per_seed' (each pair's list of per-seed returns)")
    if not isinstance(commits, dict) or not isinstance(old.get("commit", ""), str):
        return unusable(path, "'pair_commits' or 'commit' is not what crossplay.py writes")
    same = lambda a: all(old["digests"].get(k) == v for k, v in digests.items() if k.startswith(f"{a}/"))  # noqa: E731
    pairs = {pair: (runs, commits.get(pair, old.get("commit", "unknown"))) for pair, runs in per_seed.items()
             if runs and all(same(a) for a in pair.split(" vs "))}  # fmt: skip
    launches = old.get("launches") or [dict(commit=old.get("commit"), seconds=old.get("seconds"), pairs=None)]
    return pairs, launches if pairs else []


def unusable(path: Path, problem: str) -> tuple[dict, list]:
    """No earlier pairs, and a line saying why (the earlier record is overwritten by this run's)."""
    print(f"note: {path}: {problem}; every pair is played again", file=sys.stderr)
    return {}, []


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; a ValueError for a word that is not an integer or a seed given twice (its pairs would
    be played twice and counted as two seeds)."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not all(w.lstrip("-").isdigit() for w in words):
        raise ValueError(f"--seeds {text!r}: expected comma-separated integers, e.g. --seeds 0,1,2")
    seeds = [int(w) for w in words]
    if twice := sorted({s for s in seeds if seeds.count(s) > 1}):
        raise ValueError(f"--seeds {text!r}: seed {twice[0]} given twice; each seed pairs once, e.g. --seeds 0,1,2")
    return seeds


def number(v: float) -> str:
    return "—" if np.isnan(v) else f"{v:.2f}"


def seed_mean(runs: list[dict]) -> dict[str, float]:
    """{group: mean return over the seed pairs} of one pair's runs ({} for a pair left out)."""
    return {g: float(np.mean([r[g] for r in runs])) for g in runs[0]} if runs else {}


def pair_cells(per_seed: dict[str, list[dict]]) -> dict[tuple[str, str], dict[str, float]]:
    """{(team 1's script, team 2's script): seed_mean} from a record's `per_seed`."""
    return {tuple(pair.split(" vs ")): seed_mean(runs) for pair, runs in per_seed.items()}


def team_means(cells: dict, team: list[str]) -> dict[tuple[str, str], float]:
    """A team's return in each pair: the mean over its groups (NaN for a pair left out)."""
    return {pair: float(np.mean([cell[g] for g in team])) if cell else np.nan for pair, cell in cells.items()}


def summary(records: list[dict]) -> str:
    """Across tasks, one row per task and team: each script's team return averaged over every opposing script (its
    own included; the `mean` of its matrix in crossplay.md), its self-play cell in brackets, the best in bold."""
    records = [r for r in records if r.get("algos") and r.get("per_seed")]
    if not records:
        return ""
    algos = list(dict.fromkeys(a for r in records for a in r["algos"]))
    lines = ["| task: team | " + " | ".join(f"`{a}`" for a in algos) + " |", "|---" * (len(algos) + 1) + "|"]
    for record in records:
        cells = pair_cells(record["per_seed"])
        for k, team in enumerate(record["teams"]):
            mean = team_means(cells, team)
            scores = {}
            for a in record["algos"]:
                against = [mean[(a, b) if k == 0 else (b, a)] for b in record["algos"]]
                scores[a] = (np.nanmean(against), mean[a, a]) if not np.isnan(against).all() else (np.nan, np.nan)
            best = np.nanmax([s for s, _ in scores.values()])
            shown = []
            for a in algos:
                if a not in scores:
                    shown.append("—")
                    continue
                s, own = scores[a]
                text = f"{number(s)} ({number(own)})"
                shown.append(f"**{text}**" if s == best else text)
            lines.append(f"| {record['env_id']}: {'+'.join(team)} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def tables(algos: list[str], teams: tuple[list[str], list[str]], cells: dict) -> str:
    """One markdown matrix per team (its mean return over its groups), rows team 1's script, columns team 2's."""
    out = []
    for k, team in enumerate(teams):
        mean = team_means(cells, team)
        title = f"**{'+'.join(team)}** (team {k + 1}) return: rows {'+'.join(teams[0])}'s script, columns " \
                f"{'+'.join(teams[1])}'s script; higher is better for {'+'.join(team)}"  # fmt: skip
        lines = [title, "", "| | " + " | ".join(f"`{b}`" for b in algos) + " | mean |", "|---" * (len(algos) + 2) + "|"]
        for a in algos:
            row = [mean[a, b] for b in algos]
            lines.append(f"| `{a}` | " + " | ".join(map(number, row)) + f" | {number(np.nanmean(row))} |")
        lines.append("| mean | " + " | ".join(number(np.nanmean([mean[a, b] for a in algos])) for b in algos) + " | |")
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", "--env", required=True, help="a competitive MPE task, e.g. simple_tag_v3")
    parser.add_argument("--algos", required=True, help="comma-separated scripts, e.g. mappo,maddpg")
    parser.add_argument("--variant", default="3m", help="the rows' variant: runs <script>-<variant> (default 3m)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds paired s with s (default 0,1,2)")
    parser.add_argument("--teams", default=None, help="TEAM1/TEAM2, groups comma-separated (default: the 2 groups)")
    parser.add_argument("--episodes", type=int, default=FINAL_EPISODES, help="per seed pair (default: protocol v2's)")
    parser.add_argument(
        "--backend",
        default="pettingzoo",
        choices=["pettingzoo", "numba"],
        help="the env: pettingzoo (protocol v2's, default) or numba (ours: faster, other episodes)",
    )
    parser.add_argument("--runs", type=Path, default=RESULTS_DIR / "runs", help="run directories' root")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default results/<env>/)")
    parser.add_argument("--keep", type=Path, default=None, help="copy each checkpoint (no optimizer states) to "
                        "KEEP/<env>/<script>-<variant>/seed<s>/last.pt and exit (e.g. results/policies)")  # fmt: skip
    parser.add_argument("--fresh", action="store_true", help="play every pair, also those whose checkpoints did not "
                        "change since the last crossplay.json (reused by default)")  # fmt: skip
    args = parser.parse_args(argv)
    algos = [a for a in args.algos.split(",") if a]
    label = (lambda a: f"{a}-{args.variant}") if args.variant else (lambda a: a)
    try:
        seeds = parse_seeds(args.seeds)
        if len(algos) < 2 - bool(args.keep) or not seeds or args.episodes < 1:
            raise ValueError("cross-play needs two scripts or more (--algos), a seed (--seeds) and --episodes >= 1")
        if reason := envs.unknown_id(args.env_id):  # before "train the rows first" for a typo
            raise ValueError(f"--env-id {reason}")
        if "/" in args.variant or args.variant in ("..", "."):
            raise ValueError(f"--variant {args.variant!r} names a folder of --runs: no '/' in it")
        paths = {(a, s): args.runs / args.env_id / label(a) / f"seed{s}" / "last.pt" for a in algos for s in seeds}
        if not args.keep:  # keeping needs no env, nor teams: a three-group task's checkpoints are kept too
            probe = {c: make(args.env_id, 1, 0, c, args.backend) for c in (False, True)}
            specs = {c: dict(e.groups) for c, e in probe.items()}
            for e in probe.values():
                e.close()
            teams = split_teams(args.teams, list(specs[False]))  # a one-team env is told so before a missing file
        if missing := [str(p) for p in paths.values() if not p.is_file()]:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ValueError(f"no checkpoint {missing[0]}{more}: train the rows first (results/run.py), or name "
                             f"--runs/--variant")  # fmt: skip
        if args.keep:
            for path in paths.values():
                copy = args.keep / path.relative_to(args.runs)
                copy_policy(str(path), str(copy))
                print(f"kept {copy}")
            return 0
        first = {a: read_checkpoint(str(paths[a, seeds[0]])) for a in algos}
        continuous = {a: bool(ckpt["args"].get("continuous_actions")) for a, ckpt in first.items()}
    except (ValueError, OSError, envs.EnvArgumentError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or RESULTS_DIR / args.env_id
    settings = dict(env_id=args.env_id, seeds=seeds, teams=[list(t) for t in teams], episodes=args.episodes,
                    backend=args.backend)  # fmt: skip
    digests = {f"{a}/seed{s}": digest(p) for (a, s), p in paths.items()}
    earlier, launches = ({}, []) if args.fresh else earlier_pairs(out / "crossplay.json", settings, digests)
    start, cells, per_seed, left_out, commit, pair_commits = time.time(), {}, {}, [], git_commit(), {}
    for a in algos:
        for b in algos:
            mixed = continuous[a] or continuous[b]
            runs, pair_commits[f"{a} vs {b}"] = earlier.get(f"{a} vs {b}", ([], commit))
            for s in seeds if not runs else []:  # a pair of unchanged checkpoints keeps its returns
                try:
                    actors = team_actors(paths[a, s], args.env_id, teams[0], specs, mixed)
                    actors |= team_actors(paths[b, s], args.env_id, teams[1], specs, mixed)
                except Unmappable as e:
                    left_out.append(f"{a} vs {b} left out: {e}")
                    print(left_out[-1], flush=True)
                    break
                except ValueError as e:
                    print(f"error: {e}", file=sys.stderr)
                    return 2
                runs.append(play(args.env_id, actors, mixed, args.episodes, args.backend))
            per_seed[f"{a} vs {b}"] = runs
            cells[a, b] = seed_mean(runs)
            if not runs:
                continue
            shown = ", ".join(f"{g} {v:.2f}" for g, v in cells[a, b].items())
            print(f"{a} ({'+'.join(teams[0])}) vs {b} ({'+'.join(teams[1])}): {shown}", flush=True)
    rows = args.runs.parent / args.env_id  # results/runs -> results/<env>/<label>.json
    same = args.backend == "pettingzoo" and args.episodes == FINAL_EPISODES  # the rows' own episodes: exact
    checks = [c + ("" if same else " (other episodes: sampling noise)") for a in algos
              if (c := check_diagonal(rows, label(a), cells[a, a], seeds))]  # fmt: skip
    command = "python results/crossplay.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    record = dict(settings, commit=commit, command=command, algos=algos, variant=args.variant, continuous=continuous,
                  seconds=round(time.time() - start, 1), per_seed=per_seed, left_out=left_out, digests=digests,
                  pair_commits=pair_commits)  # fmt: skip
    played = sum(1 for pair, runs in per_seed.items() if runs and pair not in earlier)
    record["launches"] = launches + [dict(commit=commit, seconds=record["seconds"], pairs=played)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "crossplay.json").write_text(json.dumps(record) + "\n")
    report = tables(algos, teams, cells)
    space = ", ".join(f"`{a}` {'continuous' if c else 'discrete'}" for a, c in continuous.items())
    text = (f"# Cross-play on {args.env_id}\n\nCommand: `{command}` (commit {record['commit']}). Seeds {seeds} paired "
            f"s with s, {args.episodes} final episodes each, env backend {args.backend}; action spaces: {space} (a "
            f"mixed pair plays in the continuous env).\n\n{report}\n")  # fmt: skip
    notes, kept = checks + left_out, [c[:7] for pair, c in pair_commits.items() if c != commit and per_seed[pair]]
    if kept:
        notes.append(
            f"{len(kept)} of {len(pair_commits)} pairs kept from the runs of commit(s) "
            f"{', '.join(sorted(set(kept)))}: their checkpoints are unchanged (`--fresh` plays them again)"
        )
    text += "".join(f"* {c}\n" for c in notes)
    (out / "crossplay.md").write_text(text)
    print(report + "".join(f"{c}\n" for c in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
