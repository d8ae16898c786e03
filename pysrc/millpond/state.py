"""The per-worker state store that stateful operators use.

A stateful step registers a *builder* for its step id; the store keeps one
live state object per ``(step_id, key)`` and knows nothing else about the
operator. State objects are duck-typed: anything with a ``.snapshot()``
method (the :class:`Stateful` protocol). At an epoch's end the store calls
``.snapshot()`` on every object touched since the last snapshot, pickles the
results and hands the whole batch to the Go core in one call.

>>> import tempfile
>>> class Counter:
...     def __init__(self, resume_state):
...         self.n = resume_state or 0
...     def snapshot(self):
...         return self.n
>>> d = tempfile.mkdtemp()
>>> with StateStore.open(d, "wc") as store:
...     store.register("wc.count", Counter)
...     store.get_or_build("wc.count", "apple").n += 3
...     store.snapshot(epoch=1)
1
>>> with StateStore.open(d, "wc", resume_epoch=2) as store:
...     store.register("wc.count", Counter)
...     store.get("wc.count", "apple").n
3

:class:`MemoryStateStore` has the same methods and keeps state in memory
only; the runtime uses it when recovery is off.
"""

from __future__ import annotations

import copyreg
import functools
import gc as _pygc
import heapq
import itertools
import logging
import os
import pickle
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn, Optional, Protocol, Union, runtime_checkable

from millpond.errors import RecoveryError, SnapshotError, StateStoreError
from millpond.keygroup import DEFAULT_KEY_GROUP_COUNT
from millpond.livelimit import ByteBudget, check_max_live_bytes, check_max_live_keys

__all__ = ["Stateful", "Builder", "WorkerStore", "StateStore", "MemoryStateStore", "LiveStats"]

logger = logging.getLogger("millpond")

#: Snapshots are pickled with this protocol (out-of-band buffers aside, the
#: newest protocol is the fastest and most compact).
PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL

# Pickles are kept only from epochs that left more than this share of the
# live keys untouched (StateStore._keeps_pickles), and only by stores whose
# keys cost at least _KEEP_FROM_PACK_SECONDS a row to pack: copying a kept
# pickle costs about _COPY_SECONDS (dict lookups and a bytes object that is
# no longer in cache), so for small states (an int packs in 0.2-0.4 us)
# keeping them costs more than it saves.
_KEEP_UP_TO = 0.9
_KEEP_FROM_PACK_SECONDS = 1.0e-6
_COPY_SECONDS = 0.5e-6
# Rows a snapshot must pack for its time to tell what a row costs.
_PACK_COST_SAMPLE = 256
# What the Go core's merge of a batch into the state it carries costs, a
# carried row (sorting the batch, a pass over every row; 0.15-0.4 us
# measured, docs/benchmarks.md). An epoch written whole packs its untouched
# keys too, rather than having the core merge, when packing them costs less
# (StateStore._packs_rest): a word count over a small vocabulary touches
# nearly every key each epoch, and its states pack in well under 1 us.
_CARRY_SECONDS = 0.3e-6

#: The most a store keeps of its keys' last pickles in batch mode (see
#: :meth:`StateStore.snapshot`), counting about 64 bytes of overhead each:
#: enough for a few hundred thousand small states; a larger state keeps what
#: fits and packs the rest as before.
KEEP_PICKLES_BYTES = 64 << 20

# A store packs each key ahead, right after its activation (see
# StateStore.ahead_packer), when its keys cost at least this much a row to
# pack at the end of an epoch: there, among all the others, a key's objects
# are no longer in the cache, and a windowing key that packs in about 3 us
# right after its activation takes 5.7-9 us (docs/benchmarks.md).
_AHEAD_FROM_PACK_SECONDS = 2.0e-6
# Packing ahead stops for _AHEAD_PAUSE epochs when an epoch packed keys
# ahead more than _AHEAD_REPEATS times for each row the snapshot then copied:
# keys touched in many activations of an epoch are packed once, at its end.
_AHEAD_REPEATS = 2.0
_AHEAD_PAUSE = 8


def _reduce_timezone(tz: timezone) -> tuple[Any, ...]:
    return (timezone, tz.__getinitargs__())  # type: ignore[attr-defined]


# Pickling an aware datetime spent most of its time on the tzinfo: CPython's
# timezone has no __reduce__ of its own, so every pickle of one asked
# copyreg for its slot names, which copyreg cannot cache on a C type (about
# 2.6 us of a windowing key's 9 us snapshot). This reducer returns what that
# path computes, so pickles are the same bytes at every protocol (tested);
# only a reducer someone registered first is left alone.
if timezone not in copyreg.dispatch_table:
    copyreg.pickle(timezone, _reduce_timezone)

_MISSING: Any = object()


@runtime_checkable
class Stateful(Protocol):
    """A live state object: anything that can snapshot itself.

    ``snapshot()`` returns a picklable value that captures the object's state
    and is not mutated afterwards (the store may pickle it later in the same
    epoch). The step's builder turns that value back into a live object.
    """

    def snapshot(self) -> Any:
        """Return a picklable, effectively immutable copy of the state."""
        ...


#: ``builder(resume_state_or_None) -> Stateful``: ``None`` for a new key, the
#: last snapshot when the key is restored.
Builder = Callable[[Any], Any]


