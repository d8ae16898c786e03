"""The engine's side of recovery, against a fake recovery run: what is
snapshotted when, what a resumed execution restores and replays."""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any, List, Optional, Tuple

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.errors import DataflowError
from millpond.outputs import DynamicSink, StatelessSinkPartition
from millpond.testing import TestingSink, TestingSource, cluster_main, run_main

from helpers.engine_fakes import FakeDurable, install

EOF_ = TestingSource.EOF
ABORT = TestingSource.ABORT


@pytest.fixture(autouse=True)
def _fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)


def _sum_flow(items: List[Any], out: List[Any]) -> Dataflow:
    flow = Dataflow("sums")
    s = op.input("inp", flow, TestingSource(items))
    s = op.stateful_map("sum", s, lambda st, v: ((st or 0) + v, (st or 0) + v))
    op.output("out", s, TestingSink(out))
    return flow


ZERO = timedelta(0)


def test_abort_before_any_commit_replays_all_input():
    items = [("a", 1), ("a", 2), ABORT(), ("a", 3)]
    out: List[Any] = []
    flow = _sum_flow(items, out)
    durable = FakeDurable()
    run_main(flow, recovery_config=durable)  # one long epoch: nothing commits
    assert out == [("a", 1), ("a", 3)]
    assert durable.committed_epoch == 0
    out.clear()
    run_main(flow, recovery_config=durable)
    assert out == [("a", 1), ("a", 3), ("a", 6)]


def test_abort_after_committed_epochs_resumes_after_the_last_one():
    items = [("a", 1), ("a", 2), ABORT(), ("a", 3)]
    out: List[Any] = []
    flow = _sum_flow(items, out)
    durable = FakeDurable()
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    assert out == [("a", 1), ("a", 3)]
    assert durable.committed_epoch == 2
    out.clear()
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    assert out == [("a", 6)]
    assert ("open", 1, 3) in durable.events


def test_eof_marker_ends_the_run_and_the_next_run_continues_after_it():
    items = [("a", 1), EOF_(), ("a", 10), EOF_(), ("a", 100)]
    out: List[Any] = []
    flow = _sum_flow(items, out)
    durable = FakeDurable()
    for expected in ([("a", 1)], [("a", 11)], [("a", 111)], []):
        out.clear()
        run_main(flow, recovery_config=durable)
        assert out == expected


def test_items_appended_after_a_finished_run_are_read_by_the_next_run():
    items: List[Any] = [("a", 1)]
    out: List[Any] = []
    flow = _sum_flow(items, out)
    durable = FakeDurable()
    run_main(flow, recovery_config=durable)
    items.append(("a", 5))
    out.clear()
    run_main(flow, recovery_config=durable)
    assert out == [("a", 6)]


def test_without_recovery_each_run_starts_over():
    items = [("a", 1), EOF_(), ("a", 10)]
    out: List[Any] = []
    flow = _sum_flow(items, out)
    run_main(flow)
    run_main(flow)
    assert out == [("a", 1), ("a", 1)]


def test_discarded_keys_are_deleted_and_not_restored():
    def mapper(st: Optional[int], v: int) -> Tuple[Optional[int], int]:
        n = (st or 0) + v
        return (None if v == 0 else n), n

    items = [("a", 1), ("b", 1), ("a", 0), EOF_(), ("a", 5), ("b", 5)]
    flow = Dataflow("d")
    out: List[Any] = []
    s = op.stateful_map("sm", op.input("inp", flow, TestingSource(items)), mapper)
    op.output("out", s, TestingSink(out))
    durable = FakeDurable()
    run_main(flow, recovery_config=durable)
    assert durable.state_at(durable.committed_epoch).get(("d.sm.stateful_batch", "a")) is None
    out.clear()
    run_main(flow, recovery_config=durable)
    assert sorted(out) == [("a", 5), ("b", 6)]


@pytest.mark.parametrize("workers", [(1, 3), (3, 2), (2, 2)])
def test_state_is_restored_for_any_worker_count(workers: Tuple[int, int]):
    keys = [f"k{i}" for i in range(12)]
    items: List[Any] = [(k, 1) for k in keys] + [EOF_()] + [(k, 1) for k in keys]
    out: List[Any] = []
    flow = _sum_flow(items, out)
    durable = FakeDurable()
    cluster_main(flow, [], 0, recovery_config=durable, worker_count_per_proc=workers[0])
    out.clear()
    cluster_main(flow, [], 0, recovery_config=durable, worker_count_per_proc=workers[1])
    assert sorted(out) == sorted((k, 2) for k in keys)


