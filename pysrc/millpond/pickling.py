"""How state snapshots are pickled.

Snapshots are ordinary pickles that ``pickle.loads`` reads back, made by a
pickler that writes one kind of object in a cheaper form: an aware
datetime in UTC (``tzinfo is timezone.utc``), the timestamp a stream
processor keeps most, becomes a call of :func:`utc_datetime` on its
microseconds since 1970. CPython's own form of it names the
``datetime`` class, the ``timezone`` class and a ``timedelta`` with its
arguments: 4.6 us of a windowing key's ~13 us snapshot (a buffered item
``(key, aware datetime, amount)``); this one costs about a quarter of that
(``bench/window_snapshot.py``). The value that loads is equal to the one
pickled, and of the same type.

Only the store's snapshots use this pickler; ``pickle.dumps`` elsewhere in
the process is unchanged. Snapshots written before it existed hold
CPython's form, which loads as always, and :func:`utc_datetime` stays
importable under this name for as long as stored state may name it.
"""

from __future__ import annotations

import io
import pickle
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

__all__ = ["dumps", "snapshot_dumper", "utc_datetime"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def utc_datetime(micros: int) -> datetime:
    """The aware UTC datetime ``micros`` microseconds after 1970 (what a
    snapshot's UTC datetimes load as)."""
    return _EPOCH + timedelta(microseconds=micros)


class _SnapshotPickler(pickle.Pickler):
    """A pickler whose only change is the form of aware UTC datetimes.

    ``reducer_override`` is asked only about objects that are not exact
    ints, floats, strings, bytes, tuples, lists, dicts or sets (those take
    the pickler's C fast paths), so most of a snapshot never reaches it.
    Subclasses of datetime and a ``fold`` of 1 keep CPython's form.
    """

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is datetime and obj.tzinfo is timezone.utc and not obj.fold:
            return utc_datetime, ((obj - _EPOCH) // _MICROSECOND,)
        return NotImplemented


def dumps(obj: Any, protocol: Optional[int] = None) -> bytes:
    """``obj`` pickled as a state snapshot (see the module docstring)."""
    buf = io.BytesIO()
    _SnapshotPickler(buf, protocol).dump(obj)
    return buf.getvalue()


#: A dumper starts a new buffer after a pickle larger than this, so one
#: large state does not keep its size allocated for the store's life.
_KEEP_BYTES = 1 << 20


def snapshot_dumper(protocol: int) -> Callable[[Any, int], bytes]:
    """A function that pickles one snapshot at a time as :func:`dumps` does,
    reusing one pickler and buffer (``protocol`` is fixed here; the second
    argument is accepted for the ``pickle.dumps`` signature and ignored).

    Building a pickler and a buffer costs more than pickling a small state
    (0.36 us for ``(count, 100 bytes)`` with ``pickle.dumps``, 1.7 us
    building them each time, 0.56 us reusing them), so each state store
    keeps one. A call made while another is in progress (a ``__reduce__``
    that snapshots) gets a pickler of its own.
    """
    buf = io.BytesIO()
    pickler = _SnapshotPickler(buf, protocol)
    busy = False

    def dump(obj: Any, _protocol: int = protocol) -> bytes:
        nonlocal buf, pickler, busy
        if busy:
            return dumps(obj, protocol)
        busy = True
        try:
            buf.seek(0)
            buf.truncate()
            pickler.clear_memo()
            pickler.dump(obj)
            data = buf.getvalue()
        except BaseException:
            buf = io.BytesIO()
            pickler = _SnapshotPickler(buf, protocol)
            raise
        finally:
            busy = False
        if len(data) > _KEEP_BYTES:
            buf = io.BytesIO()
            pickler = _SnapshotPickler(buf, protocol)
        return data

    return dump
