"""Speed of the Numba Level-Based Foraging (`envs.foraging_numba`) against lbforaging and Jumanji, on one core.

    python results/bench_foraging.py          # writes results/speed/foraging.md and foraging.json

For each of the EPyMARL benchmark's LBF tasks (envs/foraging.py), random actions drawn beforehand, 50-step
episodes with resets:

* lbforaging 2.0.0: its ForagingEnv, one env, reset when an episode ends (the package has no vector form);
* ours: `ForagingVecEnv` at 1, 64 and 1024 envs, auto-reset and episode statistics included;
* Jumanji (if installed): `LevelBasedForaging` with the same grid, agents, foods, sight, levels and time limit,
  1024 envs under `VmapAutoResetWrapper`, steps run by a jitted `lax.scan` over the pre-drawn actions (its fastest
  form; the compile is not timed). JAX may use every core it sees; the process is pinned to one.

env-steps/s counts one env advancing one step. Each figure is the best of `--repeats` rounds of about
`--seconds` s (results/bench_numba_mpe.py's `best_rate`: other load only ever slows a round down).
"""

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from importlib.metadata import PackageNotFoundError, version  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_numba_mpe import best_rate, machine  # noqa: E402

from envs.foraging import TASKS, task_kwargs  # noqa: E402
from envs.foraging_numba import ForagingVecEnv  # noqa: E402

SIZES = (1, 64, 1024)
GOAL = 200  # issue 42: at least 200x the package at 1024 envs
OUT = Path(__file__).resolve().parent / "speed"


def bench_package(task: str, seconds: float, repeats: int) -> float:
    from lbforaging.foraging.environment import ForagingEnv

    env = ForagingEnv(**task_kwargs(task), max_episode_steps=50)
    env.reset(seed=0)
    table = np.random.default_rng(0).integers(0, 6, (4096, env.n_agents)).tolist()
    t = [0]

    def run(n):
        for _ in range(n):
            if env.step(table[t[0] % 4096])[2]:
                env.reset()
            t[0] += 1
        return n

    return best_rate(run, seconds, repeats)


def bench_ours(task: str, num_envs: int, seconds: float, repeats: int) -> float:
    env = ForagingVecEnv(task, num_envs, seed=0)
    env.reset()
    table = np.random.default_rng(0).integers(0, 6, (64, num_envs, env.task.players))
    t = [0]

    def run(n):
        for _ in range(n):
            env.step({"agent": table[t[0] % 64]})
            t[0] += 1
        return n * num_envs

    return best_rate(run, seconds, repeats)


def bench_jumanji(task: str, num_envs: int, seconds: float, repeats: int) -> float | None:
    try:
        import jax
        from jumanji.environments.routing.lbf import LevelBasedForaging
        from jumanji.environments.routing.lbf.generator import RandomGenerator
        from jumanji.wrappers import VmapAutoResetWrapper
    except ImportError:
        return None
    kw = task_kwargs(task)
    generator = RandomGenerator(grid_size=kw["field_size"][0], num_agents=kw["players"], num_food=kw["max_num_food"],
                                fov=kw["sight"], max_agent_level=2, force_coop=kw["force_coop"])  # fmt: skip
    env = VmapAutoResetWrapper(LevelBasedForaging(generator=generator, time_limit=50))
    steps = 64
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    state, _ = jax.jit(env.reset)(keys)
    actions = jax.random.randint(jax.random.PRNGKey(1), (steps, num_envs, kw["players"]), 0, 6)

    @jax.jit
    def rollout(state):
        return jax.lax.scan(lambda s, a: (env.step(s, a)[0], None), state, actions)[0]

    box = [jax.block_until_ready(rollout(state))]  # compile

    def run(n):
        for _ in range(n):
            box[0] = rollout(box[0])
        jax.block_until_ready(box[0])
        return n * steps * num_envs

    return best_rate(run, seconds, repeats)


def package_versions() -> dict:
    out = {}
    for name in ("lbforaging", "jumanji", "jax", "numba", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def markdown(report: dict) -> str:
    lines = [
        "# Level-Based Foraging: the Numba port against the package and Jumanji",
        "",
        f"Measured {report['date']} on {report['machine']['cpu']} ({report['machine']['logical_cores']} cores), one "
        f"core, versions {report['versions']}, load average {', '.join(f'{x:.1f}' for x in report['load_average'])} "
        f"at the end (another process ran on the other core). Regenerate: `{report['command']}`.",
        "",
        "env-steps/s (one env advancing one step), random actions drawn beforehand, 50-step episodes with resets; the "
        "best of the timed rounds. Ours and the package step the same rules bit for bit "
        "(tests/test_foraging_numba.py); Jumanji's LevelBasedForaging is its own JAX implementation of the game.",
        "",
        "| task | lbforaging (1 env) | ours, 1 env | ours, 64 | ours, 1024 | Jumanji, 1024 | ours / package at "
        "1024 | ours / Jumanji at 1024 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        jx = row["jumanji_1024"]
        ours = row["ours"]
        ratio = ours["1024"] / row["package"]
        cells = [f"{row['package']:,.0f}", *(f"{ours[str(n)]:,.0f}" for n in SIZES)]
        cells += [f"{jx:,.0f}" if jx else "—", f"**{ratio:,.0f}x**", f"{ours['1024'] / jx:.2f}x" if jx else "—"]
        lines.append(f"| {row['task']} | " + " | ".join(cells) + " |")
    worst = min(r["ours"]["1024"] / r["package"] for r in report["rows"])
    verdict = "met" if worst >= GOAL else "not met"
    goal = f"Goal: at least {GOAL}x the package at 1024 envs on every task: {verdict} (lowest {worst:,.0f}x)."
    lines += ["", goal, ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per timed round")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per figure (the best counts)")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated LBF tasks")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rows = []
    for task in args.tasks.split(","):
        row = {"task": task, "package": bench_package(task, args.seconds, args.repeats)}
        row["ours"] = {str(n): bench_ours(task, n, args.seconds, args.repeats) for n in SIZES}
        row["jumanji_1024"] = bench_jumanji(task, 1024, args.seconds, args.repeats)
        rows.append(row)
        print(task, f"package {row['package']:,.0f}", {k: f"{v:,.0f}" for k, v in row["ours"].items()},
              f"jumanji {row['jumanji_1024'] or 0:,.0f}", flush=True)  # fmt: skip
    report = dict(date=datetime.date.today().isoformat(), machine=machine(), versions=package_versions(),
                  command="python results/bench_foraging.py " + " ".join(sys.argv[1:]), rows=rows,
                  load_average=os.getloadavg())  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "foraging.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "foraging.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
