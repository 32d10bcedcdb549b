"""End-to-end training speed of the MPE scripts (MAPPO, IPPO, MADDPG, MATD3, IDDPG; IQL, VDN, QMIX, WQMIX; COMA, VDAC),
and where the time goes.

    python bench/bench_train.py            # writes results/speed/train.md and train.json
    python bench/bench_train.py --algos mappo,iql,vdn,qmix,wqmix,coma,vdac --name train_team  # the newer scripts
    python bench/bench_train.py --algos qmix,qtran,dcg,mappo,happo --name train_siblings  # issue 43's, by a sibling
    python bench/bench_train.py --algos mappo,commnet,ic3net,tarmac --steps 64000 --pz-steps 8000 --name train_comm

Each script runs as a subprocess with the settings used for the results (its defaults: for the PPO scripts
128 envs, 25-step rollouts, 10 epochs; for the DDPG family 128 envs, one update of 256 per 256 transitions)
on both env backends (mpe2 also with worker processes for MAPPO and MADDPG); env-steps/s is the script's own
last `charts/SPS` (evaluation excluded: --eval-interval 0). A bare mpe2 loop, timed in the same run, is the
reference of the ratios. Then one MAPPO and one MADDPG run on the Numba MPE under cProfile split the wall time
into acting, env stepping, storing, sampling or targets, and the updates.
The load average is recorded beside the numbers: on a shared machine they are a lower bound.
"""

import argparse
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np
from bench_envs import raw_loop
from host import cpu_name, out_folder, positive, run_or_exit, scripts
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envs.registry import build_parallel_env

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"

# per profiled script: (function name as pstats reports it, file suffix) -> row label of the time breakdown
PHASES = {
    "mappo": {
        ("update", "algos/mappo.py"): "PPO update (10 epochs: forward, backward, Adam)",
        ("act", "algos/mappo.py"): "acting (actor forward, sampling)",
        ("value", "algos/mappo.py"): "critic values while acting",
        ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
        ("add", "buffers/rollout.py"): "storing the step (RolloutBuffer.add)",
        ("compute_gae", "buffers/rollout.py"): "targets (RolloutBuffer.compute_gae)",
        ("add_scalar", "torch/utils/tensorboard/writer.py"): "TensorBoard logging",
    },
    "maddpg": {
        ("update", "algos/maddpg.py"): "updates (critic and actor losses, backward, Adam, soft target update)",
        ("sample", "buffers/replay.py"): "sampling the batch (ReplayBuffer.sample)",
        ("act", "algos/maddpg.py"): "acting (actor forward, noise)",
        ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
        ("add", "buffers/replay.py"): "storing the step (ReplayBuffer.add)",
        ("add_scalar", "torch/utils/tensorboard/writer.py"): "TensorBoard logging",
    },
}
for _algo in ("iql", "qmix"):  # the value-decomposition family: vdn is qmix with a sum, wqmix qmix with a central Q*
    PHASES[_algo] = {
        ("update", f"algos/{_algo}.py"): "updates (sampling, GRU unrolls of agents and target agents, mixer, "
        "targets, backward, Adam)",
        ("sample", "buffers/episode.py"): "- of which sampling 32 episodes (EpisodeReplayBuffer.sample)",
        ("<built-in method torch.gru>", "~"): "- of which GRU unrolls, forward (torch.gru; acting's single steps too)",
        ("<method 'run_backward' of 'torch._C._EngineBase' objects>", "~"): "- of which backward",
        ("td_targets", f"algos/{_algo}.py"): "- of which TD(lambda) targets (compiled kernel, numpy round trip)",
        **(
            {("forward", "algos/qmix.py:Mixer"): "- of which the mixer forward (hypernetworks on the state)"}
            if _algo == "qmix"
            else {}
        ),  # fmt: skip
        ("act", f"algos/{_algo}.py"): "acting (one GRU step of every agent, epsilon-greedy over available actions)",
        ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
        ("add", "buffers/episode.py"): "storing the steps (EpisodeReplayBuffer.add, finish)",
        ("finish", "buffers/episode.py"): "storing the steps (EpisodeReplayBuffer.add, finish)",
        ("add_scalar", "torch/utils/tensorboard/writer.py"): "TensorBoard logging",
    }
