"""The C pickle writer of snapshots (pybindings/pickle.c).

Snapshots pickle plain states (built-in values, dates, naive and UTC
datetimes, timedeltas) in C instead of through ``pickle.dumps``. What it
writes must be a pickle that ``pickle.loads`` reads back to an equal value
of the same types, everywhere in the value; anything it does not handle
exactly as pickle would (other classes, shared or cyclic containers, a
``copyreg`` reducer of the user's) must go to ``pickle.dumps``.
"""

from __future__ import annotations

import copyreg
import math
import pickle
import pickletools
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond import _core
from millpond.state import PICKLE_PROTOCOL, StateStore

from helpers.values import same

STEP = "s.state"


def fast(value: Any, protocol: int = PICKLE_PROTOCOL) -> Any:
    return _core.fast_pickle(value, protocol)


# -- values it writes ---------------------------------------------------------------

UTC_TIMES = st.datetimes(timezones=st.just(timezone.utc), allow_imaginary=True)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.binary(),
    st.datetimes(),
    UTC_TIMES,
    st.dates(),
    st.timedeltas(),
)
HASHABLE = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.dates())
PLAIN = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(HASHABLE, inner, max_size=4),
        st.sets(HASHABLE, max_size=4),
        st.frozensets(HASHABLE, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(PLAIN)
def test_plain_values_are_pickles_that_load_back_the_same(value):
    data = fast(value)
    assert data is not None, "every part of a plain value is handled in C"
    assert same(pickle.loads(data), value)


@pytest.mark.parametrize(
    "value",
    [
        0, 255, 256, 65535, 65536, -1, -256, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**40, -(2**47), 2**63 - 1,
        -(2**63), 0.0, -0.0, math.inf, math.nan, "", "x" * 255, "x" * 256, "é" * 200, b"", b"y" * 300,
        (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], {}, set(), frozenset(), {"a": [1, {2: (3,)}]},
        datetime(2024, 3, 1, 0, 8, 56, 140000, tzinfo=timezone.utc), datetime(1, 1, 1), datetime.max,
        datetime(2021, 11, 7, 1, 30, fold=1), datetime(2021, 11, 7, 1, 30, fold=1, tzinfo=timezone.utc),
        date(1, 1, 1), date.max, timedelta(days=-3, seconds=5, microseconds=7), timedelta.max, timedelta.min,
        ("k000001", datetime(2024, 3, 1, tzinfo=timezone.utc), 3),
    ],
    ids=repr,
)
def test_edges_load_back_the_same(value):
    data = fast(value)
    assert data is not None
    assert same(pickle.loads(data), value)


def test_a_utc_datetime_loads_as_the_utc_singleton():
    back = pickle.loads(fast(datetime(2024, 3, 1, tzinfo=timezone.utc)))
    assert back.tzinfo is timezone.utc


# -- values it leaves to pickle.dumps ----------------------------------------------------


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


class MyInt(int):
    pass


def _cycle() -> list:
    c: list = []
    c.append(c)
    return c


def _deep(n: int) -> tuple:
    v: tuple = (0,)
    for _ in range(n):
        v = (v,)
    return v


_SHARED = [1, 2]
_SHARED_D: dict = {}


@pytest.mark.parametrize(
    "value",
    [
        2**63, -(2**63) - 1, "\ud800", bytearray(b"x"), Point(1), MyInt(3), 1 + 2j, [Point(1)], ("a", {"b": {1.5j}}),
        datetime(2024, 1, 1, tzinfo=timezone(timedelta(hours=1))), [_SHARED, _SHARED], {"a": _SHARED_D, "b": _SHARED_D},
        _cycle(), _deep(64),
        [[i] for i in range(65)],
    ],
    ids=lambda v: type(v).__name__,
)
def test_anything_else_goes_to_pickle_dumps(value):
    assert fast(value) is None


def test_nesting_up_to_64_containers_deep_is_handled():
    assert same(pickle.loads(fast(_deep(63))), _deep(63))


def test_immutable_parts_may_repeat():
    t = (1, "two")
    data = fast([t, t, t])
    assert data is not None and pickle.loads(data) == [t, t, t]


def test_older_protocols_get_only_numbers_and_none():
    assert same(pickle.loads(fast(2**40, 2)), 2**40)
    assert same(pickle.loads(fast(1.25, 3)), 1.25)
    for v in ("s", b"b", (1,), [1], {1: 2}, datetime(2024, 1, 1)):
        assert fast(v, 3) is None
    assert fast(1, 1) is None


@pytest.mark.parametrize("cls", [datetime, date, timedelta])
def test_a_copyreg_reducer_of_the_users_is_honoured(cls):
    value = {datetime: datetime(2024, 1, 1), date: date(2024, 1, 1), timedelta: timedelta(1)}[cls]
    assert fast(value) is not None
    copyreg.pickle(cls, lambda o: (str, ("reduced",)))
    try:
        assert fast(value) is None
        assert fast([1, value]) is None
    finally:
        del copyreg.dispatch_table[cls]
    assert fast(value) is not None


# -- through a snapshot ------------------------------------------------------------


class Holder:
    """A state object whose snapshot is the value it holds."""

    def __init__(self, resume_state: Any) -> None:
        self.value = resume_state

    def snapshot(self) -> Any:
        return self.value


def _through_store(tmp_path: Path, values: list) -> list:
    store = StateStore.open(tmp_path, "flow")
    store.register(STEP, Holder)
    for i, v in enumerate(values):
        store.set(STEP, str(i), Holder(v))
    store.snapshot(1)
    store.close()
    store = StateStore.open(tmp_path, "flow")
    store.register(STEP, Holder)
    try:
        return [store.get(STEP, str(i)).value for i in range(len(values))]
    finally:
        store.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(PLAIN, min_size=1, max_size=10))
