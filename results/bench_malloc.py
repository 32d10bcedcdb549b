"""Training speed under glibc's default malloc and with large freed blocks kept, side by side.

    python results/bench_malloc.py            # writes results/speed/malloc.md and malloc.json

By default glibc serves a block above its mmap threshold (128 kB, raised on the fly up to 32 MB as blocks are freed)
with a fresh mmap and hands it back to the OS on free, so a tensor of a few MB can be page-faulted in again on every
allocation (results/speed/coma_baseline.md measures it in a micro-benchmark: a batched pass slower than a per-agent
loop). Setting MALLOC_MMAP_THRESHOLD_ keeps such blocks in the heap for reuse. Whether that matters in training is
what this measures: each script on the Numba MPE with one torch thread, with and without that setting, interleaved
(default, kept, default, kept, ...), the median SPS of each and their ratio. The learning is the same bit for bit:
only where memory comes from changes.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch
from bench_train import _cpu, sps

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
KEPT = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20)}  # blocks up to 32 MB come from the heap and are reused


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="mappo,maddpg,coma,qmix", help="comma-separated scripts")
    parser.add_argument("--steps", type=int, default=160_000, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per script and setting")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    load_before, rows = os.getloadavg(), []
    settings = {"glibc default": {k: v for k, v in os.environ.items() if k not in KEPT}}
    settings["large blocks kept"] = settings["glibc default"] | KEPT
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            runs = {name: [] for name in settings}
            for r in range(args.repeats):
                for i, (name, env) in enumerate(settings.items()):
                    value, cmd = sps(algo, "numba", args.steps, 1, tmp, env=env, tag=f"_{r}_{i}")
                    runs[name].append(value)
                    print(f"{algo:6s} {name:17s} {value:,.0f} env-steps/s", flush=True)
            rows.append(dict(algo=algo, steps=args.steps, command=cmd, runs=runs,
                             median={name: statistics.median(v) for name, v in runs.items()}))  # fmt: skip
    report = dict(date=date.today().isoformat(), cpu=_cpu(), cores=os.cpu_count(), python=platform.python_version(),
                  torch=torch.__version__, load_average_before=load_before, load_average=os.getloadavg(),
                  command=" ".join(["python results/bench_malloc.py", *sys.argv[1:]]), kept=KEPT,
                  rows=rows)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "malloc.json").write_text(json.dumps(report, indent=2) + "\n")
    load = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    lines = [
        "# Training speed: glibc's default malloc against large freed blocks kept",
        "",
        f"Measured {report['date']} on {report['cpu']}, one torch thread, Numba MPE, {args.steps:,} env steps per "
        f"run, {args.repeats} runs per setting, interleaved; load average {load(load_before)} before and "
        f"{load(report['load_average'])} after. Regenerate: `{report['command']}`.",
        "'Large blocks kept': the same command with MALLOC_MMAP_THRESHOLD_=33554432 in its environment.",
        "",
        "| script | glibc default (env-steps/s) | large blocks kept (env-steps/s) | kept / default | runs |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        default, kept = row["median"]["glibc default"], row["median"]["large blocks kept"]
        runs = "; ".join(f"{name}: {', '.join(f'{v:,.0f}' for v in vals)}" for name, vals in row["runs"].items())
        lines.append(f"| {row['algo']} | {default:,.0f} | {kept:,.0f} | {kept / default:.2f}x | {runs} |")
    (args.out / "malloc.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
