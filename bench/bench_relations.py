"""What `--relations` costs a step of the training env (envs/relations.py), against the same env without it.

    python bench/bench_relations.py       # writes results/speed/relations.md and relations.json

simple_spread_v3 on the Numba backend (the training env), 128 envs (MAPPO's default), N = 3, 4 and 6, the same
pre-drawn random actions for both: `--rounds` alternating rounds of `--steps` vector steps each, the median time per
vector step of each. The relations are numpy on the observations the backend hands back; MAPPO at N = 6 spends about
30 ms per vector step in all (results/simple_spread_v3/agents.md), so the added time is read against that too.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from host import cpu_name, out_folder, positive

import envs
from envs.relations import WithRelations

ROOT = Path(__file__).resolve().parents[1]


def seconds_per_step(env, actions: np.ndarray) -> float:
    env.reset(seed=0)
    start = time.perf_counter()
    for a in actions:
        env.step({"agent": a})
    return (time.perf_counter() - start) / len(actions)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=positive(int), default=128)
    parser.add_argument("--steps", type=positive(int), default=200)
    parser.add_argument("--rounds", type=positive(int), default=7)
    parser.add_argument("--out", type=out_folder, default=ROOT / "results" / "speed")
    args = parser.parse_args()
    rows = []
    for n in (3, 4, 6):
        plain = envs.make("simple_spread_v3", args.num_envs, 0, backend="numba", N=n)
        extended = WithRelations(
            envs.make("simple_spread_v3", args.num_envs, 0, backend="numba", N=n), "simple_spread_v3"
        )
        actions = np.random.default_rng(0).integers(0, 5, (args.steps, args.num_envs, n))
        seconds_per_step(plain, actions[:20]), seconds_per_step(extended, actions[:20])  # compile, warm the caches
        times = {"plain": [], "relations": []}
        for _ in range(args.rounds):
            times["plain"].append(seconds_per_step(plain, actions))
            times["relations"].append(seconds_per_step(extended, actions))
        plain_s, rel_s = statistics.median(times["plain"]), statistics.median(times["relations"])
        rows.append(
            dict(
                N=n,
                plain_us=plain_s * 1e6,
                relations_us=rel_s * 1e6,
                added_us=(rel_s - plain_s) * 1e6,
                ratio=rel_s / plain_s,
            )
        )
    meta = dict(
        date=datetime.date.today().isoformat(),
        command="python bench/bench_relations.py",
        cpu=cpu_name(),
        machine=platform.machine(),
        load_average=os.getloadavg(),
        num_envs=args.num_envs,
        steps=args.steps,
        rounds=args.rounds,
    )
    out = Path(args.out)
    (out / "relations.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = [
        "# `--relations`: the added time per vector step of the training env",
        "",
        f"`{meta['command']}` ({meta['date']}; {meta['cpu']}; load average {meta['load_average'][0]:.2f}):",
        f"simple_spread_v3, Numba backend, {args.num_envs} envs, median of {args.rounds} alternating rounds of "
        f"{args.steps} vector steps.",
        "",
        "| N | env step | with --relations | added | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['N']} | {r['plain_us']:.0f} us | {r['relations_us']:.0f} us | {r['added_us']:.0f} us | "
            f"{r['ratio']:.2f}x |"
        )
    (out / "relations.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
