"""connectors.demo.RandomMetricSource: values, count, pacing with
next_awake, and resume: a run aborted part-way and resumed from recovery
data emits the rest of the count, continuing where it stopped."""

from __future__ import annotations

import random
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

import millpond.operators as op
from millpond.connectors.demo import RandomMetricSource
from millpond.dataflow import Dataflow
from millpond.errors import AbortExecution
from millpond.recovery import RecoveryConfig
from millpond.testing import TestingSink, poll_next_batch, run_main

ZERO = timedelta(0)


def metric_flow(source, out, flow_id="metrics"):
    flow = Dataflow(flow_id)
    s = op.input("inp", flow, source)
    op.output("out", s, TestingSink(out))
    return flow


def test_emits_count_items_of_metric_name_then_ends():
    out: list = []
    src = RandomMetricSource("cpu", interval=ZERO, count=5, next_random=random.Random(7).random)
    run_main(metric_flow(src, out))
    expect = random.Random(7)
    assert out == [("cpu", expect.random()) for _ in range(5)]
    assert src.list_parts() == ["cpu"]


def test_count_zero_emits_nothing():
    out: list = []
    run_main(metric_flow(RandomMetricSource("cpu", interval=ZERO, count=0), out))
    assert out == []


def test_default_values_are_floats_in_unit_interval():
    out: list = []
    run_main(metric_flow(RandomMetricSource("m", interval=ZERO, count=20), out))
    assert len(out) == 20
    assert all(name == "m" and 0.0 <= v < 1.0 for name, v in out)


def test_sleeps_between_items():
    part = RandomMetricSource("m", interval=timedelta(milliseconds=200), count=3).build_part("s", "m", None)
    assert part.next_awake() is None  # the first item comes at once
    t0 = time.monotonic()
    first = poll_next_batch(part)
    awake = part.next_awake()
    assert awake is not None
    ahead = (awake - datetime.now(timezone.utc)).total_seconds()
    assert 0.1 < ahead <= 0.2
    assert part.next_batch() == []  # called early: nothing
    second = poll_next_batch(part)
    third = poll_next_batch(part)
    elapsed = time.monotonic() - t0
    assert [x[0] for x in first + second + third] == ["m", "m", "m"]
    assert 0.35 < elapsed < 2
    with pytest.raises(StopIteration):
        part.next_batch()
    assert part.snapshot() == 3


def test_a_flow_waits_without_burning_a_core():
    out: list = []
    src = RandomMetricSource("m", interval=timedelta(milliseconds=150), count=4)
    cpu0 = time.process_time()
    t0 = time.monotonic()
    run_main(metric_flow(src, out), epoch_interval=timedelta(milliseconds=50))
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    assert len(out) == 4
    assert wall >= 0.4
    assert cpu < 0.5 * wall + 0.2


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        RandomMetricSource("m", interval=timedelta(seconds=-1))
    with pytest.raises(ValueError):
        RandomMetricSource("m", count=-1)
    with pytest.raises(TypeError):
        RandomMetricSource(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RandomMetricSource("m", next_random=0.5)  # type: ignore[arg-type]


class AbortOnce:
    """``next_random`` that yields 0, 1, 2, ... and aborts the execution the
    first time it is asked for value ``abort_at`` (once per object)."""

    def __init__(self, abort_at: int) -> None:
        self.abort_at = abort_at
        self.fired = False
        self.lock = threading.Lock()
        self.next = 0

    def __call__(self) -> float:
        with self.lock:
            if self.next == self.abort_at and not self.fired:
                self.fired = True
                raise AbortExecution(f"abort before value {self.next}")
            v = self.next
            self.next += 1
            return float(v)


def test_resume_continues_the_count(tmp_path):
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=str(tmp_path / "backup"))
    gen = AbortOnce(abort_at=4)
    out: list = []
    flow = metric_flow(RandomMetricSource("temp", interval=ZERO, count=10, next_random=gen), out)
    run_main(flow, epoch_interval=ZERO, recovery_config=cfg)  # aborts after 4 items
    assert out == [("temp", float(i)) for i in range(4)]
    run_main(flow, epoch_interval=ZERO, recovery_config=cfg)  # resumes at item 4 of 10
    assert out == [("temp", float(i)) for i in range(10)]
    # a third run resumes after the end: the count is used up
    run_main(flow, epoch_interval=ZERO, recovery_config=cfg)
    assert len(out) == 10


def test_resume_state_is_the_number_emitted():
    src = RandomMetricSource("m", interval=ZERO, count=5, next_random=lambda: 1.0)
    part = src.build_part("s", "m", 3)
    assert part.snapshot() == 3
    assert poll_next_batch(part) == [("m", 1.0)]
    assert poll_next_batch(part) == [("m", 1.0)]
    assert part.snapshot() == 5
    with pytest.raises(StopIteration):
        part.next_batch()


def test_several_metrics_on_several_workers_resume_with_another_worker_count(tmp_path):
    from millpond.testing import cluster_main

    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=str(tmp_path / "backup"))
    gens = {name: AbortOnce(abort_at=3 if name == "b" else 100) for name in "abc"}
    out: list = []
    flow = Dataflow("multi")
    ins = [op.input(f"in_{n}", flow, RandomMetricSource(n, interval=ZERO, count=6, next_random=gens[n])) for n in "abc"]
    op.output("out", op.merge("all", *ins), TestingSink(out))
    cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg, worker_count_per_proc=3)
    first = len(out)
    assert first < 18
    # (the abort in b's partition stops the whole execution)
    cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg, worker_count_per_proc=2)
    per_metric = {n: sum(1 for name, _ in out if name == n) for n in "abc"}
    # each metric emitted its 6 items; items after the last committed epoch
    # of the aborted run may be emitted again, but the resumed run did not
    # start the count over
    assert all(6 <= c < 12 for c in per_metric.values()), per_metric
    assert len(out) - first < 18
    total = len(out)
    cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg, worker_count_per_proc=1)
    assert len(out) == total  # the counts are used up
