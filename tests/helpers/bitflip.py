"""Flip one bit of a file, at a random offset or at one chosen to hit a
particular part of a SQLite database.

Random offsets mostly land in row data; the targeted kinds make sure the
loop also covers what a random flip rarely hits and what does the most
damage: the 100-byte database header (page size, page count, schema
cookie), b-tree interior pages (a flipped child pointer sends reads to the
wrong page), a pickled state value (decodes to another value, or fails to
decode) and a state key (the row moves to another key).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_SIZE = 100
#: b-tree page types: interior index, interior table, leaf index, leaf table.
INTERIOR_INDEX, INTERIOR_TABLE, LEAF_INDEX, LEAF_TABLE = 0x02, 0x05, 0x0A, 0x0D
WAL_HEADER_SIZE = 32
WAL_FRAME_HEADER_SIZE = 24

KINDS = ("random", "value", "key", "header", "interior")


@dataclass(frozen=True)
class Flip:
    """One flipped bit: where, and what the test meant to hit."""

    path: Path
    offset: int
    bit: int
    kind: str

    def __str__(self) -> str:
        return f"{self.kind} flip of bit {self.bit} at offset {self.offset} of {self.path.name}"


def flip_bit(path: Path, offset: int, bit: int) -> None:
    """XOR one bit of ``path`` in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        assert len(b) == 1, f"offset {offset} is past the end of {path}"
        f.seek(offset)
        f.write(bytes([b[0] ^ (1 << bit)]))


def page_size(data: bytes) -> int:
    """The page size a database file's header declares (1 means 65536)."""
    assert data[:16] == SQLITE_MAGIC, "not a SQLite database file"
    (size,) = struct.unpack(">H", data[16:18])
    return 65536 if size == 1 else size


def pages(data: bytes) -> List[Tuple[int, int]]:
    """``(offset of the b-tree header, page type)`` of every page of a
    database file (page 1's b-tree header follows the 100-byte file header)."""
    size = page_size(data)
    out = []
    for start in range(0, len(data) - size + 1, size):
        hdr = start + (HEADER_SIZE if start == 0 else 0)
        out.append((hdr, data[hdr]))
    return out


def wal_pages(data: bytes) -> List[Tuple[int, int]]:
    """``(offset of the b-tree header, page type)`` of every frame of a WAL file."""
    if len(data) < WAL_HEADER_SIZE:
        return []
    (size,) = struct.unpack(">I", data[8:12])
    if size < 512 or size > 65536:
        return []
    out = []
    off = WAL_HEADER_SIZE
    while off + WAL_FRAME_HEADER_SIZE + size <= len(data):
        (pgno,) = struct.unpack(">I", data[off:off + 4])
        body = off + WAL_FRAME_HEADER_SIZE
        hdr = body + (HEADER_SIZE if pgno == 1 else 0)
        out.append((hdr, data[hdr]))
        off = body + size
    return out


def _find_all(data: bytes, needle: bytes) -> List[int]:
    out = []
    i = data.find(needle)
    while i >= 0:
        out.append(i)
        i = data.find(needle, i + 1)
    return out


def choose(path: Path, kind: str, rng: random.Random) -> Optional[Flip]:
    """A flip of ``kind`` in ``path``, or None when the file holds nothing
    of that kind (a WAL without an interior page, say)."""
    data = path.read_bytes()
    if not data:
        return None
    is_wal = path.name.endswith("-wal")
    offset: Optional[int] = None
    if kind == "random":
        offset = rng.randrange(len(data))
    elif kind == "header":
        if is_wal:
            offset = rng.randrange(min(WAL_HEADER_SIZE + WAL_FRAME_HEADER_SIZE, len(data)))
        else:
            offset = rng.randrange(HEADER_SIZE)
    elif kind == "interior":
        found = wal_pages(data) if is_wal else pages(data)
        for types in ((INTERIOR_INDEX, INTERIOR_TABLE), (LEAF_INDEX,)):
            cands = [hdr for hdr, t in found if t in types]
            if cands:
                hdr = rng.choice(cands)
                # the page header: type, freeblock, cell count, content
                # start, fragmented bytes, right-most child (interior)
                offset = hdr + rng.randrange(12 if types[0] == INTERIOR_INDEX else 8)
                break
    elif kind == "value":
        # pickles start with PROTO (0x80) and the protocol number
        cands = [i for p in (2, 3, 4, 5) for i in _find_all(data, bytes([0x80, p]))]
        if cands:
            start = rng.choice(cands)
            offset = min(start + rng.randrange(2, 6), len(data) - 1)
    elif kind == "key":
        cands = _find_all(data, b"w")
        cands = [i for i in cands if data[i + 1:i + 4].isdigit()]
        if cands:
            offset = rng.choice(cands) + rng.randrange(4)
    else:
        raise ValueError(f"unknown flip kind {kind!r}")
    if offset is None:
        return None
    return Flip(path, offset, rng.randrange(8), kind)
