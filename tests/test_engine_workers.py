"""Several cooperative workers: routing, partitions, epochs, EOF, Ctrl-C."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from datetime import timedelta
from typing import Any, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import millpond.operators as op
from millpond import _core
from millpond.dataflow import Dataflow
from millpond.inputs import FixedPartitionedSource, StatefulSourcePartition
from millpond.keygroup import worker_for_key
from millpond.outputs import FixedPartitionedSink, StatefulSinkPartition
from millpond.testing import TestingSink, TestingSource, cluster_main, run_main


def _word_flow(words: List[str], out: List[Any], batch_size: int) -> Dataflow:
    flow = Dataflow("wc")
    s = op.input("inp", flow, TestingSource(words, batch_size=batch_size))
    s = op.redistribute("spread", s)
    counts = op.count_final("count", s, lambda w: w)
    keyed = op.key_on("key", s, lambda w: w)
    running = op.stateful_map("run", keyed, lambda st, v: ((st or 0) + 1, (st or 0) + 1))
    joined = op.join("j", counts, op.max_final("mx", running), emit_mode="final")
    op.output("out", op.merge("all", joined, running), TestingSink(out))
    return flow


@settings(max_examples=20, deadline=None)
@given(
    words=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "gg", "hh"]), max_size=40),
    workers=st.integers(min_value=2, max_value=5),
    batch_size=st.integers(min_value=1, max_value=7),
)
def test_n_workers_give_the_same_multiset_of_outputs_as_one(
    words: List[str], workers: int, batch_size: int
):
    one: List[Any] = []
    run_main(_word_flow(words, one, batch_size))
    many: List[Any] = []
    cluster_main(_word_flow(words, many, batch_size), [], 0, worker_count_per_proc=workers)
    assert Counter(map(repr, one)) == Counter(map(repr, many))
    assert sorted(v for k, v in one if isinstance(v, tuple)) == sorted(
        (c, c) for c in Counter(words).values()
    )


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.text(max_size=12), max_size=80),
    groups=st.integers(1, 5000),
    workers=st.integers(1, 40),
)
def test_route_keyed_gives_each_item_to_its_keys_owner_in_order(keys: List[str], groups: int, workers: int):
    items = [(k, i) for i, k in enumerate(keys)]
    parts = _core.route_keyed(items, groups, workers)
    assert parts is not None and len(parts) == workers
    for w, part in enumerate(parts):
        assert all(worker_for_key(k, workers, groups) == w for k, _ in part)
        assert [i for _, i in part] == sorted(i for _, i in part)  # order kept
    assert sorted((i for part in parts for _, i in part)) == list(range(len(items)))


@pytest.mark.parametrize("bad", [1, ("k",), ("k", 1, 2), (1, "v"), ["k", 1], (b"k", 1)])
def test_route_keyed_refuses_a_batch_holding_an_item_that_is_not_keyed(bad: Any):
    assert _core.route_keyed([("a", 1), bad, ("b", 2)], 256, 2) is None


def test_route_keyed_raises_for_a_key_utf8_cannot_encode():
    with pytest.raises(UnicodeEncodeError):
        _core.route_keyed([("\ud800", 1)], 256, 2)
    with pytest.raises(ValueError, match="at least 1 worker"):
        _core.route_keyed([], 256, 0)


def test_keyed_items_are_processed_on_the_worker_owning_the_key():
    flow = Dataflow("t")
    keys = [f"key{i}" for i in range(40)]
    s = op.input("inp", flow, TestingSource([(k, 1) for k in keys]))
    s = op.stateful_map("sm", s, lambda st, v: (v, v))
    seen: List[Tuple[str, int]] = []
    s = op.inspect_debug("who", s, lambda sid, kv, e, w: seen.append((kv[0], w)))
    op.output("out", s, TestingSink([]))
    cluster_main(flow, [], 0, worker_count_per_proc=4)
    assert sorted(seen) == sorted((k, worker_for_key(k, 4)) for k in keys)


class _Part(StatefulSourcePartition[Tuple[str, int], int]):
    def __init__(self, name: str, n: int, resume: Optional[int]) -> None:
        self.name, self.n, self.i = name, n, resume or 0

    def next_batch(self) -> List[Tuple[str, int]]:
        if self.i >= self.n:
            raise StopIteration()
        self.i += 1
        return [(self.name, self.i - 1)]

    def snapshot(self) -> int:
        return self.i


class _PartsSource(FixedPartitionedSource[Tuple[str, int], int]):
    def __init__(self, parts: List[str], n: int) -> None:
        self.parts, self.n = parts, n

    def list_parts(self) -> List[str]:
        return self.parts

    def build_part(self, step_id: str, for_part: str, resume: Optional[int]) -> _Part:
        return _Part(for_part, self.n, resume)


def test_fixed_partitions_are_assigned_to_the_worker_owning_their_name():
    parts = [f"p{i}" for i in range(7)]
    flow = Dataflow("t")
    s = op.input("inp", flow, _PartsSource(parts, 3))
    seen: List[Tuple[str, int, int]] = []
    s = op.inspect_debug("who", s, lambda sid, x, e, w: seen.append((x[0], x[1], w)))
    op.output("out", s, TestingSink([]))
    cluster_main(flow, [], 0, worker_count_per_proc=3)
    assert sorted(seen) == sorted((p, i, worker_for_key(p, 3)) for p in parts for i in range(3))


def test_redistribute_spreads_a_single_partition_over_all_workers():
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource(list(range(30)), batch_size=10))
    s = op.redistribute("spread", s)
    workers: List[int] = []
    s = op.inspect_debug("who", s, lambda sid, x, e, w: workers.append(w))
    out: List[int] = []
    op.output("out", s, TestingSink(out))
    cluster_main(flow, [], 0, worker_count_per_proc=3)
    assert sorted(out) == list(range(30))
    assert Counter(workers) == {0: 10, 1: 10, 2: 10}


class _ListPart(StatefulSinkPartition[Any, int]):
    def __init__(self, out: List[Any], resume: Optional[int]) -> None:
        self.out = out
        del out[resume or 0 :]

    def write_batch(self, values: List[Any]) -> None:
        self.out.extend(values)

    def snapshot(self) -> int:
        return len(self.out)


class _ListsSink(FixedPartitionedSink[Any, int]):
    def __init__(self, n: int) -> None:
        self.lists = {f"part{i}": [] for i in range(n)}

    def list_parts(self) -> List[str]:
        return list(self.lists)

    def build_part(self, step_id: str, for_part: str, resume: Optional[int]) -> _ListPart:
        return _ListPart(self.lists[for_part], resume)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_partitioned_sink_routes_values_by_part_fn(workers: int):
    flow = Dataflow("t")
    keys = [f"k{i}" for i in range(20)]
    s = op.input("inp", flow, TestingSource([(k, k.upper()) for k in keys]))
    sink = _ListsSink(3)
    op.output("out", s, sink)
    cluster_main(flow, [], 0, worker_count_per_proc=workers)
    names = sink.list_parts()
    for k in keys:
        assert k.upper() in sink.lists[names[sink.part_fn(k) % 3]]
    assert sum(len(v) for v in sink.lists.values()) == 20


def test_partitioned_sink_needs_keyed_items():
    from millpond.errors import DataflowError

    flow = Dataflow("t")
    op.output("out", op.input("inp", flow, TestingSource([1])), _ListsSink(2))
    with pytest.raises(DataflowError) as ei:
        run_main(flow)
    assert isinstance(ei.value.__cause__, TypeError)


def _epochs(items: List[Any], interval: Optional[timedelta], batch_size: int = 1) -> List[int]:
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource(items, batch_size=batch_size))
    epochs: List[int] = []
    s = op.inspect_debug("ep", s, lambda sid, x, e, w: epochs.append(e))
    op.output("out", s, TestingSink([]))
    run_main(flow, epoch_interval=interval)
    return epochs


def test_zero_epoch_interval_makes_every_batch_its_own_epoch():
    assert _epochs(list(range(6)), timedelta(0), batch_size=2) == [1, 1, 2, 2, 3, 3]


def test_default_interval_keeps_a_short_input_in_epoch_one():
    assert _epochs(list(range(5)), None) == [1] * 5


def test_epochs_advance_with_the_interval():
    items = [1, TestingSource.PAUSE(timedelta(milliseconds=120)), 2]
    epochs = _epochs(items, timedelta(milliseconds=40))
    assert epochs[0] == 1 and epochs[1] >= 3


def test_negative_epoch_interval_is_rejected():
    with pytest.raises(ValueError, match="negative"):
        _epochs([1], timedelta(seconds=-1))


def test_eof_of_one_input_reaches_its_steps_before_another_input_ends():
    flow = Dataflow("t")
    short = op.input("short", flow, TestingSource(["x", "y"]))
    long = op.input("long", flow, TestingSource([1, TestingSource.PAUSE(timedelta(milliseconds=200)), 2]))
    events: List[Tuple[str, int]] = []
    counts = op.count_final("count", short, lambda w: w)
    counts = op.inspect_debug("c", counts, lambda sid, x, e, w: events.append(("count", e)))
    long = op.inspect_debug("l", long, lambda sid, x, e, w: events.append(("long", e)))
    op.output("o1", counts, TestingSink([]))
    op.output("o2", long, TestingSink([]))
    run_main(flow, epoch_interval=timedelta(0))
    count_epochs = [e for what, e in events if what == "count"]
    long_epochs = [e for what, e in events if what == "long"]
    assert len(count_epochs) == 2 and max(count_epochs) < max(long_epochs)


@pytest.mark.timeout(30)
def test_cluster_main_names_the_processes_that_never_joined(monkeypatch: pytest.MonkeyPatch):
    from millpond.errors import ClusterError
    from millpond.launch import free_ports

    monkeypatch.setenv("MILLPOND_START_TIMEOUT", "1")
    a, b = free_ports(2)
    flow = Dataflow("t")
    op.output("out", op.input("inp", flow, TestingSource([1])), TestingSink([]))
    with pytest.raises(ClusterError, match=rf"process 1 \(127.0.0.1:{b}\) did not join within 1s"):
        cluster_main(flow, [f"127.0.0.1:{a}", f"127.0.0.1:{b}"], 0)


def test_cluster_main_rejects_zero_workers():
    flow = Dataflow("t")
    op.output("out", op.input("inp", flow, TestingSource([1])), TestingSink([]))
    with pytest.raises(ValueError, match="worker_count_per_proc"):
        cluster_main(flow, [], 0, worker_count_per_proc=0)


@pytest.mark.timeout(20)
def test_ctrl_c_stops_a_waiting_flow_promptly_with_keyboard_interrupt():
    flow = Dataflow("t")
    items = [1, TestingSource.PAUSE(timedelta(seconds=60)), 2]
    op.output("out", op.input("inp", flow, TestingSource(items)), TestingSink([]))
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        run_main(flow)
    timer.join()


def test_group_keyed_queues_values_by_key_in_order() -> None:
    pending: dict[str, list[Any]] = {"a": [0]}
    assert _core.group_keyed([("a", 1), ("b", 2), ("a", 3), ("", None)], pending) is True
    assert pending == {"a": [0, 1, 3], "b": [2], "": [None]}


@pytest.mark.parametrize("bad", [1, ("k",), ("k", 1, 2), (1, "v"), ["k", 1], (b"k", 1)])
def test_group_keyed_refuses_a_batch_holding_an_item_that_is_not_keyed_and_queues_nothing(bad: Any) -> None:
    pending: dict[str, list[Any]] = {}
    assert _core.group_keyed([("a", 1), bad], pending) is False
    assert pending == {}


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "é", ""]), st.integers()), max_size=50))
def test_group_keyed_is_the_python_grouping(items: List[Tuple[str, int]]) -> None:
    want: dict[str, list[int]] = {}
    for k, v in items:
        want.setdefault(k, []).append(v)
    got: dict[str, list[Any]] = {}
    assert _core.group_keyed(list(items), got)
    assert got == want and list(got) == list(want)
