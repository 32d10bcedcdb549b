"""Every script of algos/ trained with --cuda, and its checkpoint played back on the GPU and on the CPU.

    python bench/cuda_check.py                # on a machine with a CUDA device: writes results/speed/cuda_check.md
    python bench/cuda_check.py --workers 8 --algos mappo,maddpg

For each script (each on its default task, a few hundred env steps: enough for the first updates): one training run
with `--cuda` (must exit 0 with finite losses: the scripts stop on a non-finite one), then its `last.pt` played
greedily with `--eval-checkpoint` twice, once with `--cuda` and once on the CPU, on the same fixed episodes. The two
returns must agree: a checkpoint written on a GPU reloads on a machine without one and acts alike. (Greedy actions
are argmaxes of float32 outputs: a GPU and a CPU may round a near-tie apart, so the table reports the difference
rather than demanding zero.) `--cpu` runs the same check without --cuda on both sides, to test the script here.

On a machine that has torch, numba and Cython but not the rest (the lent H200 machines: Python 3.12, no network),
carry the missing packages as wheels downloaded where pip works (`pip download --no-deps --only-binary=:all:
--python-version 3.12 --platform manylinux2014_x86_64 --platform any -d .whl gymnasium pettingzoo mpe2 magent2 tyro
docstring_parser typeguard shtab Farama-Notifications pygame-ce`, the versions of this checkout's environment), then
there: `pip install --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:$PWD;
python setup.py build_ext --inplace; python bench/cuda_check.py --workers 10`. For bench/bench_jaxmarl.py
--cuda add the wheels of ../shared/peers/README.md's install line and the packages they need (jaxmarl, distrax,
tfp-nightly, gymnax, dm-tree, gast, decorator, hydra-core, omegaconf, antlr4-python3-runtime 4.9.3).
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from host import out_file

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
OFF_POLICY = ["--learning-starts", "200", "--batch-size", "16", "--total-timesteps", "600"]
EPISODIC = ["--learning-starts", "200", "--batch-size", "4", "--total-timesteps", "800"]
CHECKS = {  # name -> (script, flags besides the run dir); each script on its default task
    "mappo": ("mappo", ["--num-steps", "50", "--total-timesteps", "400"]),
    "mappo --rnn": ("mappo", ["--num-steps", "50", "--total-timesteps", "400", "--rnn"]),
    "ippo": ("ippo", ["--num-steps", "50", "--total-timesteps", "400"]),
    "maddpg": ("maddpg", OFF_POLICY),
    "matd3": ("matd3", OFF_POLICY),
    "iddpg": ("iddpg", OFF_POLICY),
    "masac": ("masac", OFF_POLICY),
    "isac": ("isac", OFF_POLICY),
    "iql": ("iql", EPISODIC),
    "vdn": ("vdn", EPISODIC),
    "qmix": ("qmix", EPISODIC),
    "wqmix": ("wqmix", EPISODIC),
    "coma": ("coma", ["--num-steps", "25", "--total-timesteps", "400"]),
    "vdac": ("vdac", ["--num-steps", "25", "--total-timesteps", "400"]),
    "qtran": ("qtran", EPISODIC),
    "dcg": ("dcg", EPISODIC),
    "happo": ("happo", ["--num-steps", "25", "--total-timesteps", "400"]),
    "commnet": ("commnet", ["--num-steps", "25", "--total-timesteps", "400"]),
    "ic3net": ("ic3net", ["--num-steps", "25", "--total-timesteps", "400"]),
    "tarmac": ("tarmac", ["--num-steps", "25", "--total-timesteps", "400"]),
    "mfq": ("mfq", ["--learning-starts", "40", "--batch-size", "4", "--total-timesteps", "120"]),
    "mfac": ("mfac", ["--total-timesteps", "120"]),
    "ppo": ("ppo", ["--num-steps", "32", "--total-timesteps", "256"]),
    "dqn": ("dqn", ["--learning-starts", "100", "--batch-size", "16", "--total-timesteps", "400"]),
    "drqn": ("drqn", ["--learning-starts", "120", "--batch-size", "4", "--total-timesteps", "400"]),
}  # fmt: skip
COMMON = ["--num-envs", "2", "--eval-interval", "0", "--eval-episodes", "4", "--final-eval-episodes", "4",
          "--torch-threads", "1"]  # fmt: skip
RETURN = re.compile(r"episodic return (-?[\d.]+(?:e[-+]?\d+)?|nan)")


def call(cmd, timeout):
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired:
        return "timeout", "", time.perf_counter() - start


def check(name, workdir, cuda, timeout):
    """One row: train with --cuda, then play last.pt on the GPU and on the CPU."""
    script, flags = CHECKS[name]
    run_dir = Path(workdir) / name.replace(" ", "").replace("-", "_")
    base = [sys.executable, str(ROOT / "algos" / f"{script}.py"), *COMMON]
    gpu = ["--cuda"] if cuda else []
    row = {"check": name, "command": " ".join([f"algos/{script}.py", *COMMON, *flags, *gpu])}
    rc, out, row["train_s"] = call([*base, *flags, *gpu, "--run-dir", str(run_dir)], timeout)
    row["train_rc"] = rc
    if rc != 0:
        row["error"] = out.strip().splitlines()[-1] if out.strip() else str(rc)
        return row
    for side, extra in (("gpu", gpu), ("cpu", [])):
        rc, out, _ = call([*base, *flags, *extra, "--eval-checkpoint", str(run_dir / "last.pt")], timeout)
        found = RETURN.search(out)
        row[f"{side}_return"] = float(found.group(1)) if rc == 0 and found else None
        if rc != 0 or not found:
            row["error"] = f"eval on {side}: " + (out.strip().splitlines()[-1] if out.strip() else str(rc))
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default=",".join(CHECKS), help="comma-separated checks: " + ", ".join(CHECKS))
    parser.add_argument("--workers", type=int, default=1, help="checks run side by side (each one process)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per command before it counts as failed")
    parser.add_argument("--cpu", action="store_true", help="leave out --cuda (tests this script without a GPU)")
    parser.add_argument("--out", type=out_file, default=str(OUT / "cuda_check"), help="report path, without .md/.json")
    args = parser.parse_args()
    names = args.algos.split(",")
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        parser.error(f"unknown check(s) {unknown}: choose from {', '.join(CHECKS)}")
    import torch

    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it on a machine with one, or pass --cpu to test the script")
    device = "CPU" if args.cpu else torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(lambda n: check(n, workdir, not args.cpu, args.timeout), names))
    command = " ".join(["python bench/cuda_check.py", *sys.argv[1:]])
    lines = [f"# Every script with --cuda, its checkpoint played on the GPU and on the CPU ({device})", "",
             f"`{command}`, torch {torch.__version__}. "
             "A row passes when training exits 0 and both plays of `last.pt` print a return.", "",
             "| check | trained (s) | return, GPU | return, CPU | result |", "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ok = "error" not in r
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append(f"| {r['check']} | {r['train_s']:.1f} | {fmt(r.get('gpu_return'))} | "
                     f"{fmt(r.get('cpu_return'))} | {'ok' if ok else r['error'][:160]} |")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    report = {"device": device, "torch": torch.__version__, "rows": rows}
    Path(args.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
