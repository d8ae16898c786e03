"""The snapshot pickler (millpond.pickling): what it writes loads back equal."""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from millpond import pickling
from millpond.state import PICKLE_PROTOCOL, StateStore

UTC_MIN = datetime.min.replace(tzinfo=timezone.utc)
UTC_MAX = datetime.max.replace(tzinfo=timezone.utc)


class _MyDatetime(datetime):
    pass


def _same(a: datetime, b: datetime) -> bool:
    """Equal, of the same type, with an equal tzinfo (UTC itself for UTC)."""
    if type(a) is not type(b) or a != b or a.tzinfo != b.tzinfo:
        return False
    return (a.tzinfo is timezone.utc) == (b.tzinfo is timezone.utc)


@settings(max_examples=300, deadline=None)
@given(st.datetimes(timezones=st.just(timezone.utc)), st.integers(min_value=2, max_value=pickle.HIGHEST_PROTOCOL))
def test_aware_utc_datetimes_load_back_equal_at_every_protocol(dt: datetime, protocol: int) -> None:
    got = pickle.loads(pickling.dumps(dt, protocol))
    # CPython keeps fold only from protocol 4 on; so does this.
    assert _same(got, dt) and got.fold == pickle.loads(pickle.dumps(dt, protocol)).fold


@settings(max_examples=100, deadline=None)
@given(st.datetimes(timezones=st.one_of(st.none(), st.builds(
    lambda m: timezone(timedelta(minutes=m)), st.integers(min_value=-23 * 60, max_value=23 * 60)))))
def test_other_datetimes_keep_cpythons_form(dt: datetime) -> None:
    assume(dt.tzinfo is not timezone.utc)  # timezone(timedelta(0)) is UTC itself
    data = pickling.dumps(dt, PICKLE_PROTOCOL)
    assert data == pickle.dumps(dt, PICKLE_PROTOCOL)
    assert pickle.loads(data) == dt


def test_the_compact_form_is_used_for_utc_only() -> None:
    dt = datetime(2024, 3, 1, 0, 8, 22, 440000, tzinfo=timezone.utc)
    compact = pickling.dumps(dt, PICKLE_PROTOCOL)
    assert b"utc_datetime" in compact and b"timedelta" not in compact
    assert len(compact) < len(pickle.dumps(dt, PICKLE_PROTOCOL))
    for other in (dt.replace(tzinfo=None), dt.astimezone(timezone(timedelta(hours=2))), dt.replace(fold=1),
                  _MyDatetime(2024, 3, 1, tzinfo=timezone.utc)):
        data = pickling.dumps(other, PICKLE_PROTOCOL)
        assert b"utc_datetime" not in data, other
        assert _same(pickle.loads(data), other) and pickle.loads(data).fold == other.fold


def test_the_edges_and_nested_values() -> None:
    value = {
        "edges": [UTC_MIN, UTC_MAX, datetime(1970, 1, 1, tzinfo=timezone.utc)],
        "nested": (1, "k", (datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc), b"x")),
        "same twice": [datetime(2030, 1, 1, tzinfo=timezone.utc)] * 2,
    }
    got = pickle.loads(pickling.dumps(value, PICKLE_PROTOCOL))
    assert got == value
    assert all(d.tzinfo is timezone.utc for d in got["edges"])


def test_plain_pickle_elsewhere_is_unchanged() -> None:
    dt = datetime(2024, 3, 1, tzinfo=timezone.utc)
    assert b"utc_datetime" not in pickle.dumps(dt, PICKLE_PROTOCOL)


class _Stamped:
    """State holding aware datetimes, as a windowing key's does."""

    def __init__(self, resume: Optional[Any]) -> None:
        self.times = list(resume) if resume is not None else []

    def snapshot(self) -> Any:
        return tuple(self.times)


def test_state_with_utc_datetimes_resumes_equal(tmp_path: Path) -> None:
    times = [datetime(2024, 3, 1, 0, 0, i, i * 1000, tzinfo=timezone.utc) for i in range(5)] + [UTC_MIN, UTC_MAX]
    with StateStore.open(str(tmp_path), "stamps") as store:
        store.register("s", _Stamped)
        store.get_or_build("s", "k").times.extend(times)
        store.snapshot(epoch=1)
    with StateStore.open(str(tmp_path), "stamps", resume_epoch=2) as store:
        store.register("s", _Stamped)
        got = store.get("s", "k").times
    assert got == times and all(t.tzinfo is timezone.utc for t in got)


# -- the reusing dumper a state store keeps ---------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20),
              st.binary(max_size=40)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12), min_size=1, max_size=8))
def test_a_reused_dumper_writes_what_pickle_dumps_writes(values: list) -> None:
    """Without UTC datetimes the bytes are plain pickle's, call after call:
    nothing of one pickle (memo, frame, buffer) leaks into the next."""
    dump = pickling.snapshot_dumper(PICKLE_PROTOCOL)
    for v in values:
        assert dump(v, PICKLE_PROTOCOL) == pickle.dumps(v, PICKLE_PROTOCOL)


def test_each_pickle_of_a_dumper_loads_on_its_own() -> None:
    dump = pickling.snapshot_dumper(PICKLE_PROTOCOL)
    shared = ["shared", datetime(2024, 1, 1, tzinfo=timezone.utc)]
    first, second = dump((shared, shared), PICKLE_PROTOCOL), dump({"again": shared}, PICKLE_PROTOCOL)
    assert pickle.loads(first) == (shared, shared)
    assert pickle.loads(second) == {"again": shared}


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("no pickling for me")


def test_a_dumper_recovers_from_a_failed_pickle_and_from_a_large_one() -> None:
    dump = pickling.snapshot_dumper(PICKLE_PROTOCOL)
    try:
        dump(("before", _Unpicklable()), PICKLE_PROTOCOL)
    except TypeError as ex:
        assert "no pickling for me" in str(ex)
    else:
        raise AssertionError("the unpicklable value was pickled")
    assert pickle.loads(dump(("after", 1), PICKLE_PROTOCOL)) == ("after", 1)
    big = b"x" * (3 << 20)
    assert pickle.loads(dump(big, PICKLE_PROTOCOL)) == big
    assert dump(7, PICKLE_PROTOCOL) == pickle.dumps(7, PICKLE_PROTOCOL)


class _Nested:
    """A value whose pickling pickles something else with the same dumper."""

    dump: Any = None

    def __reduce__(self) -> Any:
        inner = _Nested.dump(("inner", datetime(2024, 1, 1, tzinfo=timezone.utc)), PICKLE_PROTOCOL)
        return (pickle.loads, (inner,))


def test_a_dumper_called_while_it_pickles_gets_a_pickler_of_its_own() -> None:
    dump = _Nested.dump = pickling.snapshot_dumper(PICKLE_PROTOCOL)
    got = pickle.loads(dump(("outer", _Nested()), PICKLE_PROTOCOL))
    assert got == ("outer", ("inner", datetime(2024, 1, 1, tzinfo=timezone.utc)))
