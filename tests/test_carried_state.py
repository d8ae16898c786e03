"""The Go core carries each worker's state in batch mode, so that a whole
epoch hands over only the keys it touched (docs/recovery.md, "The Go core
carries the state"). What is committed must not depend on it: runs that
carry, abort and resume on other worker counts end with the state and the
outputs of a run that never stopped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, List, Tuple

import pytest

import millpond.operators as op
from millpond import _core
from millpond.backup import DirBackup
from millpond.dataflow import Dataflow
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.state import StateStore
from millpond.testing import TestingSink, TestingSource, cluster_main

KEYS = 300
PER_EPOCH = 180  # touched a batch: at least a quarter of the keys, so epochs are whole


def _data(epochs: int) -> List[Tuple[str, int]]:
    """PER_EPOCH distinct keys of KEYS per batch, a different set each
    time; every fifth key of a batch is discarded (the value 0)."""
    return [(f"k{(e * 97 + i) % KEYS}", 0 if i % 5 == 4 else 1 + (e + i) % 3)
            for e in range(epochs) for i in range(PER_EPOCH)]


def _step(state: Any, value: int) -> Tuple[Any, Any]:
    if value == 0:
        return None, ("gone", state)  # discarded
    total = (state or 0) + value
    return total, total


def _flow(items: List[Any], out: List[Any], batch_size: int = PER_EPOCH) -> Dataflow:
    flow = Dataflow("carried")
    s = op.input("inp", flow, TestingSource(items, batch_size=batch_size))
    s = op.stateful_map("count", s, _step)
    op.output("out", s, TestingSink(out))
    return flow


def _expected(data: List[Tuple[str, int]]) -> Tuple[Dict[str, int], List[Tuple[str, Any]]]:
    state: Dict[str, int] = {}
    outs = []
    for k, v in data:
        before = state.get(k)
        if v == 0:
            state.pop(k, None)
            outs.append((k, ("gone", before)))
        else:
            state[k] = (before or 0) + v
            outs.append((k, state[k]))
    return state, outs


@pytest.fixture
def snapshots(monkeypatch: pytest.MonkeyPatch) -> List[Tuple[int, bool, int, bool]]:
    """(rows carried, whole, rows copied, the core carries) of every snapshot."""
    seen: List[Tuple[int, bool, int, bool]] = []
    snapshot = StateStore.snapshot

    def recording(self: StateStore, epoch: int) -> int:
        n = snapshot(self, epoch)
        seen.append((self.last_snapshot_carried, self.last_snapshot_whole, self.last_snapshot_reused,
                     bool(_core.store_carries(self._require_handle()))))
        return n

    monkeypatch.setattr(StateStore, "snapshot", recording)
    return seen


def _run(tmp_path, items: List[Any], workers: List[int], batch_size: int = PER_EPOCH,
         **kw: Any) -> List[List[Any]]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    cfg = RecoveryConfig(state, backup=DirBackup(tmp_path / "backup"), snapshot_mode=SnapshotMode.BATCH, **kw)
    out: List[Any] = []
    probes = [(f"k{i}", 1) for i in range(KEYS)]
    flow = _flow(items + [TestingSource.EOF()] + probes, out, batch_size)
    runs = []
    for w in workers:
        start = len(out)
        cluster_main(flow, [], 0, epoch_interval=timedelta(0), recovery_config=cfg, worker_count_per_proc=w)
        runs.append(out[start:])
    return runs


def test_a_fresh_run_writes_whole_epochs_from_the_carried_state(tmp_path, snapshots):
    data = _data(8)
    runs = _run(tmp_path, data, [2, 1])
    state, outs = _expected(data)
    assert runs[0] == outs or sorted(map(repr, runs[0])) == sorted(map(repr, outs))
    assert dict(runs[1]) == {f"k{i}": state.get(f"k{i}", 0) + 1 for i in range(KEYS)}
    carried = [c for c, whole, _, _ in snapshots if c > 0]
    assert carried, "whole epochs took untouched keys from the core"
    assert all(whole for c, whole, _, _ in snapshots if c >= 0)
    assert all(copied == 0 for c, _, copied, _ in snapshots if c >= 0), "nothing copied on the flow's side"


@pytest.mark.parametrize("workers", [[1, 2, 1], [2, 3, 1]], ids=["1-2-1", "2-3-1"])
def test_runs_that_carry_abort_and_resume_to_the_uninterrupted_state(tmp_path, snapshots, workers):
    data = _data(12)
    cuts = [PER_EPOCH * 4 + 70, PER_EPOCH * 9 + 15]  # mid-batch
    items = data[: cuts[0]] + [TestingSource.ABORT()] + data[cuts[0]: cuts[1]] + [TestingSource.ABORT()]
    items += data[cuts[1]:]
    runs = _run(tmp_path, items, workers + [1])
    state, outs = _expected(data)
    assert dict(runs[-1]) == {f"k{i}": state.get(f"k{i}", 0) + 1 for i in range(KEYS)}, (
        "the probes read the uninterrupted run's final state")
    assert set(map(repr, (x for r in runs[:-1] for x in r))) == set(map(repr, outs)), "every output, none wrong"
    assert any(c > 0 for c, _, _, _ in snapshots), "the first run carried"


@pytest.mark.parametrize("bound", [{"max_live_keys": 50}, {"max_live_bytes": 4000}], ids=["keys", "bytes"])
def test_a_bounded_store_asks_the_core_to_carry_nothing(tmp_path, snapshots, bound):
    data = _data(6)
    runs = _run(tmp_path, data, [1], **bound)
    state, outs = _expected(data)
    assert sorted(map(repr, runs[0][: len(outs)])) == sorted(map(repr, outs))
    assert snapshots and all(c == -1 and not carries for c, _, _, carries in snapshots), snapshots[:3]


def _full_and_partial(epochs: int) -> List[Tuple[str, int]]:
    """Batches of KEYS items: every third one touches every key, the others
    PER_EPOCH distinct keys (the rest repeats); some keys are discarded."""
    out = []
    for e in range(epochs):
        distinct = KEYS if e % 3 == 0 else PER_EPOCH
        out += [(f"k{(e * 31 + i % distinct) % KEYS}", 0 if (e + i) % 11 == 10 else 1 + (e + i) % 3)
                for i in range(KEYS)]
    return out


@pytest.mark.parametrize("workers", [[1, 1], [1, 2]], ids=["1-1", "1-2"])
def test_an_epoch_that_touches_every_key_is_packed_whole_and_carried_from(
        tmp_path, snapshots, monkeypatch, workers):
    # An epoch that left no key untouched packs them all (nothing to merge:
    # StateStore._packs_rest); the core carries that batch as it is, and
    # the next epoch, which touched fewer, is merged into it.
    monkeypatch.setattr("millpond.state._PACK_COST_SAMPLE", 10**9)  # no cost measured: merge when keys are left
    data = _full_and_partial(9)
    cut = KEYS * 6 + 40  # after a whole epoch and a carried one, mid-batch
    items = data[:cut] + [TestingSource.ABORT()] + data[cut:]
    runs = _run(tmp_path, items, workers + [1], batch_size=KEYS)
    state, outs = _expected(data)
    assert dict(runs[-1]) == {f"k{i}": state.get(f"k{i}", 0) + 1 for i in range(KEYS)}, (
        "the probes read the uninterrupted run's final state")
    assert set(map(repr, runs[0] + runs[1])) == set(map(repr, outs)), "every output, none wrong"
    first = [s for s in snapshots[:8]]
    packed = [i for i, (c, whole, _, carries) in enumerate(first) if c == -1 and whole and carries]
    assert packed, f"an epoch touching every key is packed whole, and the core carries it: {first}"
    assert any(first[i + 1][0] > 0 for i in packed if i + 1 < len(first)), (
        f"the epoch after it is merged into the batch the core kept: {first}")


def test_packing_the_untouched_keys_when_it_costs_less_than_the_merge(tmp_path, snapshots, monkeypatch):
    # States that pack in far less than the core's merge costs a carried
    # row: an epoch to be written whole packs the keys it left untouched.
    monkeypatch.setattr("millpond.state._PACK_COST_SAMPLE", 1)
    monkeypatch.setattr("millpond.state._CARRY_SECONDS", 1.0)
    data = _data(8)
    runs = _run(tmp_path, data, [1, 1])
    state, outs = _expected(data)
    assert dict(runs[1]) == {f"k{i}": state.get(f"k{i}", 0) + 1 for i in range(KEYS)}
    later = snapshots[2:8]
    assert later and all(c == -1 and whole and carries for c, whole, _, carries in later), later
