"""Run a sweep of algorithms x envs x seeds, locally or on Ray, then collect the results.

Each run is the plain algorithm script as a subprocess, and that exact command is recorded::

    python algos/<algo>.py --env-id ENV --seed S --total-timesteps N --run-dir DIR [--extra flags]

Runs go to ``<out>/runs/<env_id>/<algo>/seed<S>/`` (git-ignored): the script's own files, its
stdout+stderr in ``run.log`` and the runner's record ``run.json`` (command, status, times, commit,
hardware, library versions). A finished run (recorded status "ok", or a DONE file) is skipped when
the sweep is launched again; a failed one is reported with its log path, the others go on, and the
exit status is 1. Two sweeps may share a results root: each run directory is claimed (a lock beside it,
``.seed<S>.runner.lock``) just before its run starts and held until its record is written. A second sweep
passes over, with a line, a run that another sweep (or a script started by hand) is executing, runs the free ones
first, then waits for the held one and collects it if it finished (two lanes may name the same seeds); no sweep
empties a directory another holds, or one that holds files no sweep wrote, and no record is written over another
launch's.

A run that a sweep started and that did not finish (the sweep or its machine was stopped, the run killed) is
continued, not restarted, when the same sweep is launched again: the script runs with ``--resume DIR`` in place
of ``--run-dir DIR`` (its own flags and budget, from its ``last.pt``), appending to ``run.log``. A run stopped by
SIGTERM or Ctrl-C wrote ``last.pt`` (and an off-policy script its replay buffer) where it stopped; after a
``kill -9`` it goes back to the last periodic ``last.pt``, and the sweep says which step that is and how far
the run had got. ``run.json`` keeps the command and lists each resume; its ``wall_time_s`` sums the launches.
``--force`` starts every run afresh. Each (env, algo) is collected into ``<out>/<env_id>/<algo>.json`` (see
collect.py) as soon as the sweep has run all its seeds, not when the whole sweep ends (a long sweep publishes its rows
as they land, and one stopped later keeps them), and ``<out>/README.md`` is regenerated at the end (see
make_readme.py).

Usage::

    python results/run.py --algos mappo,ippo --envs simple_spread_v3 --seeds 5 \\
        --total-timesteps 10000000 --extra "--num-envs 32"
    python results/run.py ... --seeds 1,3            # explicit seeds (a single seed: --seeds 3,)
    python results/run.py ... --status               # each run: done, running at step n (time left), stopped...
    python results/run.py --algos dqn ... --variant per --extra=--prioritized   # -> <env>/dqn-per.json
    python results/run.py ... --ray                  # a local Ray instance (ray.init())
    python results/run.py ... --ray-address auto     # an existing cluster (auto | ray://host:port)

Locally, ``--workers`` runs execute at once (default: the number of cores), each with
OMP/MKL threads = cores // workers unless the environment already sets them. On Ray each run is a
task asking for ``--cpus-per-run`` CPUs and ``--gpus-per-run`` GPUs; the worker runs the command in
the same repository path with its own Python. When a worker does not share this machine's
filesystem, the run directory's files (except checkpoints ``*.pt`` and videos) are sent back.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from collect import LOG_NAME, RECORD_NAME, RESULTS_DIR, collect, finished_runs, git_commit, read_json, run_dir_for
from collect import is_finished as run_is_finished

REPO_ROOT = RESULTS_DIR.parent
sys.path.insert(0, str(REPO_ROOT))
from bench.host import writable_parent  # noqa: E402  (the benches' --out check too)

VERSION_PACKAGES = ["torch", "numpy", "numba", "pettingzoo", "mpe2", "gymnasium", "tensorboard"]
THREAD_VARS = ["OMP_NUM_THREADS", "MKL_NUM_THREADS"]
CHECKPOINT_NAME = "last.pt"  # what --resume continues from
NOT_SHIPPED = (".pt", ".mp4", ".gif", ".npz")  # large files a remote worker keeps
STOP_GRACE_S = 300  # how long a stopped script may take to write last.pt and its replay buffer before SIGKILL
PROGRESS = re.compile(rb"(\d+)/(\d+) \[")  # tqdm's "step/total [" in run.log
LEFT = re.compile(rb"\d+/\d+ \[[\d:]+<([\d:]+)[,\]]")  # tqdm's estimate of the time left, "[04:04<21:23,"
_LIVE: set[subprocess.Popen] = set()  # this process's running scripts, killed on Ctrl-C
_STOP = threading.Event()  # set on Ctrl-C: a thread waiting for a held run directory gives up


# ---------------------------------------------------------------------------------------------------
# Executing one run (a pool thread or a Ray task). Stdlib only: Ray ships these functions by value.
# ---------------------------------------------------------------------------------------------------


def utc_now(stamp: float | None = None) -> str:
    """An ISO-8601 UTC timestamp with second precision, e.g. 2026-01-31T12:00:00Z."""
    moment = datetime.fromtimestamp(time.time() if stamp is None else stamp, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def probe_hardware() -> dict:
    """CPU model, logical cores, RAM and GPUs of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        ram_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        ram_gb = None
    gpu = None
    if shutil.which("nvidia-smi"):
        try:
            query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
            names = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.split("\n")
            gpu = ", ".join(n.strip() for n in names if n.strip()) or None
        except (OSError, subprocess.SubprocessError):
            gpu = None
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": ram_gb, "gpu": gpu, "machine": platform.machine()}


