"""Bounding the keyed state a worker keeps live: a key limit, a byte
budget, and how a byte budget becomes a key limit.

A live-key limit (``max_live_keys``) needs the user to know how large a
key's state is; a byte budget (``max_live_bytes``) asks the store to work
it out. :func:`owned_bytes` measures a sample of keys: each key's bytes are
those of the objects reachable from its state object and from no other
sampled key, so what keys share (their step's configuration, a shared
lookup table, cached small ints, interned strings) is not charged to each
of them. :class:`ByteBudget` turns the sample's mean into a key count. The
result is approximate by design: ``sys.getsizeof`` does not see every
allocator overhead, and a sample is a sample.
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import re
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence

__all__ = [
    "ByteBudget",
    "KEY_OVERHEAD_BYTES",
    "LiveLimit",
    "MAX_LIVE_BYTES_VAR",
    "MAX_LIVE_KEYS_VAR",
    "check_max_live_bytes",
    "check_max_live_keys",
    "format_size",
    "owned_bytes",
    "parse_size",
    "resolve_live_limit",
]

#: The variables that set a run's bounds when the caller gives none.
MAX_LIVE_KEYS_VAR = "MILLPOND_MAX_LIVE_KEYS"
MAX_LIVE_BYTES_VAR = "MILLPOND_MAX_LIVE_BYTES"


@dataclass(frozen=True)
class LiveLimit:
    """A run's bounds on each worker's live keyed state: at most ``keys``
    objects, about ``bytes`` bytes (either, both or neither)."""

    keys: Optional[int] = None
    bytes: Optional[int] = None

    def __bool__(self) -> bool:
        return self.keys is not None or self.bytes is not None

    def apply(self, store: Any) -> None:
        """Set these bounds on a :class:`~millpond.state.StateStore`."""
        store.limit_live_keys(self.keys)
        store.limit_live_bytes(self.bytes)

    def describe(self) -> str:
        """``"100000 keys"``, ``"about 512 MiB"``, or both, for log lines."""
        parts = []
        if self.keys is not None:
            parts.append(f"{self.keys} keys")
        if self.bytes is not None:
            parts.append(f"about {format_size(self.bytes)}")
        return " and ".join(parts) or "no bound"


def _check_bound(name: str, what: str, unset: str, value: Optional[int]) -> Optional[int]:
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be {what} of at least 1 (or None for {unset}), got {value!r}")
    return value


def check_max_live_keys(value: Optional[int]) -> Optional[int]:
    """Return ``value`` if it is a valid live-key limit (``None`` or an
    int of at least 1); raise ``ValueError`` naming it otherwise."""
    return _check_bound("max_live_keys", "a whole number", "no limit", value)


def check_max_live_bytes(value: Optional[int]) -> Optional[int]:
    """Return ``value`` if it is a valid byte budget (``None`` or an int of
    at least 1); raise ``ValueError`` naming it otherwise."""
    return _check_bound("max_live_bytes", "a whole number of bytes", "no budget", value)


def resolve_live_limit(
    max_live_keys: Optional[int], max_live_bytes: Optional[int], recovery_config: Any = None
) -> LiveLimit:
    """A run's bounds: each from the argument, else the recovery config's
    field of that name, else its variable (``MILLPOND_MAX_LIVE_KEYS``,
    ``MILLPOND_MAX_LIVE_BYTES``), else none. Raises ``ValueError`` naming a
    bad value and where it came from."""
    keys = _resolve(max_live_keys, recovery_config, "max_live_keys", MAX_LIVE_KEYS_VAR,
                    check_max_live_keys, _parse_count, "no limit")
    size = _resolve(max_live_bytes, recovery_config, "max_live_bytes", MAX_LIVE_BYTES_VAR,
                    check_max_live_bytes, parse_size, "no budget")
    return LiveLimit(keys, size)


def _resolve(value: Optional[int], config: Any, field: str, var: str, check: Callable[[Optional[int]], Optional[int]],
             parse: Callable[[str], int], unset: str) -> Optional[int]:
    if value is None:
        value = getattr(config, field, None)
    if value is not None:
        return check(value)
    raw = os.environ.get(var, "").strip()
    if not raw:
        return None
    try:
        return parse(raw)
    except ValueError as ex:
        raise ValueError(f"{var}={raw!r}: {ex}; unset it for {unset}") from None


def _parse_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("it is not a whole number of at least 1")
    return int(text)


#: Bytes charged per live key besides its objects: its entries in the
#: store's dicts (the live dict, the epoch's touched keys) and their share
#: of those dicts' tables.
KEY_OVERHEAD_BYTES = 120

#: The most objects walked from one key's state. A state that reaches more
#: is charged for these only (an underestimate).
WALK_LIMIT = 20_000

# Objects a walk never enters or charges: code and classes belong to the
# program, not to a key's state.
_STOP_TYPES = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
)
_SINGLETONS = frozenset(map(id, (None, True, False, NotImplemented, Ellipsis, (), "")))

_SHARED = -1

# A container that refers to more objects than this is walked into last.
_LARGE = 256


def owned_bytes(roots: Sequence[Any], walk_limit: int = WALK_LIMIT) -> List[int]:
    """The bytes of the objects reachable from each of ``roots`` and from no
    other root (``sys.getsizeof`` each, following ``gc.get_referents``).

    An object two roots reach counts for neither, nor does anything it
    leads to: with roots sampled from many keys, what every key refers to
    (configuration, caches, a shared table) is shared and what a key alone
    holds is its own. Classes, modules, functions and code are not entered.
    Each root's walk is breadth first, what large containers hold last, and
    stops after ``walk_limit`` objects; a walk that reaches an object an earlier root reached does not
    enter it again, so a large structure every key refers to is walked
    once, not once per root.
    """
    owner: Dict[int, int] = {}
    size: Dict[int, int] = {}
    visited: Dict[int, Any] = {}
    meeting: List[Any] = []  # objects a later root found an earlier one's
    for index, root in enumerate(roots):
        seen = {id(root)}
        # What large containers hold waits until everything else found is
        # walked: a key's state that refers to a large table would
        # otherwise spend its whole walk in the table.
        queue: Deque[Any] = collections.deque([root])
        later: Deque[Any] = collections.deque()
        walked = 0
        while (queue or later) and walked < walk_limit:
            obj = queue.popleft() if queue else later.popleft()
            walked += 1
            oid = id(obj)
            first = owner.get(oid)
            if first is not None:
                if first != index and first != _SHARED:
                    owner[oid] = _SHARED
                    meeting.append(obj)
                continue
            owner[oid] = index
            visited[oid] = obj
            size[oid] = _sizeof(obj)
            refs = _referents(obj)
            into, room = queue, len(refs)
            if room > _LARGE:
                # No more than the walk can still visit: a key referring to
                # a table of a million entries queues a few thousand of them.
                into, room = later, walk_limit - walked - len(later)
            for ref in refs:
                if room <= 0:
                    break
                rid = id(ref)
                if rid not in seen and rid not in _SINGLETONS and not isinstance(ref, _STOP_TYPES):
                    seen.add(rid)
                    into.append(ref)
                    room -= 1
    # What a shared object leads to is shared too, as far as the walks went.
    while meeting:
        for ref in _referents(meeting.pop()):
            rid = id(ref)
            if owner.get(rid, _SHARED) != _SHARED:
                owner[rid] = _SHARED
                meeting.append(visited[rid])
    totals = [0] * len(roots)
    for oid, index in owner.items():
        if index != _SHARED:
            totals[index] += size[oid]
    return totals


def _referents(obj: Any) -> List[Any]:
    refs = gc.get_referents(obj)
    if isinstance(obj, dict):
        # A dict whose keys are all str does not report its keys to the
        # collector (str cannot form cycles).
        refs.extend(obj)
    return refs


def _sizeof(obj: Any) -> int:
    # __sizeof__ may be a user's method; a broken one must not stop the
    # flow over an estimate.
    try:
        return sys.getsizeof(obj, 0)
    except Exception:  # noqa: BLE001
        return 0


_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes from ``"1500000"``, ``"512MiB"``, ``"2GB"``, ``"1.5G"``: KiB,
    MiB, GiB, TiB (and K, M, G, T) are powers of 1024, KB, MB, GB, TB
    powers of 1000. Raises ``ValueError`` naming what it could not read."""
    m = _SIZE.fullmatch(text)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None or (unit == 1 and "." in m.group(1)):
        raise ValueError(f"expected a size such as 1500000, 512MiB or 2GB, got {text!r}")
    value = int(float(m.group(1)) * unit)
    if value < 1:
        raise ValueError(f"expected a size of at least 1 byte, got {text!r}")
    return value


