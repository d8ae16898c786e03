"""A byte budget for live state: ``max_live_bytes`` (issue 13).

What must hold: a key is charged for what it alone holds, not for what every
key shares; the budget becomes a key limit that keeps the live state's
estimated bytes under it; a budget smaller than one state keeps one key
live and says so; output and committed state are the same as an unbounded
run's, through aborts and resumes, with recovery on and off; bad budgets
are one clear error each, naming where they came from.
"""

from __future__ import annotations

import logging
import re
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.livelimit import KEY_OVERHEAD_BYTES, ByteBudget, LiveLimit, owned_bytes, parse_size, resolve_live_limit
from millpond.recovery import RecoveryConfig
from millpond.state import StateStore
from millpond.testing import TestingSink, TestingSource, cluster_main, run_main

from helpers.aborts import with_aborts

ZERO = timedelta(0)
STEP = "s"


class Blob:
    """A state of ``size`` bytes of its own."""

    __slots__ = ("data",)

    def __init__(self, state: Any) -> None:
        self.data: bytes = state if state is not None else b""

    def snapshot(self) -> Any:
        return self.data


# -- measuring ------------------------------------------------------------------


class Holder:
    __slots__ = ("own", "shared")

    def __init__(self, own: Any, shared: Any) -> None:
        self.own = own
        self.shared = shared


def test_a_key_is_charged_for_what_it_alone_holds():
    table = {i: str(i) * 10 for i in range(5000)}  # shared by every key
    roots = [Holder([bytes(1000 + i) for _ in range(3)], table) for i in range(4)]
    sizes = owned_bytes(roots)
    for i, size in enumerate(sizes):
        own = sys.getsizeof(roots[i]) + sys.getsizeof(roots[i].own)
        own += 3 * sys.getsizeof(bytes(1000 + i))
        # The shared table (about 400 KB) is charged to no one.
        assert size == own, (i, size, own)


def test_the_keys_of_a_dict_of_str_count_too():
    # Such a dict does not report its keys to the collector.
    states = [{f"field-{j}-{'x' * 40}": float(j) for j in range(5)} for _ in range(3)]
    expected = sys.getsizeof(states[0]) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in states[0].items())
    assert owned_bytes(states) == [expected] * 3


def test_a_large_structure_every_key_refers_to_is_walked_once_and_charged_to_none():
    table = {f"entry-{i}": [i] for i in range(100_000)}
    roots = [Holder([bytes(500) for _ in range(2)], table) for _ in range(64)]
    # The shared table comes first in each root's referents: a breadth-first
    # walk still reaches the root's own objects within the walk limit.
    roots = [Holder(table, r.own) for r in roots]
    t0 = time.perf_counter()
    sizes = owned_bytes(roots, walk_limit=5000)
    took = time.perf_counter() - t0
    own = sys.getsizeof(roots[0]) + sys.getsizeof(roots[0].shared) + 2 * sys.getsizeof(bytes(500))
    assert sizes == [own] * 64
    # Once (5,000 objects), not 64 times.
    assert took < 3.0, took  # 64 walks of the table took 10 s


def test_what_a_shared_object_leads_to_is_shared_even_when_a_root_reached_it_first():
    inner = [bytes(2000)]
    shared = {"inner": inner}
    a = Holder(inner, None)  # reaches inner directly...
    b = Holder(shared, None)  # ... and through shared
    sizes = owned_bytes([a, b])
    assert sizes[0] == sys.getsizeof(a)
    assert sizes[1] == sys.getsizeof(b) + sys.getsizeof(shared) + sys.getsizeof("inner")


def test_a_broken_sizeof_does_not_stop_the_estimate():
    class Broken:
        def __sizeof__(self) -> int:
            raise RuntimeError("no size")

    sizes = owned_bytes([Holder(Broken(), None), Holder(bytes(100), None)])
    assert sizes[1] > 100


def test_classes_functions_and_singletons_are_not_entered():
    class WithClass:
        def __init__(self) -> None:
            self.kind = WithClass
            self.fn = test_classes_functions_and_singletons_are_not_entered
            self.none = None
            self.flag = True

    (size,) = owned_bytes([WithClass()])
    assert size < 1000  # the instance and its dict, not the module's globals


def test_a_walk_stops_at_its_limit():
    big = [[i] for i in range(10_000)]
    (size,) = owned_bytes([big], walk_limit=100)
    assert 0 < size < sys.getsizeof(big) + 100 * 100


@pytest.mark.parametrize("states", [1, 0])
def test_fewer_than_two_keys_give_no_estimate(states):
    budget = ByteBudget(10_000)
    assert budget.keys_for([{f"k{i}": Blob(b"x") for i in range(states)}]) is None
    assert budget.per_key is None
    assert budget.allowed() == 10_000 // KEY_OVERHEAD_BYTES


