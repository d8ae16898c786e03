"""Windowed flows recover exactly (issue 14).

A hypothesis property test: random event-time inputs (a few keys,
timestamps mostly increasing with some out-of-order and some late items),
a tumbling, sliding or session windower, and an ``EventClock`` whose
``now_getter`` is frozen (so the watermark of a key is a function of the
items that key has seen, and nothing depends on the wall clock), aborted
with ``TestingSource.ABORT()`` at random points and resumed under
``RecoveryConfig`` on a random number of workers each time. Every stream of
the ``WindowOut`` (``down``, ``late``, ``meta``) goes to the sink; the
concatenated output of all the executions, deduplicated in no way, equals
the output of one uninterrupted run (compared as sorted lists): nothing
lost, nothing emitted twice.

``epoch_interval=timedelta(0)`` makes every batch its own epoch, so every
output written before an abort belongs to a committed epoch (the testing
sink is not transactional); with that, a plain stateful flow is already
exactly-once here, and a windowed one must be too.

The SIGKILL loop over a file-to-file windowed flow is in
``tests/test_windowing_sigkill.py``.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

win = pytest.importorskip("millpond.operators.windowing")

import millpond.operators as op  # noqa: E402
from millpond import state as state_mod  # noqa: E402
from millpond.dataflow import Dataflow  # noqa: E402
from millpond.recovery import RecoveryConfig, SnapshotMode  # noqa: E402
from millpond.testing import TestingSink, TestingSource, cluster_main  # noqa: E402

from helpers.aborts import with_aborts  # noqa: E402

ZERO = timedelta(0)
BASE = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)
# The "system time" the clock sees: never moves, so a key's watermark only
# advances with the items of that key (deterministic, no sleeping).
FROZEN_NOW = datetime(2024, 3, 1, 11, 0, tzinfo=timezone.utc)


def frozen_now() -> datetime:
    return FROZEN_NOW


def no_wakeup(_close_time: datetime) -> Optional[datetime]:
    # No timer wake-ups: with a frozen clock they could not move a watermark.
    return None


def item_ts(value: Tuple[datetime, int]) -> datetime:
    return value[0]


def make_windower(kind: str) -> Any:
    if kind == "tumbling":
        return win.TumblingWindower(length=timedelta(seconds=60), align_to=BASE)
    if kind == "sliding":
        return win.SlidingWindower(length=timedelta(seconds=60), offset=timedelta(seconds=20), align_to=BASE)
    assert kind == "session"
    return win.SessionWindower(gap=timedelta(seconds=30))


def make_clock(wait_s: int) -> Any:
    return win.EventClock(item_ts, wait_for_system_duration=timedelta(seconds=wait_s), now_getter=frozen_now,
                          to_system_utc=no_wakeup)


def _down(kv: Tuple[str, Tuple[int, Any]]) -> Tuple[Any, ...]:
    key, (wid, values) = kv
    return ("down", key, wid, tuple(idx for _ts, idx in values))


def _late(kv: Tuple[str, Tuple[int, Any]]) -> Tuple[Any, ...]:
    key, (wid, (_ts, idx)) = kv
    return ("late", key, wid, idx)


def _meta(kv: Tuple[str, Tuple[int, Any]]) -> Tuple[Any, ...]:
    key, (wid, meta) = kv
    return ("meta", key, wid, meta.open_time.isoformat(), meta.close_time.isoformat(),
            tuple(sorted(meta.merged_ids)))


def windowed_flow(items: Sequence[Any], out: List[Any], kind: str, wait_s: int, batch_size: int) -> Dataflow:
    """``(key, (ts, idx))`` items -> ``collect_window`` -> every stream of
    its ``WindowOut``, tagged, into ``out``."""
    flow = Dataflow("winrec")
    s = op.input("inp", flow, TestingSource(items, batch_size=batch_size))
    wo = win.collect_window("collect", s, make_clock(wait_s), make_windower(kind))
    tagged = op.merge("all", op.map("down", wo.down, _down), op.map("late", wo.late, _late),
                      op.map("meta", wo.meta, _meta))
    op.output("out", tagged, TestingSink(out))
    return flow


def event_items(keys: Sequence[int], steps: Sequence[int], jitters: Sequence[int]) -> List[Tuple[str, Tuple[datetime, int]]]:
    """Timestamps that mostly increase (``steps``), some pulled back by up to
    a few minutes (``jitters``): out of order, and late once the watermark
    has passed their window."""
    out = []
    t = 0
    for idx, (k, step, jit) in enumerate(zip(keys, steps, jitters)):
        t += step
        out.append((f"k{k}", (BASE + timedelta(seconds=max(0, t - jit)), idx)))
    return out



def run_uninterrupted(data: Sequence[Any], kind: str, wait_s: int, batch_size: int) -> List[Any]:
    out: List[Any] = []
    cluster_main(windowed_flow(list(data), out, kind, wait_s, batch_size), [], 0, epoch_interval=ZERO)
    return out


def run_with_aborts(state: Path, data: Sequence[Any], aborts: Sequence[int], workers: Sequence[int], kind: str,
                    wait_s: int, batch_size: int, mode: SnapshotMode) -> Tuple[List[Any], List[List[Any]]]:
    assert len(workers) == len(aborts) + 1
    out: List[Any] = []
    flow = windowed_flow(with_aborts(data, list(aborts)), out, kind, wait_s, batch_size)
    cfg = RecoveryConfig(state, snapshot_mode=mode, key_group_count=16)
    per_run = []
    for w in workers:
        start = len(out)
        cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg, worker_count_per_proc=w)
        per_run.append(out[start:])
    return out, per_run


@st.composite
def scenarios(draw: Any) -> dict:
    n = draw(st.integers(8, 60))
    n_keys = draw(st.integers(1, 4))
    keys = draw(st.lists(st.integers(0, n_keys - 1), min_size=n, max_size=n))
    steps = draw(st.lists(st.integers(0, 25), min_size=n, max_size=n))
    # mostly in order; some items a little out of order, a few far behind (late)
    jitters = [0 if j < 70 else (1 + j % 15 if j < 92 else 60 + (j * 17) % 180)
               for j in draw(st.lists(st.integers(0, 99), min_size=n, max_size=n))]
    aborts = sorted(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3)))
    return {
        "data": event_items(keys, steps, jitters),
        "aborts": aborts,
        "workers": draw(st.lists(st.integers(1, 3), min_size=len(aborts) + 1, max_size=len(aborts) + 1)),
        "kind": draw(st.sampled_from(["tumbling", "session", "sliding"])),
        "wait_s": draw(st.sampled_from([0, 10])),
        "batch_size": draw(st.integers(1, 4)),
        "mode": draw(st.sampled_from([SnapshotMode.BATCH, SnapshotMode.IMMEDIATE])),
    }


def check_scenario(sc: dict) -> None:
    expected = run_uninterrupted(sc["data"], sc["kind"], sc["wait_s"], sc["batch_size"])
    with tempfile.TemporaryDirectory(prefix="winrec-") as tmp:
        got, per_run = run_with_aborts(Path(tmp), sc["data"], sc["aborts"], sc["workers"], sc["kind"],
                                       sc["wait_s"], sc["batch_size"], sc["mode"])
    assert sorted(got) == sorted(expected), per_run
    assert len(got) == len(expected)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_aborted_and_resumed_windows_emit_exactly_the_uninterrupted_output(sc: dict) -> None:
    check_scenario(sc)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_windows_packed_ahead_resume_exactly_too(sc: dict) -> None:
    """The same with every batch-mode store packing each key right after
    its activation (``StateStore.ahead_packer``; tests/test_pack_ahead.py),
    as a store does whose keys pack slowly."""
    with mock.patch.object(state_mod, "_AHEAD_FROM_PACK_SECONDS", 0.0):
        check_scenario(sc)


def test_the_scenario_has_windows_late_items_and_merges() -> None:
    """The oracle is not vacuous: a fixed input of this shape emits windows,
    late items, and (sessions) a merge (the same outputs as Bytewax 0.21.1
    gives for these inputs, ``merged_ids`` aside)."""
    data = [("a", (BASE + timedelta(seconds=s), i)) for i, s in enumerate([0, 50, 70, 5, 200, 140, 175])]
    tumbling = run_uninterrupted(data, "tumbling", 0, 2)
    assert {x[0] for x in tumbling} == {"down", "late", "meta"}
    assert ("late", "a", 0, 3) in tumbling  # ts 5 after the watermark reached 70
    # 0 and 35 open two sessions (gap 30); 28, not behind the watermark
    # (35 - 10), bridges them before the first one closes
    data = [("a", (BASE + timedelta(seconds=s), i)) for i, s in enumerate([0, 35, 28, 200])]
    session = run_uninterrupted(data, "session", 10, 1)
    assert sorted(x[3] for x in session if x[0] == "down") == [(0, 2, 1), (3,)], session


def test_one_fixed_scenario_with_three_aborts_and_1_3_2_1_workers(tmp_path: Path) -> None:
    data = event_items([i % 3 for i in range(40)], [(i * 7) % 23 for i in range(40)],
                       [0 if i % 5 else (90 if i % 10 else 8) for i in range(40)])
    for kind in ("tumbling", "session"):
        expected = run_uninterrupted(data, kind, 10, 3)
        (tmp_path / kind).mkdir()
        got, per_run = run_with_aborts(tmp_path / kind, data, [9, 20, 31], [1, 3, 2, 1], kind, 10, 3,
                                       SnapshotMode.BATCH)
        assert sorted(got) == sorted(expected), (kind, per_run)
