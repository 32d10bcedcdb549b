"""Collect finished runs into one JSON per (env, algorithm): ``results/<env_id>/<algo>.json``.

A sweep (``results/run.py``) leaves one directory per run::

    <out>/runs/<env_id>/<algo>/seed<S>/
        run.json                  the runner's record: command, status, times, commit, hardware, versions
        run.log                   the script's stdout and stderr
        config.json               the resolved Args, written by the script
        events.out.tfevents.*     TensorBoard scalars keyed by global_step, written by the script
        final_eval.json           protocol v2: the final policy on the fixed 1000 episodes (runtime/evaluation.py)
        kept_evals.json           optional: earlier saves of the seed on the same episodes (epymarl_peer --keep-every)
        DONE                      written by the script on success

This module reads those directories (TensorBoard events through tensorboard's EventAccumulator),
reduces every seed to a few numbers, aggregates across seeds and writes the result file. The
statistics are defined once, in ``PROTOCOL``, and copied into every result file so that a reader
of the JSON needs nothing else. ``result_errors`` / ``check_result`` validate a result file
against ``RESULT_SCHEMA``; the tests and ``make_readme.py`` use them.

Usage (re-collect every finished run under a results root, without running anything)::

    python results/collect.py [--out results] [--envs simple_spread_v3] [--algos mappo,ippo]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = RESULTS_DIR.parent

# Files of a run directory.
RECORD_NAME = "run.json"
LOG_NAME = "run.log"
CONFIG_NAME = "config.json"
FINAL_EVAL_NAME = "final_eval.json"
KEPT_EVALS_NAME = "kept_evals.json"
DONE_NAME = "DONE"

# Logging keys (STYLE.md, "Logging keys"); x-axis is global_step.
EVAL_TAG = "eval/episodic_return"
SPS_TAG = "charts/SPS"

SCHEMA_VERSION = 1
LAST_N_EVALS = 10
CURVE_POINTS = 50
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95

REWARD_CONVENTION = (
    "episodic return = mean over agents of each agent's undiscounted episode return, "
    "greedy evaluation on the standard mpe2 env (for non-MPE ids: the standard, unmodified env)"
)

PROTOCOL = {
    "final_eval_return": (
        f"the mean of the last {LAST_N_EVALS} evaluations a seed logged as '{EVAL_TAG}' (all of them when "
        "fewer were logged); final_eval_return_std is their standard deviation (ddof=0)"
    ),
    "best_eval_return": "the highest single evaluation of a seed",
    "mean_std": "mean and sample standard deviation over seeds (ddof=1; 0 with one seed)",
    "iqm": (
        "interquartile mean over seeds: drop the floor(n/4) lowest and floor(n/4) highest, average the rest "
        "(scipy.stats.trim_mean(x, 0.25), as in rliable); with fewer than 4 seeds nothing is dropped and "
        "the IQM equals the mean"
    ),
    "ci95": (
        f"percentile bootstrap over seeds: {BOOTSTRAP_RESAMPLES} resamples of the seeds with replacement "
        f"(numpy.random.default_rng({BOOTSTRAP_SEED})), 2.5th and 97.5th percentiles of the statistic"
    ),
    "curve": (
        f"{CURVE_POINTS} steps evenly spaced from 0 to total_timesteps (rounded to integers); per seed, "
        "linear interpolation between evaluations, null before the first evaluation, the last "
        "evaluation held after it; over seeds: mean, sample std and the bootstrap 95% CI of the mean "
        "of the seeds that have a value at that step"
    ),
    "final_policy": (
        "evaluation protocol v2, the headline: a seed's final policy played greedily on a fixed set of episodes "
        "(env i seeded 10000 + i, 1000 episodes), the same for every algorithm and seed, written by the script "
        f"to {FINAL_EVAL_NAME}; per seed the mean and std over those episodes, across seeds the mean_std/iqm/ci95 "
        "statistics of the per-seed means. A result is 'v2' when every seed has it; 'v1' results (made before) "
        "have periodic evaluations that replayed the same episodes, and no final_policy"
    ),
    "kept_policies": (
        f"optional, per seed: earlier saves of the seed played like the final policy, from its {KEPT_EVALS_NAME} "
        "(results/epymarl_peer.py --keep-every): the seed at shorter budgets, one run; the row stays the final policy's"
    ),
    "sps": f"the last '{SPS_TAG}' value a seed logged (env steps per second)",
    "wall_time_s": "wall-clock seconds of a seed's script process, measured by results/run.py",
}


class CollectError(Exception):
    """A run directory that cannot be turned into numbers (no events, no evaluations, ...)."""


# ---------------------------------------------------------------------------------------------------
# Run directories
# ---------------------------------------------------------------------------------------------------


NOT_RESULTS = ("tournament.json", "crossplay.json")  # written beside the result files, by tournament.py, crossplay.py
PER_RUN_KEYS = {"seed", "run_dir", "resume", "eval_checkpoint"}  # differ between seeds by design
# how a run ran, not what it learned: seeds of one row may differ in these (a seed run on another machine, with --cuda)
HOW_IT_RAN = PER_RUN_KEYS | {"cuda", "torch_threads", "track", "wandb_project_name", "wandb_entity", "capture_video"}
HOW_IT_RAN |= {"save_model", "save_buffer", "checkpoint_minutes", "vector"}
FLAGS = ("config", "config_per_seed")  # the keys of a result that hold the runs' flags, never rounded


def git_commit() -> str:
    """HEAD of the repository, "-dirty" when code outside results/ differs from it; "unknown" without git.

    Dirty means a modified tracked file or an untracked, non-ignored file anywhere but results/.
    """
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":(exclude)results"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if status else "")


def result_paths(out: Path) -> list[Path]:
    """The result files under a results root, `<out>/<env_id>/<algo>.json`, sorted."""
    return [
        path
        for path in sorted(Path(out).glob("*/*.json"))
        if path.parent.name not in ("runs", "speed") and path.name not in NOT_RESULTS
    ]


def run_dir_for(out: Path, env_id: str, algo: str, seed: int) -> Path:
    """The directory of one run inside a results root."""
    return Path(out) / "runs" / env_id / algo / f"seed{seed}"


def env_kwargs_of(result: dict) -> dict:
    """The --env-kwargs a result's runs trained and were evaluated with, less those at the env's own default (an MPE
    id's, e.g. simple_spread_v3's N = 3): {} for the standard env."""
    from envs.mpe.scenarios import SCENARIOS

    kwargs = json.loads(result["config"].get("env_kwargs") or "{}")
    defaults = SCENARIOS[result["env_id"]].defaults() if result["env_id"] in SCENARIOS else {}
    return {k: v for k, v in kwargs.items() if k not in defaults or defaults[k] != v}


def read_json(path: Path) -> dict | None:
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_config(run_dir: Path) -> dict:
    """A run's config.json (the resolved flags its script wrote); a CollectError naming the file and its problem when
    it is missing or unreadable: no other seed's config may stand in for it."""
    path = Path(run_dir) / CONFIG_NAME
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise CollectError(f"{path}: missing, so the run's flags are unknown") from None
    except (OSError, ValueError) as exc:
        raise CollectError(f"{path}: unreadable ({exc}), so the run's flags are unknown") from None
    if not isinstance(config, dict):
        raise CollectError(f"{path}: a JSON {type(config).__name__}, not an object of flags")
    return config


