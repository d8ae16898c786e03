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
from collections.abc import Sequence as _Sequence, Sized as _Sized
from itertools import islice as _islice
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Set, TypeVar

from millpond.engine.main import cluster_main, run_main
from millpond.errors import AbortExecution
from millpond.inputs import FixedPartitionedSource, StatefulSourcePartition
from millpond.outputs import DynamicSink, StatelessSinkPartition

__all__ = [
    "TestingSource",
    "TestingSink",
    "run_main",
    "cluster_main",
    "poll_next_batch",
]

X = TypeVar("X")


# The end of the items.
_END: Any = object()


class _TestingPartition(StatefulSourcePartition[Any, int]):
    """Reads a source's items from index ``resume_state`` on.

    Items are indexed in the source's sequence (for an iterator, the list
    of what it yielded so far, extended as the partition reads on). An
    ``ABORT()`` that already fired is skipped as if it were not there: it
    neither ends a batch nor fires again.
    """

    def __init__(self, source: "TestingSource[Any]", resume_state: Optional[int]) -> None:
        self._source = source
        self._idx = 0 if resume_state is None else resume_state
        self._awake: Optional[datetime] = None

    def _peek(self) -> Any:
        source = self._source
        source._fill(self._idx + 1)
        seq = source._seq
        return seq[self._idx] if self._idx < len(seq) else _END

    def next_batch(self) -> List[Any]:
        self._awake = None
        out = self._take()
        if out:
            return out
        return self._at_marker_or_end()

    def _take(self) -> List[Any]:
        """Up to a batch of plain items, sliced at once (the source of the
        throughput benchmarks: no call per item); a marker ends the batch,
        except an ABORT that already fired."""
        source = self._source
        size = source._batch_size
        out: List[Any] = []
        while True:
            start = self._idx
            want = size - len(out)
            source._fill(start + want)
            chunk = source._seq[start:start + want]
            if type(chunk) is not list:
                chunk = list(chunk)
            marker: Any = None
            for i, item in enumerate(chunk):
                if isinstance(item, _Marker):
                    marker = item
                    del chunk[i:]
                    break
            self._idx = start + len(chunk)
            if out:
                out.extend(chunk)
            else:
                out = chunk
            if isinstance(marker, TestingSource.ABORT) and self._idx in source._fired:
                self._idx += 1
                continue
            return out

    def _at_marker_or_end(self) -> List[Any]:
        """No plain item is next: the end, or a marker, which takes effect now."""
        while True:
            item = self._peek()
            if item is _END:
                raise StopIteration()
            if isinstance(item, TestingSource.EOF):
                self._idx += 1
                raise StopIteration()
            if isinstance(item, TestingSource.ABORT):
                if self._idx not in self._source._fired:
                    self._source._fired.add(self._idx)
                    raise AbortExecution(f"TestingSource.ABORT() at item {self._idx}")
                self._idx += 1
                out = self._take()
                if out:
                    return out
                continue
            assert isinstance(item, TestingSource.PAUSE)
            self._idx += 1
            self._awake = datetime.now(timezone.utc) + item.duration
            return []

    def next_awake(self) -> Optional[datetime]:
        return self._awake

    def snapshot(self) -> int:
        return self._idx


class _Marker:
    """The base of TestingSource's markers (EOF, ABORT, PAUSE)."""


