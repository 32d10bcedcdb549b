"""PettingZoo parallel envs stepped in worker processes, one process per env.

Observations, rewards, flags and actions live in one shared-memory block (a multiprocessing
`RawArray`, mapped as numpy arrays by `Buffers` in the parent and in every worker). Each step the
parent writes the actions into the block and sends each worker the one-word command "step"; the
worker's `EnvRunner` writes its env's row and answers with its finished episode's stats, if any.
So arrays never travel through pickles; only commands, episode stats and render frames do.

Workers run exactly the code `SyncVecEnv` runs (`EnvRunner`), which is why both vector modes give
identical trajectories for the same seed.

Failure handling: an exception inside a worker comes back as its traceback and is raised as an
`EnvWorkerError` naming the env index; a worker that dies (segfault, `os._exit`) is noticed
through its closed pipe, and one that stops answering through a timeout. Either way the vector env
closes all its workers, so nothing is left hanging.

Start method: "fork" where the platform has it (fast: the worker inherits the imported modules),
else "spawn"; the worker's arguments are picklable, so "spawn" and "forkserver" work too. Forking
after `import torch` is safe because the workers never call into torch.
"""

import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable

import numpy as np

from envs.api import EpisodeStats
from envs.pettingzoo_env import Buffers, EnvRunner, EnvSpec, PettingZooVecEnv, describe


class EnvWorkerError(RuntimeError):
    """A subprocess env failed: it raised, died or stopped answering. The message names the env."""


def _worker(index: int, env_fn: Callable, spec: EnvSpec, num_envs: int, memory, conn) -> None:
    """Worker process main loop: build env `index`, then serve reset/step/render/close commands."""
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        env = env_fn()
        runner = EnvRunner(env, spec, Buffers(spec, num_envs, memory), index)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    while True:
        try:
            command, arg = conn.recv()
        except (EOFError, KeyboardInterrupt):  # the parent went away
            return
        try:
            if command == "step":
                reply = runner.step()
            elif command == "reset":
                reply = runner.reset(arg)
            elif command == "render":
                reply = env.render()
            elif command == "close":
                env.close()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {command!r}")
        except Exception:
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("ok", reply))


def _default_start_method() -> str:
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


class SubprocVecEnv(PettingZooVecEnv):
    """`num_envs` PettingZoo parallel envs, each in its own worker process, sharing one memory block.

    Args:
        env_fn: a picklable zero-argument callable building one env (`envs.registry.env_factory`).
        num_envs: E, also the number of worker processes.
        seed: env i is reset with `seed + i` by `reset()`.
        state_from_obs: use the concatenated observations as the state without calling `state()`.
        start_method: multiprocessing start method; default "fork" where available, else "spawn".
        timeout: seconds to wait for a worker's answer before raising `EnvWorkerError`
            (None: wait as long as the worker is alive).
    """

    def __init__(
        self,
        env_fn: Callable,
        num_envs: int,
        seed: int = 0,
        state_from_obs: bool = False,
        start_method: str | None = None,
        timeout: float | None = 300.0,
    ):
        # The layout comes from one throwaway env built here: a bad argument fails in this process
        # with a plain traceback, before any worker starts.
        probe = env_fn()
        try:
            spec = describe(probe, seed, state_from_obs)
        finally:
            probe.close()
        ctx = mp.get_context(start_method or _default_start_method())
        self._memory = ctx.RawArray("B", max(Buffers.nbytes(spec, num_envs), 1))
        super().__init__(spec, num_envs, seed, Buffers(spec, num_envs, self._memory))
        self.timeout = timeout
        self._conns = []
        self._procs = []
        for i in range(num_envs):
            parent_conn, child_conn = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                args=(i, env_fn, spec, num_envs, self._memory, child_conn),
                name=f"env-worker-{i}",
                daemon=True,
            )
            proc.start()
            # Drop our copy of the child's end: when the worker dies, recv() then sees EOF.
            child_conn.close()
            self._conns.append(parent_conn)
            self._procs.append(proc)
        self._gather(range(num_envs))

    def _send(self, indices, command: str, arg=None) -> None:
        for i in indices:
            try:
                self._conns[i].send((command, arg))
            except (BrokenPipeError, OSError):
                self._fail(f"env {i}: its worker process died (exit code {self._procs[i].exitcode})")

    def _gather(self, indices) -> list:
        """Collect one answer from each worker in `indices`; raise for the first that failed."""
        replies, errors = [], []
        for i in indices:
            conn, proc = self._conns[i], self._procs[i]
            if not conn.poll(self.timeout):
                self._fail(f"env {i}: its worker process gave no answer within {self.timeout} s")
            try:
                status, payload = conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                proc.join(timeout=1.0)
                self._fail(f"env {i}: its worker process died (exit code {proc.exitcode})")
            if status == "error":
                errors.append(f"env {i} raised in its worker process:\n{payload}")
            replies.append(payload)
        if errors:
            self._fail("\n".join(errors))
        return replies

    def _fail(self, message: str):
        self._terminate()
        raise EnvWorkerError(message)

    def _reset_envs(self, seed: int) -> None:
        for i in range(self.num_envs):
            self._send([i], "reset", seed + i)
        self._gather(range(self.num_envs))

    def _step_envs(self) -> list[EpisodeStats]:
        indices = range(self.num_envs)
        self._send(indices, "step")
        return [stats for stats in self._gather(indices) if stats is not None]

    def render(self, env_index: int = 0) -> np.ndarray:
        """An `(H, W, 3)` uint8 frame of env `env_index` (the env needs `render_mode="rgb_array"`)."""
        self._send([env_index], "render")
        (frame,) = self._gather([env_index])
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
        """Ask every worker to close its env and exit; stop those that do not within a second."""
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
