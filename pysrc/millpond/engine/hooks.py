"""The recovery hooks the engine calls, and the no-recovery stand-in.

With a recovery config the engine gets a
:class:`~millpond.engine.recovery_run.RecoveryRun`; without one it uses
:class:`EphemeralRun`: fresh in-memory stores, epoch 1, nothing persisted
(with a live-key limit, stores that spill to a temporary directory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Protocol, Sequence

from millpond.keygroup import DEFAULT_KEY_GROUP_COUNT
from millpond.livelimit import LiveLimit
from millpond.state import MemoryStateStore, StateStore, WorkerStore

if TYPE_CHECKING:  # pragma: no cover
    from millpond.engine.cluster import ClusterNode
    from millpond.recovery import RecoveryConfig

__all__ = ["Run", "EphemeralRun", "open_run"]


class Run(Protocol):
    """One execution of a flow, as seen by the engine."""

    resume_epoch: int
    execution: int
    key_group_count: int

    def worker_store(self, worker_index: int) -> WorkerStore:
        """The worker's state store, positioned at ``resume_epoch``."""

    def activation_done(self, worker_index: int, epoch: int) -> None:
        """After an activation of stateful work (immediate snapshot mode)."""

    def snapshot_epoch(self, worker_index: int, epoch: int) -> None:
        """After the worker finished ``epoch`` and wrote its outputs: write
        the state the epoch touched. Every worker's snapshot comes before
        any worker's :meth:`close_epoch` of the epoch."""

    def close_epoch(self, worker_index: int, epoch: int, last: bool = False) -> None:
        """Hand the worker's snapshotted ``epoch`` to be committed (a run
        may also snapshot here when :meth:`snapshot_epoch` was not called).

        ``last`` marks the run's final epoch (every input ended)."""

    def committed_epoch(self) -> int:
        """The newest epoch known committed (cheap: polled between
        activations to let two-phase sinks publish committed epochs)."""

    def finish(self, aborted: bool) -> None:
        """At the end of the run: wait for commits, stop background work."""

    def close(self) -> None:
        """Release everything."""


class EphemeralRun:
    """A run without recovery: in-memory stores, nothing persisted.

    ``MemoryStateStore.snapshot`` persists nothing and only forgets which
    keys were touched or discarded; calling it at each epoch close keeps
    those sets from growing for the life of a long-running flow. With a
    ``live_limit``, each worker gets a
    :class:`~millpond.spill.SpillStore` instead: state beyond the limit
    goes to a temporary directory, removed at :meth:`close`.
    """

    resume_epoch = 1
    execution = 0

    def __init__(
        self,
        hosted: Sequence[int],
        key_group_count: int,
        flow_id: str = "flow",
        worker_count: Optional[int] = None,
        live_limit: LiveLimit = LiveLimit(),
    ) -> None:
        self.key_group_count = key_group_count
        self._stores: Dict[int, WorkerStore] = {}
        # Nothing to wait for without recovery: an epoch counts as
        # committed once every hosted worker closed it.
        self._closed: Dict[int, int] = {w: 0 for w in hosted}
        if not live_limit:
            self._stores = {w: MemoryStateStore() for w in hosted}
            return
        # Imported here: spilling needs the Go extension, a flow without
        # a limit not.
        from millpond.spill import SpillStore

        count = worker_count if worker_count is not None else max(hosted, default=0) + 1
        try:
            for w in hosted:
                self._stores[w] = SpillStore.open_spill(
                    flow_id, w, count, live_limit, key_group_count=key_group_count
                )
        except BaseException:
            self.close()
            raise

    def worker_store(self, worker_index: int) -> WorkerStore:
        return self._stores[worker_index]

    def activation_done(self, worker_index: int, epoch: int) -> None:
        pass

    def snapshot_epoch(self, worker_index: int, epoch: int) -> None:
        self._stores[worker_index].snapshot(epoch)

    def close_epoch(self, worker_index: int, epoch: int, last: bool = False) -> None:
        self._closed[worker_index] = epoch

    def committed_epoch(self) -> int:
        return min(self._closed.values(), default=0)

    def finish(self, aborted: bool) -> None:
        pass

    def close(self) -> None:
        for store in self._stores.values():
            store.close()


def open_run(
    recovery_config: Optional["RecoveryConfig"],
    flow_id: str,
    worker_count: int,
    hosted: Optional[Sequence[int]] = None,
    node: Optional["ClusterNode"] = None,
    live_limit: LiveLimit = LiveLimit(),
) -> Run:
    """The run for this execution: recovering if a config is given.

    ``worker_count`` is the flow's workers in all; this process hosts
    ``hosted`` of them (all by default), and ``node`` connects it to the
    other processes of its cluster. ``live_limit`` bounds each
    worker's live state objects."""
    hosted = range(worker_count) if hosted is None else hosted
    if recovery_config is None:
        return EphemeralRun(hosted, DEFAULT_KEY_GROUP_COUNT, flow_id, worker_count, live_limit)
    # Imported here: recovery needs the Go extension, a flow without it not.
    from millpond.engine.recovery_run import open_recovery_run

    run = open_recovery_run(recovery_config, flow_id, worker_count, hosted, node)
    if live_limit:
        for w in hosted:
            store = run.worker_store(w)
            assert isinstance(store, StateStore)
            live_limit.apply(store)
    return run
