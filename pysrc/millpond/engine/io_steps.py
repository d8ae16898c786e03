"""Runtimes of ``input`` and ``output`` steps.

Fixed-partition sources and sinks: each partition lives on the worker that
owns its name as a state key (``millpond.keygroup.worker_for_key``), so a
partition and its snapshotted position always meet, for any worker count.
The partition object is the live object in the state store under
``(step_id, partition name)``; its ``snapshot()`` is taken at epoch close.

Dynamic sources and sinks: one stateless partition per worker, built with
``build(step_id, worker_index, worker_count)``.
"""

from __future__ import annotations

import zlib
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from millpond.engine.steps import NO_KEY, StepRuntime
from millpond.errors import AbortExecution
from millpond.state import WorkerStore

if TYPE_CHECKING:  # pragma: no cover
    from millpond.engine.plan import PlanStep
    from millpond.engine.worker import Worker

__all__ = ["InputRuntime", "OutputRuntime", "is_fixed_partitioned", "Hydrated"]


class Hydrated:
    """A restored partition position, until the real partition is built.

    The store's builder receives only the resume state, not the key, while a
    partition is built from both; so the builder keeps the state here and the
    engine then replaces it with the partition object.
    """

    __slots__ = ("state",)

    def __init__(self, state: Any) -> None:
        self.state = state

    def snapshot(self) -> Any:
        return self.state


def _load_positions(store: WorkerStore, step_id: str) -> None:
    """Make every stored position of ``step_id`` live at once.

    A worker reads all of them anyway (one key per partition it owns), and
    a step with no stored key left unread lets a snapshot that touches
    every live key count as the worker's whole state (see
    ``StateStore.snapshot``), which a per-key read never does."""
    store.hydrate_all(step_id)


def is_fixed_partitioned(obj: Any) -> bool:
    """True for a FixedPartitionedSource/Sink (has ``list_parts``)."""
    return callable(getattr(obj, "list_parts", None)) and callable(
        getattr(obj, "build_part", None)
    )


def _resume_state(store: WorkerStore, step_id: str, key: str) -> Any:
    held = store.get(step_id, key)
    if held is None:
        return None
    if isinstance(held, Hydrated):
        return held.state
    return held.snapshot()


def _owned_parts(rt: StepRuntime, obj: Any) -> List[str]:
    try:
        names = list(obj.list_parts())
    except Exception as ex:
        raise rt.fail(ex, what="list_parts") from ex
    for name in names:
        if not isinstance(name, str):
            err: Exception = TypeError(
                f"list_parts must return str partition names; got {name!r:.80}"
            )
            raise rt.fail(err) from err
    if len(set(names)) != len(names):
        err = ValueError(f"list_parts returned duplicate partition names: {names!r:.200}")
        raise rt.fail(err) from err
    return names


class _SourcePart:
    __slots__ = ("name", "part", "awake", "done", "polled")

    def __init__(self, name: str, part: Any) -> None:
        self.name = name
        self.part = part
        self.awake: Optional[datetime] = None
        self.done = False
        self.polled = False


class InputRuntime(StepRuntime):
    """Polls this worker's source partitions into the current epoch."""

    def __init__(self, worker: "Worker", step: "PlanStep") -> None:
        super().__init__(worker, step)
        source = step.params["source"]
        self.fixed = is_fixed_partitioned(source)
        self.parts: List[_SourcePart] = []
        store = worker.store
        if self.fixed:
            store.register(self.step_id, Hydrated)
            _load_positions(store, self.step_id)
            for name in _owned_parts(self, source):
                if worker.owner_of(name) != worker.index:
                    continue
                try:
                    resume = _resume_state(store, self.step_id, name)
                    part = source.build_part(self.step_id, name, resume)
                except Exception as ex:
                    raise self.fail(ex, key=name, what="build_part") from ex
                store.set(self.step_id, name, part)
                self.parts.append(_SourcePart(name, part))
        else:
            try:
                part = source.build(self.step_id, worker.index, worker.count)
            except Exception as ex:
                raise self.fail(ex, what="build") from ex
            self.parts.append(_SourcePart(str(worker.index), part))
        for sp in self.parts:
            sp.awake = self._ask_awake(sp)

    @property
    def done(self) -> bool:
        return all(sp.done for sp in self.parts)

    def _ask_awake(self, sp: _SourcePart) -> Optional[datetime]:
        try:
            at = sp.part.next_awake()
        except Exception as ex:
            raise self.fail(ex, key=sp.name, what="next_awake") from ex
        if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
            ex2 = TypeError(
                "next_awake must return None or a timezone-aware datetime "
                f"(use datetime.now(timezone.utc)); got {at!r:.80}"
            )
            raise self.fail(ex2, key=sp.name) from ex2
        return at

    def poll(self, now: datetime) -> bool:
        """Take at most one batch from each awake partition; True if any item."""
        emitted = False
        for sp in self.parts:
            if sp.done or (sp.awake is not None and sp.awake > now):
                continue
            sp.polled = True
            try:
                batch = sp.part.next_batch()
                if type(batch) is not list:
                    batch = list(batch)
            except StopIteration:
                sp.done = True
                self.worker.touched()
                continue
            except AbortExecution:
                raise
            except Exception as ex:
                raise self.fail(ex, key=sp.name, what="next_batch") from ex
            sp.awake = self._ask_awake(sp)
            if batch:
                emitted = True
                if self.fixed:
                    self.worker.touched()
                self.worker.emit(self.index, 0, batch)
        return emitted

    def next_wake(self) -> Optional[datetime]:
        times = [sp.awake for sp in self.parts if not sp.done]
        if not times:
            return None
        if any(t is None for t in times):
            return self.worker.clock.now()
        return min(times)  # type: ignore[type-var]

    def before_snapshot(self) -> None:
        if not self.fixed:
            return
        store = self.worker.store
        for sp in self.parts:
            if sp.polled:
                store.set(self.step_id, sp.name, sp.part)
                sp.polled = False

    def close(self) -> None:
        for sp in self.parts:
            try:
                sp.part.close()
            except Exception as ex:
                raise self.fail(ex, key=sp.name, what="close") from ex


