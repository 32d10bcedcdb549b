"""When things happen in a training loop: a linear schedule, and the intervals a step counter crosses."""


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """`start` moved linearly to `end` over `duration` steps, then held at `end`; either way (epsilon falls, and a
    schedule may rise)."""
    value = (end - start) / max(duration, 1) * t + start
    return max(value, end) if end <= start else min(value, end)


def crossings(step: int, advanced: int, every: int) -> int:
    """How many multiples of `every` the step counter passed when it advanced by `advanced` to `step`: with
    `--num-envs` steps at a time, an interval of `every` env steps is due this many times (0, 1 or more)."""
    return step // every - (step - advanced) // every
