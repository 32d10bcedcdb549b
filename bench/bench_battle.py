"""What training on MAgent2's battle costs here: env-steps/s, agent-steps/s, peak memory and the hours a 2M-step run
would take, for the scripts of the MAgent2 baseline (MAPPO and IPPO, self-play against their own past checkpoints).

    python bench/bench_battle.py            # writes results/speed/battle.md and battle.json
    python bench/bench_battle.py --algos mfq,mfac,iql,ippo,mappo --map-size 40 --max-cycles 400 --cuda \
        --workers 5 --name battle_cuda       # on a machine with a GPU: each script on the CPU and with --cuda

Each script runs as a subprocess at its defaults (128 envs, 25-step rollouts, 10 epochs of 1 minibatch) on
battle_v4 at its default 45 x 45 map (81 agents a side), `--self-play blue`, for two updates, evaluation off; the
speed is the script's last `charts/SPS`, the memory the child's peak resident set. The load average is recorded
beside the numbers: on a shared machine they are a lower bound. `--map-size 40 --max-cycles 400` measures the
battle of issue 41's protocol (results/battle_v4/protocol.md; 64 agents a side), with its flags for iql.

`--cuda`: each script also runs with `--cuda`, the GPU runs one after another (two runs on one GPU would time each
other) while the CPU runs go side by side, `--workers` at a time, one torch thread each: a machine with many cores
measures both sides in one call, and the ratio between them is the figure to read.

Every script serves all its allocations from glibc's heap and keeps what is freed (runtime.keep_freed_memory).
`--glibc`: each script also runs under glibc's own defaults (FLASHMARL_MALLOC=glibc), where every block over the
mmap threshold (at most 32 MB) is mapped afresh and handed back on free: battle's batches (32,400+ rows of 926
floats) are such blocks, and every op that makes one pays the page faults of first touching it.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

from host import cpu_name, out_folder, positive, scripts
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"


MALLOC = {  # label -> environment
    "glibc default": {"FLASHMARL_MALLOC": "glibc"},  # runtime.keep_freed_memory() leaves glibc's defaults
    "heap only": {},  # the scripts as they run: runtime.keep_freed_memory()
}
# what results/battle_v4/protocol.md adds to a script's defaults: iql's own replay of 5,000 whole episodes of 128
# envs would hold hundreds of GiB of battle's views, and the script refuses it
PROTOCOL_FLAGS = {"iql": "--num-envs 16 --buffer-size 32 --seq-len 25"}


def agents_a_side(map_size):
    """magent2's battle places int(sqrt(0.04 * map_size^2))^2 agents a side (81 at 45 x 45, 64 at 40 x 40)."""
    return int(math.sqrt(0.04 * map_size * map_size)) ** 2


def run(algo, steps, workdir, malloc="heap only", map_size=45, max_cycles=None, cuda=False):
    """(env-steps/s, peak RSS in GiB, seconds, command) of one battle_v4 training run of algos/<algo>.py."""
    run_dir = Path(workdir) / f"{algo}_{list(MALLOC).index(malloc)}_{'cuda' if cuda else 'cpu'}"
    flags = (f"--env-id battle_v4 --self-play blue --total-timesteps {steps} --eval-interval 0 --eval-episodes 1 "
             "--final-eval-episodes 0 --torch-threads 1")  # fmt: skip
    flags += f" {PROTOCOL_FLAGS.get(algo, '')}" + (f" --map-size {map_size}" if map_size != 45 else "")
    flags += (f" --max-cycles {max_cycles}" if max_cycles else "") + (" --cuda" if cuda else "")
    cmd = [sys.executable, str(ROOT / "algos" / f"{algo}.py"), *flags.split(), "--run-dir", str(run_dir)]
    start = os.times().elapsed
    env = os.environ | MALLOC[malloc]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak memory
    seconds = os.times().elapsed - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.read().decode()[-2000:]}")
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    if "charts/SPS" not in acc.Tags()["scalars"]:
        raise SystemExit(f"{algo} logged no charts/SPS in {steps:,} env steps: give it more --steps")
    sps = acc.Scalars("charts/SPS")[-1].value
    command = " ".join(cmd[1:]).replace(str(ROOT) + "/", "")
    prefix = "".join(f"{k}={v} " for k, v in MALLOC[malloc].items())
    return sps, usage.ru_maxrss / 2**20, seconds, f"{prefix}python {command}" if prefix else command


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", type=scripts, default="mappo,ippo", help="comma-separated scripts")
    parser.add_argument(
        "--steps", type=positive(int), default=6400, help="env steps per run (two updates at the defaults)"
    )
    parser.add_argument("--glibc", action="store_true", help="each script also under glibc's default malloc")
    parser.add_argument("--map-size", type=int, default=45, help="battle's map (the protocol of issue 41: 40)")
    parser.add_argument("--max-cycles", type=int, default=None, help="episode limit (the protocol: 400)")
    parser.add_argument("--cuda", action="store_true", help="each script also with --cuda (needs a CUDA device)")
    parser.add_argument("--workers", type=int, default=1, help="CPU runs side by side (GPU runs go one at a time)")
    parser.add_argument("--name", default="battle", help="report name under --out (.md and .json)")
    parser.add_argument("--out", type=out_folder, default=OUT)
    args = parser.parse_args()
    if args.map_size < 10 or args.workers < 1:
        parser.error("--map-size must be at least 10 and --workers at least 1")
    gpu = None
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            parser.error("--cuda: no CUDA device here; run it on a machine with one, or leave --cuda out")
        gpu = torch.cuda.get_device_name(0)
    agents = agents_a_side(args.map_size)
    jobs = [(algo, malloc, cuda) for algo in args.algos.split(",") for malloc in (MALLOC if args.glibc else
            ("heap only",)) for cuda in ((False, True) if args.cuda else (False,))]  # fmt: skip

    def measure(job):
        algo, malloc, cuda = job
        sps, gib, seconds, cmd = run(algo, args.steps, tmp, malloc, args.map_size, args.max_cycles, cuda)
        print(f"{algo} {malloc} {'cuda' if cuda else 'cpu'}: {sps:,.1f} env-steps/s, peak {gib:.1f} GiB", flush=True)
        return dict(algo=algo, malloc=malloc, device=gpu if cuda else "cpu", sps=sps, agent_steps_per_s=sps * agents,
                    peak_rss_gib=gib, seconds=seconds, hours_for_2m=2e6 / sps / 3600, command=cmd)  # fmt: skip

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.workers + 1) as pool:
        on_gpu = pool.submit(lambda: [measure(j) for j in jobs if j[2]])  # one after another
        on_cpu = list(pool.map(measure, [j for j in jobs if not j[2]]))
        done = {(r["algo"], r["malloc"], r["device"] != "cpu"): r for r in on_cpu + on_gpu.result()}
    report = dict(date=date.today().isoformat(), cpu=cpu_name(), cores=os.cpu_count(), gpu=gpu, workers=args.workers,
                  load_average_before=load_before, load_average=os.getloadavg(), map_size=args.map_size,
                  agents_a_side=agents, max_cycles=args.max_cycles,
                  command=" ".join(["python bench/bench_battle.py", *sys.argv[1:]]), steps=args.steps,
                  runs=[done[j] for j in jobs])  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(report))
    print((args.out / f"{args.name}.md").read_text())


