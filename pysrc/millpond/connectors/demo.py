"""Demo sources: inputs for examples and experiments, no outside system needed.

:class:`RandomMetricSource` emits ``(metric_name, value)`` with a random
value every ``interval``::

    import millpond.operators as op
    from millpond.connectors.demo import RandomMetricSource

    metrics = op.merge(
        "metrics",
        op.input("cpu", flow, RandomMetricSource("cpu", count=100)),
        op.input("mem", flow, RandomMetricSource("mem", count=100)),
    )

It is resumable: its partition's snapshot is how many items it has emitted,
so a run resumed from recovery data continues the count (with
``count=100``, the original run and the resumed one emit 100 between them,
give or take the replay of the epochs after the last committed one).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Callable, List, Optional, Tuple

from millpond.inputs import FixedPartitionedSource, StatefulSourcePartition

__all__ = ["RandomMetricSource"]


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class _RandomMetricPartition(StatefulSourcePartition[Tuple[str, float], int]):
    def __init__(
        self,
        metric_name: str,
        interval: timedelta,
        count: Optional[int],
        next_random: Callable[[], float],
        emitted: int,
    ) -> None:
        self._metric_name = metric_name
        self._interval = interval
        self._count = count
        self._next_random = next_random
        self._emitted = emitted
        # The first item (of a fresh or a resumed run) comes at once.
        self._awake: Optional[datetime] = None

    def next_batch(self) -> List[Tuple[str, float]]:
        if self._count is not None and self._emitted >= self._count:
            raise StopIteration()
        now = _utcnow() if self._interval > timedelta(0) else None
        if now is not None and self._awake is not None and now < self._awake:
            return []  # called early; the engine honours next_awake, others may not
        value = self._next_random()
        self._emitted += 1
        if now is not None:
            # Keep the cadence of the schedule, but skip ticks missed while
            # the worker was busy rather than catching up in a burst.
            scheduled = (self._awake or now) + self._interval
            self._awake = scheduled if scheduled > now else now + self._interval
        return [(self._metric_name, value)]

    def next_awake(self) -> Optional[datetime]:
        return self._awake

    def snapshot(self) -> int:
        return self._emitted


class RandomMetricSource(FixedPartitionedSource[Tuple[str, float], int]):
    """Emit ``(metric_name, next_random())`` every ``interval``.

    ``count`` items in all (``None``, the default: without end), then EOF.
    One partition, named ``metric_name``; its resume state is the number of
    items emitted so far, so a resumed run emits only the rest of ``count``.
    Between items the partition sleeps (``next_awake``), so an idle flow
    costs no CPU. ``interval=timedelta(0)`` emits as fast as the flow runs.

    ``next_random`` (default ``random.random``) makes the values; pass a
    seeded ``random.Random(42).random`` for repeatable ones.
    ``ValueError`` for a negative interval or count, ``TypeError`` for a
    ``metric_name`` that is not a ``str`` or a ``next_random`` that is not
    callable.

    >>> from millpond.testing import poll_next_batch
    >>> src = RandomMetricSource("temp", interval=timedelta(0), count=2, next_random=lambda: 0.5)
    >>> part = src.build_part("inp", "temp", None)
    >>> poll_next_batch(part), poll_next_batch(part), part.snapshot()
    ([('temp', 0.5)], [('temp', 0.5)], 2)
    """

    def __init__(
        self,
        metric_name: str,
        interval: timedelta = timedelta(seconds=0.7),
        count: Optional[int] = None,
        next_random: Callable[[], float] = random.random,
    ) -> None:
        if not isinstance(metric_name, str) or not metric_name:
            raise TypeError(f"RandomMetricSource: metric_name must be a non-empty str; got {metric_name!r:.80}")
        if not isinstance(interval, timedelta) or interval < timedelta(0):
            raise ValueError(f"RandomMetricSource: interval must be a timedelta >= 0; got {interval!r}")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise ValueError(f"RandomMetricSource: count must be None or an int >= 0; got {count!r}")
        if not callable(next_random):
            raise TypeError(f"RandomMetricSource: next_random must be callable; got {type(next_random).__name__}")
        self._metric_name = metric_name
        self._interval = interval
        self._count = count
        self._next_random = next_random

    def list_parts(self) -> List[str]:
        return [self._metric_name]

    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[int]
    ) -> StatefulSourcePartition[Tuple[str, float], int]:
        emitted = 0 if resume_state is None else int(resume_state)
        return _RandomMetricPartition(
            self._metric_name, self._interval, self._count, self._next_random, emitted
        )
