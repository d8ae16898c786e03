"""The engine's small interfaces: plan compilation, local exchange, progress."""

from __future__ import annotations

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.engine.exchange import LocalExchange, Message
from millpond.engine.plan import compile_plan
from millpond.engine.progress import LocalProgress, SingleProcessProgress
from millpond.testing import TestingSink, TestingSource


def test_plan_lists_consumers_and_input_ancestors():
    flow = Dataflow("p")
    a = op.input("a", flow, TestingSource([]))
    b = op.input("b", flow, TestingSource([]))
    m = op.merge("m", a, b)
    op.output("out", m, TestingSink([]))
    op.output("only_a", a, TestingSink([]))
    plan = compile_plan(flow)
    ids = [s.step_id for s in plan.steps]
    assert ids == ["p.a", "p.b", "p.m", "p.out", "p.only_a"]
    assert plan.steps[0].downs == (((2, 0), (4, 0)),)
    assert plan.steps[1].downs == (((2, 1),),)
    assert plan.steps[3].input_ancestors == frozenset({0, 1})
    assert plan.steps[4].input_ancestors == frozenset({0})
    assert plan.input_indexes == (0, 1)


def test_local_exchange_delivers_in_order_and_counts():
    ex = LocalExchange(2)
    ex.send(1, Message(0, 0, 1, [1]))
    ex.send(1, Message(0, 0, 1, [2]))
    assert ex.pending() and ex.counts() == (2, 0)
    assert ex.receive(0) == []
    assert [m.items for m in ex.receive(1)] == [[1], [2]]
    assert not ex.pending() and ex.counts() == (2, 2)


def test_single_process_progress_closes_only_when_ready_and_quiet():
    p = SingleProcessProgress()
    done = frozenset({0})
    assert p.report(LocalProgress(3, True, 2, 2, done)).close  # type: ignore[union-attr]
    assert not p.report(LocalProgress(3, True, 3, 2, done)).close  # type: ignore[union-attr]
    assert not p.report(LocalProgress(3, False, 2, 2, done)).close  # type: ignore[union-attr]
    assert p.report(LocalProgress(3, True, 2, 2, done)).done_inputs == done  # type: ignore[union-attr]
