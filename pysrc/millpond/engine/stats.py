"""What a worker counts for the metrics endpoint, kept cheap enough to count
always: :class:`LatencyHistogram` (fixed buckets, one observation per
epoch) and :class:`SourceLags` (the optional ``lag()`` of each source
partition, asked on the engine's thread at most once a second).

Nothing here imports ``prometheus_client``: :mod:`millpond.metrics` reads
these numbers when ``/metrics`` is scraped, from the server's thread, so
every figure is a plain int, float or a list of them that a reader may see
one update behind, never torn.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

__all__ = ["LatencyHistogram", "SourceLags", "EPOCH_CLOSE_BOUNDS", "dir_bytes"]

logger = logging.getLogger("millpond")

#: Upper bounds, in seconds, of the epoch-close latency buckets: from a
#: memory-only close (well under a millisecond) to one held up by
#: back-pressure from a slow backup.
EPOCH_CLOSE_BOUNDS: Tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)

#: Seconds between two samples of the source partitions' lag.
LAG_SAMPLE_SECONDS = 1.0


class LatencyHistogram:
    """Durations in fixed buckets, as a Prometheus histogram counts them.

    >>> h = LatencyHistogram((0.1, 1.0))
    >>> for s in (0.05, 0.5, 0.7, 3.0):
    ...     h.observe(s)
    >>> h.cumulative()
    [(0.1, 1), (1.0, 3), (inf, 4)]
    >>> round(h.total, 2)
    4.25
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float] = EPOCH_CLOSE_BOUNDS) -> None:
        self.bounds = tuple(bounds)
        #: Per bucket (not cumulative); the last one is above every bound.
        self.counts: List[int] = [0] * (len(self.bounds) + 1)
        #: The sum of every observation, in seconds.
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration."""
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> List[Tuple[float, int]]:
        """``(upper bound, observations at or below it)`` per bucket, the
        last bound ``inf``: what a Prometheus histogram exposes."""
        out: List[Tuple[float, int]] = []
        running = 0
        for bound, n in zip(self.bounds + (float("inf"),), list(self.counts), strict=True):
            running += n
            out.append((bound, running))
        return out


class SourceLags:
    """The lag each source partition of a worker reports, if it can.

    A partition may define ``lag() -> int | None``: how far it is behind
    its source (for Kafka, the high watermark minus the next offset). It
    is asked on the engine's thread (a partition object, like a Kafka
    consumer, need not be safe to call from another), at most once every
    :data:`LAG_SAMPLE_SECONDS`, and only while a metrics endpoint is
    serving (:attr:`enabled`). ``None`` means "not known now": the last
    figure is dropped. A ``lag()`` that raises is logged once per
    partition and not asked again.
    """

    def __init__(self) -> None:
        #: Set by the metrics endpoint: nothing is asked otherwise.
        self.enabled = False
        #: ``(step id, partition name) -> lag``, as last reported.
        self.values: Dict[Tuple[str, str], float] = {}
        self._next = 0.0
        self._broken: set[Tuple[str, str]] = set()

    def due(self) -> bool:
        """True when a sample is wanted now (cheap enough to ask per poll)."""
        return self.enabled and time.monotonic() >= self._next

    def sample(self, parts: Sequence[Tuple[str, str, Any]]) -> None:
        """Ask ``(step id, partition name, partition)`` each for its lag."""
        self._next = time.monotonic() + LAG_SAMPLE_SECONDS
        values = dict(self.values)
        for step_id, name, part in parts:
            where = (step_id, name)
            if where in self._broken:
                continue
            lag = getattr(part, "lag", None)
            if not callable(lag):
                continue
            try:
                value = lag()
            except Exception:  # noqa: BLE001 - a metric must not stop the flow
                self._broken.add(where)
                values.pop(where, None)
                logger.warning(
                    "step %r partition %r: lag() raised; its source lag is not reported any more",
                    step_id, name, exc_info=True,
                )
                continue
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                values.pop(where, None)
            else:
                values[where] = float(value)
        # One assignment: a reader sees the old or the new figures whole.
        self.values = values


def dir_bytes(directory: Path) -> int:
    """Bytes of the files in ``directory`` (a worker's local store: the
    database, its write-ahead log, generations being written); 0 if it
    is gone."""
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:  # removed while counting
                    pass
    except OSError:
        return 0
    return total
