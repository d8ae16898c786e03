"""``TTLCache``: the cache behind :func:`millpond.operators.enrich_cached`.

A ``TTLCache`` wraps a slow lookup (``v_getter(key) -> value``: a database,
an HTTP API, a file) and remembers each value for ``ttl``. ``get(k)`` returns
the cached value while it is fresh and calls ``v_getter`` again once it is
older than ``ttl``; ``remove(k)`` forgets a key so the next ``get`` looks it
up again. The clock is ``now_getter()``, so tests can drive expiry with
:class:`millpond.testing.TimeTestingGetter` instead of sleeping:

>>> from datetime import datetime, timedelta, timezone
>>> from millpond.testing import TimeTestingGetter
>>> clock = TimeTestingGetter(datetime(2024, 1, 1, tzinfo=timezone.utc))
>>> calls = []
>>> def lookup(k):
...     calls.append(k)
...     return k.upper()
>>> cache = TTLCache(lookup, clock.get, timedelta(minutes=1))
>>> cache.get("a"), cache.get("a"), calls
('A', 'A', ['a'])
>>> clock.advance(timedelta(minutes=2))
>>> cache.get("a"), calls
('A', ['a', 'a'])

The cache is not recovery state: a resumed run starts with an empty cache
and looks values up again.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Callable, Dict, Generic, Hashable, Tuple, TypeVar

__all__ = ["TTLCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class TTLCache(Generic[K, V]):
    """Values of ``v_getter(key)``, each kept for ``ttl`` after it was fetched.

    ``now_getter`` (default: the system clock, UTC) tells the time; a value
    fetched at ``t`` is fresh while ``now_getter() - t <= ttl``. The default
    ``ttl`` (``timedelta.max``) never expires. ``ValueError`` for a negative
    ``ttl``, ``TypeError`` for a ``ttl`` that is not a ``timedelta`` or a
    getter that is not callable. An exception from ``v_getter`` propagates
    and caches nothing.
    """

    def __init__(
        self,
        v_getter: Callable[[K], V],
        now_getter: Callable[[], datetime] = _utcnow,
        ttl: timedelta = timedelta.max,
    ) -> None:
        if not callable(v_getter):
            raise TypeError(f"TTLCache: v_getter must be callable; got {type(v_getter).__name__}")
        if not callable(now_getter):
            raise TypeError(f"TTLCache: now_getter must be callable; got {type(now_getter).__name__}")
        if not isinstance(ttl, timedelta):
            raise TypeError(f"TTLCache: ttl must be a timedelta; got {type(ttl).__name__}: {ttl!r:.80}")
        if ttl < timedelta(0):
            raise ValueError(f"TTLCache: ttl must not be negative; got {ttl}")
        self._v_getter = v_getter
        self._now_getter = now_getter
        self._ttl = ttl
        self._cache: Dict[K, Tuple[datetime, V]] = {}

    def get(self, k: K) -> V:
        """The value for ``k``: cached if fresh, else fetched with ``v_getter``."""
        now = self._now_getter()
        hit = self._cache.get(k)
        if hit is not None:
            fetched, v = hit
            if now - fetched <= self._ttl:
                return v
        v = self._v_getter(k)
        self._cache[k] = (now, v)
        return v

    def remove(self, k: K) -> None:
        """Forget ``k`` (nothing happens if it is not cached)."""
        self._cache.pop(k, None)

    def __len__(self) -> int:
        return len(self._cache)

    def __contains__(self, k: object) -> bool:
        return k in self._cache

    def __repr__(self) -> str:
        return f"TTLCache({len(self._cache)} keys, ttl={self._ttl})"
