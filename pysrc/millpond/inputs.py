"""Source protocols: how a dataflow reads from the outside world.

A source is handed to ``op.input(step_id, flow, source)``. There are two
kinds:

* :class:`FixedPartitionedSource`: a fixed, named set of partitions (files,
  Kafka partitions, ...). Each partition lives on exactly one worker, and its
  position (whatever :meth:`StatefulSourcePartition.snapshot` returns) is
  stored with the flow's recovery data, so a resumed run continues where the
  last committed epoch left off.
* :class:`DynamicSource`: one partition per worker, built from the worker's
  index and the worker count, with no resume state. Use it for inputs that
  cannot replay (a socket, a push API).

:class:`SimplePollingSource` covers the common "call something every N
seconds" case, and :func:`batch`, :func:`batch_async`, :func:`batch_getter`
and :func:`batch_getter_ts` turn iterators, async iterators and getter
functions into the batches that ``next_batch`` returns.

Example: a partition that emits the numbers ``0..n`` and resumes after the
last one emitted::

    class CountPartition(StatefulSourcePartition[int, int]):
        def __init__(self, n: int, resume_state: int | None):
            self._next = 0 if resume_state is None else resume_state
            self._n = n

        def next_batch(self) -> list[int]:
            if self._next >= self._n:
                raise StopIteration()
            self._next += 1
            return [self._next - 1]

        def snapshot(self) -> int:
            return self._next

    class CountSource(FixedPartitionedSource[int, int]):
        def list_parts(self) -> list[str]:
            return ["count"]

        def build_part(self, step_id, for_part, resume_state):
            return CountPartition(10, resume_state)
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from datetime import datetime, timedelta, timezone
from typing import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Generic,
    Iterable,
    Iterator,
    List,
    Optional,
    TypeVar,
)

from millpond.errors import AbortExecution

__all__ = [
    "AbortExecution",
    "Source",
    "StatefulSourcePartition",
    "FixedPartitionedSource",
    "StatelessSourcePartition",
    "DynamicSource",
    "SimplePollingSource",
    "batch",
    "batch_async",
    "batch_getter",
    "batch_getter_ts",
]

X = TypeVar("X")  # item type
S = TypeVar("S")  # resume state type


class Source(ABC):  # noqa: B024  (a marker base with no abstract methods)
    """Base class of every source; subclass one of its two kinds instead.

    Do not subclass ``Source`` directly: the runtime only knows how to drive
    :class:`FixedPartitionedSource` and :class:`DynamicSource`.
    """


class StatefulSourcePartition(ABC, Generic[X, S]):
    """One partition of a :class:`FixedPartitionedSource`.

    The runtime calls :meth:`next_batch` repeatedly, no earlier than
    :meth:`next_awake` says; at each epoch close it calls :meth:`snapshot`
    and stores the value with the flow's recovery data; on resume the source's
    ``build_part`` receives that value back as ``resume_state``.
    """

    @abstractmethod
    def next_batch(self) -> Iterable[X]:
        """Return the next items, possibly none.

        Raise ``StopIteration`` when the partition has ended (EOF). Return an
        empty batch when nothing is available right now; keep this call
        short, since it blocks the worker that runs it.
        """

    def next_awake(self) -> Optional[datetime]:
        """Return when to call :meth:`next_batch` next (UTC-aware), or ``None``.

        ``None`` (the default) means "as soon as possible". This is asked again
        after every :meth:`next_batch`.
        """
        return None

    @abstractmethod
    def snapshot(self) -> S:
        """Return the position after the last item emitted by :meth:`next_batch`.

        It is the ``resume_state`` a resumed partition is built with, so it
        must be picklable and must not change after it is returned.
        """

    def close(self) -> None:
        """Release resources; called once when the execution stops cleanly."""
        return None


class FixedPartitionedSource(Source, Generic[X, S]):
    """A source with a fixed set of named partitions that can resume.

    Each name from :meth:`list_parts` is assigned to exactly one worker, which
    calls :meth:`build_part` for it. Partition names are the keys of their
    resume state, so they must be stable across runs.
    """

    @abstractmethod
    def list_parts(self) -> List[str]:
        """Return the names of all partitions of this source."""

    @abstractmethod
    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[S]
    ) -> StatefulSourcePartition[X, S]:
        """Build the partition named ``for_part``.

        ``resume_state`` is ``None`` on a fresh start, otherwise the value that
        the partition's :meth:`StatefulSourcePartition.snapshot` returned at
        the epoch the run resumes from.
        """


class StatelessSourcePartition(ABC, Generic[X]):
    """One worker's partition of a :class:`DynamicSource`; it cannot resume."""

    @abstractmethod
    def next_batch(self) -> Iterable[X]:
        """Return the next items, possibly none; raise ``StopIteration`` at the end."""

    def next_awake(self) -> Optional[datetime]:
        """Return when to call :meth:`next_batch` next (UTC-aware), or ``None``."""
        return None

    def close(self) -> None:
        """Release resources; called once when the execution stops cleanly."""
        return None


