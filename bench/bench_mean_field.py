"""Mean-field MARL speed: the neighbour mean-action kernel against its reference, and MF-Q / MF-AC training on
battle_v4 with the native MAgent2 backend, measured in one run.

    python bench/bench_mean_field.py                 # writes results/speed/mean_field.md and mean_field.json
    python bench/bench_mean_field.py --no-train      # the kernel only

1. `buffers.kernels.neighbour_mean_actions` (Numba) against `buffers.reference.neighbour_mean_actions` (plain
   Python), ns per agent-step (one agent's mean action at one step), median of repeats, on random cells of a 45 x 45
   map with 10% of the agents dead: battle_v4's team (81 agents, 21 actions, view radius 6), a team of 500, and
   simple_spread's group mean (3 agents, 5 actions).
2. `algos/mfq.py` and `algos/mfac.py` at their defaults on battle_v4 (45 x 45, 81 per side, both sides learning),
   one torch thread, evaluation off: env-steps/s and agent-steps/s (162 agents per env step) after a warm-up.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
from host import cpu_name, out_folder, positive

from buffers import kernels, reference

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
SIZES = [  # name, envs, agents, actions, view radius (None: the group mean)
    ("battle_v4 team", 16, 81, 21, 6.0),
    ("a team of 500", 4, 500, 21, 6.0),
    ("simple_spread group", 128, 3, 5, None),
]


def bench_kernel(repeats):
    rng, rows = np.random.default_rng(0), []
    for name, E, A, n, radius in SIZES:
        args = (rng.integers(0, 45, (E, A, 2)), rng.random((E, A)) > 0.1, rng.integers(0, n, (E, A)), n, radius)
        times = {}
        for label, fn, reps in (("compiled", kernels.neighbour_mean_actions, repeats), ("reference",
                                reference.neighbour_mean_actions, max(1, repeats // 50))):  # fmt: skip
            samples = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn(*args)
                samples.append(time.perf_counter() - t0)
            times[label] = statistics.median(samples) / (E * A) * 1e9
        rows.append(dict(case=name, E=E, A=A, actions=n, radius=radius, compiled_ns=times["compiled"],
                         reference_ns=times["reference"], speedup=times["reference"] / times["compiled"]))  # fmt: skip
        print(f"{name}: {times['compiled']:.0f} ns vs {times['reference']:.0f} ns per agent-step")
    return rows


def bench_train(steps):
    rows = []
    for algo in ("mfq", "mfac"):
        with tempfile.TemporaryDirectory() as tmp:
            flags = ["--env", "battle_v4", "--total-timesteps", str(steps), "--eval-interval", "0",
                     "--final-eval-episodes", "0", "--torch-threads", "1"]  # fmt: skip
            if algo == "mfq":  # learning from the first quarter on, so most of the run trains
                flags += ["--learning-starts", str(steps // 4), "--log-interval", str(steps // 8)]
            cmd = [sys.executable, str(ROOT / "algos" / f"{algo}.py"), *flags, "--run-dir", tmp]
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - start
            if proc.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
            sps = [int(x) for x in re.findall(r"SPS=(\d+)", proc.stderr)]
        env_sps = sps[-1] if sps else steps / wall
        rows.append(dict(algo=algo, steps=steps, env_steps_per_s=env_sps, agent_steps_per_s=env_sps * 162,
                         command=" ".join(["python", f"algos/{algo}.py", *flags])))  # fmt: skip
        print(f"{algo}: {env_sps:,} env-steps/s")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=positive(int), default=200)
    parser.add_argument("--steps", type=positive(int), default=64_000, help="env steps of each training run")
    parser.add_argument("--no-train", action="store_true", help="the kernel only")
    parser.add_argument("--out", type=out_folder, default=OUT)
    args = parser.parse_args()
    kernels.warmup()
    report = dict(date=date.today().isoformat(), cpu=cpu_name(),
                  load_average=os.getloadavg(), command="python bench/bench_mean_field.py" + (
                      " --no-train" if args.no_train else ""), kernel=bench_kernel(args.repeats),
                  train=[] if args.no_train else bench_train(args.steps))  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mean_field.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# Mean-field MARL speed", "",
             f"Measured {report['date']} on {report['cpu']}, load average "
             f"{', '.join(f'{x:.1f}' for x in report['load_average'])}. Regenerate: `{report['command']}`.", "",
             "## The neighbour mean action (ns per agent-step, median)", "",
             "| case | envs | agents | actions | radius | compiled | reference | speedup |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['case']} | {r['E']} | {r['A']} | {r['actions']} | {r['radius'] or 'group'} | "
              f"{r['compiled_ns']:.0f} | {r['reference_ns']:,.0f} | {r['speedup']:,.0f}x |"
              for r in report["kernel"]]  # fmt: skip
    if report["train"]:
        lines += ["", "## Training on battle_v4 (45 x 45, 162 agents), native backend, one torch thread", "",
                  "| script | env-steps/s | agent-steps/s | command |", "|---|---|---|---|"]  # fmt: skip
        lines += [f"| {r['algo']} | {r['env_steps_per_s']:,} | {r['agent_steps_per_s']:,} | `{r['command']}` |"
                  for r in report["train"]]  # fmt: skip
    (args.out / "mean_field.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
