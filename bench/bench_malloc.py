"""Training speed under glibc's default malloc and with every block from the heap (the scripts' way), side by side.

    python bench/bench_malloc.py            # writes results/speed/malloc.md and malloc.json

By default glibc serves a block above its mmap threshold (128 kB, raised on the fly up to 32 MB as blocks are freed)
with a fresh mmap and hands it back to the OS on free, and it trims the heap's free top back to the OS, so a tensor
of a few MB can be page-faulted in again on every allocation. Every script calls `runtime.keep_freed_memory()` at its
start: every block from the heap, freed memory kept there for reuse. This measures what that changes in training:
each script on the Numba MPE with one torch thread, as it runs ('kept') and with glibc's defaults
(FLASHMARL_MALLOC=glibc in the environment), interleaved, the median SPS of each and their ratio, and the minor page
faults of each run (most of the kept runs' are the start: imports, Numba's cache). The learning is the same bit for
bit, checked: the first pair of runs of each script log the same losses (bench/compare_losses.py's reading).
"""

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch
from bench_train import run_dir_of, sps
from compare_losses import losses
from host import cpu_name, out_folder, positive, scripts

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
GLIBC = {"FLASHMARL_MALLOC": "glibc"}  # runtime.keep_freed_memory() leaves glibc's defaults


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", type=scripts, default="mappo,ippo,maddpg,coma,qmix", help="comma-separated scripts")
    parser.add_argument("--steps", type=positive(int), default=160_000, help="env steps per run")
    parser.add_argument("--repeats", type=positive(int), default=2, help="runs per script and setting")
    parser.add_argument("--out", type=out_folder, default=OUT)
    args = parser.parse_args()
    load_before, rows = os.getloadavg(), []
    settings = {"glibc default": os.environ | GLIBC, "kept": dict(os.environ)}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            runs, faults = {name: [] for name in settings}, {name: [] for name in settings}
            for r in range(args.repeats):
                for i, (name, env) in enumerate(settings.items()):
                    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
                    value, cmd = sps(algo, "numba", args.steps, 1, tmp, env=env, tag=f"_{r}_{i}")
                    runs[name].append(value)
                    faults[name].append(resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before)
                    print(f"{algo:6s} {name:17s} {value:,.0f} env-steps/s, {faults[name][-1]:,} faults", flush=True)
            pair = [losses(str(run_dir_of(algo, "numba", 1, tmp, tag=f"_0_{i}")), args.steps) for i in range(2)]
            same = pair[0] == pair[1] and bool(pair[0])
            rows.append(dict(algo=algo, steps=args.steps, command=cmd, runs=runs, page_faults=faults, same_losses=same,
                             median={name: statistics.median(v) for name, v in runs.items()}))  # fmt: skip
    report = dict(date=date.today().isoformat(), cpu=cpu_name(), cores=os.cpu_count(), python=platform.python_version(),
                  torch=torch.__version__, load_average_before=load_before, load_average=os.getloadavg(),
                  command=" ".join(["python bench/bench_malloc.py", *sys.argv[1:]]), glibc=GLIBC,
                  rows=rows)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "malloc.json").write_text(json.dumps(report, indent=2) + "\n")
    load = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    lines = [
        "# Training speed: glibc's default malloc against every block from the heap, freed memory kept",
        "",
        f"Measured {report['date']} on {report['cpu']}, one torch thread, Numba MPE, {args.steps:,} env steps per "
        f"run, {args.repeats} runs per setting, interleaved; load average {load(load_before)} before and "
        f"{load(report['load_average'])} after. Regenerate: `{report['command']}`.",
        "'Kept': the scripts as they run (`runtime.keep_freed_memory()`: every block from the heap, freed memory "
        "kept); 'glibc default': the same command with FLASHMARL_MALLOC=glibc in its environment. 'Same losses': "
        "every losses/* point of the first two runs equal.",
        "",
        "| script | glibc default (env-steps/s) | kept (env-steps/s) | kept / default | page faults "
        "per run, default / kept (median) | same losses | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        default, kept = row["median"]["glibc default"], row["median"]["kept"]
        pf = " / ".join(f"{statistics.median(row['page_faults'][name]):,.0f}" for name in row["runs"])
        runs = "; ".join(f"{name}: {', '.join(f'{v:,.0f}' for v in vals)}" for name, vals in row["runs"].items())
        same = "yes" if row["same_losses"] else "**no**"
        cells = f"{default:,.0f} | {kept:,.0f} | {kept / default:.2f}x | {pf} | {same}"
        lines.append(f"| {row['algo']} | {cells} | {runs} |")
    (args.out / "malloc.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
