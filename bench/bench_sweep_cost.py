"""What a sweep will cost before it is launched: each script's training env-steps/s on each task, at its defaults,
and the core-hours of a run at the budget it would get.

    python bench/bench_sweep_cost.py            # the EPyMARL benchmark's cells (issue 42): results/speed/sweep_cost.md
    python bench/bench_sweep_cost.py --algos qmix,mappo --envs rware-tiny-2ag --name cost_rware

Each (script, task) trains once for --steps env steps (one torch thread, no evaluation) and its speed is read from
the run's own `charts/SPS` points: the env steps between the middle and the last point over the wall time between
them, so the start (imports, compiling, the replay filling before the first update) is left out. A run at budget B
then costs B / speed seconds of one core for its training. Budgets: --on-policy-steps for the on-policy scripts
(ON_POLICY), --off-policy-steps for the rest (the EPyMARL benchmark: 20M and 2M, as its paper counts them).

Evaluation runs on the original package (protocol v2), not on the Numba port that trains, and on RWARE's 500-step
episodes it is not small: each task also times --eval-timing-episodes episodes of the package through
runtime.evaluation.evaluate (uniformly random actions: the package's stepping, without a network's forward pass),
and a run is charged --eval-per-run episodes at that rate (default 5,000: the EPyMARL cadence's 40 evaluations of 100
episodes and protocol v2's 1,000 final ones). The load average is recorded beside the numbers: on a shared machine
they are a lower bound on speed.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from host import cpu_name, out_folder, positive
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import envs
from runtime.evaluation import FINAL_SEED, evaluate
from runtime.opponents import random_actor

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
ON_POLICY = {"mappo", "ippo", "happo", "coma", "vdac", "commnet", "ic3net", "tarmac", "mfac"}
ALGOS = "iql,vdn,qmix,maddpg,ippo,mappo,coma"  # the benchmark's algorithms that we have (MADDPG with discrete actions)
ENVS = "Foraging-8x8-2p-2f-coop,Foraging-15x15-4p-3f,rware-tiny-2ag,rware-tiny-4ag"


def steady_speed(run_dir):
    """Env steps per second between the middle and the last `charts/SPS` point of a run, from their wall times."""
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    points = ea.Scalars("charts/SPS") if "charts/SPS" in ea.Tags()["scalars"] else []
    if len(points) < 3:
        raise RuntimeError(f"{run_dir} logged {len(points)} charts/SPS points: give it more --steps")
    mid, last = points[len(points) // 2], points[-1]
    return (last.step - mid.step) / (last.wall_time - mid.wall_time)


def measure(algo, env_id, steps, workdir):
    """(steady env-steps/s, command) of one short training run of algos/<algo>.py on env_id at its defaults."""
    run_dir = Path(workdir) / f"{algo}_{env_id}"
    extra = ["--no-continuous-actions"] if algo in ("maddpg", "matd3", "iddpg") else []  # the benchmark's MADDPG
    cmd = [sys.executable, str(ROOT / "algos" / f"{algo}.py"), "--env-id", env_id, "--total-timesteps", str(steps),
           "--eval-interval", "0", "--eval-episodes", "1", "--final-eval-episodes", "0", "--torch-threads", "1",
           *extra, "--run-dir", str(run_dir)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return steady_speed(run_dir), " ".join(cmd[1:-2]).replace(str(ROOT) + "/", "")


def eval_seconds(env_id, episodes):
    """Seconds per episode of the original package (protocol v2's evaluation env), random actions, `episodes` of it."""
    probe = envs.make(env_id, 1, 0)
    specs = list(probe.groups.values())
    probe.close()

    def joint(num_envs, rng):
        acts = [random_actor(spec)(num_envs, rng) for spec in specs]
        return lambda obs, done: {k: v for act in acts for k, v in act(obs, done).items()}

    start = time.perf_counter()
    evaluate(lambda n, seed: envs.make(env_id, n, seed), joint, episodes, FINAL_SEED)
    return (time.perf_counter() - start) / episodes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default=ALGOS, help="comma-separated scripts")
    parser.add_argument("--envs", default=ENVS, help="comma-separated env ids")
    parser.add_argument("--steps", type=positive(int), default=120_000, help="env steps of each timed run")
    parser.add_argument("--on-policy-steps", type=positive(int), default=20_000_000, help="budget of an on-policy run")
    parser.add_argument("--off-policy-steps", type=positive(int), default=2_000_000, help="budget of an off-policy run")
    parser.add_argument("--seeds", type=positive(int), default=3, help="seeds per cell, for the sweep's total")
    parser.add_argument("--eval-timing-episodes", type=int, default=100, help="package episodes timed per task")
    parser.add_argument("--eval-per-run", type=int, default=5000, help="evaluation episodes a run plays")
    parser.add_argument("--out", type=out_folder, default=OUT)
    parser.add_argument("--name", default="sweep_cost", help="file names of the report: <out>/<name>.md and .json")
    args = parser.parse_args()
    algos, env_ids = args.algos.split(","), args.envs.split(",")
    if unknown := [a for a in algos if not (ROOT / "algos" / f"{a}.py").is_file()]:
        parser.error(f"no script algos/<name>.py for {', '.join(unknown)}")
    if unknown := [str(error) for e in env_ids if (error := envs.unknown_id(e))]:
        parser.error(f"--envs: {'; '.join(unknown)}")
    if args.eval_timing_episodes < 1 or args.eval_per_run < 0:
        parser.error("--eval-timing-episodes must be at least 1 and --eval-per-run at least 0 (0: no evaluation)")
    load_before, rows = os.getloadavg(), []
    with tempfile.TemporaryDirectory() as tmp:
        for env_id in env_ids:
            per_episode = eval_seconds(env_id, args.eval_timing_episodes)
            evaluation = args.eval_per_run * per_episode / 3600
            for algo in algos:
                speed, cmd = measure(algo, env_id, args.steps, tmp)
                budget = args.on_policy_steps if algo in ON_POLICY else args.off_policy_steps
                rows.append(dict(algo=algo, env_id=env_id, env_steps_per_s=speed, budget=budget,
                                 training_core_hours=budget / speed / 3600, eval_s_per_episode=per_episode,
                                 eval_core_hours=evaluation, core_hours=budget / speed / 3600 + evaluation,
                                 command=cmd))  # fmt: skip
                print(f"{env_id:28s} {algo:7s} {speed:9,.0f} env-steps/s, {rows[-1]['core_hours']:6.2f} h a run")
    total = args.seeds * sum(r["core_hours"] for r in rows)
    report = dict(date=date.today().isoformat(), cpu=cpu_name(), cores=os.cpu_count(), python=platform.python_version(),
                  torch=torch.__version__, load_average_before=load_before, load_average=os.getloadavg(),
                  command=" ".join(["python bench/bench_sweep_cost.py", *sys.argv[1:]]), steps=args.steps,
                  seeds=args.seeds, eval_per_run=args.eval_per_run, rows=rows, total_core_hours=total)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    load = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    lines = [
        f"# What a sweep of {', '.join(algos)} costs: training env-steps/s per script and task, and core-hours at the "
        "budget",
        "",
        f"Measured {report['date']} on {report['cpu']}, one torch thread, each script at its defaults (MADDPG with "
        f"--no-continuous-actions), {args.steps:,} env steps per timed run, speed from the middle to the last "
        f"`charts/SPS` point (start, compile and replay filling left out); evaluation: {args.eval_per_run:,} "
        f"episodes a run on the original package, timed with random actions; load average {load(load_before)} "
        f"before and {load(report['load_average'])} after. Regenerate: `{report['command']}`.",
        "",
        "| task | script | env-steps/s | budget | training | evaluation (s an episode) | core-hours a run |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['env_id']} | {r['algo']} | {r['env_steps_per_s']:,.0f} | {r['budget'] / 1e6:g}M | "
              f"{r['training_core_hours']:.2f} | {r['eval_core_hours']:.2f} ({r['eval_s_per_episode']:.3f}) | "
              f"{r['core_hours']:.2f} |" for r in rows]  # fmt: skip
    lines += ["", f"All cells above, {args.seeds} seeds each: **{total:.0f} core-hours** ({total / 2:.0f} hours of a "
              "2-core machine running two runs side by side)."]  # fmt: skip
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
