"""Source protocols, SimplePollingSource and the batching helpers."""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime, timedelta, timezone
from typing import List, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

import millpond.inputs as inputs
from millpond.inputs import (
    DynamicSource,
    FixedPartitionedSource,
    SimplePollingSource,
    Source,
    StatefulSourcePartition,
    StatelessSourcePartition,
    batch,
    batch_async,
    batch_getter,
    batch_getter_ts,
)


def test_all_names_exist():
    for name in inputs.__all__:
        assert hasattr(inputs, name), name


def test_abstract_bases_cannot_be_instantiated_without_their_methods():
    class NoParts(FixedPartitionedSource):
        pass

    class NoBatch(StatefulSourcePartition):
        def snapshot(self):
            return None

    with pytest.raises(TypeError):
        NoParts()
    with pytest.raises(TypeError):
        NoBatch()
    with pytest.raises(TypeError):
        DynamicSource()


class _CountPart(StatefulSourcePartition[int, int]):
    def __init__(self, n: int, resume_state: Optional[int]):
        self._next = 0 if resume_state is None else resume_state
        self._n = n

    def next_batch(self) -> List[int]:
        if self._next >= self._n:
            raise StopIteration()
        self._next += 1
        return [self._next - 1]

    def snapshot(self) -> int:
        return self._next


class _CountSource(FixedPartitionedSource[int, int]):
    def list_parts(self):
        return ["count"]

    def build_part(self, step_id, for_part, resume_state):
        return _CountPart(3, resume_state)


def test_fixed_partitioned_source_defaults_need_only_batch_and_snapshot():
    src = _CountSource()
    assert isinstance(src, Source)
    part = src.build_part("s", "count", None)
    assert part.next_awake() is None
    assert part.next_batch() == [0]
    snap = part.snapshot()
    part.close()
    resumed = src.build_part("s", "count", snap)
    assert resumed.next_batch() == [1]
    assert resumed.next_batch() == [2]
    with pytest.raises(StopIteration):
        resumed.next_batch()


def test_dynamic_source_builds_a_stateless_partition_per_worker():
    class _Part(StatelessSourcePartition[str]):
        def __init__(self, worker_index):
            self.worker_index = worker_index

        def next_batch(self):
            return [f"w{self.worker_index}"]

    class _Src(DynamicSource[str]):
        def build(self, step_id, worker_index, worker_count):
            return _Part(worker_index)

    parts = [_Src().build("s", i, 3) for i in range(3)]
    assert [p.next_batch() for p in parts] == [["w0"], ["w1"], ["w2"]]
    assert parts[0].next_awake() is None
    parts[0].close()


# --- SimplePollingSource ----------------------------------------------------


class _Seq(SimplePollingSource[int]):
    def __init__(self, results, interval=timedelta(seconds=1), align_to=None):
        super().__init__(interval, align_to)
        self._results = iter(results)

    def next_item(self):
        r = next(self._results)
        if isinstance(r, Exception):
            raise r
        return r


def test_simple_polling_source_has_one_partition_without_resume_state():
    src = _Seq([1])
    assert src.list_parts() == ["singleton"]
    part = src.build_part("s", "singleton", None)
    assert part.snapshot() is None


def test_simple_polling_first_poll_is_immediate_without_align_to():
    before = datetime.now(timezone.utc)
    part = _Seq([1]).build_part("s", "singleton", None)
    assert before <= part.next_awake() <= datetime.now(timezone.utc)


def test_simple_polling_emits_item_and_schedules_next_poll_one_interval_later():
    part = _Seq([7, None, 8], interval=timedelta(seconds=5)).build_part("s", "singleton", None)
    first = part.next_awake()
    assert part.next_batch() == [7]
    assert part.next_awake() == first + timedelta(seconds=5)


def test_simple_polling_none_means_no_item_this_time():
    part = _Seq([None]).build_part("s", "singleton", None)
    assert part.next_batch() == []


def test_simple_polling_retry_polls_again_after_its_timeout():
    retry = SimplePollingSource.Retry(timedelta(milliseconds=300))
    part = _Seq([retry], interval=timedelta(hours=1)).build_part("s", "singleton", None)
    before = datetime.now(timezone.utc)
    assert part.next_batch() == []
    wake = part.next_awake()
    assert before + timedelta(milliseconds=300) <= wake <= datetime.now(timezone.utc) + timedelta(milliseconds=300)


def test_simple_polling_stop_iteration_ends_the_input():
    part = _Seq([StopIteration()]).build_part("s", "singleton", None)
    with pytest.raises(StopIteration):
        part.next_batch()


def test_simple_polling_align_to_puts_polls_on_the_grid():
    align = datetime(2024, 1, 1, tzinfo=timezone.utc)
    part = _Seq([1], interval=timedelta(minutes=10), align_to=align).build_part("s", "singleton", None)
    wake = part.next_awake()
    assert wake >= datetime.now(timezone.utc) - timedelta(seconds=1)
    assert (wake - align) % timedelta(minutes=10) == timedelta(0)


