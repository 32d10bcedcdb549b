"""Does torch.compile speed up the update on this CPU? The scripts' own update, eager against compiled.

    python bench/bench_compile.py            # writes results/speed/compile.md and compile.json

Issue 22 names `torch.compile` of the update step as one way to the hardware's speed. This measures it on the
scripts' real update at their defaults on simple_spread_v3: `update()` of algos/mappo.py and algos/ippo.py on one
rollout (bench_update.filled_rollout), and of algos/maddpg.py (or another of the DDPG family) on batches sampled
from a replay buffer of --learning-starts random transitions (bench_update.filled_replay; one update is one batch,
its sampling included). Three forms, interleaved round by round:

* `eager`: the update as the scripts run it;
* `networks`: actor and critic compiled (`nn.Module.compile()`: TorchInductor, forward and backward; the DDPG
  family: every actor, critic and target), the loss and Adam eager;
* `update`: the whole update function under `torch.compile` (Dynamo splits it where it leaves torch: the
  minibatch sampler, `.item()`).

For each: the median time of one update, the compile time (the first call, minus an eager call; Inductor's disk
cache starts empty, as on a fresh machine), and Dynamo's counts (graphs compiled, graph breaks, recompilations).
Each compiled form's losses on the same rollout are checked against eager's (float tolerance) before it is timed.
One torch thread.
"""

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

# compile times from a cold start, as a fresh run on a new machine pays them (Inductor caches its kernels on disk)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench_compile_"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from bench_update import DDPG, filled_replay, filled_rollout, load_script  # noqa: E402
from host import cpu_name, out_folder, positive, scripts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
MODES = ("eager", "networks", "update")


def prepared(algo, mode):
    """A fresh policy, optimizer and rollout (same seed: the same numbers) and `run()` doing one update in `mode`."""
    m = load_script(algo)
    sys.modules[m.__name__] = m  # Dynamo looks the module of a compiled function up by name
    torch.manual_seed(0)
    if algo in DDPG:  # a fresh buffer, networks and sampler each time (seed 0): the first call is the same update
        _, update, _ = filled_replay(algo, m, 256)
        if mode == "networks":
            for nets in update.nets.values():
                for net in nets.values():
                    net.compile()
        elif mode == "update":
            m.update = torch.compile(m.update)  # update() calls it through the module
        return lambda reset=False: {k: float(v) for k, v in update().items()}
    args, pol, opt, rb, _ = filled_rollout(algo, m)
    update = m.update
    if mode == "networks":
        pol.actor.compile()
        pol.critic.compile()
    elif mode == "update":
        update = torch.compile(m.update)
    state = copy.deepcopy((pol.state_dict(), opt.state_dict()))

    def run(reset=False):  # reset: from the same weights and sampler, for the equality check
        if reset:
            pol.load_state_dict(state[0])
            opt.load_state_dict(state[1])
        return update(pol, opt, rb, args, "cpu", np.random.default_rng(0))

    return run


def measure(algo, rounds):
    runs, row = {}, {"algo": algo}
    eager_losses = None
    for mode in MODES:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        t0 = time.perf_counter()
        runs[mode] = prepared(algo, mode)
        losses = runs[mode](reset=True)
        first = time.perf_counter() - t0
        stats = torch._dynamo.utils.counters
        row[mode] = dict(first_call_s=first, graphs=stats["stats"]["unique_graphs"],
                         graph_breaks=sum(stats["graph_break"].values()),
                         recompiles=stats["recompiles"].get("total", 0) if "recompiles" in stats else 0)  # fmt: skip
        if mode == "eager":
            eager_losses = losses
        else:
            row[mode]["max_loss_difference"] = max(abs(losses[k] - eager_losses[k]) for k in eager_losses)
    for mode in MODES:  # warm-up outside the timings
        runs[mode]()
    times = {mode: [] for mode in MODES}
    for _ in range(rounds):  # interleaved: a load change touches every mode alike
        for mode in MODES:
            t0 = time.perf_counter()
            runs[mode]()
            times[mode].append(time.perf_counter() - t0)
    for mode in MODES:
        row[mode]["update_ms"] = statistics.median(times[mode]) * 1e3
        row[mode]["vs_eager"] = row[mode]["update_ms"] / (statistics.median(times["eager"]) * 1e3)
    row["compile_s"] = {mode: row[mode]["first_call_s"] - row["eager"]["first_call_s"] for mode in MODES[1:]}
    print(json.dumps(row), flush=True)
    return row


def markdown(report):
    loads = [", ".join(f"{x:.1f}" for x in report[k]) for k in ("load_average_before", "load_average")]
    lines = [
        "# torch.compile on the update: the scripts' own update, eager against compiled",
        "",
        f"Measured {report['date']} on {report['cpu']} ({report['cores']} cores), torch {report['torch']}, one torch "
        f"thread, load average {loads[0]} before and {loads[1]} after. Regenerate: `{report['command']}`. Median of "
        f"{report['rounds']} updates per form, the forms interleaved; simple_spread_v3 at each script's defaults.",
        "",
        "| script | form | update (ms) | / eager | compile (s) | graphs | graph breaks | recompiles | max loss diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        for mode in MODES:
            r = row[mode]
            compile_s = f"{row['compile_s'][mode]:.1f}" if mode != "eager" else "—"
            diff = f"{r['max_loss_difference']:.1e}" if mode != "eager" else "—"
            lines.append(f"| {row['algo']} | {mode} | {r['update_ms']:.1f} | {r['vs_eager']:.2f}x | {compile_s} | "
                         f"{r['graphs']} | {r['graph_breaks']} | {r['recompiles']} | {diff} |")  # fmt: skip
    lines += [
        "",
        "Forms: `networks` compiles actor and critic (`nn.Module.compile()`, forward and backward through "
        "TorchInductor's C++ code), the loss and Adam stay eager; `update` puts the whole update function under "
        "`torch.compile` (Dynamo splits it at the sampler, at `.item()` and, in the DDPG family, at the finite-loss "
        "check before each step). A form is worth having only if its update is well under 1.00x and its compile time "
        "fits the 30 s budget of a default run's first iteration.",
        "",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--algos", type=scripts, default="mappo,ippo,maddpg", help="comma-separated scripts (PPO, DDPG family)"
    )
    parser.add_argument("--rounds", type=positive(int), default=7)
    parser.add_argument("--out", type=out_folder, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    rows = [measure(a, args.rounds) for a in args.algos.split(",")]
    report = dict(date=date.today().isoformat(), cpu=cpu_name(), cores=os.cpu_count(), python=platform.python_version(),
                  torch=torch.__version__, load_average_before=load_before, load_average=os.getloadavg(),
                  rounds=args.rounds, command="python bench/bench_compile.py", rows=rows)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "compile.md").write_text(markdown(report))
    print((args.out / "compile.md").read_text())


if __name__ == "__main__":
    main()
