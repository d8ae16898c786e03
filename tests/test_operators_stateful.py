"""Stateful operators: per-key logic, discards, EOF order, timers, joins."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, List, Optional, Tuple

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow, Stream
from millpond.errors import DataflowError
from millpond.operators import StatefulBatchLogic, StatefulLogic
from millpond.testing import TestingSink, TestingSource, cluster_main, run_main


def run_op(
    items: List[Any],
    build: Callable[[Stream[Any]], Stream[Any]],
    workers: int = 1,
    **kw: Any,
) -> List[Any]:
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource(items, **kw))
    out: List[Any] = []
    op.output("out", build(s), TestingSink(out))
    cluster_main(flow, [], 0, worker_count_per_proc=workers)
    return out


def test_stateful_map_keeps_running_state_per_key():
    def add(state: Optional[int], v: int) -> Tuple[int, int]:
        s = (state or 0) + v
        return s, s

    got = run_op([("a", 1), ("b", 10), ("a", 2)], lambda s: op.stateful_map("sm", s, add))
    assert got == [("a", 1), ("b", 10), ("a", 3)]


def test_stateful_map_none_state_discards_the_key():
    def mapper(state: Optional[int], v: str) -> Tuple[Optional[int], int]:
        n = (state or 0) + 1
        return (None if v == "reset" else n), n

    got = run_op(
        [("a", "x"), ("a", "x"), ("a", "reset"), ("a", "x")],
        lambda s: op.stateful_map("sm", s, mapper),
    )
    assert got == [("a", 1), ("a", 2), ("a", 3), ("a", 1)]


def test_stateful_flat_map_emits_iterables():
    got = run_op(
        [("a", 2), ("a", 1)],
        lambda s: op.stateful_flat_map("sm", s, lambda st, v: ((st or 0) + v, [v] * v)),
    )
    assert got == [("a", 2), ("a", 2), ("a", 1)]


# With several workers the batch is split by owner first (route_keyed in
# the core), which refuses it whole: the step must still name the item.
@pytest.mark.parametrize("workers", [1, 3])
def test_stateful_op_on_unkeyed_items_is_a_type_error_naming_the_step(workers: int):
    with pytest.raises(DataflowError, match="t.sm.stateful_batch") as ei:
        run_op([("a", 1), 1], lambda s: op.stateful_map("sm", s, lambda st, v: (st, v)), workers=workers)
    assert isinstance(ei.value.__cause__, TypeError)
    assert "(str key, value) 2-tuples" in str(ei.value.__cause__)


@pytest.mark.parametrize("workers", [1, 3])
def test_stateful_op_with_non_str_key_is_a_type_error(workers: int):
    with pytest.raises(DataflowError) as ei:
        run_op([("a", 1), (1, 2)], lambda s: op.stateful_map("sm", s, lambda st, v: (st, v)), workers=workers)
    assert "keys to be str" in str(ei.value.__cause__)


@pytest.mark.parametrize("workers", [1, 3])
def test_keyed_user_error_names_step_worker_and_key(workers: int):
    def boom(state: Any, v: int) -> Any:
        raise KeyError("inner")

    with pytest.raises(DataflowError) as ei:
        run_op([("apple", 1)], lambda s: op.stateful_map("sm", s, boom), workers=workers)
    msg = str(ei.value)
    assert "'t.sm.stateful_batch'" in msg and "for key 'apple'" in msg and "worker " in msg
    assert isinstance(ei.value.__cause__, KeyError)


class Recorder(StatefulBatchLogic[int, str, List[str]]):
    """Records the protocol calls it gets, and emits them."""

    def __init__(self, resume: Optional[List[str]]) -> None:
        self.calls: List[str] = list(resume or [])

    def on_batch(self, values: List[int]) -> Tuple[List[str], bool]:
        self.calls.append(f"batch{values}")
        return [f"batch{values}"], self.RETAIN

    def on_eof(self) -> Tuple[List[str], bool]:
        return ["eof"], self.DISCARD

    def snapshot(self) -> List[str]:
        return list(self.calls)


def test_stateful_batch_gets_batches_then_eof_in_sorted_key_order():
    items = [("c", 1), ("a", 2), ("b", 3), ("a", 4)]
    got = run_op(items, lambda s: op.stateful_batch("sb", s, Recorder), batch_size=4)
    assert got[:3] == [("c", "batch[1]"), ("a", "batch[2, 4]"), ("b", "batch[3]")]
    assert got[3:] == [("a", "eof"), ("b", "eof"), ("c", "eof")]


def test_eof_output_is_sorted_per_worker_with_several_workers():
    flow = Dataflow("t")
    keys = [f"k{i:02d}" for i in range(30)]
    s = op.input("inp", flow, TestingSource([(k, 1) for k in reversed(keys)]))
    seen: List[Tuple[int, str]] = []
    r = op.stateful_batch("sb", s, Recorder)
    r = op.filter("eofs", r, lambda kv: kv[1] == "eof")
    r = op.inspect_debug("who", r, lambda sid, kv, e, w: seen.append((w, kv[0])))
    op.output("out", r, TestingSink([]))
    cluster_main(flow, [], 0, worker_count_per_proc=3)
    assert sorted(k for _, k in seen) == keys
    for w in range(3):
        mine = [k for ww, k in seen if ww == w]
        assert mine == sorted(mine)


class Timer(StatefulBatchLogic[str, str, None]):
    """Asks to be notified shortly after its first value, once."""

    def __init__(self, resume: None) -> None:
        self.at: Optional[datetime] = None
        self.fired = False

    def on_batch(self, values: List[str]) -> Tuple[List[str], bool]:
        if self.at is None and not self.fired:
            self.at = datetime.now(timezone.utc) + timedelta(milliseconds=30)
        return list(values), self.RETAIN

    def on_notify(self) -> Tuple[List[str], bool]:
        self.fired = True
        self.at = None
        return ["notified"], self.RETAIN

    def on_eof(self) -> Tuple[List[str], bool]:
        return ["eof"], self.DISCARD

    def notify_at(self) -> Optional[datetime]:
        return self.at

    def snapshot(self) -> None:
        return None


def test_notify_at_fires_while_input_is_paused():
    items = [("a", "x"), TestingSource.PAUSE(timedelta(milliseconds=300)), ("a", "y")]
    got = run_op(items, lambda s: op.stateful_batch("sb", s, Timer))
    assert got == [("a", "x"), ("a", "notified"), ("a", "y"), ("a", "eof")]


def test_naive_notify_at_is_a_type_error():
    class Naive(Timer):
        def notify_at(self) -> Optional[datetime]:
            return datetime.now()

    with pytest.raises(DataflowError, match="notify_at") as ei:
        run_op([("a", "x")], lambda s: op.stateful_batch("sb", s, Naive))
    assert "timezone-aware" in str(ei.value.__cause__)


class ItemCounter(StatefulLogic[int, int, int]):
    def __init__(self, resume: Optional[int]) -> None:
        self.n = resume or 0

    def on_item(self, value: int) -> Tuple[List[int], bool]:
        self.n += 1
        return [self.n], self.DISCARD if value < 0 else self.RETAIN

    def on_eof(self) -> Tuple[List[int], bool]:
        return [-self.n], self.RETAIN

    def snapshot(self) -> int:
        return self.n


def test_stateful_calls_on_item_and_restarts_after_mid_batch_discard():
    items = [("a", 1), ("a", -1), ("a", 1), ("a", 1)]
    got = run_op(items, lambda s: op.stateful("st", s, ItemCounter), batch_size=4)
    assert got == [("a", 1), ("a", 2), ("a", 1), ("a", 2), ("a", -2)]


def test_collect_emits_full_lists_and_rest_at_eof():
    items = [("a", i) for i in range(5)]
    got = run_op(items, lambda s: op.collect("c", s, timedelta(seconds=10), 2), batch_size=5)
    assert got == [("a", [0, 1]), ("a", [2, 3]), ("a", [4])]


def test_collect_emits_on_timeout():
    items = [("a", 1), ("a", 2), TestingSource.PAUSE(timedelta(milliseconds=300)), ("a", 3)]
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource(items))
    out: List[Any] = []
    c = op.collect("c", s, timedelta(milliseconds=50), 10)
    op.output("out", op.map("stamp", c, lambda kv: (kv, time.monotonic())), TestingSink(out))
    run_main(flow)
    assert [kv for kv, _ in out] == [("a", [1, 2]), ("a", [3])]


def test_collect_validates_arguments():
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource([]))
    with pytest.raises(ValueError, match="max_size"):
        op.collect("c", s, timedelta(seconds=1), 0)
    with pytest.raises(TypeError, match="timeout"):
        op.collect("c2", s, 1, 2)  # type: ignore[arg-type]


def test_fold_reduce_count_max_min_final():
    kv = [("a", 3), ("b", 1), ("a", 5), ("a", 4)]
    assert sorted(
        run_op(kv, lambda s: op.fold_final("f", s, list, lambda acc, v: acc + [v]))
    ) == [("a", [3, 5, 4]), ("b", [1])]
    assert sorted(run_op(kv, lambda s: op.reduce_final("r", s, lambda a, b: a + b))) == [
        ("a", 12),
        ("b", 1),
    ]
    assert run_op(["x", "y", "x"], lambda s: op.count_final("c", s, lambda w: w)) == [
        ("x", 2),
        ("y", 1),
    ]
    assert sorted(run_op(kv, lambda s: op.max_final("mx", s))) == [("a", 5), ("b", 1)]
    assert sorted(run_op(kv, lambda s: op.min_final("mn", s))) == [("a", 3), ("b", 1)]
    assert sorted(run_op(kv, lambda s: op.max_final("mx", s, by=lambda v: -v))) == [
        ("a", 3),
        ("b", 1),
    ]


def test_reduce_final_keeps_none_values():
    got = run_op([("a", None), ("a", None)], lambda s: op.reduce_final("r", s, lambda a, b: a))
    assert got == [("a", None)]


def test_count_final_key_must_be_str():
    with pytest.raises(DataflowError) as ei:
        run_op([1], lambda s: op.count_final("c", s, lambda x: x))
    assert "must be a str" in str(ei.value.__cause__)


def _join(items_l: List[Any], items_r: List[Any], **modes: str) -> List[Any]:
    flow = Dataflow("t")
    # Interleave deterministically: one item per epoch from each side.
    left = op.input("l", flow, TestingSource(items_l))
    right = op.input("r", flow, TestingSource(items_r))
    out: List[Any] = []
    op.output("out", op.join("j", left, right, **modes), TestingSink(out))
    run_main(flow, epoch_interval=timedelta(0))
    return out


def test_join_complete_emits_once_all_sides_seen_then_resets():
    got = _join([("a", 1), ("b", 2), ("a", 3)], [("a", "x"), ("c", "z"), ("a", "y")])
    assert got == [("a", (1, "x")), ("a", (3, "y"))]


def test_join_final_emits_at_eof_with_missing_sides_as_none():
    got = _join([("a", 1), ("b", 2)], [("a", "x")], emit_mode="final")
    assert sorted(got) == [("a", (1, "x")), ("b", (2, None))]


def test_join_running_emits_on_every_value():
    got = _join([("a", 1), ("a", 2)], [("a", "x")], emit_mode="running")
    assert got == [("a", (1, None)), ("a", (1, "x")), ("a", (2, "x"))]


def test_join_first_keeps_first_value():
    got = _join([("a", 1), ("a", 2)], [], insert_mode="first", emit_mode="final")
    assert got == [("a", (1, None))]


def test_join_product_emits_cartesian_product():
    got = _join([("a", 1), ("a", 2)], [("a", "x")], insert_mode="product", emit_mode="final")
    assert sorted(got) == [("a", (1, "x")), ("a", (2, "x"))]


def test_join_rejects_unknown_modes():
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource([]))
    with pytest.raises(ValueError, match="insert_mode"):
        op.join("j", s, s, insert_mode="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="emit_mode"):
        op.join("j2", s, s, emit_mode="never")  # type: ignore[arg-type]


def test_a_duck_typed_logic_without_the_optional_methods_runs():
    # Not a StatefulBatchLogic subclass, and without notify_at, on_notify
    # or on_eof: it behaves as if it had the defaults.
    class Bare:
        def __init__(self, state):
            self.n = state or 0

        def on_batch(self, values):
            self.n += len(values)
            return [self.n], False

        def snapshot(self):
            return self.n

    from millpond.dataflow import Dataflow
    import millpond.operators as op
    from millpond.testing import TestingSink, TestingSource, run_main

    flow = Dataflow("bare")
    out: list = []
    keyed = op.key_on("k", op.input("in", flow, TestingSource(["a", "b", "a"])), lambda x: x)
    op.output("out", op.stateful_batch("s", keyed, Bare), TestingSink(out))
    run_main(flow)
    assert out == [("a", 1), ("b", 1), ("a", 2)]
