"""Our PPO scripts against JaxMARL's whole-program-compiled baselines, side by side on this machine, one thread each.

    python bench/bench_jaxmarl.py              # writes results/speed/jaxmarl.md and jaxmarl.json

Two pairs, each at JaxMARL's own config and ours set to match it (16 envs x 128 steps, 4 epochs x 4 minibatches,
gamma 0.99, value coefficient 0.5, gradient norm 0.5, no LayerNorm, no value normalization, plain squared value
error), simple_spread_v3 on our Numba MPE:

* `ippo`: JaxMARL `baselines/IPPO/ippo_ff_mpe.py` (64-wide MLPs) against our `algos/ippo.py --hidden-size 64`;
* `mappo_rnn`: JaxMARL `baselines/MAPPO/mappo_rnn_mpe.py` (128-wide, a GRU, whole 128-step sequences) against our
  `algos/mappo.py --rnn --rnn-chunk 128 --hidden-size 128`.

Rounds alternate ours and theirs (A/B/A/B: the machine's load moves both alike); the report gives medians and the
ratio ours / theirs. Each side's start-up is reported apart, alike: theirs is env-steps/s of the compiled run, the
compile time apart (`../shared/peers/run_jaxmarl.py`, in its own virtual environment: `--jaxmarl-python`); ours is
env-steps/s after the first iteration (from the script's `charts/SPS` points: the steps and seconds between the
first iteration's end and the last's), the first iteration's seconds apart (Numba's cached kernels loading, torch's
first calls; the SPS of the whole run, which includes it, is in the JSON as `sps_whole_run`).

On a machine with a GPU, `--cuda` runs both there (ours with `--cuda`, one CPU thread; JAX on its CUDA backend,
with the CPU beside it for JaxMARL's logging callback) and writes speed/jaxmarl_cuda.{md,json}. Where `../shared`
is absent (a lent GPU machine), copy `../shared/peers` into the checkout and pass `--peers`, and `--jaxmarl-python`
a python that imports jax and the packages of the install line. `--steps-scale` shortens both sides' runs.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from host import cpu_name, out_folder, positive, run_or_exit
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
PEERS = ROOT.parent / "shared" / "peers"
MATCHED = ("--env-id simple_spread_v3 --backend numba --num-envs 16 --num-steps 128 --update-epochs 4 "
           "--num-minibatches 4 --gamma 0.99 --vf-coef 0.5 --max-grad-norm 0.5 --anneal-lr --feature-norm none "
           "--no-value-norm --huber-delta 0 --eval-interval 0 --eval-episodes 1 --final-eval-episodes 0 "
           "--torch-threads 1 --no-save-model")  # fmt: skip
PAIRS = {  # name -> (our script and flags, JaxMARL's script, our steps, their steps)
    "ippo": ("ippo", "--hidden-size 64 --learning-rate 2.5e-4", "ippo", 327_680, 2_000_000),
    "mappo_rnn": ("mappo", "--rnn --rnn-chunk 128 --hidden-size 128 --learning-rate 2e-3", "mappo", 131_072, 131_072),
}
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                 "XLA_FLAGS": "--xla_force_host_platform_device_count=1 --xla_cpu_multi_thread_eigen=false "
                              "intra_op_parallelism_threads=1"}  # fmt: skip


def ours(script, flags, steps, workdir, cuda=False):
    """(env-steps/s, seconds to the first iteration's end, command) of one run of algos/<script>.py."""
    run_dir = Path(workdir) / script
    cmd = [sys.executable, str(ROOT / "algos" / f"{script}.py"), *MATCHED.split(), *flags.split(),
           "--total-timesteps", str(steps), "--run-dir", str(run_dir), *(["--cuda"] if cuda else [])]  # fmt: skip
    run_or_exit(cmd, cwd=ROOT, env=os.environ | SINGLE_THREAD)
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    sps = acc.Scalars("charts/SPS")  # env steps / seconds since training started, after every iteration
    first, last = sps[0].step / max(sps[0].value, 1e-9), sps[-1].step / max(sps[-1].value, 1e-9)
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    steady = (sps[-1].step - sps[0].step) / max(last - first, 1e-9)
    return steady, first, sps[-1].value, " ".join(cmd[1:]).replace(str(ROOT) + "/", "")


def theirs(algo, steps, python, peers=PEERS, cuda=False):
    """JaxMARL's row (run_jaxmarl.py's JSON: sps, compile_s, ...) of one run."""
    cmd = [python, str(peers / "run_jaxmarl.py"), algo, f"TOTAL_TIMESTEPS={steps}", "NUM_SEEDS=1"]
    env = os.environ | ({} if cuda else SINGLE_THREAD) | {"JAXMARL_BASELINES": str(peers / "jaxmarl-baselines"),
                                        "JAX_PLATFORMS": "cuda,cpu" if cuda else "cpu"}  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"JaxMARL's run failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    return row | {"command": " ".join(cmd[1:]).replace(str(ROOT.parent), "..")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated: " + ", ".join(PAIRS))
    parser.add_argument("--rounds", type=positive(int), default=3, help="A/B rounds per pair (medians over them)")
    parser.add_argument(
        "--jaxmarl-python",
        default="/tmp/jaxmarl-venv/bin/python",
        help="the python of JaxMARL's virtual environment (install line: ../shared/peers/README.md)",
    )
    parser.add_argument("--peers", type=Path, default=PEERS, help="folder of run_jaxmarl.py and jaxmarl-baselines/")
    parser.add_argument(
        "--cuda",
        action="store_true",
        help="both on the GPU: ours with --cuda, JAX on its CUDA backend (writes jaxmarl_cuda.*)",
    )
    parser.add_argument(
        "--steps-scale", type=positive(float), default=1.0, help="multiply both sides' env steps (shorter runs)"
    )
    parser.add_argument("--out", type=out_folder, default=OUT)
    args = parser.parse_args()
    if not shutil.which(args.jaxmarl_python):
        raise SystemExit(f"no JaxMARL python at {args.jaxmarl_python}: install it as ../shared/peers/README.md says, "
                         "or pass --jaxmarl-python")  # fmt: skip
    device = cpu_name()
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--cuda: no CUDA device here; run it on a machine with one, or leave out --cuda")
        device = f"{torch.cuda.get_device_name(0)} (host: {device})"
    report = {"date": str(date.today()), "cpu": device, "cores": os.cpu_count(), "load_before": os.getloadavg(),
              "command": "python bench/bench_jaxmarl.py " + " ".join(sys.argv[1:]), "pairs": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.pairs.split(","):
            script, flags, peer, our_steps, their_steps = PAIRS[name]
            iteration = 16 * 128  # both sides' env steps per iteration: keep whole iterations when scaled
            our_steps, their_steps = (max(iteration, round(n * args.steps_scale / iteration) * iteration)
                                      for n in (our_steps, their_steps))  # fmt: skip
            rows = {"ours": [], "first_iteration_s": [], "sps_whole_run": [], "theirs": [], "compile_s": []}
            for k in range(args.rounds):
                sps, first, whole, command = ours(script, flags, our_steps, workdir, args.cuda)
                row = theirs(peer, their_steps, args.jaxmarl_python, args.peers, args.cuda)
                rows["ours"].append(sps)
                rows["first_iteration_s"].append(first)
                rows["sps_whole_run"].append(whole)
                rows["theirs"].append(row["sps"])
                rows["compile_s"].append(row["compile_s"])
                print(f"{name} round {k + 1}: ours {sps:,.0f}, theirs {row['sps']:,.0f} env-steps/s", flush=True)
            med = {k: statistics.median(v) for k, v in rows.items()}
            report["pairs"][name] = {"runs": rows, "median": med, "ratio": med["ours"] / med["theirs"],
                                     "ours_command": command, "theirs_command": row["command"],
                                     "our_steps": our_steps, "their_steps": their_steps}  # fmt: skip
    report["load_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "jaxmarl_cuda" if args.cuda else "jaxmarl"
    report["cuda"] = args.cuda
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))


