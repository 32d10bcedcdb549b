"""The PPO update's floor: the highest env-steps/s MAPPO and IPPO can reach on this CPU at the results' settings.

    python results/bench_update.py            # writes results/speed/update.md and update.json

The PPO update is most of a MAPPO or IPPO run on the Numba MPE (results/speed/train.md). This fills one rollout
of simple_spread_v3 with the script's own networks at its defaults (128 envs x 25 steps x 3 agents, 10 epochs of
one minibatch), then, for one update:

* counts its matrix products with torch's profiler (shapes and FLOPs: 2mkn per product);
* times those products alone, at their shapes, on contiguous operands (best of several rounds);
* times the whole update (median of several).

No rewrite of the update can go below the time of its products without doing fewer FLOPs, so
`env steps per update / products' time` is a ceiling on env-steps/s at these settings on this machine, before
acting, env stepping, elementwise ops or Adam. Both thread counts are measured: 1 (the scripts' default) and 2.
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch
from bench_train import _cpu
from torch.profiler import ProfilerActivity, profile

import envs
from buffers import RolloutBuffer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
ENV_ID = "simple_spread_v3"


def load_script(algo):
    """algos/<algo>.py as a module (its main() is not run)."""
    spec = importlib.util.spec_from_file_location(algo, ROOT / "algos" / f"{algo}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def filled_rollout(algo, m, seed=0):
    """The script's policy at its defaults and one full rollout of it acting on the Numba MPE (targets computed)."""
    args = m.Args()
    env = envs.make(ENV_ID, args.num_envs, seed, backend="numba")
    (g,) = env.groups
    spec = env.groups[g]
    if algo == "mappo":  # centralized critic on the global state
        pol = m.Policy(spec, int(np.prod(env.state_shape)), args)
        rb = RolloutBuffer(args.num_steps, args.num_envs, m.rollout_fields(spec, env.state_shape, args))
        critic_input = lambda o: m.t(o.state, "cpu")  # noqa: E731
    else:  # IPPO: each agent's critic on its own observation
        pol = m.Policy(spec, args)
        rb = RolloutBuffer(args.num_steps, args.num_envs, m.rollout_fields(spec, args))
        critic_input = lambda o: m.t(o.obs[g], "cpu")  # noqa: E731
    rng, obs = np.random.default_rng(seed), env.reset()
    hidden = m.initial_hidden({g: pol}, args, args.num_envs, "cpu")
    with torch.no_grad():
        for _ in range(args.num_steps):
            actions, taken = m.act({g: pol}, obs, "cpu", rng, hidden)
            values = pol.value(critic_input(obs))[0]
            step = env.step(actions)
            row = dict(obs=obs.obs[g], state=obs.state, **taken[g], values=values, rewards=step.rewards[g],
                       terminated=step.terminated[g], truncated=step.truncated, final_values=values,
                       agent_mask=obs.agent_mask[g])  # fmt: skip
            rb.add(**{k: v for k, v in row.items() if k in rb.schema})
            obs = step.next
        rb.compute_gae(pol.value(critic_input(obs))[0], args.gamma, args.gae_lambda)
    env.close()
    opt = torch.optim.Adam(pol.parameters(), lr=args.learning_rate, eps=1e-5)
    return args, pol, opt, rb, rng


