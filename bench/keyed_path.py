"""A keyed step's own cost on the flow's thread: routing, queueing, snapshots.

One child process per run (``sys.executable`` running this file with
``child``; never a fork), each a word count in one process through
``millpond.testing.cluster_main``: lines of 10 words (100k distinct,
seeded), ``flat_map(split)``, ``key_on``, ``stateful_map`` (a running
count), a sink that drops its items. Printed per run: seconds, the
process's CPU seconds and the flow thread's; with ``--recovery``
(``RecoveryConfig`` with a backup directory, 1 s epochs) also the
snapshots' seconds on the flow's thread, split into packing (Python
objects to rows, in C) and the hand-off to the Go core, per row.

Runs alternate between the worker counts given, ``--rounds`` times, so
builds can be compared in the same session by running this file under
each (``PYTHONPATH=<copy of pysrc> python bench/keyed_path.py``).

    .venv/bin/python bench/keyed_path.py                       # 2M words, 1 and 2 workers, 3 rounds
    .venv/bin/python bench/keyed_path.py --workers 1 --recovery --lines 300000
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

VOCAB = 100_000
WORDS_PER_LINE = 10


def _lines(n: int, seed: int = 7) -> List[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(VOCAB)]
    return [" ".join(rng.choice(vocab) for _ in range(WORDS_PER_LINE)) for _ in range(n)]


def child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Run one word count as ``spec`` says; return its figures."""
    import millpond.operators as op
    from millpond import state as statemod
    from millpond.dataflow import Dataflow
    from millpond.outputs import DynamicSink, StatelessSinkPartition
    from millpond.recovery import RecoveryConfig
    from millpond.testing import TestingSource, cluster_main

    snaps: Counter[str] = Counter()
    original = statemod.StateStore.snapshot

    def timed(store: Any, epoch: int) -> int:
        rows = original(store, epoch)
        snaps["rows"] += rows
        snaps["pack_s"] += store.last_snapshot_timing["python"]
        snaps["handoff_s"] += store.last_snapshot_timing["go"]
        return rows

    setattr(statemod.StateStore, "snapshot", timed)  # timed per call, for this run only

    class Drop(StatelessSinkPartition[Any]):
        def write_batch(self, items: List[Any]) -> None:
            pass

    class Sink(DynamicSink[Any]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Drop:
            return Drop()

    flow = Dataflow("keyed_path")
    s = op.input("in", flow, TestingSource(_lines(spec["lines"]), batch_size=100))
    words = op.flat_map("split", s, str.split)
    keyed = op.key_on("key", words, lambda w: w)
    counts = op.stateful_map("count", keyed, lambda st, v: ((st or 0) + 1, (st or 0) + 1))
    op.output("out", counts, Sink())
    with tempfile.TemporaryDirectory(prefix="mp-keyed-") as tmp:
        cfg = RecoveryConfig(Path(tmp) / "state", backup=str(Path(tmp) / "backup")) if spec["recovery"] else None
        t0, c0, f0 = time.perf_counter(), time.process_time(), time.thread_time()
        cluster_main(flow, [], 0, worker_count_per_proc=spec["workers"], recovery_config=cfg,
                     epoch_interval=timedelta(seconds=1))
        out: Dict[str, Any] = {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                               "flow_thread_cpu_s": time.thread_time() - f0}
    out.update(snaps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000, help=f"lines of {WORDS_PER_LINE} words (default 200,000)")
    ap.add_argument("--workers", type=int, action="append", help="worker counts to alternate (default 1 and 2)")
    ap.add_argument("--recovery", action="store_true", help="recovery on (batch mode, 1 s epochs, a backup dir)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    words = args.lines * WORDS_PER_LINE
    print(f"keyed_path: {words:,} words over {VOCAB:,} keys, recovery {'on' if args.recovery else 'off'}")
    for r in range(args.rounds):
        for workers in args.workers or [1, 2]:
            spec = {"lines": args.lines, "workers": workers, "recovery": args.recovery}
            got = subprocess.run([sys.executable, __file__, "child", json.dumps(spec)], check=True,
                                 capture_output=True, text=True)
            res = json.loads(got.stdout.strip().splitlines()[-1])
            line = (f"  round {r + 1}, {workers} worker(s): {res['seconds']:.2f} s, CPU {res['cpu_s']:.2f} s, "
                    f"flow thread {res['flow_thread_cpu_s']:.2f} s ({res['seconds'] / words * 1e6:.2f} us a word)")
            if res.get("rows"):
                line += (f"; snapshots {res['rows']:,} rows: packing {res['pack_s']:.2f} s "
                         f"({res['pack_s'] / res['rows'] * 1e6:.2f} us a row), hand-off {res['handoff_s']:.2f} s "
                         f"({res['handoff_s'] / res['rows'] * 1e6:.2f} us a row)")
            print(line, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        main()
