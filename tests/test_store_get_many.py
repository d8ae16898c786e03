"""_core.store_hydrate_keys: the stored state of many keys read in one call
to the core and built into live objects in C, exactly as many single gets
followed by the builder would."""

from __future__ import annotations

import gc
import pickle
import tracemalloc
from pathlib import Path
from typing import Any, Iterator

import pytest

from millpond import _core
from millpond.errors import StateStoreError
from millpond.state import StateStore

STEP = "wc.count"


class Obj:
    """A live object; its snapshot is its value."""

    def __init__(self, v: Any) -> None:
        self.v = v

    def snapshot(self) -> Any:
        return self.v


class Built:
    """What the builder makes of a stored state."""

    def __init__(self, state: Any) -> None:
        self.state = state


def write(h: int, epoch: int, step: str, values: dict[str, Any]) -> None:
    """Snapshots keys of step at epoch: a value of None deletes the key."""
    dirty = {step: {k: None for k in values}}
    live = {step: {k: Obj(v) for k, v in values.items() if v is not None}}
    _core.store_snapshot(h, epoch, dirty, live, pickle.dumps, 5, False)


@pytest.fixture
def handle(tmp_path: Path) -> Iterator[int]:
    with StateStore.open(tmp_path, "flow") as store:
        h = store._require_handle()
        write(h, 1, STEP, {"a": 1, "b": [2], "deleted": "soon", "old": "first", "ключ": "key", "🦀": {"crab": 1}})
        write(h, 2, STEP, {"deleted": None, "old": "second"})
        write(h, 2, "other.step", {"elsewhere": 9})
        yield h


def hydrate(h: int, keys: list[str], live: dict[str, Any] | None = None, skip: set[str] | None = None,
            step: str = STEP) -> tuple[int, dict[str, Any]]:
    live = {} if live is None else live
    built = _core.store_hydrate_keys(h, step, keys, live, set() if skip is None else skip, Built, pickle.loads)
    return built, live


def states(live: dict[str, Any]) -> dict[str, Any]:
    return {k: v.state if isinstance(v, Built) else v for k, v in live.items()}


def test_found_keys_are_built_from_their_newest_state(handle):
    built, live = hydrate(handle, ["old", "b", "a"])
    assert built == 3
    assert states(live) == {"a": 1, "b": [2], "old": "second"}
    assert all(isinstance(v, Built) for v in live.values())


def test_missing_and_deleted_keys_are_left_out(handle):
    built, live = hydrate(handle, ["nope", "deleted", "a", "", "elsewhere"])
    assert built == 1
    assert states(live) == {"a": 1}


def test_keys_of_another_step_are_not_found(handle):
    built, live = hydrate(handle, ["elsewhere", "a"], step="other.step")
    assert built == 1 and states(live) == {"elsewhere": 9}


def test_live_keys_and_skipped_keys_are_not_built(handle):
    mine = object()
    live: dict[str, Any] = {"a": mine}
    built, live = hydrate(handle, ["a", "b", "old"], live=live, skip={"b"})
    assert built == 1
    assert live["a"] is mine and "b" not in live and states(live)["old"] == "second"


def test_non_ascii_keys_round_trip(handle):
    built, live = hydrate(handle, ["🦀", "ключ", "ключ2", "🦀🦀"])
    assert built == 2
    assert states(live) == {"🦀": {"crab": 1}, "ключ": "key"}


def test_a_key_with_a_lone_surrogate_is_not_found(handle):
    # Snapshots refuse such keys, so none can be stored.
    built, live = hydrate(handle, ["\udcff", "a"])
    assert built == 1 and states(live) == {"a": 1}


def test_an_empty_key_list_builds_nothing(handle):
    assert hydrate(handle, []) == (0, {})
    assert hydrate(handle, ["a"], live={"a": 1}) == (0, {"a": 1}), "nothing left to look up"


def test_duplicate_keys_are_built_once(handle):
    calls: list[Any] = []

    def builder(state: Any) -> Any:
        calls.append(state)
        return state

    live: dict[str, Any] = {}
    assert _core.store_hydrate_keys(handle, STEP, ["a", "a", "a"], live, set(), builder, pickle.loads) == 1
    assert calls == [1] and live == {"a": 1}


