"""Kept pickles: in batch mode (``whole_from`` set) a store keeps each key's
last pickle until the key is touched again, and an epoch topped up to the
whole state writes the untouched keys from there instead of snapshotting
and pickling their objects again. What it writes must be exactly what
packing the objects would write."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from millpond import _core
from millpond import state as state_mod
from millpond.errors import SnapshotError
from millpond.state import StateStore

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


GONE = "<no row, or a deletion>"


def stored(s: StateStore, key: str) -> Any:
    """The value of key's newest row in the store (not its live object)."""
    found = _core.store_get(s._require_handle(), STEP, key)
    if found is None or found[1] is None:
        return GONE
    return pickle.loads(found[1])


def test_a_top_up_writes_untouched_keys_from_their_kept_pickles(tmp_path):
    with open_store(tmp_path) as s:
        s.whole_from = 0.5
        for i in range(10):
            s.get_or_build(STEP, f"k{i}").value = i
        s.snapshot(1)
        assert s.last_snapshot_reused == 0
        for i in range(6):
            s.get(STEP, f"k{i}").value += 100
        Counted.calls = 0
        assert s.snapshot(2) == 10
        assert s.last_snapshot_whole
        assert s.last_snapshot_reused == 4
        assert Counted.calls == 6, "only the touched keys are snapshotted"
    with open_store(tmp_path) as s:
        assert {k: s.get(STEP, k).value for k in s.keys(STEP)} == {f"k{i}": i + 100 * (i < 6) for i in range(10)}


def test_a_discarded_key_is_no_longer_kept(tmp_path):
    with open_store(tmp_path) as s:
        s.whole_from = 0.5
        for k in "ab":
            s.get_or_build(STEP, k).value = k
        s.snapshot(1)
        held = s._packed_bytes
        s.discard(STEP, "a")
        s.snapshot(2)
        assert set(s._packed[STEP]) == {"b"}
        assert s._packed_bytes < held
        assert stored(s, "a") == GONE


def test_without_whole_from_nothing_is_kept(tmp_path):
    with open_store(tmp_path) as s:
        for i in range(10):
            s.get_or_build(STEP, f"k{i}").value = i
        s.snapshot(1)
        assert s._packed == {} and s._packed_bytes == 0


def test_a_failed_snapshot_forgets_what_was_kept(tmp_path):
    with open_store(tmp_path) as s:
        s.whole_from = 0.5
        for i in range(4):
            s.get_or_build(STEP, f"k{i}").value = i
        s.snapshot(1)
        assert s._packed_bytes > 0
        s.get(STEP, "k0").value = lambda: None  # not picklable
        s.get(STEP, "k1").value = "changed"
        with pytest.raises(SnapshotError, match="k0"):
            s.snapshot(2)
        assert s._packed == {} and s._packed_bytes == 0
        s.get(STEP, "k0").value = "fixed"
        s.snapshot(2)
        assert s.last_snapshot_reused == 0, "nothing kept survives a failed snapshot"
        assert [stored(s, f"k{i}") for i in range(4)] == ["fixed", "changed", 2, 3]


def test_kept_pickles_stay_within_their_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod, "KEEP_PICKLES_BYTES", 1000)
    with open_store(tmp_path) as s:
        s.whole_from = 0.0
        for i in range(50):
            s.get_or_build(STEP, f"k{i}").value = "x" * 40
        s.snapshot(1)
        kept = set(s._packed[STEP])
        assert 0 < len(kept) < 50
        assert s._packed_bytes == sum(len(b) + 64 for b in s._packed[STEP].values()) <= 1000
        s.get(STEP, "k0").value = "y"
        s.snapshot(2)
        assert s.last_snapshot_reused == len(kept - {"k0"})
        assert s._packed_bytes == sum(len(b) + 64 for b in s._packed[STEP].values()) <= 1000


def test_a_key_whose_new_pickle_does_not_fit_is_packed_again_not_copied(tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod, "KEEP_PICKLES_BYTES", 200)
    with open_store(tmp_path) as s:
        s.whole_from = 0.0
        s.get_or_build(STEP, "a").value = "small"
        s.get_or_build(STEP, "b").value = 0
        s.snapshot(1)
        assert set(s._packed[STEP]) == {"a", "b"}
        s.get(STEP, "a").value = "large" * 40  # its pickle no longer fits
        s.snapshot(2)
        assert set(s._packed[STEP]) == {"b"}
        s.get(STEP, "b").value = 1
        s.snapshot(3)
        assert s.last_snapshot_reused == 0
        assert (stored(s, "a"), stored(s, "b")) == ("large" * 40, 1)


# Operations on a few keys: set a new object, change a live one (both
# touch the key), discard, snapshot.
_keys = st.sampled_from([f"k{i}" for i in range(6)])
_values = st.one_of(st.integers(), st.text(max_size=120), st.none())
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
