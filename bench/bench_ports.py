"""Speed of our Numba ports of Level-Based Foraging and the Multi-Robot Warehouse against their packages and
Jumanji's JAX versions, on one core.

    python bench/bench_ports.py                 # writes results/speed/foraging.md and warehouse.md (+ .json)
    python bench/bench_ports.py --family lbf    # one of them

For each of the EPyMARL benchmark's tasks (envs/foraging.py, envs/warehouse.py), random actions drawn beforehand,
episodes at the time limit (LBF 50, RWARE 500 steps) with resets:

* the package (lbforaging 2.0.0's ForagingEnv, rware 2.0.0's Warehouse): one env, reset when an episode ends (the
  packages have no vector form);
* ours (`ForagingVecEnv`, `WarehouseVecEnv`) at 1, 64 and 1024 envs, auto-reset and episode statistics included;
* Jumanji (if installed): `LevelBasedForaging` / `RobotWarehouse` with the same grid, agents, foods or shelves,
  sight and time limit, 1024 envs under `VmapAutoResetWrapper`, steps run by a jitted `lax.scan` over the pre-drawn
  actions (its fastest form; the compile is not timed). JAX may use every core it sees; the process is pinned to
  one.

env-steps/s counts one env advancing one step. Each figure is the best of `--repeats` rounds of about
`--seconds` s (bench/bench_numba_mpe.py's `best_rate`: other load only ever slows a round down), the rounds of a
task's figures interleaved so that load on a shared machine falls on all of them alike.
"""

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
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
from host import out_folder, positive  # noqa: E402

from envs import foraging, warehouse  # noqa: E402
from envs.foraging_numba import ForagingVecEnv  # noqa: E402
from envs.warehouse_numba import WarehouseVecEnv  # noqa: E402

SIZES = (1, 64, 1024)
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
FAMILIES = {  # name -> (tasks, actions, our VecEnv, goal at 1024 envs (issue 42), page, title)
    "lbf": (foraging.TASKS, 6, ForagingVecEnv, 200, "foraging", "Level-Based Foraging"),
    "rware": (warehouse.TASKS, 5, WarehouseVecEnv, 100, "warehouse", "the Multi-Robot Warehouse"),
}


def package_env(family: str, task: str):
    if family == "lbf":
        from lbforaging.foraging.environment import ForagingEnv

        return ForagingEnv(**foraging.task_kwargs(task), max_episode_steps=50)
    from rware.warehouse import Warehouse

    return Warehouse(**{**warehouse.task_kwargs(task), "max_steps": 500})


def bench_package(family: str, task: str, seconds: float, repeats: int) -> float:
    env = package_env(family, task)
    env.reset(seed=0)
    table = np.random.default_rng(0).integers(0, FAMILIES[family][1], (4096, env.n_agents)).tolist()
    t = [0]

    def run(n):
        for _ in range(n):
            if env.step(table[t[0] % 4096])[2]:
                env.reset()
            t[0] += 1
        return n

    return best_rate(run, seconds, repeats)


def bench_ours(family: str, task: str, num_envs: int, seconds: float, repeats: int) -> float:
    _, actions, vec_env, *_ = FAMILIES[family]
    env = vec_env(task, num_envs, seed=0)
    env.reset()
    table = np.random.default_rng(0).integers(0, actions, (64, num_envs, env.groups["agent"].n_agents))
    t = [0]

    def run(n):
        for _ in range(n):
            env.step({"agent": table[t[0] % 64]})
            t[0] += 1
        return n * num_envs

    return best_rate(run, seconds, repeats)


def jumanji_env(family: str, task: str):
    """Jumanji's version of a task (same sizes, agents, items, sight and time limit), and its agents."""
    if family == "lbf":
        from jumanji.environments.routing.lbf import LevelBasedForaging
        from jumanji.environments.routing.lbf.generator import RandomGenerator

        kw = foraging.task_kwargs(task)
        generator = RandomGenerator(
            grid_size=kw["field_size"][0],
            num_agents=kw["players"],
            num_food=kw["max_num_food"],
            fov=kw["sight"],
            max_agent_level=2,
            force_coop=kw["force_coop"],
        )
        return LevelBasedForaging(generator=generator, time_limit=50), kw["players"]
    from jumanji.environments.routing.robot_warehouse import RobotWarehouse
    from jumanji.environments.routing.robot_warehouse.generator import RandomGenerator

    kw = warehouse.task_kwargs(task)
    generator = RandomGenerator(
        shelf_rows=kw["shelf_rows"],
        shelf_columns=kw["shelf_columns"],
        column_height=kw["column_height"],
        num_agents=kw["n_agents"],
        sensor_range=kw["sensor_range"],
        request_queue_size=kw["request_queue_size"],
    )
    return RobotWarehouse(generator=generator, time_limit=500), kw["n_agents"]


