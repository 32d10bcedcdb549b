"""`Run`: the run directory and everything written into it while a script trains.

* The directory is locked (`fcntl.flock` on `.lock`) while a run holds it: a second run into it is refused, and so
  is a new run into a directory that already holds one (continue that with --resume).
* `last.pt` is written at the start, at every evaluation, every --checkpoint-minutes, on a stop request and at the
  end, so a `kill -9` loses at most one interval. Writes are atomic (runtime.checkpoint).
* Ctrl-C and SIGTERM do not raise inside the script: they set a flag, and the next `run.step(...)` (a point where
  the script's state is consistent, e.g. between two updates) writes last.pt and stops with exit code 130. Further
  signals during the save wait for it (they are blocked while the file is written).
* A resume is exact where it can be: on an env that saves its state (`get_state`/`set_state`: the Numba MPE), a
  script that hands `run.step` its loop's state (`loop=`: what it carries from one step to the next besides the obs)
  and takes it back from `run.begin` steps on from its last.pt as if it had never stopped: same episodes, same
  transitions, same losses (with the replay buffer of a stop, the layer's RNG, weights and optimizers). Elsewhere
  the envs start new episodes at the resume, and the run says so.
* --self-play: every --self-play-interval env steps the learner's policy is written to `pool/step_<N>.pt` and the
  self-play group draws its next opponent from the last --self-play-pool of them (a resumed run reloads the pool).
* A non-finite loss stops the run (the script raises FloatingPointError) without writing: last.pt keeps the last
  sound state, from which `--resume <dir> --learning-rate <lower>` goes on.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import time

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from runtime.args import env_signature
from runtime.args import make_eval_env as standard_eval_env
from runtime.checkpoint import flag, load_checkpoint, pack, restore, rng_state, save_checkpoint, unpack, write_whole
from runtime.checks import CheckpointPlayed, RunFinished, RunStopped
from runtime.evaluation import (
    FINAL_SEED,
    add_video,
    check_filmable,
    evaluate,
    evaluate_checkpoint,
    periodic_seed,
    record,
)
from runtime.opponents import load_actor, self_play_source

REPLAY_NAME = "replay.npz"


def lock(run_dir: str):
    """An exclusive lock on `run_dir` for this process's lifetime (released by the OS even after kill -9)."""
    fd = os.open(os.path.join(run_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ValueError(f"{run_dir} is in use by another run (pid {holder}): wait for it, or pick another "
                         f"--run-dir") from None  # fmt: skip
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def resume_seed(seed: int, step: int) -> int:
    """The envs' seed at a resume from `step` that cannot restore them: drawn from (seed, step), below 2**31, so that
    the resumed run's episodes are neither its first ones again nor another resume's."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0] >> 1)


class Run:
    """The run around a script's training loop; see the module docstring.

    Args:
        args: the script's Args (RunArgs fields and the algorithm's own).
        algo: the script's name, e.g. "mappo" (checkpoints of another algorithm are refused).
        env: the training env (its signature is checked against a resumed checkpoint).
        nets, optimizers: name -> module / optimizer: what a checkpoint holds and --resume restores.
        rng: the script's numpy Generator (saved and restored with torch's RNG).
        make_greedy: a `runtime.opponents.MakePolicy`, `(num_envs, rng) -> act(obs, done) -> {group: actions}`, greedy:
            the evaluations and --eval-checkpoint play it.
        network_flags: flags that shape the networks; a resumed checkpoint must have the same.
        same_flags: flags that shape the run (e.g. num_steps); --num-envs is always one.
        make_eval_env: `(num_envs, seed) -> env` (default: protocol v2's standard env with the script's flags).
        replay: an off-policy script's replay buffer: --resume reloads it from replay.npz when a stop wrote one
            (`run.replay_restored`), and a stop request writes it there with --save-buffer.
    """

    def __init__(self, args, algo, env, nets, optimizers, rng, make_greedy, *, network_flags=(), same_flags=(),
                 replay=None, make_eval_env=None):  # fmt: skip
        self.args, self.algo, self.nets, self.optimizers, self.rng = args, algo, nets, optimizers, rng
        self.make_greedy, self.replay, self.replay_restored, self.env = make_greedy, replay, False, env
        self.make_eval_env = make_eval_env or (lambda n, seed: standard_eval_env(args, n, seed))
        check_filmable(args)
        if args.eval_checkpoint:  # play that checkpoint instead of training: nothing is written
            evaluate_checkpoint(args, algo, env, nets, self.make_eval_env, make_greedy, network_flags)
            raise CheckpointPlayed(args.eval_checkpoint)
        self.signature = env_signature(env)
        self.global_step, self.evals, self.best_eval, self.counters = 0, 0, -np.inf, {}
        self.last_eval, self.last_eval_step, self.stop_signal = float("nan"), -1, None
        self.loop = self.resumed_loop = None
        self.lock = self.bar = self.writer = None

        def request_stop(signum, frame):  # honoured at the next run.step(), where the script's state is consistent
            self.stop_signal = signum

        # from here on Ctrl-C and SIGTERM set a flag: no run directory is left half made
        self.previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.open_dir(env, network_flags, same_flags)
        except BaseException:
            self.close()  # the signals back, the directory free (a refused resume, a used --run-dir, ...)
            raise

    def open_dir(self, env, network_flags, same_flags) -> None:
        """The run directory, new or resumed (--resume: the networks, optimizers, RNG and replay of its last.pt),
        then its writer, the progress bar and the self-play pool."""
        args, algo = self.args, self.algo
        if args.resume:
            self.dir = args.resume
            self.lock = lock(self.dir)
            path = os.path.join(self.dir, "last.pt")
            ckpt = load_checkpoint(path, algo, args, self.signature, network_flags, ("num_envs", *same_flags))
            restore(ckpt, path, self.nets, self.optimizers, self.rng)
            if not os.path.exists(os.path.join(self.dir, "config.json")):  # stopped between last.pt and it
                self.write_config(env)
            if os.path.exists(os.path.join(self.dir, "DONE")):
                if ckpt["global_step"] >= args.total_timesteps:  # nothing to train: it would only evaluate again
                    raise RunFinished(f"{self.dir} finished at step {ckpt['global_step']:,}; --total-timesteps "
                                      f"{args.total_timesteps:,} asks for no more: nothing to train (its final "
                                      f"evaluation stands in final_eval.json; a larger --total-timesteps trains it "
                                      f"on)")  # fmt: skip
                os.remove(os.path.join(self.dir, "DONE"))  # it trains again, e.g. to a larger --total-timesteps
            self.global_step, self.evals, self.best_eval = ckpt["global_step"], ckpt["evals"], ckpt["best_eval"]
            self.counters, self.saved_step = dict(ckpt["counters"]), self.global_step
            same_dir = ("resume", "run_dir")  # --resume continues in the run's own directory
            changed = {k: v for k, v in self.config().items() if ckpt["args"].get(k) != v and k not in same_dir}
            with open(os.path.join(self.dir, "resumes.jsonl"), "a") as f:  # config.json stays the first run's
                f.write(json.dumps({"time": time.time(), "global_step": self.global_step, "changed": changed}) + "\n")
            if changed:
                print("resumed with other flags: " + ", ".join(f"{flag(k)} {v}" for k, v in changed.items()))
            self.restore_replay(ckpt)
            self.restore_loop(ckpt)
        else:
            self.dir = args.run_dir or f"runs/{args.env_id}__{algo}__{args.seed}__{int(time.time())}"
            os.makedirs(self.dir, exist_ok=True)
            self.lock = lock(self.dir)
            if taken := [n for n in ("last.pt", "best.pt", "config.json") if os.path.exists(os.path.join(self.dir, n))]:
                raise ValueError(f"{self.dir} already holds a run ({', '.join(taken)}): continue it with --resume "
                                 f"{self.dir}, or pick another --run-dir")  # fmt: skip
            # last.pt first: a directory that holds anything holds what --resume needs, even after a kill -9 here
            self.save("last.pt")
            self.write_config(env)
        if args.track:
            import wandb

            name = os.path.basename(os.path.normpath(self.dir))
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=self.config(), name=name,
                       sync_tensorboard=True)  # fmt: skip
        self.writer = SummaryWriter(self.dir)
        every = args.eval_interval
        self.next_eval = (self.global_step // every + 1) * every if every else None
        self.bar = tqdm(total=args.total_timesteps, initial=self.global_step, unit="step", dynamic_ncols=True)
        self.start_time, self.start_step = time.time(), self.global_step
        self.saved_at = time.time()
        if getattr(args, "self_play", None):
            self.start_self_play()

    def config(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self.args)))

    def write_config(self, env) -> None:
        with open(os.path.join(self.dir, "config.json"), "w") as f:
            json.dump(self.config() | {"env_class": type(env).__name__}, f, indent=2)

    # --- the loop's side ---
    def begin(self, obs, **loop):
        """Where the loop starts: `(obs, *loop.values())` as given, or on --resume the env's state and the loop's
        (each `loop` name, as `step(loop=...)` last saved it) at the step last.pt holds."""
        if self.resumed_loop is None:
            if self.args.resume and self.global_step > 0:  # new episodes, not the run's very first ones again
                obs = self.env.reset(seed=resume_seed(self.args.seed, self.global_step))
            return (obs, *loop.values())
        device = torch.device("cuda" if getattr(self.args, "cuda", False) else "cpu")  # hidden states, losses
        env_state, saved = unpack(self.resumed_loop[0]), unpack(self.resumed_loop[1], device)
        if saved.keys() != loop.keys():
            raise ValueError(f"{self.dir}/last.pt holds the loop state {sorted(saved)}, and this script carries "
                             f"{sorted(loop)}: resume it with the version of the script that wrote it")  # fmt: skip
        return (self.env.set_state(env_state), *saved.values())

    def saves_env(self):
        """The env's `get_state`, or None where it has none (a FrozenEnv's actors, PettingZoo, Gymnasium)."""
        return getattr(self.env, "get_state", None)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if isinstance(error, FloatingPointError):  # nothing is written: last.pt holds the last sound state
            self.close()
            where = f"{self.dir}/last.pt holds step {self.saved_step}, the last checkpoint before it"
            raise FloatingPointError(f"{error}; {where}: continue with --resume {self.dir} and a lower learning rate")
        if error is not None and not isinstance(error, RunStopped):
            self.close()
        return False

    def step(self, global_step: int, loop: dict | None = None, **counters) -> None:
        """After each iteration (or env step) of the loop: progress, evaluation, periodic last.pt, stop requests.

        `counters` are the script's own counters (e.g. iteration=...), saved in checkpoints and restored by
        --resume into `run.counters`. `loop`: what the loop carries to its next step besides the observations
        (arrays, tensors, numbers), saved with the env's state in every last.pt and given back by `begin`.
        """
        self.global_step, self.counters, self.loop = global_step, counters, loop
        self.bar.update(global_step - self.bar.n)
        if getattr(self.args, "self_play", None) and global_step >= self.next_snapshot:
            self.next_snapshot = (global_step // self.args.self_play_interval + 1) * self.args.self_play_interval
            self.snapshot()
        if self.next_eval is not None and global_step >= self.next_eval:
            self.next_eval += self.args.eval_interval
            self.evaluate()
            self.save("last.pt")
        elif time.time() - self.saved_at >= 60 * self.args.checkpoint_minutes:
            self.save("last.pt")
        if self.stop_signal is not None:
            self.stop()

    def sps(self, global_step: int) -> int:
        """Env steps per second since this process started training, up to `global_step` (the step just taken:
        `self.global_step` is the last one passed to `step()`, an iteration behind in the on-policy loops)."""
        return int((global_step - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def log_episodes(self, episodes, global_step: int) -> None:
        """charts/episodic_return (mean over the episodes that just ended), per group, and the length.

        `episodes`: a StepResult's EpisodeStats list, or the `infos` of a Gymnasium vector env's step."""
        if isinstance(episodes, dict):  # Gymnasium: the envs whose episode ended carry infos["episode"]
            if "_episode" in episodes:
                done, stats = episodes["_episode"], episodes["episode"]
                self.writer.add_scalar("charts/episodic_return", stats["r"][done].mean(), global_step)
                self.writer.add_scalar("charts/episodic_length", stats["l"][done].mean(), global_step)
            return
        if not episodes:
            return
        self.writer.add_scalar("charts/episodic_return", np.mean([e.episode_return for e in episodes]), global_step)
        self.writer.add_scalar("charts/episodic_length", np.mean([e.length for e in episodes]), global_step)
        for g in episodes[0].group_returns:
            r = np.mean([e.group_returns[g] for e in episodes])
            self.writer.add_scalar(f"charts/episodic_return/{g}", r, global_step)

    # --- checkpoints and evaluation ---
    def checkpoint(self) -> dict:
        ckpt = dict(algo=self.algo, env_id=self.args.env_id, signature=self.signature, args=self.config(),
                    global_step=self.global_step, evals=self.evals, best_eval=float(self.best_eval),
                    counters=self.counters, nets={k: m.state_dict() for k, m in self.nets.items()},
                    optimizers={k: o.state_dict() for k, o in self.optimizers.items()},
                    rng=rng_state(self.rng))  # fmt: skip
        if self.loop is not None and (get_state := self.saves_env()) is not None:
            ckpt |= {"env_state": pack(get_state()), "loop": pack(self.loop)}
        return ckpt

    def save(self, name: str, **extra) -> None:
        save_checkpoint(os.path.join(self.dir, name), self.checkpoint() | extra)
        if name == "last.pt":
            self.saved_at, self.saved_step = time.time(), self.global_step

    saved_step = 0

    # --- self-play ---
    def start_self_play(self) -> None:
        """The pool of past policies: reloaded from <run dir>/pool on --resume, else the first snapshot now."""
        self.pool_source = self_play_source(self.args, self.env)
        self.pool_dir = os.path.join(self.dir, "pool")
        os.makedirs(self.pool_dir, exist_ok=True)
        steps = sorted(int(f[5:-3]) for f in os.listdir(self.pool_dir) if f.startswith("step_") and f.endswith(".pt"))
        self.pool = [os.path.join(self.pool_dir, f"step_{n}.pt") for n in steps if n <= self.global_step]
        every = self.args.self_play_interval
        self.next_snapshot = (self.global_step // every + 1) * every
        self.draw_opponent() if self.pool else self.snapshot()

    def snapshot(self) -> None:
        path = os.path.join(self.pool_dir, f"step_{self.global_step}.pt")
        save_checkpoint(path, self.checkpoint())
        self.pool.append(path)
        self.draw_opponent()

    def draw_opponent(self) -> None:
        """The self-play group's next opponent: a uniform draw from the last --self-play-pool snapshots."""
        args = self.args
        members = self.pool[-args.self_play_pool :]
        path = members[np.random.default_rng([args.seed, len(self.pool)]).integers(len(members))]
        spec, device = self.env.all_groups[args.self_play], torch.device("cuda" if args.cuda else "cpu")
        make = load_actor(path, args.env_id, spec, self.pool_source, device, greedy=not args.opponent_sample)
        self.env.frozen.set(args.self_play, make, self.pool_source)
        self.writer.add_scalar("charts/self_play_opponent_step", int(os.path.basename(path)[5:-3]), self.global_step)

    def restore_replay(self, ckpt: dict) -> None:
        """The replay buffer a stop wrote beside last.pt, when last.pt is that stop's (it says so: `replay_step`).
        After a later periodic last.pt (a kill -9 since), the file is older than the weights: the buffer refills."""
        if self.replay is None:
            return
        path = os.path.join(self.dir, REPLAY_NAME)
        if not os.path.exists(path):
            print(f"{path} does not exist: the replay buffer refills from scratch")
            return
        if ckpt.get("replay_step") != ckpt["global_step"]:
            why = f"not from the stop that wrote last.pt (step {ckpt['global_step']}; a kill since?)"
            print(f"{path} is {why}: the replay buffer refills from scratch")
            return
        self.replay.load(path)
        self.replay_restored = True
        unit = "episodes" if "Episode" in type(self.replay).__name__ else "transitions"
        print(f"resumed with the {len(self.replay)} {unit} of {path}")

    def restore_loop(self, ckpt: dict) -> None:
        """Keep last.pt's env and loop state for `begin` when everything else it stood on came back too; else the
        envs start new episodes (an episode buffer drops its running ones), and the run says so."""
        whole = self.replay is None or self.replay_restored  # a kill -9 since the stop: the buffer refills
        if "loop" in ckpt and self.saves_env() is not None and whole:
            self.resumed_loop = (ckpt["env_state"], ckpt["loop"])
        elif self.global_step > 0:
            if hasattr(self.replay, "drop_running"):  # an episode buffer's running episodes end here
                self.replay.drop_running()
            why = (f"this env ({type(self.env).__name__}) does not save its state" if self.saves_env() is None else
                   "the replay buffer refills" if "loop" in ckpt else
                   f"{self.algo}.py does not hand the run its loop's state")  # fmt: skip
            print(f"the envs start new episodes at step {self.global_step} ({why}): the run goes on from the same "
                  f"weights, not bit for bit as if it had never stopped")  # fmt: skip

    def check_stop(self) -> None:
        if self.stop_signal is not None:
            self.stop()

    def stop(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # from here on the run ends: a second Ctrl-C changes nothing
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.bar.close()
        extra = {}
        if self.replay is not None and getattr(self.args, "save_buffer", True):
            # the buffer first: a last.pt that names its step is then never beside an older one
            try:
                write_whole(os.path.join(self.dir, REPLAY_NAME), self.replay.save)
                extra = {"replay_step": self.global_step}
            except OSError as e:  # the weights still go to last.pt: only the buffer's contents are lost
                print(f"{e}. last.pt is written without it: --resume refills the replay buffer", flush=True)
        self.save("last.pt", **extra)
        self.close(keep_signals_ignored=True)  # the process is ending: a second Ctrl-C must not cut its exit short
        raise RunStopped(f"stopped at step {self.global_step} ({signal.Signals(self.stop_signal).name}): saved "
                         f"{self.dir}/last.pt; continue with --resume {self.dir}")  # fmt: skip

    def evaluate(self) -> float:
        """A periodic greedy evaluation on fresh episodes; keeps best.pt and an optional video."""
        args, step = self.args, self.global_step
        seed = periodic_seed(args.seed, self.evals, args.eval_episodes)
        returns, groups = evaluate(self.make_eval_env, self.make_greedy, args.eval_episodes, seed)
        self.evals += 1
        self.writer.add_scalar("eval/episodic_return", returns.mean(), step)
        for g, r in groups.items():
            self.writer.add_scalar(f"eval/episodic_return/{g}", r.mean(), step)
        if args.capture_video:
            self.video(os.path.join(self.dir, "videos", f"step_{step}.mp4"), seed, step)
        self.last_eval, self.last_eval_step = float(returns.mean()), step
        if self.last_eval > self.best_eval:
            self.best_eval = self.last_eval
            if args.save_model:
                self.save("best.pt")
        self.bar.set_postfix(SPS=self.sps(self.global_step), eval=f"{self.last_eval:.2f}")
        return self.last_eval

    def video(self, path, seed, step):
        frames = record(self.args, self.make_greedy, path, seed)
        if frames is not None:
            add_video(self.writer, "eval/video", frames, step)
        if self.args.track:
            import wandb

            wandb.log({"eval/video": wandb.Video(path, format="mp4")}, step=step)

    def finish(self) -> None:
        """The end of training: a last evaluation, last.pt, the final policy on the fixed episode set, DONE."""
        args = self.args
        if self.last_eval_step != self.global_step:
            self.evaluate()
        self.save("last.pt")
        self.bar.close()
        final = ""
        if args.final_eval_episodes:
            returns, groups = evaluate(self.make_eval_env, self.make_greedy, args.final_eval_episodes, FINAL_SEED,
                                       stop=self.check_stop)  # fmt: skip
            result = dict(protocol="v2", episodes=len(returns), seed=FINAL_SEED, global_step=self.global_step,
                          mean=float(returns.mean()), std=float(returns.std()), returns=returns.round(4).tolist(),
                          per_group={g: float(r.mean()) for g, r in groups.items()})  # fmt: skip
            write_whole(os.path.join(self.dir, "final_eval.json"), lambda f: f.write(json.dumps(result).encode()))
            self.writer.add_scalar("eval/final_return", result["mean"], self.global_step)
            final = f"; final policy {result['mean']:.2f} ± {result['std']:.2f} on {len(returns)} fixed episodes"
        self.close()
        open(os.path.join(self.dir, "DONE"), "w").close()
        print(f"done: {self.global_step} steps, final greedy return {self.last_eval:.2f} (best {self.best_eval:.2f})"
              f"{final}; run dir {self.dir}")  # fmt: skip

    def close(self, keep_signals_ignored=False) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, signal.SIG_IGN if keep_signals_ignored else handler)
        if self.lock is not None:  # another run may now take the directory (also one in this process)
            os.close(self.lock)
            self.lock = None
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
        if self.args.track and self.writer is not None:
            import wandb

            wandb.finish()
