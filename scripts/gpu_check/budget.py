"""The time budget of one gpu-check run, and each step's share of it.

The device tool gives a command 10 minutes and brings back only what the command left under $OUT,
so a run must end, summary written, before that: every step runs under its own time limit, all
within one budget (LOCKSTEP_GPU_CHECK_BUDGET_S, default 540 s), and RESERVE_S of it is kept for
the summary and the log archive. A step gets the seconds it wants, or what is left of the budget
when that is less; when less than its minimum would be left it is skipped (a SKIP row saying so),
not started to be cut short.

Seconds are counted as whole seconds since the start, as the shell script this replaces counted
them ($SECONDS), so a limit is always a whole number of seconds.
"""
import math
import time
from typing import Callable, NamedTuple, Optional

DEFAULT_BUDGET_S = 540
RESERVE_S = 15  # kept for the summary and the log archive
DEFAULT_MINIMUM_S = 10


class Limit(NamedTuple):
    """What a step asks of the budget: `want` seconds, and at least `minimum` to be worth
    starting."""
    want: int
    minimum: int = DEFAULT_MINIMUM_S


class Budget:
    """Whole seconds elapsed since the run started, and the limit each step may run under."""

    def __init__(self, total_s: int, reserve_s: int = RESERVE_S,
                 clock: Callable[[], float] = time.monotonic, started: Optional[float] = None):
        self.total_s = total_s
        self.reserve_s = reserve_s
        self._clock = clock
        self._started = clock() if started is None else started

    def elapsed_s(self) -> int:
        return math.floor(self._clock() - self._started)

    def remaining_s(self) -> int:
        return self.total_s - self.elapsed_s()

    def limit_for(self, limit: Limit) -> Optional[int]:
        """The seconds a step asking for `limit` may run, or None: skip it, it does not fit."""
        left = self.remaining_s() - self.reserve_s
        if left < limit.minimum:
            return None
        return min(limit.want, left)


def budget_from_environment(environ) -> int:
    """LOCKSTEP_GPU_CHECK_BUDGET_S as whole seconds; ValueError names the bad value."""
    text = environ.get("LOCKSTEP_GPU_CHECK_BUDGET_S", "")
    if text == "":
        return DEFAULT_BUDGET_S
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"LOCKSTEP_GPU_CHECK_BUDGET_S={text!r} is not a whole number of seconds")
    if value <= 0:
        raise ValueError(f"LOCKSTEP_GPU_CHECK_BUDGET_S={text!r} is not a positive number of "
                         "seconds")
    return value
