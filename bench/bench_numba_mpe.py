"""Speed of the Numba MPE backend (`envs.mpe`) against mpe2, per scenario, on one core.

    python bench/bench_numba_mpe.py               # writes results/speed/numba_mpe.md and numba_mpe.json
    python bench/bench_numba_mpe.py --validation  # writes results/speed/numba_mpe_validation.md: what the
                                                    # input checks of step() cost (step vs the unchecked _step)

For each of the nine scenarios (default kwargs, discrete actions, max_cycles 25 with resets):

* mpe2: its raw parallel env (`mpe2.<scenario>.parallel_env()`), one env, reset when its agents
  are gone. "with actions": every step samples each agent's action space (the usual random loop);
  "step only": the actions come from a pre-drawn table.
* ours: `envs.mpe.make_vec(scenario, num_envs=E)` at E = 1, 64 and 1024, auto-reset and episode
  statistics included. "with actions": numpy draws the (E, A) actions every step
  (`Generator.integers`); "step only": the actions come from a pre-drawn table.

env-steps/s counts one env advancing one step (ours: E per call), so mpe2 at 1 env compares
directly. Each figure is the best of `--repeats` timed rounds of about `--seconds` seconds (best,
not mean: the machine is shared and other load only ever slows a round down). The process is pinned
to one core and Numba runs single-threaded.
"""

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from host import cpu_name, out_file, positive  # noqa: E402

from envs.mpe import SCENARIOS, make_vec  # noqa: E402
from envs.mpe.mpe2_bridge import mpe2_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1, 64, 1024)
TARGET = ("simple_spread_v3", 1024, 240_000)  # the goal: >= 100x mpe2 on simple_spread at 1024 envs


def best_rate(run_round, seconds: float, repeats: int) -> float:
    """Best env-steps/s over `repeats` rounds; run_round(n) does n calls and returns env-steps made."""
    n = 1  # calibrate the number of calls per round to about `seconds`
    while True:
        start = time.perf_counter()
        run_round(n)
        elapsed = time.perf_counter() - start
        if elapsed > seconds / 4:
            break
        n *= 4
    n = max(1, int(n * seconds / elapsed))
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        steps = run_round(n)
        best = max(best, steps / (time.perf_counter() - start))
    return best


def bench_mpe2(name: str, seconds: float, repeats: int) -> dict:
    env = mpe2_module(name).parallel_env()
    env.reset(seed=0)
    agents = env.possible_agents
    spaces = {a: env.action_space(a) for a in agents}
    for k, a in enumerate(agents):
        spaces[a].seed(k)
    table = [{a: spaces[a].sample() for a in agents} for _ in range(256)]

    def sampled(n):
        for _ in range(n):
            env.step({a: spaces[a].sample() for a in agents})
            if not env.agents:
                env.reset()
        return n

    def pre_drawn(n):
        for t in range(n):
            env.step(table[t % 256])
            if not env.agents:
                env.reset()
        return n

    return {
        "with_actions": best_rate(sampled, seconds, repeats),
        "step_only": best_rate(pre_drawn, seconds, repeats),
    }


def bench_ours(name: str, num_envs: int, seconds: float, repeats: int) -> dict:
    env = make_vec(name, num_envs=num_envs, seed=0)
    env.reset()
    rng = np.random.default_rng(0)
    shapes = {g: (spec.action_dim, (num_envs, spec.n_agents)) for g, spec in env.groups.items()}
    table = [{g: rng.integers(0, n, shape) for g, (n, shape) in shapes.items()} for _ in range(16)]

    def sampled(n):
        for _ in range(n):
            env.step({g: rng.integers(0, k, shape) for g, (k, shape) in shapes.items()})
        return n * num_envs

    def pre_drawn(n):
        for t in range(n):
            env.step(table[t % 16])
        return n * num_envs

    return {
        "with_actions": best_rate(sampled, seconds, repeats),
        "step_only": best_rate(pre_drawn, seconds, repeats),
    }