PHASES["coma"] = {
    ("update", "algos/coma.py"): "update (critic targets, critic steps, one actor step)",
    ("critic_targets", "algos/coma.py"): "- of which TD(lambda) targets of the target critic (compiled kernel)",
    ("act", "algos/coma.py"): "acting (actor forward, epsilon floor, sampling; also at final observations)",
    ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 16 envs)",
    ("add", "buffers/rollout.py"): "storing the step (RolloutBuffer.add)",
}
for _algo in ("masac", "isac"):
    PHASES[_algo] = {
        ("update", f"algos/{_algo}.py"): "updates (twin critics, actors, temperatures, backward, Adam, soft target "
        "update)",
        ("sample", "buffers/replay.py"): "sampling the batch (ReplayBuffer.sample)",
        ("act", f"algos/{_algo}.py"): "acting (actor forward, sampling the squashed Gaussian)",
        ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
        ("add", "buffers/replay.py"): "storing the step (ReplayBuffer.add)",
        ("add_scalar", "torch/utils/tensorboard/writer.py"): "TensorBoard logging",
    }
PHASES["qtran"] = {
    ("update", "algos/qtran.py"): "updates (sampling, GRU unrolls of agents and target agents, joint Q and V, three "
    "losses, backward, Adam)",
    ("sample", "buffers/episode.py"): "- of which sampling 32 episodes (EpisodeReplayBuffer.sample)",
    ("<built-in method torch.gru>", "~"): "- of which GRU unrolls, forward (torch.gru; acting's single steps too)",
    ("<method 'run_backward' of 'torch._C._EngineBase' objects>", "~"): "- of which backward",
    ("act", "algos/qtran.py"): "acting (one GRU step of every agent, epsilon-greedy over available actions)",
    ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
    ("add", "buffers/episode.py"): "storing the steps (EpisodeReplayBuffer.add, finish)",
    ("finish", "buffers/episode.py"): "storing the steps (EpisodeReplayBuffer.add, finish)",
}
PHASES["dcg"] = {
    ("update", "algos/dcg.py"): "updates (sampling, GRU unrolls, payoffs, max-sum of the targets' joint actions, "
    "backward, Adam)",
    ("<built-in method torch.gru>", "~"): "- GRU unrolls, forward (torch.gru; acting's single steps too)",
    ("payoffs", "algos/dcg.py:DCG"): "- payoff matrices of every edge (acting and updates)",
    ("max_sum", "algos/dcg.py"): "- max-sum message passing, 8 rounds (acting and updates' targets)",
    ("<method 'run_backward' of 'torch._C._EngineBase' objects>", "~"): "- backward",
    ("act", "algos/dcg.py"): "acting (one GRU step of every agent, payoffs, max-sum, epsilon-greedy)",
    ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
    ("add", "buffers/episode.py"): "storing the steps (EpisodeReplayBuffer.add, finish)",
    ("finish", "buffers/episode.py"): "storing the steps (EpisodeReplayBuffer.add, finish)",
}
PHASES["happo"] = {
    ("update_agent", "algos/happo.py"): "actor updates, agent after agent (10 epochs each, and each one's new ratios)",
    ("update_critic", "algos/happo.py"): "critic update (10 epochs)",
    ("act", "algos/happo.py"): "acting (each agent's actor forward, sampling)",
    ("value", "algos/happo.py:Team"): "critic values while acting",
    ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
    ("add", "buffers/rollout.py"): "storing the step (RolloutBuffer.add)",
    ("compute_gae", "buffers/rollout.py"): "targets (RolloutBuffer.compute_gae)",
}
for _algo, _cls in (("commnet", "CommNet"), ("ic3net", "IC3Net"), ("tarmac", "TarMAC")):
    PHASES[_algo] = {
        ("update", f"algos/{_algo}.py"): "PPO update (10 epochs on whole sequences, through time and messages)",
        ("unroll", f"algos/{_algo}.py"): "- of which the unroll, forward (25 GRU-cell steps, messages at each)",
        ("messages", f"algos/{_algo}.py:{_cls}"): "- messages, forward (acting and unrolls)",
        ("<method 'run_backward' of 'torch._C._EngineBase' objects>", "~"): "- backward",
        ("act", f"algos/{_algo}.py"): "acting (encoders, messages, a GRU-cell step, sampling; at truncations too)",
        ("step", "envs/mpe/vec_env.py"): "env step (Numba MPE, 128 envs)",
        ("add", "buffers/rollout.py"): "storing the step (RolloutBuffer.add)",
    }
