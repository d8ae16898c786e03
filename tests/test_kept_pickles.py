"""Kept pickles: in batch mode (``whole_from`` set) a store keeps each key's
last pickle until the key is touched again, and an epoch topped up to the
whole state writes the untouched keys from there instead of snapshotting
and pickling their objects again. What it writes must be exactly what
packing the objects would write."""

from __future__ import annotations

import pickle
import shutil
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
    """A state whose snapshot calls are counted."""

    calls = 0

    def __init__(self, resume_state: Any) -> None:
        self.value = resume_state

    def snapshot(self) -> Any:
        Counted.calls += 1
        return self.value


def open_store(path: Path, **kw: Any) -> StateStore:
    s = StateStore.open(path, FLOW, **kw)
    s.register(STEP, Counted)
    return s




def stored(s: StateStore, key: str) -> Any:
    """The value of key's newest row in the store (not its live object)."""
    return stored_row(s, STEP, key)


def seeded(path: Path, n: int, whole_from: float = 0.5) -> StateStore:
    """A store with keys k0..k(n-1) = 0..n-1 snapshotted at epoch 1 (an
    epoch that touched every key, so it kept nothing)."""
    s = open_store(path)
    s.whole_from = whole_from
    for i in range(n):
        s.get_or_build(STEP, f"k{i}").value = i
    s.snapshot(1)
    assert s._packed == {}
    return s


def touch(s: StateStore, *keys: str, add: int = 100) -> None:
    for k in keys:
        s.get(STEP, k).value += add


def test_a_top_up_writes_untouched_keys_from_their_kept_pickles(tmp_path):
    with seeded(tmp_path, 10) as s:
        six = [f"k{i}" for i in range(6)]
        touch(s, *six)
        s.snapshot(2)
        assert s.last_snapshot_whole and s.last_snapshot_reused == 0
        assert set(s._packed[STEP]) == {f"k{i}" for i in range(10)}
        touch(s, *six)
        Counted.calls = 0
        assert s.snapshot(3) == 10
        assert s.last_snapshot_whole
        assert s.last_snapshot_reused == 4
        assert Counted.calls == 6, "only the touched keys are snapshotted"
    with open_store(tmp_path) as s:
        assert {k: s.get(STEP, k).value for k in s.keys(STEP)} == {f"k{i}": i + 200 * (i < 6) for i in range(10)}


@pytest.mark.parametrize("touched, keeps", [(10, False), (10 - 1, True), (5, True), (3, True), (2, False), (0, False)])
def test_pickles_are_kept_from_epochs_that_make_copying_them_likely(tmp_path, touched, keeps):
    # whole_from 0.5: at least a quarter and at most 90% of the keys touched
    with seeded(tmp_path, 10) as s:
        touch(s, *(f"k{i}" for i in range(5)))
        s.snapshot(2)
        assert s._packed_bytes > 0
        touch(s, *(f"k{i}" for i in range(touched)))
        s.snapshot(3)
        assert (s._packed_bytes > 0) is keeps
        assert bool(s._packed) is keeps, "what is not kept is dropped"


def test_a_kept_pickle_rewritten_in_place_is_the_newest_and_is_what_a_top_up_copies(tmp_path):
    # 1000 + 7 * epoch pickles to as many bytes each epoch: the packer
    # copies each new pickle into the bytes object kept for the key,
    # unless someone else holds that object.
    five = [f"k{i}" for i in range(5)]
    with seeded(tmp_path, 10) as s:
        for k in five:
            s.get(STEP, k).value = 1014
        s.snapshot(2)
        # ids, not the objects: holding one would keep it from being reused
        # (a new one is made before the old one is freed, so an equal id is
        # the same object)
        first = {k: id(s._packed[STEP][k]) for k in five[1:]}
        mine = s._packed[STEP]["k0"]
        for k in five:
            s.get(STEP, k).value = 1021
        s.snapshot(3)
        assert s.last_snapshot_whole and s.last_snapshot_reused == 5
        kept = s._packed[STEP]
        assert all(id(kept[k]) == first[k] for k in five[1:]), "the same length's pickle was not copied in place"
        assert kept["k0"] is not mine and pickle.loads(mine) == 1014, "a pickle someone holds was changed"
        assert [pickle.loads(kept[k]) for k in five] == [1021] * 5
        assert [stored(s, k) for k in five] == [1021] * 5
        # the next top-up copies what the pickles hold now
        for k in (f"k{i}" for i in range(5, 10)):
            s.get(STEP, k).value += 100
        s.snapshot(4)
        assert s.last_snapshot_reused == 5
        assert [stored(s, k) for k in five] == [1021] * 5
    with open_store(tmp_path) as s:
        assert {k: s.get(STEP, k).value for k in s.keys(STEP)} == {
            **{k: 1021 for k in five}, **{f"k{i}": i + 100 for i in range(5, 10)}}


