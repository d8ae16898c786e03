"""Sink protocols: how a dataflow writes to the outside world.

A sink is handed to ``op.output(step_id, up, sink)``. There are two kinds:

* :class:`FixedPartitionedSink`: a fixed, named set of partitions (files,
  table shards, ...). The upstream must be a keyed stream of
  ``(key: str, value)`` 2-tuples; each item goes to the partition
  ``list_parts()[part_fn(key) % len(list_parts())]``, which lives on exactly
  one worker and receives only the values. A partition's
  :meth:`StatefulSinkPartition.snapshot` is stored with the flow's recovery
  data, so a resumed partition can undo or skip what the failed run wrote
  after the last committed epoch (``FileSink`` truncates to it).
* :class:`DynamicSink`: one partition per worker, no routing and no resume
  state; it receives whole items. Good for stdout, a log, a message bus.

Output is at-least-once around a resume point unless the sink uses its
snapshot to make writes idempotent, or publishes an epoch's writes only
once the epoch is committed: a :class:`TwoPhaseSinkPartition` (the Kafka
sink's exactly-once mode) is told when each epoch is committed.

A fixed-partitioned sink that defines ``route_item(item) -> int`` takes
whole items instead of ``(key, value)`` pairs: the partition index is
``route_item(item) % len(list_parts())`` and the partition receives the
items themselves (the Kafka sink routes messages by their key this way).

Example: a sink that appends values to per-partition lists::

    class ListPartition(StatefulSinkPartition[str, int]):
        def __init__(self, out: list, resume_state: int | None):
            self._out = out
            del out[resume_state or 0:]  # forget writes after the snapshot

        def write_batch(self, values: list[str]) -> None:
            self._out.extend(values)

        def snapshot(self) -> int:
            return len(self._out)
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from typing import Generic, List, Optional, TypeVar

__all__ = [
    "Sink",
    "StatefulSinkPartition",
    "FixedPartitionedSink",
    "TwoPhaseSinkPartition",
    "StatelessSinkPartition",
    "DynamicSink",
]

V = TypeVar("V")  # value type
S = TypeVar("S")  # resume state type
X = TypeVar("X")  # item type


class Sink(ABC):  # noqa: B024  (a marker base with no abstract methods)
    """Base class of every sink; subclass one of its two kinds instead.

    The runtime only knows how to drive :class:`FixedPartitionedSink` and
    :class:`DynamicSink`.
    """


class StatefulSinkPartition(ABC, Generic[V, S]):
    """One partition of a :class:`FixedPartitionedSink`.

    The runtime calls :meth:`write_batch` with the values routed to this
    partition, :meth:`snapshot` at each epoch close (after that epoch's
    values were written), and :meth:`close` when the execution stops cleanly.
    """

    @abstractmethod
    def write_batch(self, values: List[V]) -> None:
        """Write ``values`` (never keys) in order."""

    @abstractmethod
    def snapshot(self) -> S:
        """Return the state to resume from, describing everything written so far.

        It must be picklable and must not change after it is returned. A sink
        that claims durability here should make the writes durable first
        (``FileSink`` fsyncs).
        """

    def close(self) -> None:
        """Flush and release resources; called once on a clean stop."""
        return None


class TwoPhaseSinkPartition(StatefulSinkPartition[V, S]):
    """A sink partition whose output of an epoch becomes visible only once
    millpond has committed that epoch (exactly-once output).

    At each epoch close the runtime calls :meth:`prepare` (make the epoch's
    writes durable but not yet visible, and keep in :meth:`snapshot` what is
    needed to publish them after a crash), then snapshots the partition
    with the epoch. Once the epoch's commit record exists (with recovery
    off: once every worker closed it), the runtime calls :meth:`commit`
    between activations and at the end of the run. A resumed partition gets
    the snapshot of the committed epoch, and must publish what it holds
    of committed epochs that were not published yet (exactly once), and drop
    anything of later epochs.
    """

    @abstractmethod
    def prepare(self, epoch: int) -> bool:
        """Close ``epoch``'s writes (everything written since the last call).

        Return True if :meth:`snapshot` would now return something other
        than what it returned at the last epoch close; the runtime only
        stores the snapshot of a partition that changed."""

    @abstractmethod
    def commit(self, epoch: int) -> None:
        """Every epoch up to and including ``epoch`` is committed: publish
        their writes. Called with increasing epochs, possibly skipping some."""


class FixedPartitionedSink(Sink, Generic[V, S]):
    """A sink with a fixed set of named partitions that can resume.

    Partition names are the keys of their resume state, so they must be
    stable across runs; routing uses :meth:`part_fn`, which must be stable
    across processes too (Python's ``hash`` of a string is not).
    """

    @abstractmethod
    def list_parts(self) -> List[str]:
        """Return the names of all partitions of this sink."""

    def part_fn(self, item_key: str) -> int:
        """Return the partition index for ``item_key`` (taken modulo the count).

        The default is ``zlib.crc32`` of the key's UTF-8 bytes: stable across
        processes, runs and machines.
        """
        return zlib.crc32(item_key.encode("utf-8"))

    @abstractmethod
    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[S]
    ) -> StatefulSinkPartition[V, S]:
        """Build the partition named ``for_part``.

        ``resume_state`` is ``None`` on a fresh start, otherwise the value the
        partition's :meth:`StatefulSinkPartition.snapshot` returned at the
        epoch the run resumes from.
        """


class StatelessSinkPartition(ABC, Generic[X]):
    """One worker's partition of a :class:`DynamicSink`."""

    @abstractmethod
    def write_batch(self, items: List[X]) -> None:
        """Write ``items`` in order."""

    def close(self) -> None:
        """Flush and release resources; called once on a clean stop."""
        return None


class DynamicSink(Sink, Generic[X]):
    """A sink with one partition per worker and no resume state."""

    @abstractmethod
    def build(
        self, step_id: str, worker_index: int, worker_count: int
    ) -> StatelessSinkPartition[X]:
        """Build the partition for worker ``worker_index`` of ``worker_count``."""
