"""millpond.operators.windowing: clocks, windowers and the windowing
operators, table-driven, through ``run_main`` and through ``cluster_main``
with 3 workers (same outputs, compared sorted); event-time clocks use a
fixed ``now_getter`` (and ``to_system_utc`` returning None) so nothing
sleeps; recovery with ``TestingSource.ABORT()`` resumes to exactly what an
uninterrupted run emits."""

from __future__ import annotations

import pickle
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

import millpond.operators as op
import millpond.operators.windowing as win
from millpond.dataflow import Dataflow
from millpond.recovery import RecoveryConfig
from millpond.testing import TestingSink, TestingSource, cluster_main, run_main

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
ZERO = timedelta(0)


def s(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def secs(t: datetime) -> float:
    return (t - T0).total_seconds()


def ts_of(v: Any) -> datetime:
    """Item time: an int is seconds after T0; a tuple/list carries it last."""
    if isinstance(v, (tuple, list)):
        v = v[-1]
    return s(v)


def event_clock(wait: float = 0) -> win.EventClock:
    # A fixed now: the watermark is the largest time seen minus `wait`;
    # no timer (to_system_utc -> None), so windows close on items and EOF.
    return win.EventClock(ts_of, timedelta(seconds=wait), now_getter=lambda: T0, to_system_utc=lambda t: None)


def tumbling(n: float = 10, align: float = 0) -> win.TumblingWindower:
    return win.TumblingWindower(timedelta(seconds=n), s(align))


def sliding(n: float = 10, off: float = 5, align: float = 0) -> win.SlidingWindower:
    return win.SlidingWindower(timedelta(seconds=n), timedelta(seconds=off), s(align))


def session(gap: float) -> win.SessionWindower:
    return win.SessionWindower(timedelta(seconds=gap))


def meta_row(kv: Tuple[str, Tuple[int, win.WindowMetadata]]) -> Tuple[Any, ...]:
    k, (wid, m) = kv
    return (k, wid, secs(m.open_time), secs(m.close_time), tuple(sorted(m.merged_ids)))


def freeze(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(freeze(y) for y in x)
    if isinstance(x, (set, frozenset)):
        return ("set", tuple(sorted(x)))
    if isinstance(x, dict):
        return ("dict", tuple(sorted(x.items())))
    return x


def sorted_out(rows: List[Any]) -> List[Any]:
    return sorted(rows, key=repr)


class Fold(win.WindowLogic):
    """A list per window (for the general `window` operator)."""

    def __init__(self, resume: Optional[Tuple[Any, ...]]) -> None:
        self.vals = list(resume or ())

    def on_value(self, value: Any) -> List[Any]:
        self.vals.append(value)
        return []

    def on_merge(self, original: Any) -> List[Any]:
        self.vals.extend(original.vals)
        return []

    def on_close(self) -> List[Any]:
        return [tuple(self.vals)]

    def snapshot(self) -> Tuple[Any, ...]:
        return tuple(self.vals)


def run_flow(
    build: Callable[[Any], win.WindowOut],
    items: List[Any],
    runner: str,
    batch_size: int = 1,
    two_sides: bool = False,
) -> Dict[str, List[Any]]:
    flow = Dataflow("w")
    inp = op.input("inp", flow, TestingSource(items, batch_size=batch_size))
    if two_sides:
        b = op.branch("side", inp, lambda kv: kv[1][0] == "L")
        wo = build((b.trues, b.falses))
    else:
        wo = build(inp)
    down: List[Any] = []
    late: List[Any] = []
    meta: List[Any] = []
    op.output("down", wo.down, TestingSink(down))
    op.output("late", wo.late, TestingSink(late))
    op.output("meta", wo.meta, TestingSink(meta))
    if runner == "run_main":
        run_main(flow)
    else:
        cluster_main(flow, [], 0, worker_count_per_proc=3)
    return {
        "down": sorted_out([(k, (wid, freeze(v))) for k, (wid, v) in down]),
        "late": sorted_out([(k, (wid, freeze(v))) for k, (wid, v) in late]),
        "meta": sorted_out([meta_row(m) for m in meta]),
    }


RUNNERS = ["run_main", "cluster3"]

# (case id, build(up), items, expected down, expected late, expected meta or None)
CASES: List[Tuple[Any, ...]] = [
    (
        "tumbling-collect-opens-closes-late",
        lambda up: win.collect_window("c", up, event_clock(), tumbling()),
        [("a", 1), ("a", 3), ("b", 2), ("a", 12), ("a", 2), ("a", 25)],
        [("a", (0, (1, 3))), ("a", (1, (12,))), ("a", (2, (25,))), ("b", (0, (2,)))],
        [("a", (0, 2))],
        [("a", 0, 0, 10, ()), ("a", 1, 10, 20, ()), ("a", 2, 20, 30, ()), ("b", 0, 0, 10, ())],
    ),
    (
        "tumbling-wait-accepts-out-of-order-in-time-order",
        lambda up: win.collect_window("c", up, event_clock(wait=5), tumbling()),
        [("a", 1), ("a", 12), ("a", 2), ("a", 16), ("a", 3)],
        [("a", (0, (1, 2))), ("a", (1, (12, 16)))],
        [("a", (0, 3))],
        [("a", 0, 0, 10, ()), ("a", 1, 10, 20, ())],
    ),
    (
        "ordered-applies-in-time-order",
        lambda up: win.fold_window("f", up, event_clock(wait=10), tumbling(), list, lambda a, v: a + [v], lambda a, b: a + b),
        [("a", 5), ("a", 3), ("a", 8)],
        [("a", (0, (3, 5, 8)))],
        [],
        None,
    ),
    (
        "unordered-applies-in-arrival-order",
        lambda up: win.fold_window(
            "f", up, event_clock(wait=10), tumbling(), list, lambda a, v: a + [v], lambda a, b: a + b, ordered=False
        ),
        [("a", 5), ("a", 3), ("a", 8)],
        [("a", (0, (5, 3, 8)))],
        [],
        None,
    ),
    (
        "alignment-and-ids-count-from-align_to",
        lambda up: win.collect_window("c", up, event_clock(wait=100), tumbling(10, align=3)),
        [("a", 1), ("a", 3), ("a", 14), ("a", -20)],
        [("a", (-3, (-20,))), ("a", (-1, (1,))), ("a", (0, (3,))), ("a", (1, (14,)))],
        [],
        [("a", -3, -27, -17, ()), ("a", -1, -7, 3, ()), ("a", 0, 3, 13, ()), ("a", 1, 13, 23, ())],
    ),
    (
        "sliding-item-in-several-windows",
        lambda up: win.collect_window("c", up, event_clock(), sliding(10, 5)),
        [("a", 7), ("a", 12)],
        [("a", (0, (7,))), ("a", (1, (7, 12))), ("a", (2, (12,)))],
        [],
        [("a", 0, 0, 10, ()), ("a", 1, 5, 15, ()), ("a", 2, 10, 20, ())],
    ),
    (
        "sliding-late-for-closed-windows-only",
        lambda up: win.collect_window("c", up, event_clock(), sliding(10, 5)),
        [("a", 7), ("a", 12), ("a", 8)],
        # 8 falls in 0 (closed at 10 <= watermark 12) and 1 (still open)
        [("a", (0, (7,))), ("a", (1, (7, 12, 8))), ("a", (2, (12,)))],
        [("a", (0, 8))],
        None,
    ),
    (
        "session-gap-and-close",
        lambda up: win.collect_window("c", up, event_clock(), session(5)),
        [("a", 1), ("a", 4), ("a", 20), ("a", 24), ("b", 3)],
        [("a", (0, (1, 4))), ("a", (1, (20, 24))), ("b", (0, (3,)))],
        [],
        [("a", 0, 1, 9, ()), ("a", 1, 20, 29, ()), ("b", 0, 3, 8, ())],
    ),
    (
        "session-merge-unordered-merged_ids",
        lambda up: win.fold_window(
            "f", up, event_clock(wait=100), session(5), list, lambda a, v: a + [v], lambda a, b: a + b, ordered=False
        ),
        [("a", 1), ("a", 9), ("a", 28), ("a", 5), ("a", 20), ("a", 24)],
        # 5 bridges sessions 0 [1,6) and 1 [9,14); 24 bridges 3 [20,25) and
        # 2 [28,33): the one that opened first survives
        [("a", (0, (1, 9, 5))), ("a", (3, (20, 28, 24)))],
        [],
        [("a", 0, 1, 14, (1,)), ("a", 3, 20, 33, (2,))],
    ),
    (
        "session-ordered-no-merge-needed",
        lambda up: win.collect_window("c", up, event_clock(wait=100), session(5)),
        [("a", 1), ("a", 9), ("a", 5)],
        [("a", (0, (1, 5, 9)))],
        [],
        [("a", 0, 1, 14, ())],
    ),
    (
        "session-late",
        lambda up: win.collect_window("c", up, event_clock(), session(2)),
        [("a", 1), ("a", 10), ("a", 5), ("a", 9)],
        # 9 is behind the watermark but joins the open session [10, 12)
        [("a", (0, (1,))), ("a", (1, (10, 9)))],
        [("a", (win.LATE_SESSION_ID, 5))],
        [("a", 0, 1, 3, ()), ("a", 1, 9, 12, ())],
    ),
    (
        "session-gap-zero",
        lambda up: win.collect_window("c", up, event_clock(wait=1), session(0)),
        [("a", 1), ("a", 1), ("a", 2)],
        [("a", (0, (1, 1))), ("a", (1, (2,)))],
        [],
        [("a", 0, 1, 1, ()), ("a", 1, 2, 2, ())],
    ),
    (
        "collect-into-set",
        lambda up: win.collect_window("c", up, event_clock(), tumbling(), into=set),
        [("a", 1), ("a", 1), ("a", 3)],
        [("a", (0, ("set", (1, 3))))],
        [],
        None,
    ),
    (
        "collect-into-dict",
        lambda up: win.collect_window("c", op.map_value("kv", up, lambda t: (f"x{t % 2}", t)), event_clock(), tumbling(), into=dict),
        [("a", 1), ("a", 2), ("a", 3)],
        None,  # checked separately
        [],
        None,
    ),
    (
        "count_window",
        lambda up: win.count_window("n", op.key_rm("rm", up), event_clock(), tumbling(), key=lambda t: "odd" if t % 2 else "even"),
        [("a", 1), ("a", 2), ("a", 3), ("a", 11), ("a", 5)],
        [("even", (0, 1)), ("odd", (0, 2)), ("odd", (1, 1))],
        [("odd", (0, 5))],
        None,
    ),
    (
        "reduce_window",
        lambda up: win.reduce_window("r", up, event_clock(), tumbling(), lambda a, b: a + b),
        [("a", 1), ("a", 2), ("a", 13), ("b", 4)],
        [("a", (0, 3)), ("a", (1, 13)), ("b", (0, 4))],
        [],
        None,
    ),
    (
        "reduce_window-session-merge",
        lambda up: win.reduce_window("r", up, event_clock(wait=100), session(5), lambda a, b: a * 10 + b),
        [("a", 1), ("a", 9), ("a", 5)],
        [("a", (0, 159))],  # ordered: 1, 5, 9
        [],
        None,
    ),
    (
        "max_window",
        lambda up: win.max_window("m", up, event_clock(), tumbling(), by=lambda v: -v),
        [("a", 1), ("a", 2), ("a", 13)],
        [("a", (0, 1)), ("a", (1, 13))],
        [],
        None,
    ),
    (
        "min_window",
        lambda up: win.min_window("m", up, event_clock(), tumbling()),
        [("a", 3), ("a", 2), ("a", 13)],
        [("a", (0, 2)), ("a", (1, 13))],
        [],
        None,
    ),
    (
        "window-general-logic",
        lambda up: win.window("w", up, event_clock(), tumbling(), Fold),
        # 2 is behind the watermark (3) but its window is open: applied
        [("a", 3), ("a", 2), ("a", 13), ("a", 4)],
        [("a", (0, (3, 2))), ("a", (1, (13,)))],
        [("a", (0, 4))],
        [("a", 0, 0, 10, ()), ("a", 1, 10, 20, ())],
    ),
]

JOIN_ITEMS = [("a", ("L", 1)), ("a", ("R", 2)), ("a", ("L", 3)), ("b", ("L", 4)), ("a", ("R", 12)), ("a", ("L", 5))]

JOIN_CASES = [
    # (insert, emit, expected down)
    ("last", "final", [("a", (0, (("L", 3), ("R", 2)))), ("a", (1, (None, ("R", 12)))), ("b", (0, (("L", 4), None)))]),
    ("first", "final", [("a", (0, (("L", 1), ("R", 2)))), ("a", (1, (None, ("R", 12)))), ("b", (0, (("L", 4), None)))]),
    (
        "product",
        "final",
        [
            ("a", (0, (("L", 1), ("R", 2)))),
            ("a", (0, (("L", 3), ("R", 2)))),
            ("a", (1, (None, ("R", 12)))),
            ("b", (0, (("L", 4), None))),
        ],
    ),
    ("last", "complete", [("a", (0, (("L", 1), ("R", 2))))]),
    (
        "last",
        "running",
        [
            ("a", (0, (("L", 1), None))),
            ("a", (0, (("L", 1), ("R", 2)))),
            ("a", (0, (("L", 3), ("R", 2)))),
            ("a", (1, (None, ("R", 12)))),
            ("b", (0, (("L", 4), None))),
        ],
    ),
]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_windowing_operators(case: Tuple[Any, ...], runner: str) -> None:
    name, build, items, down, late, meta = case
    got = run_flow(build, items, runner)
    if name == "collect-into-dict":
        assert got["down"] == [("a", (0, ("dict", (("x0", 2), ("x1", 3)))))]
        return
    assert got["down"] == sorted_out(down)
    assert got["late"] == sorted_out(late)
    if meta is not None:
        assert got["meta"] == sorted_out(meta)


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("insert,emit,down", JOIN_CASES, ids=[f"{i}-{e}" for i, e, _ in JOIN_CASES])
def test_join_window(insert: str, emit: str, down: List[Any], runner: str) -> None:
    def build(sides: Any) -> win.WindowOut:
        return win.join_window(
            "j", event_clock(), tumbling(), *sides, insert_mode=insert, emit_mode=emit
        )

    got = run_flow(build, JOIN_ITEMS, runner, two_sides=True)
    assert got["down"] == sorted_out(down)
    # ("a", ("L", 5)) arrived after window 0 closed (watermark 12)
    assert got["late"] == [("a", (0, (0, ("L", 5))))]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_batching_does_not_change_results(runner: str, batch_size: int) -> None:
    items = [(f"k{i % 4}", (i * 7) % 50) for i in range(60)]
    build = lambda up: win.collect_window("c", up, event_clock(wait=8), session(3))  # noqa: E731
    ref = run_flow(build, items, "run_main")
    assert run_flow(build, items, runner, batch_size=batch_size) == ref


@pytest.mark.parametrize("runner", RUNNERS)
def test_eof_closes_every_window_and_next_execution_continues(tmp_path: Any, runner: str) -> None:
    items = [("a", 1), ("a", 2), TestingSource.EOF(), ("a", 3), ("b", 30)]
    flow = Dataflow("eof")
    inp = op.input("inp", flow, TestingSource(items))
    wo = win.collect_window("c", inp, event_clock(wait=1000), tumbling())
    down: List[Any] = []
    op.output("down", wo.down, TestingSink(down))
    cfg = RecoveryConfig(tmp_path)
    if runner == "run_main":
        run = lambda: run_main(flow, recovery_config=cfg)  # noqa: E731
    else:
        run = lambda: cluster_main(flow, [], 0, recovery_config=cfg, worker_count_per_proc=3)  # noqa: E731
    run()
    assert down == [("a", (0, [1, 2]))]
    run()
    # the key's state was dropped at EOF: window 0 opens afresh
    assert sorted_out(down) == sorted_out([("a", (0, [1, 2])), ("a", (0, [3])), ("b", (3, [30]))])


@pytest.mark.parametrize("runner", RUNNERS)
def test_system_clock_windows_close_at_eof(runner: str) -> None:
    now = datetime.now(timezone.utc)
    items = [("a", 1), ("a", 2), ("b", 3)]
    got = run_flow(
        lambda up: win.collect_window(
            "c", up, win.SystemClock(), win.TumblingWindower(timedelta(hours=1), now - timedelta(hours=0.5))
        ),
        items,
        runner,
    )
    values = sorted((k, v) for k, (_wid, v) in got["down"])
    assert values in ([("a", (1, 2)), ("b", (3,))], [("a", (1,)), ("a", (2,)), ("b", (3,))])
    assert got["late"] == []
    assert {wid for _k, (wid, _v) in got["down"]} <= {0, 1}


def test_system_clock_session_drops_idle_key() -> None:
    # two items far apart in system time close their own sessions
    got = run_flow(
        lambda up: win.collect_window("c", up, win.SystemClock(), win.SessionWindower(timedelta(0))),
        [("a", 1), TestingSource.PAUSE(timedelta(milliseconds=30)), ("a", 2)],
        "run_main",
    )
    assert [v for _k, (_w, v) in got["down"]] == [(1,), (2,)]


def test_timer_closes_windows_while_input_is_idle() -> None:
    """With the real clock, a window closes at its close time while the
    input sleeps (the operator sets a timer; it does not wait for EOF)."""
    seen: Dict[str, float] = {}
    base = datetime.now(timezone.utc)

    def ts_getter(v: Any) -> datetime:
        seen.setdefault(f"ts{v[1]}", time.monotonic())
        return base + timedelta(seconds=v[1])

    clock = win.EventClock(ts_getter, timedelta(milliseconds=100))
    flow = Dataflow("timer")
    inp = op.input("inp", flow, TestingSource([("a", 0), TestingSource.PAUSE(timedelta(seconds=0.8)), ("a", 100)]))
    wo = win.count_window("n", inp, clock, win.TumblingWindower(timedelta(milliseconds=200), base), key=lambda kv: kv[0])
    out: List[Any] = []

    def record(_sid: str, x: Any) -> None:
        seen.setdefault("closed0", time.monotonic())
        out.append(x)

    op.output("out", op.inspect("rec", wo.down, record), TestingSink([]))
    run_main(flow)
    assert out == [("a", (0, 1)), ("a", (500, 1))]
    # window 0 closed (0.2 s + 0.1 s wait) before the pause ended
    assert seen["closed0"] < seen["ts100"]


# --- unit level ---------------------------------------------------------------------


def test_event_clock_watermark_advances_with_system_time() -> None:
    now = [s(1000)]
    clock = win.EventClock(ts_of, timedelta(seconds=2), now_getter=lambda: now[0])
    logic = clock.build(None)
    logic.before_batch()
    assert logic.watermark() == win.UTC_MIN
    assert logic.on_item(10) == (s(10), s(8))
    assert logic.on_item(5) == (s(5), s(8))
    now[0] = s(1003)
    logic.before_batch()
    assert logic.watermark() == s(11)
    # a new max resets the base; the watermark does not go back
    assert logic.on_item(12) == (s(12), s(11))
    # the watermark reaches 20 at system time 1003 + (20 - 12 + 2)
    assert logic.to_system_utc(s(20)) == s(1013)
    restored = clock.build(pickle.loads(pickle.dumps(logic.snapshot())))
    restored.before_batch()
    assert restored.watermark() == logic.watermark()


@pytest.mark.parametrize(
    "make",
    [
        lambda: win.SlidingWindower(timedelta(seconds=5), timedelta(seconds=6), T0),
        lambda: win.SlidingWindower(timedelta(seconds=5), ZERO, T0),
        lambda: win.TumblingWindower(ZERO, T0),
        lambda: win.SessionWindower(timedelta(seconds=-1)),
        lambda: win.EventClock(ts_of, timedelta(seconds=-1)),
    ],
    ids=["sliding-offset-gt-length", "sliding-zero-offset", "tumbling-zero", "session-negative", "clock-negative"],
)
def test_bad_parameters_are_value_errors(make: Callable[[], Any]) -> None:
    with pytest.raises(ValueError):
        make()


def test_bad_arguments_are_type_errors() -> None:
    flow = Dataflow("bad")
    inp = op.input("inp", flow, TestingSource([]))
    with pytest.raises(TypeError):
        win.collect_window("c", inp, "clock", tumbling())
    with pytest.raises(TypeError):
        win.collect_window("c2", inp, event_clock(), tumbling(), into=tuple)
    with pytest.raises(TypeError):
        win.TumblingWindower(timedelta(seconds=1), datetime(2024, 1, 1))


def test_snapshot_is_picklable_and_resumes_the_same_windows() -> None:
    from millpond.operators.windowing.ops import _WindowStep

    clock, windower = event_clock(wait=5), session(3)
    a = _WindowStep(clock, windower, Fold, True, None)
    out1, _ = a.on_batch([1, 2, 10, 4, 30])
    snap = pickle.loads(pickle.dumps(a.snapshot()))
    b = _WindowStep(clock, windower, Fold, True, snap)
    assert b.snapshot() == a.snapshot()
    assert list(a.on_batch([31, 12])[0]) == list(b.on_batch([31, 12])[0])
    assert list(a.on_eof()[0]) == list(b.on_eof()[0])


def test_snapshot_keeps_times_as_integers_and_reads_older_datetime_snapshots() -> None:
    """Times go into a snapshot as microseconds (a datetime pickles three
    times slower, and every touched key is snapshotted every epoch); a
    version-1 snapshot, with datetimes, still resumes the same windows."""
    from millpond.operators.windowing.clock import from_snapshot_time
    from millpond.operators.windowing.ops import _WindowStep

    clock, windower = event_clock(wait=5), session(3)
    a = _WindowStep(clock, windower, Fold, True, None)
    # watermark 25: 20..24 applied to a session open until 27; 30 buffered
    a.on_batch([20, 22, 24, 30])
    snap = a.snapshot()
    version, clock_s, windower_s, windows_s, buffer_s, seq = snap
    assert version == 2
    assert all(type(t) is int for t in clock_s)
    assert windows_s and all(type(w[1]) is int and type(w[2]) is int for w in windows_s)
    assert buffer_s and all(type(b[0]) is int for b in buffer_s)

    def as_v1(x: Any) -> Any:
        return from_snapshot_time(x) if type(x) is int else x

    old = (
        1,
        tuple(as_v1(t) for t in clock_s),
        windower_s,
        tuple((wid, as_v1(o), as_v1(c), m, lg) for wid, o, c, m, lg in windows_s),
        tuple((as_v1(ts), sq, v) for ts, sq, v in buffer_s),
        seq,
    )
    b = _WindowStep(clock, windower, Fold, True, old)
    assert b.snapshot() == snap
    assert list(a.on_batch([31, 12])[0]) == list(b.on_batch([31, 12])[0])
    assert list(a.on_eof()[0]) == list(b.on_eof()[0])


class _NoTruth:
    """An iterable whose truth cannot be asked (as numpy arrays of more than
    one value): a window logic may return any iterable."""

    def __init__(self, *vals: Any) -> None:
        self.vals = vals

    def __iter__(self) -> Any:
        return iter(self.vals)

    def __bool__(self) -> bool:
        raise ValueError("the truth value of this iterable is ambiguous")


class EmitEach(win.WindowLogic):
    """Emits every value as it comes (a generator), every merge (an iterable
    without a truth value) and a count at close."""

    def __init__(self, resume: Optional[int]) -> None:
        self.n = resume or 0

    def on_value(self, value: Any) -> Any:
        self.n += 1
        return (x for x in [("value", value)])

    def on_merge(self, original: Any) -> Any:
        self.n += original.n
        return _NoTruth(("merged", original.n), ("now", self.n))

    def on_close(self) -> Any:
        return _NoTruth(("count", self.n))

    def snapshot(self) -> int:
        return self.n


@pytest.mark.parametrize("runner", RUNNERS)
def test_window_logic_may_emit_any_iterable(runner: str) -> None:
    # a's third item bridges its two sessions (gap 2): they merge
    items = [("a", 1), ("a", 4.5), ("a", 2.8), ("b", 2)]
    out = run_flow(
        lambda inp: win.window("w", inp, event_clock(wait=10), session(2), EmitEach, ordered=False), items, runner
    )
    assert out["down"] == sorted_out([
        ("a", (0, ("value", 1))), ("a", (1, ("value", 4.5))), ("a", (0, ("merged", 1))), ("a", (0, ("now", 2))),
        ("a", (0, ("value", 2.8))), ("a", (0, ("count", 3))), ("b", (0, ("value", 2))), ("b", (0, ("count", 1))),
    ])


def test_metadata_emitted_for_one_key_is_its_own() -> None:
    """Fixed windows share one metadata object per window among their keys
    while open; each key's ``meta`` output is a copy of its own, so a sink
    that changes one changes no other."""
    flow = Dataflow("wmeta")
    inp = op.input("inp", flow, TestingSource([("a", 1), ("b", 2), ("a", 12), ("b", 13)]))
    wo = win.collect_window("c", inp, event_clock(), tumbling(10))
    metas: List[Any] = []
    op.output("meta", wo.meta, TestingSink(metas))
    run_main(flow)
    assert sorted(meta_row(m) for m in metas) == [
        ("a", 0, 0.0, 10.0, ()), ("a", 1, 10.0, 20.0, ()), ("b", 0, 0.0, 10.0, ()), ("b", 1, 10.0, 20.0, ()),
    ]
    assert len({id(m) for _, (_, m) in metas}) == 4
    first = metas[0][1][1]
    first.merged_ids.add(99)
    first.close_time = s(1000)
    assert all(m.merged_ids == set() and secs(m.close_time) < 1000 for _, (_, m) in metas[1:])


@pytest.mark.parametrize("make", [lambda: tumbling(10), lambda: sliding(10, 5)], ids=["tumbling", "sliding"])
def test_fixed_windows_resumed_from_snapshots_share_metadata(make: Callable[[], Any]) -> None:
    """A restored key's windows take the windower's shared metadata when
    they have its extent, and keep their own when they do not (a snapshot
    of windows of another length)."""
    from millpond.operators.windowing.ops import _WindowStep

    windower = make()
    a = _WindowStep(event_clock(wait=100), windower, Fold, False, None)
    b = _WindowStep(event_clock(wait=100), windower, Fold, False, None)
    a.on_batch([1, 12])
    b.on_batch([3])
    assert a.metas[0] is b.metas[0]
    restored = _WindowStep(event_clock(wait=100), windower, Fold, False, pickle.loads(pickle.dumps(a.snapshot())))
    assert restored.snapshot() == a.snapshot()
    assert all(restored.metas[w] is a.metas[w] for w in a.metas)
    longer = _WindowStep(event_clock(wait=100), make(), Fold, False, None)
    version, clock_s, windower_s, windows_s, buffer_s, seq = a.snapshot()
    stretched = tuple((wid, o, c + 1, m, lg) for wid, o, c, m, lg in windows_s)
    other = _WindowStep(event_clock(wait=100), windower, Fold, False, (version, clock_s, windower_s, stretched, buffer_s, seq))
    assert all(other.metas[w] is not a.metas[w] for w in a.metas)
    assert [(wid, m.close_time) for wid, m in other.metas.items()] == [
        (wid, m.close_time + timedelta(microseconds=1)) for wid, m in a.metas.items()
    ]
    assert longer.metas == {}


# --- recovery ---------------------------------------------------------------------


def recovery_items() -> List[Tuple[str, int]]:
    return [(f"k{(i * 5) % 7}", (i * 13) % 40 + i) for i in range(80)]


def windowed_flow(items: List[Any], outs: Dict[str, List[Any]]) -> Dataflow:
    flow = Dataflow("wrec")
    inp = op.input("inp", flow, TestingSource(items, batch_size=2))
    t = win.collect_window("tumble", inp, event_clock(wait=6), tumbling(10))
    se = win.fold_window(
        "sess", inp, event_clock(wait=3), session(4), list, lambda a, v: a + [v], lambda a, b: a + b, ordered=False
    )
    for name, stream in (("t_down", t.down), ("t_late", t.late), ("s_down", se.down), ("s_meta", se.meta)):
        op.output(name, stream, TestingSink(outs.setdefault(name, [])))
    return flow


def normalized(outs: Dict[str, List[Any]]) -> Dict[str, List[Any]]:
    res = {}
    for name, rows in outs.items():
        res[name] = sorted_out([meta_row(r) if name.endswith("meta") else freeze(r) for r in rows])
    return res


@pytest.mark.parametrize("aborts,workers", [([17], [1, 1]), ([5, 30, 61], [1, 3, 2, 3])], ids=["one-abort", "three-aborts-rescaled"])
def test_resumed_windowed_flow_emits_what_an_uninterrupted_run_emits(tmp_path: Any, aborts: List[int], workers: List[int]) -> None:
    data = recovery_items()
    ref: Dict[str, List[Any]] = {}
    run_main(windowed_flow(data, ref))

    items: List[Any] = []
    for i, x in enumerate(data):
        if i in aborts:
            items.append(TestingSource.ABORT())
        items.append(x)
    outs: Dict[str, List[Any]] = {}
    flow = windowed_flow(items, outs)
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=str(tmp_path / "backup"))
    for w in workers:
        cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg, worker_count_per_proc=w)
    assert normalized(outs) == normalized(ref)


def test_notify_that_finds_nothing_due_stops_waking_instead_of_looping() -> None:
    from millpond.operators.windowing.ops import _WindowStep

    # now_getter stuck: the engine's timer fires but the clock sees no time pass
    clock = win.EventClock(ts_of, ZERO, now_getter=lambda: T0)
    step = _WindowStep(clock, tumbling(), Fold, True, None)
    step.on_batch([1])
    assert step.notify_at() == T0 + timedelta(seconds=9)  # window 0 closes 9 s after item 1 was seen
    out, discard = step.on_notify()
    assert list(out) == [] and discard is False
    assert step.notify_at() is None
    out, _ = step.on_batch([10])
    assert [x for x in out if x[0] == 0] == [(0, (0, (1,)))]
