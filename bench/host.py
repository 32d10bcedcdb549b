"""What the benchmarks of bench/ share: the machine they ran on, named the same way in every table."""

import argparse
import os
import platform
import shlex
import subprocess
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows of it."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


ALGOS_DIR = Path(__file__).resolve().parent.parent / "algos"


def positive(kind=int):
    """An argparse type: a number of `kind` above zero (a count of steps, rounds or seconds); anything else is one
    error line naming what was given, not an empty median or a division by zero minutes later."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def scripts(text: str) -> str:
    """An argparse type: comma-separated scripts of algos/, each one there (the text is returned as given)."""
    names = [name for name in text.split(",") if name]
    missing = [name for name in names if not (ALGOS_DIR / f"{name}.py").is_file()]
    if missing or not names:
        known = ", ".join(sorted(p.stem for p in ALGOS_DIR.glob("*.py")))
        raise argparse.ArgumentTypeError(f"no script algos/<name>.py for {', '.join(missing) or repr(text)} "
                                         f"(there are: {known})")  # fmt: skip
    return text


def writable_parent(path: Path) -> Path | None:
    """None when `path` is, or can be made, a folder this user writes in; else the nearest existing path in the way
    (a file, or a folder without write access)."""
    for place in (path, *path.parents):
        if place.exists():
            return None if place.is_dir() and os.access(place, os.W_OK | os.X_OK) else place
    return None


def out_folder(text: str) -> Path:
    """An argparse type: --out as a folder of reports, refused at once when it cannot be written in (a file in the
    way, a folder without write access), not by the write after the benchmark's minutes of measuring."""
    if (blocker := writable_parent(Path(text))) is not None:
        raise argparse.ArgumentTypeError(f"{blocker} is not a folder this user can write in")
    return Path(text)


def out_file(text: str) -> str:
    """An argparse type: --out as a report file or the stem of its files (``results/speed/numba_mpe``), refused at
    once when its folder cannot be written in or it names a folder; the text as given."""
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: name a file in it (its stem, for .md and .json)")
    if (blocker := writable_parent(Path(text).parent)) is not None:
        raise argparse.ArgumentTypeError(f"{blocker} is not a folder this user can write in")
    return text


def run_or_exit(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of one measured run, its output captured; a run that fails ends the benchmark in one line with
    the command and the run's own last words (its `error:` line), not a CalledProcessError that hides them."""
    done = subprocess.run(cmd, capture_output=True, **kwargs)
    if done.returncode:
        said = done.stderr if isinstance(done.stderr, str) else done.stderr.decode(errors="replace")
        last = next((line for line in reversed(said.strip().splitlines()) if line.strip()), "no output")
        raise SystemExit(f"error: {shlex.join(map(str, cmd))} failed (exit {done.returncode}): {last.strip()}")
    return done
