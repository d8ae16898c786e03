"""Runtimes of the stateless core steps, and the base every step runtime shares.

A step runtime lives on one worker. Items reach it through :meth:`deliver`
(which routes to another worker first when the step needs all items of a key,
or a spread, on one worker) and :meth:`on_items`; it passes its output on
with ``worker.emit``. Calls into user code are wrapped so that any exception
becomes a :class:`~millpond.errors.DataflowError` naming the step, the worker
and, for keyed steps, the key, with the original as ``__cause__``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, List, Optional

from millpond.errors import DataflowError

if TYPE_CHECKING:  # pragma: no cover
    from millpond.engine.plan import PlanStep
    from millpond.engine.worker import Worker

__all__ = [
    "StepRuntime",
    "FlatMapBatchRuntime",
    "BranchRuntime",
    "MergeRuntime",
    "RedistributeRuntime",
    "InspectDebugRuntime",
    "NO_KEY",
]

#: Marker for "this error is not about a particular key".
NO_KEY: Any = object()


class StepRuntime:
    """Base of the per-worker runtime of one core step."""

    def __init__(self, worker: "Worker", step: "PlanStep") -> None:
        self.worker = worker
        self.step = step
        self.step_id = step.step_id
        self.index = step.index

    def fail(self, ex: BaseException, key: Any = NO_KEY, what: str = "") -> DataflowError:
        """A DataflowError for ``ex`` raised by user code in this step."""
        where = f"step {self.step_id!r} on worker {self.worker.index}"
        if key is not NO_KEY:
            where += f" for key {key!r}"
        if what:
            where += f" in {what}"
        err = DataflowError(f"error in {where}: {type(ex).__name__}: {ex}")
        err.__cause__ = ex
        return err

    def deliver(self, port: int, items: List[Any]) -> None:
        """Items from upstream; routes them to their worker if needed."""
        self.on_items(port, items)

    def on_items(self, port: int, items: List[Any]) -> None:
        """Items that belong on this worker."""
        raise NotImplementedError

    def activate(self, now: datetime, fire_timers: bool) -> bool:
        """Process buffered work; True if anything was done."""
        return False

    def on_upstream_eof(self, now: datetime) -> None:
        """Every input this step reads from has ended."""

    def before_snapshot(self) -> None:
        """The epoch is closing: record positions in the store."""

    def next_wake(self) -> Optional[datetime]:
        """When this step next needs to run without new input."""
        return None

    def close(self) -> None:
        """The execution is over; release resources."""


class FlatMapBatchRuntime(StepRuntime):
    """``flat_map_batch``: ``mapper(list) -> iterable`` per batch."""

    def __init__(self, worker: "Worker", step: "PlanStep") -> None:
        super().__init__(worker, step)
        self.mapper = step.params["mapper"]

    def on_items(self, port: int, items: List[Any]) -> None:
        try:
            out = self.mapper(items)
            if type(out) is not list:
                out = list(out)
        except Exception as ex:
            raise self.fail(ex, what="mapper") from ex
        if out:
            self.worker.emit(self.index, 0, out)


class BranchRuntime(StepRuntime):
    """``branch``: split by a bool predicate into trues (port 0) / falses (1)."""

    def __init__(self, worker: "Worker", step: "PlanStep") -> None:
        super().__init__(worker, step)
        self.predicate = step.params["predicate"]

    def on_items(self, port: int, items: List[Any]) -> None:
        trues: List[Any] = []
        falses: List[Any] = []
        pred = self.predicate
        for item in items:
            try:
                res = pred(item)
            except Exception as ex:
                raise self.fail(ex, what="predicate") from ex
            if res is True:
                trues.append(item)
            elif res is False:
                falses.append(item)
            else:
                err = TypeError(
                    f"return value of `predicate` in step {self.step_id!r} must be a "
                    f"bool; got {type(res).__name__}: {res!r:.80}"
                )
                raise self.fail(err) from err
        if trues:
            self.worker.emit(self.index, 0, trues)
        if falses:
            self.worker.emit(self.index, 1, falses)


class MergeRuntime(StepRuntime):
    """``merge``: every input port feeds the one output."""

    def on_items(self, port: int, items: List[Any]) -> None:
        self.worker.emit(self.index, 0, items)


class RedistributeRuntime(StepRuntime):
    """``redistribute``: spread items round-robin over all workers."""

    def __init__(self, worker: "Worker", step: "PlanStep") -> None:
        super().__init__(worker, step)
        self._next = worker.index  # workers start at different offsets

    def deliver(self, port: int, items: List[Any]) -> None:
        n = self.worker.count
        if n == 1:
            self.on_items(port, items)
            return
        start = self._next
        self._next = (start + len(items)) % n
        for offset in range(min(n, len(items))):
            target = (start + offset) % n
            part = items[offset::n]
            if target == self.worker.index:
                self.on_items(port, part)
            else:
                self.worker.send(target, self.index, port, part)

    def on_items(self, port: int, items: List[Any]) -> None:
        self.worker.emit(self.index, 0, items)


class InspectDebugRuntime(StepRuntime):
    """``inspect_debug``: ``inspector(step_id, item, epoch, worker_index)``."""

    def __init__(self, worker: "Worker", step: "PlanStep") -> None:
        super().__init__(worker, step)
        self.inspector = step.params["inspector"]
        self.report_id = step.params.get("report_id", step.step_id)

    def on_items(self, port: int, items: List[Any]) -> None:
        insp = self.inspector
        epoch = self.worker.epoch
        w = self.worker.index
        sid = self.report_id
        try:
            for item in items:
                insp(sid, item, epoch, w)
        except Exception as ex:
            raise self.fail(ex, what="inspector") from ex
        self.worker.emit(self.index, 0, items)