def test_a_discarded_key_is_no_longer_kept(tmp_path):
    with seeded(tmp_path, 4) as s:
        touch(s, "k0", "k1")
        s.snapshot(2)
        held = s._packed_bytes
        s.discard(STEP, "k2")
        touch(s, "k3")
        s.snapshot(3)
        assert set(s._packed[STEP]) == {"k0", "k1", "k3"}
        assert s._packed_bytes < held
        assert stored(s, "k2") == GONE


def test_without_whole_from_nothing_is_kept(tmp_path):
    with open_store(tmp_path) as s:
        for i in range(10):
            s.get_or_build(STEP, f"k{i}").value = i
        s.snapshot(1)
        touch(s, "k0", "k1", "k2", "k3", "k4")
        s.snapshot(2)
        assert s._packed == {} and s._packed_bytes == 0


@pytest.mark.parametrize("bound", ["keys", "bytes"])
def test_a_bounded_store_keeps_nothing_even_before_it_evicts(tmp_path, bound):
    # Kept pickles are memory a live-key limit or a byte budget does not count.
    with seeded(tmp_path, 10) as s:
        if bound == "keys":
            s.limit_live_keys(1000)
        else:
            s.limit_live_bytes(10 << 20)
        touch(s, *(f"k{i}" for i in range(5)))
        s.snapshot(2)
        assert s.live_stats.evicted == 0 and s.last_snapshot_whole
        assert s._packed == {} and s._packed_bytes == 0


def test_a_failed_snapshot_forgets_what_was_kept(tmp_path):
    with seeded(tmp_path, 4) as s:
        touch(s, "k2", "k3")
        s.snapshot(2)
        assert s._packed_bytes > 0
        s.get(STEP, "k0").value = lambda: None  # not picklable
        s.get(STEP, "k1").value = "changed"
        with pytest.raises(SnapshotError, match="k0"):
            s.snapshot(3)
        assert s._packed == {} and s._packed_bytes == 0
        s.get(STEP, "k0").value = "fixed"
        s.snapshot(3)
        assert s.last_snapshot_reused == 0, "nothing kept survives a failed snapshot"
        assert [stored(s, f"k{i}") for i in range(4)] == ["fixed", "changed", 102, 103]


def test_kept_pickles_stay_within_their_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod, "KEEP_PICKLES_BYTES", 1000)
    with seeded(tmp_path, 50, whole_from=0.0) as s:
        touch(s, *(f"k{i}" for i in range(10)))
        s.snapshot(2)
        kept = set(s._packed[STEP])
        assert 0 < len(kept) < 50
        assert s._packed_bytes == sum(len(b) + 64 for b in s._packed[STEP].values()) <= 1000
        touch(s, "k0")
        s.snapshot(3)
        assert s.last_snapshot_reused == len(kept - {"k0"})
        assert s._packed_bytes == sum(len(b) + 64 for b in s._packed[STEP].values()) <= 1000


def test_a_key_whose_new_pickle_does_not_fit_is_packed_again_not_copied(tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod, "KEEP_PICKLES_BYTES", 300)
    with seeded(tmp_path, 3, whole_from=0.0) as s:
        touch(s, "k2")
        s.snapshot(2)
        assert set(s._packed[STEP]) == {"k0", "k1", "k2"}
        s.get(STEP, "k0").value = "large" * 40  # its pickle no longer fits
        s.snapshot(3)
        assert set(s._packed[STEP]) == {"k1", "k2"}
        touch(s, "k1")
        s.snapshot(4)
        assert s.last_snapshot_reused == 1, "k2 is copied, k0 is packed again"
        assert [stored(s, f"k{i}") for i in range(3)] == ["large" * 40, 101, 102]


def test_a_whole_epoch_writes_every_live_key_and_the_deletions_of_each_step(tmp_path):
    with seeded(tmp_path, 10) as s:
        s.register("other", Counted)
        for i in range(4):
            s.get_or_build("other", f"o{i}").value = i
        s.snapshot(2)
        s.discard(STEP, "k9")  # this step has a deletion pending, "other" has none
        touch(s, *(f"k{i}" for i in range(6)))
        s.get("other", "o0").value = "o0 changed"
        s.get("other", "o1").value = "o1 changed"
        s.get("other", "o2").value = "o2 changed"
        assert s.snapshot(3) == 14
        assert s.last_snapshot_whole
    with open_store(tmp_path) as s:
        s.register("other", Counted)
        assert {k: s.get(STEP, k).value for k in s.keys(STEP)} == {f"k{i}": i + 100 * (i < 6) for i in range(9)}
        assert {k: s.get("other", k).value for k in s.keys("other")} == {
            "o0": "o0 changed", "o1": "o1 changed", "o2": "o2 changed", "o3": 3}


def test_an_untouched_key_that_cannot_be_packed_in_a_whole_epoch_is_named(tmp_path):
    with seeded(tmp_path, 10) as s:
        s.peek(STEP, "k7").value = lambda: None  # changed without a touch, and not kept
        touch(s, *(f"k{i}" for i in range(6)))
        with pytest.raises(SnapshotError, match="'k7'"):
            s.snapshot(2)