def _is_two_phase(part: Any) -> bool:
    """True for a two-phase sink partition (``prepare`` and ``commit``;
    see :class:`millpond.outputs.TwoPhaseSinkPartition`)."""
    return callable(getattr(part, "prepare", None)) and callable(getattr(part, "commit", None))


def _default_part_fn(key: str) -> int:
    return zlib.adler32(key.encode("utf-8"))


class OutputRuntime(StepRuntime):
    """Writes items to this worker's sink partitions."""

    def __init__(self, worker: "Worker", step: "PlanStep") -> None:
        super().__init__(worker, step)
        sink = step.params["sink"]
        self.sink = sink
        self.fixed = is_fixed_partitioned(sink)
        self.parts: Dict[str, Any] = {}
        self.dirty: set[str] = set()
        self.two_phase: Dict[str, Any] = {}
        store = worker.store
        if self.fixed:
            store.register(self.step_id, Hydrated)
            _load_positions(store, self.step_id)
            self.names = _owned_parts(self, sink)
            if not self.names:
                ex = ValueError("list_parts returned no partitions")
                raise self.fail(ex) from ex
            self.owners = [worker.owner_of(n) for n in self.names]
            self.part_fn = getattr(sink, "part_fn", _default_part_fn)
            # A sink that routes whole items itself (see millpond.outputs).
            self.route_item = getattr(sink, "route_item", None)
            for name, owner in zip(self.names, self.owners, strict=True):
                if owner != worker.index:
                    continue
                try:
                    resume = _resume_state(store, self.step_id, name)
                    part = sink.build_part(self.step_id, name, resume)
                except Exception as ex:
                    raise self.fail(ex, key=name, what="build_part") from ex
                store.set(self.step_id, name, part)
                self.parts[name] = part
            self.two_phase = {n: p for n, p in self.parts.items() if _is_two_phase(p)}
        else:
            try:
                part = sink.build(self.step_id, worker.index, worker.count)
            except Exception as ex:
                raise self.fail(ex, what="build") from ex
            self.parts[str(worker.index)] = part

    def deliver(self, port: int, items: List[Any]) -> None:
        if not self.fixed:
            self._write(str(self.worker.index), items)
            return
        # Route each (key, value) to the partition part_fn picks, on the
        # worker that owns that partition.
        owners, n = self.owners, len(self.names)
        me = self.worker.index
        by_worker: Dict[int, List[Any]] = {}
        if self.route_item is not None:
            route = self.route_item
            for item in items:
                try:
                    idx = route(item) % n
                except Exception as rex:
                    raise self.fail(rex, what="route_item") from rex
                by_worker.setdefault(owners[idx], []).append((idx, item))
            items = []
        for item in items:
            if type(item) is not tuple or len(item) != 2 or type(item[0]) is not str:
                ex = TypeError(
                    f"step {self.step_id!r} writes to a partitioned sink and needs a "
                    "keyed stream of (str key, value) 2-tuples (the key picks the "
                    f"partition); got {item!r:.80}; use op.key_on first"
                )
                raise self.fail(ex) from ex
            try:
                idx = self.part_fn(item[0]) % n
            except Exception as ex:
                raise self.fail(ex, key=item[0], what="part_fn") from ex
            by_worker.setdefault(owners[idx], []).append((idx, item[1]))
        for w, routed in by_worker.items():
            if w == me:
                self.on_items(port, routed)
            else:
                self.worker.send(w, self.index, port, routed)

    def on_items(self, port: int, items: List[Any]) -> None:
        # Fixed sinks receive (partition index, value) pairs from deliver.
        by_part: Dict[int, List[Any]] = {}
        for idx, value in items:
            by_part.setdefault(idx, []).append(value)
        for idx, values in by_part.items():
            self._write(self.names[idx], values)

    def _write(self, name: str, values: List[Any]) -> None:
        try:
            self.parts[name].write_batch(values)
        except Exception as ex:
            raise self.fail(ex, key=name if self.fixed else NO_KEY, what="write_batch") from ex
        if self.fixed:
            self.dirty.add(name)
            self.worker.touched()

    def before_snapshot(self) -> None:
        if not self.fixed:
            return
        epoch = self.worker.epoch
        for name, part in self.two_phase.items():
            try:
                if part.prepare(epoch):
                    self.dirty.add(name)
            except Exception as ex:
                raise self.fail(ex, key=name, what="prepare") from ex
        store = self.worker.store
        for name in sorted(self.dirty):
            store.set(self.step_id, name, self.parts[name])
        self.dirty.clear()

    def committed(self, epoch: int) -> None:
        """Epochs up to ``epoch`` are committed: two-phase partitions
        publish them."""
        if not self.fixed:
            return
        for name, part in self.two_phase.items():
            try:
                part.commit(epoch)
            except Exception as ex:
                raise self.fail(ex, key=name, what="commit") from ex

    def close(self) -> None:
        for name, part in self.parts.items():
            try:
                part.close()
            except Exception as ex:
                raise self.fail(ex, key=name, what="close") from ex