def products_of(update):
    """The matrix products one call of `update()` makes: {(m, k, n): count}, from torch's profiler."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        update()
    counts = {}
    for e in prof.events():
        if e.name == "aten::mm":
            (m, k), (_, n) = e.input_shapes[0], e.input_shapes[1]
            counts[(m, k, n)] = counts.get((m, k, n), 0) + 1
    return counts


def time_products(counts, rounds=7, reps=20):
    """Seconds the products take alone: per shape the best of `rounds` means over `reps` calls, times its count."""
    total = 0.0
    for (m, k, n), count in counts.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        out = torch.empty(m, n)
        torch.mm(a, b, out=out)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b, out=out)
            best = min(best, (time.perf_counter() - t0) / reps)
        total += best * count
    return total


def time_update(update, repeats=7):
    """Median seconds of one whole update (after one warm-up call)."""
    update()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        update()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(algo):
    m = load_script(algo)
    args, pol, opt, rb, rng = filled_rollout(algo, m)
    update = lambda: m.update(pol, opt, rb, args, "cpu", rng)  # noqa: E731
    counts = products_of(update)
    gflop = sum(2 * mm * k * n * c for (mm, k, n), c in counts.items()) / 1e9
    env_steps = args.num_envs * args.num_steps
    row = dict(algo=algo, env_steps_per_update=env_steps, samples=env_steps * 3, epochs=args.update_epochs,
               minibatches=args.num_minibatches, hidden_size=args.hidden_size, products=sum(counts.values()),
               gflop_products=gflop, shapes={f"{a}x{b}x{c}": n for (a, b, c), n in counts.items()})  # fmt: skip
    for threads in (1, 2):
        torch.set_num_threads(threads)
        products, whole = time_products(counts), time_update(update)
        row[f"threads_{threads}"] = dict(products_ms=products * 1e3, update_ms=whole * 1e3,
                                         products_gflops=gflop / products, ceiling_env_steps_per_s=env_steps / products,
                                         update_only_env_steps_per_s=env_steps / whole)  # fmt: skip
        print(f"{algo} threads={threads}: {gflop:.2f} GFLOP in {sum(counts.values())} products, products alone "
              f"{products * 1e3:.1f} ms, whole update {whole * 1e3:.1f} ms", flush=True)  # fmt: skip
    return row


def markdown(report):
    loads = [", ".join(f"{x:.1f}" for x in report[k]) for k in ("load_average_before", "load_average")]
    lines = [
        "# The PPO update's floor: the highest env-steps/s the results' settings allow",
        "",
        f"Measured {report['date']} on {report['cpu']} ({report['cores']} cores), torch {report['torch']}, load "
        f"average {loads[0]} before and {loads[1]} after. Regenerate: `{report['command']}`.",
        f"Settings: each script's defaults on {ENV_ID} (the results' settings). One update consumes one rollout; its "
        "matrix products are counted by torch's profiler and timed alone at their shapes (contiguous operands, best "
        "of 7 rounds); the whole update is the median of 7 calls.",
        "",
        "| script | env steps per update | samples x epochs | GFLOP in matrix products | torch threads | products "
        "alone (ms) | their GFLOP/s | whole update (ms) | ceiling: env steps / products' time | env steps / whole "
        "update's time |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        for threads in (1, 2):
            t = r[f"threads_{threads}"]
            lines.append(
                f"| {r['algo']} | {r['env_steps_per_update']:,} | {r['samples']:,} x {r['epochs']} | "
                f"{r['gflop_products']:.2f} | {threads} | {t['products_ms']:.1f} | {t['products_gflops']:.0f} | "
                f"{t['update_ms']:.1f} | {t['ceiling_env_steps_per_s']:,.0f} | "
                f"{t['update_only_env_steps_per_s']:,.0f} |"
            )
    lines += [
        "",
        "The ceiling counts nothing but the update's matrix products: acting, env stepping, the elementwise ops of "
        "the networks and the losses, and Adam all come on top of it. A run at these settings is therefore slower "
        "than the ceiling on this machine whatever the implementation; only fewer FLOPs per env step (fewer epochs, "
        "fewer or smaller layers, one critic value per env instead of per agent) or more cores raise it.",
        "",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="mappo,ippo", help="comma-separated PPO scripts")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = [measure(algo) for algo in args.algos.split(",")]
    report = dict(date=date.today().isoformat(), cpu=_cpu(), cores=os.cpu_count(), python=platform.python_version(),
                  torch=torch.__version__, load_average_before=load_before, load_average=os.getloadavg(),
                  command="python results/bench_update.py", rows=rows)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "update.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "update.md").write_text(markdown(report))
    print((args.out / "update.md").read_text())


if __name__ == "__main__":
    main()
