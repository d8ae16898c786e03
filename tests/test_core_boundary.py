"""The C boundary of millpond._core: one method table, every function
documented and typed in _core.pyi, error kinds defined once by the core,
snapshots written through one call, and "not found" decided by class."""

from __future__ import annotations

import ast
import inspect
import pickle
from pathlib import Path
from typing import Any, Dict, List

import pytest

import millpond
from millpond import _core, _corebridge
from millpond.backup import core_handle_for
from millpond.errors import SnapshotError, StateStoreError
from millpond.state import StateStore

STUB = Path(millpond.__file__).with_name("_core.pyi")


def _stub_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(STUB.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _core_functions() -> dict[str, Any]:
    return {name: f for name, f in vars(_core).items() if callable(f) and not isinstance(f, type)}


def test_the_stub_names_exactly_the_functions_of_the_extension():
    assert sorted(_stub_functions()) == sorted(_core_functions())


def test_every_function_of_the_extension_has_a_docstring_with_its_signature():
    for name, fn in _core_functions().items():
        doc = inspect.getdoc(fn) or ""
        assert doc.startswith(f"{name}("), f"{name}: {doc!r}"


def _documented_params(doc: str) -> List[str]:
    """The parameter names of a docstring's first line, ``name(a, b: T = 1)``."""
    params, depth, cur = [], 0, ""
    for ch in doc.split("(", 1)[1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            params.append(cur)
            cur = ""
        else:
            cur += ch
    params.append(cur)
    return [p.split("=")[0].split(":")[0].strip() for p in params if p.strip()]


def test_the_stubs_positional_parameters_match_the_docstrings():
    for name, node in _stub_functions().items():
        documented = _documented_params(inspect.getdoc(_core_functions()[name]) or "")
        stubbed = [a.arg for a in node.args.posonlyargs + node.args.args]
        assert stubbed == documented, name


def test_every_error_kind_of_the_core_has_an_exception_class():
    assert set(_core.ERROR_KINDS) == set(_corebridge.ERROR_TYPES)


def test_errors_of_the_core_arrive_as_millpond_exception_classes(tmp_path):
    with pytest.raises(StateStoreError, match="closed"):
        _core.store_meta(123456789)
    with pytest.raises(ValueError, match="unknown snapshot mode"):
        _core.run_open(str(tmp_path), "f", 1, 16, _core.backup_open(str(tmp_path / "b")), "sometimes",
                       4, 10, 0.0, 0.5, 1 << 20, b"")


def test_an_unknown_error_kind_cannot_be_registered():
    with pytest.raises(ValueError, match="unknown error kind"):
        _core.set_error_types({"no-such-kind": RuntimeError})


class _Obj:
    def __init__(self, v: Any) -> None:
        self.v = v

    def snapshot(self) -> Any:
        return self.v


def test_a_snapshot_is_one_call_that_packs_and_writes(tmp_path):
    with StateStore.open(tmp_path, "one") as store:
        h = store._require_handle()
        dirty = {"s": {"a": None, "b": None, "gone": None}}
        live = {"s": {"a": _Obj(1), "b": _Obj({"x": [1, 2]})}}
        rows, pack_s, write_s, reused, held, ahead, carried = _core.store_snapshot(
            h, 1, dirty, live, pickle.dumps, 5, False)
        # (a store of its own: no run carries its state)
        assert rows == 3 and pack_s >= 0 and write_s >= 0 and (reused, held, ahead, carried) == (0, 0, 0, -1)
        assert _core.store_carries(h) is False
        assert _core.store_get(h, "s", "gone") == (1, None)
        got = _core.store_get(h, "s", "b")
        assert got is not None and got[1] is not None and pickle.loads(got[1]) == {"x": [1, 2]}


@pytest.mark.parametrize("whole", [False, True])
def test_a_key_packed_ahead_is_written_from_its_mark(tmp_path, whole):
    """pack_ahead makes a key's pickle its mark among the touched keys;
    store_snapshot writes that pickle, not the object's state."""
    with StateStore.open(tmp_path, "one") as store:
        h = store._require_handle()
        a, b = _Obj(1), _Obj(2)
        marks: Dict[str, Any] = {"a": None, "b": None}
        acct = [0, 1 << 20, 0]
        assert _core.pack_ahead(marks, acct, pickle.dumps, 5, "a", a) is True
        assert isinstance(marks["a"], bytes) and marks["b"] is None
        assert acct[0] == len(marks["a"]) + 64 and acct[2] == 1
        a.v = 99  # changed without being touched: its snapshot is the packed one
        out = _core.store_snapshot(h, 1, {"s": marks}, {"s": {"a": a, "b": b}}, pickle.dumps, 5, whole, {}, False,
                                   1 << 20, 0, {"s": set()} if whole else None, True)
        assert out[0] == 2 and out[3] == 1 and out[5] == 1, out
        got = {k: pickle.loads(_core.store_get(h, "s", k)[1]) for k in "ab"}
        assert got == {"a": 1, "b": 2}


def test_pack_ahead_leaves_a_full_budget_and_a_failing_state_unmarked():
    marks: Dict[str, Any] = {"a": None}
    assert _core.pack_ahead(marks, [0, 10, 0], pickle.dumps, 5, "a", _Obj(1)) is False
    assert marks == {"a": None}

    class Bad:
        def snapshot(self) -> Any:
            return lambda: None  # not picklable

    acct = [0, 1 << 20, 0]
    assert _core.pack_ahead(marks, acct, pickle.dumps, 5, "a", Bad()) is False
    assert marks == {"a": None} and acct == [0, 1 << 20, 0]
    with pytest.raises(TypeError, match="pack_ahead"):
        _core.pack_ahead(marks, acct, pickle.dumps, 5, "a")  # type: ignore[call-arg]


def test_a_snapshot_that_cannot_pack_writes_nothing_and_names_the_key(tmp_path):
    class Bad:
        def snapshot(self) -> Any:
            return lambda: None  # not picklable

    with StateStore.open(tmp_path, "bad") as store:
        store.register("s", _Obj)
        store.set("s", "fine", _Obj(1))
        store.set("s", "broken", Bad())
        with pytest.raises(SnapshotError, match="step 's' key 'broken'"):
            store.snapshot(1)
        assert store.stats()["rows"] == 0


class _MissingIsKeyError:
    """A Python backup whose download says "missing" with KeyError and a
    message that does not look like one."""

    def list_keys(self, prefix: str = "") -> List[str]:
        return []

    def upload(self, from_local: Any, to_key: str) -> None:
        raise OSError("FileNotFoundError: this text is not the class")

    def download(self, from_key: str, to_local: Any) -> None:
        raise KeyError("nothing")

    def delete(self, key: str) -> None:
        pass


def test_not_found_from_a_python_backup_is_decided_by_the_exception_class(tmp_path):
    handle, owned = core_handle_for(_MissingIsKeyError())
    try:
        with pytest.raises(FileNotFoundError):
            _core.backup_download(handle, "k", str(tmp_path / "x"))
        # A message that merely starts like one is not "not found".
        with pytest.raises(Exception) as exc:
            _core.backup_upload(handle, str(tmp_path / "x"), "k")
        assert not isinstance(exc.value, FileNotFoundError)
    finally:
        if owned:
            _core.backup_close(handle)


def test_the_snapshot_modes_are_the_cores():
    from millpond.recovery import SnapshotMode

    assert tuple(m.value for m in SnapshotMode) == _core.SNAPSHOT_MODES
