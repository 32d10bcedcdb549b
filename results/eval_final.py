"""Evaluate every published seed's final policy (``last.pt``) on many fresh episodes.

The protocol number of a result (the mean of a seed's last 10 evaluations) comes from evaluations that
replay the same ``--eval-episodes`` (10) episodes each time: every evaluation of a seed seeds its envs with
``seed + 10000`` (env i: seed + 10000 + i). A seed's number therefore carries the luck of its 10 start
configurations, which the last-10 average cannot remove (it repeats them), and seeds 0-4 share most of theirs
(14 distinct episodes between them), so the luck does not average out over seeds either.

This script measures each seed's final policy once more, greedily, on ``--episodes`` episodes (default 1000,
env i seeded with 10000 + i: the same episodes for every algorithm and seed, so rows compare on common
ground), through the script's own ``--eval-checkpoint`` on the standard env, and writes
``results/final_policies.json``; make_readme shows it beside the protocol number.

    python results/eval_final.py                                    # every result whose runs are here
    python results/eval_final.py --envs simple_spread_v3 --algos maddpg,iddpg --episodes 1000

A seed is evaluated only when its run directory still holds the run the result file describes (same
command and commit in run.json): a newer sweep into the same directory is not mistaken for it. Results of
evaluation protocol v2 are skipped: each of their runs made this measurement itself at its end (final_eval.json).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect import FINAL_EVAL_NAME, RECORD_NAME, read_json, result_paths, run_dir_for, sample_std  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = RESULTS_DIR.parent
OUTPUT_NAME = "final_policies.json"
EVAL_SEED = 0  # the scripts evaluate on seed + 10000: env i of every evaluation here is seeded 10000 + i
# what every script's --eval-checkpoint prints (algos/*.py, tests/fake_algos/_fake.py)
LINE = re.compile(r"episodic return (\S+) ± (\S+) over (\d+) greedy episodes(?:; per group (\{.*\}))?")
# flags of the training run an evaluation must not take: with a value, and switches (no W&B run, no video)
DROPPED = {"--seed", "--total-timesteps", "--run-dir", "--eval-episodes", "--eval-interval", "--resume"}
DROPPED_SWITCHES = {"--track", "--capture-video"}


def eval_command(command: str, checkpoint: Path, episodes: int) -> list[str]:
    """The training command turned into a greedy evaluation of `checkpoint` (same script, env and network flags)."""
    argv, kept = shlex.split(command), []
    i = 2  # "python algos/<name>.py"
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in DROPPED_SWITCHES:
            i += 1
            continue
        if name in DROPPED:
            i += 1 if "=" in argv[i] else 2
            continue
        kept.append(argv[i])
        i += 1
    if checkpoint.is_relative_to(REPO_ROOT):
        checkpoint = checkpoint.relative_to(REPO_ROOT)
    flags = ["--eval-checkpoint", str(checkpoint), "--eval-episodes", str(episodes), "--seed", str(EVAL_SEED)]
    return [sys.executable, argv[1], *kept, *flags]


def parse_line(stdout: str) -> dict:
    """mean, std, episodes (and per group, when the script prints it) from an --eval-checkpoint run's output."""
    match = LINE.search(stdout)
    if match is None:
        raise ValueError(f"no 'episodic return ... greedy episodes' line in: {stdout.strip()[-300:]!r}")
    mean, std, n, groups = match.groups()
    parsed = {"mean": float(mean), "std": float(std), "episodes": int(n)}  # printed with 2 decimals
    if groups:
        parsed["per_group"] = ast.literal_eval(groups)
        if len(parsed["per_group"]) == 1:  # one group: its mean is the mean over agents, at full precision
            parsed["mean"] = float(next(iter(parsed["per_group"].values())))
    return parsed


