"""Sources and sinks over local files that resume exactly where they stopped.

Sources read lines (``FileSource``, ``DirSource``) or CSV rows
(``CSVSource``) and snapshot the byte offset after the last item they
emitted, with a checksum of the bytes just before it; a resumed run seeks
there, and logs a warning when those bytes changed (the file was replaced
since the snapshot, so the resumed run would mix two inputs). Sinks (``FileSink``, ``DirSink``) write
``str`` values followed by ``end`` (each batch flushed to the OS as it is
written, so ``tail -f`` follows the output), snapshot the byte offset they have
written (after an ``fsync``, since the snapshot claims the bytes are on
disk) and, when resumed, truncate the file back to that offset before
writing. A flow from file sources to file sinks therefore produces exactly
the output of a run that never failed, whatever instant it was killed at.

A sink that starts *without* resume state (a fresh run, or recovery off)
truncates its file to empty: each run rewrites the output. What a sink cuts
off is kept in a hidden undo record beside its file until the run commits
an epoch, so a run that resumed from a wrong state (a damaged local store)
can be undone by the next; a resume whose file does not hold the bytes its
snapshot says were written fails, naming the file.

Example::

    flow = Dataflow("copy")
    lines = op.input("in", flow, FileSource("in.txt"))
    keyed = op.key_on("one_file", lines, lambda _line: "all")
    op.output("out", keyed, FileSink("out.txt"))

File sinks are fixed-partitioned sinks, so their upstream is a keyed stream
of ``(key, str)`` pairs; the key picks the file (``DirSink``) and is not
written.

Partition names have the form ``FS_ID::PATH``. ``get_fs_id`` names the file
system a path lives on; the default, ``"local"``, says every worker sees the
same files (one machine or a shared mount). Partition names key the resume
state, so whatever ``get_fs_id`` returns must stay the same across restarts.
"""

from __future__ import annotations

import csv
import logging
import os
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple, Union

from millpond.connectors import _undo
from millpond.inputs import FixedPartitionedSource, StatefulSourcePartition
from millpond.outputs import FixedPartitionedSink, StatefulSinkPartition

__all__ = [
    "local_fs_id",
    "FileSource",
    "DirSource",
    "CSVSource",
    "FileSink",
    "DirSink",
]

PathLike = Union[str, "os.PathLike[str]"]

logger = logging.getLogger("millpond")

#: A source partition's resume state: the byte offset of its next item and
#: a CRC-32 of the bytes before it (at most ``_PRINT_BYTES``), by which a
#: resume tells that the file changed. A plain offset (older snapshots) is
#: resumed without the check.
SourcePosition = Union[int, Tuple[int, int]]

#: A file sink partition's resume state: the byte length of its file, the
#: token of the run that wrote it (which tells a resume whether that run's
#: undo record still applies) and a CRC-32 of the bytes before that length
#: (at most ``_PRINT_BYTES``), by which a resume tells that the file does
#: not hold what was written. A plain length (older snapshots) is resumed
#: without either.
SinkPosition = Union[int, Tuple[int, bytes, int]]

#: How many bytes before the resume offset the fingerprint covers.
_PRINT_BYTES = 4096


def local_fs_id(path: Path) -> str:
    """The default ``get_fs_id``: all workers share one view of the files.

    Pass your own, such as ``lambda _p: socket.gethostname()``, when each
    machine of a cluster reads its own local files under the same path.
    """
    return "local"


def _fs_id(get_fs_id: Callable[[Path], str], path: Path) -> str:
    fs_id = get_fs_id(path)
    if not isinstance(fs_id, str) or "::" in fs_id:
        raise ValueError(f"get_fs_id must return a str without '::', got {fs_id!r}")
    return fs_id


def _split_part(for_part: str) -> str:
    _fs_id, sep, rest = for_part.partition("::")
    if not sep:
        raise ValueError(f"not a file partition name (expected 'FS_ID::PATH'): {for_part!r}")
    return rest


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


