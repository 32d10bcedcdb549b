"""Helpers of the script tests: run a script of algos/ in this process, read what it logged.

`run_inline` executes the script as __main__ with `runpy`: the identical code path and CLI as a subprocess, without
paying the torch import for each run on a 2-core machine. `run_captured` does the same without pytest's capsys and
answers as `subprocess.run` would, for the tests written against subprocesses; a test that needs a process of its
own (signals, environment variables read at import) starts one.
"""

import contextlib
import io
import runpy
import signal
import subprocess
import sys
from pathlib import Path
from unittest import mock

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ALGOS_DIR = Path(__file__).resolve().parents[1] / "algos"


def execute(script: Path, flags) -> int | str | None:
    """Run `script` as __main__ with these flags in this process; returns its SystemExit code (0 when it returns)."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with mock.patch.object(sys, "argv", [str(script), *map(str, flags)]):
        try:
            runpy.run_path(str(script), run_name="__main__")
            return 0
        except SystemExit as e:
            return e.code
        finally:  # a stopped run leaves the signals ignored for the rest of its process: this process goes on
            for s, handler in handlers.items():
                signal.signal(s, handler)


def run_inline(capsys, algo, *flags, check=True):
    """Run algos/<algo>.py with these flags; returns (exit code, stdout, stderr)."""
    code = execute(ALGOS_DIR / f"{algo}.py", flags)
    out = capsys.readouterr()
    if check and code != 0:
        raise AssertionError(f"{algo} {flags} failed ({code}):\n{out.err[-3000:]}")
    return code, out.out, out.err


def run_captured(script: Path, *flags, check=True) -> subprocess.CompletedProcess:
    """Run `script` in this process as `subprocess.run(..., capture_output=True, text=True)` would in another: its
    output captured, `SystemExit("message")` printed to stderr with exit status 1, as Python's exit does."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = execute(script, flags)
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
    code = code or 0  # SystemExit(None): 0
    proc = subprocess.CompletedProcess([str(script), *map(str, flags)], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"{script.name} {flags} failed ({code}):\n{proc.stderr[-3000:]}")
    return proc


def scalars(run_dir, tag):
    """[(step, value)] of one TensorBoard tag of a run directory ([] if it was never logged)."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []
