"""What the fake algorithm scripts share: the algorithm-script CLI contract and a deterministic curve.

A fake run parses the flags every algorithm script takes, writes ``config.json``, real TensorBoard
scalars (tensorboard's own event writer: no torch import, so tests stay fast) and ``DONE``. Its
evaluation return at a step is ``offset + slope * step / total_timesteps + 0.5 * seed``, logged
at 20 evenly spaced steps; the tests recompute the expected numbers from this formula.

A run also writes ``last.pt`` (JSON here, not torch) after every evaluation, with the evaluations done;
``--resume DIR`` goes on after the evaluations that last.pt counts. At the end it writes ``final_eval.json`` as
runtime.Run.finish does (evaluation protocol v2): its final policy's return is the last evaluation's minus 1.0, over
two episodes (that - 0.5 and that + 0.5).

With ``FAKE_LAUNCH_LOG`` set, every launch appends "algo env_id seed pid" to that file (and " resume" when
resumed); ``FAKE_EVAL_SLEEP`` (seconds) slows each of the 20 evaluations, for tests of sweeps that overlap.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

NUM_EVALS = 20


def eval_return(step: int, total: int, seed: int, offset: float, slope: float) -> float:
    """The fake evaluation curve."""
    return offset + slope * step / total + 0.5 * seed


def parse_args(argv=None) -> argparse.Namespace:
    """The shared flags of an algorithm script."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--env-id", "--env", dest="env_id", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=1000)
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--num-envs", type=int, default=1)
    args = parser.parse_args(argv)
    if args.resume is not None:
        args.run_dir = args.resume
    if args.run_dir is None:
        parser.error("--run-dir is required")
    return args


def final_policy_return(step: int, total: int, seed: int, offset: float, slope: float) -> float:
    """The fake final policy's return (its final_eval.json's mean): the last evaluation's minus 1.0."""
    return eval_return(step, total, seed, offset, slope) - 1.0


def write_checkpoint(run_dir, state: dict) -> None:
    """last.pt as the scripts write theirs: whole or not at all (a reader never sees half a file)."""
    (run_dir / "last.pt.tmp").write_text(json.dumps(state))
    os.replace(run_dir / "last.pt.tmp", run_dir / "last.pt")


def main(algo: str, offset: float, slope: float, fail_after: int | None = None, hang: bool = False) -> None:
    """Run the fake: fail (exit 3) after ``fail_after`` evaluations, or hang forever when asked."""
    args = parse_args()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("FAKE_LAUNCH_LOG"):
        with open(os.environ["FAKE_LAUNCH_LOG"], "a") as f:
            f.write(f"{algo} {args.env_id} {args.seed} {os.getpid()}{' resume' if args.resume else ''}\n")
    done = json.loads((args.run_dir / "last.pt").read_text())["evals"] if args.resume else 0
    config = {**vars(args), "run_dir": str(args.run_dir), "algo": algo, "exp_name": algo}
    if not args.resume:
        (args.run_dir / "config.json").write_text(json.dumps(config, indent=2))
    print(f"{algo}: env {args.env_id} seed {args.seed} for {args.total_timesteps} steps")
    writer = EventFileWriter(str(args.run_dir))

    def log(tag: str, value: float, step: int) -> None:
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    for i in range(done + 1, NUM_EVALS + 1):
        step = i * args.total_timesteps // NUM_EVALS
        value = eval_return(step, args.total_timesteps, args.seed, offset, slope)
        log("charts/episodic_return", value - 1.0, step)
        log("charts/SPS", 1000.0 + 10 * args.seed, step)
        log("eval/episodic_return", value, step)
        log("eval/episodic_return/agent", value, step)
        writer.flush()
        write_checkpoint(args.run_dir, {"evals": i})
        time.sleep(float(os.environ.get("FAKE_EVAL_SLEEP", 0)))
        if fail_after is not None and i >= fail_after:
            writer.close()
            print(f"error: {algo}: boom, a deliberate failure at step {step}", file=sys.stderr)  # as scripts end
            sys.exit(3)
    while hang:
        time.sleep(1)
    writer.close()
    write_checkpoint(args.run_dir, {"evals": NUM_EVALS})
    mean = final_policy_return(args.total_timesteps, args.total_timesteps, args.seed, offset, slope)
    final = {"protocol": "v2", "episodes": 2, "seed": 10_000, "global_step": args.total_timesteps, "mean": mean,
             "std": 0.5, "returns": [mean - 0.5, mean + 0.5], "per_group": {"agent": mean}}  # fmt: skip
    (args.run_dir / "final_eval.json").write_text(json.dumps(final))
    (args.run_dir / "DONE").write_text("")
