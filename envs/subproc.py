"""PettingZoo parallel envs stepped in worker processes, each worker holding a contiguous block of envs.

With E envs and W workers (default: one per CPU, at most E), worker w owns envs [lo_w, hi_w) and steps them
one after another, so a step costs W round trips, not E: 128 envs on 2 cores are 2 processes, not 128
contending for the same cores.

Observations, rewards, flags and actions live in one shared-memory block (a multiprocessing
`RawArray`, mapped as numpy arrays by `StepArrays` in the parent and in every worker). Each step the
parent writes the actions into the block and sends each worker the one-word command "step"; the
worker's `EnvRunner`s write their envs' rows and it answers with its finished episodes' stats.
So arrays never travel through pickles; only commands, episode stats and render frames do.

Workers run exactly the code `SyncVecEnv` runs (`EnvRunner`), which is why both vector modes give
identical trajectories for the same seed, whatever the number of workers.

Failure handling: an exception inside a worker comes back as its traceback and is raised as an
`EnvWorkerError` naming the env that raised; a worker that dies (segfault, `os._exit`) is noticed
through its closed pipe, and one that stops answering through a timeout, and the error names the envs
it held. Either way the vector env closes all its workers, so nothing is left hanging.

Start method: "fork" where the platform has it (fast: the worker inherits the imported modules),
else "spawn"; the worker's arguments are picklable, so "spawn" and "forkserver" work too. Forking
after `import torch` is safe because the workers never call into torch.
"""

import multiprocessing as mp
import os
import signal
import traceback
from collections.abc import Callable

import numpy as np

from envs.api import EpisodeStats
from envs.pettingzoo_env import EnvRunner, EnvSpec, PettingZooVecEnv, StepArrays, describe


class EnvWorkerError(RuntimeError):
    """A subprocess env failed: it raised, died or stopped answering. The message names the env."""


def _envs(lo: int, hi: int) -> str:
    """'env 3' or 'envs 0-63': the envs a worker holds, for error messages."""
    return f"env {lo}" if hi - lo == 1 else f"envs {lo}-{hi - 1}"


def _worker(lo: int, hi: int, env_fn: Callable, spec: EnvSpec, num_envs: int, memory, conn, runner=EnvRunner) -> None:
    """Worker process main loop: build envs [lo, hi), then serve reset/step/render/close commands.

    A failing env answers ("error", (env index, traceback)); a bad command ("error", (None, traceback)).
    """
    # Ctrl-C goes to the whole process group; the parent decides when workers stop. SIGTERM (terminate())
    # stops a worker at once, whatever handler a forked worker inherited from its parent (the scripts' saves).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    buffers, runners, current = StepArrays(spec, num_envs, memory), [], lo
    try:
        for current in range(lo, hi):
            runners.append(runner(env_fn(), spec, buffers, current))
    except Exception:
        conn.send(("error", (current, traceback.format_exc())))
        return
    conn.send(("ok", None))
    while True:
        try:
            command, arg = conn.recv()
        except (EOFError, KeyboardInterrupt):  # the parent went away
            return
        current = None
        try:
            if command == "step":
                reply = []
                for runner in runners:
                    current = runner.index
                    stats = runner.step()
                    if stats is not None:
                        reply.append(stats)
            elif command == "reset":  # env i is reset with seed + i
                for runner in runners:
                    current = runner.index
                    runner.reset(arg + current)
                reply = None
            elif command == "render":
                current = arg
                reply = runners[arg - lo].env.render()
            elif command == "close":
                for runner in runners:
                    current = runner.index
                    runner.env.close()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {command!r}")
        except Exception:
            conn.send(("error", (current, traceback.format_exc())))
            continue
        conn.send(("ok", reply))