def probe_versions() -> dict:
    """Python and library versions of the interpreter that runs the scripts (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    for package in VERSION_PACKAGES:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return versions


def _kill_group(proc: subprocess.Popen) -> None:
    """Terminate a process and everything it started (its own session), then make sure it is gone.

    A script stops at its next consistent point on SIGTERM and writes last.pt (and a replay buffer, which on
    battle_v4 is a gigabyte): it has STOP_GRACE_S seconds for that before SIGKILL."""
    for sig, wait in [(signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)]:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _pack(run_dir: Path) -> dict[str, bytes]:
    """The files of a run directory (relative POSIX path -> bytes), without checkpoints and videos."""
    return {
        p.relative_to(run_dir).as_posix(): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and not p.name.endswith(NOT_SHIPPED)
    }


def execute(spec: dict) -> tuple[dict, dict[str, bytes] | None]:
    """Run one command as prepared by the driver; returns (record, files). Never raises.

    ``spec``: argv (argv[0] is replaced by this interpreter), cwd, run_dir, launch_id, timeout,
    env (overrides) and record (the driver's fields). ``files`` is None when the run directory is
    the driver's own (the launch record written by the driver is visible here), else the packed
    run directory for the driver to unpack.
    """
    run_dir = Path(spec["run_dir"])
    try:
        shared = json.loads((run_dir / RECORD_NAME).read_text()).get("launch_id") == spec["launch_id"]
    except (OSError, ValueError):
        shared = False
    record = dict(spec["record"])
    record.update(hardware=probe_hardware(), versions=probe_versions(), node=socket.gethostname())
    # the code this run executes: a long sweep outlives commits, so the sweep's start is not enough
    if (commit := git_commit()) != "unknown":  # unknown: a node without the checkout keeps the driver's
        record["commit"] = commit
    returncode, error = None, None
    start = time.time()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / LOG_NAME, "ab") as log:
            argv = [sys.executable, *spec["argv"][1:]]
            env = {**os.environ, **spec["env"]}
            proc = subprocess.Popen(
                argv, cwd=spec["cwd"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            _LIVE.add(proc)
            try:
                returncode = proc.wait(timeout=spec["timeout"])
            except subprocess.TimeoutExpired:
                error = f"timed out after {spec['timeout']} s"
            finally:  # a timeout, a Ray cancel or Ctrl-C: leave no process behind
                if proc.poll() is None:
                    _kill_group(proc)
                    returncode = proc.returncode
                _LIVE.discard(proc)
            if error is None and returncode != 0:
                error = f"exit status {returncode}"
                if reason := failure_reason(run_dir / LOG_NAME):
                    error += f" ({reason})"
            if error:
                log.write(f"\n[results/run.py] run failed: {error}\n".encode())
    except OSError as exc:
        error = f"could not run: {exc}"
    end = time.time()
    record.update(
        status="ok" if error is None else "failed",
        returncode=returncode,
        error=error,
        start=utc_now(start),
        end=utc_now(end),
        wall_time_s=round(end - start + record.get("wall_time_before_s", 0.0), 3),  # every launch of the run
    )
    files = None if shared or not run_dir.is_dir() else _pack(run_dir)
    return record, files


# a script's last words: its one-sentence `error: ...` (every expected failure), or a traceback's exception line
REASON = re.compile(r"error: |\w+(Error|Exception)(: |$)")


def failure_reason(log: Path) -> str | None:
    """The line a failed run's script ended on (its `error:` line, else its exception), from the log's last 8 kB."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    said = [line.strip() for line in tail.replace("\r", "\n").splitlines() if REASON.match(line.strip())]
    return said[-1][:300] if said else None


# ---------------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One (env, algo, seed) of the sweep."""

    env_id: str
    algo: str  # the result label: the script's name, or "<script>-<variant>"
    seed: int
    run_dir: Path
    argv: list[str]  # argv[0] is "python": the recorded command

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    @property
    def name(self) -> str:
        return f"{self.env_id} {self.algo} seed {self.seed}"

    @property
    def log(self) -> Path:
        return self.run_dir / LOG_NAME


def parse_seeds(text: str) -> list[int]:
    """'5' -> seeds 0..4; '1,3' -> seeds 1 and 3; '3,' -> seed 3 only."""
    text = text.strip()
    if "," not in text:
        count = int(text)
        if count < 1:
            raise argparse.ArgumentTypeError(f"--seeds {text}: a count N needs N >= 1 (seed 0 alone: --seeds 0,)")
        return list(range(count))
    seeds = [int(s) for s in text.split(",") if s.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds: expected distinct integers, got {text!r}")
    return seeds


def is_label(text: str) -> bool:
    """A result's label or a part of one (it names files and folders): letters, digits, '-' and '_', one or more."""
    return text.replace("_", "").replace("-", "").isalnum()


def variant_name(text: str) -> str:
    """--variant's label, which names the result file <env>/<algo>-<variant>.json ("" for none)."""
    if text and not is_label(text):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: use letters, digits, '-' and '_' only (it names files)")
    return text


# The flags run.py gives every run itself, and what to do instead of passing them in --extra.
OWN_FLAGS = {
    "--env-id": "use run.py's --envs",
    "--env": "use run.py's --envs",
    "--seed": "use run.py's --seeds",
    "--total-timesteps": "use run.py's --total-timesteps",
    "--run-dir": "use run.py's --out (a run goes to <out>/runs/<env>/<algo>/seed<S>)",
    "--resume": "launch the same sweep again, and it resumes its unfinished runs",
}


def extra_flags(text: str) -> list[str]:
    """--extra as the scripts' argv; a ValueError naming the problem when it does not parse as shell words or sets a
    flag that run.py sets itself (a --seed there would train one seed and record another)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"--extra {text!r}: {exc}") from None
    for word in argv:
        flag = word.split("=", 1)[0].replace("_", "-")
        if flag in OWN_FLAGS:
            raise ValueError(f"--extra sets {flag}, which run.py gives every run itself: {OWN_FLAGS[flag]}")
    return argv


def _csv(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def extra_refusal(algos: list[str], extra_argv: list[str]) -> str | None:
    """Why --extra would not parse for one of the sweep's scripts in algos/ (a flag it lacks, a value of the wrong
    type), read from its Args the way the script reads its command line; None when every script takes it. Each run
    would otherwise fail at its start, one FAILED line a run."""
    if not extra_argv:
        return None
    from make_readme import parse_script_args

    for algo in algos:
        if not (REPO_ROOT / "algos" / f"{algo}.py").is_file():
            continue  # plan() names a script that does not exist
        _, reason = parse_script_args(f"algos/{algo}.py", extra_argv)
        if reason:
            return f"--extra {shlex.join(extra_argv)!r}: algos/{algo}.py refuses it ({reason})"
    return None


def unknown_envs(env_ids: list[str]) -> list[str]:
    """Why each id that neither envs.make nor Gymnasium knows would fail (a typo in --envs); [] when all are known."""
    import gymnasium

    import envs  # registers CartPole-PO-v1

    unknown = []
    for env_id in env_ids:
        if (error := envs.unknown_id(env_id)) and env_id not in gymnasium.registry:
            unknown.append(str(error) if error.near_miss else f"{error}, nor a Gymnasium id")
    return unknown


def _display_path(path: Path) -> str:
    """A path as written in commands: relative to the repository root when inside it."""
    path = Path(path).resolve()
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def plan(args: argparse.Namespace) -> list[Run]:
    """The runs of the sweep, in (env, algo, seed) order; fails on a missing algorithm script."""
    runs = []
    for algo in args.algos:
        script = args.algos_dir / f"{algo}.py"
        if not script.is_file():
            known = ", ".join(sorted(p.stem for p in args.algos_dir.glob("*.py"))) or "none"
            raise SystemExit(f"error: no script {script} (algorithms in {args.algos_dir}: {known})")
    for env_id in args.envs:
        for algo in args.algos:
            label = f"{algo}-{args.variant}" if args.variant else algo
            for seed in args.seeds:
                run_dir = run_dir_for(args.out, env_id, label, seed)
                argv = ["python", _display_path(args.algos_dir / f"{algo}.py"), "--env-id", env_id]
                argv += ["--seed", str(seed), "--total-timesteps", str(args.total_timesteps)]
                argv += ["--run-dir", _display_path(run_dir), *args.extra_argv]
                runs.append(Run(env_id, label, seed, run_dir, argv))
    return runs


def triage(run: Run, force: bool) -> str | None:
    """'skip' for a finished run of the same command, 'resume' for an unfinished one (a sweep started the same
    command there and its last.pt is in place), a message for a conflict, else None (run it afresh)."""
    if force:
        return None
    recorded = (read_json(run.run_dir / RECORD_NAME) or {}).get("command")
    if not run_is_finished(run.run_dir):
        if not (run.run_dir / RECORD_NAME).exists() and run.run_dir.is_dir() and any(run.run_dir.iterdir()):
            return (
                f"{run.run_dir} holds files of a run no sweep started (no {RECORD_NAME}); continue it by hand "
                "(--resume), remove it, use another --out, or pass --force"
            )
        if recorded == run.command and (run.run_dir / CHECKPOINT_NAME).is_file():
            return "resume"
        return None
    if recorded is None or recorded == run.command:
        return "skip"
    return (
        f"{run.run_dir} holds a finished run of another command ({recorded}); "
        "remove it, use another --out, or pass --force"
    )


def resume_argv(argv: list[str]) -> list[str]:
    """The command that continues a run: ``--run-dir DIR`` becomes ``--resume DIR`` (flags and budget unchanged)."""
    i = argv.index("--run-dir")
    return [*argv[:i], "--resume", *argv[i + 1 :]]


def checkpoint_step(run_dir: Path) -> int | None:
    """The env step a run's last.pt holds (None: unreadable; the script's --resume then names the problem)."""
    import torch

    try:
        return int(torch.load(run_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=True)["global_step"])
    except Exception:  # a damaged or foreign file: --resume refuses it with its own one-line error
        return None


def reached_step(run_dir: Path) -> int | None:
    """The last step the run's progress bar showed in run.log (the script's own tqdm line), None if none."""
    try:
        text = (run_dir / LOG_NAME).read_bytes()
    except OSError:
        return None
    found = PROGRESS.findall(text[-200_000:])
    return int(found[-1][0]) if found else None


def time_left(run_dir: Path) -> str | None:
    """The time left that the run's progress bar last estimated in run.log ("21:23"), None if none."""
    try:
        found = LEFT.findall((run_dir / LOG_NAME).read_bytes()[-200_000:])
    except OSError:
        return None
    return found[-1].decode() if found else None