class WorkerStore(Protocol):
    """What the engine needs of a worker's state store: live objects per
    ``(step_id, key)``, built on demand from what is stored, and a snapshot
    of what an epoch touched. :class:`StateStore` (recovery on) and
    :class:`MemoryStateStore` (recovery off) both are one."""

    def register(self, step_id: str, builder: Builder, *, evictable: bool = False) -> None:
        """Use ``builder`` to build state objects of ``step_id`` (under a
        live-key limit, ``evictable`` steps' objects count and may be
        evicted)."""
        ...

    def get(self, step_id: str, key: str) -> Optional[Any]:
        """The live object of ``key`` (touched), or ``None``."""
        ...

    def peek(self, step_id: str, key: str) -> Optional[Any]:
        """The live object of ``key`` without touching it, or ``None``."""
        ...

    def get_or_build(self, step_id: str, key: str) -> Any:
        """The live object of ``key`` (touched), built anew if it has none."""
        ...

    def set(self, step_id: str, key: str, obj: Any) -> None:
        """Make ``obj`` the live object of ``key`` (touched)."""
        ...

    def discard(self, step_id: str, key: str) -> None:
        """Drop ``key``'s state; the next snapshot records a deletion."""
        ...

    def keys(self, step_id: str) -> list[str]:
        """Every key of ``step_id`` with state, live or stored, sorted."""
        ...

    def iter_keys(self, step_id: str) -> Iterator[str]:
        """Every key of ``step_id`` with state, sorted, streamed: stored keys
        are read a page at a time, so a step with more keys than memory
        can be visited."""
        ...

    def live_count(self) -> int:
        """How many state objects are live in memory."""
        ...

    def evictable_count(self) -> int:
        """How many live objects count against a live-key limit."""
        ...

    def hydrate_all(self, step_id: str, chunk_rows: int = 8192) -> int:
        """Build live objects for every stored key of ``step_id`` in one pass."""
        ...

    def prefetch(self, step_id: str, keys: Iterable[str]) -> int:
        """Make the stored state of ``keys`` live in one call; return how
        many were built. With a live-key limit it also marks them recently
        used."""
        ...

    def evict(self, epoch: int) -> int:
        """Over the live-key limit, drop the least recently used objects
        (writing changed ones at ``epoch`` first); return how many."""
        ...

    def ahead_packer(self, step_id: str) -> Optional[Callable[[str, Any], bool]]:
        """What the step's runtime calls with ``(key, obj)`` right after an
        activation changed ``key``'s state, or ``None``."""
        ...

    @property
    def max_live_keys(self) -> Optional[int]:
        """The bound on live objects, or ``None``."""
        ...

    def snapshot(self, epoch: int) -> int:
        """Write what was touched since the last snapshot; return the rows."""
        ...

    def close(self) -> None:
        """Release the store."""
        ...


