"""millpond.testing's source and sink, and the one AbortExecution class."""

from __future__ import annotations

import itertools
from typing import Any, List, Optional

import pytest

import millpond.errors
import millpond.inputs
import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.inputs import FixedPartitionedSource, StatefulSourcePartition
from millpond.testing import TestingSink, TestingSource, poll_next_batch, run_main


def _collect(source: Any) -> List[Any]:
    flow = Dataflow("t")
    out: List[Any] = []
    op.output("out", op.input("in", flow, source), TestingSink(out))
    run_main(flow)
    return out


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: [1, 2, 3, 4, 5], id="list"),
        pytest.param(lambda: (1, 2, 3, 4, 5), id="tuple"),
        pytest.param(lambda: range(1, 6), id="range"),
        pytest.param(lambda: (n for n in range(1, 6)), id="generator"),
        pytest.param(lambda: iter([1, 2, 3, 4, 5]), id="iterator"),
        pytest.param(lambda: itertools.islice(itertools.count(1), 5), id="islice"),
    ],
)
@pytest.mark.parametrize("batch_size", [1, 2, 10])
def test_testing_source_takes_any_iterable(make, batch_size):
    assert _collect(TestingSource(make(), batch_size=batch_size)) == [1, 2, 3, 4, 5]


def test_testing_source_over_an_endless_generator_is_read_lazily():
    part = TestingSource(itertools.count(), batch_size=3).build_part("s", "iterable", None)
    assert poll_next_batch(part) == [0, 1, 2]
    assert poll_next_batch(part) == [3, 4, 5]
    assert part.snapshot() == 6


def test_testing_source_resumes_a_generator_after_the_items_already_emitted():
    part = TestingSource((c for c in "abcdef"), batch_size=2).build_part("s", "iterable", 3)
    assert poll_next_batch(part) == ["d", "e"]
    assert poll_next_batch(part) == ["f"]
    with pytest.raises(StopIteration):
        part.next_batch()


def test_testing_source_markers_work_in_a_generator():
    items = (x for x in [1, TestingSource.EOF(), 2])
    part = TestingSource(items, batch_size=5).build_part("s", "iterable", None)
    assert poll_next_batch(part) == [1]
    with pytest.raises(StopIteration):
        part.next_batch()
    assert part.snapshot() == 2


def test_testing_source_refuses_what_is_not_iterable():
    with pytest.raises(TypeError, match="TestingSource needs an iterable"):
        TestingSource(42)  # type: ignore[arg-type]


def test_there_is_one_abort_execution_class():
    assert millpond.inputs.AbortExecution is millpond.errors.AbortExecution


class _AbortingPartition(StatefulSourcePartition[int, int]):
    def __init__(self, resume: Optional[int]) -> None:
        self.pos = resume or 0

    def next_batch(self) -> List[int]:
        if self.pos == 3:
            raise millpond.errors.AbortExecution("stop here, as a crash would")
        self.pos += 1
        return [self.pos]

    def snapshot(self) -> int:
        return self.pos


class _AbortingSource(FixedPartitionedSource[int, int]):
    def list_parts(self) -> List[str]:
        return ["p"]

    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _AbortingPartition:
        return _AbortingPartition(resume_state)


def test_the_documented_abort_execution_stops_the_run_without_an_error():
    # Raised from next_batch, millpond.errors.AbortExecution (the exported,
    # documented class) ends the execution quietly, as a crash would.
    assert _collect(_AbortingSource()) == [1, 2, 3]