def test_the_estimate_follows_the_states_size_and_spans_every_step():
    budget = ByteBudget(1_000_000)
    small = {f"k{i}": Blob(bytes(100)) for i in range(500)}
    large = {f"k{i}": Blob(bytes(10_000)) for i in range(500)}
    allowed = budget.keys_for([small, large])
    assert allowed is not None and budget.per_key is not None
    # Half the sample from each step: about (100 + 10,000) / 2 bytes a key.
    assert 5_050 < budget.per_key < 5_050 + 400
    assert allowed == int(1_000_000 / budget.per_key)
    # A second measure of larger states moves the estimate halfway.
    before = budget.per_key
    budget.keys_for([{f"k{i}": Blob(bytes(20_000)) for i in range(100)}])
    assert budget.per_key == pytest.approx((before + 20_000 + 200) / 2, rel=0.05)


@pytest.mark.parametrize(
    "text,expected",
    [("1500000", 1_500_000), ("512MiB", 512 << 20), ("512 mib", 512 << 20), ("2GB", 2_000_000_000),
     ("1.5G", int(1.5 * (1 << 30))), ("64k", 64 << 10), ("10KB", 10_000), ("3b", 3), ("1TiB", 1 << 40)],
)
def test_sizes_read_with_their_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "12XB", "-5", "0", "0.1", "1.5", "2.5b", "1e6", "5 M B"])
def test_a_size_that_cannot_be_read_names_itself(text):
    with pytest.raises(ValueError, match=r"expected a size"):
        parse_size(text)


# -- the store --------------------------------------------------------------------


def _store(tmp_path: Path, budget: Optional[int], keys: Optional[int] = None) -> StateStore:
    store = StateStore.open(tmp_path, "flow")
    store.register(STEP, Blob, evictable=True)
    LiveLimit(keys, budget).apply(store)
    return store


def test_the_budget_bounds_the_live_bytes_and_evicted_keys_come_back(tmp_path):
    with _store(tmp_path, 200_000) as s:
        for i in range(2000):
            s.get_or_build(STEP, f"k{i:04d}").data = bytes([i % 251]) * 1000
            s.evict(1 + i // 500)
            live_data = sum(len(b.data) for b in s._live[STEP].values())
            assert live_data <= 200_000
        assert s.max_live_bytes == 200_000
        limit = s.max_live_keys
        assert limit is not None and 120 <= limit <= 200  # about 1,100-1,300 bytes a key
        estimate = s.live_bytes_estimate
        assert estimate is not None and estimate <= 200_000
        assert s.live_stats.evicted > 1500
        s.snapshot(5)
        for i in range(0, 2000, 37):
            assert s.get(STEP, f"k{i:04d}").data == bytes([i % 251]) * 1000


def test_the_tighter_of_a_key_limit_and_a_budget_wins(tmp_path):
    with _store(tmp_path, 10_000_000, keys=50) as s:
        for i in range(300):
            s.get_or_build(STEP, f"k{i}").data = bytes(100)
            s.evict(1)
        assert s.max_live_keys == 50 and s.evictable_count() <= 50
    with _store(tmp_path / "b", 20_000, keys=10_000) as s:
        for i in range(300):
            s.get_or_build(STEP, f"k{i}").data = bytes(1000)
            s.evict(1)
        assert s.max_live_keys is not None and s.max_live_keys < 20
        assert s.evictable_count() <= s.max_live_keys
    # Lifting both bounds lifts the limit.
    with _store(tmp_path / "c", 20_000) as s:
        s.limit_live_bytes(None)
        assert s.max_live_keys is None and s.max_live_bytes is None and s.live_bytes_estimate is None


def test_a_budget_smaller_than_one_state_keeps_one_key_live_and_says_so(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="millpond")
    with _store(tmp_path, 500) as s:
        for i in range(20):
            s.get_or_build(STEP, f"k{i}").data = bytes(5000)
            s.evict(1)
            assert s.evictable_count() <= 2  # the one kept, and the one just touched
        assert s.max_live_keys == 1
        s.snapshot(1)
        assert all(s.get(STEP, f"k{i}").data == bytes(5000) for i in range(20))
    warnings = [r.getMessage() for r in caplog.records if "less than one key's state" in r.getMessage()]
    assert len(warnings) == 1 and "max_live_bytes 500" in warnings[0]


# -- flows ------------------------------------------------------------------------------


def _flow(items: Sequence[Any], out: List[Any], batch_size: int = 3) -> Dataflow:
    """Per key, the list of its values so far (states grow as the run goes)."""
    flow = Dataflow("budgeted")
    s = op.input("in", flow, TestingSource(items, batch_size=batch_size))
    seen = op.stateful_map("seen", s, lambda acc, v: ((acc or ()) + (v,), sum((acc or ()) + (v,))))
    totals = op.fold_final("total", s, lambda: 0, lambda acc, v: acc + v)
    op.output("out", op.merge("all", op.map("a", seen, lambda kv: ("seen",) + kv),
                              op.map("t", totals, lambda kv: ("total",) + kv)), TestingSink(out))
    return flow


def _items(data: Sequence[Tuple[int, int]]) -> List[Tuple[str, int]]:
    return [(f"k{k}", v) for k, v in data]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)), min_size=1, max_size=80),
    abort_at=st.lists(st.integers(0, 79), max_size=3),
    budgets=st.lists(st.one_of(st.none(), st.integers(1, 5000)), min_size=1, max_size=3),
    workers=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    batch_size=st.integers(1, 7),
)
def test_random_budgets_and_aborts_give_the_output_of_an_unbounded_run(data, abort_at, budgets, workers,
                                                                        batch_size):
    items = _items(data)
    expected: List[Any] = []
    run_main(_flow(items, expected, batch_size), epoch_interval=ZERO)
    aborts = [i for i in abort_at if i < len(items)]
    got: List[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RecoveryConfig(local_state_dir=Path(tmp) / "state", backup=str(Path(tmp) / "backup"))
        flow = _flow(with_aborts(items, aborts), got, batch_size)  # one source: an ABORT fires once
        for i in range(len(aborts) + 1):
            cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg,
                         worker_count_per_proc=workers[i % len(workers)], max_live_bytes=budgets[i % len(budgets)])
    assert sorted(got, key=repr) == sorted(expected, key=repr)