def markdown(report):
    size, agents = report.get("map_size", 45), report.get("agents_a_side", 81)
    loads = [", ".join(f"{x:.1f}" for x in report[k]) for k in ("load_average_before", "load_average")]
    scripts = ", ".join(dict.fromkeys(run["algo"] for run in report["runs"]))  # the heading tells the files apart
    device = f"CPU and {report['gpu']}" if report.get("gpu") else "CPU"
    lines = [
        f"# Training on battle_v4 ({size} x {size}; {scripts}; {device}): what a run costs on this machine",
        "",
        f"Measured {report['date']} on {report['cpu']} ({report['cores']} cores"
        + (f", {report['gpu']}" if report.get("gpu") else "")
        + f"), load average {loads[0]} before and {loads[1]} after"
        + (f", {report['workers']} CPU runs side by side" if report.get("workers", 1) > 1 else "")
        + f". Regenerate: `{report['command']}`.",
        f"Settings: each script's defaults (iql: `{PROTOCOL_FLAGS['iql']}`), battle_v4 at {size} x {size} ({agents} "
        "agents a side)"
        + (f", episodes of at most {report['max_cycles']} steps" if report.get("max_cycles") else "")
        + ", `--self-play blue` (red learns, blue plays red's past checkpoints), "
        f"{report['steps']:,} env steps, evaluation off, 1 torch thread.",
        "",
        "| script | malloc | device | env-steps/s | learning agent-steps/s | peak memory (GiB) | "
        "hours for 2M env steps | command |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['algo']} | {r.get('malloc', 'glibc default')} | {r.get('device', 'cpu')} | {r['sps']:,.1f} | "
        f"{r['agent_steps_per_s']:,.0f} | {r['peak_rss_gib']:.1f} | {r['hours_for_2m']:.1f} | `{r['command']}` |"
        for r in report["runs"]
    ]
    cpu = {(r["algo"], r.get("malloc")): r for r in report["runs"] if r.get("device", "cpu") == "cpu"}
    for r in report["runs"]:
        if r.get("device", "cpu") != "cpu":
            lines += ["", f"{r['algo']} with `--cuda`: **{r['sps'] / cpu[r['algo'], r.get('malloc')]['sps']:.1f}x** "
                      "the env-steps/s of the same script on one CPU core of the same machine."]  # fmt: skip
    if size == 45:
        lines += [
            "",
            "The learner is the cost: 81 agents' 13 x 13 x 5 views (845 floats) through 10 epochs per rollout. Before "
            "mappo's critic took the state through its first layer once (not once per agent with its id), one update "
            "built a (3,200 x 81 x 10,206) float input, 10.6 GB a group, and a default run was killed for memory on "
            "this 24 GB machine.",
            "",
        ]
    by = {(r["algo"], r.get("malloc", "glibc default")): r for r in report["runs"]}
    for algo in dict.fromkeys(r["algo"] for r in report["runs"]):
        if (algo, "glibc default") in by:
            glibc, heap = by[algo, "glibc default"], by[algo, "heap only"]
            lines += [
                f"{algo} as it runs, every allocation from glibc's heap (runtime.keep_freed_memory): "
                f"**{heap['sps'] / glibc['sps']:.1f}x** the env-steps/s of glibc's default malloc (`--glibc`), at "
                f"{heap['peak_rss_gib'] / glibc['peak_rss_gib']:.2f}x its peak memory. Only where memory comes from "
                "changes: the losses are the same bit for bit (results/speed/malloc.md has the check). On MPE the "
                "same setting gives 1.0-1.1x (speed/malloc.md).",
                "",
            ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
