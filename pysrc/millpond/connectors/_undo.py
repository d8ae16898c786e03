"""Undo records of a file sink's resume: the bytes it cut off its file.

A resumed file sink truncates its file to the offset of the epoch it
resumes from (to nothing without a resume state). That offset is only as
good as the state it came from: a local store damaged in a way no check
sees until the flow already runs (a b-tree page hiding the sink's row, so
that the sink looks new) hands the sink an older offset, or none, and the
truncation would cut off output that was committed. The run then stops
(the background check finds the damage, and nothing of the run commits)
and the next one resumes from the backup with the right offset, which the
file must still reach.

So before truncating, the sink keeps what it cuts off in an undo record
beside its file: the cut tail copied (it is at most the output since the
last commit), or, when the whole file goes, the file itself renamed. The
record is tagged with a token of the run, which the run's snapshots carry,
and is removed once the run commits an epoch (its state was then checked,
so its truncation was right). A record still there at the next resume was
left by a run killed before that; the resume state's token says whether
that run committed after all:

* the same token: it did (the kill came between its commit and the
  record's removal); the record is dropped.
* another token, or none: it did not, so its truncation may have been
  wrong; the file is put back as it was before that run, whatever the run
  wrote meanwhile, and then truncated as this resume says.

Each step is ordered (written to a temporary name, fsynced, renamed) so a
kill at any point leaves either a complete record or the untouched file.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import struct
import zlib
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Optional, Tuple, cast

logger = logging.getLogger("millpond")

_MAGIC = b"MPUNDO1\n"
# magic, run token (16 bytes), start offset, length of the kept bytes
_META = struct.Struct(">8s16sQQ")
_CRC = struct.Struct(">I")
# Kept bytes are copied this much at a time.
_CHUNK = 8 << 20


def new_token() -> bytes:
    """A token for one run of one sink partition."""
    return secrets.token_bytes(16)


def record_paths(path: Path) -> Tuple[Path, Path]:
    """The undo record of the file at ``path``: its data (the kept bytes)
    and its description, hidden beside the file."""
    data = path.with_name(f".{path.name}.millpond-undo")
    return data, data.with_name(data.name + ".meta")


def _sync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``path`` through a temporary name, fsynced."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _chunks(fd: int, start: int, end: int) -> Iterator[bytes]:
    """The bytes ``start..end`` of the file open as ``fd``, a chunk at a time."""
    while start < end and (chunk := os.pread(fd, min(_CHUNK, end - start), start)):
        yield chunk
        start += len(chunk)


def _read_meta(meta: Path) -> Optional[Tuple[bytes, int, int]]:
    """``(token, start, length)`` of a description, None when there is none
    or it does not check out."""
    try:
        raw = meta.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) == _META.size + _CRC.size and _CRC.unpack_from(raw, _META.size)[0] == zlib.crc32(raw[: _META.size]):
        magic, token, start, length = _META.unpack_from(raw)
        if magic == _MAGIC:
            return token, start, length
    logger.warning("ignoring the damaged undo record %s of a file sink", meta)
    return None


def remove(path: Path) -> None:
    """Remove the undo record of the file at ``path``, if there is one
    (the description first: data without one is no record)."""
    data, meta = record_paths(path)
    gone = False
    # Temporary files of a record whose making failed go too.
    for p in (meta, data, meta.with_name(meta.name + ".tmp"), data.with_name(data.name + ".tmp")):
        try:
            p.unlink()
            gone = True
        except FileNotFoundError:
            pass
    if gone:
        _sync_dir(path.parent)


def settle(path: Path, token: Optional[bytes]) -> None:
    """Before a resume whose state carries ``token`` (None for a state
    without one), put the file at ``path`` back as it was before the run
    that left an undo record, unless that run committed (``token`` is the
    record's). The file must not be open."""
    data, meta = record_paths(path)
    found = _read_meta(meta)
    if found is None:
        remove(path)
        return
    rec_token, start, length = found
    try:
        kept = data.stat().st_size
    except FileNotFoundError:
        kept = -1
    if rec_token == token or kept != length:
        # Either that run committed, or the kill came while the record
        # was being made, before the file was touched.
        remove(path)
        return
    if start == 0:
        os.replace(data, path)
        _sync_dir(path.parent)
    else:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            if size < start:
                # Shorter than where that run cut it: something else
                # truncated the file. The resume refuses it if it lacks
                # committed bytes.
                logger.warning(
                    "%s: the file has %d bytes, fewer than where its undo record %s starts (%d); not applying it",
                    path, size, meta, start,
                )
                return
            with open(data, "rb") as src:
                at = start
                while chunk := src.read(_CHUNK):
                    os.pwrite(fd, chunk, at)
                    at += len(chunk)
            os.ftruncate(fd, start + length)
            os.fsync(fd)
        finally:
            os.close(fd)
    logger.info(
        "%s: put back bytes %d-%d that a run which committed nothing had cut off on resume",
        path, start, start + length,
    )
    remove(path)


def truncate(path: Path, f: BinaryIO, offset: int, token: bytes) -> BinaryIO:
    """Truncate the file open as ``f`` to ``offset``, first keeping what is
    cut off in an undo record tagged ``token``. Returns the file to write
    to: ``f``, or a new empty file when the whole file was kept (renamed).

    A file that cannot be renamed without changing what its path means (a
    symbolic link, a file with other hard links, not a regular file) is
    emptied in place without a record; so is one whose directory does not
    take the record (read-only, full), with a warning: the record is a
    safety net, and the truncation is what the resume needs."""
    fd = f.fileno()
    st = os.fstat(fd)
    size = st.st_size
    if offset >= size:
        remove(path)
        return f
    data, meta = record_paths(path)
    description = _META.pack(_MAGIC, token, offset, size - offset)
    description += _CRC.pack(zlib.crc32(description))
    try:
        remove(path)
        if offset == 0:
            if not _renamable(path, st):
                logger.debug("%s: not a plain file, emptied without an undo record", path)
                os.ftruncate(fd, 0)
                return f
            # The whole file goes: keep it by renaming it, whatever its size.
            _write_synced(meta, [description])
            os.replace(path, data)
            f.close()
            fresh = cast(BinaryIO, open(path, "w+b"))
            os.fchmod(fresh.fileno(), stat.S_IMODE(st.st_mode))
            _sync_dir(path.parent)
            return fresh
        _write_synced(data, _chunks(fd, offset, size))
        _write_synced(meta, [description])
        _sync_dir(path.parent)
    except OSError as ex:
        if f.closed:
            raise
        logger.warning(
            "%s: cannot keep the %d bytes this resume cuts off in an undo record (%s); truncating without one",
            path, size - offset, ex,
        )
        try:
            remove(path)
        except OSError:
            pass
    os.ftruncate(fd, offset)
    return f


def _renamable(path: Path, st: os.stat_result) -> bool:
    """Whether ``path`` names the open file itself, and only it: renaming it
    aside and making a new file there then changes nothing else."""
    try:
        lst = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISREG(lst.st_mode)
        and lst.st_ino == st.st_ino
        and lst.st_dev == st.st_dev
        and st.st_nlink == 1
    )