def _fingerprint(f: Any, offset: int) -> int:
    """CRC-32 of the bytes of ``f`` just before ``offset``."""
    start = max(0, offset - _PRINT_BYTES)
    return zlib.crc32(os.pread(f.fileno(), offset - start, start))


def _position(f: Any, offset: int) -> Tuple[int, int]:
    """The resume state of a partition whose next item starts at ``offset``."""
    return (offset, _fingerprint(f, offset))


def _seek_resume(path: Path, f: Any, state: Optional[SourcePosition]) -> int:
    """Position ``f`` at the resume state's offset (0 without one) and
    return it; warn when the bytes before it changed since the snapshot."""
    if not state:
        return 0
    offset, expected = (state, None) if isinstance(state, int) else state
    size = os.fstat(f.fileno()).st_size
    if offset > size:
        f.close()
        raise ValueError(
            f"{path}: cannot resume at byte {offset}, the file has only {size} bytes; "
            "it was truncated or replaced since the snapshot"
        )
    if expected is not None and _fingerprint(f, offset) != expected:
        logger.warning(
            "%s changed since the snapshot this run resumes from: the bytes before the resume position "
            "(byte %d) differ, so the file was replaced or rewritten. The run goes on from byte %d of the "
            "file as it is now, mixing its input with the old one's; to process a new input from its start, "
            "run it as a new flow (another flow id, or remove the flow's recovery state)",
            path, offset, offset,
        )
    f.seek(offset)
    return offset


def _open_at(path: Path, state: Optional[SourcePosition]) -> "tuple[Any, int]":
    """Open ``path`` for reading positioned at the resume state (``None`` = start)."""
    f = open(path, "rb")  # noqa: SIM115  (owned by the partition, closed in close())
    return f, _seek_resume(path, f, state)


#: How many bytes a line source reads at a time. A block is cut after its
#: last newline (the rest starts the next block) and its lines are decoded
#: and split at once; a line longer than a block is read whole.
_BLOCK_SIZE = 256 * 1024


def _strip_eol(line: str) -> str:
    if line.endswith("\n"):
        line = line[:-1]
        if line.endswith("\r"):
            line = line[:-1]
    return line


