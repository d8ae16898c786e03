"""The engine over the real Go-backed StateStore (local store only): a run
aborted mid-way resumes from its last closed epoch with restored state and
source positions, for 1 and several workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.testing import TestingSink, TestingSource, cluster_main

state = pytest.importorskip("millpond.state")


class LocalRun:
    """A recovery run over local StateStores: an epoch counts as committed
    once every worker has snapshotted it (no backup)."""

    def __init__(self, directory: Path, flow_id: str, worker_count: int) -> None:
        marker = directory / f"{flow_id}.committed"
        committed = int(marker.read_text()) if marker.exists() else 0
        self.marker = marker
        self.resume_epoch = committed + 1
        self.execution = 0
        self.key_group_count = state.DEFAULT_KEY_GROUP_COUNT
        self.worker_count = worker_count
        self.stores = [
            state.StateStore.open(directory, flow_id, w, worker_count, self.resume_epoch)
            for w in range(worker_count)
        ]
        self.closed: dict = {}

    def worker_store(self, w: int) -> Any:
        return self.stores[w]

    def activation_done(self, w: int, epoch: int) -> None:
        pass

    def snapshot_epoch(self, w: int, epoch: int) -> None:
        self.stores[w].snapshot(epoch)

    def close_epoch(self, w: int, epoch: int, last: bool = False) -> None:
        self.closed.setdefault(epoch, set()).add(w)
        if len(self.closed[epoch]) == self.worker_count:
            self.marker.write_text(str(epoch))

    def finish(self, aborted: bool) -> None:
        pass

    def close(self) -> None:
        for s in self.stores:
            s.close()


@pytest.fixture
def local_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    import millpond.engine.driver as driver

    monkeypatch.setattr(
        driver, "open_run", lambda config, flow_id, n, *cluster: LocalRun(Path(config), flow_id, n)
    )


@pytest.mark.parametrize("workers", [1, 3])
def test_abort_resumes_from_last_closed_epoch_with_real_store(
    tmp_path: Path, local_recovery: None, workers: int
):
    from datetime import timedelta

    keys = ["a", "b", "c", "d"]
    items: List[Any] = [(k, 1) for k in keys] * 2 + [TestingSource.ABORT()] + [(k, 1) for k in keys]
    flow = Dataflow("real")
    out: List[Any] = []
    s = op.input("inp", flow, TestingSource(items, batch_size=4))
    s = op.stateful_map("sum", s, lambda st, v: ((st or 0) + v, (st or 0) + v))
    op.output("out", s, TestingSink(out))
    cluster_main(flow, [], 0, epoch_interval=timedelta(0), recovery_config=str(tmp_path),
                 worker_count_per_proc=workers)
    assert sorted(out) == sorted([(k, 1) for k in keys] + [(k, 2) for k in keys])
    out.clear()
    cluster_main(flow, [], 0, epoch_interval=timedelta(0), recovery_config=str(tmp_path),
                 worker_count_per_proc=workers)
    assert sorted(out) == sorted((k, 3) for k in keys)
