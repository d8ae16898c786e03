"""Flows for tests/test_metrics.py: a slow fixed-partition source whose
partitions report their lag, counted per key.

``get_flow(total, delay)`` ends after ``total`` items per partition, one
every ``delay`` seconds; ``stop`` (a ``threading.Event``, in-process
tests) ends it early. Each partition's ``lag()`` is the items it has not
emitted yet; a partition named ``nolag`` has no ``lag()``, ``broken``
one that raises.
"""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.inputs import FixedPartitionedSource, StatefulSourcePartition
from millpond.testing import TestingSink


class SlowPart(StatefulSourcePartition):
    def __init__(self, total: int, delay: float, stop: Optional[threading.Event], resume: Optional[int]) -> None:
        self.total, self.delay, self.stop = total, delay, stop
        self.n = resume or 0

    def next_batch(self) -> List[str]:
        if self.n >= self.total or (self.stop is not None and self.stop.is_set()):
            raise StopIteration
        time.sleep(self.delay)
        self.n += 1
        return [f"k{self.n % 5}"]

    def snapshot(self) -> int:
        return self.n

    def lag(self) -> int:
        return self.total - self.n


class NoLagPart(SlowPart):
    lag = None  # type: ignore[assignment]


class BrokenLagPart(SlowPart):
    def lag(self) -> int:
        raise RuntimeError("lag is broken")


class SlowSource(FixedPartitionedSource):
    def __init__(self, parts: List[str], total: int, delay: float, stop: Optional[threading.Event]) -> None:
        self.parts, self.total, self.delay, self.stop = parts, total, delay, stop

    def list_parts(self) -> List[str]:
        return list(self.parts)

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> SlowPart:
        cls = {"nolag": NoLagPart, "broken": BrokenLagPart}.get(for_part, SlowPart)
        return cls(self.total, self.delay, self.stop, resume_state)


def get_flow(total: int = 100, delay: float = 0.01, parts: Optional[List[str]] = None,
             stop: Optional[threading.Event] = None, out: Optional[list] = None,
             flow_id: str = "metrics_flow") -> Dataflow:
    flow = Dataflow(flow_id)
    words = op.input("in", flow, SlowSource(parts or ["p0", "p1"], total, delay, stop))
    counts = op.stateful_map("count", op.key_on("key", words, lambda w: w),
                             lambda n, _w: ((n or 0) + 1, (n or 0) + 1))
    op.output("out", counts, TestingSink(out if out is not None else []))
    return flow
