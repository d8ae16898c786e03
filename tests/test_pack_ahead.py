"""Packing ahead: in batch mode a store whose keys take long to pack packs
each key right after its activation (``StateStore.ahead_packer``), while its
objects are in the cache, and the epoch's snapshot writes that pickle unless
the key was touched again since. What a snapshot stores must be exactly what
packing every object at the snapshot would store."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import millpond.operators as op
from millpond import state as state_mod
from millpond.backup import DirBackup
from millpond.dataflow import Dataflow
from millpond.errors import SnapshotError
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.state import StateStore
from millpond.testing import TestingSink, TestingSource, cluster_main

from helpers.stored_rows import GONE, KEYS, VALUES
from helpers.stored_rows import stored as stored_row

FLOW = "flow"
STEP = "s"


class Counted:
    """A state whose snapshot calls are counted, and that can be told to
    fail its snapshot."""

    calls = 0

    def __init__(self, resume_state: Any) -> None:
        self.value = resume_state
        self.fail: Optional[BaseException] = None

    def snapshot(self) -> Any:
        Counted.calls += 1
        if self.fail is not None:
            raise self.fail
        return self.value


def stored(s: StateStore, key: str) -> Any:
    """The value of key's newest row in the store (not its live object)."""
    return stored_row(s, STEP, key)