class DynamicSource(Source, Generic[X]):
    """A source with one partition per worker and no resume state."""

    @abstractmethod
    def build(
        self, step_id: str, worker_index: int, worker_count: int
    ) -> StatelessSourcePartition[X]:
        """Build the partition for worker ``worker_index`` of ``worker_count``."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class _SimplePollingPartition(StatefulSourcePartition[X, None]):
    def __init__(
        self,
        now: datetime,
        interval: timedelta,
        align_to: Optional[datetime],
        getter: Callable[[], Optional[X]],
    ) -> None:
        self._interval = interval
        self._align_to = align_to
        self._getter = getter
        if align_to is None:
            self._next_awake = now
        else:
            self._next_awake = self._next_aligned(now)

    def _next_aligned(self, now: datetime) -> datetime:
        # The first mark at or after `now` on the grid align_to + k * interval.
        assert self._align_to is not None
        since = (now - self._align_to) % self._interval
        if since == timedelta(0):
            return now
        return now + (self._interval - since)

    def next_batch(self) -> List[X]:
        now = _utcnow()
        try:
            item = self._getter()
        except SimplePollingSource.Retry as retry:
            self._next_awake = now + retry.timeout
            return []
        # Keep the cadence of the schedule rather than of the calls, but skip
        # ticks missed while the worker was busy instead of firing in a burst.
        scheduled = self._next_awake + self._interval
        if scheduled <= now:
            if self._align_to is not None:
                scheduled = self._next_aligned(now)
            else:
                scheduled = now + self._interval
        self._next_awake = scheduled
        if item is None:
            return []
        return [item]

    def next_awake(self) -> Optional[datetime]:
        return self._next_awake

    def snapshot(self) -> None:
        return None


class SimplePollingSource(FixedPartitionedSource[X, None]):
    """Call :meth:`next_item` every ``interval``; each result is one item.

    It has a single partition (so it runs on one worker) and keeps no
    resume state (its snapshot is ``None``): a resumed run simply starts
    polling again, as with Bytewax. Return ``None`` from
    :meth:`next_item` to emit nothing this time, raise
    ``SimplePollingSource.Retry(timeout)`` to try again sooner (or later)
    than the interval, and raise ``StopIteration`` to end the input.

    With ``align_to``, polls happen on the grid ``align_to + k * interval``
    (for example every full hour), not relative to the start of the run.

    Example::

        class Clock(SimplePollingSource[str]):
            def next_item(self) -> str:
                return datetime.now(timezone.utc).isoformat()

        op.input("clock", flow, Clock(timedelta(seconds=5)))

    Raises ``ValueError`` for a non-positive interval or a naive ``align_to``.
    """

    class Retry(Exception):
        """Raise from :meth:`next_item` to poll again after ``timeout``."""

        def __init__(self, timeout: timedelta) -> None:
            super().__init__(timeout)
            self.timeout = timeout

    def __init__(self, interval: timedelta, align_to: Optional[datetime] = None) -> None:
        if not isinstance(interval, timedelta) or interval <= timedelta(0):
            raise ValueError(
                f"SimplePollingSource: interval must be a positive timedelta, got {interval!r} "
                "(interval=0 would call next_item in a busy loop; return a list from a "
                "custom source's next_batch for items that are ready at once)"
            )
        if align_to is not None and align_to.tzinfo is None:
            raise ValueError("align_to must be timezone-aware; use datetime(..., tzinfo=timezone.utc)")
        self._interval = interval
        self._align_to = align_to

    def list_parts(self) -> List[str]:
        return ["singleton"]

    def build_part(
        self, step_id: str, for_part: str, resume_state: None
    ) -> StatefulSourcePartition[X, None]:
        return _SimplePollingPartition(_utcnow(), self._interval, self._align_to, self.next_item)

    @abstractmethod
    def next_item(self) -> Optional[X]:
        """Return the next item, or ``None`` for no item this time."""


def batch(ib: Iterable[X], batch_size: int) -> Iterator[List[X]]:
    """Group an iterable into lists of at most ``batch_size`` items.

    The last list may be shorter; no list is empty. ``batch([1, 2, 3], 2)``
    yields ``[1, 2]`` then ``[3]``. Raises ``ValueError`` if ``batch_size``
    is less than 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    it = iter(ib)
    while True:
        chunk: List[X] = []
        for item in it:
            chunk.append(item)
            if len(chunk) >= batch_size:
                break
        if not chunk:
            return
        yield chunk
        if len(chunk) < batch_size:
            return