def test_snapshots_of_plain_states_resume_the_same(tmp_path_factory, values):
    got = _through_store(tmp_path_factory.mktemp("plain"), values)
    assert all(same(g, v) for g, v in zip(got, values))


def test_snapshots_keep_what_only_pickle_keeps(tmp_path):
    shared = [1]
    cyc = _cycle()
    values = [[shared, shared], cyc, Point(4), ("x", datetime(2024, 1, 1, tzinfo=timezone(timedelta(hours=2))))]
    got = _through_store(tmp_path, values)
    assert got[0] == [[1], [1]] and got[0][0] is got[0][1], "sharing survives"
    assert got[1][0] is got[1], "the cycle survives"
    assert isinstance(got[2], Point) and got[2].x == 4
    assert got[3] == values[3]


def test_a_step_of_states_that_are_not_plain_still_snapshots_every_key(tmp_path):
    """After a run of keys the C writer gave up on, the step's other keys go
    to pickle.dumps: plain or not, each state resumes as it was."""
    values = [Point(i) for i in range(30)] + [(i, datetime(2024, 1, 1, tzinfo=timezone.utc)) for i in range(30)]
    values += [[Point(1), i] for i in range(5)] + [i for i in range(5)]
    got = _through_store(tmp_path, values)
    for g, v in zip(got, values):
        if isinstance(v, Point):
            assert isinstance(g, Point) and g.x == v.x
        elif isinstance(v, list):
            assert isinstance(g[0], Point) and g[1] == v[1]
        else:
            assert same(g, v)


def test_each_datetime_class_is_named_once_per_pickle():
    """loads looks up a global each time a pickle names it (about 1 us): a
    state of many datetimes names each class once and refers back to it."""
    value = [(datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=i), date(2024, 1, i + 1),
              timedelta(seconds=i), datetime(2024, 1, 1)) for i in range(10)]
    data = fast(value)
    ops = [op.name for op, _, _ in pickletools.genops(data)]
    assert ops.count("STACK_GLOBAL") == 4, "datetime, timezone.utc, date and timedelta, once each"
    assert same(pickle.loads(data), value)


# -- windowing's snapshot times (also C) ---------------------------------------------

_UNIX = datetime(1970, 1, 1, tzinfo=timezone.utc)


class MyDatetime(datetime):
    pass


@settings(max_examples=300, deadline=None)
@given(UTC_TIMES)
def test_snapshot_time_of_a_utc_datetime_is_its_microseconds_since_1970(t):
    assert _core.snapshot_time(t) == (t - _UNIX) // timedelta(microseconds=1)


@pytest.mark.parametrize(
    "value",
    [None, datetime(2024, 1, 1), datetime(2024, 1, 1, tzinfo=timezone(timedelta(0), "Z")), 5, "x"],
    ids=repr,
)
def test_snapshot_time_leaves_anything_else_as_it_is(value):
    assert _core.snapshot_time(value) is value


def test_snapshot_time_of_a_datetime_subclass_uses_its_own_arithmetic():
    t = MyDatetime(2024, 3, 1, 12, tzinfo=timezone.utc)
    assert _core.snapshot_time(t) == (t - _UNIX) // timedelta(microseconds=1)
    naive = MyDatetime(2024, 3, 1)
    assert _core.snapshot_time(naive) is naive
