"""Runtime of ``stateful_batch``: one logic object per key, in the state store.

Items are routed to the worker that owns their key
(``millpond.keygroup.worker_for_key``) and buffered per key; an activation
then calls, per key, ``on_notify`` if the key's time had already come (a
due timer fires before the values that arrive after it), ``on_batch`` with
the queued values, and asks ``notify_at`` again. The worker also fires due
timers before it polls new input (``Worker.fire_timers``). When every input the
step reads from has ended, ``on_eof`` runs for every key of the worker in
sorted key order. A ``DISCARD`` result drops the key from the store (its next
snapshot is a deletion) and cancels its timer.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, NoReturn, Optional, Tuple

from millpond.engine.steps import StepRuntime
from millpond.errors import keyed_item_error
from millpond.logic import keeps_default_eof, logic_class, sets_timers

if TYPE_CHECKING:  # pragma: no cover
    from millpond.engine.plan import PlanStep
    from millpond.engine.worker import Worker

__all__ = ["StatefulBatchRuntime"]

logger = logging.getLogger("millpond")

# With a live-key limit, a step that visits every key (end of input, timers
# re-armed on resume) brings this many at most back from the store at once.
_VISIT_CHUNK = 4096


class _AlwaysFalse(Dict[type, bool]):
    """Timer lookup for steps whose logic never sets timers."""

    def get(self, key: Any, default: Any = None) -> bool:
        return False


class StatefulBatchRuntime(StepRuntime):
    """Per-worker runtime of one ``stateful_batch`` step."""

    def __init__(self, worker: "Worker", step: "PlanStep") -> None:
        super().__init__(worker, step)
        self.store = worker.store
        self.store.register(self.step_id, step.params["builder"], evictable=True)
        self.pending: Dict[str, List[Any]] = {}
        from millpond import _core
        self._group_keyed = _core.group_keyed
        self.timers: Dict[str, datetime] = {}
        self.heap: List[Tuple[datetime, str]] = []
        self.ended = False
        # Outputs of the activation in progress.
        self._out: List[Tuple[str, Any]] = []
        # Logic classes that may set timers (others skip notify_at).
        self._timer_classes: Dict[type, bool] = {}
        # False for logic known to keep the default on_eof (stateful_map).
        self._has_eof = step.params.get("eof", True)
        if step.params.get("timers", True):
            self._rearm_restored()
        else:
            self._timer_classes = _AlwaysFalse()

    # -- routing --------------------------------------------------------

    def deliver(self, port: int, items: List[Any]) -> None:
        w = self.worker
        if w.count == 1:
            self.on_items(port, items)
            return
        if type(items) is not list:
            items = list(items)
        by_worker = w.split_by_owner(items)
        if by_worker is None:
            self._refuse_unkeyed(items)
        me = w.index
        for target, routed in enumerate(by_worker):
            if not routed:
                continue
            if target == me:
                self.on_items(port, routed)
            else:
                w.send(target, self.index, port, routed)

    def on_items(self, port: int, items: List[Any]) -> None:
        if type(items) is not list:
            items = list(items)
        if not self._group_keyed(items, self.pending):
            self._refuse_unkeyed(items)

    def _refuse_unkeyed(self, items: List[Any]) -> NoReturn:
        """Fail the step naming the first item of ``items`` that is not a
        ``(str, value)`` 2-tuple (the core refused the batch for it)."""
        for item in items:
            if type(item) is not tuple or len(item) != 2 or type(item[0]) is not str:
                ex = keyed_item_error(self.step_id, item)
                raise self.fail(ex) from ex
        raise AssertionError("the core refused a batch whose items are all keyed")

    # -- activation -----------------------------------------------------

    def activate(self, now: datetime, fire_timers: bool) -> bool:
        did = False
        if self.pending:
            pending, self.pending = self.pending, {}
            # The batch's stored keys come from the store in one call.
            self._prefetch(pending)
            # Outputs of all keys of the activation go downstream as one batch.
            self._out = []
            ahead = self.store.ahead_packer(self.step_id)
            for key, values in pending.items():
                logic = self._run_key(key, values, now)
                if ahead is not None and logic is not None:
                    ahead(key, logic)
            out, self._out = self._out, []
            if out:
                self.worker.emit(self.index, 0, out)
            self.worker.touched()
            did = True
        if fire_timers and self.heap and self.heap[0][0] <= now:
            # Pop everything due first, so a timer re-armed at or before
            # `now` waits for the next activation instead of looping.
            due = []
            heap, timers = self.heap, self.timers
            while heap and heap[0][0] <= now:
                at, key = heapq.heappop(heap)
                if timers.get(key) == at:
                    due.append(key)
            # Timers of evicted keys fire on time: their state comes back
            # in one call.
            self._prefetch(due)
            self._out = []
            ahead = self.store.ahead_packer(self.step_id)
            for key in due:
                if key in timers:
                    logic = self._notify_key(key)
                    if ahead is not None and logic is not None:
                        ahead(key, logic)
            out, self._out = self._out, []
            if out:
                self.worker.emit(self.index, 0, out)
            did = did or bool(due)
        return did

    def _emit(self, key: str, out: Any, what: str) -> None:
        try:
            self._out.extend([(key, o) for o in out])
        except Exception as ex:
            raise self.fail(ex, key=key, what=what) from ex

    def _run_key(self, key: str, values: List[Any], now: datetime) -> Any:
        """Apply ``values`` to ``key``'s logic; return the logic, or None
        if it discarded the key."""
        try:
            logic = self.store.get_or_build(self.step_id, key)
        except Exception as ex:
            raise self.fail(ex, key=key, what="builder") from ex
        if self.timers:
            at = self.timers.get(key)
            # A timer that is already due fires before the new values are
            # applied; a key it discards starts afresh for them.
            if at is not None and at <= now and self._fire(key, logic):
                try:
                    logic = self.store.get_or_build(self.step_id, key)
                except Exception as ex:
                    raise self.fail(ex, key=key, what="builder") from ex
        try:
            out, discard = logic.on_batch(values)
            self._out.extend([(key, o) for o in out])
        except Exception as ex:
            raise self.fail(ex, key=key, what="on_batch") from ex
        if discard:
            self._discard(key)
            return None
        cls = logic_class(logic)
        has_timers = self._timer_classes.get(cls)
        if has_timers is None:
            has_timers = self._timer_classes[cls] = sets_timers(cls)
        if has_timers:
            self._rearm(key, logic)
        return logic

    def _notify_key(self, key: str) -> Any:
        """Fire ``key``'s timer; return its logic, or None if it has no
        state (any more)."""
        try:
            logic = self.store.get(self.step_id, key)
        except Exception as ex:
            raise self.fail(ex, key=key, what="builder") from ex
        if logic is None:
            self.timers.pop(key, None)
            return None
        self.worker.touched()
        if self._fire(key, logic):
            return None
        self._rearm(key, logic)
        return logic

    def _fire(self, key: str, logic: Any) -> bool:
        """Run ``on_notify`` for ``key`` and emit its output; True if it
        discarded the key."""
        try:
            out, discard = logic.on_notify()
        except Exception as ex:
            raise self.fail(ex, key=key, what="on_notify") from ex
        self._emit(key, out, "on_notify")
        if discard:
            self._discard(key)
        return bool(discard)

    def _discard(self, key: str) -> None:
        self.store.discard(self.step_id, key)
        self.timers.pop(key, None)
        self.worker.touched()

    def _rearm(self, key: str, logic: Any) -> None:
        try:
            at = logic.notify_at()
        except Exception as ex:
            raise self.fail(ex, key=key, what="notify_at") from ex
        if at is None:
            self.timers.pop(key, None)
            return
        if not isinstance(at, datetime) or at.tzinfo is None:
            ex2 = TypeError(
                "notify_at must return None or a timezone-aware datetime "
                f"(e.g. datetime.now(timezone.utc)); got {at!r:.80}"
            )
            raise self.fail(ex2, key=key, what="notify_at") from ex2
        if self.timers.get(key) != at:
            self.timers[key] = at
            heapq.heappush(self.heap, (at, key))
            if len(self.heap) > 64 + 2 * len(self.timers):
                # Drop superseded entries so the heap tracks the live timers.
                self.heap = [(t, k) for k, t in self.timers.items()]
                heapq.heapify(self.heap)

    def _rearm_restored(self) -> None:
        # On resume, ask notify_at of every restored key so timers re-arm.
        # Reading does not change a key's state: peek, so nothing is
        # snapshotted again for it.
        first = True
        for chunk in self._chunks(self.store.iter_keys(self.step_id)):
            for key in chunk:
                try:
                    logic = self.store.peek(self.step_id, key)
                except Exception as ex:
                    raise self.fail(ex, key=key, what="builder") from ex
                if logic is None:
                    continue
                if first:
                    first = False
                    if not sets_timers(logic_class(logic)):
                        return
                    if self.store.max_live_keys is None:
                        self._hydrate_all()
                self._rearm(key, logic)
            self.worker.evict()

    def _chunks(self, keys: Iterable[str]) -> Iterator[List[str]]:
        """``keys`` in slices whose stored state comes live in one call each:
        all at once without a live-key limit (the caller then hydrates in
        one streaming pass), otherwise at most the limit at a time, so a
        caller that visits every key keeps the live set bounded (and,
        with keys streamed from the store, the key list too)."""
        limit = self.store.max_live_keys
        if limit is None:
            yield list(keys)
            return
        size = max(1, min(limit, _VISIT_CHUNK))
        it = iter(keys)
        while True:
            chunk = list(itertools.islice(it, size))
            if not chunk:
                return
            self._prefetch(chunk)
            yield chunk

    def _prefetch(self, keys: Iterable[str]) -> None:
        """Bring the stored state of ``keys`` live in one call. A builder
        that fails here fails again, naming its key, when the caller gets
        to that key (keys built before it stay live)."""
        try:
            self.store.prefetch(self.step_id, keys)
        except Exception:  # noqa: BLE001 - reported per key by the caller
            logger.debug("step %r: batched restore failed; building keys one by one", self.step_id, exc_info=True)

    def _hydrate_all(self) -> None:
        """Build every stored key's logic in one streaming pass, for a
        caller about to visit them all: one lookup per key took a minute for
        a million keys, the pass about a second. A builder that fails here
        fails again, naming its key, when the caller gets to that key."""
        try:
            self.store.hydrate_all(self.step_id)
        except Exception:  # noqa: BLE001 - reported per key by the caller
            logger.debug("step %r: bulk restore failed; building keys one by one", self.step_id, exc_info=True)

    def next_wake(self) -> Optional[datetime]:
        return self.heap[0][0] if self.heap else None

    # -- end of input -----------------------------------------------------

    def on_upstream_eof(self, now: datetime) -> None:
        self.activate(now, fire_timers=False)
        store = self.store
        self._out = []
        keys: Iterable[str] = ()
        if self._has_eof:
            # A resumed run holds only the keys it touched; on_eof may
            # run for any of them.
            if store.max_live_keys is None:
                keys = store.keys(self.step_id)
                self._hydrate_all()
            else:
                keys = store.iter_keys(self.step_id)
        # Asked per class, not per key: this runs for every key at the end.
        default_eof: Dict[type, bool] = {}
        for chunk in self._chunks(keys):
            for key in chunk:
                try:
                    logic = store.peek(self.step_id, key)
                except Exception as ex:
                    raise self.fail(ex, key=key, what="builder") from ex
                if logic is None:
                    continue
                cls = logic_class(logic)
                keeps = default_eof.get(cls)
                if keeps is None:
                    keeps = default_eof[cls] = keeps_default_eof(cls)
                if keeps:
                    continue
                store.get(self.step_id, key)  # on_eof may change it: snapshot it
                try:
                    out, discard = logic.on_eof()
                except Exception as ex:
                    raise self.fail(ex, key=key, what="on_eof") from ex
                self._emit(key, out, "on_eof")
                if discard:
                    store.discard(self.step_id, key)
            self.worker.evict()
        out, self._out = self._out, []
        self.timers.clear()
        self.heap.clear()
        self.ended = True
        self.worker.touched()
        if out:
            self.worker.emit(self.index, 0, out)