# a newer script beside the one it extends: (script, its flags); the communication scripts beside recurrent MAPPO
SIBLINGS = {"qtran": ("qmix", ""), "dcg": ("qmix", ""), "happo": ("mappo", ""), "commnet": ("mappo", "--rnn"),
            "ic3net": ("mappo", "--rnn"), "tarmac": ("mappo", "--rnn")}  # fmt: skip
SUBPROC_ALGOS = ("mappo", "maddpg")  # also timed with mpe2 in worker processes (--vector subproc)
# published variants (results/<env>/<algo>-<variant>.json) timed too, on the Numba MPE: their flags
VARIANTS_OF_SIBLINGS = {"mappo": ["--rnn"]}  # timed when a communication script is timed beside it
VARIANTS = {"maddpg": ["--train-frequency 64", "--batch-size 1024"], "iddpg": ["--train-frequency 64"]}


def run_dir_of(algo, backend, threads, workdir, vector="sync", extra="", tag=""):
    """The run directory sps() trains into under `workdir` (bench_malloc.py reads the runs' losses there)."""
    return Path(workdir) / f"{algo}_{backend}_{vector}_{threads}{extra.replace(' ', '').replace('-', '_')}{tag}"


def sps(algo, backend, steps, threads, workdir, vector="sync", extra="", env=None, tag=""):
    """env-steps/s of one training run of algos/<algo>.py (its last SPS point) and the command; `env`: the process's
    environment variables (default: this one's)."""
    run_dir = run_dir_of(algo, backend, threads, workdir, vector, extra, tag)
    flags = f"--backend {backend} --total-timesteps {steps} --eval-interval 0 --eval-episodes 1 --final-eval-episodes 0"
    flags += f" --torch-threads {threads}"
    flags += f" --vector {vector}" * (vector != "sync") + f" {extra}" * bool(extra)
    cmd = [sys.executable, str(ROOT / "algos" / f"{algo}.py"), *flags.split(), "--run-dir", str(run_dir)]
    run_or_exit(cmd, cwd=ROOT, env=env)
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc.Scalars("charts/SPS")[-1].value, " ".join(cmd[1:]).replace(str(ROOT) + "/", "")


def raw_mpe2(steps=3000, repeats=5):
    """env-steps/s of a bare mpe2 simple_spread_v3 loop (random actions, 1 env): the reference of this run."""
    env = build_parallel_env("simple_spread_v3")
    actions = np.random.default_rng(0).integers(0, 5, (steps, 3))
    raw_loop(env, actions[:50])  # warm-up
    return steps / statistics.median(raw_loop(env, actions) for _ in range(repeats))