def test_newest_snapshot_per_key_is_found_across_several_executions():
    items = [("a", 1), EOF_(), ("b", 1), EOF_(), ("b", 1), EOF_(), ("a", 1), ("b", 1)]
    out: List[Any] = []
    flow = _sum_flow(items, out)
    durable = FakeDurable()
    for _ in range(4):
        out.clear()
        run_main(flow, recovery_config=durable)
    assert out == [("a", 2), ("b", 3)]


def test_fold_final_state_survives_an_abort_and_emits_once_at_eof():
    items = [("a", 1), ("a", 2), ABORT(), ("a", 3)]
    flow = Dataflow("f")
    out: List[Any] = []
    s = op.fold_final("fold", op.input("inp", flow, TestingSource(items)), lambda: 0, lambda a, v: a + v)
    op.output("out", s, TestingSink(out))
    durable = FakeDurable()
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    assert out == []
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    assert out == [("a", 6)]


class _LoggingSink(DynamicSink[Any]):
    def __init__(self, log: List[Any]) -> None:
        self.log = log

    def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
        log = self.log

        class Part(StatelessSinkPartition[Any]):
            def write_batch(self, items: List[Any]) -> None:
                log.extend(("write", x) for x in items)

        return Part()


def test_an_epochs_outputs_are_written_before_it_is_closed():
    durable = FakeDurable()
    flow = Dataflow("o")
    s = op.input("inp", flow, TestingSource([1, 2, 3]))
    op.output("out", s, _LoggingSink(durable.events))  # type: ignore[arg-type]
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    seq = [e for e in durable.events if e[0] in ("write", "close")]
    assert seq == [
        ("write", 1),
        ("close", 0, 1),
        ("write", 2),
        ("close", 0, 2),
        ("write", 3),
        ("close", 0, 3),
        ("close", 0, 4),  # the partition's EOF closes one more (empty) epoch
    ]


def test_error_in_user_code_finishes_the_run_as_aborted_and_keeps_commits():
    items = [("a", 1), ("a", -1)]

    def mapper(st: Optional[int], v: int) -> Tuple[int, int]:
        if v < 0:
            raise ValueError("negative")
        return (st or 0) + v, v

    flow = Dataflow("e")
    s = op.stateful_map("sm", op.input("inp", flow, TestingSource(items)), mapper)
    op.output("out", s, TestingSink([]))
    durable = FakeDurable()
    with pytest.raises(DataflowError, match="for key 'a'"):
        run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    assert ("finish", True) in durable.events
    assert durable.committed_epoch == 1


def test_source_positions_are_snapshotted_each_epoch():
    items = [1, 2, 3]
    flow = Dataflow("p")
    op.output("out", op.input("inp", flow, TestingSource(items)), TestingSink([]))
    durable = FakeDurable()
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    positions = [e for e, _ in durable.rows[("p.inp", "iterable")]]
    assert positions[:3] == [1, 2, 3]
    assert durable.state_at(durable.committed_epoch)[("p.inp", "iterable")] == 3


def test_timers_are_asked_again_for_restored_keys():
    from datetime import datetime, timezone

    from millpond.operators import StatefulBatchLogic

    class Remind(StatefulBatchLogic):
        def __init__(self, resume: Any) -> None:
            self.at = resume

        def on_batch(self, values: List[Any]) -> Any:
            self.at = datetime.now(timezone.utc)  # due right away
            return [], self.RETAIN

        def on_notify(self) -> Any:
            self.at = None
            return ["reminded"], self.DISCARD

        def notify_at(self) -> Any:
            return self.at

        def snapshot(self) -> Any:
            return self.at

    # Committed state holds key "a" with a timer that is already due; the
    # input is empty, so only a re-armed timer can produce output.
    flow = Dataflow("timers")
    out: List[Any] = []
    s = op.stateful_batch("r", op.input("inp", flow, TestingSource([])), Remind)
    op.output("out", s, TestingSink(out))
    durable = FakeDurable()
    due = pickle.dumps(datetime.now(timezone.utc))
    durable.rows[("timers.r", "a")] = [(1, due)]
    durable.committed_epoch = 1
    run_main(flow, recovery_config=durable)
    assert out == [("a", "reminded")]


