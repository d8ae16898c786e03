"""Stateless operators: results, type checks and error wrapping."""

from __future__ import annotations

from typing import Any, Callable, List

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow, Stream
from millpond.errors import DataflowError
from millpond.testing import TestingSink, TestingSource, run_main


def run_op(items: List[Any], build: Callable[[Stream[Any]], Stream[Any]], **kw: Any) -> List[Any]:
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource(items, **kw))
    out: List[Any] = []
    op.output("out", build(s), TestingSink(out))
    run_main(flow)
    return out


def test_map_applies_mapper_to_each_item():
    assert run_op([1, 2, 3], lambda s: op.map("m", s, lambda x: x * 2)) == [2, 4, 6]


def test_filter_keeps_true_items():
    assert run_op([1, 2, 3, 4], lambda s: op.filter("f", s, lambda x: x % 2 == 0)) == [2, 4]


def test_filter_with_non_bool_predicate_is_a_wrapped_type_error():
    with pytest.raises(DataflowError, match="'t.f.flat_map_batch' on worker 0") as ei:
        run_op([1], lambda s: op.filter("f", s, lambda x: x))
    assert isinstance(ei.value.__cause__, TypeError)
    assert "must be a bool" in str(ei.value.__cause__)


def test_filter_map_drops_none():
    got = run_op([1, 2, 3], lambda s: op.filter_map("fm", s, lambda x: None if x == 2 else x))
    assert got == [1, 3]


def test_flat_map_emits_every_element():
    assert run_op(["a b", "c"], lambda s: op.flat_map("fm", s, str.split)) == ["a", "b", "c"]


def test_flatten_emits_elements_and_rejects_non_iterables():
    assert run_op([[1, 2], [3]], lambda s: op.flatten("fl", s)) == [1, 2, 3]
    with pytest.raises(DataflowError) as ei:
        run_op([1], lambda s: op.flatten("fl", s))
    assert isinstance(ei.value.__cause__, TypeError)


def test_flat_map_batch_gets_whole_batches():
    seen: List[List[int]] = []

    def mapper(batch: List[int]) -> List[int]:
        seen.append(list(batch))
        return [sum(batch)]

    got = run_op([1, 2, 3, 4, 5], lambda s: op.flat_map_batch("b", s, mapper), batch_size=2)
    assert seen == [[1, 2], [3, 4], [5]]
    assert got == [3, 7, 5]


def test_inspect_gets_full_step_id_and_passes_items_on():
    seen: List[Any] = []
    got = run_op([1, 2], lambda s: op.inspect("i", s, lambda sid, x: seen.append((sid, x))))
    assert got == [1, 2]
    assert seen == [("t.i", 1), ("t.i", 2)]


def test_inspect_default_prints_step_id_and_repr(capsys: Any):
    run_op(["x"], lambda s: op.inspect("i", s))
    assert capsys.readouterr().out == "t.i: 'x'\n"


def test_inspect_debug_gets_epoch_and_worker():
    seen: List[Any] = []
    run_op(
        [1],
        lambda s: op.inspect_debug("d", s, lambda sid, x, e, w: seen.append((sid, x, e, w))),
    )
    assert seen == [("t.d", 1, 1, 0)]


def test_key_on_pairs_key_with_item_and_requires_str():
    assert run_op([1, 2], lambda s: op.key_on("k", s, str)) == [("1", 1), ("2", 2)]
    with pytest.raises(DataflowError, match="'t.k'") as ei:
        run_op([1], lambda s: op.key_on("k", s, lambda x: x))
    assert "must be a str" in str(ei.value.__cause__)


def test_key_rm_drops_keys():
    assert run_op([("a", 1)], lambda s: op.key_rm("r", s)) == [1]


def test_map_value_keeps_key():
    assert run_op([("a", 1)], lambda s: op.map_value("mv", s, lambda v: v + 1)) == [("a", 2)]


def test_map_value_on_unkeyed_item_names_the_step():
    with pytest.raises(DataflowError, match="'t.mv'") as ei:
        run_op([5], lambda s: op.map_value("mv", s, lambda v: v))
    assert "keyed stream" in str(ei.value.__cause__)


def test_flat_map_value_filter_value_filter_map_value():
    assert run_op([("a", "x y")], lambda s: op.flat_map_value("f", s, str.split)) == [
        ("a", "x"),
        ("a", "y"),
    ]
    assert run_op([("a", 1), ("b", 2)], lambda s: op.filter_value("f", s, lambda v: v > 1)) == [
        ("b", 2)
    ]
    got = run_op(
        [("a", 1), ("b", 2)], lambda s: op.filter_map_value("f", s, lambda v: v if v > 1 else None)
    )
    assert got == [("b", 2)]


def test_branch_splits_by_predicate():
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource([1, 2, 3, 4]))
    b = op.branch("b", s, lambda x: x % 2 == 0)
    evens: List[int] = []
    odds: List[int] = []
    op.output("e", b.trues, TestingSink(evens))
    op.output("o", b.falses, TestingSink(odds))
    run_main(flow)
    assert (evens, odds) == ([2, 4], [1, 3])


def test_branch_with_non_bool_predicate_is_a_type_error():
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource([1]))
    b = op.branch("b", s, lambda x: "yes")
    op.output("e", b.trues, TestingSink([]))
    with pytest.raises(DataflowError) as ei:
        run_main(flow)
    assert isinstance(ei.value.__cause__, TypeError)


def test_merge_combines_streams():
    flow = Dataflow("t")
    a = op.input("a", flow, TestingSource([1, 2]))
    b = op.input("b", flow, TestingSource([3]))
    out: List[int] = []
    op.output("out", op.merge("m", a, b), TestingSink(out))
    run_main(flow)
    assert sorted(out) == [1, 2, 3]


def test_raises_fails_the_flow():
    flow = Dataflow("t")
    op.raises("boom", op.input("inp", flow, TestingSource([1])))
    op.output("out", op.input("inp2", flow, TestingSource([1])), TestingSink([]))
    with pytest.raises(DataflowError, match="t.boom"):
        run_main(flow)


def test_user_exception_is_wrapped_with_cause_step_and_worker():
    def bad(x: int) -> int:
        raise ZeroDivisionError("nope")

    with pytest.raises(DataflowError) as ei:
        run_op([1], lambda s: op.map("m", s, bad))
    assert isinstance(ei.value.__cause__, ZeroDivisionError)
    msg = str(ei.value)
    assert "'t.m.flat_map_batch'" in msg and "worker 0" in msg and "nope" in msg


def test_mapper_mutating_its_batch_does_not_affect_other_readers():
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource([3, 1, 2], batch_size=3))
    a: List[int] = []
    b: List[int] = []

    def clobber(batch: List[int]) -> List[int]:
        batch.clear()
        return []

    op.output("a", op.flat_map_batch("x", s, clobber), TestingSink(a))
    op.output("b", s, TestingSink(b))
    run_main(flow)
    assert b == [3, 1, 2]
