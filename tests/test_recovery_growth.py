"""Bounded growth: 120 epochs in which 10% of 3000 keys change leave a
durable footprint of at most 3x a compacted snapshot of the live state, and
a local store of about 2x a freshly written one.

Retention is the minimum (retain_epochs=1), as in the test at scale: the
bound is on the pipeline's own overhead, not on history a user keeps.

The reference sizes come from a run that writes the same final state in a
single epoch: its first segment is the serialized live state, its local
store a compact local store of that state. A sampler thread records the
largest sizes seen while the run is going, so growth that a clean stop
hides (an unbounded write-ahead log) shows too.

The last test runs bench/footprint.py's small-state case at the default
settings, which were chosen for it.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.testing import TestingSink, TestingSource, run_main

pytestmark = pytest.mark.slow  # a crash loop or a long run: skipped by `make test-fast`

N_KEYS = 3000
CHANGED = N_KEYS // 10
EPOCHS = 110
PACE = 0.02  # seconds per epoch of user work, so background compaction keeps pace as with real epoch intervals


def _flow(items: List[Tuple[str, str]], batch: int) -> Dataflow:
    flow = Dataflow("grow")
    s = op.input("inp", flow, TestingSource(items, batch_size=batch))

    def pace(x):
        if x[0] == "key000000":  # once per epoch: key 0 changes in every epoch
            time.sleep(PACE)
        return x

    s = op.stateful_map("state", op.map("pace", s, pace), lambda st, v: (v, None))
    op.output("out", op.filter("none", s, lambda kv: kv[1] is not None), TestingSink([]))
    return flow


def _items() -> Tuple[List[Tuple[str, str]], Dict[str, str]]:
    rng = random.Random(7)
    items = [(f"key{k:06d}", f"v0-{k}-" + "x" * 40) for k in range(N_KEYS)]
    for e in range(EPOCHS):
        for k in [0, *rng.sample(range(1, N_KEYS), CHANGED - 1)]:
            items.append((f"key{k:06d}", f"v{e + 1}-{k}-" + "y" * 40))
    return items, dict(items)


class _Sampler(threading.Thread):
    """Largest total bytes under each root, and per file pattern, while running."""

    def __init__(self, roots: Dict[str, Path]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.peak: Dict[str, int] = {name: 0 for name in roots}
        self.files: Dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for name, root in self.roots.items():
                total = 0
                for dirpath, _dirs, files in os.walk(root):
                    for f in files:
                        path = os.path.join(dirpath, f)
                        try:
                            size = os.stat(path).st_size
                        except FileNotFoundError:
                            continue
                        total += size
                        pattern = name + ":" + re.sub(r"\d+", "N", os.path.relpath(path, root))
                        self.files[pattern] = max(self.files.get(pattern, 0), size)
                self.peak[name] = max(self.peak[name], total)
            self.stop.wait(0.01)


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _local_store_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.rglob("store.sqlite*") if p.is_file())


@pytest.fixture(scope="module")
def growth(tmp_path_factory) -> Dict[str, Any]:
    items, final = _items()
    ref = tmp_path_factory.mktemp("ref")
    (ref / "state").mkdir()
    run_main(_flow(sorted(final.items()), len(final)), epoch_interval=timedelta(0),
             recovery_config=RecoveryConfig(ref / "state", backup=str(ref / "backup")))
    # The oldest commit record holds the segment of the one epoch that wrote
    # the final state (a record may cover the end-of-input epoch as well,
    # when both finished together, so it is not always numbered 1).
    records = sorted((ref / "backup" / "grow" / "commits").iterdir())
    first = json.loads(records[0].read_text())
    live = max(first["objects"], key=lambda o: o["rows"])
    assert live["rows"] >= N_KEYS

    d = tmp_path_factory.mktemp("grow")
    (d / "state").mkdir()
    cfg = RecoveryConfig(d / "state", backup=str(d / "backup"), snapshot_mode=SnapshotMode.BATCH,
                         retain_epochs=1, compact_min_bytes=64 << 10, compact_ratio=0.5)
    sampler = _Sampler({"backup": d / "backup", "local": d / "state"})
    sampler.start()
    try:
        run_main(_flow(items, CHANGED), epoch_interval=timedelta(0), recovery_config=cfg)
    finally:
        sampler.stop.set()
        sampler.join()
    return {
        "live_bytes": live["size"],
        # the live state itself: key and pickled state of every key
        "state_bytes": sum(len(k) + len(pickle.dumps(v, pickle.HIGHEST_PROTOCOL)) for k, v in final.items()),
        "fresh_local_bytes": _local_store_bytes(ref / "state"),
        "backup_bytes": _tree_bytes(d / "backup"),
        "local_bytes": _local_store_bytes(d / "state"),
        "peak": sampler.peak,
        "files": sampler.files,
        "dir": d,
        "final": final,
    }


def test_durable_footprint_is_at_most_3x_the_live_state(growth):
    ratio = growth["backup_bytes"] / growth["live_bytes"]
    assert ratio <= 3.0, (growth["backup_bytes"], growth["live_bytes"], growth["peak"])


def test_durable_footprint_is_bounded_by_the_bytes_of_the_state(growth):
    # Objects are stored compressed (zstd), so the backup is bounded by the
    # state's own bytes (key + pickled state of every key), not by SQLite's
    # files of it (issue 13): 0.5x after the run and 1.2x at its largest
    # while running, in a clean-clone run.
    state = growth["state_bytes"]
    assert growth["backup_bytes"] <= 1.0 * state, (growth["backup_bytes"], state, growth["peak"])
    assert growth["peak"]["backup"] <= 2.0 * state, (growth["peak"], state)


def test_compacted_state_restores_to_the_final_state(growth):
    # one more run over probe items reads every key's state back (a full resume)
    import shutil

    d = growth["dir"]
    shutil.rmtree(d / "state")
    (d / "state").mkdir()
    out: List[Any] = []
    flow = Dataflow("grow")
    keys = sorted(growth["final"])
    # the input resumes after the items of the growth run and reads the probes
    s = op.input("inp", flow, TestingSource([*_items()[0], *[(k, None) for k in keys]], batch_size=CHANGED))
    s = op.stateful_map("state", op.map("pace", s, lambda x: x), lambda st, v: (st if v is None else v, st))
    op.output("out", s, TestingSink(out))
    run_main(flow, epoch_interval=timedelta(0),
             recovery_config=RecoveryConfig(d / "state", backup=str(d / "backup"), retain_epochs=1))
    assert dict(out) == growth["final"]


def test_local_store_after_the_run_is_about_2x_a_fresh_one(growth):
    # About 2x on a quiet machine (1.6-2.1x), 1.8-2.5x with both cores
    # busy. Finish stops a maintenance round that is still running (the
    # next run collects in the background), so the superseded rows of the
    # last few epochs may be left: a CI run with its test lanes in
    # parallel saw 3.05x. Without local GC the store would hold every
    # version of 110 epochs at 10% churn (over 10x), which 4x still tells
    # apart; the bound while running is
    # test_local_store_stays_bounded_while_running's.
    assert growth["local_bytes"] <= 4.0 * growth["fresh_local_bytes"], (growth["local_bytes"], growth["fresh_local_bytes"])


PAGE = 4096  # the local store's page size


def test_local_store_stays_bounded_while_running(growth):
    # The checkpoint policy lets the WAL reach about the size of the file
    # before the writer folds it back itself, and the writes around that
    # moment (an epoch's pages, a GC round, a fold of the write buffer) come
    # on top; in a clean-clone run the peak was 3.1x a fresh store. While a
    # checkpoint copies (slow when the disk is shared) the writer cannot
    # truncate, so the WAL grows by what is written meanwhile: 8.3x in a CI
    # run with three test lanes at once. A WAL that is never checkpointed
    # holds every epoch's pages: 170x here.
    wal = growth["files"].get("local:grow/worker-N/store.sqlite-wal", 0)
    unbounded = EPOCHS * CHANGED * PAGE // 2
    assert wal <= 16 * growth["fresh_local_bytes"] < unbounded // 4, (wal, growth["fresh_local_bytes"], unbounded)


# -- the default settings, small states ------------------------------------------

SMALL_KEYS = 20_000
SMALL_EPOCHS = 100


def test_default_settings_keep_small_states_within_about_2x(tmp_path: Path) -> None:
    """bench/footprint.py's 20-byte case at the defaults (2 retained epochs,
    compaction from 256 KiB): the durable footprint after 100 epochs that
    each change 10% of 20,000 keys stays near 2x the live state (issue
    13's target), and bounded while running. With the defaults before (10
    epochs, 1 MiB) four runs of this test ended at 2.55-2.96x and peaked at
    5.9-6.4x: all failed."""
    rng = random.Random(13)
    keys = [f"user-{k:07d}" for k in range(SMALL_KEYS)]
    # Every key first (ten epochs of a batch each), then 100 epochs that
    # change a tenth of them.
    items = [(k, 1 << 20 | i) for i, k in enumerate(keys)]
    for e in range(1, SMALL_EPOCHS + 1):
        changed = rng.sample(range(SMALL_KEYS), SMALL_KEYS // 10)
        items += [(keys[k], 1 << 20 | (e * 7919 + k) & 0xFFFF) for k in changed]
    final = dict(items)
    # The store pickles these ints in 8 bytes (its small-int form).
    live = sum(len(k) + 8 for k in final)
    (tmp_path / "state").mkdir()
    sampler = _Sampler({"backup": tmp_path / "backup"})
    sampler.start()
    try:
        run_main(_flow(items, SMALL_KEYS // 10), epoch_interval=timedelta(0),
                 recovery_config=RecoveryConfig(tmp_path / "state", backup=str(tmp_path / "backup")))
    finally:
        sampler.stop.set()
        sampler.join()
    end = _tree_bytes(tmp_path / "backup")
    # Bounds with room for a slow machine, where maintenance lags: six runs
    # here ended at 1.10-1.58x and peaked at 3.0-4.6x.
    assert end <= 2.5 * live, (end, live, sampler.peak)
    assert sampler.peak["backup"] <= 6.0 * live, (sampler.peak, live)
