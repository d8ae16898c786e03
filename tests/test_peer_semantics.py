"""Semantics that users of the peer (Bytewax 0.21) rely on, one test per
item of the list in issue 14: each of these failed before its fix."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, List, Optional, Tuple

import pytest

import millpond.operators as op
from millpond.connectors.files import DirSink, DirSource, FileSink
from millpond.dataflow import Dataflow
from millpond.errors import AbortExecution, DataflowError
from millpond.inputs import SimplePollingSource
from millpond.operators import StatefulLogic
from millpond.outputs import DynamicSink, StatelessSinkPartition
from millpond.recovery import RecoveryConfig
from millpond.testing import TestingSink, TestingSource, poll_next_batch, run_main

ZERO = timedelta(0)
ABORT = TestingSource.ABORT


# 1. A flow whose only terminal step is an inspect step runs.


@pytest.mark.parametrize(
    "terminal",
    [
        pytest.param(lambda s, seen: op.inspect("look", s, lambda _sid, x: seen.append(x)), id="inspect"),
        pytest.param(
            lambda s, seen: op.inspect_debug("look", s, lambda _sid, x, _e, _w: seen.append(x)),
            id="inspect_debug",
        ),
    ],
)
def test_a_flow_ending_in_an_inspect_step_runs(terminal):
    flow = Dataflow("look_only")
    seen: List[Any] = []
    terminal(op.map("double", op.input("inp", flow, TestingSource([1, 2, 3])), lambda x: x * 2), seen)
    run_main(flow)
    assert seen == [2, 4, 6]


def test_a_flow_ending_in_raises_runs_and_fails_on_the_first_item():
    flow = Dataflow("boom_only")
    op.raises("boom", op.input("inp", flow, TestingSource([1])))
    with pytest.raises(DataflowError, match="boom_only.boom"):
        run_main(flow)
    quiet = Dataflow("quiet")
    op.raises("boom", op.input("inp", quiet, TestingSource([])))
    run_main(quiet)  # no item, no error


def test_a_flow_without_output_or_inspect_step_is_still_refused():
    flow = Dataflow("nothing_out")
    op.map("m", op.input("inp", flow, TestingSource([1])), str)
    with pytest.raises(ValueError, match="has no output or inspect step; add one with op.output"):
        run_main(flow)


# 2. A timer already due fires before the key's next item is applied.


class _NotifyNow(StatefulLogic[int, str, None]):
    calls: List[str] = []

    def __init__(self, _resume: Optional[None]) -> None:
        self.at: Optional[datetime] = None

    def on_item(self, value: int) -> Tuple[Iterable[str], bool]:
        self.calls.append(f"on_item({value})")
        self.at = datetime.now(timezone.utc)
        return [f"item {value}"], self.RETAIN

    def on_notify(self) -> Tuple[Iterable[str], bool]:
        self.calls.append("on_notify")
        self.at = None
        return ["notify"], self.RETAIN

    def notify_at(self) -> Optional[datetime]:
        return self.at

    def snapshot(self) -> None:
        return None


def test_a_due_timer_fires_before_the_next_item_of_its_key():
    _NotifyNow.calls = []
    flow = Dataflow("timers")
    keyed = op.key_on("k", op.input("inp", flow, TestingSource([1, 2])), lambda _x: "k")
    out: List[Any] = []
    op.output("out", op.stateful("s", keyed, _NotifyNow), TestingSink(out))
    run_main(flow, epoch_interval=ZERO)
    assert _NotifyNow.calls == ["on_item(1)", "on_notify", "on_item(2)", "on_notify"]
    assert [v for _k, v in out] == ["item 1", "notify", "item 2", "notify"]


def test_due_timers_fire_before_new_input_is_polled():
    # Key "a" sets a timer due at once; the next input item is for key "b".
    # The timer's output comes before anything of the item polled after it.
    _NotifyNow.calls = []
    flow = Dataflow("timers2")
    inp = op.input("inp", flow, TestingSource([("a", 1), ("b", 2)]))
    seen: List[Any] = []
    op.inspect("polled", inp, lambda _sid, x: seen.append(("polled", x[0])))
    notes = op.stateful("s", inp, _NotifyNow)
    op.inspect("emitted", notes, lambda _sid, kv: seen.append(("emitted", kv)))
    run_main(flow, epoch_interval=ZERO)
    assert seen[:4] == [
        ("polled", "a"),
        ("emitted", ("a", "item 1")),
        ("emitted", ("a", "notify")),
        ("polled", "b"),
    ]


# 3. DirSource on a missing path or a file: ValueError at build time.


def test_dir_source_on_a_missing_path_says_it_does_not_exist(tmp_path: Path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match="does not exist") as ei:
        DirSource(missing)
    assert str(missing) in str(ei.value)


def test_dir_source_on_a_file_says_it_is_not_a_directory(tmp_path: Path):
    f = tmp_path / "a.txt"
    f.write_text("x\n")
    with pytest.raises(ValueError, match="is not a directory") as ei:
        DirSource(f)
    assert str(f) in str(ei.value)
    assert "does not exist" not in str(ei.value)


# 4. File sinks with recovery off write every batch as it comes.


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_file_sinks_write_every_batch_without_recovery(tmp_path: Path, kind: str):
    target = tmp_path / "out"
    sizes: List[int] = []

    def size_on_disk(_sid: str, x: int) -> None:
        # Another reader (tail -f) sees the file as it is on disk.
        if x == 50:
            if kind == "file":
                sizes.append(os.stat(target).st_size)
            else:
                sizes.append(sum(os.stat(p).st_size for p in target.iterdir()))

    flow = Dataflow("sink_now")
    nums = op.input("inp", flow, TestingSource(range(100), batch_size=10))
    op.inspect("watch", nums, size_on_disk)
    keyed = op.key_on("k", op.map("s", nums, str), lambda s: s)
    sink = FileSink(target) if kind == "file" else DirSink(target, 1)
    op.output("out", keyed, sink)
    run_main(flow)
    # Items 0-49 were written (batches of 10) before item 50 was polled.
    assert sizes == [len("".join(f"{i}\n" for i in range(50)))]


def test_file_sink_with_recovery_stays_exactly_once_across_an_abort(tmp_path: Path):
    out_path = tmp_path / "out.txt"
    items: List[Any] = list(range(20))
    items.insert(13, ABORT())
    config = RecoveryConfig(str(tmp_path / "state"))

    def flow() -> Dataflow:
        f = Dataflow("exactly_once")
        nums = op.input("inp", f, src)
        op.output("out", op.key_on("k", op.map("s", nums, str), lambda _s: "all"), FileSink(out_path))
        return f

    src = TestingSource(items, batch_size=4)
    f = flow()
    # Epochs of 10 s: the abort comes before any epoch commits.
    run_main(f, recovery_config=config)
    # The aborted run flushed its batches, also past the last snapshot...
    assert out_path.read_text().splitlines() == [str(i) for i in range(13)]
    run_main(f, recovery_config=config)
    # ...and the resumed run truncated back to it: nothing twice.
    assert out_path.read_text() == "".join(f"{i}\n" for i in range(20))


# 5. An ABORT that already fired does not split the resumed run's batches.


def test_a_fired_abort_does_not_split_batches_of_the_partition():
    src = TestingSource([1, 2, ABORT(), 3, 4], batch_size=2)
    part = src.build_part("s", "iterable", None)
    assert poll_next_batch(part) == [1, 2]
    with pytest.raises(AbortExecution):
        part.next_batch()
    resumed = src.build_part("s", "iterable", 1)
    assert poll_next_batch(resumed) == [2, 3]
    assert poll_next_batch(resumed) == [4]
    with pytest.raises(StopIteration):
        resumed.next_batch()


class _BatchSink(DynamicSink[Any]):
    def __init__(self, batches: List[List[Any]]) -> None:
        self.batches = batches

    def build(self, step_id: str, worker_index: int, worker_count: int) -> "_BatchPart":
        return _BatchPart(self.batches)


class _BatchPart(StatelessSinkPartition[Any]):
    def __init__(self, batches: List[List[Any]]) -> None:
        self.batches = batches

    def write_batch(self, items: List[Any]) -> None:
        self.batches.append(list(items))


def test_a_fired_abort_does_not_split_batches_of_a_resumed_run(tmp_path: Path):
    flow = Dataflow("batches")
    batches: List[List[Any]] = []
    op.output("out", op.input("inp", flow, TestingSource([1, ABORT(), 2, 3, 4], batch_size=2)), _BatchSink(batches))
    config = RecoveryConfig(str(tmp_path / "state"))
    run_main(flow, recovery_config=config)  # aborts before epoch 1 commits
    assert batches == [[1]]
    batches.clear()
    run_main(flow, recovery_config=config)
    assert batches == [[1, 2], [3, 4]]


# 6. TestingSource takes any iterable, and a reused one replays it.


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (x for x in [1, 2, 3]), id="generator"),
        pytest.param(lambda: {1, 2, 3}, id="set"),
        pytest.param(lambda: {1: "a", 2: "b", 3: "c"}.keys(), id="dict_keys"),
        pytest.param(lambda: iter([1, 2, 3]), id="iterator"),
    ],
)
def test_testing_source_takes_any_iterable_and_replays_it_on_resume(tmp_path: Path, make):
    items = list(make())
    flow = Dataflow("iterables")
    src_items = make()
    with_abort: Iterable[Any]
    if isinstance(src_items, (set, type({}.keys()))):
        with_abort = src_items  # no place for a marker in an unordered collection
    else:
        with_abort = _with_abort_after(src_items, 1)
    out: List[Any] = []
    op.output("out", op.input("inp", flow, TestingSource(with_abort)), TestingSink(out))
    config = RecoveryConfig(str(tmp_path / "state"))
    run_main(flow, epoch_interval=ZERO, recovery_config=config)
    run_main(flow, epoch_interval=ZERO, recovery_config=config)
    assert sorted(out) == sorted(items)


def _with_abort_after(it: Iterable[Any], n: int) -> Iterable[Any]:
    for i, x in enumerate(it):
        if i == n:
            yield ABORT()
        yield x


def test_testing_source_reused_over_a_generator_runs_it_once(tmp_path: Path):
    # Without recovery each run starts at the first item: the source
    # remembers what the generator yielded, so a second run sees it again.
    flow = Dataflow("again")
    out: List[Any] = []
    op.output("out", op.input("inp", flow, TestingSource(x * x for x in range(4))), TestingSink(out))
    run_main(flow)
    run_main(flow)
    assert out == [0, 1, 4, 9, 0, 1, 4, 9]


# 7. SimplePollingSource keeps no resume state and refuses interval=0.


class _Ticks(SimplePollingSource[int]):
    def __init__(self, n: int, interval: timedelta = timedelta(milliseconds=1)) -> None:
        super().__init__(interval)
        self.n = n
        self.i = 0

    def next_item(self) -> int:
        if self.i >= self.n:
            raise StopIteration()
        self.i += 1
        return self.i


@pytest.mark.parametrize("interval", [timedelta(0), timedelta(seconds=-1)])
def test_simple_polling_source_refuses_a_non_positive_interval(interval):
    with pytest.raises(ValueError, match="interval must be a positive timedelta"):
        _Ticks(3, interval)


def test_simple_polling_source_keeps_no_resume_state(tmp_path: Path):
    src = _Ticks(3)
    part = src.build_part("s", "singleton", None)
    assert part.snapshot() is None
    flow = Dataflow("ticks")
    out: List[Any] = []
    op.output("out", op.input("inp", flow, src), TestingSink(out))
    config = RecoveryConfig(str(tmp_path / "state"))
    run_main(flow, epoch_interval=ZERO, recovery_config=config)
    src.i = 0  # a resumed run polls from scratch: nothing restores a position
    run_main(flow, epoch_interval=ZERO, recovery_config=config)
    assert out == [1, 2, 3, 1, 2, 3]