class TestingSource(FixedPartitionedSource[X, int]):
    """A one-partition source over any iterable, that resumes by position.

    A list (any sequence) is read lazily, so items appended between runs are
    seen by the next run. A set, a dict view or another sized collection is
    copied into a list when the source is made. A generator or other
    iterator is consumed once, lazily (an endless one works), and the
    source keeps what it yielded: every run of the same source (a resumed
    one, or the same flow run again) sees the same items, in the same
    order, and the iterator is never restarted. (So it holds every item
    read so far in memory; pass a list to share one.) A new
    ``TestingSource`` over a generator that another one consumed sees
    only what is left of it.
    ``batch_size`` items go into each batch (markers end a batch early;
    an ``ABORT()`` that already fired does not). ``ValueError`` for a
    ``batch_size`` below 1, ``TypeError`` for something that is not
    iterable.

    >>> from millpond.testing import poll_next_batch
    >>> part = TestingSource((n * n for n in range(5)), batch_size=2).build_part("s", "iterable", None)
    >>> poll_next_batch(part), poll_next_batch(part), poll_next_batch(part)
    ([0, 1], [4, 9], [16])
    """

    __test__ = False  # not a pytest test class

    class EOF(_Marker):
        """End this execution's input here; the next execution continues after it."""

        def __repr__(self) -> str:
            return "TestingSource.EOF()"

    class ABORT(_Marker):
        """Stop the execution abruptly here, once per source object (as a crash)."""

        def __repr__(self) -> str:
            return "TestingSource.ABORT()"

    class PAUSE(_Marker):
        """Make the partition emit nothing for ``duration``."""

        def __init__(self, duration: timedelta) -> None:
            if not isinstance(duration, timedelta) or duration < timedelta(0):
                raise ValueError(f"PAUSE needs a non-negative timedelta; got {duration!r}")
            self.duration = duration

        def __repr__(self) -> str:
            return f"TestingSource.PAUSE({self.duration!r})"

    def __init__(self, items: Iterable[X], batch_size: int = 1) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        try:
            iter(items)
        except TypeError:
            raise TypeError(f"TestingSource needs an iterable of items; got {type(items).__name__}: {items!r:.80}") from None
        self._items = items
        self._batch_size = batch_size
        # Indexes of ABORT markers that already fired for this source.
        self._fired: Set[int] = set()
        # The items by index: the sequence itself, or a list of what the
        # iterator ``_it`` yielded so far (``_fill`` reads on).
        self._it: Optional[Iterator[Any]] = None
        self._seq: Sequence[Any]
        if isinstance(items, _Sequence):
            self._seq = items
        elif isinstance(items, _Sized):
            self._seq = list(items)
        else:
            self._seq = []
            self._it = iter(items)

    def _fill(self, n: int) -> None:
        """Read the iterator on until ``n`` items are known (or it ends)."""
        it = self._it
        if it is None:
            return
        seq = self._seq
        assert isinstance(seq, list)
        if len(seq) < n:
            seq.extend(_islice(it, n - len(seq)))
            if len(seq) < n:
                self._it = None  # ended

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


# --------------------------------------------------------------------------
# Helpers for tests of time- and iterator-driven code (ffwd_iter,
# TimeTestingGetter); self-contained, appended to __all__ here.

import itertools as _itertools  # noqa: E402

__all__ += ["ffwd_iter", "TimeTestingGetter"]


def ffwd_iter(it: Iterator[Any], n: int) -> None:
    """Advance the iterator ``it`` by ``n`` items (fewer if it ends first).

    >>> it = iter(range(10))
    >>> ffwd_iter(it, 3)
    >>> next(it)
    3

    ``ValueError`` for a negative ``n``.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"ffwd_iter: n must be an int >= 0; got {n!r}")
    next(_itertools.islice(it, n, n), None)


class TimeTestingGetter:
    """A clock for tests: ``get()`` returns ``now`` until ``advance(td)``
    moves it, so code that takes a ``now_getter`` (an event clock, a
    ``TTLCache``, ``op.enrich_cached``) can be driven without sleeping.

    Pass the bound method: ``TTLCache(lookup, clock.get, ttl)``. Use
    UTC-aware datetimes with millpond's clocks and timers.

    >>> from datetime import datetime, timedelta, timezone
    >>> clock = TimeTestingGetter(datetime(2024, 1, 1, tzinfo=timezone.utc))
    >>> clock.advance(timedelta(seconds=90))
    >>> clock.get()
    datetime.datetime(2024, 1, 1, 0, 1, 30, tzinfo=datetime.timezone.utc)
    """

    __test__ = False  # not a pytest test class

    def __init__(self, now: datetime) -> None:
        if not isinstance(now, datetime):
            raise TypeError(f"TimeTestingGetter needs a datetime; got {type(now).__name__}: {now!r:.80}")
        self._now = now

    def advance(self, td: timedelta) -> None:
        """Move the clock by ``td`` (a negative ``td`` moves it back)."""
        if not isinstance(td, timedelta):
            raise TypeError(f"TimeTestingGetter.advance needs a timedelta; got {type(td).__name__}: {td!r:.80}")
        self._now += td

    def get(self) -> datetime:
        """The current (test) time."""
        return self._now

    def __repr__(self) -> str:
        return f"TimeTestingGetter({self._now!r})"
