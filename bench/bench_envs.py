"""Speed of the `envs` vector envs: wrapper overhead, sync vs subprocess, and MAgent2 battle.

    python bench/bench_envs.py            # writes results/speed/envs.md and envs.json

Measured in one run, with the same pre-drawn random actions for every contender:

1. Overhead: `envs.make("simple_spread_v3", num_envs=1)` against a raw mpe2 parallel-env loop (the
   same env stepped with an action dict, reset when its agents are gone), alternating the two for
   `--repeats` rounds of `--steps` steps; the median time of each gives the overhead.
2. Sync vs subprocess vectorization of simple_spread_v3 at 1, 2 and 8 envs (env-steps/s = envs x
   vector steps / s).
3. battle_v4 at its default 45 x 45 map (162 agents), 1 env: our PettingZoo path and the native backend, against
   the raw PettingZoo loop and a bare GridWorld loop through the engine's team handles.

Timings on a shared machine move with its load; the load average is recorded beside them.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
from host import cpu_name, positive

import envs
from envs.registry import build_parallel_env

ROOT = Path(__file__).resolve().parents[1]


def raw_loop(env, actions: np.ndarray, skip_dead: bool = False, with_state: bool = False) -> float:
    """Seconds to step a raw PettingZoo parallel env through `actions` (T, A), resetting when done.

    `skip_dead` sends actions only for living agents (MAgent2 needs it; MPE agents never die);
    `with_state` also calls `env.state()` after every step, as the vector env does for MAgent2.
    """
    agents = env.possible_agents
    env.reset(seed=0)
    start = time.perf_counter()
    for row in actions:
        if skip_dead:
            alive = set(env.agents)
            env.step({a: act for a, act in zip(agents, row.tolist(), strict=True) if a in alive})
        else:
            env.step(dict(zip(agents, row.tolist(), strict=True)))
        if with_state:
            env.state()
        if not env.agents:
            env.reset()
    return time.perf_counter() - start


def vec_loop(vec, actions: dict[str, np.ndarray]) -> float:
    """Seconds to step a VecEnv through `actions[g]` (T, E, A)."""
    vec.reset()
    steps = len(next(iter(actions.values())))
    start = time.perf_counter()
    for t in range(steps):
        vec.step({g: a[t] for g, a in actions.items()})
    return time.perf_counter() - start


def runner_loop(vec, actions: dict[str, np.ndarray]) -> float:
    """Seconds to step a sync VecEnv's one runner alone through `actions[g]` (T, 1, A): no vector layer (no action
    checks, no copies of the results), so the time splits into the engine, the runner and the vector layer."""
    vec.reset()
    runner, buffers = vec.runners[0], vec._buffers
    steps = len(next(iter(actions.values())))
    start = time.perf_counter()
    for t in range(steps):
        for g, a in actions.items():
            buffers.actions[g][...] = a[t]
        runner.step()
    return time.perf_counter() - start


def overhead(steps: int, repeats: int) -> dict:
    """Our sync vector env (E=1) vs the raw mpe2 loop on simple_spread_v3, interleaved."""
    raw_env = build_parallel_env("simple_spread_v3")
    vec = envs.make("simple_spread_v3", num_envs=1, seed=0)
    actions = np.random.default_rng(0).integers(0, 5, (steps, 3))
    raw_loop(raw_env, actions[:50])  # warm-up: first-call costs out of the timings
    vec_loop(vec, {"agent": actions[:50, None]})
    raw_times, vec_times = [], []
    for _ in range(repeats):
        raw_times.append(raw_loop(raw_env, actions))
        vec_times.append(vec_loop(vec, {"agent": actions[:, None]}))
    vec.close()
    raw_t, vec_t = statistics.median(raw_times), statistics.median(vec_times)
    return {
        "steps": steps,
        "repeats": repeats,
        "raw_steps_per_s": steps / raw_t,
        "vec_steps_per_s": steps / vec_t,
        "overhead_pct": 100.0 * (vec_t / raw_t - 1.0),
        "raw_seconds": raw_times,
        "vec_seconds": vec_times,
    }


def sync_vs_subproc(steps: int, repeats: int, env_counts: list[int]) -> list[dict]:
    """Env-steps/s of simple_spread_v3 for each vector mode and number of envs."""
    rows = []
    for num_envs in env_counts:
        actions = {"agent": np.random.default_rng(0).integers(0, 5, (steps, num_envs, 3))}
        for mode in ("sync", "subproc"):
            vec = envs.make("simple_spread_v3", num_envs=num_envs, seed=0, vector=mode)
            vec_loop(vec, {"agent": actions["agent"][:20]})  # warm-up
            times = [vec_loop(vec, actions) for _ in range(repeats)]
            vec.close()
            rows.append(
                {
                    "vector": mode,
                    "num_envs": num_envs,
                    "steps": steps,
                    "env_steps_per_s": num_envs * steps / statistics.median(times),
                    "seconds": times,
                }
            )
    return rows


def gridworld_loop(env, actions: np.ndarray) -> tuple[float, int]:
    """Seconds to step magent2's GridWorld itself through its team handles, and the agent-steps taken: per team
    set_action, then step, then per team get_observation, get_reward and get_alive, then clear_dead (what any
    learner needs each step, with nothing around it); reset at the end of an episode."""
    world, handles = env.env, env.handles
    env.reset(seed=0)
    frames, agent_steps = 0, 0
    start = time.perf_counter()
    for row in actions:
        sent = [np.ascontiguousarray(row[world.get_agent_id(h)], dtype=np.int32) for h in handles]
        for h, a in zip(handles, sent, strict=True):
            world.set_action(h, a)
        done = world.step()
        frames += 1
        for h in handles:
            world.get_observation(h)
            world.get_reward(h)
            agent_steps += len(world.get_alive(h))
        world.clear_dead()
        if done or frames >= env.max_cycles:
            env.reset()
            frames = 0
    return time.perf_counter() - start, agent_steps


def battle(steps: int, repeats: int) -> dict:
    """battle_v4 at the default map size, 1 env: the PettingZoo path and the native backend of our vector env, the
    raw PettingZoo env, and a bare GridWorld loop, alternating, with the same actions."""
    vec = envs.make("battle_v4", num_envs=1, seed=0, backend="pettingzoo")
    native = envs.make("battle_v4", num_envs=1, seed=0, backend="native")
    n_agents = sum(spec.n_agents for spec in vec.groups.values())
    actions = np.random.default_rng(0).integers(0, 21, (steps, n_agents))
    split = {
        "red": actions[:, None, : vec.groups["red"].n_agents],
        "blue": actions[:, None, vec.groups["red"].n_agents :],
    }
    raw_env, bare_env = build_parallel_env("battle_v4"), build_parallel_env("battle_v4")
    times = {"raw": [], "raw_with_state": [], "vec": [], "native": [], "native_runner": [], "gridworld": []}
    agent_steps = 0
    for _ in range(repeats):
        times["raw"].append(raw_loop(raw_env, actions, skip_dead=True))
        times["raw_with_state"].append(raw_loop(raw_env, actions, skip_dead=True, with_state=True))
        times["vec"].append(vec_loop(vec, split))
        times["native"].append(vec_loop(native, split))
        times["native_runner"].append(runner_loop(native, split))
        seconds, agent_steps = gridworld_loop(bare_env, actions)
        times["gridworld"].append(seconds)
    vec.close()
    native.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "map_size": 45,
        "n_agents": n_agents,
        "steps": steps,
        "repeats": repeats,
        "mean_agents_alive": agent_steps / steps,
        **{f"{k}_steps_per_s": steps / t for k, t in med.items()},
        "overhead_pct": 100.0 * (med["vec"] / med["raw"] - 1.0),
        "overhead_vs_raw_with_state_pct": 100.0 * (med["vec"] / med["raw_with_state"] - 1.0),
        "native_speedup_vs_vec": med["vec"] / med["native"],
        "native_vs_gridworld_pct": 100.0 * (med["native"] / med["gridworld"] - 1.0),
        **{f"{k}_seconds": v for k, v in times.items()},
    }


def machine() -> dict:
    cpu = cpu_name()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "commit": commit,
        "versions": {p: version(p) for p in ("numpy", "pettingzoo", "mpe2", "magent2", "gymnasium")},
    }


def markdown(report: dict) -> str:
    o, b, m = report["overhead"], report["battle"], report["machine"]
    lines = [
        "# Env speed",
        "",
        f"Generated by `{report['command']}` on {report['date']} (commit {m['commit']}).",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['platform']}, Python {m['python']}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + ".",
        f"Load average before / after: {report['load_before']} / {report['load_after']} (a shared machine: "
        "absolute numbers move with its load; each comparison below is measured side by side).",
        "",
        "## Wrapper overhead on simple_spread_v3 (1 env, random actions)",
        "",
        f"Median of {o['repeats']} alternating rounds of {o['steps']} steps.",
        "",
        "| loop | env-steps/s |",
        "|---|---:|",
        f"| raw mpe2 parallel env | {o['raw_steps_per_s']:,.0f} |",
        f"| `envs.make(..., vector='sync')` | {o['vec_steps_per_s']:,.0f} |",
        f"| **overhead** | **{o['overhead_pct']:+.1f} %** |",
        "",
        "## Sync vs subprocess on simple_spread_v3",
        "",
        "| envs | sync env-steps/s | subproc env-steps/s |",
        "|---:|---:|---:|",
    ]
    by = {(r["vector"], r["num_envs"]): r["env_steps_per_s"] for r in report["vector"]}
    for n in sorted({r["num_envs"] for r in report["vector"]}):
        lines.append(f"| {n} | {by[('sync', n)]:,.0f} | {by[('subproc', n)]:,.0f} |")
    lines += [
        "",
        f"## battle_v4, default {b['map_size']} x {b['map_size']} map ({b['n_agents']} agents, 1 env, sync)",
        "",
        f"Median of {b['repeats']} alternating rounds of {b['steps']} steps; {b['mean_agents_alive']:.0f} agents alive "
        "per step on average (agent-steps/s = env-steps/s x that).",
        "",
        "| loop | env-steps/s | agent-steps/s |",
        "|---|---:|---:|",
    ]
    rows = [("bare GridWorld: per team set_action, step, get_observation, get_reward, get_alive", "gridworld"),
            ("raw magent2 PettingZoo env", "raw"), ("raw, plus `env.state()` every step", "raw_with_state"),
            ("`envs.make(..., backend='pettingzoo')`", "vec"),
            ("the native backend's runner alone (no vector layer)", "native_runner"),
            ("**`envs.make(..., backend='native')`**", "native")]  # fmt: skip
    lines += [f"| {label} | {b[k + '_steps_per_s']:,.0f} | {b[k + '_steps_per_s'] * b['mean_agents_alive']:,.0f} |"
              for label, k in rows]  # fmt: skip
    lines += [
        "",
        f"The native backend (envs/magent_native.py, the default for MAgent2 ids) is "
        f"**{b['native_speedup_vs_vec']:.1f}x** the PettingZoo path and {b['native_vs_gridworld_pct']:+.0f} % from the "
        "bare GridWorld loop, with the same numbers bit for bit as the PettingZoo path (tests/test_magent_native.py). "
        "The bare loop calls magent2's Python getters, which build a new array and a ctypes pointer per call; the "
        "runner calls the engine's C functions with buffers made once, and while a team is whole the engine writes "
        "its observations straight into the batch row, so the runner alone can beat the bare loop while it also "
        "writes the global state and the agents' cells. The PettingZoo path's overhead over its raw loop: "
        f"{b['overhead_pct']:+.1f} % (vs raw plus state: {b['overhead_vs_raw_with_state_pct']:+.1f} %): MAgent2 "
        "computes `state()` by reading every agent's view again, and each step goes through per-agent dicts.",
        "",
        "Where a native step's time goes (per env step, from the medians above): the runner (engine included) "
        f"{1e6 / b['native_runner_steps_per_s']:.0f} µs, the vector layer (action checks, copies of the results so "
        f"they outlive the next step) {1e6 / b['native_steps_per_s'] - 1e6 / b['native_runner_steps_per_s']:.0f} µs."
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive(int), default=2000, help="steps per round of the overhead test")
    parser.add_argument("--repeats", type=positive(int), default=9, help="rounds per measurement (median)")
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "speed"))
    args = parser.parse_args()

    start = time.perf_counter()
    report = {
        "command": "python " + " ".join(["bench/bench_envs.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    report["overhead"] = overhead(args.steps, args.repeats)
    print(f"overhead: {report['overhead']['overhead_pct']:+.1f} %", flush=True)
    report["vector"] = sync_vs_subproc(max(args.steps // 4, 50), max(args.repeats // 2, 3), [1, 2, 8])
    print("sync vs subproc done", flush=True)
    report["battle"] = battle(max(args.steps // 10, 20), max(args.repeats // 2, 3))
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    report["wall_seconds"] = time.perf_counter() - start

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "envs.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(args.out_dir, "envs.md"), "w") as f:
        f.write(markdown(report))
    print(markdown(report))
    print(f"total {report['wall_seconds']:.0f} s")


if __name__ == "__main__":
    main()
