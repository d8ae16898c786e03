"""Helpers to run and test dataflows from Python.

::

    from millpond.dataflow import Dataflow
    import millpond.operators as op
    from millpond.testing import TestingSink, TestingSource, run_main

    flow = Dataflow("test")
    s = op.input("inp", flow, TestingSource([1, 2, 3]))
    op.output("out", op.map("inc", s, lambda x: x + 1), TestingSink(out := []))
    run_main(flow)
    assert out == [2, 3, 4]

``TestingSource`` items may include markers: ``TestingSource.EOF()`` ends
this execution's input there (a resumed execution continues after it),
``TestingSource.ABORT()`` stops the execution abruptly once, like a crash
(committed epochs survive, nothing else does), and
``TestingSource.PAUSE(timedelta)`` makes the partition sleep.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, List, Optional, Sequence, Set, TypeVar

from millpond.dataflow import Dataflow
from millpond.engine import execute
from millpond.inputs import (
    AbortExecution,
    FixedPartitionedSource,
    StatefulSourcePartition,
)
from millpond.outputs import DynamicSink, StatelessSinkPartition

__all__ = [
    "TestingSource",
    "TestingSink",
    "run_main",
    "cluster_main",
    "poll_next_batch",
]

X = TypeVar("X")


class _TestingPartition(StatefulSourcePartition[Any, int]):
    def __init__(self, source: "TestingSource", resume_state: Optional[int]) -> None:
        self._source = source
        self._idx = 0 if resume_state is None else resume_state
        self._awake: Optional[datetime] = None

    def next_batch(self) -> List[Any]:
        self._awake = None
        items = self._source._items
        size = self._source._batch_size
        out: List[Any] = []
        while len(out) < size:
            if self._idx >= len(items):
                if out:
                    return out
                raise StopIteration()
            item = items[self._idx]
            if isinstance(item, (TestingSource.EOF, TestingSource.ABORT, TestingSource.PAUSE)):
                # A marker ends the batch; it takes effect on the next call.
                if out:
                    return out
                if isinstance(item, TestingSource.EOF):
                    self._idx += 1
                    raise StopIteration()
                if isinstance(item, TestingSource.ABORT):
                    if self._idx not in self._source._fired:
                        self._source._fired.add(self._idx)
                        raise AbortExecution(f"TestingSource.ABORT() at item {self._idx}")
                    self._idx += 1
                    continue
                self._idx += 1
                self._awake = datetime.now(timezone.utc) + item.duration
                return []
            out.append(item)
            self._idx += 1
        return out

    def next_awake(self) -> Optional[datetime]:
        return self._awake

    def snapshot(self) -> int:
        return self._idx


class TestingSource(FixedPartitionedSource[X, int]):
    """A one-partition source over a list, that resumes by list index.

    The list is read lazily, so items appended between runs are seen by the
    next run. ``batch_size`` items go into each batch (markers end a batch
    early). ``ValueError`` for a ``batch_size`` below 1.
    """

    __test__ = False  # not a pytest test class

    class EOF:
        """End this execution's input here; the next execution continues after it."""

        def __repr__(self) -> str:
            return "TestingSource.EOF()"

    class ABORT:
        """Stop the execution abruptly here, once per source object (as a crash)."""

        def __repr__(self) -> str:
            return "TestingSource.ABORT()"

    class PAUSE:
        """Make the partition emit nothing for ``duration``."""

        def __init__(self, duration: timedelta) -> None:
            if not isinstance(duration, timedelta) or duration < timedelta(0):
                raise ValueError(f"PAUSE needs a non-negative timedelta; got {duration!r}")
            self.duration = duration

        def __repr__(self) -> str:
            return f"TestingSource.PAUSE({self.duration!r})"

    def __init__(self, items: Sequence[Any], batch_size: int = 1) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        self._items = items
        self._batch_size = batch_size
        # Indexes of ABORT markers that already fired for this source.
        self._fired: Set[int] = set()

    def list_parts(self) -> List[str]:
        return ["iterable"]

    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[int]
    ) -> StatefulSourcePartition[X, int]:
        return _TestingPartition(self, resume_state)


class _TestingSinkPartition(StatelessSinkPartition[Any]):
    def __init__(self, out: List[Any]) -> None:
        self._out = out

    def write_batch(self, items: List[Any]) -> None:
        self._out.extend(items)


class TestingSink(DynamicSink[X]):
    """Appends every item to ``ls`` (from every worker)."""

    __test__ = False

    def __init__(self, ls: List[X]) -> None:
        self._ls = ls

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _TestingSinkPartition:
        return _TestingSinkPartition(self._ls)


def run_main(
    flow: Dataflow,
    *,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Any = None,
) -> None:
    """Run ``flow`` on one worker in the calling thread until its input ends.

    ``epoch_interval`` defaults to 10 seconds; ``recovery_config`` (a
    ``millpond.recovery.RecoveryConfig``) turns recovery on. Exceptions from
    user code arrive as ``millpond.errors.DataflowError``; ``ValueError``
    for a flow without input or output.
    """
    execute(flow, worker_count=1, epoch_interval=epoch_interval, recovery_config=recovery_config)


def cluster_main(
    flow: Dataflow,
    addresses: Optional[Sequence[str]],
    proc_id: int,
    *,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Any = None,
    worker_count_per_proc: int = 1,
) -> None:
    """Run ``flow`` with ``worker_count_per_proc`` workers in this process.

    The workers run cooperatively in the calling thread. ``addresses=[]``
    (or a single address with ``proc_id=0``) means a one-process cluster;
    several processes are not supported yet (``ValueError``). Keyed items go
    to the worker that owns their key, so results are the same for any
    worker count.
    """
    addrs = list(addresses or [])
    if len(addrs) > 1:
        raise ValueError(
            f"multi-process clusters are not supported yet ({len(addrs)} addresses given); "
            "run one process with worker_count_per_proc=N instead"
        )
    if proc_id != 0:
        raise ValueError(f"proc_id must be 0 for a one-process cluster; got {proc_id!r}")
    if not isinstance(worker_count_per_proc, int) or worker_count_per_proc < 1:
        raise ValueError(
            f"worker_count_per_proc must be a positive int; got {worker_count_per_proc!r}"
        )
    execute(
        flow,
        worker_count=worker_count_per_proc,
        epoch_interval=epoch_interval,
        recovery_config=recovery_config,
    )


def poll_next_batch(part: Any, timeout: timedelta = timedelta(seconds=5)) -> List[Any]:
    """Call ``part.next_batch()`` until it returns items; return them.

    Honours ``part.next_awake()``. Raises ``TimeoutError`` after ``timeout``
    without items; ``StopIteration`` from the partition passes through.
    """
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        awake = part.next_awake() if hasattr(part, "next_awake") else None
        if awake is not None:
            wait = (awake - datetime.now(timezone.utc)).total_seconds()
            if wait > 0:
                if time.monotonic() + wait > deadline:
                    raise TimeoutError(f"no items within {timeout}")
                time.sleep(wait)
        batch = list(part.next_batch())
        if batch:
            return batch
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no items within {timeout}")
        time.sleep(0.001)