def bench_validation(seconds: float, repeats: int) -> list[dict]:
    """Time step() (actions checked, envs.api.check_actions) against _step() (the same step unchecked) on the same
    pre-drawn actions, in alternating rounds, so both see the same machine; the best round of each is kept."""
    rows = []
    for continuous in (False, True):
        for E in (64, 1024):
            env = make_vec("simple_spread_v3", num_envs=E, seed=0, continuous_actions=continuous)
            env.reset()
            rng = np.random.default_rng(0)
            shape = (E, 3, 5) if continuous else (E, 3)
            table = [{"agent": rng.random(shape, np.float32) if continuous else rng.integers(0, 5, shape)}
                     for _ in range(16)]  # fmt: skip

            def checked(n, env=env, table=table):
                for t in range(n):
                    env.step(table[t % 16])
                return n

            def unchecked(n, env=env, table=table):
                for t in range(n):
                    env._step(table[t % 16])
                return n

            best = {"checked": 0.0, "unchecked": 0.0}
            for _ in range(repeats):  # alternate, so slow phases of a shared machine hit both
                best["checked"] = max(best["checked"], best_rate(checked, seconds, 1))
                best["unchecked"] = max(best["unchecked"], best_rate(unchecked, seconds, 1))
            us = {k: 1e6 / v for k, v in best.items()}  # microseconds per step() call
            rows.append(dict(actions="continuous" if continuous else "discrete", num_envs=E, us_checked=us["checked"],
                             us_unchecked=us["unchecked"], overhead=us["checked"] / us["unchecked"] - 1))  # fmt: skip
            print(f"{rows[-1]['actions']:10s} E={E:5d}: {us['unchecked']:8.1f} us unchecked, {us['checked']:8.1f} us "
                  f"checked: {100 * rows[-1]['overhead']:+.1f}%", flush=True)  # fmt: skip
    return rows


def validation_markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# What the Numba MPE's input checks cost",
        "",
        f"Generated by `{report['command']}` on {report['date']} (commit {m['commit']}); {m['cpu']}, pinned to core "
        f"{m['pinned_to_core']}; load average before / after {m['load_average']} / {report['load_average_after']}.",
        "",
        "`MPEVecEnv.step` checks its actions as the PettingZoo backend does (`envs.api.check_actions`: a dict of the",
        "env's groups, shape, dtype, range of discrete actions, finite continuous ones) and then runs `_step`. Both",
        "are timed here on the same pre-drawn actions of simple_spread_v3, in alternating rounds (best of "
        f"{report['repeats']} rounds of ~{report['seconds']} s each). Goal: under 3% of a step at 1024 envs.",
        "",
        "| actions | envs | step unchecked (us) | step checked (us) | cost of the checks |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in report["validation"]:
        lines.append(f"| {r['actions']} | {r['num_envs']} | {r['us_unchecked']:.1f} | {r['us_checked']:.1f} | "
                     f"{100 * r['overhead']:+.1f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def machine() -> dict:
    cpu = cpu_name()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "pinned_to_core": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: version(p) for p in ("numpy", "numba", "mpe2", "pettingzoo")},
        "commit": commit,
        "load_average": list(os.getloadavg()),
    }


def fmt(x: float) -> str:
    return f"{x:,.0f}"