class _LinePartition(StatefulSourcePartition[str, SourcePosition]):
    """Reads a file's lines; the resume state is the position of the next line.

    The file is read a block at a time: the whole lines of a block (its
    *chunk*, cut after the last ``b"\\n"``, which is always a UTF-8
    character boundary) are decoded with one ``decode`` and one ``split``,
    and batches are slices of that list. The bytes after the chunk's last
    newline are carried over to the next block; at end of file they are a
    last line without a newline. The byte offset of the next line is only
    worked out when a snapshot asks for it.

    The lines are those of reading the file with ``readline`` and
    ``_strip_eol`` (one ``"\\r"`` before the ``"\\n"`` removed, a lone
    ``"\\r"`` kept), and so are the batches: a batch is cut short only by
    the end of the file (the next call reads on, so lines appended since
    are read, and a call that finds nothing ends the partition), and the
    batch that would hold a non-UTF-8 line raises instead, naming the
    line's byte offset, after the batches before it were handed out.
    """

    def __init__(
        self,
        path: Path,
        batch_size: int,
        resume_state: Optional[SourcePosition],
        block_size: Optional[int] = None,
    ) -> None:
        self._path = path
        self._batch_size = batch_size
        self._block_size = block_size or _BLOCK_SIZE
        self._f, offset = _open_at(path, resume_state)
        # The lines being handed out: the decoded lines of ``_chunk``, whose
        # first byte is at ``_chunk_offset`` in the file; ``_next`` is the
        # index of the next line to hand out.
        self._lines: List[str] = []
        self._next = 0
        self._chunk = b""
        self._chunk_offset = offset
        # Bytes read after the chunk: the start of the line after it.
        self._carry = b""
        # A non-UTF-8 line right after the chunk: (its offset, the error).
        self._bad: Optional[Tuple[int, UnicodeDecodeError]] = None

    def next_batch(self) -> List[str]:
        i = self._next
        j = i + self._batch_size
        lines = self._lines
        if j <= len(lines):
            self._next = j
            return lines[i:j]
        out = lines[i:]
        self._next = len(lines)
        while len(out) < self._batch_size:
            if self._bad is not None:
                offset, ex = self._bad
                raise ValueError(f"{self._path}: line at byte {offset} is not UTF-8: {ex}") from ex
            if not self._fill():
                break
            take = self._batch_size - len(out)
            out += self._lines[:take]
            self._next = min(take, len(self._lines))
        if not out:
            raise StopIteration()
        return out

    def _fill(self) -> bool:
        """Replace the (used up) chunk by the next lines of the file; False
        when there are none (end of file, for now)."""
        start = self._chunk_offset + len(self._chunk)
        parts = [self._carry] if self._carry else []
        read = self._f.read
        while True:
            block = read(self._block_size)
            if not block:
                carry = b""  # what is left is a last line without a newline
                break
            cut = block.rfind(b"\n") + 1
            if cut:
                if cut == len(block):
                    parts.append(block)
                    carry = b""
                else:
                    parts.append(block[:cut])
                    carry = block[cut:]
                break
            parts.append(block)  # no newline yet: a line longer than a block
        chunk = parts[0] if len(parts) == 1 else b"".join(parts)
        self._carry = carry
        self._chunk = chunk
        self._chunk_offset = start
        self._next = 0
        if not chunk:
            self._lines = []
            return False
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError:
            self._lines = self._decode_until_bad(chunk, start)
            return True
        if "\r" in text:
            # What _strip_eol does to every line: "\r\n" never overlaps
            # itself, so this drops exactly one "\r" before each "\n".
            text = text.replace("\r\n", "\n")
        lines = text.split("\n")
        if chunk[-1] == 0x0A:
            lines.pop()  # the empty string after the last newline
        self._lines = lines
        return True

    def _decode_until_bad(self, chunk: bytes, start: int) -> List[str]:
        """The lines of ``chunk`` before its first non-UTF-8 line, which is
        recorded in ``_bad``; the chunk is cut back to end before it."""
        lines: List[str] = []
        pos = 0
        while pos < len(chunk):
            end = chunk.find(b"\n", pos) + 1 or len(chunk)
            try:
                lines.append(_strip_eol(chunk[pos:end].decode("utf-8")))
            except UnicodeDecodeError as ex:
                self._bad = (start + pos, ex)
                self._chunk = chunk[:pos]
                break
            pos = end
        return lines

    def _offset(self) -> int:
        """The byte offset of the next line to hand out."""
        k = self._next
        if k == 0:
            return self._chunk_offset
        chunk = self._chunk
        n = len(self._lines)
        if k >= n:
            return self._chunk_offset + len(chunk)
        # Here every line of the chunk ends with a newline (only a chunk of
        # one line can lack it), and line k starts after the k-th one:
        # found from whichever end is nearer.
        if k <= n // 2:
            return self._chunk_offset + len(chunk) - len(chunk.split(b"\n", k)[k])
        return self._chunk_offset + len(chunk.rsplit(b"\n", n - k + 1)[0]) + 1

    def snapshot(self) -> SourcePosition:
        return _position(self._f, self._offset())

    def close(self) -> None:
        self._f.close()


class _OneFile:
    """What FileSource and CSVSource share: one partition, named by the
    file's filesystem id and path so a resume finds its position."""

    def __init__(self, path: PathLike, batch_size: int, get_fs_id: Callable[[Path], str]) -> None:
        _check_batch_size(batch_size)
        self._path = Path(path)
        self._batch_size = batch_size
        self._get_fs_id = get_fs_id

    def list_parts(self) -> List[str]:
        return [f"{_fs_id(self._get_fs_id, self._path)}::{self._path}"]


