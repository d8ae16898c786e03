"""The windowing operators, built on ``stateful_batch``.

One :class:`_WindowStep` per key holds the clock's state, the open windows
(one :class:`WindowLogic` each, with their :class:`WindowMetadata`), the
values buffered until the watermark passes them (``ordered=True``), and
derives its wake-up time (``notify_at``) from the earliest close time, so an
idle flow sleeps until a window is due. Its snapshot is a tuple of plain
values: windows are recovery state like any other.
"""

from __future__ import annotations

import functools
import heapq
from datetime import datetime
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

from millpond.dataflow import Stream, operator
from millpond.logic import StatefulBatchLogic
from millpond.operators import (  # _UNSET: also the name pickled snapshots of reduce_window refer to
    _UNSET,
    JoinEmitMode,
    _check_join_modes,
    _identity,
    _JoinSides,
    _tag_side,
    JoinInsertMode,
    flat_map_batch,
    key_on,
    map_value,
    merge,
    stateful_batch,
)
from millpond import _core
from millpond.operators.windowing.clock import (
    UTC_MAX,
    Clock,
    ClockLogic,
    _EventClockLogic,
    _SystemClockLogic,
    from_snapshot_time,
    to_snapshot_time,
)
from millpond.operators.windowing.logic import WindowLogic, WindowMetadata, WindowOut
from millpond.operators.windowing.windower import Windower, WindowerLogic, _SessionLogic, _SlidingLogic

__all__ = [
    "collect_window",
    "count_window",
    "fold_window",
    "join_window",
    "max_window",
    "min_window",
    "reduce_window",
    "window",
]

V = TypeVar("V")
W = TypeVar("W")
S = TypeVar("S")

KeyedStream = Stream

_DOWN = 0
_LATE = 1
_META = 2

#: What window logics return most of the time; an empty one is skipped.
_PLAIN = (tuple, list)

#: 2: times as microseconds since 1970 (to_snapshot_time); 1: datetimes.
_SNAPSHOT_VERSION = 2
_SNAPSHOT_VERSIONS = (1, 2)


class _WindowStep(StatefulBatchLogic[Any, Tuple[int, Any], Any]):
    """Per-key state of a windowing operator."""

    __slots__ = (
        "clock",
        "windower",
        "builder",
        "ordered",
        "windows",
        "metas",
        "buffer",
        "seq",
        "next_close",
        "wake",
    )

    def __init__(
        self,
        clock: Clock,
        windower: Windower,
        builder: Callable[[Any], WindowLogic[Any, Any, Any]],
        ordered: bool,
        resume: Any,
    ) -> None:
        self.builder = builder
        self.ordered = ordered
        self.windows: Dict[int, WindowLogic[Any, Any, Any]] = {}
        self.metas: Dict[int, WindowMetadata] = {}
        self.buffer: List[Tuple[datetime, int, Any]] = []
        self.seq = 0
        if resume is None:
            self.clock: ClockLogic = clock.build(None)
            self.windower: WindowerLogic = windower.build(None)
        else:
            version, clock_s, windower_s, windows_s, buffer_s, self.seq = resume
            if version not in _SNAPSHOT_VERSIONS:
                raise ValueError(f"unknown windowing snapshot version {version!r}")
            self.clock = clock.build(clock_s)
            self.windower = windower.build(windower_s)
            for wid, open_time, close_time, merged, logic_s in windows_s:
                self.metas[wid] = self.windower.metadata(
                    wid, from_snapshot_time(open_time), from_snapshot_time(close_time), merged
                )
                self.windows[wid] = builder(logic_s)
            self.buffer = [(from_snapshot_time(ts), seq, v) for ts, seq, v in buffer_s]
            heapq.heapify(self.buffer)
        self.next_close = min((m.close_time for m in self.metas.values()), default=UTC_MAX)
        self.wake: Optional[datetime] = self._compute_wake()

    # -- the engine's calls ---------------------------------------------

    def on_batch(self, values: List[Any]) -> Tuple[Iterable[Tuple[int, Any]], bool]:
        out: List[Any] = []
        clock = self.clock
        clock.before_batch()
        ordered = self.ordered
        for v in values:
            ts, wm = clock.on_item(v)
            if ordered and ts >= wm:
                heapq.heappush(self.buffer, (ts, self.seq, v))
                self.seq += 1
                self._advance(wm, out)
            else:
                self._advance(wm, out)
                self._apply(ts, wm, v, out)
                if self.next_close <= wm:
                    self._close_upto(wm, out)
        self.wake = self._compute_wake()
        return out, self._idle()

    def on_notify(self) -> Tuple[Iterable[Tuple[int, Any]], bool]:
        out: List[Any] = []
        fired = self.wake
        self.clock.before_batch()
        self._advance(self.clock.watermark(), out)
        self.wake = self._compute_wake()
        if fired is not None and self.wake is not None and self.wake <= fired:
            # The clock says the time has not come although the timer fired
            # (a now_getter behind the system clock): wait for items or EOF
            # rather than wake up in a loop.
            self.wake = None
        return out, self._idle()

    def on_eof(self) -> Tuple[Iterable[Tuple[int, Any]], bool]:
        out: List[Any] = []
        self._advance(UTC_MAX, out)
        self.wake = None
        return out, StatefulBatchLogic.DISCARD

    def notify_at(self) -> Optional[datetime]:
        return self.wake

    def snapshot(self) -> Any:
        # The state store's packer builds this same tuple in C when every
        # part is windowing's own class (pybindings/window.c, registered at
        # the end of this module); this method is the definition, and runs
        # for anything else (a user's WindowLogic). Keep the two in step:
        # tests/test_window_snapshot.py compares them.
        #
        # List comprehensions, and no loop at all over nothing: a key's
        # snapshot is taken every epoch it is touched, and a generator
        # costs more than the one or two entries a key usually holds.
        metas, windows, buffer = self.metas, self.windows, self.buffer
        return (
            _SNAPSHOT_VERSION,
            self.clock.snapshot(),
            self.windower.snapshot(),
            tuple([
                (
                    wid,
                    to_snapshot_time(m.open_time),
                    to_snapshot_time(m.close_time),
                    tuple(sorted(m.merged_ids)) if m.merged_ids else (),
                    logic.snapshot(),
                )
                for wid, logic in windows.items()
                for m in (metas[wid],)
            ]) if windows else (),
            tuple([(to_snapshot_time(ts), seq, v) for ts, seq, v in buffer]) if buffer else (),
            self.seq,
        )

    # -- internals --------------------------------------------------------

    def _idle(self) -> bool:
        # A stateless clock (SystemClock) with nothing open loses nothing
        # when the key is dropped; an event clock keeps its watermark.
        return self.clock.stateless and not self.metas and not self.buffer

    def _compute_wake(self) -> Optional[datetime]:
        due = self.next_close if self.metas else None
        if self.buffer:
            first = self.buffer[0][0]
            due = first if due is None or first < due else due
        if due is None or due >= UTC_MAX:
            return None
        return self.clock.to_system_utc(due)

    def _advance(self, wm: datetime, out: List[Any]) -> None:
        """Apply the buffered values the watermark ``wm`` passed, in time
        order, closing windows as the time moves; then close what ``wm``
        closes."""
        buf = self.buffer
        while buf and buf[0][0] <= wm:
            ts, _, v = heapq.heappop(buf)
            # windows that closed before this item's time close first (one
            # closing exactly at it, a gap-0 session, may still take it)
            if self.next_close < ts:
                self._close_upto(ts, out, strict=True)
            self._apply(ts, ts, v, out)
        if self.next_close <= wm:
            self._close_upto(wm, out)

    def _apply(self, ts: datetime, wm: datetime, v: Any, out: List[Any]) -> None:
        metas = self.metas
        targets, merges, late = self.windower.assign(ts, wm, metas)
        windows = self.windows
        for into, frm in merges:
            original = windows.pop(frm)
            emitted = windows[into].on_merge(original)
            if emitted.__class__ not in _PLAIN or emitted:
                out.extend([(_DOWN, (into, w)) for w in emitted])
        for wid in targets:
            logic = windows.get(wid)
            if logic is None:
                logic = windows[wid] = self.builder(None)
            # Most values emit nothing until their window closes: an empty
            # tuple or list skips building the output loop at all (anything
            # else is iterated: its truth may not say whether it is empty).
            emitted = logic.on_value(v)
            if emitted.__class__ not in _PLAIN or emitted:
                out.extend([(_DOWN, (wid, w)) for w in emitted])
            close = metas[wid].close_time
            if close < self.next_close:
                self.next_close = close
        for wid in late:
            out.append((_LATE, (wid, v)))

    def _close_upto(self, t: datetime, out: List[Any], strict: bool = False) -> None:
        if not self.metas or self.next_close > t or (strict and self.next_close == t):
            return
        metas = self.metas
        shared = self.windower.shares_metadata
        due = [
            (m.close_time, wid) for wid, m in metas.items() if m.close_time < t or (not strict and m.close_time == t)
        ]
        if len(due) > 1:
            due.sort()
        for _, wid in due:
            logic = self.windows.pop(wid)
            meta = metas.pop(wid)
            if shared:
                meta = WindowMetadata(meta.open_time, meta.close_time, set())
            out.extend((_DOWN, (wid, w)) for w in logic.on_close())
            out.append((_META, (wid, meta)))
        self.next_close = min([m.close_time for m in metas.values()]) if metas else UTC_MAX


def _split(tag: int, batch: List[Tuple[str, Tuple[int, Any]]]) -> List[Tuple[str, Any]]:
    return [(k, tv[1]) for k, tv in batch if tv[0] == tag]


def _check(step_id: str, clock: Any, windower: Any, builder: Any) -> None:
    if not isinstance(clock, Clock):
        raise TypeError(f"step {step_id!r}: clock must be a SystemClock or EventClock; got {clock!r:.80}")
    if not isinstance(windower, Windower):
        raise TypeError(
            f"step {step_id!r}: windower must be a TumblingWindower, SlidingWindower or "
            f"SessionWindower; got {windower!r:.80}"
        )
    if not callable(builder):
        raise TypeError(f"step {step_id!r}: `builder` must be callable; got {builder!r:.80}")


@operator
def window(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    clock: Clock,
    windower: Windower,
    builder: Callable[[Optional[S]], WindowLogic[V, W, S]],
    ordered: bool = True,
) -> WindowOut[V, W]:
    """The general windowing operator: one ``builder(resume_state)``
    :class:`WindowLogic` per window per key.

    Returns :class:`WindowOut` ``(down, late, meta)``, keyed streams of
    ``(window_id, x)``. With ``ordered=True`` values are applied to windows
    in time order (buffered until the watermark passes them); with ``False``
    in arrival order.
    """
    _check(step_id, clock, windower, builder)

    def shim_builder(resume: Any) -> _WindowStep:
        return _WindowStep(clock, windower, builder, bool(ordered), resume)

    tagged = stateful_batch("stateful_batch", up, shim_builder)
    return WindowOut(
        flat_map_batch("down", tagged, functools.partial(_split, _DOWN)),
        flat_map_batch("late", tagged, functools.partial(_split, _LATE)),
        flat_map_batch("meta", tagged, functools.partial(_split, _META)),
    )


class _FoldWindowLogic(WindowLogic[V, S, S]):
    __slots__ = ("folder", "merger", "acc")

    def __init__(self, folder: Callable[[S, V], S], merger: Callable[[S, S], S], acc: S) -> None:
        self.folder = folder
        self.merger = merger
        self.acc = acc

    def on_value(self, value: V) -> Iterable[S]:
        self.acc = self.folder(self.acc, value)
        return ()

    def on_merge(self, original: WindowLogic[V, S, S]) -> Iterable[S]:
        assert isinstance(original, _FoldWindowLogic)
        self.acc = self.merger(self.acc, original.acc)
        return ()

    def on_close(self) -> Iterable[S]:
        return (self.acc,)

    def snapshot(self) -> S:
        return self.acc


@operator
def fold_window(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    clock: Clock,
    windower: Windower,
    builder: Callable[[], S],
    folder: Callable[[S, V], S],
    merger: Callable[[S, S], S],
    ordered: bool = True,
) -> WindowOut[V, S]:
    """Per window, ``acc = folder(acc, value)`` from ``builder()``; merged
    sessions combine with ``merger(acc, original_acc)``; emits
    ``(key, (window_id, acc))`` when the window closes."""
    for name, fn in (("builder", builder), ("folder", folder), ("merger", merger)):
        if not callable(fn):
            raise TypeError(f"step {step_id!r}: `{name}` must be callable; got {fn!r:.80}")

    def logic_builder(resume: Optional[S]) -> _FoldWindowLogic[V, S]:
        return _FoldWindowLogic(folder, merger, builder() if resume is None else resume)

    return window("fold_window", up, clock, windower, logic_builder, ordered)


class _CollectWindowLogic(WindowLogic[Any, Any, Tuple[Any, ...]]):
    __slots__ = ("into", "values")

    def __init__(self, into: Callable[[List[Any]], Any], values: List[Any]) -> None:
        self.into = into
        self.values = values

    def on_value(self, value: Any) -> Iterable[Any]:
        self.values.append(value)
        return ()

    def on_merge(self, original: WindowLogic[Any, Any, Tuple[Any, ...]]) -> Iterable[Any]:
        assert isinstance(original, _CollectWindowLogic)
        self.values.extend(original.values)
        return ()

    def on_close(self) -> Iterable[Any]:
        return (self.into(self.values),)

    def snapshot(self) -> Tuple[Any, ...]:
        return tuple(self.values)


@operator
def collect_window(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    clock: Clock,
    windower: Windower,
    into: Any = list,
) -> WindowOut[V, Any]:
    """Per window, gather the values into a ``list`` (time order with the
    default ``ordered`` windowing), a ``set``, or a ``dict`` (values must be
    ``(k, v)`` pairs; later pairs win); emitted when the window closes."""
    if into not in (list, set, dict):
        raise TypeError(f"step {step_id!r}: `into` must be list, set or dict; got {into!r:.80}")

    def logic_builder(resume: Optional[Tuple[Any, ...]]) -> _CollectWindowLogic:
        return _CollectWindowLogic(into, [] if resume is None else list(resume))

    return window("collect_window", up, clock, windower, logic_builder)


def _add(a: int, b: int) -> int:
    return a + b


def _count_one(n: int, _v: Any) -> int:
    return n + 1


def _zero() -> int:
    return 0


@operator
def count_window(
    step_id: str,
    up: Stream[Any],
    clock: Clock,
    windower: Windower,
    key: Callable[[Any], str],
) -> WindowOut[Any, int]:
    """Count items per ``key(item)`` (a ``str``) and window; emits
    ``(key, (window_id, count))`` when a window closes. Takes an unkeyed
    stream; the clock sees the items themselves."""
    keyed = key_on("key", up, key)
    return fold_window("fold_window", keyed, clock, windower, _zero, _count_one, _add)


@operator
def reduce_window(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    clock: Clock,
    windower: Windower,
    reducer: Callable[[V, V], V],
) -> WindowOut[V, V]:
    """Per window, combine values with ``reducer(acc, value)`` starting
    from the first; emits ``(key, (window_id, acc))`` at close."""
    if not callable(reducer):
        raise TypeError(f"step {step_id!r}: `reducer` must be callable; got {reducer!r:.80}")

    def folder(acc: Any, v: Any) -> Any:
        return v if acc is _UNSET else reducer(acc, v)

    def merger(a: Any, b: Any) -> Any:
        if a is _UNSET:
            return b
        if b is _UNSET:
            return a
        return reducer(a, b)

    return fold_window("fold_window", up, clock, windower, lambda: _UNSET, folder, merger)


@operator
def max_window(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    clock: Clock,
    windower: Windower,
    by: Callable[[V], Any] = _identity,
) -> WindowOut[V, V]:
    """The largest value per window by ``by(value)``, emitted at close."""
    return reduce_window("reduce_window", up, clock, windower, lambda a, b: max(a, b, key=by))


@operator
def min_window(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    clock: Clock,
    windower: Windower,
    by: Callable[[V], Any] = _identity,
) -> WindowOut[V, V]:
    """The smallest value per window by ``by(value)``, emitted at close."""
    return reduce_window("reduce_window", up, clock, windower, lambda a, b: min(a, b, key=by))


class _JoinWindowLogic(_JoinSides, WindowLogic[Tuple[int, Any], Tuple[Any, ...], Tuple[Tuple[Any, ...], ...]]):
    __slots__ = ()

    def on_value(self, value: Tuple[int, Any]) -> Iterable[Tuple[Any, ...]]:
        side, v = value
        self._insert(side, [v])
        return self._after_insert()

    def on_merge(self, original: WindowLogic[Any, Any, Any]) -> Iterable[Tuple[Any, ...]]:
        assert isinstance(original, _JoinWindowLogic)
        for side, vs in enumerate(original.seen):
            self._insert(side, vs)
        return self._after_insert() if any(original.seen) else []

    def on_close(self) -> Iterable[Tuple[Any, ...]]:
        if self.emit_mode == "final" and any(self.seen):
            return self._rows()
        return ()


def _untag(tv: Tuple[int, Any]) -> Any:
    return tv[1]


@operator
def join_window(
    step_id: str,
    clock: Clock,
    windower: Windower,
    *sides: KeyedStream[Tuple[str, Any]],
    insert_mode: JoinInsertMode = "last",
    emit_mode: JoinEmitMode = "final",
    ordered: bool = True,
) -> WindowOut[Any, Tuple[Any, ...]]:
    """Join keyed streams per key and window; emits
    ``(key, (window_id, (v_side0, v_side1, ...)))``.

    ``insert_mode`` and ``emit_mode`` are those of ``op.join``, per window:
    ``"final"`` emits what the window has when it closes (missing sides are
    ``None``), ``"complete"`` as soon as every side has a value (then starts
    over within the window), ``"running"`` on every value. The clock's
    ``ts_getter`` sees each side's values as they are. ``late`` carries
    ``(window_id, (side_index, value))``.
    """
    _check_join_modes(step_id, insert_mode, emit_mode)
    if not sides:
        raise TypeError(f"step {step_id!r}: join_window needs at least one side")
    if not isinstance(clock, Clock):
        raise TypeError(f"step {step_id!r}: clock must be a SystemClock or EventClock; got {clock!r:.80}")
    tagged = [
        map_value(f"side_{i}", side, functools.partial(_tag_side, i)) for i, side in enumerate(sides)
    ]
    merged = merge("merge", *tagged)
    count = len(sides)

    def logic_builder(resume: Any) -> _JoinWindowLogic:
        return _JoinWindowLogic(count, insert_mode, emit_mode, resume)

    return window("window", merged, clock._on_values(_untag), windower, logic_builder, ordered)


# The classes whose objects snapshots read in C (see _WindowStep.snapshot).
_core.window_register(
    _WindowStep,
    _EventClockLogic,
    _SystemClockLogic,
    _SlidingLogic,
    _SessionLogic,
    _FoldWindowLogic,
    _CollectWindowLogic,
    WindowMetadata,
    _SNAPSHOT_VERSION,
)