def test_unpicklable_state_is_a_dataflow_error_naming_the_step():
    import threading

    flow = Dataflow("u")
    inp = op.input("inp", flow, TestingSource([("a", 1)]))
    s = op.stateful_map("sm", inp, lambda st, v: (threading.Lock(), v))
    op.output("out", s, TestingSink([]))
    durable = FakeDurable()
    with pytest.raises(DataflowError, match="u.sm.stateful_batch") as ei:
        run_main(flow, recovery_config=durable)
    assert ei.value.__cause__ is not None


def test_only_the_final_epoch_is_closed_as_the_last():
    # The recovery layer lets the last epoch skip the wait for compaction
    # (the run ends right after it): only the epoch in which every input
    # ended may say so, on every worker.
    items = [("a", 1), ("b", 2), ("a", 3), ("c", 4)]
    durable = FakeDurable()
    flow = _sum_flow(items, [])
    cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=durable, worker_count_per_proc=2)
    last_epoch = max(e for _, e, _ in durable.closes)
    assert last_epoch > 1
    assert [(w, e) for w, e, last in durable.closes if last] == [(0, last_epoch), (1, last_epoch)]
    assert all(not last for _, e, last in durable.closes if e < last_epoch)

    durable = FakeDurable()
    run_main(_sum_flow([("a", 1), ABORT(), ("a", 2)], []), epoch_interval=ZERO, recovery_config=durable)
    assert durable.closes and not any(last for *_, last in durable.closes), "an aborted run has no last epoch"


class _EofEmitter(op.StatefulBatchLogic):
    """Sums values; at EOF emits the sum and doubles its state."""

    def __init__(self, state: Optional[int]) -> None:
        self.total = state or 0

    def on_batch(self, values: List[int]) -> Tuple[List[int], bool]:
        self.total += sum(values)
        return [], False

    def on_eof(self) -> Tuple[List[int], bool]:
        self.total *= 2
        return [self.total], False

    def snapshot(self) -> int:
        return self.total


def _map_and_eof_flow(items: List[Any], out: List[Any]) -> Dataflow:
    """A running sum by stateful_map (default on_eof) beside _EofEmitter."""
    flow = Dataflow("eof")
    s = op.input("inp", flow, TestingSource(items))
    op.output("maps", op.stateful_map("m", s, lambda st, v: ((st or 0) + v, (st or 0) + v)), TestingSink(out))
    op.output("sums", op.stateful_batch("e", s, _EofEmitter), TestingSink(out))
    return flow


def test_end_of_input_snapshots_only_keys_whose_on_eof_can_change_them():
    items = [("a", 1), ("b", 2), ("a", 3), EOF_(), ("a", 1)]
    out: List[Any] = []
    flow = _map_and_eof_flow(items, out)
    durable = FakeDurable()
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    # Every item is an epoch and EOF closes a fourth. stateful_map keeps the
    # default on_eof (nothing to emit, state kept), so its keys are written
    # only in the epochs that changed them, not again at EOF; the step whose
    # on_eof changes its state is written as of EOF.
    written = {k: [e for e, _ in rows] for (st, k), rows in durable.rows.items() if st == "eof.m.stateful_batch"}
    assert written == {"a": [1, 3], "b": [2]}
    assert durable.state_at(4)[("eof.e", "a")] == 8 and durable.state_at(4)[("eof.e", "b")] == 4
    assert sorted(x for x in out if x[0] == "a") == [("a", 1), ("a", 4), ("a", 8)]
    # The state left by EOF is what the next run continues from.
    out.clear()
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    assert ("a", 5) in out and ("a", 18) in out


def test_end_of_input_of_a_resumed_stateful_map_leaves_stored_keys_unread():
    items = [("a", 1), ("b", 2), EOF_(), ("a", 1), EOF_()]
    out: List[Any] = []
    flow = _map_and_eof_flow(items, out)
    durable = FakeDurable()
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    out.clear()
    run_main(flow, epoch_interval=ZERO, recovery_config=durable)
    live = set(durable.runs[-1].stores[0].live)
    # stateful_map's logic keeps the default on_eof: EOF does not build b.
    assert ("eof.m.stateful_batch", "b") not in live
    # A logic with its own on_eof runs it for every key, stored ones too.
    assert {("eof.e", "a"), ("eof.e", "b")} <= live
    assert sorted(out) == [("a", 2), ("a", 6), ("b", 8)]