class FileSource(_OneFile, FixedPartitionedSource[str, SourcePosition]):
    """Read a text file (UTF-8) line by line, without line endings.

    One partition, so one worker reads the file. Emits batches of up to
    ``batch_size`` lines; ``"\\n"`` and ``"\\r\\n"`` endings are removed, other
    whitespace is kept, and a last line without a newline is still emitted.
    Resumes at the byte after the last line emitted. The file is opened when
    the flow runs, not when the source is built; a missing file or non-UTF-8
    content makes the run fail with an error naming the path.
    """

    def __init__(
        self,
        path: PathLike,
        batch_size: int = 1000,
        get_fs_id: Callable[[Path], str] = local_fs_id,
    ) -> None:
        super().__init__(path, batch_size, get_fs_id)

    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[SourcePosition]
    ) -> StatefulSourcePartition[str, SourcePosition]:
        return _LinePartition(self._path, self._batch_size, resume_state)


def _check_dir(path: Path) -> None:
    if not path.exists():
        raise ValueError(f"DirSource: input directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise ValueError(f"DirSource: input directory {str(path)!r} is not a directory")


class DirSource(FixedPartitionedSource[str, SourcePosition]):
    """Read every file in ``dir`` matching ``glob_pat``, one partition per file.

    Each file is read like :class:`FileSource`, so partitions (files) are
    spread over the workers. ``glob_pat`` is a :meth:`pathlib.Path.glob`
    pattern relative to ``dir`` (``"*.log"``, ``"**/*.txt"``); directories
    are skipped. The set of files is taken when the flow starts. Raises
    ``ValueError`` when the source is built if ``dir`` does not exist or is
    not a directory (as Bytewax does).
    """

    def __init__(
        self,
        dir: PathLike,  # noqa: A002  (the name users know from Bytewax)
        glob_pat: str = "*",
        batch_size: int = 1000,
        get_fs_id: Callable[[Path], str] = local_fs_id,
    ) -> None:
        _check_batch_size(batch_size)
        self._dir = Path(dir)
        _check_dir(self._dir)
        self._glob_pat = glob_pat
        self._batch_size = batch_size
        self._get_fs_id = get_fs_id

    def list_parts(self) -> List[str]:
        _check_dir(self._dir)  # again: it may have gone since the flow was built
        fs_id = _fs_id(self._get_fs_id, self._dir)
        rels = sorted(
            p.relative_to(self._dir).as_posix() for p in self._dir.glob(self._glob_pat) if p.is_file()
        )
        return [f"{fs_id}::{rel}" for rel in rels]

    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[SourcePosition]
    ) -> StatefulSourcePartition[str, SourcePosition]:
        return _LinePartition(self._dir / _split_part(for_part), self._batch_size, resume_state)


class _CSVPartition(StatefulSourcePartition[Dict[str, Any], SourcePosition]):
    """Reads CSV rows as dicts; the resume state is the position of the next row."""

    def __init__(
        self,
        path: Path,
        batch_size: int,
        resume_state: Optional[SourcePosition],
        fmtparams: Dict[str, Any],
    ) -> None:
        self._path = path
        self._batch_size = batch_size
        # The header is always read from the start, also on resume, so the
        # snapshot only needs the offset.
        self._f, _ = _open_at(path, None)
        self._offset = 0
        lines = self._lines()
        try:
            header: Optional[List[str]] = next(csv.reader(lines, **fmtparams))
        except StopIteration:
            header = None  # an empty file: no header, no rows
        except csv.Error as ex:
            raise ValueError(f"{path}: bad CSV header: {ex}") from ex
        if header is not None and header and header[0].startswith("\ufeff"):
            header[0] = header[0][1:]  # a UTF-8 byte order mark from spreadsheet exports
        if resume_state:
            self._offset = _seek_resume(path, self._f, resume_state)
        self._reader: Optional[Iterator[Dict[str, Any]]] = (
            None if header is None else csv.DictReader(lines, fieldnames=header, **fmtparams)
        )

    def _lines(self) -> Iterator[str]:
        # The csv module pulls lines one at a time (more than one only for a
        # quoted field with newlines) and never reads ahead, so after each
        # row the offset is exactly the end of that row.
        readline = self._f.readline
        while True:
            raw = readline()
            if not raw:
                return
            self._offset += len(raw)
            yield raw.decode("utf-8")

    def next_batch(self) -> List[Dict[str, Any]]:
        if self._reader is None:
            raise StopIteration()
        out: List[Dict[str, Any]] = []
        reader = self._reader
        try:
            for _ in range(self._batch_size):
                row = next(reader, None)
                if row is None:
                    break
                out.append(row)
        except (csv.Error, UnicodeDecodeError) as ex:
            raise ValueError(f"{self._path}: bad CSV before byte {self._offset}: {ex}") from ex
        if not out:
            raise StopIteration()
        return out

    def snapshot(self) -> SourcePosition:
        return _position(self._f, self._offset)

    def close(self) -> None:
        self._f.close()