def format_size(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class ByteBudget:
    """What a byte budget allows, in live keys, from samples of the keys'
    sizes.

    :meth:`keys_for` measures up to ``sample`` keys (half from each end of
    the live dicts: the least and the most recently used) and returns how
    many keys of that mean size fit the budget (at least one). Successive
    measurements are averaged with the previous one, so one odd sample
    moves the limit by half as much.
    """

    def __init__(self, budget: int, sample: int = 64) -> None:
        if check_max_live_bytes(budget) is None:
            raise ValueError("a byte budget needs a number of bytes, not None")
        self.budget: int = budget
        self.sample = sample
        #: The last estimate of the bytes a live key takes (None: none yet).
        self.per_key: Optional[float] = None

    def keys_for(self, steps: Iterable[Dict[str, Any]]) -> Optional[int]:
        """The key count the budget allows, measured on a sample of the
        live dicts ``steps``; ``None`` while they hold fewer than two keys
        (a lone key cannot tell what it shares with others)."""
        dicts = [d for d in steps if d]
        total = sum(len(d) for d in dicts)
        if total < 2:
            return None
        keys: List[str] = []
        objs: List[Any] = []
        for d in dicts:
            share = max(1, self.sample * len(d) // total)
            if len(d) <= share:
                items = list(d.items())
            else:
                items = list(itertools.islice(d.items(), (share + 1) // 2))
                items += itertools.islice(reversed(d.items()), share // 2)
            for key, obj in items:
                keys.append(key)
                objs.append(obj)
        sizes = owned_bytes(objs)
        mean = sum(sizes[i] + sys.getsizeof(k) for i, k in enumerate(keys)) / len(keys) + KEY_OVERHEAD_BYTES
        self.per_key = mean if self.per_key is None else (self.per_key + mean) / 2
        return self.allowed()

    def allowed(self) -> int:
        """The key count the budget allows at the last estimate (before
        any: as if a key took only :data:`KEY_OVERHEAD_BYTES`)."""
        return max(1, int(self.budget / (self.per_key or KEY_OVERHEAD_BYTES)))
