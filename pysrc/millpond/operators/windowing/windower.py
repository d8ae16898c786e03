"""Windowers: which windows an item time falls in, and when each closes.

Window ids of :class:`TumblingWindower` and :class:`SlidingWindower` count
windows from ``align_to`` (window ``n`` opens at ``align_to + n * offset``;
negative before ``align_to``), so they are the same on every run and worker.
Session ids count sessions per key from 0 in the order they open.

A window ``[open_time, close_time)`` closes when the watermark reaches its
``close_time``; a session's ``close_time`` is its last item's time plus
``gap``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime, timedelta
from typing import Any, Dict, Iterable, List, Optional, Tuple

from millpond.operators.windowing.logic import WindowMetadata

__all__ = [
    "LATE_SESSION_ID",
    "SessionWindower",
    "SlidingWindower",
    "TumblingWindower",
    "Windower",
    "WindowerLogic",
]

#: The window id of late items of a :class:`SessionWindower`.
LATE_SESSION_ID = -1

Assignment = Tuple[List[int], List[Tuple[int, int]], List[int]]


class WindowerLogic(ABC):
    """Per-key windower state. :meth:`assign` places one item."""

    #: True when the :class:`WindowMetadata` this logic puts in ``metas`` is
    #: shared by every key (and must not be handed out or mutated).
    shares_metadata: bool = False

    @abstractmethod
    def assign(self, ts: datetime, watermark: datetime, metas: Dict[int, WindowMetadata]) -> Assignment:
        """Place an item of time ``ts``, given the open windows ``metas``
        (updated in place: new windows added, merged ones removed).

        Returns ``(ids to apply the value to, merges (into, from) to run
        before, ids of already closed windows the item is late for)``.
        """

    def snapshot(self) -> Any:
        return None

    def metadata(self, wid: int, open_time: datetime, close_time: datetime, merged: Iterable[int]) -> WindowMetadata:
        """The metadata of window ``wid`` restored from a snapshot."""
        return WindowMetadata(open_time, close_time, set(merged))


class Windower(ABC):
    """Configuration of a windower."""

    @abstractmethod
    def build(self, resume_state: Any) -> WindowerLogic:
        """A new logic (``resume_state`` None) or a restored one."""


def _check_td(who: str, name: str, td: Any, positive: bool) -> None:
    if not isinstance(td, timedelta):
        raise TypeError(f"{who}: {name} must be a timedelta; got {td!r:.80}")
    if positive and td <= timedelta(0):
        raise ValueError(f"{who}: {name} must be positive; got {td}")
    if td < timedelta(0):
        raise ValueError(f"{who}: {name} must not be negative; got {td}")


def _check_align(who: str, align_to: Any) -> None:
    if not isinstance(align_to, datetime) or align_to.tzinfo is None:
        raise TypeError(f"{who}: align_to must be a timezone-aware datetime; got {align_to!r:.80}")


#: How many windows' metadata a tumbling or sliding windower keeps to share
#: among its keys (the windows around the watermark; older ones are made
#: again if an item or a snapshot still needs them).
_SHARED_METAS = 4096


class _SlidingLogic(WindowerLogic):
    """The logic of fixed windows, the same for every key: it keeps no state
    of its own, so one instance serves every key of the operator, and so does
    each window's metadata (a key's state is then fewer objects: each is a
    cache miss when the key is snapshotted)."""

    __slots__ = ("length", "offset", "align_to", "shared")
    shares_metadata = True

    def __init__(self, length: timedelta, offset: timedelta, align_to: datetime) -> None:
        self.length = length
        self.offset = offset
        self.align_to = align_to
        self.shared: Dict[int, WindowMetadata] = {}

    def _meta(self, wid: int) -> WindowMetadata:
        meta = self.shared.get(wid)
        if meta is None:
            if len(self.shared) >= _SHARED_METAS:
                self.shared.clear()
            open_time = self.align_to + wid * self.offset
            meta = self.shared[wid] = WindowMetadata(open_time, open_time + self.length, set())
        return meta

    def metadata(self, wid: int, open_time: datetime, close_time: datetime, merged: Iterable[int]) -> WindowMetadata:
        meta = self._meta(wid)
        if meta.open_time == open_time and meta.close_time == close_time:
            return meta
        # A snapshot of another windower's windows (its length changed
        # between runs): keep them as they were.
        return WindowMetadata(open_time, close_time, set(merged))

    def assign(self, ts: datetime, watermark: datetime, metas: Dict[int, WindowMetadata]) -> Assignment:
        since = ts - self.align_to
        hi = since // self.offset
        lo = (since - self.length) // self.offset + 1
        targets: List[int] = []
        late: List[int] = []
        for wid in range(lo, hi + 1):
            if wid in metas:
                targets.append(wid)
                continue
            meta = self._meta(wid)
            if meta.close_time <= watermark:
                late.append(wid)
            else:
                metas[wid] = meta
                targets.append(wid)
        return targets, [], late


class TumblingWindower(Windower):
    """Fixed windows of ``length`` back to back, counted from ``align_to``
    (an aware datetime): window ``n`` is
    ``[align_to + n * length, align_to + (n + 1) * length)``."""

    def __init__(self, length: timedelta, align_to: datetime) -> None:
        _check_td("TumblingWindower", "length", length, positive=True)
        _check_align("TumblingWindower", align_to)
        self.length = length
        self.align_to = align_to
        self._logic = _SlidingLogic(length, length, align_to)

    def build(self, resume_state: Any) -> WindowerLogic:
        return self._logic

    def __repr__(self) -> str:
        return f"TumblingWindower(length={self.length!r}, align_to={self.align_to!r})"


class SlidingWindower(Windower):
    """Windows of ``length`` opening every ``offset`` from ``align_to``:
    window ``n`` is ``[align_to + n * offset, align_to + n * offset + length)``.
    ``offset <= length`` (else ``ValueError``), so an item falls in
    ``length / offset`` windows (rounded up or down)."""

    def __init__(self, length: timedelta, offset: timedelta, align_to: datetime) -> None:
        _check_td("SlidingWindower", "length", length, positive=True)
        _check_td("SlidingWindower", "offset", offset, positive=True)
        _check_align("SlidingWindower", align_to)
        if offset > length:
            raise ValueError(
                f"SlidingWindower: offset ({offset}) must not be longer than length ({length}); "
                "use a TumblingWindower for gaps-free windows, or a longer length"
            )
        self.length = length
        self.offset = offset
        self.align_to = align_to
        self._logic = _SlidingLogic(length, offset, align_to)

    def build(self, resume_state: Any) -> WindowerLogic:
        return self._logic

    def __repr__(self) -> str:
        return f"SlidingWindower(length={self.length!r}, offset={self.offset!r}, align_to={self.align_to!r})"


class _SessionLogic(WindowerLogic):
    __slots__ = ("gap", "next_id")

    def __init__(self, gap: timedelta, resume: Optional[int]) -> None:
        self.gap = gap
        self.next_id = 0 if resume is None else resume

    def assign(self, ts: datetime, watermark: datetime, metas: Dict[int, WindowMetadata]) -> Assignment:
        gap = self.gap
        hits = [
            wid
            for wid, m in metas.items()
            # within the gap of the session, or inside it
            if (m.open_time - gap < ts < m.close_time) or (m.open_time <= ts <= m.close_time - gap)
        ]
        if not hits:
            if ts < watermark and ts + gap <= watermark:
                return [], [], [LATE_SESSION_ID]
            wid = self.next_id
            self.next_id += 1
            metas[wid] = WindowMetadata(ts, ts + gap, set())
            return [wid], [], []
        if len(hits) > 1:
            hits.sort(key=lambda w: (metas[w].open_time, w))
        into = hits[0]
        # A session's metadata is its key's own until it closes (then it
        # is popped and emitted), so it grows in place rather than being
        # copied for every item.
        m = metas[into]
        if ts < m.open_time:
            m.open_time = ts
        end = ts + gap
        if end > m.close_time:
            m.close_time = end
        merges: List[Tuple[int, int]] = []
        for other in hits[1:]:
            o = metas.pop(other)
            if o.open_time < m.open_time:
                m.open_time = o.open_time
            if o.close_time > m.close_time:
                m.close_time = o.close_time
            m.merged_ids.add(other)
            m.merged_ids |= o.merged_ids
            merges.append((into, other))
        return [into], merges, []

    def snapshot(self) -> Any:
        return self.next_id


class SessionWindower(Windower):
    """A session per key closes after ``gap`` of inactivity (its
    ``close_time`` is its last item's time + ``gap``). An item within ``gap``
    of a session joins it; an item that reaches two or more sessions merges
    them into the one that opened first, whose ``merged_ids`` lists the
    others. ``gap >= 0``."""

    def __init__(self, gap: timedelta) -> None:
        _check_td("SessionWindower", "gap", gap, positive=False)
        self.gap = gap

    def build(self, resume_state: Any) -> WindowerLogic:
        return _SessionLogic(self.gap, resume_state)

    def __repr__(self) -> str:
        return f"SessionWindower(gap={self.gap!r})"
