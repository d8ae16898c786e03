"""Two-phase sink partitions (``millpond.outputs.TwoPhaseSinkPartition``):
the engine prepares each epoch at its close and tells the partition to
publish an epoch only once the epoch's commit record exists, so a sink that
keeps what it prepared in its snapshot publishes every committed item
exactly once across aborts (the protocol of the Kafka sink's exactly-once
mode, here against an in-memory "external system")."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.outputs import FixedPartitionedSink, TwoPhaseSinkPartition
from millpond.recovery import RecoveryConfig
from millpond.testing import TestingSource, run_main

ABORT = TestingSource.ABORT
ZERO = timedelta(0)


class External:
    """The outside system: what readers see, and a marker per partition
    (the newest epoch published), as Kafka's transactional offsets are."""

    def __init__(self, backup: Optional[Path]) -> None:
        self.visible: List[Any] = []
        self.marker: Dict[str, int] = {}
        self.backup = backup
        self.calls: List[Tuple[str, str, int]] = []

    def committed_on_disk(self) -> int:
        """The newest commit record in the backup directory."""
        if self.backup is None:
            return 1 << 60
        epochs = [int(m.group(1)) for p in self.backup.rglob("commits/*.json")
                  if (m := re.fullmatch(r"(\d+)\.json", p.name))]
        return max(epochs, default=0)


class Part(TwoPhaseSinkPartition[Any, Dict[str, Any]]):
    def __init__(self, ext: External, name: str, resume: Optional[Dict[str, Any]]) -> None:
        self.ext, self.name = ext, name
        self.current: List[Any] = []
        self.pending: List[Tuple[int, List[Any]]] = []
        self.changed = resume is not None
        done = ext.marker.get(name, 0)
        for epoch, items in (resume or {}).get("pending", []):
            if epoch > done:  # committed by millpond, not yet published
                ext.visible.extend(items)
                ext.marker[name] = epoch

    def write_batch(self, values: List[Any]) -> None:
        self.current.extend(values)

    def prepare(self, epoch: int) -> bool:
        self.ext.calls.append(("prepare", self.name, epoch))
        changed, self.changed = self.changed, False
        if self.current:
            self.pending.append((epoch, self.current))
            self.current = []
            return True
        return changed

    def commit(self, epoch: int) -> None:
        self.ext.calls.append(("commit", self.name, epoch))
        assert epoch <= self.ext.committed_on_disk(), f"commit({epoch}) before its commit record"
        while self.pending and self.pending[0][0] <= epoch:
            e, items = self.pending.pop(0)
            self.ext.visible.extend(items)
            self.ext.marker[self.name] = e
            self.changed = True

    def snapshot(self) -> Dict[str, Any]:
        return {"pending": list(self.pending)}


class Sink(FixedPartitionedSink[Any, Any]):
    def __init__(self, ext: External, parts: int = 2) -> None:
        self.ext, self.parts = ext, parts

    def list_parts(self) -> List[str]:
        return [f"p{i}" for i in range(self.parts)]

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> Part:
        return Part(self.ext, for_part, resume_state)


def _flow(items: List[Any], ext: External) -> Dataflow:
    flow = Dataflow("two_phase")
    s = op.input("inp", flow, TestingSource(items))
    s = op.stateful_map("sum", s, lambda acc, v: ((acc or 0) + v, (acc or 0) + v))
    # A fixed sink receives values: keep the key in them.
    op.output("out", op.map("kv", s, lambda kv: (kv[0], kv)), Sink(ext))
    return flow


def _config(tmp_path: Path) -> RecoveryConfig:
    return RecoveryConfig(tmp_path / "state", backup=str(tmp_path / "backup"))


def test_each_epoch_is_published_once_after_its_commit_record(tmp_path: Path) -> None:
    ext = External(tmp_path / "backup")
    items = [(k, v) for v in range(1, 6) for k in "abc"]
    run_main(_flow(items, ext), epoch_interval=ZERO, recovery_config=_config(tmp_path))
    assert sorted(ext.visible) == sorted(
        (k, sum(range(1, v + 1))) for v in range(1, 6) for k in "abc")
    commits = [c for c in ext.calls if c[0] == "commit"]
    assert commits, "the engine never told the sink of a commit"
    for name in ("p0", "p1"):
        epochs = [e for kind, n, e in commits if n == name]
        assert epochs == sorted(epochs)


def test_without_recovery_epochs_are_published_as_they_close() -> None:
    ext = External(None)
    run_main(_flow([("a", 1), ("b", 2), ("a", 3)], ext), epoch_interval=ZERO)
    assert sorted(ext.visible) == [("a", 1), ("a", 4), ("b", 2)]


def test_a_resumed_partition_publishes_committed_epochs_it_had_not(tmp_path: Path) -> None:
    # The first run dies after millpond committed epochs but before the
    # sink published them: the snapshot carries them to the resumed run.
    ext = External(tmp_path / "backup")
    items = [("a", 1), ("b", 1), ("a", 1), ABORT(), ("b", 1), ("a", 1)]
    flow = _flow(items, ext)
    cfg = _config(tmp_path)
    lost: List[Any] = []

    def forgetful_commit(self: Part, epoch: int) -> None:
        lost.append(epoch)  # publish nothing: the crash comes first

    original = Part.commit
    Part.commit = forgetful_commit  # type: ignore[method-assign]
    try:
        run_main(flow, epoch_interval=ZERO, recovery_config=cfg)
    finally:
        Part.commit = original  # type: ignore[method-assign]
    assert lost and ext.visible == []
    run_main(flow, epoch_interval=ZERO, recovery_config=cfg)
    assert sorted(ext.visible) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]


@settings(max_examples=15, deadline=None)
@given(
    values=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 9)), min_size=1, max_size=25),
    aborts=st.lists(st.integers(0, 25), max_size=3),
)
def test_any_aborts_publish_exactly_the_uninterrupted_output(
    tmp_path_factory: pytest.TempPathFactory, values: List[Tuple[str, int]], aborts: List[int]
) -> None:
    ref = External(None)
    run_main(_flow(list(values), ref), epoch_interval=ZERO)
    items: List[Any] = list(values)
    for at in sorted(set(aborts), reverse=True):
        items.insert(min(at, len(items)), ABORT())
    tmp = tmp_path_factory.mktemp("tp")
    ext = External(tmp / "backup")
    flow = _flow(items, ext)
    for _ in range(len(aborts) + 1):
        run_main(flow, epoch_interval=ZERO, recovery_config=_config(tmp))
    assert sorted(ext.visible) == sorted(ref.visible)