def profile(algo, steps, workdir):
    """Seconds in the script's main() and per phase of PHASES[algo], from one cProfile'd Numba-MPE run."""
    prof = Path(workdir) / f"{algo}.prof"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), str(ROOT / "algos" / f"{algo}.py"), "--backend", "numba",
           "--total-timesteps", str(steps), "--eval-interval", "0", "--eval-episodes", "1",
           "--final-eval-episodes", "0", "--run-dir", str(Path(workdir) / f"prof_{algo}")]  # fmt: skip
    run_or_exit(cmd, cwd=ROOT)
    stats = pstats.Stats(str(prof)).stats
    main = next(v[3] for (f, _, name), v in stats.items() if name == "main" and f.endswith(f"algos/{algo}.py"))
    rows = {}
    for (f, line, name), (_, _, _, cumtime, _) in stats.items():
        for (fn, suffix), label in PHASES[algo].items():
            path, _, cls = suffix.partition(":")  # "file:Class": that class's method of this name only
            if name == fn and f.endswith(path) and (not cls or line == method_line(ROOT / path, cls, fn)):
                rows[label] = rows.get(label, 0.0) + cumtime
    return main, rows


def method_line(path, cls, name):
    """The line of `def name` inside `class cls` of a source file (what cProfile keys a method by)."""
    lines = Path(path).read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"class {cls}("))
    return next(i + 1 for i, ln in enumerate(lines[start:], start) if ln.strip().startswith(f"def {name}("))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive(int), default=320_000, help="env steps per Numba-MPE run")
    parser.add_argument("--pz-steps", type=positive(int), default=64_000, help="env steps per mpe2 (PettingZoo) run")
    parser.add_argument("--algos", type=scripts, help="comma-separated scripts",
                        default="mappo,ippo,maddpg,matd3,iddpg,masac,isac,iql,vdn,qmix,wqmix,coma,vdac")  # fmt: skip
    parser.add_argument("--out", type=out_folder, default=OUT)
    parser.add_argument("--name", default="train", help="file names of the report: <out>/<name>.md and .json")
    args = parser.parse_args()
    load_before, rows = os.getloadavg(), []
    raw = raw_mpe2()
    print(f"raw mpe2 loop: {raw:,.0f} env-steps/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            runs = [("numba", args.steps, 1, "sync", "")]
            runs += [("numba", args.steps, 2, "sync", "")] if algo in ("mappo", "ippo") else []
            runs += [("pettingzoo", args.pz_steps, 1, "sync", "")]
            runs += [("pettingzoo", args.pz_steps, 1, "subproc", "")] if algo in SUBPROC_ALGOS else []
            runs += [("numba", args.steps, 1, "sync", extra) for extra in VARIANTS.get(algo, [])]
            if any(SIBLINGS.get(a, ("", ""))[0] == algo and SIBLINGS[a][1] for a in args.algos.split(",")):
                runs += [("numba", args.steps, 1, "sync", x) for x in VARIANTS_OF_SIBLINGS.get(algo, [])]
            for backend, steps, threads, vector, extra in runs:
                value, cmd = sps(algo, backend, steps, threads, tmp, vector, extra)
                rows.append(dict(algo=algo, backend=backend, vector=vector, torch_threads=threads, steps=steps,
                                 flags=extra, sps=value, command=cmd))  # fmt: skip
                print(f"{algo:6s} {backend:10s} {vector:7s} threads={threads} {extra}: {value:,.0f} env-steps/s",
                      flush=True)  # fmt: skip
        profiles = {algo: profile(algo, args.steps, tmp) for algo in PHASES if algo in args.algos.split(",")}
    report = dict(date=date.today().isoformat(), cpu=cpu_name(), cores=os.cpu_count(), python=platform.python_version(),
                  load_average_before=load_before, load_average=os.getloadavg(),
                  command=" ".join(["python bench/bench_train.py", *sys.argv[1:]]), runs=rows,
                  raw_mpe2_env_steps_per_s=raw,
                  profiles={a: dict(main_seconds=t, phases=ph) for a, (t, ph) in profiles.items()})  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(report))
    print((args.out / f"{args.name}.md").read_text())


