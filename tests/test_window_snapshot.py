"""A windowing key's snapshot built in C (pybindings/window.c) is the tuple
its ``.snapshot()`` returns: the state store's packer takes the C one when
every part of the key's state is windowing's own class, and the method
otherwise."""

from __future__ import annotations

import functools
import pickle
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond import _core
from millpond.operators import windowing as win
from millpond.operators.windowing.ops import _CollectWindowLogic, _FoldWindowLogic, _WindowStep
from millpond.state import StateStore

from helpers import values

# A snapshot resumed from its pickle holds a +02:00 time zone object of its
# own: equal, not the same object.
same = functools.partial(values.same, same_tzinfo=False)

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
PLUS2 = timezone(timedelta(hours=2))


def fold_builder(resume: Optional[int]) -> _FoldWindowLogic[Any, int]:
    return _FoldWindowLogic(lambda acc, v: acc + v[1], lambda a, b: a + b, 0 if resume is None else resume)


def collect_builder(resume: Optional[Tuple[Any, ...]]) -> _CollectWindowLogic:
    return _CollectWindowLogic(list, [] if resume is None else list(resume))


class Custom(win.WindowLogic):
    """A user's window logic: only its own .snapshot() knows its state."""

    def __init__(self, resume: Optional[int]) -> None:
        self.n = resume or 0

    def on_value(self, value: Any) -> List[Any]:
        self.n += 1
        return []

    def on_merge(self, original: win.WindowLogic) -> List[Any]:
        self.n += original.n  # type: ignore[attr-defined]
        return []

    def on_close(self) -> List[Any]:
        return [self.n]

    def snapshot(self) -> int:
        return self.n


BUILDERS: dict[str, Callable[[Any], Any]] = {"fold": fold_builder, "collect": collect_builder, "custom": Custom}


def windower(kind: str) -> win.Windower:
    if kind == "tumbling":
        return win.TumblingWindower(timedelta(seconds=10), T0)
    if kind == "sliding":
        return win.SlidingWindower(timedelta(seconds=10), timedelta(seconds=4), T0)
    return win.SessionWindower(timedelta(seconds=3))


def clock(kind: str, wait: float, tz: timezone) -> win.Clock:
    if kind == "system":
        return win.SystemClock()
    return win.EventClock(
        lambda v: v[0].astimezone(tz), timedelta(seconds=wait), now_getter=lambda: T0, to_system_utc=lambda t: None
    )


@settings(max_examples=150, deadline=None)
@given(
    clock_kind=st.sampled_from(["event", "system"]),
    windower_kind=st.sampled_from(["tumbling", "sliding", "session"]),
    logic=st.sampled_from(["fold", "collect"]),
    ordered=st.booleans(),
    wait=st.sampled_from([0, 2, 7]),
    tz=st.sampled_from([timezone.utc, PLUS2]),
    batches=st.lists(st.lists(st.integers(0, 60), max_size=8), max_size=6),
)
def test_the_c_snapshot_is_the_methods_tuple(
    clock_kind: str, windower_kind: str, logic: str, ordered: bool, wait: int, tz: timezone,
    batches: List[List[int]],
) -> None:
    step = _WindowStep(clock(clock_kind, wait, tz), windower(windower_kind), BUILDERS[logic], ordered, None)
    checks = [step.snapshot()]
    assert same(_core.window_snapshot(step), checks[0])
    for batch in batches:
        step.on_batch([(T0 + timedelta(seconds=t), t) for t in batch])
        want = step.snapshot()
        assert same(_core.window_snapshot(step), want), (_core.window_snapshot(step), want)
        # and it resumes to the same state
        again = _WindowStep(clock(clock_kind, wait, tz), windower(windower_kind), BUILDERS[logic], ordered,
                            pickle.loads(pickle.dumps(want)))
        assert same(_core.window_snapshot(again), want)
    step.on_eof()
    assert same(_core.window_snapshot(step), step.snapshot())


def test_merged_sessions_snapshot_their_merged_ids_sorted() -> None:
    step = _WindowStep(clock("event", 100, timezone.utc), windower("session"), fold_builder, False, None)
    # three sessions (gap 3), then items that join them into the first
    step.on_batch([(T0 + timedelta(seconds=t), 1) for t in (8, 4, 0, 6, 2)])
    (wid, _, _, merged, acc), = step.snapshot()[3]
    assert merged == (0, 1) and acc == 5
    assert same(_core.window_snapshot(step), step.snapshot())


def test_a_users_window_logic_is_left_to_the_method() -> None:
    step = _WindowStep(clock("event", 5, timezone.utc), windower("tumbling"), Custom, True, None)
    assert same(_core.window_snapshot(step), step.snapshot())  # no windows yet: nothing of the user's
    step.on_batch([(T0 + timedelta(seconds=t), t) for t in (1, 2, 12)])
    assert _core.window_snapshot(step) is NotImplemented
    assert step.snapshot()[3]


@pytest.mark.parametrize("obj", [object(), 5, (1, 2), _FoldWindowLogic(None, None, 1)])  # type: ignore[arg-type]
def test_anything_else_is_left_to_its_method(obj: Any) -> None:
    assert _core.window_snapshot(obj) is NotImplemented


class _Other(_WindowStep):
    """A subclass may snapshot differently: its own method decides."""

    def snapshot(self) -> Any:
        return "mine"


def test_a_subclass_is_left_to_its_method() -> None:
    step = _Other(clock("event", 5, timezone.utc), windower("tumbling"), fold_builder, True, None)
    assert _core.window_snapshot(step) is NotImplemented


def test_the_store_packs_windowing_keys_without_calling_their_method(tmp_path: Path, monkeypatch: Any) -> None:
    """The packer builds a windowing key's snapshot in C (the method is
    never called) and the row it writes reads back as the method's tuple;
    a key with a user's window logic still goes through the method."""
    store = StateStore.open(tmp_path, "flow")
    # unordered, with a long wait: every window stays open
    store.register("own", lambda resume: _WindowStep(
        clock("event", 100, timezone.utc), windower("session"), fold_builder, False, resume))
    store.register("user", lambda resume: _WindowStep(
        clock("event", 100, timezone.utc), windower("tumbling"), Custom, False, resume))
    items = [(T0 + timedelta(seconds=t), t) for t in (1, 2, 12, 30, 4)]
    for step_id in ("own", "user"):
        for key in ("a", "b"):
            store.get_or_build(step_id, key).on_batch(items)
    want = {(s, k): store.peek(s, k).snapshot() for s in ("own", "user") for k in ("a", "b")}
    calls: list[str] = []
    method = _WindowStep.snapshot

    def counted(self: _WindowStep) -> Any:
        calls.append(type(self.windows[next(iter(self.windows))]).__name__ if self.windows else "-")
        return method(self)

    monkeypatch.setattr(_WindowStep, "snapshot", counted)
    assert store.snapshot(1) == 4
    assert calls == ["Custom", "Custom"]
    monkeypatch.setattr(_WindowStep, "snapshot", method)
    store.close()
    again = StateStore.open(tmp_path, "flow", resume_epoch=2)
    for step_id in ("own", "user"):
        again.register(step_id, lambda resume: resume)
    for (step_id, key), snap in want.items():
        got = again.get(step_id, key)
        assert same(got, snap), (step_id, key, got, snap)
    again.close()