def markdown(r):
    load = lambda x: ", ".join(f"{v:.1f}" for v in x)  # noqa: E731
    lines = [
        "# Our PPO scripts against JaxMARL, side by side (env-steps/s, "
        + ("both on the GPU, one CPU thread for ours)" if r.get("cuda") else "one thread each)")
        + f": {r['cpu']}",
        "",
        f"Measured {r['date']} on {r['cpu']} ({r['cores']} cores), load average {load(r['load_before'])} before and "
        f"{load(r['load_after'])} after. Regenerate: `{r['command'].strip()}` (settings: the script's docstring).",
        "",
        "| pair | ours (median) | JaxMARL (median) | ours / JaxMARL | our first iteration | JaxMARL compile "
        "| ours, whole run | rounds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, p in r["pairs"].items():
        m = p["median"]
        rounds = len(p["runs"]["ours"])
        lines.append(f"| {name} | {m['ours']:,.0f} | {m['theirs']:,.0f} | **{p['ratio']:.2f}x** | "
                     f"{m['first_iteration_s']:.1f} s | {m['compile_s']:.1f} s | {m['sps_whole_run']:,.0f} | "
                     f"{rounds} |")  # fmt: skip
    lines += ["", "Start-up apart on both sides: ours after its first iteration, theirs after compiling. "
              "'ours, whole run': our env-steps/s with the first iteration inside.", "",
              "Commands (ours, then theirs, alternating):", ""]  # fmt: skip
    for name, p in r["pairs"].items():
        lines += [f"* {name}: `python {p['ours_command']}` ({p['our_steps']:,} steps); "
                  f"`python {p['theirs_command']}` ({p['their_steps']:,} steps)"]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