# Operations on a few keys: set a new object, change a live one (both
# touch the key), discard, snapshot.
_keys, _values = KEYS, VALUES
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), _keys, _values),
        st.tuples(st.just("change"), _keys, _values),
        st.tuples(st.just("discard"), _keys),
        st.tuples(st.just("snapshot")),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, budget=st.sampled_from([0, 100, 200, 400, 1 << 20]), share=st.sampled_from([0.0, 0.5]))
def test_topped_up_epochs_store_what_packing_every_object_would(tmp_path_factory, monkeypatch, ops, budget, share):
    """After every snapshot, each key's newest stored row is its state as
    of that snapshot, whichever keys were written from kept pickles (and
    however many fit the budget)."""
    monkeypatch.setattr(state_mod, "KEEP_PICKLES_BYTES", budget)
    model: dict[str, Any] = {}
    epoch = 0
    with open_store(tmp_path_factory.mktemp("kept")) as s:
        s.whole_from = share
        for op in ops + [("snapshot",)]:
            if op[0] == "set":
                s.set(STEP, op[1], Counted(op[2]))
                model[op[1]] = op[2]
            elif op[0] == "change":
                obj: Optional[Counted] = s.get(STEP, op[1])
                if obj is not None:
                    obj.value = op[2]
                    model[op[1]] = op[2]
            elif op[0] == "discard":
                s.discard(STEP, op[1])
                model.pop(op[1], None)
            else:
                epoch += 1
                s.snapshot(epoch)
                assert s._packed_bytes <= budget
                for k in (f"k{i}" for i in range(6)):
                    assert stored(s, k) == model.get(k, GONE), f"key {k} after epoch {epoch}"


# -- through the engine: a batch-mode run whose whole epochs copy keys -----------------


def _rotating_data(epochs: int, keys: int = 10, per_epoch: int = 6) -> List[Tuple[str, int]]:
    """``per_epoch`` distinct keys of ``keys`` per batch, a different set
    each time: every epoch leaves 40% of the keys untouched."""
    return [(f"k{(e * 3 + i) % keys}", 1 + (e + i) % 3) for e in range(epochs) for i in range(per_epoch)]


def _flow(items: List[Any], out: List[Any]) -> Dataflow:
    flow = Dataflow("kept")
    s = op.input("inp", flow, TestingSource(items, batch_size=6))
    s = op.stateful_map("count", s, lambda st, v: ((st or 0) + v, (st or 0) + v))
    op.output("out", s, TestingSink(out))
    return flow


def _run(flow: Dataflow, out: List[Any], cfg: RecoveryConfig, workers: int) -> List[Any]:
    start = len(out)
    cluster_main(flow, [], 0, epoch_interval=timedelta(0), recovery_config=cfg, worker_count_per_proc=workers)
    return out[start:]


@pytest.mark.parametrize("lose_local", [False, True], ids=["fast", "full"])
def test_a_run_whose_whole_epochs_copy_kept_pickles_resumes_to_the_uninterrupted_state(
    tmp_path, monkeypatch, lose_local
):
    copied: List[int] = []
    snapshot = StateStore.snapshot

    def counting(self: StateStore, epoch: int) -> int:
        n = snapshot(self, epoch)
        copied.append(self.last_snapshot_reused)
        return n

    monkeypatch.setattr(StateStore, "snapshot", counting)
    # The kept pickles' path: the one a store takes when the core carries
    # nothing (after a resume until a whole epoch, a state past its budget);
    # a fresh run's core would carry the untouched keys instead.
    monkeypatch.setattr(StateStore, "_carried", lambda self: False)
    data = _rotating_data(30)
    cut = 6 * 17 + 3  # mid-batch
    items = data[:cut] + [TestingSource.ABORT()] + data[cut:] + [TestingSource.EOF()]
    probes = [(f"k{i}", 0) for i in range(10)]
    state, backup = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    cfg = RecoveryConfig(state, backup=DirBackup(backup), snapshot_mode=SnapshotMode.BATCH)
    out: List[Any] = []
    flow = _flow(items + probes, out)
    first = _run(flow, out, cfg, 1)
    assert sum(copied) > 0, "the whole epochs copied untouched keys"
    if lose_local:
        shutil.rmtree(state)
        state.mkdir()
    second = _run(flow, out, cfg, 2)
    third = _run(flow, out, cfg, 1)
    totals: Dict[str, int] = {}
    running = []
    for k, v in data:
        totals[k] = totals.get(k, 0) + v
        running.append((k, totals[k]))
    assert dict(third) == totals, "the probes read the uninterrupted run's final state"
    assert set(first + second) == set(running), "every running total, none wrong"


def test_a_store_whose_states_pack_fast_keeps_nothing(tmp_path):
    with seeded(tmp_path, 300) as s:
        assert s._pack_cost is not None and s._pack_cost > 0, "300 rows packed: their cost is measured"
        half = [f"k{i}" for i in range(150)]
        s._pack_cost = 0.3e-6  # an int state's cost
        touch(s, *half)
        s.snapshot(2)
        assert s._packed == {}
        s._pack_cost = 3e-6  # a windowing key's
        touch(s, *half)
        s.snapshot(3)
        assert len(s._packed[STEP]) == 300
