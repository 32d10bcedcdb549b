"""Speed of the compiled kernels and segment trees against their references, measured in one run.

    python bench/bench_kernels.py            # writes results/speed/kernels.md and kernels.json

GAE, TD(lambda) and n-step returns: Numba kernel vs the plain-Python reference (buffers/reference.py),
ns per agent-step, median of repeats, at (T=128, E=16, A=3) and (T=1000, E=128, A=8).
Segment trees at capacity 2**20: stratified sampling of 256 indices, 256 priority updates, and the
prioritized buffers' sample + update round trip, with cpprb's PrioritizedReplayBuffer as a peer
column when cpprb is installed. Inputs are fresh random draws per repeat so caches do not flatter.
The GRU sequence kernels (runtime/gru.py, forward and backward through time, one torch thread) against the
step-by-step torch loop they are tested against, and torch.nn.GRU (which cannot restart mid-sequence, timed
without restarts), at the shapes the scripts train on.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch
from host import cpu_name, out_folder

from buffers import MinTree, PrioritizedReplayBuffer, SumTree, kernels, reference
from runtime.gru import gru_sequence, gru_sequence_reference

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"


def timeit(fn, make_args, repeats):
    """Median seconds of fn(*make_args()) over `repeats` calls; argument creation is not timed."""
    times = []
    for _ in range(repeats):
        args = make_args()
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rollout_inputs(T, B, dtype, rng):
    return (
        rng.standard_normal((T, B)).astype(dtype),
        rng.standard_normal((T, B)).astype(dtype),
        rng.standard_normal((T, B)).astype(dtype),
        rng.random((T, B)) < 0.01,
        rng.random((T, B)) < 0.05,
    )


def bench_returns(rng, quick):
    rows = []
    sizes = [(128, 16, 3), (1000, 128, 8)]
    for T, E, A in sizes:
        B = E * A
        for dtype in (np.float32, np.float64):
            r, v, nv, term, end = rollout_inputs(T, B, dtype, rng)
            end |= term
            cases = {  # name -> (function name, arguments): the same call on both modules
                "gae": ("gae", (r, v, nv, term, end, 0.99, 0.95)),
                "td_lambda": ("td_lambda", (r, nv, term, end, 0.99, 0.95)),
                "nstep_returns (n=5)": ("nstep_returns", (r, term, end, 0.99, 5)),
            }
            for name, (fn, fn_args) in cases.items():
                compiled = timeit(getattr(kernels, fn), lambda a=fn_args: a, 50 if T * B < 1e5 else 15)
                ref_repeats = 1 if (quick or T * B > 1e5) else 3
                ref = timeit(getattr(reference, fn), lambda a=fn_args: a, ref_repeats)
                rows.append(
                    dict(
                        kernel=name,
                        T=T,
                        E=E,
                        A=A,
                        dtype=np.dtype(dtype).name,
                        compiled_ns_per_agent_step=compiled / (T * B) * 1e9,
                        reference_ns_per_agent_step=ref / (T * B) * 1e9,
                        speedup=ref / compiled,
                    )
                )
                print(f"{name:20s} T={T} E={E} A={A} {np.dtype(dtype).name}: {rows[-1]['speedup']:.0f}x")
    return rows


def bench_trees(rng, repeats):
    cap, n = 2**20, 256
    s, m = SumTree(cap), MinTree(cap)
    p = rng.random(cap) + 1e-3
    s.update(np.arange(cap), p)
    m.update(np.arange(cap), p)
    rows = {
        "SumTree.sample_stratified(256)": timeit(lambda: s.sample_stratified(n, rng), tuple, repeats),
        "SumTree.find_prefixsum(256 queries)": timeit(s.find_prefixsum, lambda: (rng.random(n) * s.sum(),), repeats),
        "SumTree.update(256)": timeit(s.update, lambda: (rng.integers(0, cap, n), rng.random(n)), repeats),
        "MinTree.update(256)": timeit(m.update, lambda: (rng.integers(0, cap, n), rng.random(n)), repeats),
        "SumTree.sum() + MinTree.min()": timeit(lambda: (s.sum(), m.min()), tuple, repeats),
    }
    return {k: v * 1e6 for k, v in rows.items()}


def bench_per_buffers(rng, repeats):
    """Prioritized buffer round trip at 2**20 transitions: ours vs cpprb (when installed)."""
    cap, n, obs_dim = 2**20, 256, 8
    out = {}
    ours = PrioritizedReplayBuffer(cap, 1, {"obs": ((obs_dim,), np.float32)}, alpha=0.6)
    ours.data["obs"][:] = rng.random((cap, 1, obs_dim), dtype=np.float32)  # filled in place, not timed
    ours.size, ours.pos = ours.rows, 0
    ours.priorities.add(np.arange(cap))
    ours.update_priorities(np.arange(cap), rng.random(cap))
    out["flashmarl"] = {
        "sample(256)": timeit(lambda: ours.sample(n, rng, beta=0.4), tuple, repeats) * 1e6,
        "update_priorities(256)": timeit(
            ours.update_priorities, lambda: (rng.integers(0, cap, n), rng.random(n)), repeats
        )
        * 1e6,
    }
    try:
        import cpprb
    except ImportError:
        return out
    peer = cpprb.PrioritizedReplayBuffer(cap, {"obs": {"shape": obs_dim}}, alpha=0.6)
    for block in np.array_split(np.arange(cap), 64):
        peer.add(obs=rng.random((len(block), obs_dim), dtype=np.float32))
    peer.update_priorities(np.arange(cap), rng.random(cap))
    out["cpprb " + getattr(cpprb, "__version__", "")] = {
        "sample(256)": timeit(lambda: peer.sample(n, beta=0.4), tuple, repeats) * 1e6,
        "update_priorities(256)": timeit(
            peer.update_priorities, lambda: (rng.integers(0, cap, n), rng.random(n)), repeats
        )
        * 1e6,
    }
    return out


GRU_SHAPES = [  # (what trains on it, L steps, B sequences, A agents, H units)
    ("mappo.py --rnn at JaxMARL's config: one minibatch", 128, 4, 3, 128),
    ("mappo.py --rnn at its defaults: the whole rollout", 25, 128, 3, 64),
    ("qmix.py and family: 32 whole episodes", 26, 32, 3, 64),
]


def gru_timings(L, B, A, H, repeats):
    """ms per forward + backward pass: the kernels, the torch loop, torch.nn.GRU (its own weights, no restarts)."""
    gen = torch.Generator().manual_seed(0)
    w, b = (
        (0.1 * torch.randn(1, H, 3 * H, generator=gen)).requires_grad_(),
        torch.zeros(1, 1, 3 * H, requires_grad=True),
    )
    keep = (torch.rand(L, B, generator=gen) > 1 / 25).float()  # restarts as often as MPE's episodes end
    gru = torch.nn.GRU(H, H)

    def make():
        return torch.randn(L, B, A, 3 * H, requires_grad=True), torch.zeros(B, A, H)

    def torch_gru(gx, h0):
        gru(gx[..., :H].reshape(L, B * A, H), h0.reshape(1, B * A, H))[0].sum().backward()

    fns = {"kernels": gru_sequence, "torch loop": gru_sequence_reference}
    timings = {k: timeit(lambda gx, h0, f=f: f(gx, h0, w, b, keep).sum().backward(), make, repeats)
               for k, f in fns.items()}  # fmt: skip
    return {k: 1e3 * v for k, v in (timings | {"torch.nn.GRU": timeit(torch_gru, make, repeats)}).items()}


def bench_gru(repeats):
    torch.set_num_threads(1)
    return [
        dict(shape=name, L=L, B=B, A=A, H=H, ms=gru_timings(L, B, A, H, repeats)) for name, L, B, A, H in GRU_SHAPES
    ]


def machine():
    cpu = cpu_name()
    import numba

    return dict(
        cpu=cpu,
        cores=os.cpu_count(),
        python=platform.python_version(),
        numpy=np.__version__,
        numba=numba.__version__,
    )


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def write_markdown(report, path):
    lines = [
        "# Kernel and segment-tree speed",
        "",
        f"Measured {report['date']} at commit `{report['commit']}` on {report['machine']['cpu']} "
        f"({report['machine']['cores']} cores), numba {report['machine']['numba']}, "
        f"numpy {report['machine']['numpy']}. Regenerate: `{report['command']}`.",
        "",
        "## Returns kernels: Numba vs the reference loop (ns per agent-step, median)",
        "",
        "| kernel | T | E | A | dtype | compiled | reference | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["returns"]:
        lines.append(
            f"| {r['kernel']} | {r['T']} | {r['E']} | {r['A']} | {r['dtype']} | "
            f"{r['compiled_ns_per_agent_step']:.2f} | {r['reference_ns_per_agent_step']:.0f} | "
            f"{r['speedup']:,.0f}x |"
        )
    lines += [
        "",
        "Target: GAE and TD(lambda) <= 2 ns per agent-step at the large size (memory-bound near 1.2 ns).",
        "",
        "## Segment trees at capacity 2**20 (µs per call, median)",
        "",
        "| operation | µs |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.1f} |" for k, v in report["trees"].items()]
    lines += [
        "",
        "Targets: sample 256 indices <= 40 µs, update 256 priorities <= 8 µs.",
        "",
        "## Prioritized replay buffer round trip at 2**20 transitions (µs per call, median)",
        "",
        "| library | sample(256) | update_priorities(256) |",
        "|---|---|---|",
    ]
    for lib, r in report["per_buffers"].items():
        lines.append(f"| {lib} | {r['sample(256)']:.1f} | {r['update_priorities(256)']:.1f} |")
    lines += [
        "",
        "## GRU over a sequence, forward and backward (ms per sequence batch, median, one torch thread)",
        "",
        "| trained on | L x B x A, H | kernels (runtime/gru.py) | torch loop (reference) | torch.nn.GRU, no restarts |",
        "|---|---|---|---|---|",
    ]
    for r in report["gru"]:
        ms = r["ms"]
        lines.append(f"| {r['shape']} | {r['L']} x {r['B']} x {r['A']}, {r['H']} | {ms['kernels']:.2f} | "
                     f"{ms['torch loop']:.2f} | {ms['torch.nn.GRU']:.2f} |")  # fmt: skip
    lines.append("")
    path.write_text("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one reference repeat everywhere")
    parser.add_argument("--out", type=out_folder, default=OUT, help="directory for kernels.md / kernels.json")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    kernels.warmup()
    report = dict(
        date=date.today().isoformat(),
        commit=commit(),
        command="python bench/bench_kernels.py" + (" --quick" if args.quick else ""),
        machine=machine(),
        returns=bench_returns(rng, args.quick),
        trees=bench_trees(rng, 2000),
        per_buffers=bench_per_buffers(rng, 500),
        gru=bench_gru(21),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, args.out / "kernels.md")
    print((args.out / "kernels.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