class CSVSource(_OneFile, FixedPartitionedSource[Dict[str, Any], SourcePosition]):
    """Read a CSV file (UTF-8) with a header row; emit one ``dict`` per row.

    Values are strings, keyed by the header's column names, as with
    :class:`csv.DictReader`: a short row fills missing columns with ``None``,
    extra fields go in a list under the key ``None``, blank lines are
    skipped. ``fmtparams`` are passed to the ``csv`` module (``delimiter=";"``,
    ``quotechar``, ``dialect``, ...). Quoted fields may span lines. Resumes at
    the byte after the last row emitted.

    Example::

        rows = op.input("rows", flow, CSVSource("trades.csv", delimiter=";"))
    """

    def __init__(
        self,
        path: PathLike,
        batch_size: int = 1000,
        get_fs_id: Callable[[Path], str] = local_fs_id,
        **fmtparams: Any,
    ) -> None:
        super().__init__(path, batch_size, get_fs_id)
        # Fail now, not when the flow runs, on a misspelled format parameter.
        csv.reader([], **fmtparams)
        self._fmtparams = fmtparams

    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[SourcePosition]
    ) -> StatefulSourcePartition[Dict[str, Any], SourcePosition]:
        return _CSVPartition(self._path, self._batch_size, resume_state, self._fmtparams)


class _FileSinkPartition(StatefulSinkPartition[str, SinkPosition]):
    """Appends values, flushed per batch; the resume state is the byte
    length of the file (flushed and fsynced when snapshotted), this run's
    token and a fingerprint of the bytes before that length, which a resume
    checks. What a resume cuts off the file is kept in an undo record
    until the run commits an epoch (see ``_undo``); the runtime says when,
    through ``commit`` (the two-phase protocol, without its deferred
    output: written values are visible at once)."""

    def __init__(self, path: Path, end: str, resume_state: Optional[SinkPosition]) -> None:
        self._path = path
        self._end = end
        self._token = _undo.new_token()
        self._undo_kept = True  # until an epoch of this run commits
        if isinstance(resume_state, int):
            offset, token, expected = resume_state, None, None
        else:
            offset, token, expected = resume_state or (0, None, None)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A run that truncated this file and committed nothing since may
        # have resumed from a wrong state: put the file back first.
        _undo.settle(path, token)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        f: BinaryIO = os.fdopen(fd, "r+b")
        try:
            size = os.fstat(fd).st_size
            if offset > size:
                raise ValueError(
                    f"{path}: the snapshot says {offset} bytes were written but the file has "
                    f"only {size}; it was truncated or replaced since, so resuming would lose output"
                )
            if expected is not None and _fingerprint(f, offset) != expected:
                raise ValueError(
                    f"{path}: the bytes before byte {offset} are not those the snapshot says were "
                    "written; the file was rewritten or replaced since, so resuming would mix two outputs. "
                    "Restore the file, or remove it and the flow's recovery state to start over"
                )
            # Drop whatever the failed run wrote after the last committed
            # epoch (a fresh run: everything); the replayed input writes it
            # again.
            f = _undo.truncate(path, f, offset, self._token)
        except BaseException:
            f.close()
            raise
        self._f = f
        f.seek(offset)

    def write_batch(self, values: List[str]) -> None:
        end = self._end
        try:
            data = end.join(values) + end if values else ""
        except TypeError:
            bad = next(v for v in values if not isinstance(v, str))
            raise TypeError(
                f"{self._path}: file sinks write str values, got {type(bad).__name__} "
                f"{bad!r:.80}; convert first, e.g. op.map_value('fmt', stream, str)"
            ) from None
        f = self._f
        f.write(data.encode("utf-8"))
        # Hand every batch to the OS at once, so a reader (tail -f) sees it
        # and a crash without recovery loses only the batch in hand. With
        # recovery, bytes past the last snapshot are truncated on resume.
        f.flush()

    def snapshot(self) -> SinkPosition:
        self._f.flush()
        os.fsync(self._f.fileno())
        offset = self._f.tell()
        return (offset, self._token, _fingerprint(self._f, offset))

    def prepare(self, epoch: int) -> bool:
        # Nothing is held back: the snapshot changes only with writes,
        # which the runtime tracks itself.
        return False

    def commit(self, epoch: int) -> None:
        if self._undo_kept:
            _undo.remove(self._path)
            self._undo_kept = False

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            self._f.close()