class _LiveState:
    """Live objects, the touched set and pending deletions, per step.

    This is the hot path: ``get`` on a live key is two dict lookups and a set
    insertion. Subclasses supply persistence through ``_load``.
    """

    def __init__(self) -> None:
        self._builders: dict[str, Builder] = {}
        self._live: dict[str, dict[str, Any]] = {}
        # Touched keys per step, in first-touch order (a dict used as an
        # ordered set): snapshotting in that order follows how the objects
        # were allocated far more often than a set's hash order does, which
        # halves the time spent waiting on memory for large snapshots. A
        # key's value (its mark) is None, or its pickle once it was packed
        # ahead (see StateStore.ahead_packer) and not touched since.
        self._dirty: dict[str, dict[str, Optional[bytes]]] = {}
        self._deleted: dict[str, set[str]] = {}
        # Steps that may have keys stored but not live; other steps never
        # pay for a lookup on a miss.
        self._maybe_stored: set[str] = set()
        # Keys a prefetch looked up and did not find, per step: the per-key
        # path must not look them up again (valid until the next eviction
        # writes keys to the store).
        self._absent: dict[str, set[str]] = {}
        # The objects of the last eviction batch, per step, until the next
        # one: a key touched again soon after it was evicted comes back
        # from here, not from the store (where its row may still be on its
        # way).
        self._victims: dict[str, dict[str, Any]] = {}
        #: Counters of the live set: see :class:`LiveStats`.
        self.live_stats = LiveStats()
        # Steps whose objects a live-key limit counts and evicts.
        self._evictable: set[str] = set()
        self._closed = False

    # -- registration -------------------------------------------------------

    def register(self, step_id: str, builder: Builder, *, evictable: bool = False) -> None:
        """Register ``builder`` as the way to build state objects of ``step_id``.

        Registering the same step id again replaces the builder (live objects
        are kept). With ``evictable``, the step's objects count against a
        live-key limit and may be evicted (keyed state; not the positions of
        source and sink partitions, which their steps hold on to). Raises
        ``TypeError`` if ``builder`` is not callable.
        """
        self._check_open()
        if not isinstance(step_id, str) or not step_id:
            raise TypeError(f"step id must be a non-empty str, got {step_id!r}")
        if "\0" in step_id:
            raise ValueError(f"step id {step_id!r} may not contain NUL characters")
        try:
            step_id.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"step id {step_id!r} is not valid Unicode text (it holds a lone surrogate)") from None
        if not callable(builder):
            raise TypeError(f"builder for step {step_id!r} must be callable, got {builder!r}")
        self._builders[step_id] = builder
        if evictable:
            self._evictable.add(step_id)
        self._live.setdefault(step_id, {})
        self._dirty.setdefault(step_id, {})
        self._deleted.setdefault(step_id, set())

    def registered_steps(self) -> list[str]:
        """Return the step ids with a registered builder."""
        return sorted(self._builders)

    def ahead_packer(self, step_id: str) -> Optional[Callable[[str, Any], bool]]:
        """A function the step's runtime calls with ``(key, obj)`` right
        after an activation changed ``key``'s state, or ``None`` when this
        store does not pack ahead (see :meth:`StateStore.ahead_packer`)."""
        return None

    # -- access -------------------------------------------------------------

    def get(self, step_id: str, key: str) -> Optional[Any]:
        """Return the live state object of ``key``, or ``None`` if it has none.

        A key that is not live is hydrated through the step's builder from
        the newest stored snapshot. The key counts as touched: its object is
        snapshotted at the next :meth:`snapshot`.
        """
        try:
            live = self._live[step_id]
        except KeyError:
            raise self._unknown_step(step_id) from None
        obj = live.get(key, _MISSING)
        if obj is _MISSING:
            obj = self._hydrate(step_id, key)
            if obj is None:
                return None
        self._dirty[step_id][key] = None
        return obj

    def peek(self, step_id: str, key: str) -> Optional[Any]:
        """Like :meth:`get`, but the key does not count as touched: for a
        caller that only reads the object. Mutating it is not snapshotted
        unless the key is touched some other way."""
        try:
            live = self._live[step_id]
        except KeyError:
            raise self._unknown_step(step_id) from None
        obj = live.get(key, _MISSING)
        if obj is _MISSING:
            return self._hydrate(step_id, key)
        return obj

    def get_or_build(self, step_id: str, key: str) -> Any:
        """Like :meth:`get`, but build a new object with ``builder(None)`` if
        the key has no state."""
        try:
            live = self._live[step_id]
        except KeyError:
            raise self._unknown_step(step_id) from None
        obj = live.get(key, _MISSING)
        if obj is _MISSING:
            obj = self._hydrate(step_id, key)
            if obj is None:
                obj = self._builders[step_id](None)
                live[key] = obj
                self._deleted[step_id].discard(key)
        self._dirty[step_id][key] = None
        return obj

    def set(self, step_id: str, key: str, obj: Any) -> None:
        """Make ``obj`` the live state object of ``key`` (touched)."""
        try:
            live = self._live[step_id]
        except KeyError:
            raise self._unknown_step(step_id) from None
        self._check_key(step_id, key)
        if obj is None:
            raise TypeError(f"state of step {step_id!r} key {key!r} is None; use discard() to drop a key")
        if self._victims:
            self._drop_victim(step_id, key)
        live[key] = obj
        self._deleted[step_id].discard(key)
        self._dirty[step_id][key] = None

    def discard(self, step_id: str, key: str) -> None:
        """Drop ``key``'s state; the next snapshot records a deletion."""
        try:
            live = self._live[step_id]
        except KeyError:
            raise self._unknown_step(step_id) from None
        self._check_key(step_id, key)
        live.pop(key, None)
        if self._victims:
            self._drop_victim(step_id, key)
        self._deleted[step_id].add(key)
        self._dirty[step_id][key] = None

    def keys(self, step_id: str) -> list[str]:
        """Return every key of ``step_id`` with state, live or stored, sorted."""
        if step_id not in self._live:
            raise self._unknown_step(step_id)
        found = set(self._live[step_id])
        if step_id in self._maybe_stored:
            found.update(self._stored_keys(step_id))
            found.difference_update(self._deleted[step_id])
        return sorted(found)

    def iter_keys(self, step_id: str) -> Iterator[str]:
        """Like :meth:`keys`, streamed: stored keys come from the store a
        page at a time (in key order) and are merged with the live ones, so
        the keys of a step larger than memory can be visited. Keys made
        live or evicted while it runs are each yielded once; a key
        discarded meanwhile is skipped if it was not yielded yet."""
        if step_id not in self._live:
            raise self._unknown_step(step_id)
        if step_id not in self._maybe_stored:
            return iter(sorted(self._live[step_id]))
        return self._merged_keys(step_id)

    def _merged_keys(self, step_id: str) -> Iterator[str]:
        # Keys live now that the store may not hold yet; keys made live
        # later came from the store, so its scan has them.
        live = sorted(self._live[step_id])
        deleted = self._deleted[step_id]
        last: Optional[str] = None
        for key in heapq.merge(live, self._stored_keys(step_id)):
            if key == last or key in deleted:
                continue
            last = key
            yield key

    def live_count(self) -> int:
        """Return how many state objects are live in memory."""
        return sum(len(v) for v in self._live.values())

    def _drop_victim(self, step_id: str, key: str) -> None:
        victims = self._victims.get(step_id)
        if victims:
            victims.pop(key, None)

    def evictable_count(self) -> int:
        """Return how many live objects count against a live-key limit."""
        return sum(len(self._live[step_id]) for step_id in self._evictable)

    def dirty_count(self) -> int:
        """Return how many keys the next snapshot will write."""
        return sum(len(v) for v in self._dirty.values())

    # -- snapshots ----------------------------------------------------------

    def _raise_snapshot_error(self, cause: BaseException, whole: bool = False) -> NoReturn:
        """Raise :class:`SnapshotError` for a snapshot whose packing failed
        (nothing was written): naming the step and key whose ``.snapshot()``
        or pickling fails when the keys packed (the touched ones; every live
        one when the batch was ``whole``) are tried one by one, or with
        ``cause`` itself when none does."""
        for step_id, touched in self._dirty.items():
            live = self._live[step_id]
            for key in list(live if whole else touched):
                obj = live.get(key, _MISSING)
                if obj is _MISSING:
                    continue
                try:
                    pickle.dumps(obj.snapshot(), PICKLE_PROTOCOL)
                except Exception as exc:
                    raise SnapshotError(
                        f"cannot snapshot state of step {step_id!r} key {key!r}: "
                        f"{type(exc).__name__}: {exc}; make .snapshot() return a picklable value"
                    ) from exc
        raise SnapshotError(f"cannot snapshot the state store: {type(cause).__name__}: {cause}") from cause

    def _clear_dirty(self) -> None:
        for touched in self._dirty.values():
            touched.clear()
        for deleted in self._deleted.values():
            deleted.clear()

    # -- lifecycle ----------------------------------------------------------

    def __enter__(self) -> "_LiveState":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop all live state. Closing twice is a no-op."""
        self._closed = True
        self._victims = {}
        self._live = {}
        self._dirty = {}
        self._deleted = {}
        self._builders = {}

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # -- hooks and helpers --------------------------------------------------

    def _hydrate(self, step_id: str, key: str) -> Optional[Any]:
        """Build the live object of a non-live key from storage, or None."""
        self._check_key(step_id, key)
        if step_id not in self._maybe_stored or key in self._deleted[step_id]:
            return None
        victims = self._victims.get(step_id)
        if victims:
            obj = victims.pop(key, _MISSING)
            if obj is not _MISSING:
                self._live[step_id][key] = obj
                self.live_stats.victims_back += 1
                return obj
        absent = self._absent.get(step_id)
        if absent is not None and key in absent:
            return None
        state = self._load(step_id, key)
        if state is _MISSING:
            return None
        obj = self._builders[step_id](state)
        self._live[step_id][key] = obj
        return obj

    def _load(self, step_id: str, key: str) -> Any:
        """Return the stored snapshot of a key, or _MISSING."""
        return _MISSING

    def _stored_keys(self, step_id: str) -> Iterator[str]:
        return iter(())

    def _check_open(self) -> None:
        if self._closed:
            raise StateStoreError(f"{type(self).__name__} is closed")

    def _unknown_step(self, step_id: str) -> Exception:
        if self._closed:
            return StateStoreError(f"{type(self).__name__} is closed")
        return StateStoreError(
            f"step {step_id!r} has no registered builder; call register({step_id!r}, builder) first"
        )

    @classmethod
    def _check_key(cls, step_id: str, key: Any) -> None:
        """Refuse keys the store cannot persist; run once per new key."""
        if type(key) is not str:
            raise cls._bad_key(step_id, key)
        if not key.isascii():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"state key {key!r} of step {step_id!r} is not valid Unicode text "
                    "(it holds a lone surrogate); decode your input with errors='replace' or key on something else"
                ) from None

    @staticmethod
    def _bad_key(step_id: str, key: Any) -> TypeError:
        return TypeError(
            f"state key of step {step_id!r} must be str, got {type(key).__name__} {key!r}; "
            "key the stream with op.key_on first"
        )


class MemoryStateStore(_LiveState):
    """State in memory only, with :class:`StateStore`'s methods.

    Used when recovery is off: nothing is persisted, and :meth:`snapshot`
    only forgets which keys were touched (it neither calls ``.snapshot()``
    nor pickles, so a flow without recovery pays nothing for them).
    """

    def snapshot(self, epoch: int) -> int:
        """Forget which keys were touched; persist nothing and return 0."""
        self._check_open()
        self._clear_dirty()
        return 0

    def hydrate_all(self, step_id: str, chunk_rows: int = 8192) -> int:
        """Nothing is stored, so nothing is built: return 0."""
        if step_id not in self._builders:
            raise self._unknown_step(step_id)
        return 0

    def prefetch(self, step_id: str, keys: Iterable[str]) -> int:
        """Nothing is stored, so nothing is built: return 0."""
        return 0

    def evict(self, epoch: int) -> int:
        """Memory is the only place state lives: nothing is evicted."""
        return 0

    @property
    def max_live_keys(self) -> Optional[int]:
        """Always ``None``: a memory store keeps every key live."""
        return None


PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class LiveStats:
    """What a store's live-key limit did, counted since it opened."""

    #: Keys dropped from memory by :meth:`StateStore.evict`.
    evicted: int = 0
    #: Eviction passes (each drops a batch of keys).
    evictions: int = 0
    #: Evicted keys written first (changed since their last snapshot).
    spilled: int = 0
    #: Keys built from the store by :meth:`StateStore.prefetch`.
    hydrated: int = 0
    #: Multi-get calls that built them.
    hydrate_calls: int = 0
    #: Keys looked up one at a time (outside a prefetch).
    single_gets: int = 0
    #: Evicted keys touched again before the next eviction: back from
    #: memory, without a read.
    victims_back: int = 0


