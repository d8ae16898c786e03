"""What one key's snapshot costs as its open windows grow (docs/operators.md,
"Snapshot cost").

A windowing operator keeps one state object per key holding all of that
key's open windows, so a key touched in an epoch rewrites every one of
them. This builds that per-key state directly (a ``fold_window`` over an
event-time tumbling windower whose watermark waits a day, so every window
stays open), opens N windows, and times the snapshot as the state store
takes it (built in C, ``_core.window_snapshot``, for a state of windowing's
own classes such as this one) plus the pickle the store applies (its C
writer, ``_core.fast_pickle``, which handles these states; ``pickle.dumps``
for one it gives up on), against the same for a key with one window (the
baseline of the ratio column). The last column is the same with the
state's Python ``snapshot()`` method instead (what a key whose windows hold
a user's ``WindowLogic`` runs).

    .venv/bin/python bench/window_snapshot.py [--repeat 2000]
"""

from __future__ import annotations

import argparse
import pickle
import time
from datetime import datetime, timedelta, timezone
from typing import Any, List

from millpond import _core
from millpond.operators.windowing import EventClock, TumblingWindower
from millpond.operators.windowing.ops import _FoldWindowLogic, _WindowStep

ALIGN = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _key_state(windows: int) -> Any:
    clock = EventClock(lambda v: v[0], wait_for_system_duration=timedelta(days=1),
                       now_getter=lambda: ALIGN, to_system_utc=lambda t: None)
    windower = TumblingWindower(length=timedelta(minutes=1), align_to=ALIGN)

    def builder(resume: Any) -> _FoldWindowLogic[Any, int]:
        return _FoldWindowLogic(lambda acc, v: acc + v[1], lambda a, b: a + b, 0 if resume is None else resume)

    step = _WindowStep(clock, windower, builder, False, None)
    values: List[Any] = [(ALIGN + timedelta(minutes=i, seconds=1), 1) for i in range(windows)]
    step.on_batch(values)
    assert len(step.windows) == windows, (len(step.windows), windows)
    return step


def _per_snapshot(step: Any, repeat: int, method: bool = False) -> tuple[float, int]:
    best = float("inf")
    size = 0
    take = step.snapshot if method else (lambda: _core.window_snapshot(step))
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            state = take()
            data = _core.fast_pickle(state, pickle.HIGHEST_PROTOCOL) or pickle.dumps(state, pickle.HIGHEST_PROTOCOL)
        best = min(best, (time.perf_counter() - t0) / repeat)
        size = len(data)
    return best, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000, help="snapshots per timing of the one-window key")
    args = ap.parse_args()
    base, _ = _per_snapshot(_key_state(1), args.repeat)
    print("open windows per key | per key snapshot | bytes | per window | x one window | with the method")
    for n in (1, 10, 100, 1000):
        step = _key_state(n)
        assert _core.window_snapshot(step) == step.snapshot()
        t, size = _per_snapshot(step, max(1, args.repeat // n))
        tm, _ = _per_snapshot(step, max(1, args.repeat // n), method=True)
        print(f"{n:>20} | {t * 1e6:>13.1f} us | {size:>5} | {t / n * 1e6:>7.2f} us | {t / base:>11.1f}x"
              f" | {tm * 1e6:>12.1f} us")


if __name__ == "__main__":
    main()