def _holder(fd: int) -> str:
    """The pid a lock file names, "?" when it names none."""
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 64).decode(errors="replace").strip() or "?"


def claim(run_dir: Path) -> int | str:
    """Lock ``run_dir`` for this sweep (or the EPyMARL peer's command): the lock's fd, or who holds it.

    The lock file sits beside the directory (emptying the directory keeps it) and the OS releases it when this
    process dies, even by kill -9. A script started by hand into the directory holds the script's own ``.lock``.
    While another holds either, nothing in the directory is touched; the claim does not wait (run_local tries a held
    run again after the free ones).
    """
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir.parent / f".{run_dir.name}.runner.lock", os.O_RDWR | os.O_CREAT, 0o644)
    if (holder := _try_claim(fd, run_dir)) is None:
        return fd
    os.close(fd)
    return holder


def _locked(path: Path) -> str | None:
    """The pid named in the lock file `path` while another process holds it; None when it is free or absent (the
    probe takes a shared lock and lets it go at once)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no one has ever held it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)  # closing lets the probe's lock go


def run_status(run: Run, total_timesteps: int) -> tuple[str, str]:
    """(state, line): where a run of the sweep stands, read from its directory and locks, nothing claimed or
    changed. States: done, running, stopped (launching the sweep again continues it), failed, pending."""
    record = read_json(run.run_dir / RECORD_NAME) or {}
    if run_is_finished(run.run_dir):
        wall = record.get("wall_time_s")
        return "done", f"done     {run.name}" + (f" ({wall / 60:.0f} min)" if wall else "")
    step = reached_step(run.run_dir)
    at = f" at step {step:,} of {total_timesteps:,} ({step / total_timesteps:.0%})" if step else ""
    sweep = _locked(run.run_dir.parent / f".{run.run_dir.name}.runner.lock")
    if sweep is not None or (script := _locked(run.run_dir / ".lock")) is not None:
        who = f"sweep pid {sweep}" if sweep is not None else f"script pid {script}"
        left = f", about {eta} left" if (eta := time_left(run.run_dir)) else ""
        return "running", f"running  {run.name}{at}{left} ({who})"
    if record.get("status") == "failed":
        return "failed", f"failed   {run.name}{at}: {record.get('error')}; log: {run.log}"
    if step or record:
        return "stopped", f"stopped  {run.name}{at}: launching the sweep again continues it from its last.pt"
    return "pending", f"pending  {run.name}"


def _try_claim(fd: int, run_dir: Path) -> str | None:
    """Take the sweep lock ``fd`` when neither another sweep nor a running script holds the directory; else who does."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return f"in use by another sweep (pid {_holder(fd)})"
    if (script := _locked(run_dir / ".lock")) is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return f"in use by a running script (pid {script})"
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, str(os.getpid()).encode())
    return None


