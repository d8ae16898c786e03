"""millpond.testing.ffwd_iter and TimeTestingGetter."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import millpond.testing as testing
from millpond.testing import TimeTestingGetter, ffwd_iter


def test_exported():
    assert {"ffwd_iter", "TimeTestingGetter", "TestingSource", "run_main"} <= set(testing.__all__)


def test_ffwd_iter():
    it = iter(range(5))
    ffwd_iter(it, 2)
    assert next(it) == 2
    ffwd_iter(it, 0)
    assert next(it) == 3
    ffwd_iter(it, 10)  # past the end: stops there
    assert next(it, "end") == "end"

    def gen():
        yield from "abcdef"

    g = gen()
    ffwd_iter(g, 4)
    assert list(g) == ["e", "f"]
    with pytest.raises(ValueError):
        ffwd_iter(iter([]), -1)


def test_time_testing_getter():
    t0 = datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
    clock = TimeTestingGetter(t0)
    assert clock.get() == t0 and clock.get() == t0
    clock.advance(timedelta(minutes=5))
    assert clock.get() == t0 + timedelta(minutes=5)
    clock.advance(timedelta(minutes=-10))
    assert clock.get() == t0 - timedelta(minutes=5)
    assert clock.get().tzinfo is timezone.utc
    with pytest.raises(TypeError):
        clock.advance(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        TimeTestingGetter("2024-01-01")  # type: ignore[arg-type]


def test_time_testing_getter_drives_a_ttl_cache_across_runs():
    # The getter object is shared with code under test through its bound method.
    from millpond.operators import TTLCache

    clock = TimeTestingGetter(datetime(2024, 1, 1, tzinfo=timezone.utc))
    fetched = []
    cache = TTLCache(lambda k: fetched.append(k) or k, clock.get, timedelta(hours=1))
    for _ in range(3):
        cache.get("k")
        clock.advance(timedelta(minutes=40))
    # fetched at 0, fresh at 40 min, refetched at 80 min
    assert fetched == ["k", "k"]
