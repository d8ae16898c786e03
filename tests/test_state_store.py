"""StateStore and MemoryStateStore: round trips, discards, resume epochs,
many keys, streaming hydration, errors and the in-process lock.

Cross-process behaviour (SIGKILL, lock held by another process) is in
test_state_crash.py; the hypothesis state machine in test_state_machine.py.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from millpond.errors import (
    CorruptObjectError,
    ForeignStoreError,
    SnapshotError,
    StateStoreError,
    StoreLayoutError,
    StoreLockedError,
)
from millpond.state import MemoryStateStore, StateStore, Stateful

FLOW = "flow"
STEP = "wc.count"


class Box:
    """Holds any value; its snapshot is the value itself."""

    built_from: list[Any] = []

    def __init__(self, resume_state: Any) -> None:
        Box.built_from.append(resume_state)
        self.value = resume_state

    def snapshot(self) -> Any:
        return self.value


def box(value: Any) -> Box:
    b = Box.__new__(Box)
    b.value = value
    return b


class Counter:
    def __init__(self, resume_state: Optional[int]) -> None:
        self.n = resume_state or 0

    def snapshot(self) -> int:
        return self.n


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: float
    tags: tuple[str, ...] = ()


class Session:
    """A custom class whose snapshot is itself a custom (picklable) object."""

    def __init__(self, resume_state: Optional["SessionSnap"]) -> None:
        snap = resume_state or SessionSnap([], 0)
        self.events, self.total = list(snap.events), snap.total

    def add(self, event: str, amount: int) -> None:
        self.events.append(event)
        self.total += amount

    def snapshot(self) -> "SessionSnap":
        return SessionSnap(list(self.events), self.total)


@dataclasses.dataclass
class SessionSnap:
    events: list[str]
    total: int


def open_store(path: Path, resume_epoch: Optional[int] = None, **kw: Any) -> StateStore:
    store = StateStore.open(path, FLOW, resume_epoch=resume_epoch, **kw)
    store.register(STEP, Box)
    return store


def values(store: Any, step: str = STEP) -> dict[str, Any]:
    """{key: snapshot} of every key the store shows for ``step``."""
    return {k: store.get(step, k).snapshot() for k in store.keys(step)}


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path)
    yield s
    s.close()


@pytest.fixture(params=["StateStore", "MemoryStateStore"])
def any_store(request, tmp_path):
    """A StateStore or a MemoryStateStore with STEP registered to Box."""
    s = open_store(tmp_path) if request.param == "StateStore" else MemoryStateStore()
    s.register(STEP, Box)
    yield s
    s.close()


# -- shared behaviour: StateStore and MemoryStateStore -----------------------


def test_get_of_unknown_key_returns_none_and_touches_nothing(any_store):
    assert any_store.get(STEP, "nope") is None
    assert any_store.dirty_count() == 0
    assert any_store.keys(STEP) == []


def test_get_or_build_builds_with_none_once_then_returns_the_live_object(any_store):
    Box.built_from.clear()
    first = any_store.get_or_build(STEP, "a")
    assert Box.built_from == [None]
    assert any_store.get_or_build(STEP, "a") is first
    assert any_store.get(STEP, "a") is first
    assert Box.built_from == [None]


def test_set_then_get_returns_the_same_object(any_store):
    obj = box({"n": 1})
    any_store.set(STEP, "a", obj)
    assert any_store.get(STEP, "a") is obj
    assert any_store.keys(STEP) == ["a"]
    assert any_store.live_count() == 1


def test_discard_drops_the_key_and_get_returns_none(any_store):
    any_store.set(STEP, "a", box(1))
    any_store.set(STEP, "b", box(2))
    any_store.discard(STEP, "a")
    assert any_store.get(STEP, "a") is None
    assert any_store.keys(STEP) == ["b"]


def test_discard_of_a_key_that_never_existed_is_not_an_error(any_store):
    any_store.discard(STEP, "ghost")
    assert any_store.keys(STEP) == []


def test_discard_then_set_in_the_same_epoch_keeps_the_new_object(any_store):
    any_store.set(STEP, "a", box("old"))
    any_store.discard(STEP, "a")
    new = box("new")
    any_store.set(STEP, "a", new)
    assert any_store.get(STEP, "a") is new
    assert any_store.keys(STEP) == ["a"]


def test_discard_then_get_or_build_builds_a_fresh_object(any_store):
    any_store.set(STEP, "a", box("old"))
    any_store.discard(STEP, "a")
    assert any_store.get_or_build(STEP, "a").value is None


def test_keys_are_sorted_and_span_steps_independently(any_store):
    any_store.register("other", Box)
    for k in ["b", "a", "c"]:
        any_store.set(STEP, k, box(k))
    any_store.set("other", "z", box(0))
    assert any_store.keys(STEP) == ["a", "b", "c"]
    assert any_store.keys("other") == ["z"]


def test_dirty_count_counts_touched_keys_until_snapshot(any_store):
    any_store.set(STEP, "a", box(1))
    any_store.get_or_build(STEP, "b")
    any_store.discard(STEP, "c")
    assert any_store.dirty_count() == 3
    any_store.snapshot(1)
    assert any_store.dirty_count() == 0
    any_store.get(STEP, "a")  # reading a live key touches it
    assert any_store.dirty_count() == 1


def test_registering_again_replaces_the_builder_and_keeps_live_objects(any_store):
    live = box(1)
    any_store.set(STEP, "a", live)
    any_store.register(STEP, Counter)
    assert any_store.get(STEP, "a") is live
    assert isinstance(any_store.get_or_build(STEP, "new"), Counter)
    assert any_store.registered_steps() == [STEP]


@pytest.mark.parametrize("method", ["get", "get_or_build", "discard", "keys", "set"])
def test_unregistered_step_id_is_an_error_naming_it(any_store, method):
    args = {"keys": ("nope",), "set": ("nope", "k", box(1))}.get(method, ("nope", "k"))
    with pytest.raises(StateStoreError, match=r"step 'nope' has no registered builder.*register\('nope'"):
        getattr(any_store, method)(*args)


@pytest.mark.parametrize("key", [1, b"a", None, ("a",), 1.5])
@pytest.mark.parametrize("method", ["get", "get_or_build", "set", "discard"])
def test_non_str_key_is_a_type_error_naming_the_step(any_store, method, key):
    args = (STEP, key, box(1)) if method == "set" else (STEP, key)
    with pytest.raises(TypeError, match=rf"state key of step '{STEP}' must be str, got {type(key).__name__}"):
        getattr(any_store, method)(*args)


def test_str_subclass_key_is_rejected(any_store):
    class Key(str):
        pass

    with pytest.raises(TypeError, match="must be str"):
        any_store.set(STEP, Key("a"), box(1))


def test_set_none_is_a_type_error_pointing_at_discard(any_store):
    with pytest.raises(TypeError, match=r"use discard\(\)"):
        any_store.set(STEP, "a", None)


@pytest.mark.parametrize("step_id", ["", None, 3])
def test_register_rejects_a_step_id_that_is_not_a_non_empty_str(any_store, step_id):
    with pytest.raises(TypeError, match="step id must be a non-empty str"):
        any_store.register(step_id, Box)


def test_register_rejects_a_builder_that_is_not_callable(any_store):
    with pytest.raises(TypeError, match=r"builder for step 'x' must be callable"):
        any_store.register("x", 42)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get(STEP, "a"),
        lambda s: s.get_or_build(STEP, "a"),
        lambda s: s.set(STEP, "a", box(1)),
        lambda s: s.discard(STEP, "a"),
        lambda s: s.keys(STEP),
        lambda s: s.register("x", Box),
        lambda s: s.snapshot(1),
    ],
    ids=["get", "get_or_build", "set", "discard", "keys", "register", "snapshot"],
)
def test_closed_store_raises_state_store_error_saying_closed(any_store, call):
    any_store.set(STEP, "a", box(1))
    any_store.close()
    any_store.close()  # closing twice is a no-op
    assert any_store.closed
    with pytest.raises(StateStoreError, match="is closed"):
        call(any_store)


@pytest.mark.parametrize("method, args", [("hydrate_all", (STEP,)), ("stats", ()), ("gc", (1,))])
def test_closed_state_store_refuses_core_calls(store, method, args):
    store.close()
    with pytest.raises(StateStoreError, match="StateStore is closed"):
        getattr(store, method)(*args)


def test_context_manager_closes_the_store(tmp_path):
    with StateStore.open(tmp_path, FLOW) as s:
        assert not s.closed
    assert s.closed
    with MemoryStateStore() as m:
        pass
    assert m.closed


def test_stateful_protocol_is_duck_typed():
    assert isinstance(box(1), Stateful)
    assert isinstance(Counter(None), Stateful)
    assert not isinstance(object(), Stateful)


def test_memory_store_snapshot_persists_nothing_and_returns_zero():
    m = MemoryStateStore()
    m.register(STEP, Box)
    m.set(STEP, "a", box(1))
    assert m.snapshot(1) == 0
    assert m.keys(STEP) == ["a"]


def test_memory_store_snapshot_forgets_touched_keys_without_pickling():
    m = MemoryStateStore()
    m.register(STEP, Box)
    m.set(STEP, "bad", box(lambda: 1))  # unpicklable, but nothing is persisted
    assert m.dirty_count() == 1
    assert m.snapshot(1) == 0
    assert m.dirty_count() == 0
    assert m.get(STEP, "bad") is not None


# -- round trips through the Go core -----------------------------------------


def test_snapshot_then_reopen_restores_every_key(tmp_path):
    with StateStore.open(tmp_path, FLOW) as s:
        s.register(STEP, Counter)
        for i, word in enumerate(["apple", "pear", "fig"]):
            s.get_or_build(STEP, word).n += i + 1
        assert s.snapshot(1) == 3
    with StateStore.open(tmp_path, FLOW) as s:
        s.register(STEP, Counter)
        assert {k: s.get(STEP, k).n for k in s.keys(STEP)} == {"apple": 1, "pear": 2, "fig": 3}


@pytest.mark.parametrize(
    "value",
    [
        0, 1, -(2**70), 3.25, "text", True, False, None,
        {"a": [1, 2, {"b": (3, 4)}]}, [1, "two", 3.0], {1, 2}, frozenset({"x"}), (1, (2, (3,))),
        Point(1, 2.5, ("t",)),
        b"\x00\xff" * 100,
        # empty-like snapshots must come back as themselves, not as "no state"
        b"", "", [], {}, (), bytearray(),
    ],
    ids=repr,
)
def test_snapshot_values_of_many_types_round_trip(tmp_path, value):
    with open_store(tmp_path) as s:
        s.set(STEP, "k", box(value))
        assert s.snapshot(1) == 1
    Box.built_from.clear()
    with open_store(tmp_path, resume_epoch=2) as s:
        assert s.keys(STEP) == ["k"]
        restored = s.get(STEP, "k")
        assert restored is not None
        assert Box.built_from == [value]
        assert restored.value == value and type(restored.value) is type(value)


def test_custom_class_with_snapshot_round_trips_through_its_builder(tmp_path):
    with StateStore.open(tmp_path, FLOW) as s:
        s.register("sessions", Session)
        s.get_or_build("sessions", "u1").add("login", 1)
        s.get_or_build("sessions", "u1").add("buy", 10)
        s.snapshot(1)
    with StateStore.open(tmp_path, FLOW, resume_epoch=2) as s:
        s.register("sessions", Session)
        u1 = s.get("sessions", "u1")
        assert isinstance(u1, Session)
        assert (u1.events, u1.total) == (["login", "buy"], 11)
        u1.add("logout", 0)
        s.snapshot(2)
    with StateStore.open(tmp_path, FLOW) as s:
        s.register("sessions", Session)
        assert s.get("sessions", "u1").events == ["login", "buy", "logout"]


def test_get_hydrates_through_the_builder_only_once(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "a", box(5))
        s.snapshot(1)
    Box.built_from.clear()
    with open_store(tmp_path) as s:
        first = s.get(STEP, "a")
        assert s.get(STEP, "a") is first
        assert s.get_or_build(STEP, "a") is first
        assert Box.built_from == [5]


def test_peek_reads_live_and_stored_keys_without_touching_them(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "a", box(5))
        s.snapshot(1)
    Box.built_from.clear()
    with open_store(tmp_path) as s:
        first = s.peek(STEP, "a")
        assert first.value == 5 and Box.built_from == [5]
        assert s.peek(STEP, "a") is first
        assert s.peek(STEP, "nope") is None
        assert s.dirty_count() == 0
        assert s.snapshot(2) == 0, "peeked keys are not snapshotted"
        assert s.get(STEP, "a") is first
        assert s.dirty_count() == 1


def test_snapshot_writes_only_keys_touched_since_the_last_snapshot(store):
    for i in range(10):
        store.set(STEP, f"k{i}", box(i))
    assert store.snapshot(1) == 10
    assert store.snapshot(2) == 0
    store.get(STEP, "k3").value = 33
    store.discard(STEP, "k4")
    assert store.snapshot(3) == 2
    store.close()
    with open_store(store.path.parents[2]) as s:
        assert values(s) == {f"k{i}": i for i in range(10) if i != 4} | {"k3": 33}


@pytest.mark.parametrize(
    "key",
    ["", "ünïcødé", "日本語のキー", "emoji 😀🎉", "e\u0301", "nul\x00inside", "tab\tnew\nline", "x" * 10_000, "'\"\\"],
    ids=lambda k: repr(k[:20]),
)
def test_unicode_and_odd_keys_round_trip(tmp_path, key):
    with open_store(tmp_path) as s:
        s.set(STEP, key, box(key))
        s.set(STEP, key + "!", box(1))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        assert s.keys(STEP) == sorted([key, key + "!"])
        assert s.get(STEP, key).value == key
        s.hydrate_all(STEP, chunk_rows=1)


def test_unicode_step_ids_round_trip(tmp_path):
    step = "stép.日本😀"
    with StateStore.open(tmp_path, FLOW) as s:
        s.register(step, Box)
        s.set(step, "k", box(1))
        s.snapshot(1)
    with StateStore.open(tmp_path, FLOW) as s:
        s.register(step, Box)
        assert s.get(step, "k").value == 1


def test_step_id_containing_nul_is_rejected_or_round_trips(tmp_path):
    step = "a\x00b"
    with StateStore.open(tmp_path, FLOW) as s:
        try:
            s.register(step, Box)
        except (TypeError, ValueError):
            return  # rejecting it up front is fine
        s.register("a", Box)
        s.set("a", "other-step", box(0))
        s.set(step, "k", box(1))
        s.snapshot(1)
        assert s.keys(step) == ["k"]
    with StateStore.open(tmp_path, FLOW) as s:
        s.register(step, Box)
        assert s.get(step, "k") is not None, "state of the step was lost on reopen"


def test_large_snapshot_value_round_trips(tmp_path):
    big = bytes(range(256)) * (16 << 10)  # 4 MiB
    with open_store(tmp_path) as s:
        s.set(STEP, "big", box(big))
        s.set(STEP, "small", box(1))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        assert s.get(STEP, "big").value == big
    with open_store(tmp_path) as s:
        assert s.hydrate_all(STEP, chunk_rows=1) == 2
        assert s.get(STEP, "big").value == big


def test_key_not_encodable_as_utf8_never_wedges_the_store(store, tmp_path):
    store.set(STEP, "good", box(1))
    try:
        store.set(STEP, "bad\ud800", box(2))
    except ValueError:
        pass  # rejecting the key up front is fine
    else:
        with pytest.raises(SnapshotError, match="bad"):
            store.snapshot(1)
        store.discard(STEP, "bad\ud800")
    store.snapshot(1)
    store.close()
    with open_store(tmp_path) as s:
        assert values(s) == {"good": 1}


def test_reopen_without_resume_epoch_sees_every_row(tmp_path):
    with open_store(tmp_path) as s:
        for epoch in range(1, 6):
            s.set(STEP, f"k{epoch}", box(epoch))
            s.set(STEP, "shared", box(epoch))
            s.snapshot(epoch)
    with open_store(tmp_path) as s:
        assert s.stats()["last_epoch"] == 5
        assert values(s) == {"k1": 1, "k2": 2, "k3": 3, "k4": 4, "k5": 5, "shared": 5}
    with open_store(tmp_path, resume_epoch=6) as s:
        assert values(s)["shared"] == 5
    with open_store(tmp_path, resume_epoch=100) as s:
        assert values(s)["shared"] == 5


def test_stats_report_layout_and_row_counts(tmp_path):
    with StateStore.open(tmp_path, FLOW, worker_index=1, worker_count=3, key_group_count=64, execution=7) as s:
        s.register(STEP, Box)
        s.set(STEP, "a", box(1))
        s.discard(STEP, "b")
        s.snapshot(4)
        st = s.stats()
    assert st["worker_index"] == 1 and st["worker_count"] == 3 and st["key_group_count"] == 64
    assert st["execution"] == 7 and st["last_epoch"] == 4
    assert st["rows"] == 2 and st["deletions"] == 1
    assert s.path == tmp_path / FLOW / "worker-0001" / "store.sqlite"
    assert s.path.exists()


def test_empty_snapshot_advances_the_last_epoch(store):
    assert store.snapshot(1) == 0
    assert store.stats()["last_epoch"] == 1
    assert store.snapshot(2) == 0
    assert store.stats()["last_epoch"] == 2


def test_snapshot_twice_at_the_same_epoch_keeps_the_newest_value(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "a", box(1))
        s.snapshot(1)
        s.get(STEP, "a").value = 2
        s.snapshot(1)
    with open_store(tmp_path) as s:
        assert values(s) == {"a": 2}


def test_workers_of_one_flow_have_independent_stores(tmp_path):
    a = StateStore.open(tmp_path, FLOW, worker_index=0, worker_count=2)
    b = StateStore.open(tmp_path, FLOW, worker_index=1, worker_count=2)
    try:
        for s, v in ((a, "a"), (b, "b")):
            s.register(STEP, Box)
            s.set(STEP, "k", box(v))
            s.snapshot(1)
    finally:
        a.close()
        b.close()
    with StateStore.open(tmp_path, FLOW, worker_index=1, worker_count=2) as s:
        s.register(STEP, Box)
        assert values(s) == {"k": "b"}


def test_last_snapshot_timing_reports_python_and_go_seconds(store):
    store.set(STEP, "a", box(1))
    store.snapshot(1)
    t = store.last_snapshot_timing
    assert set(t) == {"python", "go"} and all(v >= 0 for v in t.values())


# -- discard then resume -----------------------------------------------------


def test_discarded_key_stays_gone_after_reopen(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "gone", box(1))
        s.set(STEP, "kept", box(2))
        s.snapshot(1)
        s.discard(STEP, "gone")
        assert s.snapshot(2) == 1
    for resume in (None, 3):
        with open_store(tmp_path, resume_epoch=resume) as s:
            assert s.get(STEP, "gone") is None
            assert s.keys(STEP) == ["kept"]
            assert s.hydrate_all(STEP) == 1


def test_discard_then_set_again_in_the_same_epoch_persists_the_new_value(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "a", box("v1"))
        s.snapshot(1)
        s.discard(STEP, "a")
        s.set(STEP, "a", box("v2"))
        s.snapshot(2)
    with open_store(tmp_path) as s:
        assert values(s) == {"a": "v2"}


def test_discard_then_get_or_build_in_the_same_epoch_persists_a_fresh_object(tmp_path):
    with StateStore.open(tmp_path, FLOW) as s:
        s.register(STEP, Counter)
        s.get_or_build(STEP, "a").n = 10
        s.snapshot(1)
        s.discard(STEP, "a")
        s.get_or_build(STEP, "a").n += 1
        s.snapshot(2)
    with StateStore.open(tmp_path, FLOW) as s:
        s.register(STEP, Counter)
        assert s.get(STEP, "a").n == 1


def test_discard_of_a_stored_key_hides_it_before_the_snapshot(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "a", box(1))
        s.set(STEP, "b", box(2))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        s.discard(STEP, "a")  # not live: only stored
        assert s.get(STEP, "a") is None
        assert s.keys(STEP) == ["b"]
        assert s.hydrate_all(STEP) == 1
        assert s.live_count() == 1


def test_discard_of_a_stored_key_then_get_or_build_does_not_hydrate_the_old_state(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "a", box("old"))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        s.discard(STEP, "a")
        assert s.get_or_build(STEP, "a").value is None


def test_resume_before_a_discard_brings_the_key_back(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "a", box("v1"))
        s.snapshot(1)
        s.discard(STEP, "a")
        s.snapshot(2)
    with open_store(tmp_path, resume_epoch=2) as s:
        assert values(s) == {"a": "v1"}


# -- resume at an older epoch ------------------------------------------------


def _write_five_epochs(path: Path) -> None:
    with open_store(path) as s:
        for epoch in range(1, 6):
            s.set(STEP, "shared", box(epoch))
            s.set(STEP, f"only{epoch}", box(epoch))
            if epoch == 4:
                s.discard(STEP, "only1")
            s.snapshot(epoch)


@pytest.mark.parametrize("resume", [1, 2, 3, 4, 5, 6])
def test_resume_epoch_sees_newest_row_before_it_and_ignores_newer(tmp_path, resume):
    _write_five_epochs(tmp_path)
    expected: dict[str, int] = {}
    for epoch in range(1, resume):
        expected["shared"] = epoch
        expected[f"only{epoch}"] = epoch
        if epoch == 4:
            del expected["only1"]
    with open_store(tmp_path, resume_epoch=resume) as s:
        assert values(s) == expected
        assert s.stats()["last_epoch"] == min(resume - 1, 5)


def test_resume_at_an_older_epoch_rolls_back_newer_rows_for_good(tmp_path):
    _write_five_epochs(tmp_path)
    with open_store(tmp_path, resume_epoch=3) as s:
        assert s.get(STEP, "shared").value == 2
    # Opening afterwards without a resume epoch sees the rollback.
    with open_store(tmp_path) as s:
        assert values(s) == {"shared": 2, "only1": 1, "only2": 2}
        assert s.stats()["last_epoch"] == 2
        # Epoch 3 is written anew.
        s.set(STEP, "shared", box("3-again"))
        s.snapshot(3)
    with open_store(tmp_path) as s:
        assert values(s) == {"shared": "3-again", "only1": 1, "only2": 2}


def test_resume_epoch_one_starts_from_empty_state(tmp_path):
    _write_five_epochs(tmp_path)
    with open_store(tmp_path, resume_epoch=1) as s:
        assert s.keys(STEP) == []
        assert s.get(STEP, "shared") is None
        assert s.stats()["rows"] == 0


def test_rollback_of_every_row_of_a_step_forgets_the_step(tmp_path):
    with StateStore.open(tmp_path, FLOW) as s:
        s.register("early", Box)
        s.register("late", Box)
        s.set("early", "a", box(1))
        s.snapshot(1)
        s.set("late", "b", box(2))
        s.snapshot(2)
    with StateStore.open(tmp_path, FLOW, resume_epoch=2) as s:
        s.register("early", Box)
        s.register("late", Box)
        assert s.keys("late") == [] and s.get("late", "b") is None
        assert s.keys("early") == ["a"]


def test_gc_keeps_the_newest_row_of_each_key(tmp_path):
    with open_store(tmp_path) as s:
        for epoch in range(1, 5):
            s.set(STEP, "a", box(epoch))
            s.set(STEP, f"e{epoch}", box(epoch))
            if epoch == 3:
                s.discard(STEP, "e1")
            s.snapshot(epoch)
        before = values(s)
        assert s.gc(4) > 0
        assert s.stats()["deletions"] == 0
    with open_store(tmp_path) as s:
        assert values(s) == before == {"a": 4, "e2": 2, "e3": 3, "e4": 4}


# -- many steps, many keys, streaming hydration ------------------------------


def test_many_steps_and_keys_round_trip_over_several_epochs(tmp_path):
    steps, nkeys = 5, 20_000
    names = [f"step{i}" for i in range(steps)]
    keys = [f"key-{j:06d}" for j in range(nkeys)]
    with StateStore.open(tmp_path, FLOW) as s:
        for name in names:
            s.register(name, Counter)
            for k in keys:
                s.get_or_build(name, k).n = 1
        assert s.snapshot(1) == steps * nkeys
        # Epoch 2 touches one key in ten of each step, and discards a few.
        for i, name in enumerate(names):
            for j in range(i, nkeys, 10):
                s.get(name, keys[j]).n += j
            for j in range(i, nkeys, 1000):
                s.discard(name, keys[j])
        s.snapshot(2)
    with StateStore.open(tmp_path, FLOW) as s:
        for i, name in enumerate(names):
            s.register(name, Counter)
            assert s.hydrate_all(name, chunk_rows=3000) == nkeys - nkeys // 1000
            got = {k: s.get(name, k).n for k in s.keys(name)}
            expected = {k: 1 + (j if j % 10 == i else 0) for j, k in enumerate(keys) if j % 1000 != i}
            assert got == expected, name
    with StateStore.open(tmp_path, FLOW, resume_epoch=2) as s:
        s.register(names[0], Counter)
        assert s.hydrate_all(names[0], chunk_rows=7777) == nkeys
        assert all(s.get(names[0], k).n == 1 for k in keys[:100])


@pytest.mark.parametrize("chunk_rows", [1, 3, 64, 999, 1000, 5000])
def test_hydrate_all_streams_in_chunks_smaller_than_the_key_count(tmp_path, chunk_rows):
    n = 1000 if chunk_rows > 3 else 100
    with open_store(tmp_path) as s:
        for i in range(n):
            s.set(STEP, f"k{i:04d}", box(i))
        for i in range(0, n, 7):
            s.discard(STEP, f"k{i:04d}")  # deletions interleave with live rows
        s.snapshot(1)
    expected = {f"k{i:04d}": i for i in range(n) if i % 7}
    with open_store(tmp_path) as s:
        assert s.hydrate_all(STEP, chunk_rows=chunk_rows) == len(expected)
        assert s.live_count() == len(expected)
        assert values(s) == expected


def test_hydrate_all_keeps_live_objects_and_skips_pending_discards(tmp_path):
    with open_store(tmp_path) as s:
        for i in range(50):
            s.set(STEP, f"k{i:02d}", box(i))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        live = s.get(STEP, "k10")
        live.value = "changed"
        s.discard(STEP, "k20")
        assert s.hydrate_all(STEP, chunk_rows=8) == 48
        assert s.get(STEP, "k10") is live
        assert s.get(STEP, "k20") is None
        assert len(s.keys(STEP)) == 49
        # hydration does not touch anything: only k10 and k20 are written
        assert s.snapshot(2) == 2


@pytest.mark.parametrize("collecting", [True, False])
def test_hydrate_all_leaves_the_cyclic_collector_as_it_found_it(tmp_path, collecting):
    import gc

    with open_store(tmp_path) as s:
        for i in range(20):
            s.set(STEP, f"k{i:02d}", box(i))
        s.snapshot(1)
    was = gc.isenabled()
    try:
        (gc.enable if collecting else gc.disable)()
        with open_store(tmp_path) as s:
            s.register(STEP, lambda st: box(1 // 0) if st == 7 else box(st))
            with pytest.raises(ZeroDivisionError):
                s.hydrate_all(STEP, chunk_rows=4)  # the builder fails midway
            assert gc.isenabled() is collecting
            s.register(STEP, box)
            s.hydrate_all(STEP, chunk_rows=4)
            assert s.live_count() == 20
            assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()


def test_hydrate_all_of_a_step_with_no_stored_rows_returns_zero(store):
    store.set(STEP, "live", box(1))
    assert store.hydrate_all(STEP) == 0
    assert store.keys(STEP) == ["live"]


def test_hydrate_all_of_an_unregistered_step_is_an_error(store):
    with pytest.raises(StateStoreError, match="no registered builder"):
        store.hydrate_all("nope")


def test_keys_is_the_union_of_live_and_stored_minus_discarded(tmp_path):
    with open_store(tmp_path) as s:
        for k in ["s1", "s2", "s3", "both"]:
            s.set(STEP, k, box(k))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        s.get(STEP, "both")  # stored and now live
        s.set(STEP, "live1", box(1))  # live only
        s.discard(STEP, "s2")  # stored, discarded
        assert s.keys(STEP) == ["both", "live1", "s1", "s3"]
        s.snapshot(2)
        assert s.keys(STEP) == ["both", "live1", "s1", "s3"]


def test_keys_after_snapshot_include_stored_keys_of_a_new_step(store):
    store.register("late", Box)
    store.set("late", "x", box(1))
    store.snapshot(1)
    store.discard("late", "x")
    assert store.keys("late") == []


# -- errors: snapshots -------------------------------------------------------


class Unpicklable:
    def __init__(self, what: Any) -> None:
        self.what = what

    def snapshot(self) -> Any:
        return self.what


class Exploding:
    def snapshot(self) -> Any:
        raise RuntimeError("boom")


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: Unpicklable(lambda x: x), id="lambda"),
        pytest.param(lambda: Unpicklable(open(os.devnull)), id="open-file"),
        pytest.param(lambda: Unpicklable({"nested": [lambda: 1]}), id="nested-lambda"),
        pytest.param(Exploding, id="snapshot-raises"),
        pytest.param(lambda: object(), id="no-snapshot-method"),
    ],
)
def test_bad_snapshot_raises_snapshot_error_naming_step_and_key_and_writes_nothing(tmp_path, bad):
    with open_store(tmp_path) as s:
        s.set(STEP, "old", box("v1"))
        s.snapshot(1)
        s.set(STEP, "old", box("v2"))  # a good row in the same batch
        s.discard(STEP, "gone")
        obj = bad()
        s.set(STEP, "bad-key", obj)
        with pytest.raises(SnapshotError, match=rf"step '{STEP}' key 'bad-key'") as info:
            s.snapshot(2)
        assert info.value.__cause__ is not None
        assert s.stats()["last_epoch"] == 1
        assert s.stats()["rows"] == 1
        if isinstance(obj, Unpicklable) and hasattr(obj.what, "close"):
            obj.what.close()
    with open_store(tmp_path) as s:
        assert values(s) == {"old": "v1"}, "part of the failed batch was written"


def test_store_stays_usable_after_a_snapshot_error_once_the_object_is_fixed(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "good", box(1))
        bad = Unpicklable(lambda: 1)
        s.set(STEP, "bad", bad)
        with pytest.raises(SnapshotError):
            s.snapshot(1)
        assert s.dirty_count() == 2, "a failed snapshot must not forget the touched keys"
        bad.what = "fixed"
        assert s.snapshot(1) == 2
    with open_store(tmp_path) as s:
        assert values(s) == {"good": 1, "bad": "fixed"}


def test_snapshot_error_is_a_state_store_error():
    assert issubclass(SnapshotError, StateStoreError)


@pytest.mark.parametrize("epoch", [0, -1])
def test_snapshot_at_an_epoch_below_one_is_a_value_error(store, epoch):
    store.set(STEP, "a", box(1))
    with pytest.raises(ValueError):
        store.snapshot(epoch)


def test_snapshot_at_an_epoch_older_than_the_last_written_is_rejected(tmp_path):
    with open_store(tmp_path) as s:
        s.set(STEP, "a", box("at-5"))
        s.snapshot(5)
        s.set(STEP, "a", box("at-3"))
        with pytest.raises((ValueError, StateStoreError)):
            s.snapshot(3)


# -- errors: opening ---------------------------------------------------------


@pytest.mark.parametrize("flow_id", ["", "a.b", "a/b", "a\\b", "a\x00b", ".", 3, None])
def test_invalid_flow_id_is_a_value_error(tmp_path, flow_id):
    with pytest.raises(ValueError, match="flow id"):
        StateStore.open(tmp_path, flow_id)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"worker_index": -1}, "worker_index -1 is out of range"),
        ({"worker_index": 1}, "worker_index 1 is out of range for 1 workers"),
        ({"worker_index": 2, "worker_count": 2}, "worker_index 2 is out of range"),
        ({"worker_count": 0}, "worker_count must be between 1"),
        ({"worker_count": 300}, "worker_count must be between 1 and the key-group count 256"),
        ({"key_group_count": 0}, "key_group_count must be at least 1"),
        ({"resume_epoch": 0}, "resume_epoch must be at least 1"),
        ({"resume_epoch": -5}, "resume_epoch must be at least 1"),
    ],
)
def test_invalid_layout_or_resume_epoch_is_a_value_error(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        StateStore.open(tmp_path, FLOW, **kw)
    assert not (tmp_path / FLOW).exists(), "a rejected open must not create anything"


def test_missing_local_state_dir_is_made_with_its_parents(tmp_path):
    missing = tmp_path / "no" / "such"
    with StateStore.open(missing, FLOW) as store:
        store.register("s", int)
    assert (missing / FLOW / "worker-0000").is_dir()


def test_local_state_dir_that_is_a_file_is_a_state_store_error_naming_it(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StateStoreError, match=rf"{f} exists and is not a directory"):
        StateStore.open(f, FLOW)


def _store_with_one_row(path: Path, **kw: Any) -> None:
    with StateStore.open(path, FLOW, **kw) as s:
        s.register(STEP, Box)
        s.set(STEP, "a", box(1))
        s.snapshot(1)


@pytest.mark.parametrize("how", ["copy", "rename"])
def test_worker_dir_under_another_flow_id_is_a_foreign_store_error(tmp_path, how):
    _store_with_one_row(tmp_path)
    (shutil.copytree if how == "copy" else shutil.move)(tmp_path / FLOW, tmp_path / "other")
    with pytest.raises(ForeignStoreError, match=r'holds state of flow "flow", not "other"') as info:
        StateStore.open(tmp_path, "other")
    assert not isinstance(info.value, StoreLayoutError)
    assert "store.sqlite" in str(info.value)
    # The failed open released its lock.
    (tmp_path / "other" / "worker-0000" / "store.sqlite").unlink()
    with StateStore.open(tmp_path, "other"):
        pass


def test_different_key_group_count_is_a_foreign_store_error(tmp_path):
    _store_with_one_row(tmp_path)
    with pytest.raises(ForeignStoreError, match="written with 256 key groups, not 128") as info:
        StateStore.open(tmp_path, FLOW, key_group_count=128)
    assert not isinstance(info.value, StoreLayoutError)
    with open_store(tmp_path) as s:  # neither lock nor data was touched
        assert values(s) == {"a": 1}


@pytest.mark.parametrize("worker_count", [2, 5])
def test_different_worker_count_is_a_store_layout_error(tmp_path, worker_count):
    _store_with_one_row(tmp_path)
    with pytest.raises(StoreLayoutError, match=rf"belongs to worker 0 of 1, not 0 of {worker_count}"):
        StateStore.open(tmp_path, FLOW, worker_count=worker_count)
    with open_store(tmp_path) as s:
        assert values(s) == {"a": 1}


@pytest.mark.parametrize("content", [b"garbage " * 200, b"", b"SQLite format 3\x00" + b"\xff" * 100])
def test_garbage_in_place_of_the_store_file_is_a_corrupt_object_error_naming_the_path(tmp_path, content):
    path = tmp_path / FLOW / "worker-0000" / "store.sqlite"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(CorruptObjectError, match=str(path)):
        StateStore.open(tmp_path, FLOW)
    assert path.read_bytes() == content, "a corrupt store must not be overwritten"


def test_directory_in_place_of_the_store_file_is_a_corrupt_object_error(tmp_path):
    path = tmp_path / FLOW / "worker-0000" / "store.sqlite"
    path.mkdir(parents=True)
    with pytest.raises(CorruptObjectError, match=str(path)):
        StateStore.open(tmp_path, FLOW)


# -- the lock within one process ---------------------------------------------


def test_second_open_in_the_same_process_names_this_pid(tmp_path):
    first = StateStore.open(tmp_path, FLOW)
    try:
        with pytest.raises(StoreLockedError, match=rf"process {os.getpid()} holds .*LOCK") as info:
            StateStore.open(tmp_path, FLOW)
        assert isinstance(info.value, StateStoreError)
        with pytest.raises(StoreLockedError):  # the failed attempt did not release the lock
            StateStore.open(tmp_path, FLOW)
        # The failed open did not disturb the holder.
        first.register(STEP, Box)
        first.set(STEP, "a", box(1))
        assert first.snapshot(1) == 1
    finally:
        first.close()
    with open_store(tmp_path) as again:
        assert values(again) == {"a": 1}


def test_lock_is_released_when_a_forgotten_store_is_collected(tmp_path):
    StateStore.open(tmp_path, FLOW)  # never closed
    gc.collect()
    with StateStore.open(tmp_path, FLOW):
        pass


def test_open_with_a_locked_store_and_a_bad_layout_reports_the_lock(tmp_path):
    with StateStore.open(tmp_path, FLOW):
        with pytest.raises(StoreLockedError):
            StateStore.open(tmp_path, FLOW, worker_count=2)


# -- whole-state snapshots -----------------------------------------------------


@pytest.mark.parametrize(
    "epoch2, whole",
    [
        ({"touch": ["a", "b", "c"]}, True),
        ({"touch": ["a", "b"]}, False),
        ({"touch": ["a", "b"], "discard": ["c"]}, True),
        ({"discard": ["a", "b", "c"]}, True),
        ({"touch": ["a", "b", "c"], "peek": ["c"]}, True),
        ({}, True),
    ],
    ids=["all touched", "one untouched", "untouched one discarded", "all discarded", "peek too", "nothing"],
)
def test_last_snapshot_whole_tells_whether_every_key_with_state_was_written(store, epoch2, whole):
    for k in "abc":
        store.set(STEP, k, box(k))
    store.snapshot(1)
    assert store.last_snapshot_whole, "a first snapshot of every key is whole"
    if epoch2:
        for k in epoch2.get("touch", []):
            store.get(STEP, k).value += "!"
        for k in epoch2.get("peek", []):
            store.peek(STEP, k)
        for k in epoch2.get("discard", []):
            store.discard(STEP, k)
    else:
        for k in "abc":
            store.get(STEP, k)
    store.snapshot(2)
    assert store.last_snapshot_whole is whole


def test_a_step_with_untouched_keys_makes_the_snapshot_partial_whatever_other_steps_did(store):
    store.register("other", Box)
    store.set(STEP, "a", box(1))
    store.set("other", "x", box(2))
    store.snapshot(1)
    store.get(STEP, "a")
    store.snapshot(2)
    assert not store.last_snapshot_whole


def test_stored_keys_not_read_in_full_keep_snapshots_partial_until_hydrate_all(tmp_path):
    with open_store(tmp_path) as s:
        s.register("gone", Box)
        for k in "abc":
            s.set(STEP, k, box(k))
        s.set("gone", "g", box(0))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        for k in "abc":
            s.get(STEP, k)
        s.snapshot(2)
        assert not s.last_snapshot_whole, "step 'gone' has stored rows and no builder this run"
    with open_store(tmp_path) as s:
        s.register("gone", Box)
        for k in "abc":
            s.get(STEP, k)
        s.get("gone", "g")
        s.snapshot(3)
        assert not s.last_snapshot_whole, "stored keys were never listed: some may be unread"
        s.hydrate_all(STEP)
        s.hydrate_all("gone")
        for k in "abc":
            s.get(STEP, k)
        s.get("gone", "g")
        s.snapshot(4)
        assert s.last_snapshot_whole


@pytest.mark.parametrize("touched, topped_up", [(10, True), (6, True), (5, True), (4, False), (0, False)])
def test_whole_from_snapshots_the_untouched_keys_once_enough_are_touched(store, touched, topped_up):
    for i in range(10):
        store.set(STEP, f"k{i}", box(i))
    store.snapshot(1)
    store.whole_from = 0.5
    for i in range(touched):
        store.get(STEP, f"k{i}").value += 100
    written = store.snapshot(2)
    assert written == (10 if topped_up else touched)
    assert store.last_snapshot_whole is topped_up
    store.close()
    with open_store(store.path.parents[2]) as s:
        assert values(s) == {f"k{i}": i + 100 * (i < touched) for i in range(10)}


# -- the packer's chunks ---------------------------------------------------------------
# Keys are packed 16 at a time with the next chunks looked up ahead
# (pybindings/snapshot.c): every count around a chunk's edge, in both walks
# (the touched keys, and the live dict for a whole batch), with deletions
# among them.


@pytest.mark.parametrize("n", [1, 15, 16, 17, 32, 33, 47, 48, 49, 100])
@pytest.mark.parametrize("whole", [False, True], ids=["touched", "whole"])
def test_every_key_is_packed_whatever_the_count_against_a_chunk(tmp_path, n, whole):
    with open_store(tmp_path) as s:
        for i in range(n + 5):
            s.set(STEP, f"k{i:03d}", box(i))
        s.snapshot(1)
        s.whole_from = 0.0 if whole else None
        # every third key of the first n changes, every seventh goes
        for i in range(n):
            if i % 7 == 3:
                s.discard(STEP, f"k{i:03d}")
            elif i % 3 == 0:
                s.get(STEP, f"k{i:03d}").value = -i
        expected_rows = len([i for i in range(n) if i % 7 == 3 or i % 3 == 0])
        written = s.snapshot(2)
        assert s.last_snapshot_whole is whole
        assert written == (n + 5 if whole else expected_rows)
    with open_store(tmp_path) as s:
        assert values(s) == {
            f"k{i:03d}": (-i if i < n and i % 3 == 0 else i)
            for i in range(n + 5)
            if not (i < n and i % 7 == 3)
        }


class _Raises:
    """Its snapshot fails for the one key told so."""

    def __init__(self, value: Any, fail: bool = False) -> None:
        self.value = value
        self.fail = fail

    def snapshot(self) -> Any:
        if self.fail:
            raise RuntimeError("snapshot failed")
        return self.value


@pytest.mark.parametrize("at", [0, 15, 16, 20, 39])
def test_a_failed_snapshot_in_the_middle_of_a_chunk_releases_every_object_it_held(tmp_path, at):
    with open_store(tmp_path) as s:
        objs = [_Raises(i, fail=i == at) for i in range(40)]
        for i, o in enumerate(objs):
            s.set(STEP, f"k{i:02d}", o)
        keys = list(s._dirty[STEP])
        before = [sys.getrefcount(o) for o in objs] + [sys.getrefcount(k) for k in keys]
        with pytest.raises(SnapshotError, match=f"key 'k{at:02d}'"):
            s.snapshot(1)
        after = [sys.getrefcount(o) for o in objs] + [sys.getrefcount(k) for k in keys]
        assert after == before, "a key or object the packer looked up ahead was not released"
        objs[at].fail = False
        assert s.snapshot(1) == 40
    with open_store(tmp_path) as s:
        assert values(s) == {f"k{i:02d}": i for i in range(40)}


class _Meddler:
    """Its snapshot touches the store that is snapshotting it."""

    store: Optional[StateStore] = None

    def __init__(self, value: Any) -> None:
        self.value = value

    def snapshot(self) -> Any:
        assert _Meddler.store is not None
        _Meddler.store.set(STEP, f"new-{self.value}", box(0))
        return self.value


def test_a_snapshot_method_that_touches_the_store_fails_the_snapshot_and_writes_nothing(tmp_path):
    with open_store(tmp_path) as s:
        for i in range(40):
            s.set(STEP, f"k{i:02d}", box(i))
        s.snapshot(1)
        s.get(STEP, "k20")
        s.set(STEP, "k21", _Meddler(21))
        _Meddler.store = s
        try:
            with pytest.raises(SnapshotError, match="changed during snapshot"):
                s.snapshot(2)
        finally:
            _Meddler.store = None
        assert s.stats()["last_epoch"] == 1


def test_a_state_holding_a_large_container_packs_whole(tmp_path):
    big = {f"f{i}": list(range(i % 50)) for i in range(20_000)}
    with open_store(tmp_path) as s:
        for i in range(20):
            s.set(STEP, f"k{i:02d}", box(big if i == 7 else i))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        assert s.get(STEP, "k07").value == big
        assert values(s)["k19"] == 19


# -- small states pickled in C ---------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SMALL_EDGES = [0, 1, 255, 256, 65535, 65536, -1, -255, -256, -65536, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1,
               2**63, None, True, False, "x", 1.5, (1, 2)]


def _roundtrip(tmp_path: Path, values: list) -> list:
    """Snapshot ``values`` as the states of keys 0..n-1, reopen, read them back."""
    with open_store(tmp_path) as s:
        for i, v in enumerate(values):
            s.set(STEP, str(i), box(v))
        s.snapshot(1)
    with open_store(tmp_path) as s:
        return [s.get(STEP, str(i)).value for i in range(len(values))]


def test_ints_none_and_bools_pickled_in_c_load_back_exactly(tmp_path):
    got = _roundtrip(tmp_path, SMALL_EDGES)
    assert got == SMALL_EDGES
    assert [type(v) for v in got] == [type(v) for v in SMALL_EDGES], "True stays a bool, not 1"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.integers(), st.none(), st.booleans()), min_size=1, max_size=40))
def test_any_int_state_survives_a_snapshot(tmp_path_factory, values):
    got = _roundtrip(tmp_path_factory.mktemp("ints"), values)
    assert got == values and [type(v) for v in got] == [type(v) for v in values]


def test_state_pickles_of_aware_datetimes_are_the_bytes_plain_python_makes():
    """millpond registers a faster reducer for datetime.timezone (state.py);
    it must not change a single byte of any pickle, at any protocol."""
    import copyreg
    import subprocess
    import sys
    from datetime import timezone

    import millpond.state  # noqa: F401  (registers the reducer)

    assert timezone in copyreg.dispatch_table
    code = (
        "import pickle, sys\n"
        "from datetime import datetime, timedelta, timezone\n"
        "objs = [timezone.utc, timezone(timedelta(hours=2)), timezone(timedelta(hours=-3, minutes=-30), 'X'),\n"
        "        datetime(2024, 3, 1, 0, 8, 56, 140000, tzinfo=timezone.utc),\n"
        "        (1, datetime(2024, 3, 1, tzinfo=timezone(timedelta(hours=5), 'Y')), [timezone.utc] * 3)]\n"
        "if sys.argv[1] == 'millpond':\n"
        "    import millpond.state\n"
        "sys.stdout.write(repr([pickle.dumps(o, p) for p in range(6) for o in objs]))\n"
    )
    plain, with_millpond = (
        subprocess.run([sys.executable, "-c", code, which], capture_output=True, text=True, check=True).stdout
        for which in ("plain", "millpond")
    )
    assert plain == with_millpond