def prepare(run: Run, args: argparse.Namespace, commit: str, sweep_command: str, resume: str | None = None) -> dict:
    """Write the launch record of a (claimed) run and return the spec that ``execute`` runs.

    A fresh run empties the directory first. ``resume`` (a line that says where the run goes on from) keeps it:
    the script continues with ``--resume``, and the record keeps the earlier launches under "resumes"."""
    previous = (read_json(run.run_dir / RECORD_NAME) or {}) if resume else {}
    if not resume:
        if run.run_dir.exists():
            shutil.rmtree(run.run_dir)
        run.run_dir.mkdir(parents=True)
    launch_id = uuid.uuid4().hex
    record = {
        "env_id": run.env_id,
        "algo": run.algo,
        "seed": run.seed,
        "total_timesteps": args.total_timesteps,
        "command": run.command,
        "cwd": str(REPO_ROOT),
        "commit": commit,
        "sweep_command": sweep_command,
        "env": dict(args.child_env),
        "launch_id": launch_id,
        "launched": time.time(),
    }
    argv = run.argv
    if resume:
        argv = resume_argv(run.argv)
        earlier = {k: previous.get(k) for k in ("start", "end", "status", "error", "commit", "node", "hardware")}
        record["resumes"] = [*previous.get("resumes", []), {**earlier, "resumed": utc_now(), "how": resume}]
        record["resume_command"] = shlex.join(argv)
        record["first_start"] = previous.get("first_start") or previous.get("start")
        record["wall_time_before_s"] = previous.get("wall_time_s") or interrupted_time(run, previous)
        with open(run.log, "ab") as log:
            log.write(f"\n[results/run.py] {resume}\n".encode())
    (run.run_dir / RECORD_NAME).write_text(json.dumps({**record, "status": "launched"}))
    return {
        "argv": argv,
        "cwd": str(REPO_ROOT),
        "run_dir": str(run.run_dir.resolve()),
        "launch_id": launch_id,
        "timeout": args.timeout,
        "env": dict(args.child_env),
        "record": record,
    }