class FileSink(FixedPartitionedSink[str, SinkPosition]):
    """Write each ``str`` value, followed by ``end``, to one file.

    The upstream is a keyed stream ``(key, str)``; the key is ignored (all
    values go to the one file). A fresh run truncates the file; a resumed
    run truncates it to the offset of the epoch it resumes from, so the
    file never holds output of an epoch twice. The parent directory is
    created if needed. A value that is not a ``str`` fails the run with a
    ``TypeError`` naming the file.
    """

    def __init__(self, path: PathLike, end: str = "\n") -> None:
        self._path = Path(path)
        self._end = end

    def list_parts(self) -> List[str]:
        return [str(self._path)]

    def part_fn(self, item_key: str) -> int:
        return 0

    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[SinkPosition]
    ) -> StatefulSinkPartition[str, SinkPosition]:
        return _FileSinkPartition(self._path, self._end, resume_state)


def _default_file_namer(index: int, count: int) -> str:
    return f"part_{index}"


def _default_assign_file(key: str) -> int:
    return zlib.crc32(key.encode("utf-8"))


class DirSink(FixedPartitionedSink[str, SinkPosition]):
    """Write ``str`` values to ``file_count`` files in ``dir``, picked by key.

    The item's key goes through ``assign_file(key) -> int`` (default: a
    stable CRC-32 of the key), taken modulo ``file_count``; file ``i`` is
    named ``file_namer(i, file_count)`` (default ``part_{i}``). Each file is
    a partition, so the files are spread over the workers, and each one
    behaves like :class:`FileSink` (truncated on a fresh run, truncated to
    its snapshot on resume). ``dir`` is created if needed.

    Raises ``ValueError`` if ``file_count`` is less than 1 or two files get
    the same name.
    """

    def __init__(
        self,
        dir: PathLike,  # noqa: A002  (the name users know from Bytewax)
        file_count: int,
        file_namer: Callable[[int, int], str] = _default_file_namer,
        assign_file: Callable[[str], int] = _default_assign_file,
        end: str = "\n",
    ) -> None:
        if not isinstance(file_count, int) or file_count < 1:
            raise ValueError(f"file_count must be a positive int, got {file_count!r}")
        self._dir = Path(dir)
        self._file_count = file_count
        self._names = [file_namer(i, file_count) for i in range(file_count)]
        if len(set(self._names)) != file_count:
            raise ValueError(f"file_namer must give each file its own name, got {self._names}")
        self._assign_file = assign_file
        self._end = end

    def list_parts(self) -> List[str]:
        return list(self._names)

    def part_fn(self, item_key: str) -> int:
        return self._assign_file(item_key) % self._file_count

    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[SinkPosition]
    ) -> StatefulSinkPartition[str, SinkPosition]:
        return _FileSinkPartition(self._dir / for_part, self._end, resume_state)