def evaluate_seed(out: Path, result: dict, entry: dict, episodes: int) -> dict:
    """One seed's final policy on `episodes` fresh episodes, or {"error": why} when it cannot be evaluated."""
    run_dir = run_dir_for(out, result["env_id"], result["algo"], entry["seed"])
    record = read_json(run_dir / RECORD_NAME)
    if record is None:
        return {"error": f"{run_dir / RECORD_NAME} is missing: the runs of this result are not on this machine"}
    if record.get("command") != entry["command"] or record.get("commit", entry["commit"]) != entry["commit"]:
        return {"error": f"{run_dir} no longer holds the run of this result (rerun its sweep)"}
    checkpoint = run_dir / "last.pt"
    if not checkpoint.is_file():
        return {"error": f"{checkpoint} does not exist"}
    argv = eval_command(entry["command"], checkpoint, episodes)
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"}
    try:
        return parse_line(proc.stdout) | {"command": shlex.join(["python", *argv[1:]])}
    except ValueError as exc:
        return {"error": str(exc)}


def evaluate_result(out: Path, result: dict, episodes: int) -> dict:
    """Every seed of one result file, and the mean ± std over the seeds that could be evaluated."""
    per_seed = []
    for entry in result["per_seed"]:
        start = time.time()
        row = {"seed": entry["seed"], "command_trained": entry["command"], "commit": entry["commit"]}
        row |= evaluate_seed(out, result, entry, episodes)
        per_seed.append(row)
        status = row.get("error") or f"{row['mean']:.2f} ± {row['std']:.2f} over {row['episodes']} episodes"
        print(f"{result['env_id']} {result['algo']} seed {entry['seed']}: {status} ({time.time() - start:.0f} s)")
    means = [row["mean"] for row in per_seed if "mean" in row]
    summary = {"n": len(means), "mean": float(np.mean(means)), "std": sample_std(np.array(means))} if means else None
    return {"episodes": episodes, "per_seed": per_seed, "summary": summary}


def matches(entry: dict | None, result: dict) -> bool:
    """True when a stored evaluation is of this result's runs (each seed it measured has the same command and
    commit in the result); it may lack seeds that could not be evaluated (its summary says how many it has)."""
    if not entry or not entry.get("summary"):
        return False
    evaluated = {(r["seed"], r["command_trained"], r["commit"]) for r in entry["per_seed"] if "mean" in r}
    return evaluated <= {(r["seed"], r["command"], r["commit"]) for r in result["per_seed"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root (default: results/)")
    parser.add_argument("--envs", default="", help="comma-separated env ids (default: all)")
    parser.add_argument("--algos", default="", help="comma-separated result labels, e.g. maddpg,maddpg-tf128")
    parser.add_argument("--episodes", type=int, default=1000, help="greedy episodes per seed (default 1000)")
    parser.add_argument("--force", action="store_true", help="evaluate again results already evaluated")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {args.episodes}")
    wanted_envs, wanted_algos = set(filter(None, args.envs.split(","))), set(filter(None, args.algos.split(",")))
    path = args.out / OUTPUT_NAME
    stored = read_json(path) or {}
    failed = False
    for result_path in result_paths(args.out):
        result = json.loads(result_path.read_text())
        if result["env_id"] not in (wanted_envs or {result["env_id"]}):
            continue
        if result["algo"] not in (wanted_algos or {result["algo"]}):
            continue
        key = f"{result['env_id']}/{result['algo']}"
        if result.get("evaluation_protocol") == "v2":
            print(f"{key}: protocol v2, its runs measured their final policies themselves ({FINAL_EVAL_NAME})")
            continue
        done = matches(stored.get(key), result) and stored[key]["summary"]["n"] == len(result["per_seed"])
        if not args.force and done and stored[key]["episodes"] == args.episodes:
            print(f"{key}: already evaluated on {args.episodes} episodes (--force to redo)")
            continue
        entry = evaluate_result(args.out, result, args.episodes)
        failed |= entry["summary"] is None or entry["summary"]["n"] < len(result["per_seed"])
        if entry["summary"] is not None:  # keep an older complete evaluation rather than an empty one
            stored[key] = entry
            path.write_text(json.dumps(dict(sorted(stored.items())), indent=1) + "\n")
    print(f"wrote {path}" if path.exists() else "nothing evaluated")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
