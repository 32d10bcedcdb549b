"""EPyMARL itself (uoe-agents/epymarl) on our protocol, as a row beside ours (issue 42, part 4).

EPyMARL is not on PyPI and not our dependency: install it apart (results/epymarl_benchmark.md says how), then

    python results/epymarl_peer.py --epymarl ~/epymarl --python ~/epymarl/.venv/bin/python --config qmix \\
        --env-id Foraging-8x8-2p-2f-coop --seeds 3 --total-timesteps 2000000 --eval-interval 50000

For each seed, EPyMARL's own `src/main.py` trains with its own config (`--config`, its `gymma` env on the package,
its time limit, its periodic tests of `--eval-episodes` episodes every `--eval-interval` steps) and saves its final
agent. This script then rebuilds that agent (EPyMARL's RNNAgent: fc1 and a ReLU, a GRUCell, or a Linear and a ReLU
where the config has no RNN, fc2; fed the observation, the last action where the config says, and the agent's
one-hot id) and plays it greedily on protocol v2's 1000 fixed episodes of the package (runtime/evaluation.py), as every
script of ours ends. It writes the run directory that collect.py reads: EPyMARL's periodic tests as TensorBoard
scalars, divided by the number of agents (EPyMARL logs the team's sum; our rows hold the mean over agents),
final_eval.json, config.json and run.json. The row is `results/<env_id>/<config>-epymarl.json`.

What differs from our runs, on purpose: EPyMARL's periodic tests play its own episodes, and sample the actions of its
policy-gradient configs (its `soft_policies` selector); only the final policy is played on our fixed episodes.

A seed stops and resumes, as ours do. EPyMARL runs through results/epymarl_launch.py (its main.py, its code unchanged,
with hooks that save what its own checkpoints leave out: target networks, running statistics, update counters and the
replay buffer). A SIGTERM or SIGINT to this script is passed on: EPyMARL finishes its episode, saves and exits, and the
same command later resumes the seed from that save (or, after a crash, from its last save of every
`--save-interval` steps). The seed's row joins its segments: EPyMARL's tests up to each resume, its wall time summed.
What a resume does not keep: the random number streams, restarted from the seed. A resume removes the older saves;
`--keep-every N` keeps the agent of the first save in each span of N steps (<run dir>/kept/) and plays each on the same
fixed episodes at the seed's end (<run dir>/kept_evals.json): what the seed scores at shorter budgets, from one run.

Commands may split the seeds between them (`--seeds 0,1` and `--seeds 2,`), side by side: each seed's directory is
locked while it trains (the lock results/run.py's sweeps take), a seed held by another command is skipped with a line,
and the row each command writes at its end holds every finished seed of the task and config.

A setting other than EPyMARL's own, a shorter budget say, is a row of its own: `--variant 5m` writes
`<config>-epymarl-5m.json` from runs of its own folder, as results/run.py's `--variant` does for our scripts. A longer
row can go on from a shorter one's finished seeds (`--extend mappo-epymarl-5m`): each seed starts from that row's last
save (EPyMARL's MAPPO has no schedule tied to t_max, so this is the run it would have been), and its row joins the
shorter row's tests and wall time to its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from collect import (
    CONFIG_NAME,
    EVAL_TAG,
    FINAL_EVAL_NAME,
    KEPT_EVALS_NAME,
    LOG_NAME,
    RECORD_NAME,
    RESULTS_DIR,
    SPS_TAG,
    collect,
    finished_runs,
    git_commit,
    is_finished,
    read_json,
    run_dir_for,
)
from make_readme import team_size
from run import claim, failure_reason, is_label, parse_seeds, probe_hardware, probe_versions, utc_now, variant_name

ROOT = RESULTS_DIR.parent
# EPyMARL's gymma env by the package's registered id, and the benchmark's time limit: per registry family
PACKAGE_IDS = {"lbf": ("lbforaging:{}-v3", 50), "rware": ("rware:{}-v2", 500)}
# EPyMARL's keys that differ between seeds by design, or with where a seed was resumed
PER_SEED_CONFIG = {"seed", "local_results_path", "unique_token", "checkpoint_path", "load_step"}
LAUNCHER = Path(__file__).resolve().with_name("epymarl_launch.py")
STOPPED = 75  # epymarl_launch.py's exit status after a signal and its save
KEPT = "kept"  # <run dir>/kept/<t_env>/agent.th: the agents --keep-every keeps from EPyMARL's saves


class Stopped(Exception):
    """EPyMARL stopped on a signal and saved: the same command resumes the seed."""


class EPyMARLAgent(nn.Module):
    """EPyMARL's RNNAgent (src/modules/agents/rnn_agent.py), rebuilt from the state dict it saves as agent.th: its
    shapes give the widths, and its keys whether the middle layer is a GRUCell (use_rnn) or a Linear."""

    def __init__(self, state: dict[str, torch.Tensor]):
        super().__init__()
        hidden, d_in = state["fc1.weight"].shape
        self.fc1 = nn.Linear(d_in, hidden)
        self.rnn = nn.GRUCell(hidden, hidden) if "rnn.weight_ih" in state else nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, state["fc2.weight"].shape[0])
        self.load_state_dict(state)

    def forward(self, x, h):  # x (B, d_in), h (B, hidden) -> Q-values or logits (B, n_actions), h
        x = F.relu(self.fc1(x))
        h = self.rnn(x, h) if isinstance(self.rnn, nn.GRUCell) else F.relu(self.rnn(x))
        return self.fc2(h), h


def acting(agent: EPyMARLAgent, last_action: bool, agent_id: bool):
    """The greedy policy of an EPyMARL agent in runtime/evaluation.py's form: make(num_envs, rng) -> act(obs, done).
    Its inputs are EPyMARL's basic controller's: the observation, the last action's one-hot (zeros at an episode's
    first step), the agent's one-hot id; the action is the argmax of its outputs (Q-values, or a policy's logits)."""
    n_actions, hidden = agent.fc2.out_features, agent.fc1.out_features

    def make(num_envs, rng):
        state = {}

        def act(obs, done):
            (group,) = obs.obs  # one team: LBF's and RWARE's agents
            x = torch.as_tensor(obs.obs[group], dtype=torch.float32).flatten(2)  # (E, A, d)
            E, A = x.shape[:2]
            if not state:
                state.update(h=torch.zeros(E, A, hidden), last=torch.zeros(E, A, n_actions))
            if done is not None:  # a finished env starts its next episode from scratch
                state["h"][torch.as_tensor(done)] = 0.0
                state["last"][torch.as_tensor(done)] = 0.0
            parts = [x, state["last"]] if last_action else [x]
            parts += [torch.eye(A).expand(E, A, A)] if agent_id else []
            out, h = agent(torch.cat(parts, -1).reshape(E * A, -1), state["h"].reshape(E * A, hidden))
            actions = out.reshape(E, A, n_actions).argmax(-1)
            state["h"], state["last"] = h.reshape(E, A, hidden), F.one_hot(actions, n_actions).float()
            return {group: actions.numpy()}

        return act

    return make


def package_key(env_id: str) -> tuple[str, int]:
    """EPyMARL's env key of a task (the package's registered id) and its time limit; a ValueError for other envs."""
    from envs.registry import REGISTRY, lookup

    entry = lookup(env_id)
    if entry is None or entry.family not in PACKAGE_IDS:
        tasks = ", ".join(name for name, e in REGISTRY.items() if e.family in PACKAGE_IDS)
        raise ValueError(
            f"{env_id!r} is not a Level-Based Foraging or Multi-Robot Warehouse task; the benchmark's: {tasks}"
        )
    key, limit = PACKAGE_IDS[entry.family]
    return key.format(env_id), limit


def sacred_segments(epymarl: Path, config: str, key: str, seed: int, results_path: Path) -> list[dict]:
    """The sacred runs (EPyMARL's results/sacred/<config>/<key>/<id>/) that trained this seed's run directory, in the
    order they ran, less any that a later one replaced by starting again from the same or an earlier step. Each:
    {dir, from_step (the save it resumed from, 0 for a fresh start), status, wall_s (start to stop, or to the last
    heartbeat of a run that was killed)}."""
    runs = []
    for run_dir in (epymarl / "results" / "sacred" / config / key).glob("[0-9]*"):
        run, cfg = read_json(run_dir / "run.json") or {}, read_json(run_dir / "config.json") or {}
        if cfg.get("seed") != seed or cfg.get("local_results_path") != str(results_path) or "start_time" not in run:
            continue
        start = datetime.fromisoformat(run["start_time"])
        end = datetime.fromisoformat(run.get("stop_time") or run.get("heartbeat") or run["start_time"])
        from_step = int(cfg.get("load_step") or 0) if cfg.get("checkpoint_path") else 0
        runs.append(dict(dir=run_dir, from_step=from_step, status=run.get("status"), start=start,
                         wall_s=(end - start).total_seconds()))  # fmt: skip
    chain = []
    for segment in sorted(runs, key=lambda r: r["start"]):
        while chain and chain[-1]["from_step"] >= segment["from_step"]:
            chain.pop()
        chain.append(segment)
    return chain


def series(info: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A metric sacred logged: (steps, values); its values are jsonpickle'd numpy floats or plain numbers."""
    values = [v["value"] if isinstance(v, dict) else v for v in info[name]]
    return np.asarray(info[f"{name}_T"], dtype=np.int64), np.asarray(values, dtype=np.float64)


def chained_series(chain: list[dict], name: str) -> tuple[np.ndarray, np.ndarray]:
    """A metric over a seed's segments: each segment's points up to the step the next one resumed from."""
    steps, values = [np.zeros(0, np.int64)], [np.zeros(0)]
    for segment, after in zip(chain, [*chain[1:], None], strict=False):  # the last is followed by None
        info = read_json(segment["dir"] / "info.json") or {}
        if name not in info:
            continue
        t, v = series(info, name)
        keep = t <= after["from_step"] if after else np.ones(len(t), bool)
        steps.append(t[keep])
        values.append(v[keep])
    return np.concatenate(steps), np.concatenate(values)


def saves(run_dir: Path) -> list[tuple[int, Path]]:
    """EPyMARL's saves of this seed (models/<token>/<t_env>/, a token per segment) as (t_env, folder), oldest first."""
    return sorted((int(p.parent.name), p.parent) for p in (run_dir / "epymarl" / "models").glob("*/*/agent.th"))


def newest_save_only(run_dir: Path) -> tuple[int, Path] | None:
    """The save a seed resumes from, its newest; the older ones are removed (nothing reads them)."""
    found = saves(run_dir)
    for _, folder in found[:-1]:
        shutil.rmtree(folder)
    for token in (run_dir / "epymarl" / "models").glob("*"):
        if token.is_dir() and not any(token.iterdir()):
            token.rmdir()
    return found[-1] if found else None


def keep_saves(run_dir: Path, every: int) -> list[int]:
    """Copy the agent of the first save in each span of `every` env steps (step 0's untrained one included) to
    <run dir>/kept/<t_env>/, out of newest_save_only's reach, and return the kept steps: the seed's policy at shorter
    budgets, from the one run. Called before each resume and at the end, so every save EPyMARL wrote is seen."""
    kept = run_dir / KEPT
    steps = {int(agent.parent.name) for agent in kept.glob("*/agent.th")}
    spans = {step // every for step in steps}
    for step, folder in saves(run_dir):
        if step // every not in spans:
            (kept / str(step)).mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / "agent.th", kept / str(step) / "agent.th")
            steps.add(step)
            spans.add(step // every)
    return sorted(steps)


def final_agent(run_dir: Path) -> tuple[Path, int]:
    """The agent.th EPyMARL saved last (at the end of training: epymarl_launch.py's last save) and its t_env."""
    found = saves(run_dir)
    if not found:
        raise RuntimeError(f"EPyMARL saved no agent under {run_dir / 'epymarl' / 'models'}")
    step, folder = found[-1]
    return folder / "agent.th", step


def play_save(agent_th: Path, cfg: dict, env_id: str) -> np.ndarray:
    """The returns of an EPyMARL save's agent (its agent.th, and its run's config.json as `cfg`) played greedily on
    protocol v2's fixed episodes of the package, as every run of ours ends: a seed's final evaluation, or an earlier
    save's (a shorter budget)."""
    from runtime.args import MultiAgentArgs, make_eval_env
    from runtime.evaluation import FINAL_EPISODES, FINAL_SEED, evaluate

    agent = EPyMARLAgent(torch.load(agent_th, map_location="cpu", weights_only=True))
    make_greedy = acting(agent, cfg["obs_last_action"], cfg["obs_agent_id"])
    ours = MultiAgentArgs(env_id=env_id)
    returns, _ = evaluate(lambda n, s: make_eval_env(ours, n, s), make_greedy, FINAL_EPISODES, FINAL_SEED)
    return returns


def wait_passing_on_signals(proc: subprocess.Popen) -> int:
    """Wait for EPyMARL; a SIGTERM or SIGINT to this script reaches it as a SIGTERM (it then saves and exits)."""
    received = []

    def pass_on(signum, frame):
        received.append(signum)
        proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received or code == STOPPED:
        raise Stopped(f"EPyMARL stopped (exit status {code}) after a signal")
    return code


def row_name(text: str) -> str:
    """--extend's row: a result's label (mappo-epymarl-5m), which names its runs' folder."""
    if not is_label(text):
        raise argparse.ArgumentTypeError(f"--extend {text!r}: name a row, as <config>-epymarl-<variant>")
    return text


def row_label(args) -> str:
    """The row's name, and its runs' folder: <config>-epymarl, or <config>-epymarl-<variant>."""
    return f"{args.config}-epymarl" + (f"-{args.variant}" if args.variant else "")


def extend_from(args, seed: int, run_dir: Path) -> Path | None:
    """--extend: the shorter row's run directory of this seed (None without the flag). A seed not started yet gets
    that run's last save (the launcher's state with it) and its kept agents, so that EPyMARL goes on from its end.
    Raises RuntimeError when that seed is not finished, ran another config or as long."""
    if not args.extend:
        return None
    source = run_dir_for(args.out, args.env_id, args.extend, seed)
    record = read_json(source / RECORD_NAME) or {}
    if not is_finished(source):
        raise RuntimeError(f"--extend {args.extend}: seed {seed} has no finished run there ({source}); finish it first")
    if (ran := (read_json(source / CONFIG_NAME) or {}).get("epymarl_config")) != args.config:
        raise RuntimeError(f"--extend {args.extend}: seed {seed} ran EPyMARL's {ran}, not --config {args.config}")
    if record.get("total_timesteps", 0) >= args.total_timesteps:
        raise RuntimeError(f"--extend {args.extend}: seed {seed} ran {record.get('total_timesteps'):,} steps, as many "
                           f"as --total-timesteps {args.total_timesteps:,} or more: nothing to extend")  # fmt: skip
    if not saves(run_dir):
        step, folder = saves(source)[-1]
        shutil.copytree(folder, run_dir / "epymarl" / "models" / folder.parent.name / str(step))
        if (source / KEPT).is_dir():
            shutil.copytree(source / KEPT, run_dir / KEPT, dirs_exist_ok=True)
        print(f"     extending {args.extend}'s seed {seed} from its last save, at step {step:,}", flush=True)
    return source


def train_seed(args, seed: int, run_dir: Path, sweep_command: str) -> None:
    """One seed: EPyMARL trains (or resumes) and saves its agent, we play it on the fixed episodes and write the run
    directory. Raises Stopped when a signal stopped it, RuntimeError when EPyMARL failed."""
    from torch.utils.tensorboard import SummaryWriter

    from runtime.evaluation import FINAL_EPISODES, FINAL_SEED

    key, limit = package_key(args.env_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    results_path = run_dir.resolve() / "epymarl"
    argv = [str(args.python), str(LAUNCHER), f"--config={args.config}", "--env-config=gymma", "with",
            f"env_args.time_limit={limit}", f"env_args.key={key}", f"seed={seed}", f"t_max={args.total_timesteps}",
            "use_cuda=False", f"test_interval={args.eval_interval}", f"test_nepisode={args.eval_episodes}",
            "save_model=True", f"save_model_interval={args.save_interval}",
            f"local_results_path={results_path}"]  # fmt: skip
    source = extend_from(args, seed, run_dir)
    if args.keep_every:
        keep_saves(run_dir, args.keep_every)
    resume = newest_save_only(run_dir)
    if resume is not None:
        step, folder = resume
        argv += [f"checkpoint_path={folder.parent}", f"load_step={step}"]
        print(f"     resuming from EPyMARL's save at step {step:,}", flush=True)
    env = os.environ | {"PYTHONPATH": str(args.stubs), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    record = dict(env_id=args.env_id, algo=row_label(args), seed=seed, total_timesteps=args.total_timesteps,
                  command=f"{sweep_command} --seeds {seed},", sweep_command=sweep_command,
                  epymarl_command=shlex.join(argv), commit=git_commit(), hardware=probe_hardware(),
                  versions=probe_versions(), start=utc_now())  # fmt: skip
    with open(run_dir / LOG_NAME, "a") as log:
        # its own session: a terminal's Ctrl-C reaches this script, which passes it on, not EPyMARL's env workers
        proc = subprocess.Popen(argv, cwd=args.epymarl, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        code = wait_passing_on_signals(proc)
    if code != 0:
        said = f" ({reason})" if (reason := failure_reason(run_dir / LOG_NAME)) else ""
        record.update(
            status="failed", error=f"EPyMARL exited with {code}{said}: see {run_dir / LOG_NAME}", end=utc_now()
        )
        (run_dir / RECORD_NAME).write_text(json.dumps(record, indent=2))
        raise RuntimeError(record["error"])
    chain = sacred_segments(args.epymarl, args.config, key, seed, results_path)
    if source is not None:  # the shorter row's segments come first
        chain = sacred_segments(args.epymarl, args.config, key, seed, source.resolve() / "epymarl") + chain
    if not chain or chain[-1]["status"] != "COMPLETED":
        sacred = args.epymarl / "results" / "sacred" / args.config / key
        raise RuntimeError(f"no completed sacred run of seed {seed} under {sacred}")
    cfg = read_json(chain[-1]["dir"] / "config.json")
    path, step = final_agent(run_dir)
    returns = play_save(path, cfg, args.env_id)
    final = dict(protocol="v2", episodes=len(returns), seed=FINAL_SEED, global_step=step, mean=float(returns.mean()),
                 std=float(returns.std()), returns=returns.tolist())  # fmt: skip
    (run_dir / FINAL_EVAL_NAME).write_text(json.dumps(final))
    if args.keep_every:  # the kept agents on the same episodes (the last is the final agent's save)
        evals = []
        for t in keep_saves(run_dir, args.keep_every):
            r = play_save(run_dir / KEPT / str(t) / "agent.th", cfg, args.env_id)
            evals.append(dict(global_step=t, mean=float(r.mean()), std=float(r.std())))
            print(f"     kept save at step {t:,}: {evals[-1]['mean']:.3f} on the fixed episodes", flush=True)
        kept = dict(protocol="v2", episodes=FINAL_EPISODES, seed=FINAL_SEED, every=args.keep_every, evaluations=evals)
        (run_dir / KEPT_EVALS_NAME).write_text(json.dumps(kept, indent=1))
    n_agents = team_size(args.env_id)
    wall = sum(segment["wall_s"] for segment in chain)
    writer = SummaryWriter(str(run_dir))
    for t, r in zip(*chained_series(chain, "test_return_mean"), strict=True):  # the team's sum -> mean over agents
        writer.add_scalar(EVAL_TAG, r / n_agents, int(t))
    writer.add_scalar(SPS_TAG, args.total_timesteps / max(wall, 1e-9), args.total_timesteps)
    writer.close()
    config = {k: v for k, v in cfg.items() if k not in PER_SEED_CONFIG}
    config = dict(env_id=args.env_id, seed=seed, total_timesteps=args.total_timesteps, run_dir=str(run_dir),
                  epymarl_config=args.config, eval_interval=args.eval_interval, eval_episodes=args.eval_episodes,
                  final_eval_episodes=FINAL_EPISODES, extends=args.extend, epymarl=config)  # fmt: skip
    (run_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2, default=str))
    segments = [dict(sacred_run=str(c["dir"]), from_step=c["from_step"], status=c["status"], wall_time_s=c["wall_s"])
                for c in chain]  # fmt: skip
    record.update(status="ok", returncode=0, error=None, end=utc_now(), wall_time_s=wall, segments=segments)
    (run_dir / RECORD_NAME).write_text(json.dumps(record, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epymarl", type=Path, required=True, help="a checkout of uoe-agents/epymarl")
    parser.add_argument("--python", type=Path, required=True, help="the interpreter of EPyMARL's own environment")
    stubs = "a folder on EPyMARL's PYTHONPATH (default <epymarl>/stubs): an empty smaclite package"
    parser.add_argument("--stubs", type=Path, default=None, help=stubs)
    parser.add_argument("--config", default="qmix", help="EPyMARL's algorithm config: src/config/algs/<config>.yaml")
    parser.add_argument("--env-id", required=True, help="an LBF or RWARE task of the registry")
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("3"), help="N (seeds 0..N-1) or a list '1,3'")
    parser.add_argument("--total-timesteps", type=int, required=True, help="EPyMARL's t_max")
    parser.add_argument("--eval-interval", type=int, default=50_000, help="EPyMARL's test_interval (env steps)")
    parser.add_argument("--eval-episodes", type=int, default=100, help="EPyMARL's test_nepisode")
    save = "EPyMARL's save_model_interval (env steps): a crashed seed resumes from its last save (a stopped one saves)"
    parser.add_argument("--save-interval", type=int, default=200_000, help=save)
    keep = ("keep the agent of EPyMARL's first save in each span of this many env steps and play each on the fixed "
            "episodes at the seed's end (<run dir>/kept_evals.json: the seed at shorter budgets; the row stays the "
            "final policy's)")  # fmt: skip
    parser.add_argument("--keep-every", type=int, default=None, help=keep)
    variant = "label of a setting not EPyMARL's own (a shorter --total-timesteps, say): row <config>-epymarl-<variant>"
    parser.add_argument("--variant", type=variant_name, default="", help=variant)
    extend = ("a shorter row of the same config (mappo-epymarl-5m): each seed starts from that row's last save of it, "
              "finished, and this row holds its tests and time too")  # fmt: skip
    parser.add_argument("--extend", type=row_name, default=None, metavar="ROW", help=extend)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root (default results/)")
    args = parser.parse_args(argv)
    try:
        package_key(args.env_id)
    except ValueError as e:
        parser.error(str(e))
    if not (args.epymarl / "src" / "main.py").is_file():
        parser.error(f"--epymarl {args.epymarl}: no src/main.py there; give a checkout of uoe-agents/epymarl")
    if not (configs := args.epymarl / "src" / "config" / "algs" / f"{args.config}.yaml").is_file():
        known = ", ".join(sorted(p.stem for p in configs.parent.glob("*.yaml")))
        parser.error(f"--config {args.config}: EPyMARL has no {configs}; its configs: {known or 'none there'}")
    if not (args.python.is_file() and os.access(args.python, os.X_OK)):
        parser.error(f"--python {args.python}: not an executable interpreter (EPyMARL's own environment)")
    counts = [args.total_timesteps, args.eval_interval, args.eval_episodes, args.save_interval]
    if min(counts + ([] if args.keep_every is None else [args.keep_every])) < 1:
        parser.error("--total-timesteps, --eval-interval, --eval-episodes, --save-interval and --keep-every must be "
                     "positive")  # fmt: skip
    if args.extend == row_label(args):
        parser.error(f"--extend {args.extend}: that is this row; name the shorter row (give this one a --variant)")
    args.stubs = args.stubs or args.epymarl / "stubs"
    algo = row_label(args)
    sweep_command = shlex.join(["python", "results/epymarl_peer.py", *(argv if argv is not None else sys.argv[1:])])
    for seed in args.seeds:
        run_dir = run_dir_for(args.out, args.env_id, algo, seed)
        if is_finished(run_dir):
            print(f"skip {args.env_id} {algo} seed {seed}: finished ({run_dir})")
            continue
        claimed = claim(run_dir)  # the lock results/run.py's sweeps take: one seed, one process
        if isinstance(claimed, str):
            print(f"skip {args.env_id} {algo} seed {seed}: {claimed}", flush=True)
            continue
        print(f"run  {args.env_id} {algo} seed {seed} -> {run_dir}", flush=True)
        try:
            train_seed(args, seed, run_dir, sweep_command)
        except Stopped as e:
            print(f"stopped: {e}; the same command resumes seed {seed} from its save", file=sys.stderr)
            return STOPPED
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            os.close(claimed)
    # the row holds every finished seed of the task and config, those another command ran included
    groups, _ = finished_runs(args.out, [args.env_id], [algo])
    paths, errors = collect(args.out, groups or {(args.env_id, algo): args.seeds})
    for path in paths:
        print(f"wrote {path}")
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
