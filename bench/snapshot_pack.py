"""What packing a snapshot costs a row, on the flow's thread (issue 14).

A snapshot calls ``.snapshot()`` on every touched key and pickles the result
(``pybindings/snapshot.c``). Its cost is mostly waiting on memory: a key's
objects are spread over the heap, allocated as its items came, and the
keys come in the order the epoch first touched them. Two measurements:

1. **windowing**: the flow of ``bench/windowing.py`` (``tumbling`` or
   ``session``, 1M items over 100k keys, recovery on, 1 s epochs) runs in
   this process; at each of its epochs 5-14 the epoch's touched keys are
   packed and written twice more before the real snapshot, once keeping
   each key's pickle for later top-ups and once not (the order alternates
   between epochs; the rows are rewritten by the real snapshot at the same
   epoch). It prints the median microseconds a row of each.
2. **synthetic**: 100k keys whose states are a windowing key's snapshot
   tuple, made in key order; 16 snapshots of 45k keys each, sampled at
   random or (the baseline: memory read in the order it was allocated) in
   key order; keeping on and off alternate. Then the same with states
   that are ints (a word count's), where packing is little more than the
   walk itself.

Compare builds by running it with each build's ``_core`` (copy the built
``.so`` aside, rebuild, run again); compare the figures of one run with
each other for what keeping pickles and the order of the keys cost.

    .venv/bin/python bench/snapshot_pack.py                     # both flows and the synthetic
    .venv/bin/python bench/snapshot_pack.py --only synthetic
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "pysrc"))

from millpond.recovery import RecoveryConfig  # noqa: E402
from millpond.state import StateStore  # noqa: E402
from millpond.testing import run_main  # noqa: E402

STEP = "step"


def _median(xs: List[float]) -> str:
    return f"{statistics.median(xs):5.2f} us/row (of {len(xs)}: {min(xs):.2f}-{max(xs):.2f})"


def windowing(kind: str) -> Dict[bool, List[float]]:
    """Per-row pack times of the epochs 5-14 of the windowing flow ``kind``,
    keeping pickles (True) and not (False)."""
    import windowing as flows

    res: Dict[bool, List[float]] = {False: [], True: []}
    real = StateStore.snapshot

    def snapshot(store: StateStore, epoch: int) -> int:
        if 5 <= epoch <= 14:
            for keep in ((False, True) if epoch % 2 else (True, False)):
                rows, pack_s, _ = store._write(epoch, store._dirty, False, keep)
                if rows:
                    res[keep].append(pack_s / rows * 1e6)
        return real(store, epoch)

    StateStore.snapshot = snapshot  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="mp-bench-pack-") as d:
            flow = flows.get_flow("millpond", kind, 1_000_000, 100_000)
            run_main(flow, epoch_interval=timedelta(seconds=1),
                     recovery_config=RecoveryConfig(local_state_dir=Path(d) / "state"))
    finally:
        StateStore.snapshot = real  # type: ignore[method-assign]
    return res


class _State:
    __slots__ = ("s",)

    def __init__(self, s: Any) -> None:
        self.s = s

    def snapshot(self) -> Any:
        return self.s


def synthetic(tiny: bool, keys: int = 100_000, touched: int = 45_000, rounds: int = 16) -> Dict[str, List[float]]:
    """Per-row pack times of random and key-ordered samples of a store of
    windowing-like states (``tiny``: of ints), keeping pickles and not."""
    at = datetime(2024, 3, 1, tzinfo=timezone.utc)
    res: Dict[str, List[float]] = {}
    with tempfile.TemporaryDirectory(prefix="mp-bench-pack-") as d:
        store = StateStore.open(d, "bench_pack")
        store.register(STEP, _State)
        names = [f"k{i:06d}" for i in range(keys)]
        for i, k in enumerate(names):
            if tiny:
                store.set(STEP, k, _State(i))
                continue
            store.set(STEP, k, _State((2, (1709251738085000 + i, 1709251200000000, 1709251728085000), None,
                                       ((8, 1709251680000000, 1709251740000000, (), i % 7),),
                                       ((1709251738085000, 4, (k, at, 17)),), 5)))
        store.snapshot(1)
        rng = random.Random(14)
        epoch = 2
        for order in ("random", "key order"):
            for r in range(rounds):
                for keep in ((True, False) if r % 2 else (False, True)):
                    sample = rng.sample(names, touched)
                    if order == "key order":
                        sample.sort()
                    rows, pack_s, _ = store._write(epoch, {STEP: dict.fromkeys(sample)}, False, keep)
                    epoch += 1
                    res.setdefault(f"{order}, {'keeping' if keep else 'not keeping'}", []).append(
                        pack_s / rows * 1e6)
        store.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="tumbling,session,synthetic",
                    help="comma-separated subset of tumbling, session, synthetic")
    args = ap.parse_args()
    only = [x for x in args.only.split(",") if x]
    for kind in ("tumbling", "session"):
        if kind in only:
            res = windowing(kind)
            print(f"{kind:<9} not keeping {_median(res[False])}")
            print(f"{kind:<9} keeping     {_median(res[True])}")
    if "synthetic" in only:
        for tiny in (False, True):
            for name, xs in synthetic(tiny).items():
                print(f"synthetic{' int' if tiny else ''} {name:<26} {_median(xs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
