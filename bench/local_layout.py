"""The least a row-per-key local store can take on disk (issue 13's local
footprint target): SQLite files holding N keys of ~20-byte state, one row
per key, in the local store's row format and in leaner variants, built in
key order and VACUUMed so every page is full, without the epoch index.

The local store cannot do better than these figures with a row per key:
its pages are not full after updates (about half, ``bench/footprint.py``
prints the fill of a real run) and it keeps an epoch index beside the
rows. If even the full-page figure of a variant is near 2x the live
state, a row per key cannot meet a 2x target for states this small; only
a layout holding many keys per row (a block of keys and values) can.

Built with the standard library's ``sqlite3`` (the same file format the
store writes through ``modernc.org/sqlite``), so it needs no build.

    .venv/bin/python bench/local_layout.py              # 20,000 keys, ~20-byte states
    .venv/bin/python bench/local_layout.py --keys 100000 --fill 0.54
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import zlib
from pathlib import Path
from typing import Callable, List, NamedTuple, Tuple

STEP_ID = "footprint.state.stateful_batch"  # the footprint benchmark's step id (30 bytes)


class Layout(NamedTuple):
    name: str
    columns: str
    primary_key: str
    row: Callable[[int], Tuple[object, ...]]


def _key(i: int) -> str:
    return f"user-{i:07d}"  # 12 bytes, as in bench/footprint.py


def _value(i: int) -> bytes:
    return (1 << 20 | i).to_bytes(8, "little")  # 8 bytes: a small int's pickle


def _crc(i: int) -> int:
    return zlib.crc32(_key(i).encode())  # a 32-bit checksum, as the store keeps one


LAYOUTS: List[Layout] = [
    Layout("the local store's row (step id as text)",
           "step_id TEXT, state_key TEXT, epoch INTEGER, key_group INTEGER, value BLOB, crc INTEGER",
           "step_id, state_key, epoch",
           lambda i: (STEP_ID, _key(i), 95, i % 256, _value(i), _crc(i))),
    Layout("step id interned (an integer)",
           "step INTEGER, state_key TEXT, epoch INTEGER, key_group INTEGER, value BLOB, crc INTEGER",
           "step, state_key, epoch",
           lambda i: (1, _key(i), 95, i % 256, _value(i), _crc(i))),
    Layout("interned, no key group (derived from the key)",
           "step INTEGER, state_key TEXT, epoch INTEGER, value BLOB, crc INTEGER",
           "step, state_key, epoch",
           lambda i: (1, _key(i), 95, _value(i), _crc(i))),
    Layout("interned, no key group, no checksum",
           "step INTEGER, state_key TEXT, epoch INTEGER, value BLOB",
           "step, state_key, epoch",
           lambda i: (1, _key(i), 95, _value(i))),
]


def build(path: Path, layout: Layout, keys: int, page_size: int) -> int:
    """Write ``keys`` rows of ``layout`` into a new file with full pages;
    return its size in bytes."""
    con = sqlite3.connect(path)
    try:
        con.execute(f"PRAGMA page_size={page_size}")
        con.execute(f"CREATE TABLE t ({layout.columns}, PRIMARY KEY ({layout.primary_key})) WITHOUT ROWID")
        marks = ",".join("?" * len(layout.row(0)))
        con.executemany(f"INSERT INTO t VALUES ({marks})", (layout.row(i) for i in range(keys)))
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--page-size", type=int, action="append", help="bytes (16384 and 4096 by default)")
    ap.add_argument("--fill", type=float, default=0.5,
                    help="page fill to project the figures to (a real run's, from bench/footprint.py)")
    args = ap.parse_args()
    live = sum(len(_key(i)) + len(_value(i)) for i in range(args.keys))
    print(f"{args.keys:,} keys, live state {live:,} B ({live / args.keys:.0f} B a key); "
          f"full pages, no epoch index; projected at {args.fill:.0%} page fill")
    with tempfile.TemporaryDirectory(prefix="mp-layout-") as tmp:
        for n, layout in enumerate(LAYOUTS):
            for page_size in args.page_size or [16384, 4096]:
                size = build(Path(tmp) / f"{n}-{page_size}.sqlite", layout, args.keys, page_size)
                print(f"  {layout.name:48s} page {page_size:5d}: {size:10,d} B, {size / args.keys:5.1f} B a row, "
                      f"{size / live:4.2f}x live; at {args.fill:.0%} fill {size / args.fill / live:4.2f}x")


if __name__ == "__main__":
    main()
