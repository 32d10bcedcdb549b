"""Where one iteration of ippo.py goes at JaxMARL's IPPO config, section by section, one torch thread.

    python bench/bench_rollout.py            # writes results/speed/rollout.md and rollout.json

The config of speed/jaxmarl.md's `ippo` pair (16 envs x 128 steps on the Numba MPE's simple_spread_v3, 64-wide
networks, 4 epochs x 4 minibatches). The script's own functions run its loop: each rollout step is timed in its
sections (acting: the actor's forward, sampling, log-probs; the critic's values; env.step; the critic's values of
final observations where episodes were cut; storing), then the update on the full rollout. Medians over rollouts
and updates after two of each to warm up. JaxMARL's whole iteration, from speed/jaxmarl.json (2,048 env steps at
its median env-steps/s), is the reference.
"""

import argparse
import importlib.util
import json
import os
import statistics
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch
from bench_update import MATCHED
from host import cpu_name, positive

import envs
from buffers import RolloutBuffer, float_tensor

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
SECTIONS = ("act", "critic values", "env.step", "final values", "store")


def load_ippo():
    spec = importlib.util.spec_from_file_location("ippo", ROOT / "algos" / "ippo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(iterations):
    m = load_ippo()
    args = m.Args(**MATCHED)
    torch.manual_seed(0)
    env = envs.make("simple_spread_v3", args.num_envs, 0, backend="numba")
    (g,) = env.groups
    pol = m.Policy(env.groups[g], args)
    opt, rng = m.adam(pol.parameters(), args.learning_rate, eps=1e-5), np.random.default_rng(0)
    rb = RolloutBuffer(args.num_steps, args.num_envs, m.rollout_fields(env.groups[g], args))
    obs, h_actor, h_critic = env.reset(), {g: None}, None
    per_iteration = {k: [] for k in (*SECTIONS, "rollout", "update")}
    for _ in range(iterations + 2):
        spent = dict.fromkeys(SECTIONS, 0.0)
        start = time.perf_counter()
        for _ in range(args.num_steps):
            t0 = time.perf_counter()
            with torch.inference_mode():  # as the script acts
                actions, taken = m.act({g: pol}, obs, "cpu", h_actor)
                t1 = time.perf_counter()
                values, h_critic = pol.value(float_tensor(obs.obs[g], "cpu"), h_critic)
            t2 = time.perf_counter()
            step = env.step(actions)
            t3 = time.perf_counter()
            with torch.inference_mode():  # as the script acts
                final = pol.value(float_tensor(step.final.obs[g], "cpu"))[0] if step.truncated.any() else 0 * values
            t4 = time.perf_counter()
            rb.add(obs=obs.obs[g], **taken[g], values=values, rewards=step.rewards[g], terminated=step.terminated[g],
                   truncated=step.truncated, final_values=final, agent_mask=obs.agent_mask[g])  # fmt: skip
            obs = step.next
            t5 = time.perf_counter()
            for k, dt in zip(SECTIONS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                spent[k] += dt
        rollout = time.perf_counter() - start
        with torch.no_grad():
            rb.compute_gae(pol.value(float_tensor(obs.obs[g], "cpu"))[0], args.gamma, args.gae_lambda)
        t0 = time.perf_counter()
        m.update(pol, opt, rb, args, "cpu", rng)
        update = time.perf_counter() - t0
        rb.reset()
        for k, v in (*spent.items(), ("rollout", rollout), ("update", update)):
            per_iteration[k].append(v * 1e3)
    env.close()
    return {k: statistics.median(v[2:]) for k, v in per_iteration.items()}, args


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=positive(int), default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    ms, run_args = measure(args.iterations)
    steps = run_args.num_envs * run_args.num_steps
    jax = json.loads((OUT / "jaxmarl.json").read_text())["pairs"]["ippo"]["median"]["theirs"]
    products = next(r for r in json.loads((OUT / "update.json").read_text())["rows"]
                    if r.get("label") == "ippo (JaxMARL's config)")["threads_1"]["products_ms"]  # fmt: skip
    report = {"date": date.today().isoformat(), "cpu": cpu_name(), "torch": torch.__version__, "load_before": load,
              "load_after": os.getloadavg(), "env_steps_per_iteration": steps, "ms_per_iteration": ms,
              "update_products_ms": products, "jaxmarl_ms_per_iteration": steps / jax * 1e3}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "rollout.json").write_text(json.dumps(report, indent=2) + "\n")
    total = ms["rollout"] + ms["update"]
    lines = [
        "# Where an ippo.py iteration goes at JaxMARL's IPPO config (ms per iteration of 2,048 env steps, one thread)",
        "",
        f"Measured {report['date']} on {report['cpu']}, torch {report['torch']}, load average "
        f"{', '.join(f'{x:.1f}' for x in load)} before. Regenerate: `python bench/bench_rollout.py` (what it "
        f"times: its docstring). Medians over {args.iterations} iterations.",
        "",
        "| part | ms per iteration | per env step of the 16 envs (us) | share |",
        "|---|---:|---:|---:|",
    ]
    for k in SECTIONS:
        lines.append(f"| rollout: {k} | {ms[k]:.1f} | {ms[k] / run_args.num_steps * 1e3:.0f} | {ms[k] / total:.0%} |")
    lines += [
        f"| rollout, whole (with the loop's own Python) | {ms['rollout']:.1f} | "
        f"{ms['rollout'] / run_args.num_steps * 1e3:.0f} | {ms['rollout'] / total:.0%} |",
        f"| update (4 epochs x 4 minibatches) | {ms['update']:.1f} | | {ms['update'] / total:.0%} |",
        f"| **iteration** | **{total:.1f}** | | |",
        f"| the update's matrix products alone (speed/update.md) | {products:.1f} | | |",
        f"| JaxMARL's whole iteration (speed/jaxmarl.md) | {report['jaxmarl_ms_per_iteration']:.1f} | | |",
    ]
    (OUT / "rollout.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
