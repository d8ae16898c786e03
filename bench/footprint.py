"""Bytes on disk per byte of state (issue 13): the durable and the local
footprint of a flow against its live state, and the bytes uploaded per epoch.

The flow keeps N keys (20,000) of state, writes every key in its first
epoch, then changes 10% of the keys in each of E epochs (100) of one batch
each (``epoch_interval=timedelta(0)``), under the default
``RecoveryConfig(local_state_dir=..., backup=<dir>)`` unless a flag says
otherwise. Two state sizes: ~20 bytes (a 12-byte key and an int state,
which the store pickles in 8 bytes) and ~1 KB (a 12-byte key and 1,000
bytes of state, half random bytes and half text, so neither compression's
best nor its worst case).

It prints, after the run:

- live: the live state, the sum over keys of len(key) + len(pickled state);
- durable: every file under the backup directory;
- local: the local stores (store.sqlite and its -wal/-shm) under the local
  state directory;
- the ratios to live (at the end, and the largest seen while the run
  went, sampled every 50 ms), and what the run uploaded (segments and compacted
  objects, as stored) per epoch, from the run's finish line;
- where the local bytes go: per table and index of the local store, its
  pages, payload and unused bytes (SQLite's ``dbstat``).

    .venv/bin/python bench/footprint.py                    # both sizes, defaults
    .venv/bin/python bench/footprint.py --size 20 --retain-epochs 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import random
import re
import sqlite3
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Tuple

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.recovery import RecoveryConfig
from millpond.testing import TestingSink, TestingSource, run_main

FLOW = "footprint"


def _key(k: int) -> str:
    return f"user-{k:07d}"  # 12 bytes


def _value(size: int, rng: random.Random, k: int, epoch: int) -> Any:
    if size <= 20:
        return 1 << 20 | (epoch * 7919 + k) & 0xFFFF  # an int of 4 bytes: pickled in 8
    half = (size - 40) // 2
    text = (f"epoch={epoch} key={k} " * (half // 16 + 1))[:half]
    return rng.randbytes(half) + text.encode()


def _pickled(v: Any) -> int:
    if isinstance(v, int) and -(1 << 31) <= v < 1 << 31:
        return 8 if v >= 65536 or v < 0 else 5  # the store's small-int pickle (no frame)
    return len(pickle.dumps(v, pickle.HIGHEST_PROTOCOL))


def _batches(keys: int, epochs: int, size: int, changed: float) -> Tuple[List[List[Tuple[str, Any]]], Dict[str, Any]]:
    rng = random.Random(13)
    first = [(_key(k), _value(size, rng, k, 0)) for k in range(keys)]
    batches = [first]
    n = max(1, int(keys * changed))
    for e in range(1, epochs + 1):
        batches.append([(_key(k), _value(size, rng, k, e)) for k in rng.sample(range(keys), n)])
    final: Dict[str, Any] = {}
    for b in batches:
        final.update(b)
    return batches, final


def _flow(batches: List[List[Tuple[str, Any]]]) -> Dataflow:
    flow = Dataflow(FLOW)
    s = op.input("inp", flow, TestingSource(batches, batch_size=1))  # one batch, one epoch
    s = op.flat_map("items", s, lambda b: b)
    s = op.stateful_map("state", s, lambda st, v: (v, None))
    op.output("out", op.filter("none", s, lambda kv: kv[1] is not None), TestingSink([]))
    return flow


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _local_store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("store.sqlite*") if p.is_file())


def _local_breakdown(root: Path) -> Dict[str, Dict[str, int]]:
    """Where the local stores' bytes go, per table and index: pages, bytes
    of those pages, payload (what the rows themselves hold) and unused
    bytes, from SQLite's ``dbstat`` (read-only; the run is over)."""
    out: Dict[str, Dict[str, int]] = {}
    for path in sorted(root.rglob("store.sqlite")):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT name, count(*), sum(pgsize), sum(payload), sum(unused), sum(ncell) "
                               "FROM dbstat GROUP BY name").fetchall()
        except sqlite3.OperationalError as exc:  # a sqlite3 built without dbstat
            logging.getLogger(__name__).warning("no breakdown of %s: %s", path, exc)
            continue
        finally:
            con.close()
        for name, pages, size, payload, unused, cells in rows:
            t = out.setdefault(name, {"pages": 0, "bytes": 0, "payload": 0, "unused": 0, "cells": 0})
            for k, v in zip(("pages", "bytes", "payload", "unused", "cells"), (pages, size, payload, unused, cells)):
                t[k] += v
    return out


class _Peak(threading.Thread):
    """The largest durable and local footprint seen while the run goes."""

    def __init__(self, backup: Path, state: Path) -> None:
        super().__init__(daemon=True)
        self.backup, self.state = backup, state
        self.durable = self.local = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.durable = max(self.durable, _tree_bytes(self.backup))
                self.local = max(self.local, _local_store_bytes(self.state))
            except FileNotFoundError:
                pass  # a file went away while it was listed
            self.stop.wait(0.05)


