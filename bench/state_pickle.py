"""What pickling a state costs: the snapshot path's C writer against pickle.dumps.

Snapshots pickle each touched key's state. Plain states (built-in values,
dates, naive and UTC datetimes, timedeltas) are written by a C writer
(``pybindings/pickle.c``); anything else goes to ``pickle.dumps`` as before.
For a range of state shapes this prints, per state, in one process:

- ``dumps``: ``pickle.dumps(state, 5)``, what every snapshot paid before;
- ``C``: ``_core.fast_pickle(state, 5)`` (``-`` when the shape is not plain
  and the writer gives up; ``give-up`` is then what that attempt costs on
  top of ``dumps``);
- ``loads``: ``pickle.loads`` of each one's bytes (a resume reads them back);
- ``snapshot``: a whole ``StateStore.snapshot`` of 20k keys of that shape,
  per key (packing, the C or ``dumps`` path as it applies, plus the write).

Best of 5 timings each; ratios are ``dumps / C``.

A second table writes ``(count, <N random bytes>)`` states of several sizes
through ``StateStore.snapshot`` (20k keys, five epochs, every key each
epoch, no commit: every version stays) and prints the time per key of the
first write and of the best later one, and the local store's bytes per
byte of state written (key + pickle, all versions). It shows the local
store's page size at work: a row past about a quarter of a page spills to
an overflow page of its own.

    .venv/bin/python bench/state_pickle.py [--keys 20000]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import tempfile
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, List, Optional, Tuple

from millpond import _core
from millpond.state import StateStore

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)


@dataclasses.dataclass
class Reading:
    sensor: str
    value: float


def _shapes() -> List[Tuple[str, Any]]:
    return [
        ("int counter", 12345),
        ("(count, 100 bytes)", (7, bytes(range(100)))),
        ("(count, 1 KB bytes)", (7, bytes(1000))),
        ("str -> float dict of 20", {f"field{i}": i * 0.5 for i in range(20)}),
        ("list of 1000 ints", list(range(1000))),
        ("windowing key (1 window, 1 buffered item)",
         (2, (1709251225000000, 1709251200000000, 1709251215000000), None,
          ((0, 1709251200000000, 1709251260000000, (), 3),),
          ((1709251225000000, 1, ("k000001", T0 + timedelta(seconds=25), 3)),), 2)),
        ("aware UTC datetime", T0),
        ("10 (datetime, float) pairs", [(T0 + timedelta(seconds=i), i * 1.5) for i in range(10)]),
        ("dataclass (not plain)", Reading("s1", 2.5)),
        ("1000 ints then a dataclass (not plain)", list(range(1000)) + [Reading("s1", 2.5)]),
    ]


def _best(fn: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


class _Holder:
    def __init__(self, resume_state: Any) -> None:
        self.value = resume_state

    def snapshot(self) -> Any:
        return self.value


def _snapshot_per_key(state: Any, keys: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        store = StateStore.open(d, "bench")
        store.register("s", _Holder)
        best = float("inf")
        for epoch in range(1, 4):
            for i in range(keys):
                store.set("s", f"k{i:07d}", _Holder(state))
            t0 = time.perf_counter()
            store.snapshot(epoch)
            best = min(best, (time.perf_counter() - t0) / keys)
        store.close()
    return best


def _us(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 1e6:.2f}"


def _sizes(keys: int) -> None:
    print()
    print(f"{'state bytes':>11} | {'first write us/key':>18} | {'later us/key':>12} | {'local bytes / state bytes':>25}")
    for size in (100, 900, 1000, 2000, 4000, 6000):
        state = (7, os.urandom(size))
        row_bytes = keys * (8 + len(pickle.dumps(state, 5)))
        with tempfile.TemporaryDirectory() as d:
            store = StateStore.open(d, "bench")
            store.register("s", _Holder)
            times = []
            for epoch in range(1, 6):
                for i in range(keys):
                    store.set("s", f"k{i:07d}", _Holder(state))
                t0 = time.perf_counter()
                store.snapshot(epoch)
                times.append((time.perf_counter() - t0) / keys)
            store.close()
            disk = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
        print(f"{size:>11} | {times[0] * 1e6:>18.2f} | {min(times[1:]) * 1e6:>12.2f} | {disk / (5 * row_bytes):>25.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=20000, help="keys per StateStore.snapshot")
    args = ap.parse_args()
    print(f"{'state':44} | {'dumps us':>8} | {'C us':>6} | {'x':>5} | {'give-up us':>10} | "
          f"{'loads(dumps)':>12} | {'loads(C)':>8} | {'snapshot us/key':>15}")
    for name, state in _shapes():
        n = 20000 if len(pickle.dumps(state)) < 2000 else 2000
        dumps = _best(lambda: pickle.dumps(state, 5), n)
        fast_bytes = _core.fast_pickle(state, 5)
        c: Optional[float] = None
        give_up: Optional[float] = None
        load_c: Optional[float] = None
        t_attempt = _best(lambda: _core.fast_pickle(state, 5), n)
        if fast_bytes is not None:
            c = t_attempt
            assert pickle.loads(fast_bytes) == state
            load_c = _best(lambda: pickle.loads(fast_bytes), n)
        else:
            give_up = t_attempt
        dumped = pickle.dumps(state, 5)
        load_d = _best(lambda: pickle.loads(dumped), n)
        snap = _snapshot_per_key(state, args.keys)
        ratio = f"{dumps / c:.1f}" if c else "-"
        print(f"{name:44} | {_us(dumps):>8} | {_us(c):>6} | {ratio:>5} | {_us(give_up):>10} | "
              f"{_us(load_d):>12} | {_us(load_c):>8} | {_us(snap):>15}")
    _sizes(args.keys)


if __name__ == "__main__":
    main()
