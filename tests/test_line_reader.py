"""The block line reader of FileSource/DirSource against a readline reader.

``_RefLinePartition`` is the reader FileSource had before the block reader
(``readline`` + ``decode`` + ``_strip_eol`` per line, the offset counted as
it goes); the block reader must hand out the same batches, raise the same
errors at the same call, and take the same snapshots, for any bytes, any
batch size and any block size (small blocks here, so lines longer than a
block and blocks cut in every place are common).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond.connectors import files
from millpond.connectors.files import DirSource, FileSource, _LinePartition


class _RefLinePartition:
    """The readline-based line reader (the behaviour to keep)."""

    def __init__(self, path: Path, batch_size: int, resume_state: Any) -> None:
        self._path = path
        self._batch_size = batch_size
        self._f, self._offset = files._open_at(path, resume_state)

    def next_batch(self) -> List[str]:
        out: List[str] = []
        offset = self._offset
        for _ in range(self._batch_size):
            raw = self._f.readline()
            if not raw:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as ex:
                raise ValueError(f"{self._path}: line at byte {offset} is not UTF-8: {ex}") from ex
            offset += len(raw)
            if line.endswith("\n"):
                line = line[:-1]
                if line.endswith("\r"):
                    line = line[:-1]
            out.append(line)
        self._offset = offset
        if not out:
            raise StopIteration()
        return out

    def snapshot(self) -> Tuple[int, int]:
        return files._position(self._f, self._offset)

    def close(self) -> None:
        self._f.close()


Step = Tuple[str, Any, Any]


def _steps(part: Any, limit: int = 10_000) -> List[Step]:
    """Every call's outcome until the partition ends or fails: a batch and
    the snapshot after it, the end, or the error's message."""
    out: List[Step] = [("start", None, part.snapshot())]
    for _ in range(limit):
        try:
            batch = part.next_batch()
        except StopIteration:
            out.append(("stop", None, None))
            break
        except ValueError as ex:
            out.append(("error", str(ex), None))
            break
        out.append(("batch", batch, part.snapshot()))
    part.close()
    return out


def _lines_of(steps: List[Step]) -> List[str]:
    return [x for kind, batch, _ in steps if kind == "batch" for x in batch]


_GOOD = [
    b"a", b"xyz", b" ", b"\t", b"\n", b"\n", b"\n\n", b"\r\n", b"\r", b"\r\r\n", b"\n\r",
    "é".encode(), "€".encode(), "𝄞".encode(), "\ufeff".encode(), "\u2028".encode(), b"\x00",
]
_BAD = [b"\xff", b"\x80", b"\xe2\x82", b"\xed\xa0\x80", b"\xc3", b"\xf0\x9f\x98"]

_good_piece = st.one_of(
    st.sampled_from(_GOOD),
    # Runs longer than the blocks below (lines longer than a block).
    st.integers(1, 80).map(lambda n: b"L" * n),
    st.integers(1, 30).map(lambda n: "é€".encode() * n),
)
_good_bytes = st.lists(_good_piece, max_size=40).map(b"".join)
_any_bytes = st.lists(
    st.one_of(_good_piece, _good_piece, _good_piece, st.sampled_from(_BAD)), max_size=40
).map(b"".join)
_block = st.sampled_from([1, 2, 3, 4, 7, 16, 64, None])
_batch = st.integers(1, 7)


def _check_same(path: Path, batch_size: int, block_size: Optional[int], state: Any) -> List[Step]:
    new = _steps(_LinePartition(path, batch_size, state, block_size=block_size))
    ref = _steps(_RefLinePartition(path, batch_size, state))
    assert new == ref
    return new


