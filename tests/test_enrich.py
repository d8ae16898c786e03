"""op.enrich_cached and TTLCache (expiry driven by a test clock, no
sleeping), and operators.helpers.map_dict_value."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.errors import DataflowError
from millpond.operators import TTLCache
from millpond.operators.helpers import map_dict_value
from millpond.testing import TestingSink, TestingSource, TimeTestingGetter, run_main

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


class Lookup:
    """A slow lookup that counts its calls; its answers change over time."""

    def __init__(self) -> None:
        self.calls: list = []
        self.version = 1

    def __call__(self, k: str) -> str:
        self.calls.append(k)
        return f"{k}-v{self.version}"


def test_ttl_cache_fetches_once_while_fresh_and_again_after_ttl():
    clock = TimeTestingGetter(T0)
    lookup = Lookup()
    cache = TTLCache(lookup, clock.get, timedelta(seconds=10))
    assert cache.get("a") == "a-v1"
    lookup.version = 2
    clock.advance(timedelta(seconds=10))  # exactly ttl old: still fresh
    assert cache.get("a") == "a-v1"
    assert lookup.calls == ["a"]
    clock.advance(timedelta(microseconds=1))
    assert cache.get("a") == "a-v2"
    assert lookup.calls == ["a", "a"]
    # the refetch restarts the key's ttl
    clock.advance(timedelta(seconds=5))
    assert cache.get("a") == "a-v2" and lookup.calls == ["a", "a"]


def test_ttl_cache_remove_and_keys_are_independent():
    clock = TimeTestingGetter(T0)
    lookup = Lookup()
    cache = TTLCache(lookup, clock.get, timedelta(seconds=10))
    cache.get("a")
    clock.advance(timedelta(seconds=6))
    cache.get("b")
    clock.advance(timedelta(seconds=6))
    assert cache.get("b") == "b-v1"  # 6 s old
    lookup.version = 2
    assert cache.get("a") == "a-v2"  # 12 s old
    cache.remove("b")
    cache.remove("never-cached")
    assert cache.get("b") == "b-v2"
    assert lookup.calls == ["a", "b", "a", "b"]


def test_ttl_cache_default_never_expires_and_errors_cache_nothing():
    clock = TimeTestingGetter(T0)
    n = {"calls": 0}

    def flaky(k):
        n["calls"] += 1
        if n["calls"] == 1:
            raise ConnectionError("down")
        return k * 2

    cache = TTLCache(flaky, clock.get)
    with pytest.raises(ConnectionError):
        cache.get("x")
    assert cache.get("x") == "xx"
    clock.advance(timedelta(days=365 * 1000))
    assert cache.get("x") == "xx" and n["calls"] == 2


def test_ttl_cache_rejects_bad_arguments():
    with pytest.raises(ValueError, match="negative"):
        TTLCache(str, ttl=timedelta(seconds=-1))
    with pytest.raises(TypeError, match="timedelta"):
        TTLCache(str, ttl=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        TTLCache(None)  # type: ignore[arg-type]


def enrich_flow(items, lookup, out, clock, ttl=timedelta(seconds=30)):
    flow = Dataflow("enrich")
    s = op.input("inp", flow, TestingSource(items))

    def mapper(cache, item):
        if item == "flush-b":
            cache.remove("b")
            return None
        return (item, cache.get(item))

    s = op.enrich_cached("lookup", s, lookup, mapper, ttl, now_getter=clock.get)
    s = op.filter("some", s, lambda x: x is not None)
    op.output("out", s, TestingSink(out))
    return flow


def test_enrich_cached_joins_items_with_cached_lookups():
    clock = TimeTestingGetter(T0)
    lookup = Lookup()
    out: list = []
    run_main(enrich_flow(["a", "b", "a", "b", "flush-b", "b"], lookup, out, clock))
    assert out == [("a", "a-v1"), ("b", "b-v1"), ("a", "a-v1"), ("b", "b-v1"), ("b", "b-v1")]
    assert lookup.calls == ["a", "b", "b"]


def test_enrich_cached_ttl_expiry_with_a_test_clock():
    clock = TimeTestingGetter(T0)
    lookup = Lookup()
    out: list = []

    def mapper(cache, k):
        # the clock moves 20 s per item, as the flow runs
        clock.advance(timedelta(seconds=20))
        return cache.get(k)

    flow = Dataflow("enrich_ttl")
    s = op.input("inp", flow, TestingSource(["a"] * 5, batch_size=2))
    s = op.enrich_cached("lookup", s, lookup, mapper, timedelta(seconds=30), now_getter=clock.get)
    op.output("out", s, TestingSink(out))
    run_main(flow)
    # fetched at t=20; fresh at 40; 60 - 20 > 30: refetch at 60; fresh at 80; refetch at 100
    assert len(out) == 5
    assert len(lookup.calls) == 3


def test_enrich_cached_errors():
    flow = Dataflow("bad")
    s = op.input("inp", flow, TestingSource([1]))
    with pytest.raises(TypeError, match="getter"):
        op.enrich_cached("e", s, 3, lambda c, x: x)
    with pytest.raises(ValueError, match="step 'e2'.*negative"):
        op.enrich_cached("e2", s, str, lambda c, x: x, timedelta(seconds=-1))

    def failing_lookup(k):
        raise LookupError("no such row")

    flow = Dataflow("fails")
    s = op.input("inp", flow, TestingSource([1]))
    s = op.enrich_cached("e", s, failing_lookup, lambda c, x: c.get(x))
    op.output("out", s, TestingSink([]))
    with pytest.raises(DataflowError, match="fails.e") as info:
        run_main(flow)
    assert isinstance(info.value.__cause__, LookupError)


def test_map_dict_value_in_a_flow():
    items = [{"user": "a", "n": 1}, {"user": "b", "n": 2}]
    out: list = []
    seen_by_other: list = []
    flow = Dataflow("mdv")
    s = op.input("inp", flow, TestingSource(items))
    op.output("out", op.map("inc", s, map_dict_value("n", lambda n: n * 10)), TestingSink(out))
    op.output("raw", s, TestingSink(seen_by_other))
    run_main(flow)
    assert out == [{"user": "a", "n": 10}, {"user": "b", "n": 20}]
    # the item is copied: the other reader of the stream sees it unchanged
    assert seen_by_other == items
    assert items == [{"user": "a", "n": 1}, {"user": "b", "n": 2}]


def test_map_dict_value_errors_and_mapping_types():
    from collections import OrderedDict

    f = map_dict_value("n", str)
    res = f(OrderedDict(n=1))
    assert type(res) is OrderedDict and res["n"] == "1"
    with pytest.raises(KeyError, match="no key 'n'"):
        f({"m": 1})
    with pytest.raises(TypeError, match="dict items"):
        f(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        map_dict_value("n", 3)  # type: ignore[arg-type]


def test_enrich_cached_with_several_workers():
    from millpond.testing import cluster_main

    clock = TimeTestingGetter(T0)
    lookup = Lookup()
    out: list = []
    flow = Dataflow("enrich_workers")
    s = op.input("inp", flow, TestingSource([f"k{i % 4}" for i in range(40)], batch_size=3))
    s = op.redistribute("spread", s)
    s = op.enrich_cached("lookup", s, lookup, lambda cache, k: (k, cache.get(k)), now_getter=clock.get)
    op.output("out", s, TestingSink(out))
    cluster_main(flow, [], 0, worker_count_per_proc=3)
    assert sorted(out) == sorted((f"k{i % 4}", f"k{i % 4}-v1") for i in range(40))
    # one cache per process, shared by its workers: each key fetched once
    assert sorted(lookup.calls) == ["k0", "k1", "k2", "k3"]
