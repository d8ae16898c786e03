"""Sink protocols."""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

import millpond.outputs as outputs
from millpond.outputs import (
    DynamicSink,
    FixedPartitionedSink,
    Sink,
    StatefulSinkPartition,
    StatelessSinkPartition,
)


class _ListPart(StatefulSinkPartition[str, int]):
    def __init__(self, out, resume_state):
        self.out = out
        del out[resume_state or 0 :]

    def write_batch(self, values):
        self.out.extend(values)

    def snapshot(self):
        return len(self.out)


class _ListSink(FixedPartitionedSink[str, int]):
    def __init__(self, n):
        self.lists = {f"p{i}": [] for i in range(n)}

    def list_parts(self):
        return list(self.lists)

    def build_part(self, step_id, for_part, resume_state):
        return _ListPart(self.lists[for_part], resume_state)


def test_all_names_exist():
    for name in outputs.__all__:
        assert hasattr(outputs, name), name


def test_abstract_bases_need_their_methods():
    class NoParts(FixedPartitionedSink):
        pass

    class NoWrite(StatelessSinkPartition):
        pass

    with pytest.raises(TypeError):
        NoParts()
    with pytest.raises(TypeError):
        NoWrite()
    with pytest.raises(TypeError):
        DynamicSink()


def test_default_part_fn_is_crc32_of_utf8_key():
    sink = _ListSink(3)
    assert isinstance(sink, Sink)
    assert sink.part_fn("héllo") == zlib.crc32("héllo".encode("utf-8"))


@given(st.text())
def test_default_part_fn_is_non_negative_int(key):
    value = _ListSink(1).part_fn(key)
    assert isinstance(value, int) and value >= 0


def test_default_part_fn_is_stable_across_processes():
    # Python's str hash is salted per process; the routing hash must not be.
    code = (
        "from millpond.outputs import FixedPartitionedSink\n"
        "class S(FixedPartitionedSink):\n"
        "    list_parts = build_part = None\n"
        "print(S().part_fn('key-42'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "random", "PYTHONPATH": ":".join(sys.path)},
    )
    assert int(out.stdout) == _ListSink(1).part_fn("key-42")


def test_stateful_sink_partition_resumes_from_its_snapshot():
    sink = _ListSink(1)
    part = sink.build_part("out", "p0", None)
    part.write_batch(["a", "b"])
    snap = part.snapshot()
    part.write_batch(["c"])  # written after the snapshot: lost in a crash
    part.close()
    resumed = sink.build_part("out", "p0", snap)
    resumed.write_batch(["c2"])
    assert sink.lists["p0"] == ["a", "b", "c2"]


def test_dynamic_sink_builds_a_partition_per_worker():
    written = []

    class _Part(StatelessSinkPartition[int]):
        def __init__(self, w):
            self.w = w

        def write_batch(self, items):
            written.extend((self.w, i) for i in items)

    class _Sink(DynamicSink[int]):
        def build(self, step_id, worker_index, worker_count):
            return _Part(worker_index)

    parts = [_Sink().build("out", i, 2) for i in range(2)]
    parts[0].write_batch([1])
    parts[1].write_batch([2])
    parts[1].close()
    assert written == [(0, 1), (1, 2)]
