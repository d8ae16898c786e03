"""Whole-state epochs: untouched keys copied from kept pickles, against packing them again.

In batch mode an epoch that touched at least half of a worker's keys is
topped up to the whole state (docs/recovery.md). Since ``bd7057d`` the
untouched keys are written from the pickles the store kept of them; this
benchmark measures what that saves, in one process: the same store
workload with pickles kept (the default) and with nothing kept
(``KEEP_PICKLES_BYTES = 0``, the packing of every key that came before),
in alternating rounds.

Each round opens a store, makes ``--keys`` keys, then runs ``--epochs``
epochs that each touch ``--share`` of the keys at random (changing them)
and snapshot, and reports the snapshot's packing time per row (the Python
and C side the flow's thread pays; the write itself is the Go core's).
States:

- ``window``: the windowing operator's per-key state (``count_window``
  over 1-minute event-time tumbling windows, one item applied per touch:
  a clock, a window and a buffered item with its datetime, about 190
  bytes pickled), as in ``bench/windowing.py``;
- ``int``: an int counter (a word count's state).

    python bench/topup.py                          # window states, 100k keys, 60% touched
    python bench/topup.py --state int --share 1.0  # every key touched: nothing is kept
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List

import millpond.state as state_mod
from millpond.state import StateStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
import windowing as W  # noqa: E402  (bench/windowing.py: the same items and clock)

STEP = "topup"


class Counter:
    __slots__ = ("n",)

    def __init__(self, resume: Any) -> None:
        self.n = resume or 0

    def snapshot(self) -> int:
        return self.n


def window_builder() -> Callable[[Any], Any]:
    import millpond.operators.windowing as win
    from millpond.operators.windowing.ops import _FoldWindowLogic, _WindowStep

    clock = win.EventClock(W._ts, wait_for_system_duration=timedelta(seconds=10), now_getter=W._frozen_now,
                           to_system_utc=W._no_wakeup)
    windower = win.TumblingWindower(length=timedelta(minutes=1), align_to=W.BASE)

    def logic(resume: Any) -> Any:
        return _FoldWindowLogic(W._add, W._merge, 0 if resume is None else resume)

    return lambda resume: _WindowStep(clock, windower, logic, True, resume)


def one_round(kind: str, keys: int, epochs: int, share: float, keep: bool, seed: int) -> Dict[str, float]:
    saved = state_mod.KEEP_PICKLES_BYTES
    state_mod.KEEP_PICKLES_BYTES = saved if keep else 0
    root = Path(tempfile.mkdtemp(prefix="mp-topup-"))
    rng = random.Random(seed)
    names = [f"k{i:06d}" for i in range(keys)]
    items = W.make_items(keys * (epochs + 1), keys, seed)
    it = iter(items)
    try:
        store = StateStore.open(root, "topup")
        store.register(STEP, window_builder() if kind == "window" else Counter)
        store.whole_from = 0.5

        def touch(key: str) -> None:
            obj = store.get_or_build(STEP, key)
            if kind == "window":
                item = next(it)
                obj.on_batch([(key, item[1], item[2])])
            else:
                obj.n += 1

        for key in names:
            touch(key)
        store.snapshot(1)
        per_row: List[float] = []
        copied = 0
        for epoch in range(2, epochs + 2):
            for key in rng.sample(names, int(share * keys)):
                touch(key)
            gc.collect()
            rows = store.snapshot(epoch)
            per_row.append(store.last_snapshot_timing["python"] / rows * 1e6)
            copied += store.last_snapshot_reused
        store.close()
        return {"us_per_row": statistics.median(per_row), "copied_share": copied / (epochs * keys)}
    finally:
        state_mod.KEEP_PICKLES_BYTES = saved
        shutil.rmtree(root, ignore_errors=True)


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", choices=("window", "int"), default="window")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--share", type=float, default=0.6, help="share of the keys each epoch touches (default 0.6)")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"top-up: {args.keys:,} {args.state} states, {args.share:.0%} touched an epoch, {args.epochs} epochs, "
          f"{args.rounds} rounds", flush=True)
    res: Dict[bool, List[float]] = {True: [], False: []}
    for rnd in range(args.rounds):
        for keep in ((False, True) if rnd % 2 == 0 else (True, False)):
            r = one_round(args.state, args.keys, args.epochs, args.share, keep, seed=rnd)
            res[keep].append(r["us_per_row"])
            print(f"  round {rnd + 1} {'kept pickles' if keep else 'packed again':<13} "
                  f"{r['us_per_row']:.3f} us a row packed ({r['copied_share']:.0%} of rows copied)", flush=True)
    base, kept = statistics.median(res[False]), statistics.median(res[True])
    ratios = [b / k for b, k in zip(res[False], res[True])]
    print(f"median: packed again {base:.3f} us a row, kept pickles {kept:.3f}: "
          f"{statistics.median(ratios):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
