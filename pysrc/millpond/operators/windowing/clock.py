"""Clocks: what time an item has, and the watermark.

A clock is a picklable-free configuration object (it may hold functions);
:meth:`Clock.build` makes the per-key :class:`ClockLogic` whose
:meth:`ClockLogic.snapshot` is the (picklable) recovery state of the clock.

- :class:`SystemClock`: item time = watermark = now (UTC).
- :class:`EventClock`: item time = ``ts_getter(value)``; watermark = the
  largest item time seen minus ``wait_for_system_duration``, advanced by the
  system time (``now_getter``) elapsed since that item was seen. The
  watermark never goes back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional, Tuple

from millpond import _core

__all__ = ["Clock", "ClockLogic", "EventClock", "SystemClock", "UTC_MAX", "UTC_MIN"]

#: The earliest / latest aware UTC datetimes (the watermark before any item,
#: and at the end of input).
UTC_MIN = datetime.min.replace(tzinfo=timezone.utc)
UTC_MAX = datetime.max.replace(tzinfo=timezone.utc)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


#: ``to_snapshot_time(t)``: ``t`` as it goes into a snapshot: a UTC datetime
#: (``tzinfo is timezone.utc``) as microseconds since 1970 (an int pickles in
#: a fraction of a datetime's time, and a key's snapshot is rewritten every
#: epoch it is touched); anything else as is. In C: a key's snapshot converts
#: a handful of times, and ``(t - 1970) // 1 us`` in Python cost 0.3 us each.
to_snapshot_time: Callable[[Any], Any] = _core.snapshot_time


def from_snapshot_time(t: Any) -> Any:
    """The inverse of :func:`to_snapshot_time` (older snapshots hold
    datetimes, which pass through)."""
    if type(t) is int:
        return _EPOCH + timedelta(microseconds=t)
    return t


def _identity_time(t: datetime) -> Optional[datetime]:
    return t


def _check_aware(what: str, t: Any) -> datetime:
    if not isinstance(t, datetime) or t.tzinfo is None:
        raise TypeError(
            f"{what} must return a timezone-aware datetime "
            f"(e.g. datetime.now(timezone.utc)); got {t!r:.80}"
        )
    return t


class ClockLogic(ABC):
    """The per-key state of a clock."""

    #: True when the clock keeps no state, so an idle key may be dropped.
    stateless: bool = False

    @abstractmethod
    def before_batch(self) -> None:
        """Called once before the items (or the timer) of an activation."""

    @abstractmethod
    def on_item(self, value: Any) -> Tuple[datetime, datetime]:
        """``(item time, watermark)`` for one value."""

    @abstractmethod
    def watermark(self) -> datetime:
        """The watermark now (no new item)."""

    @abstractmethod
    def to_system_utc(self, t: datetime) -> Optional[datetime]:
        """The system (UTC) time at which the watermark reaches ``t``;
        ``None``: do not wake up, wait for items or the end of input."""

    @abstractmethod
    def snapshot(self) -> Any:
        """Picklable state to resume this clock from."""


class Clock(ABC):
    """Configuration of a clock; builds one :class:`ClockLogic` per key."""

    @abstractmethod
    def build(self, resume_state: Any) -> ClockLogic:
        """A new logic (``resume_state`` None) or a restored one."""

    def _on_values(self, getter: Callable[[Any], Any]) -> "Clock":
        """This clock reading item times from ``getter(value)`` (used by
        ``join_window`` whose values are tagged with their side)."""
        return self


class _SystemClockLogic(ClockLogic):
    __slots__ = ("now",)
    stateless = True

    def __init__(self) -> None:
        self.now = _utcnow()

    def before_batch(self) -> None:
        self.now = _utcnow()

    def on_item(self, value: Any) -> Tuple[datetime, datetime]:
        return self.now, self.now

    def watermark(self) -> datetime:
        return self.now

    def to_system_utc(self, t: datetime) -> Optional[datetime]:
        return t

    def snapshot(self) -> Any:
        return None


class SystemClock(Clock):
    """Item time and watermark are the current UTC time (read once per
    activation). At the end of input every window closes."""

    def build(self, resume_state: Any) -> ClockLogic:
        return _SystemClockLogic()

    def __repr__(self) -> str:
        return "SystemClock()"


class _EventClockLogic(ClockLogic):
    __slots__ = ("clock", "now", "max_seen", "seen_at", "floor")

    def __init__(self, clock: "EventClock", resume: Any) -> None:
        self.clock = clock
        self.now: Optional[datetime] = None
        if resume is None:
            self.max_seen: Optional[datetime] = None
            self.seen_at: Optional[datetime] = None
            self.floor = UTC_MIN
        else:
            self.max_seen, self.seen_at, self.floor = (from_snapshot_time(t) for t in resume)

    def before_batch(self) -> None:
        self.now = _check_aware("now_getter", self.clock.now_getter())

    def on_item(self, value: Any) -> Tuple[datetime, datetime]:
        ts = self.clock.ts_getter(value)
        if ts.__class__ is not datetime or ts.tzinfo is None:
            _check_aware("ts_getter", ts)
        max_seen = self.max_seen
        if max_seen is None or ts > max_seen:
            self.max_seen = ts
            if self.now is None:
                self.before_batch()
            self.seen_at = self.now
        return ts, self.watermark()

    def watermark(self) -> datetime:
        max_seen, seen_at = self.max_seen, self.seen_at
        if max_seen is None or seen_at is None:
            return self.floor
        now = self.now
        if now is None:
            self.before_batch()
            now = self.now
        assert now is not None
        try:
            wm = max_seen - self.clock.wait_for_system_duration
            # Within an activation the newest item was seen "now": nothing
            # to add (and two datetime operations fewer per item).
            if now is not seen_at:
                wm += now - seen_at
        except OverflowError:
            wm = UTC_MIN if self.clock.wait_for_system_duration > timedelta(0) else UTC_MAX
        if wm > self.floor:
            self.floor = wm
        return self.floor

    def to_system_utc(self, t: datetime) -> Optional[datetime]:
        if self.max_seen is None or self.seen_at is None:
            return None
        try:
            at = self.seen_at + (t - self.max_seen + self.clock.wait_for_system_duration)
        except OverflowError:
            return None
        return self.clock.to_system_utc(at)

    def snapshot(self) -> Any:
        return (to_snapshot_time(self.max_seen), to_snapshot_time(self.seen_at), to_snapshot_time(self.floor))


class EventClock(Clock):
    """Item time from the values themselves.

    ``ts_getter(value)`` returns the item's aware UTC datetime. The watermark
    is the largest item time seen minus ``wait_for_system_duration``,
    advanced by the system time elapsed (per ``now_getter``) since that item
    was seen; it never goes back. ``to_system_utc(t)`` maps a time of
    ``now_getter``'s clock (when the watermark will reach a window's close)
    to the system UTC time to wake up at; ``None`` means "do not wake up,
    wait for items or the end of input" (what a test with a fake
    ``now_getter`` wants). At the end of input every window closes.
    """

    def __init__(
        self,
        ts_getter: Callable[[Any], datetime],
        wait_for_system_duration: timedelta,
        now_getter: Callable[[], datetime] = _utcnow,
        to_system_utc: Callable[[datetime], Optional[datetime]] = _identity_time,
    ) -> None:
        for name, fn in (("ts_getter", ts_getter), ("now_getter", now_getter), ("to_system_utc", to_system_utc)):
            if not callable(fn):
                raise TypeError(f"EventClock: `{name}` must be callable; got {fn!r:.80}")
        if not isinstance(wait_for_system_duration, timedelta):
            raise TypeError(
                "EventClock: wait_for_system_duration must be a timedelta; "
                f"got {wait_for_system_duration!r}"
            )
        if wait_for_system_duration < timedelta(0):
            raise ValueError(
                f"EventClock: wait_for_system_duration must not be negative; got {wait_for_system_duration}"
            )
        self.ts_getter = ts_getter
        self.wait_for_system_duration = wait_for_system_duration
        self.now_getter = now_getter
        self.to_system_utc = to_system_utc

    def build(self, resume_state: Any) -> ClockLogic:
        return _EventClockLogic(self, resume_state)

    def _on_values(self, getter: Callable[[Any], Any]) -> "Clock":
        ts_getter = self.ts_getter
        return EventClock(
            lambda v: ts_getter(getter(v)),
            self.wait_for_system_duration,
            self.now_getter,
            self.to_system_utc,
        )

    def __repr__(self) -> str:
        return f"EventClock(wait_for_system_duration={self.wait_for_system_duration!r})"
