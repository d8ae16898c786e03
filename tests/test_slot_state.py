"""stateful_map's key states are packed from their slot in C (pybindings/
slotstate.c), without calling ``_StatefulMapLogic.snapshot``: the rows
must read back as what the method returns, and anything that is not
exactly that class, or an unset slot, must still go through the method."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond import _core
from millpond.errors import SnapshotError
from millpond.operators import _StatefulMapLogic
from millpond.state import StateStore

from tests.helpers.values import same

STATES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


class _Sub(_StatefulMapLogic[Any, Any, Any]):
    __slots__ = ()

    def snapshot(self) -> Any:
        return ("sub", self.state)


def _mapper(state: Any, value: Any) -> Any:
    return value, value


def _write_and_read(tmp_path: Path, objs: dict[str, Any], monkeypatch: Any) -> tuple[List[str], dict[str, Any]]:
    """Snapshot objs (key -> logic object) through a real store, counting the
    calls of _StatefulMapLogic.snapshot; return the keys it was called for
    and what each key's row reads back as."""
    store = StateStore.open(tmp_path, "flow")
    store.register("sm", lambda resume: _StatefulMapLogic(_mapper, resume, False))
    for key, obj in objs.items():
        store.set("sm", key, obj)
    calls: List[str] = []
    method = _StatefulMapLogic.snapshot

    def counted(self: Any) -> Any:
        calls.append(next(k for k, o in objs.items() if o is self))
        return method(self)

    monkeypatch.setattr(_StatefulMapLogic, "snapshot", counted)
    try:
        store.snapshot(1)
    finally:
        monkeypatch.setattr(_StatefulMapLogic, "snapshot", method)
        store.close()
    again = StateStore.open(tmp_path, "flow", resume_epoch=2)
    again.register("sm", lambda resume: resume)
    got = {key: again.get("sm", key) for key in objs}
    again.close()
    return calls, got


@settings(max_examples=60, deadline=None)
@given(states=st.lists(STATES.filter(lambda s: s is not None), min_size=1, max_size=8))
def test_stateful_map_states_pack_without_the_method_and_read_back_as_it(
    tmp_path_factory: Any, states: List[Any]
) -> None:
    tmp = tmp_path_factory.mktemp("slot")
    objs = {f"k{i}": _StatefulMapLogic(_mapper, s, False) for i, s in enumerate(states)}
    want = {k: o.snapshot() for k, o in objs.items()}
    with pytest.MonkeyPatch.context() as mp:
        calls, got = _write_and_read(tmp, objs, mp)
    assert calls == []
    for key in objs:
        assert same(got[key], want[key]), (key, got[key], want[key])


def test_a_subclass_and_an_unset_slot_go_through_the_method(tmp_path: Path, monkeypatch: Any) -> None:
    sub = _Sub(_mapper, [1, 2], False)
    calls, got = _write_and_read(tmp_path / "sub", {"s": sub, "p": _StatefulMapLogic(_mapper, 7, False)}, monkeypatch)
    assert calls == []  # _Sub overrides snapshot: the base method is not what runs
    assert got == {"s": ("sub", [1, 2]), "p": 7}
    unset = _StatefulMapLogic(_mapper, 1, False)
    del unset.state
    with pytest.raises(SnapshotError, match="'u'") as ei:
        _write_and_read(tmp_path / "unset", {"u": unset}, monkeypatch)
    assert isinstance(ei.value.__cause__, AttributeError)


def test_only_a_slot_can_be_registered() -> None:
    with pytest.raises(TypeError, match="is not a slot"):
        _core.slot_state_register(_StatefulMapLogic, "nothing")
    with pytest.raises(TypeError, match="is not a slot"):
        _core.slot_state_register(int, "real")
