"""Windowing: group the items of each key by time; import as ``win``.

::

    from datetime import datetime, timedelta, timezone
    import millpond.operators.windowing as win

    clock = win.EventClock(lambda e: e["at"], wait_for_system_duration=timedelta(seconds=5))
    windower = win.TumblingWindower(timedelta(minutes=1), align_to=datetime(2024, 1, 1, tzinfo=timezone.utc))
    counts = win.count_window("count", events, clock, windower, key=lambda e: e["user"])
    # counts.down: (user, (window_id, n)); counts.late; counts.meta

See ``docs/operators.md`` ("Windowing") for the semantics.
"""

from millpond.operators.windowing.clock import UTC_MAX, UTC_MIN, Clock, ClockLogic, EventClock, SystemClock
from millpond.operators.windowing.logic import WindowLogic, WindowMetadata, WindowOut
from millpond.operators.windowing.ops import (
    collect_window,
    count_window,
    fold_window,
    join_window,
    max_window,
    min_window,
    reduce_window,
    window,
)
from millpond.operators.windowing.windower import (
    LATE_SESSION_ID,
    SessionWindower,
    SlidingWindower,
    TumblingWindower,
    Windower,
    WindowerLogic,
)

__all__ = [
    "Clock",
    "ClockLogic",
    "EventClock",
    "LATE_SESSION_ID",
    "SessionWindower",
    "SlidingWindower",
    "SystemClock",
    "TumblingWindower",
    "UTC_MAX",
    "UTC_MIN",
    "WindowLogic",
    "WindowMetadata",
    "WindowOut",
    "Windower",
    "WindowerLogic",
    "collect_window",
    "count_window",
    "fold_window",
    "join_window",
    "max_window",
    "min_window",
    "reduce_window",
    "window",
]
