"""Time as the engine sees it: wall-clock UTC for timers and source wake-ups,
a monotonic clock for epoch intervals, and an interruptible sleep.

Kept behind one small class so tests (and a future simulated-time runner)
can substitute it.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """What the engine needs from time."""

    def now(self) -> datetime:
        """The current UTC-aware wall-clock time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (epoch deadlines)."""

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds``; Ctrl-C must interrupt it."""


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            # time.sleep is interrupted by SIGINT, so Ctrl-C stays prompt.
            time.sleep(seconds)
