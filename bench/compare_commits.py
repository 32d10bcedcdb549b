"""Did a change alter training? Run scripts at two commits side by side: losses bit-identical, speed ratio.

    python bench/compare_commits.py --base daca779 --algos mappo,maddpg --seconds 100 --until 200000

For each script, the command `python algos/<algo>.py --seed 0 --torch-threads 1 --run-dir DIR` (every other flag at
its default: the published settings) runs for --seconds at --base (in a git worktree) and then at the working tree,
one after the other, and is stopped with SIGINT (both versions save and exit on it); before it, an untimed run of
--warmup seconds fills each tree's Numba cache (keyed by source path: the base worktree starts cold, and its first
timed run would pay every kernel's compilation). Then:

* every `losses/*` scalar at steps <= --until must be bit-identical (bench/compare_losses.py);
* the speed ratio is the last `charts/SPS` of the working tree over that of --base (one run each, so only a rough
  figure on a shared machine; evaluations run inside both).

Writes results/speed/compare_commits.md. The base worktree gets the compiled segment tree of this checkout (the .pyx
is assumed unchanged in between).
"""

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compare_losses import losses
from host import out_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]


def run(tree: Path, algo: str, run_dir: Path, seconds: float) -> None:
    cmd = [sys.executable, "algos/" + f"{algo}.py", "--seed", "0", "--torch-threads", "1", "--run-dir", str(run_dir)]
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    log = run_dir.with_suffix(".log")  # a file, not a pipe: a full pipe would stall the run's progress bar
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    if proc.returncode not in (0, 130):
        raise SystemExit(f"{algo} at {tree} failed ({proc.returncode}): {log.read_text()[-1000:]}")


def last_sps(run_dir: Path) -> float:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc.Scalars("charts/SPS")[-1].value


def compare(a: Path, b: Path, until: int) -> str:
    """The losses of both runs up to `until`, or up to the last step the shorter run logged (a slow script may not
    reach `until` in --seconds, and the two runs seldom stop at the same step)."""
    la, lb = losses(str(a), until), losses(str(b), until)
    if set(la) != set(lb) or not la:
        return f"different loss tags: {sorted(set(la) ^ set(lb))}"
    common = min(max(s for v in run.values() for s, _ in v) for run in (la, lb))
    la, lb = ({tag: [(s, x) for s, x in v if s <= common] for tag, v in run.items()} for run in (la, lb))
    n = 0
    for tag in sorted(la):
        if la[tag] != lb[tag]:
            return f"{tag} differs ({len(la[tag])} vs {len(lb[tag])} points)"
        n += len(la[tag])
    return f"identical ({len(la)} tags, {n} values, steps <= {max(s for v in la.values() for s, _ in v)})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the commit to compare with")
    p.add_argument("--algos", default="mappo,maddpg")
    p.add_argument("--seconds", type=float, default=100.0, help="wall time of each run before SIGINT")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds of an untimed run of each tree first (Numba "
                   "caches its kernels per source path: the base worktree starts cold)")  # fmt: skip
    p.add_argument("--until", type=int, default=200_000, help="compare the losses of the steps up to this one")
    p.add_argument("--out", type=out_file, default=str(ROOT / "results" / "speed" / "compare_commits.md"))
    p.add_argument("--keep", action="store_true", help="keep the run directories (printed) for a closer look")
    a = p.parse_args()
    if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{a.base}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode:  # fmt: skip
        p.error(f"--base {a.base}: not a commit of this repository (git log --oneline lists them)")
    work = Path(tempfile.mkdtemp(prefix="compare_commits_"))
    base = work / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), a.base], cwd=ROOT, check=True, capture_output=True)
    try:
        for so in (ROOT / "buffers").glob("segment_tree*.so"):
            shutil.copy(so, base / "buffers")
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        rows = []
        for algo in a.algos.split(","):
            dirs = {name: work / f"{algo}_{name}" for name in ("base", "head")}
            for tree in (base, ROOT):  # untimed: Numba compiles each tree's kernels into its own cache first
                run(tree, algo, work / f"{algo}_warm_{tree.name}", a.warmup)
            run(base, algo, dirs["base"], a.seconds)
            run(ROOT, algo, dirs["head"], a.seconds)
            verdict = compare(dirs["base"], dirs["head"], a.until)
            sps = {name: last_sps(d) for name, d in dirs.items()}
            rows.append(f"| {algo} | {verdict} | {sps['base']:,.0f} | {sps['head']:,.0f} | "
                        f"{sps['head'] / sps['base']:.2f} |")  # fmt: skip
            print(rows[-1], flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
        if a.keep:
            print(f"run directories kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    text = [
        "# Training before and after a change",
        "",
        f"Generated by `python bench/compare_commits.py {' '.join(sys.argv[1:])}` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: `--base` {a.base} against the working tree at "
        f"{head.stdout.strip()}. Each script ran with seed 0 and its default (published) flags for {a.seconds:.0f} s, "
        f"one thread, one run after the other, then stopped by SIGINT, each after an untimed {a.warmup:.0f} s run of "
        "the same tree (Numba's kernel cache filled). Losses: every `losses/*` scalar up to step "
        f"{a.until:,}. SPS: the last `charts/SPS` of each run (one run each: a rough figure on a shared machine).",
        "",
        "| script | losses | SPS before | SPS after | after / before |",
        "|---|---|---:|---:|---:|",
        *rows,
    ]
    Path(a.out).write_text("\n".join(text) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