def check_seeds(run_dirs: dict[int, Path], configs: dict[int, dict]) -> None:
    """Each run directory trained the seed its name says, and no two the same one (a copied directory would count one
    run twice); a CollectError naming the directories otherwise."""
    trained_by: dict[int, Path] = {}
    for seed, run_dir in sorted(run_dirs.items()):
        trained = configs[seed].get("seed")
        if trained is None:
            continue
        if trained in trained_by:
            raise CollectError(
                f"{trained_by[trained]} and {run_dir} both trained with --seed {trained} ({CONFIG_NAME}): one run "
                "twice (a copied directory?), not two seeds; remove one"
            )
        trained_by[trained] = run_dir
        if trained != seed:
            raise CollectError(f"{run_dir} trained with --seed {trained} ({CONFIG_NAME}), not the seed {seed} it names")


def check_one_configuration(configs: dict[int, dict], varying: dict) -> None:
    """One row is one configuration: a CollectError naming the flags whose values differ between seeds (a sweep that
    added seeds after a default changed would otherwise average two configurations under one label). A flag that only
    some seeds recorded (added to the script between them) differs too: what the others ran with is not known here."""
    differing = [key for key in varying if key not in HOW_IT_RAN]
    if differing:
        said = "; ".join(
            f"{key}: "
            + ", ".join(
                f"seed {seed} {json.dumps(cfg[key]) if key in cfg else 'absent'}" for seed, cfg in configs.items()
            )
            for key in differing
        )
        raise CollectError(
            f"its seeds ran different configurations ({said}): rerun the odd seeds with the others' "
            "flags, or sweep them under another --variant"
        )


