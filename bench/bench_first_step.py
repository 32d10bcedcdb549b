"""A fresh clone's wait before its first training step: the README's main job, cold (Numba's cache empty, as after
`git clone` and the install) against warm (the same clone's next run).

    python bench/bench_first_step.py            # writes results/speed/first_step.md and first_step.json

The clone is `git clone` of this checkout's HEAD into a temporary folder, with the built Cython extension copied in
(what `pip install -e .` builds there: the install is excluded), run by this interpreter with the clone first on
sys.path. Each run is the README's main job, `python algos/mappo.py --env-id simple_spread_v3`, stopped after its
first training iteration (--total-timesteps one rollout, --final-eval-episodes 0). Its time to the first step is
from the process's start to the wall time of its first `charts/SPS` scalar, which the script writes once the
first rollout and update are done. A cold run empties the clone's Numba caches (`__pycache__/*.nbi, *.nbc`) first,
a warm run finds them. The warm run is the reference measured in the same run: cold / warm is the fresh install's
extra wait. The table also says whether the run printed its one line about compiling (cold runs must, warm must
not), and holds the previous measurement beside this one, so a change that makes the wait grow shows. One more cold
run under Numba's compile events says where the cold wait goes: each compiled function's own seconds (its callees'
compiles subtracted), grouped.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from host import cpu_name, out_folder
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
KEPT = ("date", "commit", "median_first_step_s", "cold_over_warm", "load_average_before")  # of the previous report
MESSAGE = "compiling the Numba kernels"  # runtime.setup's line on a cold cache


# run in the clone: the main job with a listener on Numba's compile events, printing {function: own seconds} as JSON
RECORDER = """
import json, runpy, sys, time
import numba.core.event as event
own, stack = {}, []
class Recorder(event.Listener):
    def on_start(self, e):
        stack.append([time.perf_counter(), 0.0])
    def on_end(self, e):
        start, children = stack.pop()
        f = e.data["dispatcher"].py_func
        name, took = f"{f.__module__}.{f.__qualname__}", time.perf_counter() - start
        own[name] = own.get(name, 0.0) + took - children
        if stack:
            stack[-1][1] += took
event.register("numba:compile", Recorder())
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("COMPILE-TIMES " + json.dumps(own))
"""


OTHER_SCENARIOS = ("simple", "reference", "speaker_listener", "adversary", "tag", "push", "crypto", "world_comm")
GROUPS = (
    ("envs.mpe.", "MPE kernels and physics"),
    ("runtime.", "the acting pass (runtime/mlp.py)"),
    ("buffers.", "the buffers' kernels (GAE)"),
    ("numba.", "Numba's own overloads (np.zeros, str, ...)"),
)


def group_of(function):
    """The part of the code a compiled function belongs to, for the breakdown of the cold wait: the MPE scenario
    functions of simple_spread (and the dispatchers and helpers every scenario shares) apart from the 8 others'."""
    if function.startswith("envs.mpe.scenarios."):
        name = function.rsplit(".", 1)[1]
        other = any(name.endswith("_" + s) for s in OTHER_SCENARIOS) or "adversar" in name or "crypto" in name
        return "MPE scenarios: the 8 others' functions" if other else "MPE scenarios: simple_spread's, and shared"
    return next((group for prefix, group in GROUPS if function.startswith(prefix)), "other")


def first_scalar_time(run_dir, tag="charts/SPS"):
    """The wall time (seconds since the epoch) of the first `tag` event in a run directory's TensorBoard log."""
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    if tag not in ea.Tags()["scalars"]:
        raise RuntimeError(f"{run_dir} logged no {tag}: the run did not finish its first iteration")
    return min(e.wall_time for e in ea.Scalars(tag))


def empty_numba_caches(clone):
    """Remove every Numba cache file under the clone (Numba keeps them beside each module, in __pycache__)."""
    for f in [*clone.rglob("__pycache__/*.nbi"), *clone.rglob("__pycache__/*.nbc")]:
        f.unlink()


def make_clone(tmp):
    """A fresh clone of HEAD with the Cython extension this checkout built copied in (the install's product)."""
    clone = Path(tmp) / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    for built in (ROOT / "buffers").glob("segment_tree*.so"):
        shutil.copy(built, clone / "buffers" / built.name)
    return clone


def one_iteration():
    """mappo.py's default rollout size (--num-envs x --num-steps): the budget of one training iteration."""
    sys.path.insert(0, str(ROOT / "algos"))
    import mappo

    args = mappo.Args()
    return args.num_envs * args.num_steps


def clone_env(clone):
    """The environment of a run in the clone: its modules first on the path, Numba's cache beside them."""
    return {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | {"PYTHONPATH": str(clone)}


def run_once(clone, steps, run_dir, cold):
    """One main job in the clone: (seconds to the first training step, seconds in all, printed the compile line)."""
    if cold:
        empty_numba_caches(clone)
    env = clone_env(clone)
    cmd = [sys.executable, "algos/mappo.py", "--env-id", "simple_spread_v3", "--total-timesteps", str(steps),
           "--final-eval-episodes", "0", "--run-dir", str(run_dir)]  # fmt: skip
    start = time.time()
    proc = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True)
    total = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    if not any(clone.rglob("__pycache__/*.nbi")):  # the kernels came from another checkout's modules, not the clone's
        raise RuntimeError(f"the run wrote no Numba cache in {clone}: it did not import the clone's modules")
    return first_scalar_time(run_dir) - start, total, MESSAGE in proc.stdout


