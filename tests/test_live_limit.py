"""A bounded live set: ``max_live_keys``, eviction and batched hydration
(issue 13).

What must hold: a flow's output, and the state it commits, are the same
whichever keys happened to be live; evicted keys come back when touched
(their timers fire on time and ``on_eof`` reaches them); a stored key costs
one multi-get per batch, not a lookup per key; the limit works with
recovery off too (spilling to a temporary directory removed at exit); a bad
limit is one clear error.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.logic import StatefulLogic
from millpond.recovery import RecoveryConfig
from millpond.state import StateStore
from millpond.testing import TestingSink, TestingSource, cluster_main, run_main

from helpers.aborts import with_aborts

ZERO = timedelta(0)
PAST = datetime(2000, 1, 1, tzinfo=timezone.utc)
STEP = "s"


class Box:
    def __init__(self, state: Any) -> None:
        self.v = state if state is not None else 0

    def snapshot(self) -> Any:
        return self.v


# -- the store ------------------------------------------------------------------


def _store(tmp_path: Path, limit: Optional[int], resume_epoch: Optional[int] = None) -> StateStore:
    store = StateStore.open(tmp_path, "flow", resume_epoch=resume_epoch)
    store.register(STEP, Box, evictable=True)
    store.limit_live_keys(limit)
    return store


def test_eviction_writes_changed_keys_at_the_current_epoch_and_drops_clean_ones(tmp_path):
    with _store(tmp_path, 10) as s:
        for i in range(20):
            s.get_or_build(STEP, f"k{i:02d}").v = i
        assert s.snapshot(1) == 20
        # All clean: eviction writes nothing, down to 80% of the limit.
        assert s.evict(2) == 12
        assert s.evictable_count() == 8
        assert s.live_stats.spilled == 0
        # The oldest went first; the newest stayed.
        assert s.peek(STEP, "k19") is not None
        # k11 (evicted) comes back from the last batch, without a read.
        s.get(STEP, "k11").v = 111
        assert s.live_stats.victims_back == 1
        # Change it and a live key, make new ones: the least recently used
        # go, and a changed one among them is written first (at epoch 2).
        s.get(STEP, "k12").v = 112
        for i in range(20, 25):
            s.get_or_build(STEP, f"k{i:02d}").v = i
        assert s.evict(2) == 6  # k12..k17
        assert s.live_stats.spilled == 1
        assert s.peek(STEP, "k11") is not None
        # Evicted keys come back with their latest value: those of the
        # last batch from memory, older ones from the store.
        assert s.get(STEP, "k12").v == 112
        assert s.live_stats.victims_back == 2
        assert s.get(STEP, "k00").v == 0
        assert s.live_stats.victims_back == 2
    # Epoch 2 never committed: a resume at epoch 2 rolls the spilled rows back.
    with _store(tmp_path, None, resume_epoch=2) as s:
        assert s.get(STEP, "k11").v == 11
        assert s.get(STEP, "k12").v == 12
        assert s.get(STEP, "k20") is None


def test_a_prefetched_key_becomes_the_most_recently_used(tmp_path):
    with _store(tmp_path, 10) as s:
        for i in range(10):
            s.get_or_build(STEP, f"k{i}")
        # Touched as a batch, in any order: k0 and k1 are now the newest,
        # so the oldest after them go first.
        assert s.prefetch(STEP, iter(["k1", "nope", "k0"])) == 0
        s.get_or_build(STEP, "k10")
        assert s.evict(1) == 3
        assert list(s._live[STEP]) == ["k5", "k6", "k7", "k8", "k9", "k1", "k0", "k10"]


def test_touch_keys_moves_found_keys_to_the_end_and_returns_the_others():
    from millpond import _core

    live = {"a": 1, "b": 2, "c": 3}
    assert _core.touch_keys(live, ["a", "x", "b", "x"]) == ["x", "x"]
    assert list(live.items()) == [("c", 3), ("a", 1), ("b", 2)]
    assert _core.touch_keys(live, (k for k in ["c"])) == []
    assert list(live) == ["a", "b", "c"]
    with pytest.raises(TypeError):
        _core.touch_keys([], [])
    with pytest.raises(TypeError, match="unhashable"):
        _core.touch_keys(live, [["a"]])
    assert list(live) == ["a", "b", "c"], "a failed call leaves the order of what it did not reach"


def test_a_changed_key_evicted_then_snapshotted_in_the_same_epoch_keeps_its_last_value(tmp_path):
    with _store(tmp_path, 1) as s:
        s.get_or_build(STEP, "a").v = 1
        s.get_or_build(STEP, "b").v = 2
        s.evict(1)  # both go, written at epoch 1
        assert s.evictable_count() == 0
        assert s.live_stats.spilled == 2
        s.get(STEP, "a").v = 10  # back, changed again in the same epoch
        s.discard(STEP, "b")
        s.snapshot(1)
    with _store(tmp_path, None, resume_epoch=2) as s:
        assert s.get(STEP, "a").v == 10
        assert s.get(STEP, "b") is None
        assert s.keys(STEP) == ["a"]


def test_prefetch_builds_a_batch_of_stored_keys_in_one_call(tmp_path, monkeypatch):
    with _store(tmp_path, None) as s:
        for i in range(100):
            s.get_or_build(STEP, f"k{i}").v = i
        s.snapshot(1)
    from millpond import _core

    singles: List[str] = []
    real_get = _core.store_get
    monkeypatch.setattr(_core, "store_get", lambda h, step, key: singles.append(key) or real_get(h, step, key))
    with _store(tmp_path, None, resume_epoch=2) as s:
        wanted = [f"k{i}" for i in range(0, 100, 3)] + ["new1", "new2"]
        assert s.prefetch(STEP, wanted) == 34
        assert s.live_stats.hydrate_calls == 1
        for key in wanted:
            s.get_or_build(STEP, key)
        assert s.get(STEP, "k3").v == 3
        # Found keys are live, absent ones remembered: nothing per key.
        assert singles == []
        assert s.get(STEP, "new1").v == 0
        # A key outside the prefetch is looked up on its own.
        assert s.get(STEP, "k4").v == 4
        assert singles == ["k4"]


def test_prefetch_skips_pending_deletions_and_keeps_live_objects(tmp_path):
    with _store(tmp_path, None) as s:
        for key in "abc":
            s.get_or_build(STEP, key).v = key
        s.snapshot(1)
    with _store(tmp_path, None, resume_epoch=2) as s:
        live_a = s.get_or_build(STEP, "a")
        live_a.v = "changed"
        s.discard(STEP, "b")
        assert s.prefetch(STEP, ["a", "b", "c"]) == 1
        assert s.peek(STEP, "a") is live_a
        assert s.peek(STEP, "b") is None
        assert s.peek(STEP, "c").v == "c"


def test_steps_not_evictable_keep_their_objects(tmp_path):
    with _store(tmp_path, 2) as s:
        s.register("positions", Box)
        for i in range(5):
            s.set("positions", f"p{i}", Box(i))
            s.get_or_build(STEP, f"k{i}")
        s.evict(1)
        assert s.evictable_count() <= 2
        assert len(s.keys("positions")) == 5
        assert all(s.peek("positions", f"p{i}").v == i for i in range(5))


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "10"])
def test_a_limit_below_one_or_not_a_whole_number_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match=r"max_live_keys must be a whole number of at least 1"):
        RecoveryConfig(local_state_dir=tmp_path, max_live_keys=bad)
    flow = _count_flow([("a", 1)], [])
    with pytest.raises(ValueError, match=r"max_live_keys must be a whole number of at least 1"):
        run_main(flow, max_live_keys=bad)


@pytest.mark.parametrize("raw", ["0", "-3", "many"])
def test_a_bad_limit_in_the_environment_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("MILLPOND_MAX_LIVE_KEYS", raw)
    with pytest.raises(ValueError, match=r"MILLPOND_MAX_LIVE_KEYS=.* is not a whole number of at least 1"):
        run_main(_count_flow([("a", 1)], []))


# -- flows ----------------------------------------------------------------------


class Notifying(StatefulLogic[Any, Any, Any]):
    """Counts a key's items; every third asks for a timer that is already
    due, whose notification says which count set it; at EOF says its
    count. The output does not depend on when anything was live."""

    def __init__(self, state: Any) -> None:
        self.count, self.pending = state if state is not None else (0, None)

    def on_item(self, value: Any) -> Tuple[Iterable[Any], bool]:
        self.count += 1
        if self.count % 3 == 0:
            self.pending = self.count
        return [("item", self.count, value)], False

    def on_notify(self) -> Tuple[Iterable[Any], bool]:
        fired, self.pending = self.pending, None
        return [("notify", fired)], False

    def on_eof(self) -> Tuple[Iterable[Any], bool]:
        return [("eof", self.count)], self.count % 4 == 0

    def notify_at(self) -> Optional[datetime]:
        return PAST if self.pending is not None else None

    def snapshot(self) -> Any:
        return (self.count, self.pending)


def _count_flow(items: Sequence[Any], out: List[Any], batch_size: int = 3) -> Dataflow:
    flow = Dataflow("limited")
    s = op.input("in", flow, TestingSource(items, batch_size=batch_size))
    counted = op.stateful_map("count", s, lambda n, v: ((n or 0) + v, (n or 0) + v))
    notified = op.stateful("notify", s, Notifying)
    totals = op.fold_final("total", s, lambda: 0, lambda acc, v: acc + v)
    op.output("out", op.merge("all", op.map("c", counted, lambda kv: ("count",) + kv),
                              op.map("n", notified, lambda kv: ("notify",) + kv),
                              op.map("t", totals, lambda kv: ("total",) + kv)), TestingSink(out))
    return flow


def _items(keys: Sequence[int], values: Sequence[int]) -> List[Tuple[str, int]]:
    return [(f"k{k}", v) for k, v in zip(keys, values)]



def _resumed_output(tmp: Path, items: Sequence[Any], limits: Sequence[Optional[int]], workers: Sequence[int],
                    aborts: int, batch_size: int) -> List[Any]:
    out: List[Any] = []
    cfg = RecoveryConfig(local_state_dir=tmp / "state", backup=str(tmp / "backup"))
    # One flow (one source) for every run: an ABORT fires once.
    flow = _count_flow(items, out, batch_size)
    for i in range(aborts + 1):
        cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg,
                     worker_count_per_proc=workers[i % len(workers)], max_live_keys=limits[i % len(limits)])
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 9)), min_size=1, max_size=80),
    abort_at=st.lists(st.integers(0, 79), max_size=4),
    limits=st.lists(st.one_of(st.none(), st.integers(1, 12)), min_size=1, max_size=4),
    workers=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    batch_size=st.integers(1, 7),
)
def test_random_limits_and_aborts_give_the_output_of_an_unlimited_run(data, abort_at, limits, workers, batch_size):
    items = _items([k for k, _ in data], [v for _, v in data])
    expected: List[Any] = []
    run_main(_count_flow(items, expected, batch_size), epoch_interval=ZERO)
    aborts = [i for i in abort_at if i < len(items)]
    with tempfile.TemporaryDirectory() as tmp:
        got = _resumed_output(Path(tmp), with_aborts(items, aborts), limits, workers, len(aborts), batch_size)
    assert sorted(got, key=repr) == sorted(expected, key=repr)


@pytest.mark.parametrize("limit", [1, 10])
def test_recovery_off_with_a_limit_gives_the_same_output_and_leaves_no_files(tmp_path, monkeypatch, limit):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    items = _items([i % 37 for i in range(500)], [i % 5 + 1 for i in range(500)])
    expected: List[Any] = []
    run_main(_count_flow(items, expected), epoch_interval=ZERO)
    got: List[Any] = []
    run_main(_count_flow(items, got), epoch_interval=timedelta(seconds=10), max_live_keys=limit)
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    assert list(tmp_path.iterdir()) == []


def test_the_limit_holds_between_activations_and_the_run_logs_what_it_did(tmp_path, caplog):
    caplog.set_level("INFO", logger="millpond")
    seen: List[int] = []

    class Watch:
        def __init__(self, state: Any) -> None:
            self.n = state or 0

        def snapshot(self) -> Any:
            return self.n

    flow = Dataflow("bounded")
    s = op.input("in", flow, TestingSource([(f"k{i % 500}", 1) for i in range(3000)], batch_size=50))
    counted = op.stateful_map("count", s, lambda n, v: ((n or 0) + v, (n or 0) + v))
    op.output("out", op.map("len", counted, lambda kv: kv), TestingSink([]))
    from millpond.engine import worker as worker_mod

    real = worker_mod.Worker._activation_done

    def spy(self: Any) -> None:
        real(self)
        seen.append(self.store.evictable_count())

    worker_mod.Worker._activation_done = spy  # type: ignore[method-assign]
    try:
        run_main(flow, recovery_config=RecoveryConfig(local_state_dir=tmp_path), max_live_keys=40)
    finally:
        worker_mod.Worker._activation_done = real  # type: ignore[method-assign]
    assert max(seen) <= 40
    line = next(r.getMessage() for r in caplog.records if "live keys (limit 40)" in r.getMessage())
    assert "evicted" in line and "multi-gets" in line


def test_the_variable_sets_the_limit_when_nothing_else_does(tmp_path, monkeypatch, caplog):
    caplog.set_level("INFO", logger="millpond")
    monkeypatch.setenv("MILLPOND_MAX_LIVE_KEYS", "5")
    out: List[Any] = []
    run_main(_count_flow(_items(range(40), [1] * 40), out))
    assert any("live keys (limit 5)" in r.getMessage() for r in caplog.records)
    # The keyword wins over the variable.
    caplog.clear()
    run_main(_count_flow(_items(range(40), [1] * 40), []), max_live_keys=7)
    assert any("live keys (limit 7)" in r.getMessage() for r in caplog.records)
    assert os.environ["MILLPOND_MAX_LIVE_KEYS"] == "5"


# -- SIGKILL while evictions are in flight -------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "killed_under,resumed_under,resumed_log",
    [
        (["--max-live-keys", "20"], ["--max-live-keys", "7"], r"live keys \(limit 7\); evicted (\d+) keys"),
        # A byte budget: about 20 and then about 6 keys of these (int) states.
        (["--max-live-bytes", "4KiB"], ["--max-live-bytes", "1200"], r"live keys \(limit \d\); evicted (\d+) keys"),
    ],
    ids=["key-limit", "byte-budget"],
)
def test_sigkill_while_evicting_then_resume_with_another_limit_and_worker_count(tmp_path, killed_under,
                                                                                  resumed_under, resumed_log):
    """The word count of helpers.mpflow (300 words) under a limit of 20 live
    keys (or a byte budget that allows about as many) evicts on nearly
    every batch; SIGKILLed at random moments, each rerun leaves a prefix of
    the uninterrupted output, and a last run with a tighter bound on two
    workers completes it exactly: every count once."""
    import random

    from helpers.mpflow import child_env, expected_output, kill_at_random_points, make_run_dir, run, run_argv

    uninterrupted = expected_output()
    d = make_run_dir(tmp_path / "run")
    (d / "state").mkdir()
    argv = run_argv(local="state", backup=None, extra=killed_under)
    logs, killed = kill_at_random_points(argv, d, child_env(), 3, random.Random(13), 0.35, d / "out.txt",
                                         uninterrupted)
    assert killed == 3
    final = run(run_argv(local="state", backup=None, extra=resumed_under + ["-w", "2"]), d, timeout=120)
    assert final.returncode == 0, final
    text = (d / "out.txt").read_text()
    # Every running count exactly once (two workers emit in another order).
    assert sorted(text.splitlines()) == sorted(uninterrupted.splitlines())
    import re

    evicted = [int(n) for n in re.findall(resumed_log, final.stderr)]
    assert len(evicted) == 2 and sum(evicted) > 0, final.stderr


def test_the_command_line_takes_the_limit_and_refuses_a_bad_one(tmp_path):
    from helpers.mpflow import bound_flag_runs

    bad, bad_var, ok = bound_flag_runs(tmp_path, "--max-live-keys", "MILLPOND_MAX_LIVE_KEYS",
                                       ["--max-live-keys", "25"], env={"TMPDIR": str(tmp_path)})
    assert "--max-live-keys: expected a positive integer, got '0'" in bad.stderr
    assert "MILLPOND_MAX_LIVE_KEYS='lots': expected a positive integer" in bad_var.stderr
    assert "live keys (limit 25)" in ok.stderr
    # Without recovery, the spill directory is gone at exit.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_iter_keys_streams_every_key_once_while_keys_are_evicted_and_discarded(tmp_path):
    with _store(tmp_path, 10) as s:
        for i in range(0, 60, 2):
            s.get_or_build(STEP, f"k{i:03d}").v = i
        s.snapshot(1)
        s.evict(2)  # most are stored only now
        for i in range(1, 60, 2):
            s.get_or_build(STEP, f"k{i:03d}").v = i  # live, not stored yet
        s.discard(STEP, "k010")
        expected = s.keys(STEP)
        assert "k010" not in expected and len(expected) == 59
        seen = []
        for n, key in enumerate(s.iter_keys(STEP)):
            seen.append(key)
            s.get(STEP, key)  # touched: may come back from the store
            if n % 7 == 0:
                s.evict(2)  # written to the store while it is scanned
            if key == "k020":
                s.discard(STEP, "k040")  # not yielded yet: skipped
        assert seen == [k for k in expected if k != "k040"]