@pytest.fixture
def ahead_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any pack cost (even one not measured yet) makes a store pack ahead."""
    monkeypatch.setattr(state_mod, "_AHEAD_FROM_PACK_SECONDS", 0.0)


def planned(path: Path, keys: int = 4, **kw: Any) -> StateStore:
    """A batch-mode store with keys k0.. = 0.. snapshotted at epoch 1, so
    the next epoch packs ahead."""
    s = StateStore.open(path, FLOW, **kw)
    s.register(STEP, Counted)
    s.whole_from = 0.5
    for i in range(keys):
        s.get_or_build(STEP, f"k{i}").value = i
    s.snapshot(1)
    return s


def activate(s: StateStore, key: str, value: Any) -> bool:
    """What the runtime does for one key: touch it, change it, pack it ahead."""
    obj = s.get_or_build(STEP, key)
    obj.value = value
    packer = s.ahead_packer(STEP)
    assert packer is not None
    return packer(key, obj)


def test_a_key_packed_ahead_is_written_from_that_pickle(tmp_path, ahead_on):
    with planned(tmp_path) as s:
        assert activate(s, "k1", 101)
        calls = Counted.calls
        s.snapshot(2)
        assert Counted.calls == calls, "the snapshot did not pack k1 again"
        assert s.last_snapshot_ahead == 1 and s.snapshot_rows_ahead == 1
        assert s.last_snapshot_reused == 0, "copied from kept pickles: none"
        assert stored(s, "k1") == 101


def test_a_key_touched_after_it_was_packed_ahead_is_packed_again(tmp_path, ahead_on):
    with planned(tmp_path) as s:
        assert activate(s, "k1", 101)
        s.get(STEP, "k1").value = 102  # a later activation, without its pack
        s.snapshot(2)
        assert s.last_snapshot_ahead == 0
        assert stored(s, "k1") == 102


def test_a_key_discarded_after_it_was_packed_ahead_is_a_deletion(tmp_path, ahead_on):
    with planned(tmp_path) as s:
        assert activate(s, "k1", 101)
        s.discard(STEP, "k1")
        s.snapshot(2)
        assert stored(s, "k1") == GONE


def test_a_state_that_fails_to_pack_ahead_is_named_by_the_snapshot(tmp_path, ahead_on):
    with planned(tmp_path) as s:
        obj = s.get_or_build(STEP, "k2")
        obj.fail = ValueError("no snapshot today")
        assert s.ahead_packer(STEP)("k2", obj) is False
        with pytest.raises(SnapshotError, match="k2"):
            s.snapshot(2)


def test_an_interrupt_in_a_pack_ahead_goes_on_up(tmp_path, ahead_on):
    with planned(tmp_path) as s:
        obj = s.get_or_build(STEP, "k2")
        obj.fail = KeyboardInterrupt()
        with pytest.raises(KeyboardInterrupt):
            s.ahead_packer(STEP)("k2", obj)


def test_pickles_packed_ahead_stay_within_their_budget(tmp_path, ahead_on, monkeypatch):
    # Each pickle counts its bytes and 64 of overhead: room for two.
    monkeypatch.setattr(state_mod, "KEEP_PICKLES_BYTES", 2 * (64 + 40))
    with planned(tmp_path) as s:
        assert [activate(s, f"k{i}", "x" * 20) for i in range(4)] == [True, True, False, False]
        s.snapshot(2)
        assert s.last_snapshot_ahead == 2
        assert [stored(s, f"k{i}") for i in range(4)] == ["x" * 20] * 4
        assert activate(s, "k3", "y"), "the budget is per epoch"


def test_keys_packed_ahead_many_times_an_epoch_pause_it(tmp_path, ahead_on):
    with planned(tmp_path) as s:
        for v in range(3):  # k1 changed by three activations
            assert activate(s, "k1", v)
        s.snapshot(2)
        assert stored(s, "k1") == 2
        assert s.ahead_packer(STEP) is None
        for epoch in range(3, 2 + state_mod._AHEAD_PAUSE):
            s.snapshot(epoch)
            assert s.ahead_packer(STEP) is None, epoch
        s.snapshot(2 + state_mod._AHEAD_PAUSE)
        assert s.ahead_packer(STEP) is not None


def test_only_stores_whose_keys_pack_slowly_pack_ahead(tmp_path):
    with planned(tmp_path / "a") as s:
        assert s.ahead_packer(STEP) is None, "a cost not measured yet is no reason to"
        s._pack_cost = state_mod._AHEAD_FROM_PACK_SECONDS
        s.snapshot(2)
        assert s.ahead_packer(STEP) is not None
        s._pack_cost = state_mod._AHEAD_FROM_PACK_SECONDS / 2
        s.snapshot(3)
        assert s.ahead_packer(STEP) is None


def test_without_batch_mode_nothing_is_packed_ahead(tmp_path, ahead_on):
    with planned(tmp_path) as s:
        s.whole_from = None
        s.snapshot(2)
        assert s.ahead_packer(STEP) is None


@pytest.mark.parametrize("bound", ["keys", "bytes"])
def test_a_bounded_store_packs_nothing_ahead(tmp_path, ahead_on, bound):
    # Pickles packed ahead are memory a live-key limit or a byte budget
    # does not count.
    with planned(tmp_path) as s:
        assert s.ahead_packer(STEP) is not None
        if bound == "keys":
            s.limit_live_keys(10)
        else:
            s.limit_live_bytes(10 << 20)
        assert s.ahead_packer(STEP) is None, "a bound drops the packers at once"
        s.snapshot(2)
        assert s.ahead_packer(STEP) is None


# A random sequence of what happens to six keys between snapshots: an
# activation that packs its key ahead, one that does not (a second touch
# after the pack), a new object, a discard, a snapshot.
_keys, _values = KEYS, VALUES
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("ahead"), _keys, _values),
        st.tuples(st.just("change"), _keys, _values),
        st.tuples(st.just("set"), _keys, _values),
        st.tuples(st.just("discard"), _keys),
        st.tuples(st.just("snapshot")),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, budget=st.sampled_from([0, 150, 400, 1 << 20]), share=st.sampled_from([0.0, 0.5, 1.0]))
def test_snapshots_store_what_packing_every_object_would(tmp_path_factory, monkeypatch, ops, budget, share):
    """After every snapshot, each key's newest stored row is its state as
    of that snapshot, whichever keys were packed ahead, touched again,
    written from kept pickles or packed (and however many fit the budget)."""
    monkeypatch.setattr(state_mod, "_AHEAD_FROM_PACK_SECONDS", 0.0)
    monkeypatch.setattr(state_mod, "KEEP_PICKLES_BYTES", budget)
    model: Dict[str, Any] = {}
    epoch = 0
    with StateStore.open(tmp_path_factory.mktemp("ahead"), FLOW) as s:
        s.register(STEP, Counted)
        s.whole_from = share
        for step in ops + [("snapshot",)]:
            if step[0] in ("ahead", "change"):
                obj: Counted = s.get_or_build(STEP, step[1])
                obj.value = step[2]
                model[step[1]] = step[2]
                packer = s.ahead_packer(STEP)
                if step[0] == "ahead" and packer is not None:
                    packer(step[1], obj)
            elif step[0] == "set":
                s.set(STEP, step[1], Counted(step[2]))
                model[step[1]] = step[2]
            elif step[0] == "discard":
                s.discard(STEP, step[1])
                model.pop(step[1], None)
            else:
                epoch += 1
                s.snapshot(epoch)
                for k in (f"k{i}" for i in range(6)):
                    assert stored(s, k) == model.get(k, GONE), f"key {k} after epoch {epoch}"


# -- through the engine ------------------------------------------------------------------


def _data(epochs: int, keys: int = 300, per_epoch: int = 180) -> List[Tuple[str, int]]:
    """``per_epoch`` distinct keys of ``keys`` per batch, a different set
    each time, each key once a batch."""
    return [(f"k{(e * 97 + i) % keys}", 1 + (e + i) % 3) for e in range(epochs) for i in range(per_epoch)]


def _flow(items: List[Any], out: List[Any]) -> Dataflow:
    flow = Dataflow("ahead")
    s = op.input("inp", flow, TestingSource(items, batch_size=180))
    s = op.stateful_map("count", s, lambda st, v: ((st or 0) + v, (st or 0) + v))
    op.output("out", s, TestingSink(out))
    return flow


@pytest.mark.parametrize("workers", [[1, 2, 1], [2, 1, 3]], ids=["1-2-1", "2-1-3"])
def test_an_aborted_run_that_packs_ahead_resumes_to_the_uninterrupted_state(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(state_mod, "_AHEAD_FROM_PACK_SECONDS", 0.0)
    ahead: List[int] = []
    snapshot = StateStore.snapshot

    def counting(self: StateStore, epoch: int) -> int:
        n = snapshot(self, epoch)
        ahead.append(self.last_snapshot_ahead)
        return n

    monkeypatch.setattr(StateStore, "snapshot", counting)
    data = _data(12)
    cuts = [180 * 5 + 40, 180 * 9 + 100]  # mid-batch
    items = data[: cuts[0]] + [TestingSource.ABORT()] + data[cuts[0]: cuts[1]] + [TestingSource.ABORT()]
    items += data[cuts[1]:]
    probes = [(f"k{i}", 0) for i in range(300)]
    state = tmp_path / "state"
    state.mkdir()
    cfg = RecoveryConfig(state, backup=DirBackup(tmp_path / "backup"), snapshot_mode=SnapshotMode.BATCH)
    out: List[Any] = []
    flow = _flow(items + [TestingSource.EOF()] + probes, out)
    runs = []
    for w in workers + [1]:
        start = len(out)
        cluster_main(flow, [], 0, epoch_interval=timedelta(0), recovery_config=cfg, worker_count_per_proc=w)
        runs.append(out[start:])
    assert sum(ahead) > 0, "keys were packed ahead"
    totals: Dict[str, int] = {}
    running = []
    for k, v in data:
        totals[k] = totals.get(k, 0) + v
        running.append((k, totals[k]))
    assert dict(runs[-1]) == totals, "the probes read the uninterrupted run's final state"
    assert set(x for r in runs[:-1] for x in r) == set(running), "every running total, none wrong"