def _default_start_method() -> str:
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def default_num_workers(num_envs: int) -> int:
    """One worker per CPU this process may use, and never more workers than envs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(num_envs, cpus))


class SubprocVecEnv(PettingZooVecEnv):
    """`num_envs` PettingZoo parallel envs in `num_workers` worker processes, sharing one memory block.

    Args:
        env_fn: a picklable zero-argument callable building one env (`envs.registry.env_factory`).
        num_envs: E.
        seed: env i is reset with `seed + i` by `reset()`.
        state_from_obs: use the concatenated observations as the state without calling `state()`.
        start_method: multiprocessing start method; default "fork" where available, else "spawn".
        timeout: seconds to wait for a worker's answer before raising `EnvWorkerError`
            (None: wait as long as the worker is alive).
        num_workers: worker processes (default: one per CPU, at most E); worker w holds a contiguous
            block of about E / W envs.
        runner: what steps each env (`EnvRunner`; `envs.magent_native.MagentRunner` for MAgent2's engine).
    """

    def __init__(
        self,
        env_fn: Callable,
        num_envs: int,
        seed: int = 0,
        state_from_obs: bool = False,
        start_method: str | None = None,
        timeout: float | None = 300.0,
        num_workers: int | None = None,
        runner: type = EnvRunner,
    ):
        num_workers = default_num_workers(num_envs) if num_workers is None else num_workers
        if not 1 <= num_workers <= num_envs:
            raise ValueError(f"num_workers must be in [1, num_envs={num_envs}], got {num_workers}")
        # The layout comes from one throwaway env built here: a bad argument fails in this process
        # with a plain traceback, before any worker starts.
        probe = env_fn()
        try:
            spec = describe(probe, seed, state_from_obs)
        finally:
            probe.close()
        ctx = mp.get_context(start_method or _default_start_method())
        self._memory = ctx.RawArray("B", max(StepArrays.nbytes(spec, num_envs), 1))
        super().__init__(spec, num_envs, seed, StepArrays(spec, num_envs, self._memory))
        self.timeout = timeout
        bounds = [round(w * num_envs / num_workers) for w in range(num_workers + 1)]
        self._blocks = list(zip(bounds[:-1], bounds[1:], strict=True))  # worker w holds envs [lo, hi)
        self._conns = []
        self._procs = []
        for w, (lo, hi) in enumerate(self._blocks):
            parent_conn, child_conn = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                args=(lo, hi, env_fn, spec, num_envs, self._memory, child_conn, runner),
                name=f"env-worker-{w}",
                daemon=True,
            )
            proc.start()
            # Drop our copy of the child's end: when the worker dies, recv() then sees EOF.
            child_conn.close()
            self._conns.append(parent_conn)
            self._procs.append(proc)
        self._gather(range(num_workers))

    @property
    def num_workers(self) -> int:
        return len(self._procs)

    def _send(self, workers, command: str, arg=None) -> None:
        for w in workers:
            try:
                self._conns[w].send((command, arg))
            except (BrokenPipeError, OSError):
                held, code = _envs(*self._blocks[w]), self._procs[w].exitcode
                self._fail(f"{held}: worker process {w} died (exit code {code})")

    def _gather(self, workers) -> list:
        """Collect one answer from each worker in `workers`; raise for the first that failed."""
        replies, errors = [], []
        for w in workers:
            conn, proc, held = self._conns[w], self._procs[w], _envs(*self._blocks[w])
            if not conn.poll(self.timeout):
                self._fail(f"{held}: worker process {w} gave no answer within {self.timeout} s")
            try:
                status, payload = conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                proc.join(timeout=1.0)
                self._fail(f"{held}: worker process {w} died (exit code {proc.exitcode})")
            if status == "error":
                index, trace = payload
                where = held if index is None else f"env {index}"
                errors.append(f"{where} raised in its worker process:\n{trace}")
            replies.append(payload)
        if errors:
            self._fail("\n".join(errors))
        return replies

    def _worker_of(self, env_index: int) -> int:
        return next(w for w, (lo, hi) in enumerate(self._blocks) if lo <= env_index < hi)

    def _fail(self, message: str):
        self._terminate()
        raise EnvWorkerError(message)

    def _reset_envs(self, seed: int) -> None:
        self._send(range(self.num_workers), "reset", seed)
        self._gather(range(self.num_workers))

    def _step_envs(self) -> list[EpisodeStats]:
        workers = range(self.num_workers)
        self._send(workers, "step")
        return [stats for reply in self._gather(workers) for stats in reply]

    def render(self, env_index: int = 0) -> np.ndarray:
        """An `(H, W, 3)` uint8 frame of env `env_index` (the env needs `render_mode="rgb_array"`)."""
        if not 0 <= env_index < self.num_envs:
            raise ValueError(f"env_index must be in [0, {self.num_envs}), got {env_index}")
        w = self._worker_of(env_index)
        self._send([w], "render", env_index)
        (frame,) = self._gather([w])
        if frame is None:
            raise ValueError("the env returned no frame: build it with render_mode='rgb_array'")
        return np.asarray(frame)

    def _terminate(self) -> None:
        """Stop every worker now (after a failure) and mark the vector env closed."""
        self._closed = True
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(timeout=1.0)
        for conn in self._conns:
            conn.close()

    def close(self) -> None:
        """Ask every worker to close its envs and exit; stop those that do not within a second."""
        if self._closed:
            return
        self._closed = True
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if proc.is_alive():
                try:
                    conn.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
        for proc in self._procs:
            proc.join(timeout=1.0)
        self._terminate()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