def batch_async(
    aib: AsyncIterable[X],
    timeout: timedelta,
    batch_size: int,
    loop: Optional[asyncio.AbstractEventLoop] = None,
) -> Iterator[List[X]]:
    """Turn an async iterable into a (blocking) iterator of batches.

    Each ``next()`` runs the event loop until ``batch_size`` items have
    arrived or ``timeout`` has passed, and returns what arrived, which may be
    an empty list. An item that is still pending when the timeout hits is not
    lost: it goes into a later batch. The iterator ends after the async
    iterable does. Use it from a partition::

        self._batches = batch_async(websocket_messages(), timedelta(seconds=0.5), 100)

        def next_batch(self):
            return next(self._batches)  # StopIteration at the end ends the input

    ``loop`` defaults to a new event loop owned by this iterator. Raises
    ``ValueError`` if ``batch_size`` is less than 1 or ``timeout`` negative.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if timeout < timedelta(0):
        raise ValueError(f"timeout must not be negative, got {timeout!r}")
    return _batch_async(aib, timeout.total_seconds(), batch_size, loop)


def _batch_async(
    aib: AsyncIterable[X],
    timeout_s: float,
    batch_size: int,
    loop: Optional[asyncio.AbstractEventLoop],
) -> Iterator[List[X]]:
    own_loop = loop is None
    ev_loop = asyncio.new_event_loop() if loop is None else loop
    ait: AsyncIterator[X] = aib.__aiter__()
    # The in-flight __anext__ survives across batches so that a timeout never
    # drops an item the async iterator is about to produce.
    pending: List["asyncio.Future[X]"] = []
    ended = False

    async def gather() -> List[X]:
        nonlocal ended
        out: List[X] = []
        deadline = ev_loop.time() + timeout_s
        while len(out) < batch_size:
            if not pending:
                pending.append(asyncio.ensure_future(ait.__anext__()))
            remaining = deadline - ev_loop.time()
            done, _ = await asyncio.wait({pending[0]}, timeout=max(remaining, 0))
            if not done:
                break
            fut = pending.pop()
            try:
                out.append(fut.result())
            except StopAsyncIteration:
                ended = True
                break
        return out

    try:
        while not ended:
            out = ev_loop.run_until_complete(gather())
            if out or not ended:
                yield out
    finally:
        for fut in pending:
            fut.cancel()
        if own_loop:
            ev_loop.close()


def batch_getter(
    getter: Callable[[], X], batch_size: int, yield_on: Optional[X] = None
) -> Iterator[List[X]]:
    """Batch items from a function that returns one item per call.

    ``getter()`` is called until ``batch_size`` items are gathered or it
    returns ``yield_on`` (default ``None``, meaning "nothing right now"), at
    which point the batch so far is yielded, possibly empty. When ``getter``
    raises ``StopIteration`` the items so far are yielded (if any) and the
    iterator ends. Raises ``ValueError`` if ``batch_size`` is less than 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    while True:
        out: List[X] = []
        try:
            while len(out) < batch_size:
                item = getter()
                if item is yield_on or (yield_on is not None and item == yield_on):
                    break
                out.append(item)
        except StopIteration:
            if out:
                yield out
            return
        yield out


def batch_getter_ts(
    getter: Callable[[], X],
    timeout: timedelta,
    batch_size: int,
    yield_on: Optional[X] = None,
) -> Iterator[List[X]]:
    """Like :func:`batch_getter`, but a batch also closes after ``timeout``.

    A batch is yielded when it holds ``batch_size`` items, when ``getter``
    returns ``yield_on``, or when ``timeout`` has passed since the batch was
    started, whichever comes first. This bounds the latency added by batching
    when the getter keeps producing slowly but steadily. Raises
    ``ValueError`` if ``batch_size`` is less than 1 or ``timeout`` negative.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if timeout < timedelta(0):
        raise ValueError(f"timeout must not be negative, got {timeout!r}")
    timeout_s = timeout.total_seconds()
    while True:
        out: List[X] = []
        deadline = time.monotonic() + timeout_s
        try:
            while len(out) < batch_size:
                item = getter()
                if item is yield_on or (yield_on is not None and item == yield_on):
                    break
                out.append(item)
                if time.monotonic() >= deadline:
                    break
        except StopIteration:
            if out:
                yield out
            return
        yield out
