"""Snapshot write and restore: millpond's StateStore against a plain sqlite3 baseline.

Measures, in one process and one run:

1. a full snapshot of N keys (all dirty) of ~100-byte pickled state;
2. snapshots with 1% of the keys dirty, over several epochs (median);
3. a restore of every key (read, unpickle, rebuild the live objects).

The baseline writes the same rows with Python's stdlib ``sqlite3``: one
table, upsert by key in arrival order, batched transactions, WAL with
synchronous=NORMAL (the same durability as the local store), and restores
them with one SELECT. Ratios are what to read: this machine is noisy.

    python bench/snapshot_write.py            # 1,000,000 keys
    python bench/snapshot_write.py --keys 200000 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from millpond.state import StateStore

FLOW = "bench"
STEP = "bench.state"
LABEL = "w" * 80
DIRTY_ROUNDS = 5
EPOCH_INTERVAL = 1.0  # seconds between the 1%-dirty snapshots (not timed)


class Account:
    """A state object whose pickled snapshot is about 100 bytes."""

    __slots__ = ("state",)

    def __init__(self, resume_state):
        self.state = resume_state

    def snapshot(self):
        return self.state


def make_keys(n: int, seed: int) -> list[str]:
    keys = [f"user-{i:08d}" for i in range(n)]
    random.Random(seed).shuffle(keys)  # arrival order is not key order
    return keys


def bench_millpond(keys: list[str], dirty: list[str], root: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    store = StateStore.open(root, FLOW)
    store.register(STEP, Account)
    for i, k in enumerate(keys):
        store.get_or_build(STEP, k).state = (i, LABEL)
    gc.collect()
    t0 = time.perf_counter()
    rows = store.snapshot(1)
    out["full_s"] = time.perf_counter() - t0
    out["full_python_s"] = store.last_snapshot_timing["python"]
    out["full_go_s"] = store.last_snapshot_timing["go"]
    assert rows == len(keys), rows
    # Several 1%-dirty epochs, as a running flow would have them: spaced by
    # a 1 s epoch interval (not timed), so background work of the previous
    # epoch (the WAL checkpoint after the full snapshot) has had its time,
    # as it would in a flow. The median is the figure; the first one is
    # printed as well.
    times, py_times, go_times = [], [], []
    for epoch in range(2, 2 + DIRTY_ROUNDS):
        time.sleep(EPOCH_INTERVAL)
        for k in dirty:
            acc = store.get(STEP, k)
            acc.state = (acc.state[0] + 1, LABEL)
        t0 = time.perf_counter()
        rows = store.snapshot(epoch)
        times.append(time.perf_counter() - t0)
        py_times.append(store.last_snapshot_timing["python"])
        go_times.append(store.last_snapshot_timing["go"])
        assert rows == len(dirty), rows
    out["dirty_first_s"] = times[0]
    out["dirty_s"] = statistics.median(times)
    out["dirty_python_s"] = statistics.median(py_times)
    out["dirty_go_s"] = statistics.median(go_times)
    out["file_bytes"] = float(store.path.stat().st_size)
    store.close()
    del store
    gc.collect()

    t0 = time.perf_counter()
    store = StateStore.open(root, FLOW, resume_epoch=2 + DIRTY_ROUNDS)
    store.register(STEP, Account)
    restored = store.hydrate_all(STEP)
    out["restore_s"] = time.perf_counter() - t0
    assert restored == len(keys), restored
    probe = dirty[0]
    assert store.get(STEP, probe).state[0] == keys.index(probe) + DIRTY_ROUNDS
    store.close()
    return out


def bench_baseline(keys: list[str], dirty: list[str], root: Path, batch: int = 10_000) -> dict[str, float]:
    out: dict[str, float] = {}
    path = root / "baseline.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE state (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
    upsert = "INSERT INTO state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
    live = {k: Account((i, LABEL)) for i, k in enumerate(keys)}
    dumps = pickle.dumps
    proto = pickle.HIGHEST_PROTOCOL

    def write(which: list[str]) -> None:
        for start in range(0, len(which), batch):
            chunk = which[start:start + batch]
            db.execute("BEGIN")
            db.executemany(upsert, [(k, dumps(live[k].snapshot(), proto)) for k in chunk])
            db.execute("COMMIT")

    gc.collect()
    t0 = time.perf_counter()
    write(keys)
    out["full_s"] = time.perf_counter() - t0
    times = []
    for epoch in range(2, 2 + DIRTY_ROUNDS):
        time.sleep(EPOCH_INTERVAL)
        for k in dirty:
            acc = live[k]
            acc.state = (acc.state[0] + 1, LABEL)
        t0 = time.perf_counter()
        write(dirty)
        times.append(time.perf_counter() - t0)
    out["dirty_first_s"] = times[0]
    out["dirty_s"] = statistics.median(times)
    db.close()
    del live
    gc.collect()

    def restore() -> float:
        t0 = time.perf_counter()
        db = sqlite3.connect(path)
        loads = pickle.loads
        restored = {k: Account(loads(v)) for k, v in db.execute("SELECT key, value FROM state")}
        elapsed = time.perf_counter() - t0
        assert len(restored) == len(keys)
        db.close()
        return elapsed

    out["restore_s"] = restore()
    gc.collect()
    # Not the target's baseline, shown so the reader can tell how much of
    # millpond's lead comes from holding off the cyclic collector (which
    # hydrate_all does): the same loop with it off.
    gc.disable()
    try:
        out["restore_nogc_s"] = restore()
    finally:
        gc.enable()
    gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="number of keys (default 1,000,000)")
    ap.add_argument("--dirty", type=float, default=0.01, help="fraction dirty in the second snapshot")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)

    keys = make_keys(args.keys, args.seed)
    dirty = random.Random(args.seed + 1).sample(keys, max(1, int(len(keys) * args.dirty)))
    sample = len(pickle.dumps((1, LABEL), pickle.HIGHEST_PROTOCOL))
    print(f"snapshot_write: {len(keys):,} keys, {len(dirty):,} dirty, pickled state {sample} bytes")

    with tempfile.TemporaryDirectory(prefix="mp-bench-") as tmp:
        base = bench_baseline(keys, dirty, Path(tmp))
    with tempfile.TemporaryDirectory(prefix="mp-bench-") as tmp:
        mp = bench_millpond(keys, dirty, Path(tmp))

    n, d = len(keys), len(dirty)
    full_ratio = base["full_s"] / mp["full_s"]
    dirty_speedup = mp["full_s"] / mp["dirty_s"]
    restore_ratio = base["restore_s"] / mp["restore_s"]
    print(f"{'':28}{'millpond':>14}{'sqlite3 baseline':>18}")
    print(f"{'full snapshot (rows/s)':28}{n / mp['full_s']:>14,.0f}{n / base['full_s']:>18,.0f}")
    print(f"{'  seconds':28}{mp['full_s']:>14.3f}{base['full_s']:>18.3f}")
    print(f"{'  python side / go side (s)':28}{mp['full_python_s']:>7.3f}/{mp['full_go_s']:<6.3f}")
    print(f"{'1% dirty snapshot, median (s)':28}{mp['dirty_s']:>14.4f}{base['dirty_s']:>18.4f}")
    print(f"{'  first':28}{mp['dirty_first_s']:>14.4f}{base['dirty_first_s']:>18.4f}")
    print(f"{'  python side / go side (s)':28}{mp['dirty_python_s']:>7.4f}/{mp['dirty_go_s']:<6.4f}")
    print(f"{'restore all keys (s)':28}{mp['restore_s']:>14.3f}{base['restore_s']:>18.3f}")
    print(f"{'restore (keys/s)':28}{n / mp['restore_s']:>14,.0f}{n / base['restore_s']:>18,.0f}")
    print()
    print(f"full snapshot vs baseline:   {full_ratio:6.2f}x   (target >= 3x)")
    print(f"1%-dirty vs full snapshot:   {dirty_speedup:6.1f}x   (target >= 50x)")
    print(f"restore vs baseline:         {restore_ratio:6.2f}x   (target >= 1.5x)")
    print(f"  (vs the baseline loop run with the cyclic collector off, as hydrate_all runs: "
          f"{base['restore_nogc_s'] / mp['restore_s']:.2f}x, {base['restore_nogc_s']:.3f} s)")
    if args.json:
        args.json.write_text(json.dumps({"keys": n, "dirty": d, "millpond": mp, "baseline": base,
                                         "full_ratio": full_ratio, "dirty_speedup": dirty_speedup,
                                         "restore_ratio": restore_ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