def _check_content(content: bytes, batch_size: int, block_size: Optional[int], data: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "in.txt"
        path.write_bytes(content)
        steps = _check_same(path, batch_size, block_size, None)
        # Every good line (a bad one ends the file here), one at a time.
        every = _lines_of(_steps(_RefLinePartition(path, 1, None)))
        # Resume a fresh partition (another batch and block size) from
        # every snapshot taken: it goes on with exactly the next line.
        done = 0
        for kind, batch, snap in steps:
            if kind == "batch":
                done += len(batch)
            if snap is None:
                continue
            rest = _lines_of(_check_same(path, data.draw(_batch), data.draw(_block), snap))
            if steps[-1][0] == "error":
                # What comes out before the error depends on the batch size.
                assert rest == every[done : done + len(rest)]
            else:
                assert rest == every[done:]
            # A plain offset (older snapshots) resumes at the same line.
            assert _steps(_LinePartition(path, 1, snap[0], block_size=3))[1:] == _steps(
                _RefLinePartition(path, 1, snap[0])
            )[1:]


@settings(max_examples=300, deadline=None)
@given(content=_good_bytes, batch_size=_batch, block_size=_block, data=st.data())
def test_same_batches_and_snapshots_as_readline(content, batch_size, block_size, data):
    _check_content(content, batch_size, block_size, data)


@settings(max_examples=300, deadline=None)
@given(content=_any_bytes, batch_size=_batch, block_size=_block, data=st.data())
def test_same_batches_and_error_as_readline_with_non_utf8(content, batch_size, block_size, data):
    _check_content(content, batch_size, block_size, data)


@settings(max_examples=150, deadline=None)
@given(
    first=_good_bytes,
    appends=st.lists(st.tuples(st.integers(0, 3), _good_bytes), max_size=5),
    batch_size=_batch,
    block_size=_block,
)
def test_a_growing_file_reads_like_readline(first, appends, batch_size, block_size):
    """Lines appended between calls (a partial last line included) are read
    as the readline reader reads them, until a call finds nothing."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "in.txt"
        path.write_bytes(first)
        new = _LinePartition(path, batch_size, None, block_size=block_size)
        ref = _RefLinePartition(path, batch_size, None)

        def call(part: Any) -> Any:
            try:
                return ("batch", part.next_batch(), part.snapshot())
            except StopIteration:
                return ("stop", None, None)

        for calls, more in appends:
            for _ in range(calls):
                assert call(new) == call(ref)
            with open(path, "ab") as f:
                f.write(more)
        while True:
            got = call(new)
            assert got == call(ref)
            if got[0] == "stop":
                break
        new.close()
        ref.close()


def test_default_block_size_on_a_file_of_many_blocks(tmp_path):
    """The real block size over a few MB of mixed lines, snapshots and
    resumes in the middle of blocks included."""
    rnd = random.Random(7)
    words = ["alpha", "é", "€uro", "𝄞", "", "x" * 300, "tab\there", "cr\rin"]
    out = []
    for i in range(60_000):
        line = " ".join(rnd.choice(words) for _ in range(rnd.randint(0, 12)))
        out.append(f"{i} {line}" + rnd.choice(["\n", "\n", "\r\n"]))
    out.append("no newline at the end")
    path = tmp_path / "big.txt"
    path.write_bytes("".join(out).encode("utf-8"))
    assert path.stat().st_size > 3 * files._BLOCK_SIZE
    steps = _check_same(path, 997, None, None)
    assert len(_lines_of(steps)) == 60_001
    for _kind, _b, snap in steps[1::7]:
        if snap is not None:
            _check_same(path, 1000, None, snap)


def test_long_line_spanning_many_blocks(tmp_path):
    path = tmp_path / "in.txt"
    long = "é" * 1000 + "x" * 999
    path.write_bytes(f"a\n{long}\r\nb\n{long}".encode())
    part = _LinePartition(path, 2, None, block_size=16)
    assert part.next_batch() == ["a", long]
    assert part.snapshot()[0] == len(f"a\n{long}\r\n".encode())
    assert part.next_batch() == ["b", long]
    with pytest.raises(StopIteration):
        part.next_batch()
    assert part.snapshot()[0] == path.stat().st_size
    part.close()


def test_empty_file_gives_nothing(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"")
    part = _LinePartition(path, 10, None)
    assert part.snapshot()[0] == 0
    with pytest.raises(StopIteration):
        part.next_batch()
    part.close()


# --- non-UTF-8 lines -------------------------------------------------------------


_BAD_FILE = b"ok\n" * 3 + b"bad \xff here\n" + b"after\n"  # the bad line is at byte 9


@pytest.mark.parametrize("block_size", [None, 1, 4, 11])
def test_non_utf8_error_names_path_and_offset(tmp_path, block_size):
    path = tmp_path / "in.txt"
    path.write_bytes(_BAD_FILE)
    part = _LinePartition(path, 1000, None, block_size=block_size)
    with pytest.raises(ValueError, match=r"in\.txt: line at byte 9 is not UTF-8: .*0xff") as info:
        part.next_batch()
    assert isinstance(info.value.__cause__, UnicodeDecodeError)
    part.close()


@pytest.mark.parametrize("block_size", [None, 2, 5])
def test_non_utf8_batches_before_the_bad_line_are_handed_out(tmp_path, block_size):
    """As with readline: the batches before the one reaching the bad line
    come out, that one raises (its good lines with it), and the snapshot
    points at the first line not handed out."""
    path = tmp_path / "in.txt"
    path.write_bytes(_BAD_FILE)
    part = _LinePartition(path, 2, None, block_size=block_size)
    assert part.next_batch() == ["ok", "ok"]
    assert part.snapshot()[0] == 6
    with pytest.raises(ValueError, match="byte 9"):
        part.next_batch()
    part.close()

    part = _LinePartition(path, 3, None, block_size=block_size)
    assert part.next_batch() == ["ok", "ok", "ok"]
    assert part.snapshot()[0] == 9
    with pytest.raises(ValueError, match="byte 9"):
        part.next_batch()
    part.close()
    # Resumed at the bad line, the first call fails on it.
    with open(path, "rb") as f:
        at_bad = files._position(f, 9)
    part = _LinePartition(path, 3, at_bad, block_size=block_size)
    with pytest.raises(ValueError, match="byte 9"):
        part.next_batch()
    part.close()


def test_non_utf8_offset_counts_bytes_not_chars(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("é€𝄞\r\n".encode() * 100 + b"\xe2\x82\n")
    for block_size in (None, 3, 64):
        part = FileSource(path).build_part("in", "local::x", None)
        part._block_size = block_size or files._BLOCK_SIZE
        with pytest.raises(ValueError, match=f"byte {11 * 100} is not UTF-8"):
            part.next_batch()
        part.close()


def test_dir_source_uses_the_block_reader(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"a1\r\na2\n\na3")
    src = DirSource(tmp_path, "*.txt", batch_size=2)
    part = src.build_part("in", "local::a.txt", None)
    assert isinstance(part, _LinePartition)
    assert part.next_batch() == ["a1", "a2"]
    assert part.snapshot()[0] == 7
    assert part.next_batch() == ["", "a3"]
    with pytest.raises(StopIteration):
        part.next_batch()
    part.close()