def interrupted_time(run: Run, previous: dict) -> float:
    """Seconds an interrupted launch ran (its record has no end): from its launch to its log's last write."""
    try:
        ran = max(0.0, run.log.stat().st_mtime - previous["launched"])
        return round(ran + previous.get("wall_time_before_s", 0.0), 3)
    except (OSError, KeyError, TypeError):
        return 0.0


def resume_line(run: Run) -> str:
    """Where an unfinished run goes on from: its last.pt's step, and what a kill lost since then."""
    step, reached = checkpoint_step(run.run_dir), reached_step(run.run_dir)
    line = f"resume  {run.name} from step {step:,} of its last.pt" if step is not None else f"resume  {run.name}"
    if step is not None and reached is not None and reached > step:
        # the log's progress line is throttled, so the run went at least this far: a lower bound on what is lost
        line += f": it had reached at least step {reached:,}, so {reached - step:,} or more steps since it are lost"
    elif step is not None:
        line += ", where it stopped"
    return line


def finish(run: Run, record: dict, files: dict[str, bytes] | None) -> str | None:
    """Store what a run sent back: its files when it ran elsewhere, and the final run.json.

    Nothing is written when the directory's launch record is not this run's (another launch took the directory):
    then the reason is returned, else None.
    """
    launched = (read_json(run.run_dir / RECORD_NAME) or {}).get("launch_id")
    if launched != record.get("launch_id"):
        return f"{run.run_dir} now holds another launch ({launched}); this run's record was not written over it"
    for rel, data in (files or {}).items():
        target = run.run_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (run.run_dir / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
    return None


def _failure_record(run: Run, error: str) -> dict:
    """A record for a run that could not even report back (e.g. a Ray task that died)."""
    previous = read_json(run.run_dir / RECORD_NAME) or {}
    return {**previous, "status": "failed", "returncode": None, "error": error, "end": utc_now()}


def run_local(runs: list[Run], workers: int, start, on_done) -> None:
    """Execute the runs in a pool of ``workers`` threads, each waiting on its subprocess.

    A thread takes up the first run left that it can start: ``start(run)`` claims and prepares it (its spec, None
    when it is not to run, or who holds it when another command does). A held run is passed over for the runs after
    it, so two sweeps that share seeds each run the free ones first; only when every run left is held does a thread
    wait, trying them again every 2 s until one is free or the sweep is stopped.
    """
    left = list(runs)
    lock = threading.Lock()

    def take() -> tuple[Run, dict | None] | None:
        while True:
            with lock:
                for run in left:
                    if not isinstance(spec := start(run), str):
                        left.remove(run)
                        return run, spec
            if _STOP.wait(2.0):
                return None

    def attempt() -> tuple[Run, dict, dict[str, bytes] | None] | None:
        if (taken := take()) is None or taken[1] is None:
            return None
        run, spec = taken
        return run, *execute(spec)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(attempt) for _ in runs]
        try:
            for future in as_completed(futures):
                if (outcome := future.result()) is not None:
                    on_done(*outcome)
        except KeyboardInterrupt:  # the scripts run in their own sessions: stop them here
            _STOP.set()
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in list(_LIVE):
                _kill_group(proc)
            raise