def is_finished(run_dir: Path) -> bool:
    """True when the run succeeded: the runner recorded status "ok", or, without a record, a DONE file."""
    record = read_json(Path(run_dir) / RECORD_NAME)
    if record is not None and "status" in record:
        return record["status"] == "ok"
    return (Path(run_dir) / DONE_NAME).exists()


# ---------------------------------------------------------------------------------------------------
# TensorBoard events
# ---------------------------------------------------------------------------------------------------


def read_scalars(run_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """All scalars under a run directory: tag -> (steps int64, values float64, wall_times float64).

    Every directory below ``run_dir`` that holds event files is read with tensorboard's
    EventAccumulator (no sampling). Old-style ``simple_value`` scalars (torch's SummaryWriter) and
    new-style scalar tensors are both read. Points are sorted by step; when a step was logged more
    than once the last write wins.
    """
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    points: dict[str, list[tuple[int, float, float]]] = {}
    event_dirs = sorted({p.parent for p in Path(run_dir).rglob("*tfevents*") if p.is_file()})
    for event_dir in event_dirs:
        acc = ea.EventAccumulator(str(event_dir), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in tags.get(ea.SCALARS, []):
            points.setdefault(tag, []).extend((e.step, e.value, e.wall_time) for e in acc.Scalars(tag))
        for tag in tags.get(ea.TENSORS, []):
            for e in acc.Tensors(tag):
                value = tensor_util.make_ndarray(e.tensor_proto)
                if value.size == 1 and np.issubdtype(value.dtype, np.number):
                    points.setdefault(tag, []).append((e.step, float(value.reshape(())), e.wall_time))
    scalars = {}
    for tag, rows in points.items():
        by_step = {}
        for step, value, wall_time in sorted(rows, key=lambda r: r[2]):  # later writes win
            by_step[int(step)] = (float(value), float(wall_time))
        steps = np.array(sorted(by_step), dtype=np.int64)
        values = np.array([by_step[s][0] for s in steps], dtype=np.float64)
        wall_times = np.array([by_step[s][1] for s in steps], dtype=np.float64)
        scalars[tag] = (steps, values, wall_times)
    return scalars


# ---------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean along an axis: drop floor(n/4) from each end of the sorted values, average the rest.

    Equal to ``scipy.stats.trim_mean(values, 0.25, axis)``; with n < 4 nothing is dropped.
    """
    values = np.sort(np.asarray(values, dtype=np.float64), axis=axis)
    n = values.shape[axis]
    k = n // 4
    return np.take(values, np.arange(k, n - k), axis=axis).mean(axis=axis)


def percentile_interval(stats: np.ndarray, level: float = CI_LEVEL) -> tuple[float, float]:
    """The central `level` interval of bootstrap statistics: their (1 - level) / 2 and (1 + level) / 2 percentiles."""
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(stats, [tail, 100.0 - tail])
    return float(low), float(high)


def bootstrap_ci(
    values: Sequence[float],
    statistic: Callable[..., np.ndarray],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``statistic(x, axis=-1)`` over resampled seeds."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(resamples, x.size))]  # (resamples, n)
    return percentile_interval(statistic(samples, axis=-1), level)


def difference_ci(
    a: Sequence[float],
    b: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of mean(a) - mean(b), the seeds of each resampled apart (two rows
    trained separately: their seeds are not pairs)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.size == 0 or y.size == 0:
        raise ValueError("difference_ci needs at least one value on each side")
    rng = np.random.default_rng(seed)
    means_a = x[rng.integers(0, x.size, (resamples, x.size))].mean(-1)
    means_b = y[rng.integers(0, y.size, (resamples, y.size))].mean(-1)
    return percentile_interval(means_a - means_b, level)


def sample_std(x: np.ndarray) -> float:
    """Sample standard deviation (ddof=1), 0 for a single value."""
    return float(np.std(x, ddof=1)) if len(x) > 1 else 0.0


def summarize(values: Iterable[float | None]) -> dict | None:
    """Across-seed summary of one per-seed number (None entries are skipped); None when nothing is left."""
    x = np.array([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return None
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "std": sample_std(x),
        "min": float(x.min()),
        "max": float(x.max()),
        "mean_ci95": list(bootstrap_ci(x, np.mean)),
        "iqm": float(iqm(x)),
        "iqm_ci95": list(bootstrap_ci(x, iqm)),
    }


def curve_grid(total_timesteps: int, points: int = CURVE_POINTS) -> np.ndarray:
    """The fixed step grid of a learning curve: ``points`` integers from 0 to total_timesteps."""
    return np.linspace(0, total_timesteps, points).round().astype(np.int64)


def curve_on_grid(steps: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """One seed's evaluations on the grid: interpolated, NaN before the first, held after the last."""
    y = np.interp(grid, steps, values)
    y[grid < steps[0]] = np.nan
    return y


def curve_summary(per_seed: np.ndarray) -> dict[str, list[float | None]]:
    """Mean, std and bootstrap CI of the mean across seeds at each grid step; per_seed is (seeds, points)."""
    out = {"mean": [], "std": [], "ci95_low": [], "ci95_high": []}
    for column in per_seed.T:
        x = column[~np.isnan(column)]
        if x.size == 0:
            for key in out:
                out[key].append(None)
            continue
        low, high = bootstrap_ci(x, np.mean)
        out["mean"].append(float(x.mean()))
        out["std"].append(sample_std(x))
        out["ci95_low"].append(low)
        out["ci95_high"].append(high)
    return out


# ---------------------------------------------------------------------------------------------------
# One seed, one result file
# ---------------------------------------------------------------------------------------------------


def seed_metrics(run_dir: Path) -> tuple[dict, tuple[np.ndarray, np.ndarray]]:
    """The per-seed numbers of one finished run and its evaluation curve (steps, values)."""
    scalars = read_scalars(run_dir)
    if EVAL_TAG not in scalars:
        found = ", ".join(sorted(scalars)) or "no scalars at all"
        raise CollectError(f"{run_dir}: no '{EVAL_TAG}' scalars in the TensorBoard events ({found})")
    steps, values, wall_times = scalars[EVAL_TAG]
    last = values[-LAST_N_EVALS:]
    best = int(np.argmax(values))
    by_group = {
        tag[len(EVAL_TAG) + 1 :]: float(v[-LAST_N_EVALS:].mean())
        for tag, (_, v, _) in sorted(scalars.items())
        if tag.startswith(EVAL_TAG + "/")
    }
    record = read_json(Path(run_dir) / RECORD_NAME) or {}
    wall_time = record.get("wall_time_s")
    if wall_time is None:  # no runner record: span of the event timestamps
        stamps = np.concatenate([w for _, _, w in scalars.values()])
        wall_time = float(stamps.max() - stamps.min())
    sps = float(scalars[SPS_TAG][1][-1]) if SPS_TAG in scalars else None
    metrics = {
        "final_eval_return": float(last.mean()),
        "final_eval_return_std": float(last.std()),
        "best_eval_return": float(values[best]),
        "best_eval_step": int(steps[best]),
        "num_evals": int(values.size),
        "last_eval_step": int(steps[-1]),
        "final_eval_return_by_group": by_group,
        "evaluations": {"steps": steps.tolist(), "returns": values.tolist()},  # EPyMARL's metrics need them
        "wall_time_s": float(wall_time),
        "sps": sps,
    }
    if (Path(run_dir) / FINAL_EVAL_NAME).exists():  # protocol v2: the final policy on the fixed episode set
        metrics["final_policy"] = read_final_eval(Path(run_dir) / FINAL_EVAL_NAME)
    if (Path(run_dir) / KEPT_EVALS_NAME).exists():
        metrics["kept_policies"] = read_kept_evals(Path(run_dir) / KEPT_EVALS_NAME)
    return metrics, (steps, values)


def read_kept_evals(path: Path) -> dict:
    """A run's kept_evals.json reduced to what a result keeps (episodes, and per kept save its step, mean and std);
    one that is not a protocol v2 evaluation of numbered saves is an error, as read_final_eval's."""
    kept = read_json(path)
    evaluations = kept.get("evaluations") if isinstance(kept, dict) else None

    def a_save(e) -> bool:  # {"global_step": int, "mean": number, "std": number}
        if not (isinstance(e, dict) and isinstance(e.get("global_step"), int)):
            return False
        return all(isinstance(e.get(k), (int, float)) for k in ("mean", "std"))

    if not (isinstance(kept, dict) and kept.get("protocol") == "v2" and isinstance(kept.get("episodes"), int)
            and isinstance(evaluations, list) and all(a_save(e) for e in evaluations)):  # fmt: skip
        raise CollectError(f"{path}: not a protocol v2 evaluation of kept saves (protocol, episodes, and per save "
                           f"global_step, mean and std)")  # fmt: skip
    return {"episodes": kept["episodes"],
            "evaluations": [{k: e[k] for k in ("global_step", "mean", "std")} for e in evaluations]}  # fmt: skip


def read_final_eval(path: Path) -> dict:
    """A run's final_eval.json reduced to what a result keeps (mean, std, episodes, protocol, per_group); a file that
    is not a v2 evaluation (unreadable, another protocol, a missing number, returns that disagree) is an error."""
    final = read_json(path)
    if not isinstance(final, dict):
        raise CollectError(f"{path}: not a JSON object")
    number = (int, float)
    problems = [f"'{k}' is not a number" for k in ("mean", "std") if not isinstance(final.get(k), number)]
    if final.get("protocol") != "v2":
        problems.append(f"protocol {final.get('protocol')!r}, expected 'v2'")
    episodes = final.get("episodes")
    if not isinstance(episodes, int) or episodes < 1:
        problems.append(f"episodes {episodes!r}")
    elif len(final.get("returns") or []) != episodes:
        problems.append(f"{len(final.get('returns') or [])} returns for {episodes} episodes")
    if not isinstance(final.get("per_group", {}), dict):
        problems.append("per_group is not an object")
    if problems:
        raise CollectError(f"{path}: not a protocol v2 final evaluation: {'; '.join(problems)}")
    return {"mean": final["mean"], "std": final["std"], "episodes": episodes, "protocol": "v2",
            "per_group": final.get("per_group", {})}  # fmt: skip


def _common_and_varying(configs: dict[int, dict | None]) -> tuple[dict, dict]:
    """Split per-seed configs into the entries all seeds share and, per differing key, seed -> value."""
    present = {seed: cfg for seed, cfg in configs.items() if cfg is not None}
    keys = []
    for cfg in present.values():
        keys.extend(k for k in cfg if k not in keys)
    common, varying = {}, {}
    for key in keys:
        values = {seed: cfg.get(key) for seed, cfg in present.items()}
        distinct = {json.dumps(v, sort_keys=True) for v in values.values()}
        if len(distinct) == 1 and all(key in cfg for cfg in present.values()):
            common[key] = next(iter(values.values()))
        else:
            varying[key] = {str(seed): value for seed, value in values.items()}
    return common, varying


def _grouped(items: dict[int, dict | None]) -> list[dict]:
    """Distinct dicts (hardware, versions) with the seeds that share each, in first-seen order."""
    groups: list[dict] = []
    for seed, item in items.items():
        if item is None:
            continue
        for group in groups:
            if {k: v for k, v in group.items() if k != "seeds"} == item:
                group["seeds"].append(seed)
                break
        else:
            groups.append({**item, "seeds": [seed]})
    return groups


def _unique(values: Iterable[str | None]) -> list[str]:
    """Distinct non-empty strings in first-seen order."""
    out: list[str] = []
    for v in values:
        if v and v not in out:
            out.append(v)
    return out


def _relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when it lies inside it, else absolute (POSIX separators)."""
    path = Path(path).resolve()
    try:
        return path.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def build_result(
    env_id: str, algo: str, run_dirs: dict[int, Path], out: Path, total_timesteps: int | None = None
) -> dict:
    """The result document of one (env, algorithm) from its finished seeds' run directories."""
    if not run_dirs:
        raise CollectError(f"{env_id}/{algo}: no finished runs to collect")
    seeds = sorted(run_dirs)
    records = {s: read_json(run_dirs[s] / RECORD_NAME) or {} for s in seeds}
    configs = {s: read_config(run_dirs[s]) for s in seeds}
    check_seeds(run_dirs, configs)
    metrics, curves = {}, {}
    for s in seeds:
        metrics[s], curves[s] = seed_metrics(run_dirs[s])

    if total_timesteps is None:
        budgets = [records[s].get("total_timesteps") or (configs[s] or {}).get("total_timesteps") for s in seeds]
        budgets = [int(b) for b in budgets if b is not None]
        total_timesteps = max(budgets) if budgets else max(m["last_eval_step"] for m in metrics.values())
    grid = curve_grid(total_timesteps)
    per_seed_curves = np.stack([curve_on_grid(*curves[s], grid) for s in seeds])  # (seeds, points)

    per_seed = []
    for s in seeds:
        log = run_dirs[s] / LOG_NAME
        per_seed.append(
            {
                "seed": s,
                "command": records[s].get("command"),
                "commit": records[s].get("commit"),
                **metrics[s],
                "log": _relative(log, out) if log.exists() else None,
            }
        )
    common, varying = _common_and_varying(configs)
    check_one_configuration(configs, varying)
    commits = _unique(records[s].get("commit") for s in seeds)
    ends = sorted(records[s]["end"] for s in seeds if records[s].get("end"))
    summary_keys = ["final_eval_return", "best_eval_return", "wall_time_s", "sps"]
    v2 = all("final_policy" in m for m in metrics.values())
    result = {
        "schema_version": SCHEMA_VERSION,
        "algo": algo,
        "env_id": env_id,
        "commit": ", ".join(commits) if commits else "unknown",
        "date": ends[-1] if ends else None,
        "sweep_commands": _unique(records[s].get("sweep_command") for s in seeds),
        "commands": [r["command"] for r in per_seed if r["command"]],
        "config": common,
        "config_per_seed": varying,
        "seeds": seeds,
        "total_timesteps": int(total_timesteps),
        "reward_convention": REWARD_CONVENTION,
        "protocol": dict(PROTOCOL),
        "evaluation_protocol": "v2" if v2 else "v1",
        "per_seed": per_seed,
        "summary": {key: summarize(m[key] for m in metrics.values()) for key in summary_keys}
        | ({"final_policy": summarize(m["final_policy"]["mean"] for m in metrics.values())} if v2 else {}),
        "curve": {
            "metric": EVAL_TAG,
            "steps": grid.tolist(),
            "per_seed": {str(s): row.tolist() for s, row in zip(seeds, per_seed_curves, strict=True)},
            **curve_summary(per_seed_curves),
        },
        "hardware": _grouped({s: records[s].get("hardware") for s in seeds}),
        "versions": _grouped({s: records[s].get("versions") for s in seeds}),
    }
    # the measurements to 6 decimals; the flags as the runs recorded them (rounded, coma's --actor-adam-eps 1e-8
    # was 0.0, and make_readme called the row stale)
    return {key: clean_json(value, decimals=None if key in FLAGS else 6) for key, value in result.items()}


def clean_json(obj, decimals: int | None = 6):
    """Plain JSON values: numpy scalars to Python, non-finite floats to None, floats rounded to `decimals` (None:
    kept as they are)."""
    if isinstance(obj, dict):
        return {str(k): clean_json(v, decimals) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v, decimals) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        if not math.isfinite(obj):
            return None
        return float(obj) if decimals is None else round(float(obj), decimals)
    return obj


def dump_json(obj, indent: int = 0) -> str:
    """JSON indented like ``json.dumps(indent=2)``, except that lists of numbers stay on one line (curves)."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(str(k))}: {dump_json(v, indent + 1).strip()}" for k, v in obj.items()]
        text = "{\n" + ",\n".join(items) + f"\n{pad}}}"
    elif isinstance(obj, list) and any(isinstance(v, (dict, list, str)) for v in obj):
        text = "[\n" + ",\n".join(inner + dump_json(v, indent + 1).strip() for v in obj) + f"\n{pad}]"
    else:
        text = json.dumps(obj, allow_nan=False, ensure_ascii=False)
    return text + "\n" if indent == 0 else text


def write_result(result: dict, out: Path) -> Path:
    """Validate and write a result document to ``<out>/<env_id>/<algo>.json`` (whole: `write_whole`): returns the
    path."""
    check_result(result)
    path = Path(out) / result["env_id"] / f"{result['algo']}.json"
    write_whole(path, dump_json(result))
    return path


def write_whole(path: Path, data: str | bytes) -> None:
    """Write `path` whole or not at all: a sweep writes its rows and README while it runs and may be stopped at any
    moment. The temporary file is the writer's own: sweeps sharing the same runs end together and write the same
    files at once (a run's own files have one writer, the run: runtime.checkpoint.write_whole, which this module
    does not import, to stay free of torch)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".tmp", prefix=f"{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)  # mkstemp's file is the owner's alone; what we publish is for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------------


class Optional_:
    """Schema marker: the value may be null."""

    def __init__(self, spec):
        self.spec = spec


class AnyDict:
    """Schema marker: an object whose keys are free and whose values all follow ``spec`` (None: anything)."""

    def __init__(self, spec=None):
        self.spec = spec


NUMBER = (int, float)
OPT_NUMBER = Optional_(NUMBER)
STATS = Optional_(
    {
        "n": int,
        "mean": NUMBER,
        "std": NUMBER,
        "min": NUMBER,
        "max": NUMBER,
        "mean_ci95": [NUMBER],
        "iqm": NUMBER,
        "iqm_ci95": [NUMBER],
    }
)
RESULT_SCHEMA = {
    "schema_version": int,
    "algo": str,
    "env_id": str,
    "commit": str,
    "date": Optional_(str),
    "sweep_commands": [str],
    "commands": [str],
    "config": AnyDict(),
    "config_per_seed": AnyDict(AnyDict()),
    "seeds": [int],
    "total_timesteps": int,
    "reward_convention": str,
    "protocol": AnyDict(str),
    "per_seed": [
        {
            "seed": int,
            "command": Optional_(str),
            "commit": Optional_(str),
            "final_eval_return": NUMBER,
            "final_eval_return_std": NUMBER,
            "best_eval_return": NUMBER,
            "best_eval_step": int,
            "num_evals": int,
            "last_eval_step": int,
            "final_eval_return_by_group": AnyDict(NUMBER),
            "evaluations?": {"steps": [int], "returns": [NUMBER]},  # every periodic evaluation; older results lack it
            "wall_time_s": NUMBER,
            "sps": OPT_NUMBER,
            "log": Optional_(str),
            "final_policy?": {"mean": NUMBER, "std": NUMBER, "episodes": int, "protocol": str, "per_group": AnyDict()},
            "kept_policies?": {"episodes": int, "evaluations": [{"global_step": int, "mean": NUMBER, "std": NUMBER}]},
        }
    ],
    "evaluation_protocol?": str,
    "summary": {
        "final_eval_return": STATS,
        "best_eval_return": STATS,
        "wall_time_s": STATS,
        "sps": STATS,
        "final_policy?": STATS,
    },  # fmt: skip
    "curve": {
        "metric": str,
        "steps": [int],
        "per_seed": AnyDict([OPT_NUMBER]),
        "mean": [OPT_NUMBER],
        "std": [OPT_NUMBER],
        "ci95_low": [OPT_NUMBER],
        "ci95_high": [OPT_NUMBER],
    },
    "hardware": [AnyDict()],
    "versions": [AnyDict()],
}


def _type_errors(value, spec, where: str) -> list[str]:
    """Mismatches between a JSON value and a schema spec (type, dict of specs, [item spec], markers); a dict spec's
    key that ends in '?' is optional."""
    if isinstance(spec, Optional_):
        return [] if value is None else _type_errors(value, spec.spec, where)
    if isinstance(spec, AnyDict):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        if spec.spec is None:
            return []
        return [e for k, v in value.items() for e in _type_errors(v, spec.spec, f"{where}.{k}")]
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        specs = {k.rstrip("?"): v for k, v in spec.items()}  # a key ending in '?' may be absent
        errors = [f"{where}: missing key '{k}'" for k in spec if not k.endswith("?") and k not in value]
        errors += [f"{where}: unexpected key '{k}'" for k in value if k not in specs]
        for key in (k for k in specs if k in value):
            errors += _type_errors(value[key], specs[key], f"{where}.{key}")
        return errors
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [e for i, v in enumerate(value) for e in _type_errors(v, spec[0], f"{where}[{i}]")]
    types = spec if isinstance(spec, tuple) else (spec,)
    if isinstance(value, bool) or not isinstance(value, types):  # bool is an int, but never a number here
        names = "/".join(t.__name__ for t in types)
        return [f"{where}: expected {names}, got {type(value).__name__}"]
    return []


def result_errors(result: dict) -> list[str]:
    """Everything wrong with a result document: schema types, then consistency between its parts."""
    errors = _type_errors(result, RESULT_SCHEMA, "result")
    if errors:
        return errors
    if result["schema_version"] != SCHEMA_VERSION:
        errors.append(f"result.schema_version: {result['schema_version']} != {SCHEMA_VERSION}")
    seeds = result["seeds"]
    if not seeds or len(set(seeds)) != len(seeds):
        errors.append(f"result.seeds: must be non-empty and distinct, got {seeds}")
    if [r["seed"] for r in result["per_seed"]] != seeds:
        errors.append("result.per_seed: seeds differ from result.seeds")
    curve = result["curve"]
    n_points = len(curve["steps"])
    if curve["steps"] != sorted(curve["steps"]) or not curve["steps"]:
        errors.append("result.curve.steps: must be non-empty and increasing")
    if sorted(curve["per_seed"], key=int) != [str(s) for s in seeds]:
        errors.append("result.curve.per_seed: keys differ from result.seeds")
    for key in ["mean", "std", "ci95_low", "ci95_high"]:
        if len(curve[key]) != n_points:
            errors.append(f"result.curve.{key}: {len(curve[key])} points, steps has {n_points}")
    for seed, row in curve["per_seed"].items():
        if len(row) != n_points:
            errors.append(f"result.curve.per_seed.{seed}: {len(row)} points, steps has {n_points}")
    final = result["summary"]["final_eval_return"]
    if final is None or final["n"] != len(seeds):
        errors.append("result.summary.final_eval_return: must summarize every seed")
    for name, stats in result["summary"].items():
        if stats is None:
            continue
        for key in ["mean_ci95", "iqm_ci95"]:
            low_high = stats[key]
            if len(low_high) != 2 or low_high[0] > low_high[1]:
                errors.append(f"result.summary.{name}.{key}: expected [low, high], got {low_high}")
    return errors


def check_result(result: dict) -> None:
    """Raise ValueError listing every problem when ``result`` is not a valid result document."""
    errors = result_errors(result)
    if errors:
        raise ValueError("invalid result document:\n  " + "\n  ".join(errors))


# ---------------------------------------------------------------------------------------------------
# Collection of a sweep / of a whole results root
# ---------------------------------------------------------------------------------------------------


def collect(
    out: Path, groups: dict[tuple[str, str], list[int]], total_timesteps: int | None = None
) -> tuple[list[Path], list[str]]:
    """Write the result file of each (env_id, algo) from its finished seeds; returns (paths, errors)."""
    paths, errors = [], []
    for (env_id, algo), seeds in sorted(groups.items()):
        run_dirs = {s: run_dir_for(out, env_id, algo, s) for s in seeds}
        run_dirs = {s: d for s, d in run_dirs.items() if is_finished(d)}
        if not run_dirs:
            errors.append(f"{env_id}/{algo}: no finished seed, nothing collected")
            continue
        try:
            paths.append(write_result(build_result(env_id, algo, run_dirs, out, total_timesteps), out))
        except (CollectError, ValueError) as exc:
            errors.append(f"{env_id}/{algo}: {exc}")
    return paths, errors


def finished_runs(
    out: Path, envs: list[str] | None = None, algos: list[str] | None = None
) -> tuple[dict[tuple[str, str], list[int]], list[str]]:
    """Every finished run under ``<out>/runs``: ((env_id, algo) -> sorted seeds, a line per unfinished seed)."""
    groups: dict[tuple[str, str], list[int]] = {}
    unfinished = []
    for run_dir in sorted((Path(out) / "runs").glob("*/*/seed*")):
        env_id, algo, name = run_dir.parts[-3:]
        if not name[4:].isdigit() or (envs and env_id not in envs) or (algos and algo not in algos):
            continue
        if is_finished(run_dir):
            groups.setdefault((env_id, algo), []).append(int(name[4:]))
        else:
            record = read_json(run_dir / RECORD_NAME) or {}
            why = record.get("error") or record.get("status") or "no record and no DONE file"
            unfinished.append(f"{env_id}/{algo} seed {name[4:]} left out, not finished ({why}): {run_dir}")
    return {key: sorted(seeds) for key, seeds in groups.items()}, unfinished


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def main(argv: list[str] | None = None) -> int:
    """CLI: re-collect the finished runs under a results root."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root (default: results/)")
    parser.add_argument("--envs", type=_csv, default=None, help="comma-separated env ids (default: all)")
    parser.add_argument("--algos", type=_csv, default=None, help="comma-separated algorithms (default: all)")
    args = parser.parse_args(argv)
    groups, unfinished = finished_runs(args.out, args.envs, args.algos)
    for line in unfinished:
        print(line, file=sys.stderr)
    if not groups:
        runs = args.out / "runs"  # a typo in --envs: say so, and which envs are there
        asked = [f"--{k} {','.join(v)}" for k, v in (("envs", args.envs), ("algos", args.algos)) if v]
        there = sorted(p.name for p in runs.iterdir() if p.is_dir()) if args.envs and runs.is_dir() else []
        print(f"no finished runs{' of ' + ' and '.join(asked) if asked else ''} under {runs}"
              + (f" (the envs there: {', '.join(there)})" if there else ""), file=sys.stderr)  # fmt: skip
        return 1
    paths, errors = collect(args.out, groups)
    for path in paths:
        print(f"wrote {path}")
        if kwargs := env_kwargs_of(read_json(path)):
            print(
                f"note: {path.parent.name}/{path.stem} trained and was evaluated with --env-kwargs "
                f"'{json.dumps(kwargs)}': its returns are of that env, not the standard one",
                file=sys.stderr,
            )
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