def test_simple_polling_skips_missed_ticks_instead_of_bursting():
    # The partition was scheduled long ago (the worker was busy): the next
    # poll must be in the future, not a backlog of past ticks.
    part = _Seq([1, 2], interval=timedelta(seconds=1)).build_part("s", "singleton", None)
    part._next_awake -= timedelta(hours=1)
    part.next_batch()
    assert part.next_awake() > datetime.now(timezone.utc)


@pytest.mark.parametrize("interval", [timedelta(0), timedelta(seconds=-1), 5])
def test_simple_polling_rejects_non_positive_interval(interval):
    with pytest.raises(ValueError, match="interval"):
        _Seq([], interval=interval)


def test_simple_polling_rejects_naive_align_to():
    with pytest.raises(ValueError, match="timezone-aware"):
        _Seq([], align_to=datetime(2024, 1, 1))


# --- batch ------------------------------------------------------------------


@given(st.lists(st.integers()), st.integers(min_value=1, max_value=10))
def test_batch_preserves_items_and_bounds_sizes(items, size):
    batches = list(batch(items, size))
    assert list(itertools.chain.from_iterable(batches)) == items
    assert all(1 <= len(b) <= size for b in batches)
    assert all(len(b) == size for b in batches[:-1])


def test_batch_works_on_a_one_shot_iterator():
    assert list(batch(iter(range(5)), 2)) == [[0, 1], [2, 3], [4]]


def test_batch_rejects_zero_size():
    with pytest.raises(ValueError, match="batch_size"):
        list(batch([1], 0))


# --- batch_getter / batch_getter_ts ------------------------------------------


def _getter(values):
    it = iter(values)

    def get():
        return next(it)

    return get


def test_batch_getter_yields_at_yield_on_and_at_size():
    got = list(batch_getter(_getter([1, 2, 3, None, 4]), 2))
    assert got == [[1, 2], [3], [4]]


def test_batch_getter_yields_empty_batch_when_nothing_is_ready():
    it = batch_getter(_getter([None, 1]), 5)
    assert next(it) == []
    assert next(it) == [1]
    with pytest.raises(StopIteration):
        next(it)


def test_batch_getter_custom_sentinel():
    got = list(batch_getter(_getter(["a", "", "b"]), 10, yield_on=""))
    assert got == [["a"], ["b"]]


@given(st.lists(st.one_of(st.none(), st.integers())), st.integers(min_value=1, max_value=5))
def test_batch_getter_loses_no_item(values, size):
    got = list(batch_getter(_getter(values), size))
    assert list(itertools.chain.from_iterable(got)) == [v for v in values if v is not None]
    assert all(len(b) <= size for b in got)


def test_batch_getter_ts_closes_a_batch_after_the_timeout():
    clock = itertools.count()

    def slow():
        n = next(clock)
        if n >= 6:
            raise StopIteration()
        import time

        time.sleep(0.03)
        return n

    got = list(batch_getter_ts(slow, timedelta(milliseconds=50), 100))
    assert list(itertools.chain.from_iterable(got)) == [0, 1, 2, 3, 4, 5]
    assert len(got) >= 2  # the timeout, not the size, closed the batches


def test_batch_getter_ts_rejects_negative_timeout():
    with pytest.raises(ValueError, match="timeout"):
        list(batch_getter_ts(_getter([]), timedelta(seconds=-1), 1))


# --- batch_async --------------------------------------------------------------


async def _agen(values, delay=0.0):
    for v in values:
        if delay:
            await asyncio.sleep(delay)
        yield v


def test_batch_async_gathers_up_to_size():
    got = list(batch_async(_agen(range(5)), timedelta(seconds=1), 2))
    assert got == [[0, 1], [2, 3], [4]]


def test_batch_async_returns_empty_batch_on_timeout_and_keeps_the_pending_item():
    it = batch_async(_agen([1, 2], delay=0.2), timedelta(milliseconds=20), 10)
    seen: List[int] = []
    empties = 0
    for b in it:
        if not b:
            empties += 1
        seen.extend(b)
    assert seen == [1, 2]
    assert empties >= 1


def test_batch_async_uses_a_given_loop_and_leaves_it_open():
    loop = asyncio.new_event_loop()
    try:
        got = list(batch_async(_agen([1, 2, 3]), timedelta(seconds=1), 10, loop=loop))
        assert got == [[1, 2, 3]]
        assert not loop.is_closed()
    finally:
        loop.close()


def test_batch_async_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        batch_async(_agen([]), timedelta(seconds=1), 0)
    with pytest.raises(ValueError, match="timeout"):
        batch_async(_agen([]), timedelta(seconds=-1), 1)
