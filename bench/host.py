"""What the benchmarks of bench/ share: the machine they ran on, named the same way in every table."""

import platform


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows of it."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