def test_a_resumed_run_under_a_budget_ends_with_the_state_of_one_that_never_failed(tmp_path):
    """Aborted twice, resumed under other budgets and worker counts (2, then
    1): the final totals and every running value match the uninterrupted
    run, and the budget evicted on the way."""
    items = _items([(i * 7 % 60, i % 5 + 1) for i in range(600)])
    expected: List[Any] = []
    run_main(_flow(items, expected, 10), epoch_interval=ZERO)
    got: List[Any] = []
    cfg = RecoveryConfig(local_state_dir=tmp_path / "state", backup=str(tmp_path / "backup"), max_live_bytes=4000)
    flow = _flow(with_aborts(items, [150, 420]), got, 10)
    for workers, budget in ((1, None), (2, 2500), (1, 800)):
        cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg, worker_count_per_proc=workers,
                     max_live_bytes=budget)
    assert sorted(got, key=repr) == sorted(expected, key=repr)


def test_recovery_off_with_a_budget_gives_the_same_output_and_leaves_no_files(tmp_path, monkeypatch, caplog):
    caplog.set_level("INFO", logger="millpond")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    items = _items([(i % 90, i % 5 + 1) for i in range(900)])
    expected: List[Any] = []
    run_main(_flow(items, expected), epoch_interval=ZERO)
    got: List[Any] = []
    run_main(_flow(items, got), epoch_interval=timedelta(seconds=10), max_live_bytes=3000)
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    assert list(tmp_path.iterdir()) == []
    lines = [r.getMessage() for r in caplog.records]
    assert any(re.search(r"byte budget 2.9 KiB: \d+ bytes a key at the latest estimate, .* for the \d+ live keys", m)
               for m in lines), lines
    evicted = [m for m in lines if "live keys (limit" in m]
    assert evicted and " evicted 0 keys" not in evicted[0]


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "10"])
def test_a_budget_below_one_or_not_a_whole_number_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match=r"max_live_bytes must be a whole number of bytes of at least 1"):
        RecoveryConfig(local_state_dir=tmp_path, max_live_bytes=bad)
    with pytest.raises(ValueError, match=r"max_live_bytes must be a whole number of bytes of at least 1"):
        run_main(_flow([("a", 1)], []), max_live_bytes=bad)


@pytest.mark.parametrize("raw", ["0", "-3", "lots", "12XB"])
def test_a_bad_budget_in_the_environment_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("MILLPOND_MAX_LIVE_BYTES", raw)
    with pytest.raises(ValueError, match=r"MILLPOND_MAX_LIVE_BYTES=.*: expected a size.*unset it for no budget"):
        run_main(_flow([("a", 1)], []))


def test_the_argument_wins_over_the_config_and_the_config_over_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MILLPOND_MAX_LIVE_BYTES", "1MiB")
    assert resolve_live_limit(None, None) == LiveLimit(None, 1 << 20)
    cfg = RecoveryConfig(local_state_dir=tmp_path, max_live_bytes=5000, max_live_keys=9)
    assert resolve_live_limit(None, None, cfg) == LiveLimit(9, 5000)
    assert resolve_live_limit(3, 700, cfg) == LiveLimit(3, 700)
    assert LiveLimit(3, 700).describe() == "3 keys and about 700 bytes"
    assert not LiveLimit()


def test_the_command_line_takes_a_budget_and_refuses_a_bad_one(tmp_path):
    from helpers.mpflow import PYTHON, bound_flag_runs, run

    bad, bad_var, ok = bound_flag_runs(tmp_path, "--max-live-bytes", "MILLPOND_MAX_LIVE_BYTES",
                                       ["--max-live-bytes", "8KiB", "-d", "state"])
    assert "--max-live-bytes: expected a size of at least 1 byte, got '0'" in bad.stderr
    assert "MILLPOND_MAX_LIVE_BYTES='lots': expected a size such as 1500000, 512MiB or 2GB" in bad_var.stderr
    assert "byte budget 8.0 KiB" in ok.stderr and "live keys (limit" in ok.stderr
    help_text = run([PYTHON, "-m", "millpond.run", "--help"], tmp_path)
    assert "--max-live-bytes SIZE" in help_text.stdout