def run_ray(specs: list[tuple[Run, dict]], args: argparse.Namespace, on_done) -> None:
    """Execute each run as a Ray task on a cluster (``--ray-address``) or a local instance (``--ray``)."""
    import ray

    if args.ray_address:
        ray.init(address=args.ray_address)
    else:
        ray.init(num_cpus=args.workers or os.cpu_count(), include_dashboard=False)
    try:
        if execute.__module__ != "__main__":  # imported (tests): ship this module's code, not its name
            ray.cloudpickle.register_pickle_by_value(sys.modules[execute.__module__])
        task = ray.remote(num_cpus=args.cpus_per_run, num_gpus=args.gpus_per_run, max_retries=0)(execute)
        pending = {task.remote(spec): run for run, spec in specs}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    run = pending.pop(ref)
                    try:
                        record, files = ray.get(ref)
                    except Exception as exc:  # the task itself died (worker lost, ...)
                        record, files = _failure_record(run, f"ray task failed: {exc!r}"), None
                    on_done(run, record, files)
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref)  # raises KeyboardInterrupt in the task, which kills its process group
            raise
    finally:
        ray.shutdown()


def joined_extra(argv: list[str]) -> list[str]:
    """`--extra VALUE` as `--extra=VALUE`: argparse takes a value that starts with a dash (`--extra --rnn`) for an
    option of run.py's own and stops with "expected one argument"; the next word is always --extra's."""
    out, rest = [], iter(argv)
    for word in rest:
        value = next(rest, None) if word == "--extra" else None
        out.append(word if value is None else f"--extra={value}")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The sweep's command line."""
    parser = argparse.ArgumentParser(
        description="Run algorithms x envs x seeds (locally or on Ray) and collect the results."
    )
    parser.add_argument("--algos", type=_csv, required=True, help="comma-separated algorithms: algos/<algo>.py")
    parser.add_argument("--envs", type=_csv, required=True, help="comma-separated env ids")
    parser.add_argument("--seeds", type=parse_seeds, default="5", help="N (seeds 0..N-1) or a list '1,3' (default 5)")
    parser.add_argument("--total-timesteps", type=int, required=True, help="budget of every run in env steps")
    parser.add_argument(
        "--extra",
        default="",
        help="flags for every script: '--num-envs 32', --rnn; not those run.py sets itself",
    )
    parser.add_argument(
        "--variant",
        type=variant_name,
        default="",
        help="label of a non-default configuration: results go to <env>/<algo>-<variant>.json (e.g. 'continuous')",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root (default results/)")
    parser.add_argument("--algos-dir", type=Path, default=REPO_ROOT / "algos", help="scripts (default algos/)")
    parser.add_argument("--workers", type=int, default=None, help="parallel runs (default: the cpu count)")
    parser.add_argument("--threads-per-run", type=int, default=None, help="OMP/MKL threads of each run")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before a run is killed")
    parser.add_argument("--force", action="store_true", help="rerun finished runs too")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--status", action="store_true", help="say where each run of this sweep stands (done, running at step n...)"
    )
    parser.add_argument("--ray", action="store_true", help="run on a local Ray instance (ray.init())")
    parser.add_argument("--ray-address", default=None, help="an existing Ray cluster: auto | ray://host:port")
    parser.add_argument("--cpus-per-run", type=float, default=1, help="CPUs a Ray task asks for (default 1)")
    parser.add_argument("--gpus-per-run", type=float, default=0, help="GPUs a Ray task asks for (default 0)")
    parser.add_argument("--no-collect", action="store_true", help="do not write the result JSON files")
    parser.add_argument("--no-readme", action="store_true", help="do not regenerate <out>/README.md")
    args = parser.parse_args(joined_extra(sys.argv[1:] if argv is None else argv))
    if args.total_timesteps < 1:
        parser.error("--total-timesteps must be >= 1")
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers {args.workers}: must be >= 1 (without it: one run per CPU)")
    if args.threads_per_run is not None and args.threads_per_run < 1:
        parser.error(f"--threads-per-run {args.threads_per_run}: must be >= 1 (without it: the CPUs shared out)")
    if args.timeout is not None and args.timeout <= 0:
        parser.error(f"--timeout {args.timeout:g}: must be > 0 seconds (without it: no limit)")
    if args.cpus_per_run <= 0 or args.gpus_per_run < 0:
        parser.error(f"--cpus-per-run {args.cpus_per_run:g} must be > 0 and --gpus-per-run {args.gpus_per_run:g} >= 0")
    if not (args.dry_run or args.status) and (parent := writable_parent(args.out)) is not None:
        parser.error(f"--out {args.out}: {parent} is not a folder this user can write in")
    try:
        args.extra_argv = extra_flags(args.extra)
    except ValueError as exc:
        parser.error(str(exc))
    if args.algos_dir.resolve() == REPO_ROOT / "algos" and (unknown := unknown_envs(args.envs)):
        parser.error(f"--envs: {'; '.join(unknown)}")  # before any run starts, not one FAILED line a run
    if args.algos_dir.resolve() == REPO_ROOT / "algos" and (refusal := extra_refusal(args.algos, args.extra_argv)):
        parser.error(refusal)
    args.out = args.out.resolve()
    args.algos_dir = args.algos_dir.resolve()
    args.use_ray = args.ray or args.ray_address is not None
    workers = args.workers or os.cpu_count() or 1
    threads = args.threads_per_run
    if threads is None and not args.use_ray and not any(v in os.environ for v in THREAD_VARS):
        threads = max(1, (os.cpu_count() or 1) // workers)
    args.child_env = {var: str(threads) for var in THREAD_VARS} if threads else {}
    args.workers = workers if not args.use_ray else args.workers
    return args


def earlier_seeds(out: Path, env_id: str, label: str, swept: list[int], total_timesteps: int, say=print) -> list[int]:
    """The finished seeds of `label` on `env_id` that this sweep did not run but an earlier one did with the same
    budget: they belong in the same result file, and writing it from this sweep's seeds alone would drop them. A
    seed of another budget (or started by hand, with no record of one) is left out, in a line that says so."""
    found, _ = finished_runs(out, [env_id], [label])
    same, other = [], []
    for seed in found.get((env_id, label), []):
        if seed in swept:
            continue
        record = read_json(run_dir_for(out, env_id, label, seed) / RECORD_NAME) or {}
        (same if record.get("total_timesteps") == total_timesteps else other).append(seed)
    if same:
        say(f"{env_id}/{label}: also collecting seed(s) {same}, finished by an earlier sweep of the same budget")
    if other:
        say(f"{env_id}/{label}: leaving out seed(s) {other}, not trained by a sweep of {total_timesteps:,} steps")
    return same


class Sweep:
    """One sweep's runs and their outcomes as they come in: the progress bar and its tallies, the run directories
    this sweep holds locked, and the rows it publishes, each as soon as its seeds are settled (a six-hour sweep
    publishes every row it can before its end, not all at its end)."""

    def __init__(self, args: argparse.Namespace, runs: list[Run], sweep_command: str):
        from tqdm import tqdm

        self.args, self.runs, self.sweep_command = args, runs, sweep_command
        self.outcomes: dict[Path, str] = {}  # run directory -> "ok", "skipped", "failed" or "busy", once settled
        self.failures: list[str] = []  # the lines that say why a run failed or was not run
        self.todo: list[Run] = []
        for run in runs:
            verdict = triage(run, args.force)
            if verdict == "skip":
                self.outcomes[run.run_dir] = "skipped"
            elif verdict in (None, "resume"):
                self.todo.append(run)
            else:
                self.outcomes[run.run_dir] = "failed"
                self.failures.append(f"FAILED {run.name}: {verdict}")
        self.commit = git_commit()
        self.bar = tqdm(total=len(runs), initial=len(self.outcomes), desc="runs", unit="run", dynamic_ncols=True)
        self.bar.set_postfix(self.counts())
        self.lock = threading.Lock()
        # run directory -> the fd of this sweep's lock on it, held until its record is written
        self.claims: dict[Path, int] = {}
        self.held: set[Path] = set()  # runs found held by another command (said once)
        self.rows: dict[tuple[str, str], set[Path]] = {}  # (env_id, label "<algo>-<variant>") -> its runs in this sweep
        for run in runs:
            self.rows.setdefault((run.env_id, run.algo), set()).add(run.run_dir)
        self.written: set[tuple[str, str]] = set()  # rows this sweep has collected
        self.paths: list[Path] = []
        self.errors: list[str] = []

    def counts(self) -> dict[str, int]:
        """The bar's tallies, read from the outcomes (the refused runs count as failed)."""
        tally = Counter(self.outcomes.values())
        return {outcome: tally[outcome] for outcome in ("ok", "skipped", "failed", "busy")}

    def collectable(self) -> list[Run]:
        """The runs finished now: skipped as done, or run to the end by this sweep."""
        return [run for run in self.runs if self.outcomes.get(run.run_dir) in ("ok", "skipped")]

    def collect_rows(self, keys: list[tuple[str, str]], say=print) -> None:
        """Write the result file of each row in `keys`: this sweep's seeds of it, minus those that failed or hold
        another command, and the seeds an earlier sweep of the same label and budget finished (a sweep adding
        seeds keeps the others)."""
        args = self.args
        collectable = self.collectable()
        groups = {key: [run.seed for run in collectable if (run.env_id, run.algo) == key] for key in keys}
        for (env_id, algo), seeds in groups.items():
            if seeds:
                seeds += earlier_seeds(args.out, env_id, algo, seeds, args.total_timesteps, say)
        new_paths, new_errors = collect(args.out, groups, args.total_timesteps)
        self.paths.extend(new_paths)
        self.errors.extend(new_errors)
        self.written.update(keys)
        for path in new_paths:
            say(f"wrote {path}")
        for (env_id, algo), seeds in groups.items():
            if seeds and (left := sorted(set(args.seeds) - set(seeds))):
                say(f"{env_id}/{algo}: collected without seed(s) {left} (see above)", file=sys.stderr)

    def tally(self, run: Run, outcome: str, message: str | None = None) -> None:
        with self.lock:
            self.outcomes[run.run_dir] = outcome
            if message:
                self.bar.write(message)
                if outcome in ("failed", "busy"):
                    self.failures.append(message)
            self.bar.update(1)
            self.bar.set_postfix(self.counts())

    def start(self, run: Run) -> dict | str | None:
        """Claim, triage (again: another sweep may have run it meanwhile) and prepare a run just before it runs: its
        spec, None when it is not to run, or who holds it.

        Locally a held run is tried again later (run_local; the other sweep's result is then collected); Ray claims
        every run at launch, so there a held run is left to the sweep that holds it.
        """
        if isinstance(claimed := claim(run.run_dir), str):
            if self.args.use_ray:
                self.tally(run, "busy", f"BUSY   {run.name}: {claimed}; not run, and not in this sweep's results")
                return None
            if run.run_dir not in self.held:
                self.held.add(run.run_dir)
                self.bar.write(f"busy    {run.name}: {claimed}; running the free runs first, then waiting for it")
            return claimed
        verdict = triage(run, self.args.force)
        if verdict not in (None, "resume"):
            os.close(claimed)
            if verdict == "skip":
                self.tally(run, "skipped", f"skip    {run.name}: finished meanwhile by another sweep")
            else:
                self.tally(run, "failed", f"FAILED {run.name}: {verdict}")
            return None
        self.claims[run.run_dir] = claimed
        resume = None
        if verdict == "resume":
            resume = resume_line(run)
            self.bar.write(resume)
        return prepare(run, self.args, self.commit, self.sweep_command, resume)

    def on_done(self, run: Run, record: dict, files: dict[str, bytes] | None) -> None:
        clash = finish(run, record, files)
        os.close(self.claims.pop(run.run_dir))
        if clash is not None:
            self.tally(run, "failed", f"FAILED {run.name}: {clash}")
        elif record["status"] == "ok":
            self.tally(run, "ok", f"ok      {run.name} ({record.get('wall_time_s', 0):.1f} s)")
        else:
            self.tally(run, "failed", f"FAILED {run.name}: {record.get('error')}; log: {run.log}")
        key = (run.env_id, run.algo)
        if self.args.no_collect:
            return
        with self.lock:  # a row is published as soon as its seeds are done, not when the whole sweep is; once
            if key not in self.written and self.rows[key] <= self.outcomes.keys():
                self.collect_rows([key], self.bar.write)

    def execute(self) -> bool:
        """Run what is left to run; False when interrupted (Ctrl-C, or a SIGTERM to the sweep, which also stops its
        scripts)."""

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, interrupt)
        try:
            if self.args.use_ray:  # Ray queues every task at once: claim them all now
                specs = [(run, spec) for run in self.todo if (spec := self.start(run)) is not None]
                run_ray(specs, self.args, self.on_done)
            else:
                run_local(self.todo, self.args.workers, self.start, self.on_done)
        except KeyboardInterrupt:
            self.bar.close()
            print("interrupted", file=sys.stderr)
            return False
        finally:
            signal.signal(signal.SIGTERM, previous)
        self.bar.close()
        return True

    def report(self) -> int:
        """Collect the rows no run of this sweep ended (all skipped...), regenerate the README, say how the sweep
        went; 0 when every run and collection succeeded."""
        if not self.args.no_collect:
            self.collect_rows([key for key in self.rows if key not in self.written])
            if self.paths and not self.args.no_readme:
                import make_readme

                print(f"wrote {make_readme.generate(self.args.out)}")
        ok, skipped, failed, busy = self.counts().values()
        print(
            f"{ok} ran, {skipped} skipped, {failed} failed"
            + (f", {busy} busy" if busy else "")
            + f" (of {len(self.runs)} runs)"
        )
        for message in self.failures:
            print(message, file=sys.stderr)
        for error in self.errors:
            print(f"collect error: {error}", file=sys.stderr)
        return 1 if self.failures or self.errors else 0


def print_status(runs: list[Run], total_timesteps: int) -> None:
    """`--status`: one line per run and the tally of states; a reader that closes the pipe early (`| head`) ends it
    quietly."""
    try:
        states = [run_status(run, total_timesteps) for run in runs]
        for _, line in states:
            print(line)
        counts = Counter(state for state, _ in states)  # in the order the states first appear
        print(", ".join(f"{n} {state}" for state, n in counts.items()) + f" (of {len(runs)} runs)")
        sys.stdout.flush()
    except BrokenPipeError:  # Python's own recipe: point stdout at devnull so that its flush at exit is quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    """Run the sweep, collect it, regenerate the README; 0 when every run and collection succeeded."""
    raw_argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(raw_argv)
    runs = plan(args)
    if args.dry_run:
        for run in runs:
            print(run.command)
        return 0
    if args.status:
        print_status(runs, args.total_timesteps)
        return 0
    _STOP.clear()
    sweep = Sweep(args, runs, shlex.join(["python", _display_path(Path(__file__)), *raw_argv]))
    if not sweep.execute():
        return 130
    return sweep.report()


if __name__ == "__main__":
    sys.exit(main())