def markdown(report):
    """train.md from the report: the speed table, the ratios measured side by side, the profiles."""
    loads = [", ".join(f"{x:.1f}" for x in report[k]) for k in ("load_average_before", "load_average")]
    lines = [
        # the scripts in the heading: several of these files stand side by side in results/README.md
        "# End-to-end training speed (env-steps/s): " + ", ".join(dict.fromkeys(r["algo"] for r in report["runs"])),
        "",
        f"Measured {report['date']} on {report['cpu']} ({report['cores']} cores), load average {loads[0]} before and "
        f"{loads[1]} after. Regenerate: `{report['command']}`.",
        "Settings: the scripts' defaults (PPO: 128 envs, 25-step rollouts, 1 minibatch, 10 epochs; DDPG family: 128 "
        "envs, batch 256 every 256 transitions, 25k random steps first; value decomposition (iql, vdn, qmix, wqmix): "
        "128 envs, GRU agents, 32 whole episodes every 200 env steps after 10k steps; COMA: 16 envs, 25-step rollouts; "
        "VDAC: as PPO), evaluation off; "
        "'other flags': a published variant's (results/README.md).",
        "",
        "| script | backend | vector | torch threads | other flags | env-steps/s | command |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['algo']} | {r['backend']} | {r['vector']} | {r['torch_threads']} | {r.get('flags') or '—'} | "
        f"{r['sps']:,.0f} | `{r['command']}` |"
        for r in report["runs"]
    ]
    raw = report["raw_mpe2_env_steps_per_s"]
    lines += [
        "",
        f"Measured in the same run: a bare mpe2 simple_spread_v3 loop (1 env, random actions, no learning) steps "
        f"**{raw:,.0f} env-steps/s**. Ratios, each script against itself on mpe2 (sync) and against that bare loop:",
        "",
        "| script | Numba MPE / mpe2 sync | Numba MPE / bare mpe2 loop | best mpe2 run / bare mpe2 loop |",
        "|---|---|---|---|",
    ]
    for algo in dict.fromkeys(r["algo"] for r in report["runs"]):
        mine = [r for r in report["runs"] if r["algo"] == algo and r["torch_threads"] == 1 and not r.get("flags")]
        numba = next(r["sps"] for r in mine if r["backend"] == "numba")
        pz = next(r["sps"] for r in mine if r["backend"] == "pettingzoo" and r["vector"] == "sync")
        best_pz = max(r["sps"] for r in mine if r["backend"] == "pettingzoo")
        lines.append(f"| {algo} | {numba / pz:.1f}x | {numba / raw:.1f}x | {best_pz / raw:.2f}x |")
    numba = {(r["algo"], r.get("flags") or ""): r["sps"] for r in report["runs"] if r["backend"] == "numba"
             and r["torch_threads"] == 1}  # fmt: skip
    pairs = [(a, b) for a, b in SIBLINGS.items() if (a, "") in numba and b in numba]
    if pairs:
        lines += ["", "Beside its nearest sibling, measured in the same run (Numba MPE, 1 thread):", "",
                  "| script | sibling | script / sibling |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {a} | {' '.join(b).strip()} | {numba[(a, '')] / numba[b]:.2f}x |" for a, b in pairs]
    lines += [
        "",
        "Reference points on this machine class: the reference library's MAPPO trains at ~900 env-steps/s, its "
        "MADDPG at ~1,900, its IQL at ~1,980 and its QMIX at ~1,860 (feed-forward agents, 16 envs).",
    ]
    for algo, prof in report["profiles"].items():
        total = prof["main_seconds"]
        lines += [
            "",
            f"## Where the time goes: {algo.upper()}, Numba MPE, 1 thread ({total:.1f} s in main, cProfile)",
            "",
            "| phase | seconds | share of main |",
            "|---|---|---|",
        ]
        order = list(dict.fromkeys(PHASES.get(algo, {}).values()))  # parents before their "- of which" rows
        phases = sorted(prof["phases"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
        lines += [f"| {k} | {v:.2f} | {100 * v / total:.0f}% |" for k, v in phases]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
