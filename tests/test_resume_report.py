"""What a resume reports: the keys it says it restored are the keys that
``inspect --keys`` counts in the committed state, after a clean finish and
after a crash that left older versions of keys uncollected; a run that
fails or aborts does not report itself finished."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
import shutil
from typing import Any, List, Tuple

import pytest

import millpond.operators as op
from millpond import _core
from millpond.backup import backup_from_uri
from millpond.dataflow import Dataflow
from millpond.engine.restore_progress import RestoreProgress
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.testing import TestingSink, TestingSource, run_main

KEYS = 50


def _flow(items: List[Any], out: List[Any]) -> Dataflow:
    flow = Dataflow("rr")
    keyed = op.key_on("key", op.input("in", flow, TestingSource(items)), lambda x: f"k{x % KEYS}")
    counts = op.stateful_map("count", keyed, lambda n, _v: ((n or 0) + 1, (n or 0) + 1))
    op.output("out", counts, TestingSink(out))
    return flow


def _restored(caplog: pytest.LogCaptureFixture) -> List[Tuple[str, int, str]]:
    """(kind, count, what) of each resume line: what is "keys" or "stored rows"."""
    out = []
    for r in caplog.records:
        m = re.search(r"(\w+) resume, .*, (\d+) (keys|stored rows) restored", r.getMessage())
        if m:
            out.append((m.group(1), int(m.group(2)), m.group(3)))
    return out


def _inspected_keys(backup_dir: str) -> int:
    b = backup_from_uri(backup_dir)
    report = _core.durable_inspect(b.core_handle(), "rr", True, b"")
    return sum(report["keys_per_step"].values())


@pytest.mark.parametrize("mode", [SnapshotMode.BATCH, SnapshotMode.IMMEDIATE], ids=lambda m: m.value)
def test_a_resume_reports_keys_only_when_it_knows_them(tmp_path, caplog, mode):
    caplog.set_level(logging.INFO, logger="millpond")
    backup = str(tmp_path / "backup")
    cfg = RecoveryConfig(tmp_path / "state", backup=backup, snapshot_mode=mode)
    # Every key changes in many epochs (the interval is 0: every batch is
    # an epoch), so the local store holds several versions of each key
    # until its GC runs; the abort leaves them for the next run.
    items: List[Any] = list(range(KEYS * 8)) + [TestingSource.ABORT()] + list(range(10))
    run_main(_flow(items, []), epoch_interval=timedelta(0), recovery_config=cfg)
    run_main(_flow(items, []), epoch_interval=timedelta(0), recovery_config=cfg)
    # A full resume rebuilds one row per key: keys, exactly.
    shutil.rmtree(tmp_path / "state" / "rr")
    run_main(_flow(items, []), epoch_interval=timedelta(0), recovery_config=cfg)
    fresh, fast, full = _restored(caplog)
    assert fresh == ("fresh", 0, "keys")
    # KEYS counters and the source's position.
    assert full == ("full", KEYS + 1, "keys") and _inspected_keys(backup) == KEYS + 1
    # After the abort the store may hold older versions (unless its
    # background GC caught up before the abort): then its rows are said
    # as rows, never passed off as keys; keys, when said, are exact.
    assert fast[0] == "fast"
    if fast[2] == "keys":
        assert fast[1] == KEYS + 1
    else:
        assert fast[1] >= KEYS + 1


def test_a_fast_resume_of_a_store_without_older_versions_reports_its_keys(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="millpond")
    backup = str(tmp_path / "backup")
    cfg = RecoveryConfig(tmp_path / "state", backup=backup)
    # One epoch that writes every key (2,000 of them): the local store takes
    # it as a new generation, one row per key, nothing to collect.
    items: List[Any] = list(range(2000)) + [TestingSource.EOF()] + [1]
    flow = Dataflow("rr")
    keyed = op.key_on("key", op.input("in", flow, TestingSource(items, batch_size=5000)), lambda x: f"k{x}")
    op.output("out", op.stateful_map("count", keyed, lambda n, _v: ((n or 0) + 1, 1)), TestingSink([]))
    run_main(flow, recovery_config=cfg)
    run_main(flow, recovery_config=cfg)
    assert _restored(caplog)[1] == ("fast", 2001, "keys") and _inspected_keys(backup) == 2001


def test_a_run_that_aborts_does_not_log_itself_finished(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="millpond")
    cfg = RecoveryConfig(tmp_path / "state")
    run_main(_flow([1, 2, TestingSource.ABORT(), 3], []), epoch_interval=timedelta(0), recovery_config=cfg)
    messages = [r.getMessage() for r in caplog.records if r.name == "millpond"]
    assert not any(" finished: " in m for m in messages), messages
    assert any("stopped early; committed epoch" in m for m in messages), messages


def test_a_run_that_fails_does_not_log_itself_finished(tmp_path, caplog):
    from millpond.errors import DataflowError

    caplog.set_level(logging.INFO, logger="millpond")
    flow = Dataflow("rr")
    keyed = op.key_on("key", op.input("in", flow, TestingSource([1, 2])), str)
    op.output("out", op.stateful_map("bad", keyed, lambda n, v: ((lambda: None), v)), TestingSink([]))
    with pytest.raises(DataflowError, match="cannot snapshot"):
        run_main(flow, recovery_config=RecoveryConfig(tmp_path / "state"))
    messages = [r.getMessage() for r in caplog.records if r.name == "millpond"]
    assert not any(" finished: " in m for m in messages), messages


@pytest.mark.parametrize(
    "counters, fraction",
    [
        (dict(bytes_done=0, bytes_total=100, rows_restored=0, rows_total=1000), 0.0),
        (dict(bytes_done=50, bytes_total=100, rows_restored=0, rows_total=1000), 0.25),
        # Every byte is in, no row loaded yet: half way, not full.
        (dict(bytes_done=100, bytes_total=100, rows_restored=0, rows_total=1000), 0.5),
        (dict(bytes_done=100, bytes_total=100, rows_restored=500, rows_total=1000), 0.75),
        (dict(bytes_done=100, bytes_total=100, rows_restored=1000, rows_total=1000), 1.0),
    ],
)
def test_the_restore_bar_is_full_only_when_the_rows_are_in(counters, fraction):
    assert RestoreProgress.fraction(counters) == pytest.approx(fraction)
