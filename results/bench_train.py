"""End-to-end training speed of the MPE scripts (MAPPO, IPPO, MADDPG, MATD3, IDDPG), and where the time goes.

    python results/bench_train.py            # writes results/speed/train.md and train.json

Each script runs as a subprocess with the settings used for the results (its defaults: for the PPO scripts
128 envs, 25-step rollouts, 10 epochs; for the DDPG family 128 envs, one update of 256 per 256 transitions)
on both env backends; env-steps/s is the script's own last
`charts/SPS` (evaluation excluded: --eval-interval 0). Then one MAPPO run on the Numba MPE under
cProfile splits the wall time into acting, env stepping, storing, targets and the PPO update.
The load average is recorded beside the numbers: on a shared machine they are a lower bound.
"""

import argparse
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"

# (function name as pstats reports it, file suffix) -> row label of the time breakdown
PHASES = {
    ("update", "algos/mappo.py"): "PPO update (10 epochs: forward, backward, Adam)",
    ("act", "algos/mappo.py"): "acting (actor forward, sampling)",
    ("value", "algos/mappo.py"): "critic values while acting",
    ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
    ("add", "buffers/rollout.py"): "storing the step (RolloutBuffer.add)",
    ("compute_gae", "buffers/rollout.py"): "targets (RolloutBuffer.compute_gae)",
    ("add_scalar", "torch/utils/tensorboard/writer.py"): "TensorBoard logging",
}


def sps(algo, backend, steps, threads, workdir):
    run_dir = Path(workdir) / f"{algo}_{backend}_{threads}"
    flags = (
        f"--backend {backend} --total-timesteps {steps} --eval-interval 0 --eval-episodes 1 --torch-threads {threads}"
    )
    cmd = [sys.executable, str(ROOT / "algos" / f"{algo}.py"), *flags.split(), "--run-dir", str(run_dir)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc.Scalars("charts/SPS")[-1].value, " ".join(cmd[1:]).replace(str(ROOT) + "/", "")


def profile(steps, workdir):
    prof = Path(workdir) / "mappo.prof"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), str(ROOT / "algos" / "mappo.py"), "--backend", "numba",
           "--total-timesteps", str(steps), "--eval-interval", "0", "--eval-episodes", "1",
           "--run-dir", str(Path(workdir) / "prof_run")]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    stats = pstats.Stats(str(prof)).stats
    main = next(v[3] for (f, _, name), v in stats.items() if name == "main" and f.endswith("algos/mappo.py"))
    rows = {}
    for (f, _, name), (_, _, _, cumtime, _) in stats.items():
        for (fn, suffix), label in PHASES.items():
            if name == fn and f.endswith(suffix):
                rows[label] = rows.get(label, 0.0) + cumtime
    rows = {k: v for k, v in sorted(rows.items(), key=lambda kv: -kv[1])}
    return main, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=320_000, help="env steps per Numba-MPE run")
    parser.add_argument("--pz-steps", type=int, default=64_000, help="env steps per mpe2 (PettingZoo) run")
    parser.add_argument("--algos", default="mappo,ippo,maddpg,matd3,iddpg", help="comma-separated scripts")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            two_threads = [("numba", args.steps, 2)] if algo in ("mappo", "ippo") else []
            for backend, steps, threads in [("numba", args.steps, 1), *two_threads, ("pettingzoo", args.pz_steps, 1)]:
                value, cmd = sps(algo, backend, steps, threads, tmp)
                rows.append(
                    dict(algo=algo, backend=backend, torch_threads=threads, steps=steps, sps=value, command=cmd)
                )
                print(f"{algo:6s} {backend:10s} threads={threads}: {value:,.0f} env-steps/s", flush=True)
        total, phases = profile(args.steps, tmp)
    report = dict(date=date.today().isoformat(), cpu=_cpu(), cores=os.cpu_count(), python=platform.python_version(),
                  load_average=os.getloadavg(), command="python results/bench_train.py", runs=rows,
                  profile=dict(main_seconds=total, phases=phases))  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# End-to-end training speed (env-steps/s)",
        "",
        f"Measured {report['date']} on {report['cpu']} ({report['cores']} cores), load average "
        f"{', '.join(f'{x:.1f}' for x in report['load_average'])} at the end. Regenerate: `{report['command']}`.",
        "Settings: the scripts' defaults (PPO: 128 envs, 25-step rollouts, 1 minibatch, 10 epochs; DDPG family: 128 "
        "envs, batch 256 every 256 transitions, 25k random steps first), evaluation off.",
        "",
        "| script | backend | torch threads | env-steps/s | command |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['algo']} | {r['backend']} | {r['torch_threads']} | {r['sps']:,.0f} | `{r['command']}` |" for r in rows
    ]
    lines += [
        "",
        "Reference points on this machine class: the reference library's MAPPO trains at ~900 env-steps/s and its",
        "MADDPG at ~1,900;",
        "a raw mpe2 loop steps simple_spread at ~2,400 env-steps/s (results/speed/envs.md).",
        "",
        f"## Where the time goes: MAPPO, Numba MPE, 1 thread ({total:.1f} s in main, cProfile)",
        "",
        "| phase | seconds | share of main |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v:.2f} | {100 * v / total:.0f}% |" for k, v in phases.items()]
    lines.append("")
    (args.out / "train.md").write_text("\n".join(lines))
    print((args.out / "train.md").read_text())


def _cpu():
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    main()
