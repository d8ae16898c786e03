"""Building flows: step ids, nesting, duplicates, argument checks."""

from __future__ import annotations

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow, Stream, operator
from millpond.testing import TestingSink, TestingSource, run_main


def _ids(flow: Dataflow) -> list:
    return [s.step_id for s in flow._graph.steps]


def test_flow_id_with_dot_is_rejected():
    with pytest.raises(ValueError, match="must not contain '.'"):
        Dataflow("a.b")


def test_flow_id_must_be_str():
    with pytest.raises(TypeError):
        Dataflow(3)  # type: ignore[arg-type]


def test_step_ids_are_prefixed_with_flow_and_nested_under_composites():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1]))
    op.output("out", op.map("double", s, lambda x: x * 2), TestingSink([]))
    assert _ids(flow) == ["f.inp", "f.double.flat_map_batch", "f.out"]


def test_custom_operator_nests_its_steps():
    @operator
    def add_then_double(step_id: str, up: Stream[int]) -> Stream[int]:
        return op.map("double", op.map("add", up, lambda x: x + 1), lambda x: x * 2)

    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1, 2]))
    out: list = []
    op.output("out", add_then_double("calc", s), TestingSink(out))
    assert "f.calc.add.flat_map_batch" in _ids(flow)
    assert "f.calc.double.flat_map_batch" in _ids(flow)
    run_main(flow)
    assert out == [4, 6]


def test_duplicate_step_id_in_one_scope_is_a_value_error():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1]))
    op.map("m", s, str)
    with pytest.raises(ValueError, match="'m' is used twice in 'f'"):
        op.map("m", s, str)


def test_same_step_id_in_different_scopes_is_fine():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1]))
    op.map("a", s, str)
    op.map("b", s, str)  # both have a child "flat_map_batch"
    assert "f.a.flat_map_batch" in _ids(flow) and "f.b.flat_map_batch" in _ids(flow)


def test_step_id_with_dot_is_rejected():
    flow = Dataflow("f")
    with pytest.raises(ValueError, match="must not contain '.'"):
        op.input("a.b", flow, TestingSource([1]))


def test_non_stream_argument_is_a_type_error():
    with pytest.raises(TypeError, match="argument 'up' must be a Stream; got list"):
        op.map("m", [1, 2], str)  # type: ignore[arg-type]


def test_input_needs_a_dataflow():
    with pytest.raises(TypeError, match="argument 'flow' must be a Dataflow"):
        op.input("inp", "flow", TestingSource([1]))  # type: ignore[arg-type]


def test_input_rejects_a_non_source():
    flow = Dataflow("f")
    with pytest.raises(TypeError, match="FixedPartitionedSource or DynamicSource"):
        op.input("inp", flow, [1, 2, 3])


def test_output_rejects_a_non_sink():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1]))
    with pytest.raises(TypeError, match="FixedPartitionedSink or DynamicSink"):
        op.output("out", s, [])


def test_non_callable_mapper_is_a_type_error():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1]))
    with pytest.raises(TypeError, match="`mapper` must be callable"):
        op.map("m", s, 3)  # type: ignore[arg-type]


def test_streams_of_two_flows_cannot_merge():
    a, b = Dataflow("a"), Dataflow("b")
    sa = op.input("inp", a, TestingSource([1]))
    sb = op.input("inp", b, TestingSource([1]))
    with pytest.raises(ValueError, match="another Dataflow"):
        op.merge("m", sa, sb)


def test_then_chains_operators():
    flow = Dataflow("f")
    out: list = []
    (
        op.input("inp", flow, TestingSource([1, 2, 3]))
        .then(op.map, "inc", lambda x: x + 1)
        .then(op.filter, "even", lambda x: x % 2 == 0)
        .then(op.output, "out", TestingSink(out))
    )
    run_main(flow)
    assert out == [2, 4]


def test_a_stream_feeds_every_step_that_reads_it():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1, 2]))
    a: list = []
    b: list = []
    op.output("a", op.map("m", s, lambda x: x * 10), TestingSink(a))
    op.output("b", s, TestingSink(b))
    run_main(flow)
    assert a == [10, 20] and b == [1, 2]


def test_flow_without_input_is_rejected_at_run():
    with pytest.raises(ValueError, match="no input step"):
        run_main(Dataflow("empty"))


def test_flow_without_output_is_rejected_at_run():
    flow = Dataflow("f")
    op.map("m", op.input("inp", flow, TestingSource([1])), str)
    with pytest.raises(ValueError, match="no output or inspect step"):
        run_main(flow)


def test_run_main_rejects_a_non_flow():
    with pytest.raises(TypeError, match="expected a Dataflow"):
        run_main("flow")  # type: ignore[arg-type]