def test_objects_are_stored_under_the_key_objects_asked_with(handle):
    """Keys asked in any order, twice, or with keys that are not stored:
    each object built is stored under the very str object asked with (its
    hash already computed), not a copy decoded from the core's answer."""
    asked = ["".join(["ol", "d"]), "".join(["🦀"]), "zz-none", "".join(["a"]), "ключ", "a"]
    live: dict[str, Any] = {}
    assert _core.store_hydrate_keys(handle, STEP, asked, live, set(), Built, pickle.loads) == 4
    assert states(live) == {"a": 1, "old": "second", "ключ": "key", "🦀": {"crab": 1}}
    for key in live:
        assert any(key is a for a in asked), key


def test_absent_collects_every_key_asked_that_is_not_live_after(handle):
    live: dict[str, Any] = {"b": "live already"}
    absent: set[str] = set()
    keys = ["a", "b", "deleted", "never", "skipped", "lone\udcff", "never"]
    built = _core.store_hydrate_keys(handle, STEP, keys, live, {"skipped"}, Built, pickle.loads, absent)
    assert built == 1 and set(live) == {"a", "b"}
    assert absent == {"deleted", "never", "skipped", "lone\udcff"}
    # nothing to look up at all: still collected
    again: set[str] = set()
    assert _core.store_hydrate_keys(handle, STEP, ["a", "x"], {"a": 1, "x": 2}, set(), Built, pickle.loads, again) == 0
    assert again == set()
    assert _core.store_hydrate_keys(handle, STEP, ["q"], {}, {"q"}, Built, pickle.loads, again) == 0
    assert again == {"q"}


def test_many_keys_at_once(tmp_path):
    with StateStore.open(tmp_path, "flow") as store:
        h = store._require_handle()
        write(h, 1, STEP, {f"k{i:05d}": i for i in range(5000)})
        keys = [f"k{i:05d}" for i in range(0, 6000, 3)]
        built, live = hydrate(h, keys)
        assert built == len(range(0, 5000, 3))
        assert states(live) == {f"k{i:05d}": i for i in range(0, 5000, 3)}


def test_wrong_argument_types_are_type_errors(handle):
    with pytest.raises(TypeError, match="keys must be str"):
        hydrate(handle, ["a", 1])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _core.store_hydrate_keys(handle, STEP, ("a",), {}, set(), Built, pickle.loads)  # type: ignore[arg-type]


def test_a_closed_handle_is_an_error():
    with pytest.raises(StateStoreError, match="closed"):
        _core.store_hydrate_keys(123456789, STEP, ["a"], {}, set(), Built, pickle.loads)


class Boom(Exception):
    pass


def test_a_builder_that_raises_propagates_and_keeps_what_was_built_before(handle):
    def builder(state: Any) -> Any:
        if state == [2]:
            raise Boom("no")
        return Built(state)

    live: dict[str, Any] = {}
    with pytest.raises(Boom, match="no"):
        _core.store_hydrate_keys(handle, STEP, ["old", "b", "a"], live, set(), builder, pickle.loads)
    # Keys are built in key order: "a" came before the failure, "old" after.
    assert states(live) == {"a": 1}


def test_a_failing_builder_or_loads_leaks_nothing(tmp_path):
    with StateStore.open(tmp_path, "flow") as store:
        h = store._require_handle()
        big = b"x" * 20_000
        write(h, 1, STEP, {f"k{i}": big for i in range(20)})
        keys = [f"k{i}" for i in range(20)]

        def builder(state: Any) -> Any:
            raise Boom(len(state))

        def loads(data: bytes) -> Any:
            raise Boom(len(data))

        def round() -> None:
            for b, l in ((builder, pickle.loads), (Built, loads)):
                with pytest.raises(Boom):
                    _core.store_hydrate_keys(h, STEP, keys, {}, set(), b, l)
            live: dict[str, Any] = {}
            assert _core.store_hydrate_keys(h, STEP, keys, live, set(), Built, pickle.loads) == 20

        for _ in range(20):
            round()
        gc.collect()
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            for _ in range(300):
                round()
            gc.collect()
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # A leaked value, state or key per call would be 300 * 20 kB or more.
        assert after - before < 1_000_000