def compile_breakdown(clone, steps, run_dir):
    """A cold run under the compile-event recorder: {group: own compile seconds}, the functions' own seconds, and
    that run's time to its first step (the recorder slows it)."""
    empty_numba_caches(clone)
    env = clone_env(clone)
    cmd = [sys.executable, "-c", RECORDER, "algos/mappo.py", "--env-id", "simple_spread_v3", "--total-timesteps",
           str(steps), "--final-eval-episodes", "0", "--run-dir", str(run_dir)]  # fmt: skip
    start = time.time()
    proc = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("COMPILE-TIMES ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"the recorded cold run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    own = json.loads(line.split(" ", 1)[1])
    groups = {}
    for function, seconds in own.items():
        groups[group_of(function)] = groups.get(group_of(function), 0.0) + seconds
    first = first_scalar_time(run_dir) - start
    return dict(sorted(groups.items(), key=lambda kv: -kv[1])), dict(sorted(own.items(), key=lambda kv: -kv[1])), first


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="cold and warm runs each, interleaved")
    parser.add_argument("--out", type=out_folder, default=OUT)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats} must be at least 1")
    previous_file = args.out / "first_step.json"
    previous = json.loads(previous_file.read_text()) if previous_file.is_file() else None
    steps, load_before, runs = one_iteration(), os.getloadavg(), {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        clone = make_clone(tmp)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
        for r in range(args.repeats):
            for kind in ("cold", "warm"):  # a warm run right after a cold one finds the caches it wrote
                first, total, said = run_once(clone, steps, Path(tmp) / f"{kind}{r}", cold=kind == "cold")
                runs[kind].append(dict(first_step_s=round(first, 2), process_s=round(total, 2), compile_line=said))
                print(f"{kind}: first step after {first:.1f} s ({total:.1f} s in all), compile line: {said}")
        groups, functions, recorded_first = compile_breakdown(clone, steps, Path(tmp) / "recorded")
    median = {k: statistics.median(r["first_step_s"] for r in v) for k, v in runs.items()}
    report = dict(date=date.today().isoformat(), cpu=cpu_name(), cores=os.cpu_count(), python=platform.python_version(),
                  torch=torch.__version__, commit=commit, load_average_before=load_before, load_average=os.getloadavg(),
                  command=" ".join(["python bench/bench_first_step.py", *sys.argv[1:]]), steps=steps, runs=runs,
                  compile_s_by_group=groups, compile_s_by_function=functions,
                  recorded_first_step_s=round(recorded_first, 2),
                  median_first_step_s=median, cold_over_warm=median["cold"] / median["warm"],
                  previous=previous and {k: previous[k] for k in KEPT})  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    previous_file.write_text(json.dumps(report, indent=2) + "\n")
    load = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    lines = [
        "# A fresh clone's wait before its first training step",
        "",
        f"Measured {report['date']} on {report['cpu']} ({report['cores']} cores), commit {commit[:7]}, torch "
        f"{report['torch']}; load average {load(load_before)} before and {load(report['load_average'])} after. "
        f"Regenerate: `{report['command']}`.",
        "The README's main job (`python algos/mappo.py --env-id simple_spread_v3`) in a fresh clone, stopped after "
        f"its first iteration ({steps:,} env steps); install excluded. First step: from the process's start to its "
        "first `charts/SPS` (first rollout and update done). Cold: Numba's caches empty (a fresh install's first "
        "run); warm: the next run, which loads them. Runs interleaved, cold then warm.",
        "",
        "| run | first step (s), median | each run: first step / whole process (s) | printed the compile line |",
        "|---|---|---|---|",
    ]
    for kind, rows in runs.items():
        each = "; ".join(f"{r['first_step_s']:.1f} / {r['process_s']:.1f}" for r in rows)
        said = ", ".join("yes" if r["compile_line"] else "no" for r in rows)
        lines.append(f"| {kind} | {median[kind]:.1f} | {each} | {said} |")
    lines += ["", f"Cold / warm: **{report['cold_over_warm']:.2f}x** (the wait a fresh install adds once)."]
    total = sum(groups.values())
    lines += ["", f"Where a cold run's wait goes: one more cold run under Numba's compile events (slower: its first "
              f"step came after {recorded_first:.1f} s) spent {total:.1f} s compiling; each compiled function's own "
              "time (its callees' compiles subtracted), by part:", "",
              "| part | compile (s) | share |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {group} | {sec:.1f} | {sec / total:.0%} |" for group, sec in groups.items()]
    top = ", ".join(f"{f.removeprefix('envs.mpe.')} {sec:.1f} s" for f, sec in list(functions.items())[:6])
    lines += ["", f"The costliest functions: {top}."]
    if previous:
        lines.append("")
        was = previous["median_first_step_s"]
        lines.append(
            f"Previous measurement ({previous['date']}, commit {previous['commit'][:7]}, load average "
            f"{load(previous['load_average_before'])} before): cold {was['cold']:.1f} s, warm {was['warm']:.1f} s, "
            f"cold / warm {previous['cold_over_warm']:.2f}x; now / then, cold {median['cold'] / was['cold']:.2f}x, "
            f"warm {median['warm'] / was['warm']:.2f}x."
        )
    (args.out / "first_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