class _FinishLine(logging.Handler):
    """Keeps the run's finish line (the bytes it uploaded)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if " finished: committed epoch " in msg:
            self.line = msg


def _uploaded(line: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    m = re.search(r"(\d+) segments \((\d+) bytes", line)
    if m:
        out["segments"], out["segment_bytes"] = int(m.group(1)), int(m.group(2))
    m = re.search(r"(\d+) bytes before compression; (\d+) compacted objects \((\d+) bytes, (\d+) before", line)
    if m:
        out["segment_raw_bytes"] = int(m.group(1))
        out["compacted"], out["compacted_bytes"], out["compacted_raw_bytes"] = map(int, m.group(2, 3, 4))
    m = re.search(r"(\d+) bytes uploaded in all", line)
    if m:
        out["uploaded_bytes"] = int(m.group(1))
    return out


def measure(size: int, keys: int, epochs: int, changed: float, retain: int | None,
            compact_min_bytes: int | None = None) -> Dict[str, Any]:
    batches, final = _batches(keys, epochs, size, changed)
    live = sum(len(k) + _pickled(v) for k, v in final.items())
    with tempfile.TemporaryDirectory(prefix="mp-footprint-") as tmp:
        root = Path(tmp)
        (root / "state").mkdir()
        kw: Dict[str, Any] = {} if retain is None else {"retain_epochs": retain}
        if compact_min_bytes is not None:
            kw["compact_min_bytes"] = compact_min_bytes
        cfg = RecoveryConfig(root / "state", backup=str(root / "backup"), **kw)
        handler = _FinishLine()
        log = logging.getLogger("millpond")
        log.addHandler(handler)
        old = log.level
        log.setLevel(logging.INFO)
        peak = _Peak(root / "backup", root / "state")
        peak.start()
        t0 = time.perf_counter()
        try:
            run_main(_flow(batches), epoch_interval=timedelta(0), recovery_config=cfg)
        finally:
            peak.stop.set()
            peak.join()
            log.removeHandler(handler)
            log.setLevel(old)
        seconds = time.perf_counter() - t0
        durable = _tree_bytes(root / "backup")
        by_dir = {d.name: _tree_bytes(d) for d in sorted((root / "backup" / FLOW).iterdir())}
        local = _local_store_bytes(root / "state")
        breakdown = _local_breakdown(root / "state")
    up = _uploaded(handler.line)
    total_epochs = epochs + 1
    res: Dict[str, Any] = {
        "state_bytes": size, "keys": keys, "epochs": total_epochs, "retain_epochs": cfg.retain_epochs,
        "compact_min_bytes": cfg.compact_min_bytes,
        "live_bytes": live, "durable_bytes": durable, "local_bytes": local,
        "durable_ratio": round(durable / live, 2), "local_ratio": round(local / live, 2),
        "peak_durable_ratio": round(max(peak.durable, durable) / live, 2),
        "peak_local_ratio": round(max(peak.local, local) / live, 2),
        "durable_by_dir": by_dir, "local_by_table": breakdown, "seconds": round(seconds, 1), **up,
    }
    if "segment_bytes" in up:
        res["segment_bytes_per_epoch"] = up["segment_bytes"] // total_epochs
    if "uploaded_bytes" in up:
        res["uploaded_bytes_per_epoch"] = up["uploaded_bytes"] // total_epochs
        res["raw_bytes_per_epoch"] = (up["segment_raw_bytes"] + up["compacted_raw_bytes"]) // total_epochs
    res["finish_line"] = handler.line
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, action="append", help="state bytes (20 or 1000); both by default")
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--epochs", type=int, default=100, help="epochs of changes after the first")
    ap.add_argument("--changed", type=float, default=0.1, help="share of keys changed per epoch")
    ap.add_argument("--retain-epochs", type=int, default=None, help="default: RecoveryConfig's")
    ap.add_argument("--compact-min-bytes", type=int, default=None, help="default: RecoveryConfig's")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results = []
    for size in args.size or [20, 1000]:
        r = measure(size, args.keys, args.epochs, args.changed, args.retain_epochs, args.compact_min_bytes)
        results.append(r)
        print(f"state ~{size} B, {r['keys']} keys, {r['epochs']} epochs, retain_epochs={r['retain_epochs']}, "
              f"compact_min_bytes={r['compact_min_bytes']}: "
              f"live {r['live_bytes']:,} B; durable {r['durable_bytes']:,} B ({r['durable_ratio']}x); "
              f"local {r['local_bytes']:,} B ({r['local_ratio']}x); "
              f"peak while running: durable {r['peak_durable_ratio']}x, local {r['peak_local_ratio']}x; {r['seconds']} s")
        per = {k: v for k, v in r.items() if k.endswith("per_epoch")}
        print(f"  durable by directory: {r['durable_by_dir']}")
        for name, t in sorted(r["local_by_table"].items(), key=lambda kv: -kv[1]["bytes"]):
            if t["payload"]:
                print(f"  local {name}: {t['bytes']:,} B in {t['pages']} pages, {t['cells']:,} cells, "
                      f"payload {t['payload']:,} B ({t['payload'] / max(1, t['cells']):.1f} B a cell), "
                      f"{t['unused'] / max(1, t['bytes']):.0%} unused")
        print(f"  uploaded: {per}  [{r['finish_line']}]")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