def bench_jumanji(family: str, task: str, num_envs: int, seconds: float, repeats: int) -> float | None:
    try:
        import jax
        from jumanji.wrappers import VmapAutoResetWrapper
    except ImportError:
        return None
    base, agents = jumanji_env(family, task)
    env = VmapAutoResetWrapper(base)
    steps = 64
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    state, _ = jax.jit(env.reset)(keys)
    actions = jax.random.randint(jax.random.PRNGKey(1), (steps, num_envs, agents), 0, FAMILIES[family][1])

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
    for name in ("lbforaging", "rware", "jumanji", "jax", "numba", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def markdown(report: dict) -> str:
    _, _, _, goal_x, _, title = FAMILIES[report["family"]]
    package = "lbforaging" if report["family"] == "lbf" else "rware"
    lines = [
        f"# {title[0].upper() + title[1:]}: the Numba port against the package and Jumanji",
        "",
        f"Measured {report['date']} on {report['machine']['cpu']} ({report['machine']['logical_cores']} cores), one "
        f"core, versions {report['versions']}, load average {', '.join(f'{x:.1f}' for x in report['load_average'])} "
        f"at the end (another process ran on the other core). Regenerate: `{report['command']}`.",
        "",
        "env-steps/s (one env advancing one step), random actions drawn beforehand, episodes to the time limit with "
        "resets; the best of the timed rounds. Ours and the package step the same rules bit for bit "
        f"(tests/test_{FAMILIES[report['family']][4]}_numba.py); Jumanji's version is its own JAX implementation.",
        "",
        f"| task | {package} (1 env) | ours, 1 env | ours, 64 | ours, 1024 | Jumanji, 1024 | ours / package at "
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
    verdict = "met" if worst >= goal_x else "not met"
    goal = f"Goal: at least {goal_x}x the package at 1024 envs on every task: {verdict} (lowest {worst:,.0f}x)."
    lines += ["", goal, ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["lbf", "rware", "both"], default="both")
    parser.add_argument("--seconds", type=positive(float), default=1.0, help="seconds per timed round")
    parser.add_argument("--repeats", type=positive(int), default=3, help="timed rounds per figure (the best counts)")
    parser.add_argument("--out", type=out_folder, default=OUT)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for family in ["lbf", "rware"] if args.family == "both" else [args.family]:
        rows = []
        for task in FAMILIES[family][0]:
            # the figures interleaved, one round each per pass: load on a shared machine falls on all of them alike
            row = {"task": task, "package": 0.0, "ours": {str(n): 0.0 for n in SIZES}, "jumanji_1024": None}
            for _ in range(args.repeats):
                row["package"] = max(row["package"], bench_package(family, task, args.seconds, 1))
                for n in SIZES:
                    row["ours"][str(n)] = max(row["ours"][str(n)], bench_ours(family, task, n, args.seconds, 1))
                jx = bench_jumanji(family, task, 1024, args.seconds, 1)
                row["jumanji_1024"] = None if jx is None else max(row["jumanji_1024"] or 0.0, jx)
            rows.append(row)
            print(
                task,
                f"package {row['package']:,.0f}",
                {k: f"{v:,.0f}" for k, v in row["ours"].items()},
                f"jumanji {row['jumanji_1024'] or 0:,.0f}",
                flush=True,
            )
        report = dict(
            date=datetime.date.today().isoformat(),
            machine=machine(),
            versions=package_versions(),
            command="python bench/bench_ports.py " + " ".join(sys.argv[1:]),
            family=family,
            rows=rows,
            load_average=os.getloadavg(),
        )
        page = FAMILIES[family][4]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{page}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"{page}.md").write_text(markdown(report))
        print(markdown(report))


if __name__ == "__main__":
    main()