class StateStore(_LiveState):
    """A worker's state store over the Go core's local store.

    Open it with :meth:`open`. Rows live in a SQLite file under
    ``local_state_dir/<flow_id>/worker-NNNN/``; only one process may have it
    open (a second gets :class:`~millpond.errors.StoreLockedError` naming the
    holder's pid), and a store written by another flow or key-group count is
    refused with :class:`~millpond.errors.ForeignStoreError`.
    """

    def __init__(self, handle: int, flow_id: str, worker_index: int, worker_count: int,
                 key_group_count: int, resume_epoch: Optional[int], path: Path) -> None:
        from millpond import _core
        super().__init__()
        self._handle: Optional[int] = handle
        self.flow_id = flow_id
        self.worker_index = worker_index
        self.worker_count = worker_count
        self.key_group_count = key_group_count
        self.resume_epoch = resume_epoch
        self.path = path
        self._stored_steps: set[str] = set(_core.store_steps(handle))
        #: Seconds spent in the last snapshot: packing and pickling
        #: ("python") and handing the batch to the Go core ("go").
        self.last_snapshot_timing: dict[str, float] = {"python": 0.0, "go": 0.0}
        #: Whether the last snapshot wrote every key with state (see
        #: :meth:`snapshot`).
        self.last_snapshot_whole = False
        #: Rows (writes and deletions) every snapshot of this store wrote,
        #: for the metrics endpoint.
        self.snapshot_rows = 0
        #: When set, a snapshot that touches at least this share of the live
        #: keys snapshots the untouched ones too, so that the batch is the
        #: whole state. The recovery run sets it in batch mode, where a whole
        #: epoch spares a compaction that would rewrite all of it.
        self.whole_from: Optional[float] = None
        #: Rows of the last snapshot copied from kept pickles (see
        #: :meth:`snapshot`) rather than packed from their objects, and of
        #: every snapshot of this store.
        self.last_snapshot_reused = 0
        self.snapshot_rows_copied = 0
        #: Rows of the last snapshot that the core added from the state it
        #: carries (an epoch written whole from its touched keys, see
        #: :meth:`snapshot`; -1 when the last one was not), and of every
        #: snapshot of this store.
        self.last_snapshot_carried = -1
        self.snapshot_rows_carried = 0
        # Whether the core was told to carry nothing (a bounded store).
        self._carry_stopped = False
        # With whole_from set: each key's last pickle, per step, kept while
        # the key is not touched (see snapshot), and the bytes they hold.
        self._packed: dict[str, dict[str, bytes]] = {}
        self._packed_bytes = 0
        # [bytes the pickles packed ahead since the last snapshot hold (in
        # self._dirty, as the keys' marks), their budget, keys packed ahead
        # since the last snapshot]: shared with the ahead packers, which
        # update it.
        self._acct: list[int] = [0, KEEP_PICKLES_BYTES, 0]
        # The ahead packer of each step, while this store packs ahead, and
        # the first epoch after a pause that may pack ahead again.
        self._ahead: dict[str, Callable[[str, Any], bool]] = {}
        self._ahead_after = 0
        #: Rows of the last snapshot that were packed ahead, and of every
        #: snapshot of this store.
        self.last_snapshot_ahead = 0
        self.snapshot_rows_ahead = 0
        # Seconds a row the last snapshot that packed enough rows took to
        # pack them (None until one did).
        self._pack_cost: Optional[float] = None
        # The live-key limit evict() keeps to: the smaller of the user's
        # key limit and what the byte budget allows at its last estimate.
        self._max_live: Optional[int] = None
        self._key_cap: Optional[int] = None
        self._bytes: Optional[ByteBudget] = None
        # When the byte budget was last measured: the epoch and the live
        # count then.
        self._measured: tuple[int, int] = (-1, 0)
        self._budget_warned = False

    @classmethod
    def open(
        cls,
        local_state_dir: PathLike,
        flow_id: str,
        worker_index: int = 0,
        worker_count: int = 1,
        resume_epoch: Optional[int] = None,
        *,
        key_group_count: int = DEFAULT_KEY_GROUP_COUNT,
        execution: int = 0,
    ) -> "StateStore":
        """Open (or create) the store of worker ``worker_index`` of a flow.

        With ``resume_epoch`` E, each key shows its newest row with epoch < E;
        rows at or after E belong to an epoch that never committed and are
        rolled back. ``None`` keeps every row. Raises ``ValueError`` for a bad
        flow id or worker layout and :class:`~millpond.errors.StateStoreError`
        for a missing directory.
        """
        from millpond import _core
        if not isinstance(flow_id, str) or not flow_id or any(c in flow_id for c in "./\\\0"):
            raise ValueError(f"flow id {flow_id!r} must be a non-empty str without '.', '/' or '\\'")
        if key_group_count < 1:
            raise ValueError(f"key_group_count must be at least 1, got {key_group_count}")
        if not 0 < worker_count <= key_group_count:
            raise ValueError(
                f"worker_count must be between 1 and the key-group count {key_group_count}, got {worker_count}"
            )
        if not 0 <= worker_index < worker_count:
            raise ValueError(f"worker_index {worker_index} is out of range for {worker_count} workers")
        if resume_epoch is not None and (type(resume_epoch) is not int or resume_epoch < 1):
            raise ValueError(f"resume_epoch must be at least 1 (epochs start at 1), got {resume_epoch}")
        directory = Path(local_state_dir)
        handle = _core.store_open(
            str(directory), flow_id, worker_index, worker_count, key_group_count,
            execution, resume_epoch or 0,
        )
        path = directory / flow_id / f"worker-{worker_index:04d}" / "store.sqlite"
        return cls(handle, flow_id, worker_index, worker_count, key_group_count, resume_epoch, path)

    def register(self, step_id: str, builder: Builder, *, evictable: bool = False) -> None:
        super().register(step_id, builder, evictable=evictable)
        if step_id in self._stored_steps:
            self._maybe_stored.add(step_id)

    @property
    def max_live_keys(self) -> Optional[int]:
        """The most live objects the store keeps between activations
        (``None``: no bound): the key limit of :meth:`limit_live_keys`, or
        what the byte budget of :meth:`limit_live_bytes` allows at its
        latest estimate, whichever is smaller."""
        return self._max_live

    @property
    def max_live_bytes(self) -> Optional[int]:
        """The byte budget of :meth:`limit_live_bytes` (``None``: none)."""
        return self._bytes.budget if self._bytes is not None else None

    @property
    def live_key_bytes(self) -> Optional[float]:
        """With a byte budget: the latest estimate of the bytes a live key
        takes (``None`` before the first)."""
        return self._bytes.per_key if self._bytes is not None else None

    @property
    def live_bytes_estimate(self) -> Optional[int]:
        """With a byte budget: the estimated bytes of the live keyed state
        (the latest estimate of a key's bytes times the live keys)."""
        if self._bytes is None or self._bytes.per_key is None:
            return None
        return int(self._bytes.per_key * self.evictable_count())

    def limit_live_keys(self, max_live_keys: Optional[int]) -> None:
        """Bound the live objects to ``max_live_keys`` (``None``: no bound).

        Over the bound, :meth:`evict` drops the least recently used ones,
        writing those changed since their last snapshot first; they come
        back from the store when touched again. Raises ``ValueError`` for a
        bound below 1.
        """
        self._key_cap = check_max_live_keys(max_live_keys)
        self._apply_caps()

    def limit_live_bytes(self, max_live_bytes: Optional[int]) -> None:
        """Bound the live keyed state to about ``max_live_bytes`` bytes
        (``None``: no budget), as a key limit worked out from a sample of
        the live keys (:mod:`millpond.livelimit`), measured again each epoch
        and before each eviction. At least one key stays live whatever the
        budget. Raises ``ValueError`` for a budget below 1.
        """
        budget = check_max_live_bytes(max_live_bytes)
        self._bytes = ByteBudget(budget) if budget is not None else None
        self._measured = (-1, 0)
        self._apply_caps()

    def _apply_caps(self) -> None:
        caps = [c for c in (self._key_cap, self._bytes.allowed() if self._bytes is not None else None) if c]
        self._max_live = min(caps) if caps else None
        if self._max_live is not None:
            # Kept pickles are memory the bound does not count (and an
            # evicting store's epochs are not whole): see _keeps_pickles.
            # So are pickles packed ahead.
            self._forget_packed()
            self._ahead = {}
            # So is the core's copy of the state, carried for whole epochs.
            if not self._carry_stopped and self._handle is not None:
                from millpond import _core
                _core.store_carry_off(self._handle)
                self._carry_stopped = True

    def _measure_budget(self, epoch: int, total: int) -> None:
        """Estimate a key's bytes again, if the epoch changed, the live keys
        doubled, or an eviction is due, since the last estimate."""
        budget = self._bytes
        assert budget is not None
        last_epoch, last_total = self._measured
        limit = self._max_live
        if epoch == last_epoch and total < 2 * last_total and (limit is None or total <= limit):
            return
        if budget.keys_for(self._live[step_id] for step_id in self._evictable) is None:
            return
        self._measured = (epoch, total)
        self._apply_caps()
        per_key = budget.per_key or 0.0
        if per_key > budget.budget and not self._budget_warned:
            self._budget_warned = True
            logger.warning(
                "worker %d: max_live_bytes %d is less than one key's state (about %d bytes): one key stays live",
                self.worker_index, budget.budget, per_key,
            )

    def prefetch(self, step_id: str, keys: Iterable[str]) -> int:
        """Build the live objects of the stored ``keys`` that are not live,
        in one call to the core (a multi-get), and return how many it built.

        A caller about to touch a batch of keys calls this first: each key
        then costs a dict lookup instead of a lookup in the store. Keys the
        store does not hold are remembered as absent until the next
        eviction, so touching them looks nothing up either. With a live-key
        limit, the keys also become the most recently used.
        """
        live = self._live.get(step_id)
        if live is None:
            raise self._unknown_step(step_id)
        from millpond import _core
        missing: list[str]
        if self._max_live is not None:
            # Least recently used first: the live dict's order. A touched
            # key moves to its end (a pop and an insert, in the core's C).
            missing = _core.touch_keys(live, keys)
        elif step_id in self._maybe_stored:
            # The core call skips live keys itself.
            missing = keys if type(keys) is list else list(keys)
        else:
            return 0
        if not missing or step_id not in self._maybe_stored:
            return 0
        # Pending deletions are skipped by the core call (its skip set);
        # they are never among the victims (discard drops them).
        deleted = self._deleted[step_id]
        victims = self._victims.get(step_id)
        if victims:
            still: list[str] = []
            for key in missing:
                obj = victims.pop(key, _MISSING)
                if obj is _MISSING:
                    still.append(key)
                else:
                    live[key] = obj
            self.live_stats.victims_back += len(missing) - len(still)
            if not still:
                return 0
            missing = still
        absent: set[str] = set()
        try:
            built = int(_core.store_hydrate_keys(
                self._require_handle(), step_id, missing, live, deleted, self._builders[step_id], pickle.loads,
                absent,
            ))
        except UnicodeEncodeError:
            # A key the store cannot hold: the per-key path names it.
            return 0
        stats = self.live_stats
        stats.hydrated += built
        stats.hydrate_calls += 1
        if absent:
            self._absent[step_id] = absent
        else:
            self._absent.pop(step_id, None)
        return built

    def evict(self, epoch: int) -> int:
        """Over the live-key limit, drop the least recently used objects;
        return how many went.

        Eviction runs in batches: from over the limit down to 80% of it
        (at least one below it), so the next new keys do not each cost an
        eviction. The objects of the batch stay reachable until the next
        eviction (so live and just-evicted objects together stay within
        the limit): a key touched again soon comes back without a read. Objects changed
        since their last snapshot are written first, at ``epoch`` (the epoch
        in progress: like any row of an epoch that never commits, they are
        rolled back if it does not). Committed state is the same whichever
        keys were live.
        """
        if self._max_live is None:
            return 0
        total = self.evictable_count()
        if self._bytes is not None:
            self._measure_budget(epoch, total)
        limit = self._max_live
        if limit is None or total <= limit:
            return 0
        excess = total - (limit - max(1, limit // 5))
        victims: dict[str, list[str]] = {}
        for step_id in self._evictable:
            live = self._live[step_id]
            share = min(len(live), -(-excess * len(live) // total))
            if share:
                victims[step_id] = list(itertools.islice(live, share))
        changed: dict[str, dict[str, Optional[bytes]]] = {}
        for step_id, keys in victims.items():
            dirty = self._dirty[step_id]
            written = dict.fromkeys(key for key in keys if key in dirty)
            if written:
                changed[step_id] = written
        if changed:
            self._write(self._spill_epoch(epoch), changed)
        count = 0
        self._victims = {}
        for step_id, keys in victims.items():
            live, dirty = self._live[step_id], self._dirty[step_id]
            kept = self._victims[step_id] = {}
            for key in keys:
                kept[key] = live.pop(key)
                dirty.pop(key, None)
            count += len(keys)
            self._stored_steps.add(step_id)
            self._maybe_stored.add(step_id)
        # Keys found absent may be stored now.
        self._absent.clear()
        stats = self.live_stats
        stats.evicted += count
        stats.evictions += 1
        stats.spilled += sum(len(w) for w in changed.values())
        return count

    def _spill_epoch(self, epoch: int) -> int:
        """The epoch evicted changes are written at."""
        return epoch

    def _write(
        self,
        epoch: int,
        touched: dict[str, dict[str, Optional[bytes]]],
        whole: bool = False,
        keep: bool = False,
        topped_up: bool = False,
        marked: bool = False,
        carried: bool = False,
    ) -> tuple[int, float, float]:
        """Write ``touched`` (keys per step; a key not live is a deletion)
        at ``epoch`` in one call; return the rows written and the seconds
        spent packing and handing them to the core. A ``whole`` batch is
        every live key instead, in live order, and the pending deletions.
        With ``carried`` (and not ``whole``), the core writes the batch as
        the whole state, merged into the state it carries (see
        :meth:`_carried`); :attr:`last_snapshot_carried` counts the rows
        it added (-1 when it wrote the batch as it is).

        With ``keep``, every key packed has its pickle kept in
        ``self._packed``, and when the whole batch is ``topped_up`` a live
        key ``touched`` does not hold is written from there if it was kept.
        With ``marked``, a key whose mark in ``touched`` is a pickle (packed
        ahead) is written from it.

        Each pickle.dumps allocates a pickler the cyclic collector tracks,
        so a large write would set off collections that walk the whole
        heap, for objects that are garbage at once and in no cycle:
        collection waits until the batch is packed.
        """
        from millpond import _core
        handle = self._require_handle()
        collecting = _pygc.isenabled()
        _pygc.disable()
        try:
            mode = 1 if whole else 2 if carried else 0
            written, pack_s, write_s, reused, held, ahead, added = _core.store_snapshot(
                handle, epoch, touched, self._live, pickle.dumps, PICKLE_PROTOCOL, mode,
                self._packed if keep else None, topped_up, KEEP_PICKLES_BYTES, self._packed_bytes,
                self._deleted if whole else None, marked,
            )
        except BaseException as exc:
            # Which kept pickles the failed call replaced is not known.
            self._forget_packed()
            if isinstance(exc, (StateStoreError, RecoveryError)) or not isinstance(exc, Exception):
                raise
            # Packing failed in user code (.snapshot() or pickling) and
            # nothing was written: find the step and key to name.
            self._raise_snapshot_error(exc, whole)
        finally:
            if collecting:
                _pygc.enable()
        if keep:
            self._packed_bytes = held
        # (the core counts both kinds of rows it copied as reused)
        self.last_snapshot_reused = reused - ahead
        self.last_snapshot_ahead = ahead
        self.last_snapshot_carried = added
        return int(written), pack_s, write_s

    def _forget_packed(self) -> None:
        self._packed = {}
        self._packed_bytes = 0

    def ahead_packer(self, step_id: str) -> Optional[Callable[[str, Any], bool]]:
        """A function the step's runtime calls with ``(key, obj)`` right
        after an activation changed ``key``'s state, or ``None``.

        Packing a key at the end of the epoch, among all the others, waits
        on memory for its objects; right after its activation they are in
        the cache, and packing costs several times less. So in batch mode
        a store whose keys take long to pack (at least
        ``_AHEAD_FROM_PACK_SECONDS`` a row, measured at its snapshots) packs
        each key as its activation ends: the pickle becomes the key's mark
        among the touched keys (up to ``KEEP_PICKLES_BYTES`` of them an
        epoch), and the snapshot writes it as it is unless the key was
        touched again since (its mark is then cleared). Its runtime asks at
        each activation (the packer changes as snapshots decide). An epoch
        that packed keys ahead many times for each row its snapshot wrote
        from them (keys changed in many activations) pauses this for a few
        epochs.
        """
        return self._ahead.get(step_id)

    def _plan_ahead(self, epoch: int, packed_ahead: int) -> None:
        """Decide, after the snapshot at ``epoch``, whether the next epoch
        packs ahead (:meth:`ahead_packer`): ``packed_ahead`` keys were
        packed ahead during this one."""
        self._ahead = {}
        if packed_ahead > _AHEAD_REPEATS * max(self.last_snapshot_ahead, 1):
            self._ahead_after = epoch + _AHEAD_PAUSE
        # (a cost not measured yet counts as none)
        cost = self._pack_cost or 0.0
        bounded = self._max_live is not None or self._bytes is not None
        if self.whole_from is None or bounded or cost < _AHEAD_FROM_PACK_SECONDS or epoch < self._ahead_after:
            return
        from millpond import _core
        for step_id, marks in self._dirty.items():
            self._ahead[step_id] = functools.partial(
                _core.pack_ahead, marks, self._acct, pickle.dumps, PICKLE_PROTOCOL)

    def snapshot(self, epoch: int) -> int:
        """Persist every touched key at ``epoch`` in one call; return the rows written.

        ``.snapshot()`` is called on each touched object, the results are
        pickled and written in one transaction together with deletions of
        discarded keys. Afterwards :attr:`last_snapshot_whole` tells whether
        the batch was the store's whole state (every key with state was
        touched, and no stored key is left unread): the recovery layer then
        keeps that epoch as compacted state instead of compacting again.
        If any object cannot be snapshotted or pickled,
        :class:`~millpond.errors.SnapshotError` names its step and key and
        nothing of the batch is written.

        With :attr:`whole_from` set, each key's pickle is kept (up to
        ``KEEP_PICKLES_BYTES`` in all) until the key is touched again: a key
        not touched since its last snapshot packs to the same bytes, so a
        top-up writes those instead of calling ``.snapshot()`` and pickling
        again. :attr:`last_snapshot_reused` counts them. An epoch that
        touched nearly every key, or few of them, keeps nothing (and drops
        what was kept): top-ups would copy little of it; nor does a store
        whose states pack in less than about 1 us a row, which is not much
        more than copying a kept pickle costs.
        """
        self._require_handle()
        if type(epoch) is not int or epoch < 1:
            raise ValueError(f"snapshot epoch must be an int of at least 1 (epochs start at 1), got {epoch!r}")
        live_keys = sum(len(live) for live in self._live.values())
        touched = sum(len(d) - len(self._deleted[s]) for s, d in self._dirty.items())
        packed_ahead = self._acct[2]
        if self._carried():
            # The core merges the touched keys into the state it carries:
            # nothing untouched is handed over, so nothing is kept for it.
            # Or, when that costs it more than packing the few keys left
            # untouched costs here, the epoch is packed whole, which the core
            # then carries as it is.
            if self._packed:
                self._forget_packed()
            wanted = self._is_whole(live_keys, touched)
            if wanted and self._packs_rest(live_keys, touched):
                written, pack_s, write_s = self._write(epoch, self._dirty, True, marked=packed_ahead > 0)
                whole = True
            else:
                written, pack_s, write_s = self._write(
                    epoch, self._dirty, marked=packed_ahead > 0, carried=wanted)
                whole = self.last_snapshot_carried >= 0
        else:
            may_be_whole = self._may_be_whole()
            keep = self._keeps_pickles(may_be_whole, live_keys, touched)
            if not keep and self._packed:
                self._forget_packed()
            whole = may_be_whole and self._is_whole(live_keys, touched)
            written, pack_s, write_s = self._write(
                epoch, self._dirty, whole, keep, topped_up=touched < live_keys, marked=packed_ahead > 0)
        self.last_snapshot_timing = {"python": pack_s, "go": write_s}
        self.last_snapshot_whole = whole
        self.snapshot_rows += written
        self.snapshot_rows_copied += self.last_snapshot_reused
        self.snapshot_rows_ahead += self.last_snapshot_ahead
        carried = max(0, self.last_snapshot_carried)
        self.snapshot_rows_carried += carried
        # Rows written from pickles made before (kept, or packed ahead)
        # cost a copy each, rows the core carried nothing here; the rest
        # tell what packing a row costs.
        copied = self.last_snapshot_reused + self.last_snapshot_ahead
        packed = written - carried - copied
        if packed >= _PACK_COST_SAMPLE:
            self._pack_cost = max(0.0, pack_s - copied * _COPY_SECONDS) / packed
        # Keys written by this store stay live unless evicted (which marks
        # their step as stored), so steps first written now never need a
        # lookup on a miss.
        self._clear_dirty()
        self._acct[0] = self._acct[2] = 0
        self._plan_ahead(epoch, packed_ahead)
        return written

    def _carried(self) -> bool:
        """Whether the core carries this store's whole state (batch mode
        in a recovery run, from a fresh start or the last whole batch, while
        it fits the core's budget), so that an epoch is written whole from
        its touched keys alone. A store with a live-key limit or byte budget
        never asks (and tells the core to carry nothing, see _apply_caps):
        the core's copy of every key is memory its bound does not count."""
        if self.whole_from is None or self._max_live is not None:
            return False
        from millpond import _core
        return bool(_core.store_carries(self._require_handle()))

    def _packs_rest(self, live_keys: int, touched: int) -> bool:
        """Whether an epoch to be written whole (the caller checked
        :meth:`_is_whole`) while the core carries the state packs every live
        key, the untouched ones too, instead of handing over the touched
        ones for the core to merge: when packing the untouched ones, at this
        store's measured cost a row, costs less than the core's pass over
        every carried row (_CARRY_SECONDS), or when there are none. Until a
        snapshot measured the cost, the core merges."""
        if not self._may_be_whole():
            return False
        untouched = max(0, live_keys - touched)
        if untouched == 0:
            return True
        cost = self._pack_cost
        return cost is not None and untouched * cost < live_keys * _CARRY_SECONDS

    def _may_be_whole(self) -> bool:
        """Whether every step with stored rows was read in full, so that
        the live keys are all the state (a stored key never read is state a
        batch of live keys would leave out)."""
        for step_id in self._stored_steps:
            if step_id not in self._live or step_id in self._maybe_stored:
                return False
        return True

    def _keeps_pickles(self, may_be_whole: bool, live_keys: int, touched: int) -> bool:
        """Whether this snapshot keeps the pickles it packs (see
        :meth:`snapshot`). Keeping one costs 0.3-0.6 us (docs/benchmarks.md), paid back only
        when a later top-up copies it, so pickles are kept in batch mode
        when this epoch touched a share of the keys that makes top-ups
        likely (at least half of ``whole_from``) and left enough untouched
        (more than ``1 - _KEEP_UP_TO``) for them to copy: an epoch that
        touches nearly every key, as a word count over a small vocabulary
        does, keeps nothing, nor does one that touches a few keys. Nor does
        a store whose keys pack faster than a kept pickle would pay back
        (small states: see _KEEP_FROM_PACK_SECONDS), nor one with a
        live-key limit or byte budget."""
        share = self.whole_from
        if share is None or not may_be_whole or live_keys == 0:
            return False
        # Kept pickles are memory a live-key limit or byte budget does not
        # count: a bounded store keeps none, whether or not it evicted yet.
        if self._max_live is not None:
            return False
        if self._pack_cost is not None and self._pack_cost < _KEEP_FROM_PACK_SECONDS:
            return False
        return share / 2 * live_keys <= touched <= _KEEP_UP_TO * live_keys

    def _is_whole(self, live_keys: int, touched: int) -> bool:
        """Whether this snapshot is the whole state (:meth:`_may_be_whole`
        holds), topped up to be when it is not already.

        It is whole when every live key is touched (discarded keys are the
        only touched keys not live). With :attr:`whole_from` set, touching at
        least that share of the live keys is enough: the rest are written
        too, since writing them costs less than compacting what the batch
        already rewrote. A whole batch visits the objects in the order they
        were made (the live dict's): in the order an epoch first touched
        them, a snapshot that visits most of them misses the cache on nearly
        every one (three to five times slower). ``live_keys`` and
        ``touched`` count the live keys and the touched keys that are live.
        """
        share = self.whole_from
        return touched >= live_keys or (share is not None and touched >= share * live_keys)

    def hydrate_all(self, step_id: str, chunk_rows: int = 8192) -> int:
        """Build live objects for every stored key of ``step_id``; return how many.

        Rows stream from the Go core a page at a time while the next page is
        read ahead, so memory stays bounded by what becomes live. Keys that
        are already live keep their live object.
        """
        from millpond import _core
        handle = self._require_handle()
        if step_id not in self._builders:
            raise self._unknown_step(step_id)
        if step_id not in self._maybe_stored:
            return 0
        builder = self._builders[step_id]
        live = self._live[step_id]
        scan = _core.scan_open(handle, step_id, chunk_rows)
        count = 0
        # The cyclic collector runs every few hundred allocations and, as
        # objects pile up, walks all of them again in its older generations:
        # on a million keys it took 40% of the restore. Freshly built state
        # holds no garbage, so collection waits until the restore is done.
        collecting = _pygc.isenabled()
        _pygc.disable()
        try:
            while True:
                built = _core.scan_hydrate(scan, live, self._deleted[step_id], builder, pickle.loads)
                if built is None:
                    break
                count += built
        finally:
            if collecting:
                _pygc.enable()
            _core.scan_close(scan)
        # Every stored key is live now; misses need no lookup.
        self._maybe_stored.discard(step_id)
        return count

    def stats(self) -> dict[str, int]:
        """Return the store's metadata and row counts (rows, deletions, bytes, epochs)."""
        from millpond import _core
        return _core.store_meta(self._require_handle())

    def gc(self, committed_epoch: int) -> int:
        """Remove rows superseded at or before ``committed_epoch``; return how many."""
        from millpond import _core
        return _core.store_gc(self._require_handle(), committed_epoch)

    def close(self) -> None:
        """Close the store and release its lock. Unsnapshotted changes are lost."""
        from millpond import _core
        handle, self._handle = self._handle, None
        super().close()
        if handle is not None:
            _core.store_close(handle)

    def __del__(self) -> None:  # a forgotten store must not keep its lock
        if getattr(self, "_handle", None) is not None:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing useful to do at teardown
                pass

    # -- internals ----------------------------------------------------------

    def _require_handle(self) -> int:
        if self._handle is None:
            raise StateStoreError("StateStore is closed")
        return self._handle

    def _load(self, step_id: str, key: str) -> Any:
        from millpond import _core
        found = _core.store_get(self._require_handle(), step_id, key)
        self.live_stats.single_gets += 1
        if found is None or found[1] is None:
            return _MISSING
        return pickle.loads(found[1])

    def _stored_keys(self, step_id: str) -> Iterator[str]:
        for page in self._pages(self._require_handle(), step_id, 8192):
            for key, _ in page:
                yield key

    def _pages(self, handle: int, step_id: str, chunk_rows: int) -> Iterator[list[tuple[str, Optional[bytes]]]]:
        from millpond import _core
        scan = _core.scan_open(handle, step_id, chunk_rows)
        try:
            while True:
                page = _core.scan_next(scan)
                if page is None:
                    return
                yield page
        finally:
            _core.scan_close(scan)
