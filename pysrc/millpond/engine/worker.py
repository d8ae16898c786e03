"""One worker: the runtimes of every step of the plan, and how items move
between them.

Items move depth-first: a step's output is handed straight to the steps that
read it (``emit``), except where a step needs items on another worker, where
they go through the :class:`~millpond.engine.exchange.Exchange`. Stateful
steps buffer what they receive and run in ``pump``, in topological order.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional

from millpond.engine.clock import Clock
from millpond.engine.exchange import Exchange, Message
from millpond.engine.hooks import Run
from millpond.engine.io_steps import InputRuntime, OutputRuntime
from millpond.engine.plan import Plan
from millpond.engine.stateful_step import StatefulBatchRuntime
from millpond.engine.stats import LatencyHistogram, SourceLags, dir_bytes
from millpond.engine.steps import (
    BranchRuntime,
    FlatMapBatchRuntime,
    InspectDebugRuntime,
    MergeRuntime,
    RedistributeRuntime,
    StepRuntime,
)
from millpond.errors import DataflowError, SnapshotError
from millpond.keygroup import worker_for_key
from millpond.livelimit import format_size

__all__ = ["Worker"]

logger = logging.getLogger("millpond")

_RUNTIMES: Dict[str, Callable[..., StepRuntime]] = {
    "input": InputRuntime,
    "output": OutputRuntime,
    "flat_map_batch": FlatMapBatchRuntime,
    "branch": BranchRuntime,
    "merge": MergeRuntime,
    "redistribute": RedistributeRuntime,
    "inspect_debug": InspectDebugRuntime,
    "stateful_batch": StatefulBatchRuntime,
}


class Worker:
    """Executes the plan for worker ``index`` of ``count``."""

    def __init__(
        self,
        index: int,
        count: int,
        plan: Plan,
        run: Run,
        exchange: Exchange,
        key_group_count: int,
        clock: Clock,
        epoch: int,
    ) -> None:
        self.index = index
        self.count = count
        self.plan = plan
        self.run = run
        self.exchange = exchange
        self.key_group_count = key_group_count
        self.clock = clock
        self.epoch = epoch
        self.store = run.worker_store(index)
        self._evicts = self.store.max_live_keys is not None
        self._touched = False
        from millpond import _core
        self._route_keyed = _core.route_keyed
        self.runtimes: List[StepRuntime] = []
        for step in plan.steps:
            self.runtimes.append(_RUNTIMES[step.kind](self, step))
        # For each step and output port, the deliver functions of its readers.
        self._targets: List[List[List[Callable[[int, List[Any]], None]]]] = []
        self._ports: List[List[List[int]]] = []
        for step in plan.steps:
            self._targets.append([[self.runtimes[c].deliver for c, _ in d] for d in step.downs])
            self._ports.append([[p for _, p in d] for d in step.downs])
        self.inputs = [rt for rt in self.runtimes if isinstance(rt, InputRuntime)]
        self.stateful = [rt for rt in self.runtimes if isinstance(rt, StatefulBatchRuntime)]
        # What the metrics endpoint reads (millpond.metrics), counted per
        # batch: items each step emitted on each output port (what a
        # step's readers received follows from the plan's wiring).
        self.items_out: List[List[int]] = [[0] * len(step.downs) for step in plan.steps]
        #: Seconds each epoch took to close on this worker: its snapshot
        #: and the hand-off to recovery (with any wait on back-pressure).
        self.epoch_close = LatencyHistogram()
        #: The newest epoch this worker closed (0: none yet).
        self.closed_epoch = 0
        #: Source partitions' lag, sampled only while metrics are served.
        self.source_lags = SourceLags()
        self._snapshot_seconds = 0.0
        self.outputs = [rt for rt in self.runtimes if isinstance(rt, OutputRuntime) and rt.two_phase]

    # -- routing --------------------------------------------------------

    def owner_of(self, key: str) -> int:
        """The worker that owns ``key`` (its state and its items)."""
        return worker_for_key(key, self.count, self.key_group_count)

    def split_by_owner(self, items: List[Any]) -> Optional[List[List[Any]]]:
        """Keyed ``items`` (a list) split by the worker that owns each key:
        entry ``w`` holds worker ``w``'s items, in their order. ``None`` when
        an item is not a ``(str, value)`` 2-tuple (the caller names it)."""
        return self._route_keyed(items, self.key_group_count, self.count)

    def emit(self, step: int, port: int, items: List[Any]) -> None:
        """Hand ``items`` produced on ``port`` of ``step`` to its readers."""
        self.items_out[step][port] += len(items)
        targets = self._targets[step][port]
        ports = self._ports[step][port]
        last = len(targets) - 1
        for i, deliver in enumerate(targets):
            # Each reader gets its own list: user mappers may mutate theirs.
            deliver(ports[i], items if i == last else list(items))

    def send(self, to_worker: int, step: int, port: int, items: List[Any]) -> None:
        """Queue ``items`` for ``step``'s input ``port`` on another worker."""
        self.exchange.send(to_worker, Message(step, port, self.epoch, items))

    def touched(self) -> None:
        """Note that stateful work happened in the current activation."""
        self._touched = True

    def _activation_done(self) -> None:
        if self._touched:
            self._touched = False
            self.run.activation_done(self.index, self.epoch)
            if self._evicts:
                self.store.evict(self.epoch)

    def evict(self) -> None:
        """Bring the live state back under the worker's live-key limit (a
        step that makes many keys live in one go calls this between
        chunks)."""
        if self._evicts:
            self.store.evict(self.epoch)

    def log_live_stats(self) -> None:
        """Log what the live-key limit did in this run, if there is one."""
        limit = self.store.max_live_keys
        stats = getattr(self.store, "live_stats", None)
        if limit is None or stats is None:
            return
        calls = stats.hydrate_calls
        path = getattr(self.store, "path", None)
        budget = getattr(self.store, "max_live_bytes", None)
        if budget is not None:
            per_key = getattr(self.store, "live_key_bytes", None)
            estimate = getattr(self.store, "live_bytes_estimate", None)
            logger.info(
                "worker %d: byte budget %s: %s a key at the latest estimate, %s for the %d live keys",
                self.index, format_size(budget), "?" if per_key is None else format_size(per_key),
                "?" if estimate is None else format_size(estimate), self.store.evictable_count(),
            )
        logger.info(
            "worker %d: %d live keys (limit %d); evicted %d keys in %d batches (%d written first, "
            "%d back before the next batch); hydrated %d keys in %d multi-gets (%.1f per call), %d single reads; "
            "local store %d bytes",
            self.index, self.store.evictable_count(), limit, stats.evicted, stats.evictions, stats.spilled,
            stats.victims_back, stats.hydrated, calls, stats.hydrated / calls if calls else 0.0, stats.single_gets,
            dir_bytes(path.parent) if path is not None else 0,
        )

    # -- scheduling -----------------------------------------------------

    def poll_inputs(self, now: datetime) -> bool:
        """One batch from every awake source partition; True if any item."""
        emitted = False
        for rt in self.inputs:
            if rt.poll(now):
                emitted = True
        self._activation_done()
        if self.source_lags.due():
            self.source_lags.sample(
                [(rt.step_id, sp.name, sp.part) for rt in self.inputs for sp in rt.parts if not sp.done]
            )
        return emitted

    def fire_timers(self, now: datetime) -> None:
        """Run the stateful steps that have a timer due at ``now``: the
        epoch loop calls this before polling new input, so due timers fire
        before anything polled after them."""
        for rt in self.stateful:
            if rt.heap and rt.heap[0][0] <= now:
                rt.activate(now, True)
        self._activation_done()

    def pump(self, now: datetime, fire_timers: bool) -> bool:
        """Take delivered messages and run stateful steps; True if any work."""
        did = False
        for msg in self.exchange.receive(self.index):
            self.runtimes[msg.step].on_items(msg.port, msg.items)
            did = True
        for rt in self.stateful:
            if rt.activate(now, fire_timers):
                did = True
        self._activation_done()
        return did

    def inputs_done(self) -> FrozenSet[int]:
        """Indexes of input steps whose partitions on this worker all ended."""
        return frozenset(rt.index for rt in self.inputs if rt.done)

    def next_wake(self) -> Optional[datetime]:
        """The earliest time a source partition or a timer wants to run."""
        times = [t for t in (rt.next_wake() for rt in self.inputs) if t is not None]
        times += [t for t in (rt.next_wake() for rt in self.stateful) if t is not None]
        return min(times) if times else None

    def upstream_eof(self, step: int, now: datetime) -> None:
        """All inputs of ``step`` have ended everywhere."""
        self.runtimes[step].on_upstream_eof(now)
        self._activation_done()

    def snapshot_epoch(self, epoch: int) -> None:
        """Record partition positions and write the state ``epoch`` touched.

        The driver snapshots every worker before it closes any (see
        :meth:`close_epoch`): the recovery layer can then tell, as each
        worker closes, whether the epoch is every worker's whole state."""
        started = time.perf_counter()
        for rt in self.runtimes:
            rt.before_snapshot()
        with self._user_snapshot(epoch):
            self.run.snapshot_epoch(self.index, epoch)
        self._snapshot_seconds = time.perf_counter() - started

    def close_epoch(self, epoch: int, last: bool = False) -> None:
        """Hand the snapshotted epoch to recovery (``last``: every input
        ended, the run finishes after it)."""
        started = time.perf_counter()
        with self._user_snapshot(epoch):
            self.run.close_epoch(self.index, epoch, last)
        self.epoch_close.observe(self._snapshot_seconds + time.perf_counter() - started)
        self._snapshot_seconds = 0.0
        self.closed_epoch = epoch

    @contextmanager
    def _user_snapshot(self, epoch: int) -> Iterator[None]:
        try:
            yield
        except SnapshotError as ex:
            # A state object's snapshot() failed or was not picklable: that
            # is user code, so it surfaces like any other user error.
            err = DataflowError(f"error on worker {self.index} at the close of epoch {epoch}: {ex}")
            raise err from ex

    def epochs_committed(self, epoch: int) -> None:
        """Epochs up to ``epoch`` are committed: two-phase sinks publish them."""
        for rt in self.outputs:
            rt.committed(epoch)

    def close(self) -> None:
        """Close every source and sink partition (first error wins)."""
        first: Optional[BaseException] = None
        for rt in self.runtimes:
            try:
                rt.close()
            except Exception as ex:  # keep closing the others
                first = first or ex
        if first is not None:
            raise first


