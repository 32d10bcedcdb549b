"""Helpers of the script tests: run a script of algos/ in this process, read what it logged.

`run_inline` executes the script as __main__ with `runpy`: the identical code path and CLI as a subprocess, without
paying the torch import for each run on a 2-core machine.
"""

import runpy
import signal
import sys
from pathlib import Path
from unittest import mock

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ALGOS_DIR = Path(__file__).resolve().parents[1] / "algos"


def run_inline(capsys, algo, *flags, check=True):
    """Run algos/<algo>.py with these flags; returns (exit code, stdout, stderr)."""
    script = ALGOS_DIR / f"{algo}.py"
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with mock.patch.object(sys, "argv", [str(script), *map(str, flags)]):
        try:
            runpy.run_path(str(script), run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code
        finally:  # a stopped run leaves the signals ignored for the rest of its process: this process goes on
            for s, handler in handlers.items():
                signal.signal(s, handler)
    out = capsys.readouterr()
    if check and code != 0:
        raise AssertionError(f"{algo} {flags} failed ({code}):\n{out.err[-3000:]}")
    return code, out.out, out.err


def scalars(run_dir, tag):
    """[(step, value)] of one TensorBoard tag of a run directory ([] if it was never logged)."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []
