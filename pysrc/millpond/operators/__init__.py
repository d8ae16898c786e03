"""Every operator of a millpond dataflow; import as ``op``.

::

    import millpond.operators as op

    words = op.flat_map("split", lines, str.split)
    counts = op.count_final("count", words, key=lambda w: w)

The core operators (``input``, ``output``, ``flat_map_batch``, ``branch``,
``merge``, ``redistribute``, ``inspect_debug``, ``stateful_batch``) are run
by the engine directly; all others are built from them, so their steps show
up as ``<your id>.<core step>`` in errors and recovery state.

Keyed streams carry ``(key: str, value)`` 2-tuples. Stateful operators route
each key to one worker and keep one logic object per key; anything that is
not such a tuple raises a ``TypeError`` naming the step (wrapped in a
``DataflowError`` at run time, like every exception from user code).
See ``docs/operators.md`` for the full reference.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import (
    Any,
    Callable,
    Generic,
    Iterable,
    List,
    Literal,
    Optional,
    Tuple,
    TypeVar,
    cast,
)

from millpond import _core
from millpond.dataflow import Dataflow, Stream, _step_scope, operator
from millpond.errors import keyed_item_error
from millpond.logic import StatefulBatchLogic, StatefulLogic, StatefulShim

__all__ = [
    "BranchOut",
    "StatefulBatchLogic",
    "StatefulLogic",
    "JoinInsertMode",
    "JoinEmitMode",
    "branch",
    "collect",
    "count_final",
    "enrich_cached",
    "TTLCache",
    "filter",
    "filter_map",
    "filter_map_value",
    "filter_value",
    "flat_map",
    "flat_map_batch",
    "flat_map_value",
    "flatten",
    "fold_final",
    "input",
    "inspect",
    "inspect_debug",
    "join",
    "key_on",
    "key_rm",
    "map",
    "map_value",
    "max_final",
    "merge",
    "min_final",
    "output",
    "raises",
    "redistribute",
    "reduce_final",
    "stateful",
    "stateful_batch",
    "stateful_flat_map",
    "stateful_map",
]

X = TypeVar("X")
Y = TypeVar("Y")
V = TypeVar("V")
W = TypeVar("W")
S = TypeVar("S")

KeyedStream = Stream  # a Stream of (str, value) 2-tuples, for annotations


def _check_callable(step_id: str, name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(
            f"step {step_id!r}: `{name}` must be callable; got {type(fn).__name__}: {fn!r:.80}"
        )


def _keyed(step_id: str, item: Any) -> Tuple[str, Any]:
    if type(item) is tuple and len(item) == 2 and type(item[0]) is str:
        return item
    raise keyed_item_error(step_id, item)


# --------------------------------------------------------------------------
# Core operators


@operator
def input(step_id: str, flow: Dataflow, source: Any) -> Stream[Any]:
    """Read items from ``source`` (a ``FixedPartitionedSource`` or
    ``DynamicSource`` from :mod:`millpond.inputs`).

    Fixed partitions are spread over workers by name; a dynamic source gets
    one partition per worker.
    """
    view, me = _step_scope(flow)
    has_fixed = callable(getattr(source, "list_parts", None)) and callable(
        getattr(source, "build_part", None)
    )
    if not has_fixed and not callable(getattr(source, "build", None)):
        raise TypeError(
            f"step {me!r}: source must be a FixedPartitionedSource or DynamicSource "
            f"(see millpond.inputs); got {type(source).__name__}"
        )
    return view._add_step(me, "input", [], ["down"], {"source": source})[0]


@operator
def output(step_id: str, up: Stream[Any], sink: Any) -> None:
    """Write every item of ``up`` to ``sink`` (a ``FixedPartitionedSink`` or
    ``DynamicSink`` from :mod:`millpond.outputs`).

    A fixed-partitioned sink needs a keyed stream: ``part_fn(key)`` picks the
    partition and ``write_batch`` receives the values.
    """
    view, me = _step_scope(up)
    has_fixed = callable(getattr(sink, "list_parts", None)) and callable(
        getattr(sink, "build_part", None)
    )
    if not has_fixed and not callable(getattr(sink, "build", None)):
        raise TypeError(
            f"step {me!r}: sink must be a FixedPartitionedSink or DynamicSink "
            f"(see millpond.outputs); got {type(sink).__name__}"
        )
    view._add_step(me, "output", [up], [], {"sink": sink})


@operator
def flat_map_batch(
    step_id: str, up: Stream[X], mapper: Callable[[List[X]], Iterable[Y]]
) -> Stream[Y]:
    """Call ``mapper`` on each batch of items; emit everything it returns.

    The fastest way to run Python over a stream: one call per batch.
    """
    view, me = _step_scope(up)
    _check_callable(me, "mapper", mapper)
    return view._add_step(me, "flat_map_batch", [up], ["down"], {"mapper": mapper})[0]


@dataclass(frozen=True)
class BranchOut(Generic[X, Y]):
    """The two streams of :func:`branch`."""

    trues: Stream[X]
    falses: Stream[Y]


@operator
def branch(step_id: str, up: Stream[X], predicate: Callable[[X], bool]) -> BranchOut[X, X]:
    """Split ``up`` by ``predicate``; a non-bool result is a ``TypeError``."""
    view, me = _step_scope(up)
    _check_callable(me, "predicate", predicate)
    trues, falses = view._add_step(
        me, "branch", [up], ["trues", "falses"], {"predicate": predicate}
    )
    return BranchOut(trues, falses)


@operator
def merge(step_id: str, *ups: Stream[Any]) -> Stream[Any]:
    """All items of all ``ups`` in one stream."""
    view, me = _step_scope(ups[0])
    return view._add_step(me, "merge", list(ups), ["down"], {})[0]


@operator
def redistribute(step_id: str, up: Stream[X]) -> Stream[X]:
    """Spread items evenly over all workers (e.g. after a one-partition source)."""
    view, me = _step_scope(up)
    return view._add_step(me, "redistribute", [up], ["down"], {})[0]


@operator
def inspect_debug(
    step_id: str,
    up: Stream[X],
    inspector: Optional[Callable[[str, X, int, int], None]] = None,
) -> Stream[X]:
    """Call ``inspector(step_id, item, epoch, worker_index)`` on each item and
    pass the item on. Default: print all four."""
    view, me = _step_scope(up)
    if inspector is None:
        inspector = _default_debug_inspector
    _check_callable(me, "inspector", inspector)
    return view._add_step(me, "inspect_debug", [up], ["down"], {"inspector": inspector})[0]


def _default_debug_inspector(step_id: str, item: Any, epoch: int, worker: int) -> None:
    print(f"{step_id} W{worker} @{epoch}: {item!r}", flush=True)


@operator
def stateful_batch(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    builder: Callable[[Optional[S]], StatefulBatchLogic[V, W, S]],
) -> KeyedStream[Tuple[str, W]]:
    """The general stateful operator: one :class:`StatefulBatchLogic` per key.

    ``builder(resume_state)`` gets ``None`` for a new key and the last
    snapshot for a restored one. Per key and activation: ``on_batch`` with the
    key's queued values, then ``on_notify`` if its time has come, then
    ``on_eof`` if the upstream ended; then ``notify_at()`` is asked again.
    Outputs are emitted as ``(key, value)``. Per worker, EOF output comes in
    sorted key order.
    """
    view, me = _step_scope(up)
    _check_callable(me, "builder", builder)
    return view._add_step(me, "stateful_batch", [up], ["down"], {"builder": builder})[0]


# --------------------------------------------------------------------------
# Stateless operators built from the core ones


@operator
def map(step_id: str, up: Stream[X], mapper: Callable[[X], Y]) -> Stream[Y]:
    """Emit ``mapper(item)`` for each item."""
    _check_callable(step_id, "mapper", mapper)

    def shim(batch: List[X]) -> List[Y]:
        return [mapper(x) for x in batch]

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def filter(step_id: str, up: Stream[X], predicate: Callable[[X], bool]) -> Stream[X]:
    """Keep the items for which ``predicate`` returns ``True``.

    A result that is not a ``bool`` is a ``TypeError``.
    """
    _check_callable(step_id, "predicate", predicate)
    _, me = _step_scope(up)

    def shim(batch: List[X]) -> List[X]:
        return _kept(me, batch, predicate)

    return flat_map_batch("flat_map_batch", up, shim)


def _kept(me: str, batch: List[Any], test: Callable[[Any], Any]) -> List[Any]:
    """The items of ``batch`` for which ``test`` is ``True``; a result that
    is not a bool is a ``TypeError`` naming step ``me``."""
    out = []
    for x in batch:
        keep = test(x)
        if keep is True:
            out.append(x)
        elif keep is not False:
            raise TypeError(
                f"return value of `predicate` in step {me!r} must be a bool; "
                f"got {type(keep).__name__}: {keep!r:.80}"
            )
    return out


@operator
def filter_map(step_id: str, up: Stream[X], mapper: Callable[[X], Optional[Y]]) -> Stream[Y]:
    """Emit ``mapper(item)`` unless it is ``None``."""
    _check_callable(step_id, "mapper", mapper)

    def shim(batch: List[X]) -> List[Y]:
        return [y for y in (mapper(x) for x in batch) if y is not None]

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def flat_map(step_id: str, up: Stream[X], mapper: Callable[[X], Iterable[Y]]) -> Stream[Y]:
    """Emit every item of the iterable ``mapper(item)`` returns."""
    _check_callable(step_id, "mapper", mapper)

    def shim(batch: List[X]) -> List[Y]:
        return [y for x in batch for y in mapper(x)]

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def flatten(step_id: str, up: Stream[Iterable[X]]) -> Stream[X]:
    """Emit every element of every (iterable) item."""
    _, me = _step_scope(up)

    def shim(batch: List[Iterable[X]]) -> List[X]:
        out: List[X] = []
        for xs in batch:
            try:
                it = iter(xs)
            except TypeError:
                raise TypeError(
                    f"step {me!r} flattens iterables; got {type(xs).__name__}: {xs!r:.80}"
                ) from None
            out.extend(it)
        return out

    return flat_map_batch("flat_map_batch", up, shim)


def _default_inspector(step_id: str, item: Any) -> None:
    print(f"{step_id}: {item!r}", flush=True)


@operator
def inspect(
    step_id: str,
    up: Stream[X],
    inspector: Callable[[str, X], None] = _default_inspector,
) -> Stream[X]:
    """Call ``inspector(step_id, item)`` on each item and pass it on.

    The default prints ``step_id: item!r``.
    """
    _check_callable(step_id, "inspector", inspector)
    _, me = _step_scope(up)

    def shim(_sid: str, item: X, _epoch: int, _worker: int) -> None:
        inspector(me, item)

    return inspect_debug("inspect_debug", up, shim)


@operator
def key_on(step_id: str, up: Stream[X], key: Callable[[X], str]) -> KeyedStream[Tuple[str, X]]:
    """Emit ``(key(item), item)``; ``key`` must return a ``str``."""
    _check_callable(step_id, "key", key)
    _, me = _step_scope(up)

    def shim(batch: List[X]) -> List[Tuple[str, X]]:
        out = []
        for x in batch:
            k = key(x)
            if type(k) is not str:
                raise TypeError(
                    f"return value of `key` in step {me!r} must be a str; "
                    f"got {type(k).__name__}: {k!r:.80}"
                )
            out.append((k, x))
        return out

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def key_rm(step_id: str, up: KeyedStream[Tuple[str, V]]) -> Stream[V]:
    """Drop the key: emit ``value`` for each ``(key, value)``."""
    _, me = _step_scope(up)

    def shim(batch: List[Tuple[str, V]]) -> List[V]:
        return [_keyed(me, kv)[1] for kv in batch]

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def map_value(
    step_id: str, up: KeyedStream[Tuple[str, V]], mapper: Callable[[V], W]
) -> KeyedStream[Tuple[str, W]]:
    """Emit ``(key, mapper(value))``."""
    _check_callable(step_id, "mapper", mapper)
    _, me = _step_scope(up)

    def shim(batch: List[Tuple[str, V]]) -> List[Tuple[str, W]]:
        out: List[Tuple[str, W]] = []
        for kv in batch:
            k, v = _keyed(me, kv)
            out.append((k, mapper(v)))
        return out

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def flat_map_value(
    step_id: str, up: KeyedStream[Tuple[str, V]], mapper: Callable[[V], Iterable[W]]
) -> KeyedStream[Tuple[str, W]]:
    """Emit ``(key, w)`` for each ``w`` in ``mapper(value)``."""
    _check_callable(step_id, "mapper", mapper)
    _, me = _step_scope(up)

    def shim(batch: List[Tuple[str, V]]) -> List[Tuple[str, W]]:
        out: List[Tuple[str, W]] = []
        for kv in batch:
            k, v = _keyed(me, kv)
            out.extend((k, w) for w in mapper(v))
        return out

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def filter_value(
    step_id: str, up: KeyedStream[Tuple[str, V]], predicate: Callable[[V], bool]
) -> KeyedStream[Tuple[str, V]]:
    """Keep ``(key, value)`` when ``predicate(value)`` is ``True`` (must be a bool)."""
    _check_callable(step_id, "predicate", predicate)
    _, me = _step_scope(up)

    def shim(batch: List[Tuple[str, V]]) -> List[Tuple[str, V]]:
        return _kept(me, batch, lambda kv: predicate(_keyed(me, kv)[1]))

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def filter_map_value(
    step_id: str, up: KeyedStream[Tuple[str, V]], mapper: Callable[[V], Optional[W]]
) -> KeyedStream[Tuple[str, W]]:
    """Emit ``(key, mapper(value))`` unless the result is ``None``."""
    _check_callable(step_id, "mapper", mapper)
    _, me = _step_scope(up)

    def shim(batch: List[Tuple[str, V]]) -> List[Tuple[str, W]]:
        out = []
        for kv in batch:
            k, v = _keyed(me, kv)
            w = mapper(v)
            if w is not None:
                out.append((k, w))
        return out

    return flat_map_batch("flat_map_batch", up, shim)


@operator
def raises(step_id: str, up: Stream[Any]) -> None:
    """Fail the dataflow on the first item (useful in tests).

    An inspect step, so a flow may end in it without an ``op.output``."""
    _, me = _step_scope(up)

    def shim(_sid: str, item: Any, _epoch: int, _worker: int) -> None:
        raise RuntimeError(f"step {me!r} got an item: {item!r:.80}")

    inspect_debug("inspect_debug", up, shim)


# enrich_cached: a map that joins items against a slow lookup, with a cache
# (millpond.operators.enrich holds TTLCache).
from millpond.operators.enrich import TTLCache, _utcnow as _enrich_utcnow  # noqa: E402


@operator
def enrich_cached(
    step_id: str,
    up: Stream[X],
    getter: Callable[[Any], Any],
    mapper: Callable[[TTLCache[Any, Any], X], Y],
    ttl: timedelta = timedelta.max,
    *,
    now_getter: Callable[[], datetime] = _enrich_utcnow,
) -> Stream[Y]:
    """Emit ``mapper(cache, item)``, where ``cache.get(k)`` returns
    ``getter(k)``, cached for ``ttl`` (default: forever).

    The :class:`TTLCache` lives in the process running the flow and is
    shared by its workers; it is not recovery state (a resumed run fetches
    again). ``cache.remove(k)`` forgets a key. ``now_getter`` is the clock
    (``millpond.testing.TimeTestingGetter(...).get`` in tests).
    """
    _check_callable(step_id, "getter", getter)
    _check_callable(step_id, "mapper", mapper)
    try:
        cache: TTLCache[Any, Any] = TTLCache(getter, now_getter, ttl)
    except (TypeError, ValueError) as ex:
        raise type(ex)(f"step {step_id!r}: {ex}") from None

    def shim(batch: List[X]) -> List[Y]:
        return [mapper(cache, x) for x in batch]

    return flat_map_batch("flat_map_batch", up, shim)


# --------------------------------------------------------------------------
# Stateful operators built from stateful_batch


def _without_timers(stream: Stream[Any], on_eof: bool = True) -> Stream[Any]:
    """Mark the ``stateful_batch`` step producing ``stream`` as one whose
    logic never sets timers, so a resumed run need not hydrate every key just
    to ask ``notify_at``. With ``on_eof=False`` its logic also keeps the
    default ``on_eof`` (nothing emitted, state kept), so the end of input
    need not visit its keys at all."""
    for step in stream._graph.steps:
        if f"{step.step_id}.down" == stream.stream_id and step.kind == "stateful_batch":
            step.params["timers"] = False
            step.params["eof"] = on_eof
    return stream


@operator
def stateful(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    builder: Callable[[Optional[S]], StatefulLogic[V, W, S]],
) -> KeyedStream[Tuple[str, W]]:
    """Like :func:`stateful_batch` with a per-item :class:`StatefulLogic`."""
    _check_callable(step_id, "builder", builder)

    def shim_builder(resume: Optional[S]) -> StatefulShim[V, W, S]:
        return StatefulShim(builder, builder(resume))

    return stateful_batch("stateful_batch", up, shim_builder)


class _StatefulMapLogic(StatefulBatchLogic[V, W, S]):
    __slots__ = ("mapper", "state", "flat")

    def __init__(self, mapper: Callable[[Optional[S], V], Tuple[Optional[S], Any]], state: Any, flat: bool):
        self.mapper = mapper
        self.state = state
        self.flat = flat

    def on_batch(self, values: List[V]) -> Tuple[Iterable[W], bool]:
        out: List[W] = []
        mapper = self.mapper
        state = self.state
        for v in values:
            res = mapper(state, v)
            if type(res) is not tuple or len(res) != 2:
                raise TypeError(
                    "the mapper of stateful_map/stateful_flat_map must return "
                    f"(new_state, emit) 2-tuples; got {res!r:.80}"
                )
            state, emit = res
            if self.flat:
                out.extend(emit)
            else:
                out.append(emit)
        self.state = state
        return out, state is None

    def snapshot(self) -> S:
        # The state a mapper returned; None never reaches a snapshot (the
        # key was discarded). Snapshots read the slot in C instead of
        # calling this (registered below): keep the two the same.
        return cast(S, self.state)


_core.slot_state_register(_StatefulMapLogic, "state")


@operator
def stateful_map(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    mapper: Callable[[Optional[S], V], Tuple[Optional[S], W]],
) -> KeyedStream[Tuple[str, W]]:
    """Per key, ``mapper(state_or_None, value) -> (new_state_or_None, emit)``.

    Emits ``(key, emit)``. A ``None`` state discards the key. The state
    should be treated as immutable once returned (it is what is snapshotted).
    """
    _check_callable(step_id, "mapper", mapper)
    return _without_timers(
        stateful_batch(
            "stateful_batch", up, lambda resume: _StatefulMapLogic(mapper, resume, False)
        ),
        on_eof=False,
    )


@operator
def stateful_flat_map(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    mapper: Callable[[Optional[S], V], Tuple[Optional[S], Iterable[W]]],
) -> KeyedStream[Tuple[str, W]]:
    """Like :func:`stateful_map`, but ``emit`` is an iterable of values."""
    _check_callable(step_id, "mapper", mapper)
    return _without_timers(
        stateful_batch(
            "stateful_batch", up, lambda resume: _StatefulMapLogic(mapper, resume, True)
        ),
        on_eof=False,
    )


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class _CollectLogic(StatefulBatchLogic[V, List[V], Tuple[List[V], Optional[datetime]]]):
    __slots__ = ("timeout", "max_size", "acc", "due")

    def __init__(self, timeout: timedelta, max_size: int, resume: Any) -> None:
        self.timeout = timeout
        self.max_size = max_size
        if resume is None:
            self.acc: List[V] = []
            self.due: Optional[datetime] = None
        else:
            acc, self.due = resume
            self.acc = list(acc)

    def on_batch(self, values: List[V]) -> Tuple[Iterable[List[V]], bool]:
        out: List[List[V]] = []
        for v in values:
            if not self.acc:
                self.due = _utcnow() + self.timeout
            self.acc.append(v)
            if len(self.acc) >= self.max_size:
                out.append(self.acc)
                self.acc = []
                self.due = None
        return out, not self.acc

    def on_notify(self) -> Tuple[Iterable[List[V]], bool]:
        return self._flush()

    def on_eof(self) -> Tuple[Iterable[List[V]], bool]:
        return self._flush()

    def _flush(self) -> Tuple[Iterable[List[V]], bool]:
        out = [self.acc] if self.acc else []
        self.acc = []
        self.due = None
        return out, True

    def notify_at(self) -> Optional[datetime]:
        return self.due

    def snapshot(self) -> Tuple[List[V], Optional[datetime]]:
        return (list(self.acc), self.due)


@operator
def collect(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    timeout: timedelta,
    max_size: int,
) -> KeyedStream[Tuple[str, List[V]]]:
    """Per key, gather values into lists of at most ``max_size``.

    A list is emitted when it is full, when ``timeout`` has passed since its
    first value, or at EOF.
    """
    if not isinstance(timeout, timedelta):
        raise TypeError(f"step {step_id!r}: timeout must be a timedelta; got {timeout!r}")
    if timeout < timedelta(0):
        raise ValueError(f"step {step_id!r}: timeout must not be negative; got {timeout}")
    if not isinstance(max_size, int) or isinstance(max_size, bool) or max_size < 1:
        raise ValueError(f"step {step_id!r}: max_size must be a positive int; got {max_size!r}")
    return stateful_batch(
        "stateful_batch", up, lambda resume: _CollectLogic(timeout, max_size, resume)
    )


class _FoldFinalLogic(StatefulBatchLogic[V, S, S]):
    __slots__ = ("folder", "acc")

    def __init__(self, folder: Callable[[S, V], S], acc: S) -> None:
        self.folder = folder
        self.acc = acc

    def on_batch(self, values: List[V]) -> Tuple[Iterable[S], bool]:
        acc = self.acc
        folder = self.folder
        for v in values:
            acc = folder(acc, v)
        self.acc = acc
        return (), False

    def on_eof(self) -> Tuple[Iterable[S], bool]:
        return (self.acc,), True

    def snapshot(self) -> S:
        return self.acc


@operator
def fold_final(
    step_id: str,
    up: KeyedStream[Tuple[str, V]],
    builder: Callable[[], S],
    folder: Callable[[S, V], S],
) -> KeyedStream[Tuple[str, S]]:
    """Per key, fold values into ``builder()`` with ``folder(acc, value)``;
    emit ``(key, acc)`` when the upstream ends (then the key is dropped)."""
    _check_callable(step_id, "builder", builder)
    _check_callable(step_id, "folder", folder)

    def shim_builder(resume: Optional[S]) -> _FoldFinalLogic[V, S]:
        return _FoldFinalLogic(folder, builder() if resume is None else resume)

    return _without_timers(stateful_batch("stateful_batch", up, shim_builder))


class _Unset:
    """No value yet (``None`` may be a legitimate value); pickles as itself."""

    def __repr__(self) -> str:
        return "<unset>"

    def __reduce__(self) -> str:
        return "_UNSET"


_UNSET: Any = _Unset()


@operator
def reduce_final(
    step_id: str, up: KeyedStream[Tuple[str, V]], reducer: Callable[[V, V], V]
) -> KeyedStream[Tuple[str, V]]:
    """Per key, combine values with ``reducer(acc, value)``; emit
    ``(key, acc)`` when the upstream ends."""
    _check_callable(step_id, "reducer", reducer)

    def folder(acc: Any, v: V) -> V:
        return v if acc is _UNSET else reducer(acc, v)

    return fold_final("fold_final", up, lambda: _UNSET, folder)


@operator
def count_final(
    step_id: str, up: Stream[X], key: Callable[[X], str]
) -> KeyedStream[Tuple[str, int]]:
    """Count items by ``key(item)`` (a ``str``); emit ``(key, count)`` at EOF."""
    _check_callable(step_id, "key", key)
    _, me = _step_scope(up)

    def pre_count(batch: List[X]) -> List[Tuple[str, int]]:
        # Count within each batch first: one item per distinct key crosses
        # to the stateful step instead of one per input item.
        counts: Counter[Any] = Counter()
        for x in batch:
            k = key(x)
            if type(k) is not str:
                raise TypeError(
                    f"return value of `key` in step {me!r} must be a str; "
                    f"got {type(k).__name__}: {k!r:.80}"
                )
            counts[k] += 1
        return list(counts.items())

    keyed = flat_map_batch("init_count", up, pre_count)
    return fold_final("sum", keyed, lambda: 0, lambda s, n: s + n)


def _identity(x: Any) -> Any:
    return x


@operator
def max_final(
    step_id: str, up: KeyedStream[Tuple[str, V]], by: Callable[[V], Any] = _identity
) -> KeyedStream[Tuple[str, V]]:
    """Per key, the largest value by ``by(value)``, emitted at EOF."""
    _check_callable(step_id, "by", by)
    return reduce_final("reduce_final", up, lambda a, b: max(a, b, key=by))


@operator
def min_final(
    step_id: str, up: KeyedStream[Tuple[str, V]], by: Callable[[V], Any] = _identity
) -> KeyedStream[Tuple[str, V]]:
    """Per key, the smallest value by ``by(value)``, emitted at EOF."""
    _check_callable(step_id, "by", by)
    return reduce_final("reduce_final", up, lambda a, b: min(a, b, key=by))


JoinInsertMode = Literal["first", "last", "product"]
JoinEmitMode = Literal["complete", "final", "running"]


class _JoinSides:
    """The values a join keeps per side and the rows it emits: ``join`` per
    key, ``windowing.join_window`` per key and window."""

    __slots__ = ("sides", "insert_mode", "emit_mode", "seen")

    def __init__(self, sides: int, insert_mode: str, emit_mode: str, resume: Any) -> None:
        self.sides = sides
        self.insert_mode = insert_mode
        self.emit_mode = emit_mode
        self.seen: List[List[Any]] = (
            [[] for _ in range(sides)] if resume is None else [list(vs) for vs in resume]
        )

    def _rows(self) -> List[Tuple[Any, ...]]:
        return list(itertools.product(*(vs if vs else [None] for vs in self.seen)))

    def _insert(self, side: int, vs: List[Any]) -> None:
        """Take ``vs``, in order, into ``side`` as the insert mode says."""
        if not vs:
            return
        mode = self.insert_mode
        if mode == "last":
            self.seen[side] = [vs[-1]]
        elif mode == "first":
            if not self.seen[side]:
                self.seen[side] = [vs[0]]
        else:
            self.seen[side].extend(vs)

    def _after_insert(self) -> List[Tuple[Any, ...]]:
        """The rows the emit mode emits after an insert ("complete" then
        starts over)."""
        if self.emit_mode == "running":
            return self._rows()
        if self.emit_mode == "complete" and all(self.seen):
            rows = self._rows()
            self.seen = [[] for _ in range(self.sides)]
            return rows
        return []

    def snapshot(self) -> Tuple[Tuple[Any, ...], ...]:
        return tuple(tuple(vs) for vs in self.seen)


class _JoinLogic(_JoinSides, StatefulBatchLogic[Tuple[int, Any], Tuple[Any, ...], Tuple[Tuple[Any, ...], ...]]):
    __slots__ = ()

    def on_batch(self, values: List[Tuple[int, Any]]) -> Tuple[Iterable[Tuple[Any, ...]], bool]:
        out: List[Tuple[Any, ...]] = []
        for side, v in values:
            self._insert(side, [v])
            out.extend(self._after_insert())
        if self.emit_mode == "complete":
            return out, not any(self.seen)
        return out, False

    def on_eof(self) -> Tuple[Iterable[Tuple[Any, ...]], bool]:
        if self.emit_mode == "final":
            return self._rows(), True
        return (), True


def _check_join_modes(step_id: str, insert_mode: str, emit_mode: str) -> None:
    if insert_mode not in ("first", "last", "product"):
        raise ValueError(
            f"step {step_id!r}: insert_mode must be 'first', 'last' or 'product'; "
            f"got {insert_mode!r}"
        )
    if emit_mode not in ("complete", "final", "running"):
        raise ValueError(
            f"step {step_id!r}: emit_mode must be 'complete', 'final' or 'running'; "
            f"got {emit_mode!r}"
        )


def _tag_side(side: int, value: Any) -> Tuple[int, Any]:
    return (side, value)


@operator
def join(
    step_id: str,
    *sides: KeyedStream[Tuple[str, Any]],
    insert_mode: JoinInsertMode = "last",
    emit_mode: JoinEmitMode = "complete",
) -> KeyedStream[Tuple[str, Tuple[Any, ...]]]:
    """Join keyed streams on their keys; emit ``(key, (v_side0, v_side1, ...))``.

    ``insert_mode``: per side, keep the ``"first"`` value, the ``"last"``
    value, or every value (``"product"``: emit the cartesian product).
    ``emit_mode``: ``"complete"`` emits once every side has a value, then
    forgets the key; ``"final"`` emits what it has at EOF (missing sides are
    ``None``); ``"running"`` emits on every value (missing sides ``None``).
    """
    _check_join_modes(step_id, insert_mode, emit_mode)
    if not sides:
        raise TypeError(f"step {step_id!r}: join needs at least one side")
    tagged = [
        map_value(f"side_{i}", side, functools.partial(_tag_side, i))
        for i, side in enumerate(sides)
    ]
    merged = merge("merge", *tagged)
    count = len(sides)
    return _without_timers(
        stateful_batch(
            "join",
            merged,
            lambda resume: _JoinLogic(count, insert_mode, emit_mode, resume),
        )
    )