def markdown(report: dict) -> str:
    m = report["machine"]
    v = ", ".join(f"{k} {x}" for k, x in m["versions"].items())
    lines = [
        "# Numba MPE speed",
        "",
        f"Generated by `{report['command']}` on {report['date']} (commit {m['commit']}).",
        f"Machine: {m['cpu']}, {m['logical_cores']} logical cores, pinned to core {m['pinned_to_core']}, "
        f"{m['platform']}, Python {m['python']}; {v}.",
        f"Load average before / after: {m['load_average']} / {report['load_average_after']} (a shared machine: "
        "each figure is the best of "
        f"{report['repeats']} rounds of ~{report['seconds']} s).",
        "",
        "env-steps/s = one env advancing one step; ours steps E envs per call (auto-reset and episode",
        "statistics included). mpe2 = its raw parallel env, one env. Discrete actions, default kwargs,",
        "max_cycles 25. Ratio = ours / mpe2.",
    ]
    for mode, title in (("with_actions", "With random actions drawn every step"), ("step_only", "Step only")):
        lines += ["", f"## {title}", ""]
        if mode == "with_actions":
            lines.append("mpe2: `action_space(a).sample()` per agent; ours: `Generator.integers` per group, (E, A).")
        else:
            lines.append("Actions read from a pre-drawn table.")
        lines += [
            "",
            "| scenario | mpe2 | ours E=1 | ours E=64 | ours E=1024 | ratio E=1 | ratio E=64 | ratio E=1024 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in report["results"].items():
            base = r["mpe2"][mode]
            ours = [r["ours"][str(E)][mode] for E in SIZES]
            ratios = " | ".join(f"{x / base:,.0f}x" for x in ours)
            lines.append(f"| {name} | {fmt(base)} | {' | '.join(fmt(x) for x in ours)} | {ratios} |")
    name, E, goal = TARGET
    if name in report["results"]:
        got = report["results"][name]["ours"][str(E)]["with_actions"]
        base = report["results"][name]["mpe2"]["with_actions"]
        lines += [
            "",
            f"Target: {name} >= {goal:,} env-steps/s at {E} envs (with actions): **{fmt(got)}** "
            f"({got / base:,.0f}x mpe2) - {'met' if got >= goal else 'NOT met'}.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=positive(float), default=0.5, help="length of one timed round")
    parser.add_argument("--repeats", type=positive(int), default=3, help="timed rounds per figure (the best is kept)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated scenario ids")
    stem = str(ROOT / "results" / "speed" / "numba_mpe")
    parser.add_argument("--out", type=out_file, default=stem, help="output stem")
    parser.add_argument("--validation", action="store_true", help="only the cost of step()'s input checks")
    args = parser.parse_args()
    if unknown := [name for name in args.scenarios.split(",") if name not in SCENARIOS]:
        parser.error(f"--scenarios: {', '.join(unknown)} unknown; the Numba MPE's: {', '.join(SCENARIOS)}")
    if hasattr(os, "sched_setaffinity"):  # one core: the last one this process may use
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    started = time.perf_counter()
    report = {
        "command": "python bench/bench_numba_mpe.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "seconds": args.seconds,
        "repeats": args.repeats,
        "results": {},
    }
    if args.validation:
        make_vec("simple_spread_v3", num_envs=2).reset()  # compile outside the timings
        report["validation"] = bench_validation(args.seconds, args.repeats)
        report["load_average_after"] = list(os.getloadavg())
        out = Path(args.out + "_validation")
        out.with_suffix(".md").write_text(validation_markdown(report))
        out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out.with_suffix('.md')}")
        return
    for name in args.scenarios.split(","):
        make_vec(name, num_envs=2).reset()  # compile (or load from Numba's cache) outside the timings
        r = {"mpe2": bench_mpe2(name, args.seconds, args.repeats), "ours": {}}
        for E in SIZES:
            r["ours"][str(E)] = bench_ours(name, E, args.seconds, args.repeats)
        report["results"][name] = r
        ours = r["ours"][str(SIZES[-1])]["with_actions"]
        base = r["mpe2"]["with_actions"]
        print(f"{name:28s} mpe2 {fmt(base):>8} | ours E={SIZES[-1]} {fmt(ours):>11} ({ours / base:,.0f}x)", flush=True)
    report["load_average_after"] = list(os.getloadavg())
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {out.with_suffix('.md')} and .json in {report['wall_seconds']} s")


if __name__ == "__main__":
    main()
