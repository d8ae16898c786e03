"""File sources and sinks: reading, resuming from byte offsets, truncating on resume."""

from __future__ import annotations

import csv
import io
import os
import tempfile
import zlib
from pathlib import Path
from typing import List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond.connectors.files import CSVSource, DirSink, DirSource, FileSink, FileSource


def _drain(part) -> List:
    out = []
    while True:
        try:
            out.extend(part.next_batch())
        except StopIteration:
            return out


def _only_part(src):
    (name,) = src.list_parts()
    return name


# --- FileSource ----------------------------------------------------------------


def test_file_source_reads_lines_without_endings(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"one\ntwo\r\n  three  \n\nlast")
    src = FileSource(path)
    part = src.build_part("in", _only_part(src), None)
    assert _drain(part) == ["one", "two", "  three  ", "", "last"]
    part.close()


def test_file_source_batches_up_to_batch_size(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("".join(f"{i}\n" for i in range(5)))
    src = FileSource(path, batch_size=2)
    part = src.build_part("in", _only_part(src), None)
    assert part.next_batch() == ["0", "1"]
    assert part.next_batch() == ["2", "3"]
    assert part.next_batch() == ["4"]
    with pytest.raises(StopIteration):
        part.next_batch()


def test_file_source_snapshot_is_byte_offset_after_last_emitted_line(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("é\nb\n", encoding="utf-8")
    src = FileSource(path, batch_size=1)
    part = src.build_part("in", _only_part(src), None)
    assert part.snapshot()[0] == 0
    part.next_batch()
    assert part.snapshot()[0] == len("é\n".encode("utf-8"))


def test_file_source_resumes_from_a_plain_offset(tmp_path):
    # Snapshots of older versions hold the offset alone.
    path = tmp_path / "in.txt"
    path.write_text("a\nb\n")
    src = FileSource(path, batch_size=5)
    assert _drain(src.build_part("in", _only_part(src), 2)) == ["b"]


def test_file_source_warns_when_the_input_was_replaced(tmp_path, caplog):
    path = tmp_path / "in.txt"
    path.write_text("a\nb\nc\n")
    src = FileSource(path, batch_size=1)
    part = src.build_part("in", _only_part(src), None)
    part.next_batch()
    snap = part.snapshot()
    part.close()
    # The same flow id over the same file, unchanged: no warning.
    with caplog.at_level("WARNING", logger="millpond"):
        assert _drain(src.build_part("in", _only_part(src), snap)) == ["b", "c"]
    assert not caplog.records
    # Another input under the same name: resumed, with a warning naming it.
    path.write_text("x\ny\nz\n")
    with caplog.at_level("WARNING", logger="millpond"):
        assert _drain(src.build_part("in", _only_part(src), snap)) == ["y", "z"]
    assert any("changed since the snapshot" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)


def test_file_source_resumes_after_the_snapshot(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a\nb\nc\n")
    src = FileSource(path, batch_size=1)
    part = src.build_part("in", _only_part(src), None)
    part.next_batch()
    snap = part.snapshot()
    part.next_batch()  # read but never committed
    part.close()
    resumed = src.build_part("in", _only_part(src), snap)
    assert _drain(resumed) == ["b", "c"]


def test_file_source_partition_name_is_stable_and_includes_fs_id(tmp_path):
    path = tmp_path / "in.txt"
    assert FileSource(path).list_parts() == [f"local::{path}"]
    assert FileSource(path, get_fs_id=lambda p: "host1").list_parts() == [f"host1::{path}"]


def test_file_source_rejects_fs_id_with_separator(tmp_path):
    with pytest.raises(ValueError, match="::"):
        FileSource(tmp_path / "x", get_fs_id=lambda p: "a::b").list_parts()


def test_file_source_rejects_resume_past_end_of_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a\n")
    with pytest.raises(ValueError, match="truncated or replaced"):
        FileSource(path).build_part("in", "local::x", 100)


def test_file_source_names_the_file_on_bad_utf8(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"ok\n\xff\xfe\n")
    part = FileSource(path).build_part("in", "local::x", None)
    with pytest.raises(ValueError, match="in.txt.*byte 3"):
        part.next_batch()


def test_file_source_missing_file_fails_when_built_not_when_defined(tmp_path):
    src = FileSource(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError):
        src.build_part("in", _only_part(src), None)


def test_file_source_rejects_bad_batch_size(tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        FileSource(tmp_path / "x", batch_size=0)


_line = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=8)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_line, max_size=20), batch_size=st.integers(1, 4), data=st.data())
def test_file_source_resume_at_any_snapshot_yields_the_rest_exactly(lines, batch_size, data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "in.txt"
        path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
        src = FileSource(path, batch_size=batch_size)
        name = _only_part(src)
        part = src.build_part("in", name, None)
        emitted: List[str] = []
        stops = data.draw(st.integers(0, len(lines) // batch_size + 1))
        for _ in range(stops):
            try:
                emitted.extend(part.next_batch())
            except StopIteration:
                break
        snap = part.snapshot()
        part.close()
        rest = _drain(src.build_part("in", name, snap))
        assert emitted + rest == lines


# --- DirSource -----------------------------------------------------------------


def test_dir_source_has_one_sorted_partition_per_matching_file(tmp_path):
    (tmp_path / "b.txt").write_text("b1\n")
    (tmp_path / "a.txt").write_text("a1\na2\n")
    (tmp_path / "skip.log").write_text("x\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("c1\n")
    src = DirSource(tmp_path, "*.txt")
    assert src.list_parts() == ["local::a.txt", "local::b.txt"]
    assert DirSource(tmp_path, "**/*.txt").list_parts() == ["local::a.txt", "local::b.txt", "local::sub/c.txt"]
    parts = {name: _drain(src.build_part("in", name, None)) for name in src.list_parts()}
    assert parts == {"local::a.txt": ["a1", "a2"], "local::b.txt": ["b1"]}


def test_dir_source_resumes_each_file_at_its_own_offset(tmp_path):
    (tmp_path / "a.txt").write_text("a1\na2\n")
    src = DirSource(tmp_path, batch_size=1)
    part = src.build_part("in", "local::a.txt", None)
    part.next_batch()
    assert _drain(src.build_part("in", "local::a.txt", part.snapshot())) == ["a2"]


def test_dir_source_fails_clearly_when_dir_is_missing(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        DirSource(tmp_path / "nope")


def test_dir_source_fails_clearly_when_dir_goes_before_the_run(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    src = DirSource(d)
    d.rmdir()
    with pytest.raises(ValueError, match="does not exist"):
        src.list_parts()


# --- CSVSource -----------------------------------------------------------------


def test_csv_source_yields_a_dict_per_row(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('name,qty\nbolt,3\n"nut, hex",5\n\nshort\n', encoding="utf-8")
    src = CSVSource(path)
    rows = _drain(src.build_part("in", _only_part(src), None))
    assert rows == [
        {"name": "bolt", "qty": "3"},
        {"name": "nut, hex", "qty": "5"},
        {"name": "short", "qty": None},
    ]


def test_csv_source_passes_format_parameters(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("a;b\n1;2\n")
    src = CSVSource(path, delimiter=";")
    assert _drain(src.build_part("in", _only_part(src), None)) == [{"a": "1", "b": "2"}]


def test_csv_source_rejects_unknown_format_parameter_at_definition(tmp_path):
    with pytest.raises(TypeError):
        CSVSource(tmp_path / "x.csv", delimeter=";")


def test_csv_source_strips_byte_order_mark_from_header(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes("\ufeffa,b\n1,2\n".encode("utf-8"))
    src = CSVSource(path)
    assert _drain(src.build_part("in", _only_part(src), None)) == [{"a": "1", "b": "2"}]


def test_csv_source_empty_file_has_no_rows(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("")
    src = CSVSource(path)
    assert _drain(src.build_part("in", _only_part(src), None)) == []


def test_csv_source_resume_rereads_header_and_continues_after_multiline_row(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('k,v\n1,"multi\nline"\n2,x\n3,y\n')
    src = CSVSource(path, batch_size=1)
    name = _only_part(src)
    part = src.build_part("in", name, None)
    assert part.next_batch() == [{"k": "1", "v": "multi\nline"}]
    snap = part.snapshot()
    assert snap[0] == len(b'k,v\n1,"multi\nline"\n')
    assert _drain(src.build_part("in", name, snap)) == [{"k": "2", "v": "x"}, {"k": "3", "v": "y"}]


_cell = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"), max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(_cell, _cell), max_size=12),
    batch_size=st.integers(1, 3),
    data=st.data(),
)
def test_csv_source_resume_at_any_snapshot_yields_the_rest_exactly(rows, batch_size, data):
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["a", "b"])
    writer.writerows(rows)
    # A row of two empty cells is written as a blank-looking line that
    # DictReader reads as ['', ''] only if quoted; csv.writer writes `,`
    # which reads back as two empty strings, so nothing is skipped.
    expected = [{"a": a, "b": b} for a, b in rows]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "in.csv"
        path.write_text(buf.getvalue(), encoding="utf-8")
        src = CSVSource(path, batch_size=batch_size)
        name = _only_part(src)
        part = src.build_part("in", name, None)
        emitted = []
        for _ in range(data.draw(st.integers(0, len(rows) + 1))):
            try:
                emitted.extend(part.next_batch())
            except StopIteration:
                break
        snap = part.snapshot()
        part.close()
        assert emitted + _drain(src.build_part("in", name, snap)) == expected


# --- FileSink --------------------------------------------------------------------


def test_file_sink_writes_values_with_end(tmp_path):
    path = tmp_path / "out" / "o.txt"
    sink = FileSink(path, end=";")
    (name,) = sink.list_parts()
    part = sink.build_part("out", name, None)
    part.write_batch(["a", "b"])
    part.write_batch([])
    part.write_batch(["ç"])
    part.close()
    assert path.read_text(encoding="utf-8") == "a;b;ç;"


def test_file_sink_routes_every_key_to_its_one_partition(tmp_path):
    sink = FileSink(tmp_path / "o.txt")
    assert {sink.part_fn(k) for k in ["a", "b", "zzz"]} == {0}


def test_file_sink_fresh_start_truncates_existing_file(tmp_path):
    path = tmp_path / "o.txt"
    path.write_text("old output\n")
    part = FileSink(path).build_part("out", str(path), None)
    part.write_batch(["new"])
    part.close()
    assert path.read_text() == "new\n"


def test_file_sink_snapshot_is_bytes_written(tmp_path):
    path = tmp_path / "o.txt"
    part = FileSink(path).build_part("out", str(path), None)
    part.write_batch(["é"])
    offset, token, fingerprint = part.snapshot()
    assert offset == len("é\n".encode("utf-8"))
    assert isinstance(token, bytes) and len(token) == 16
    assert fingerprint == zlib.crc32("é\n".encode("utf-8"))
    # The snapshot promises the bytes are on disk, visible to a new reader.
    assert path.read_bytes() == "é\n".encode("utf-8")


def test_file_sink_truncates_to_snapshot_on_resume(tmp_path):
    path = tmp_path / "o.txt"
    sink = FileSink(path)
    part = sink.build_part("out", str(path), None)
    part.write_batch(["1", "2"])
    snap = part.snapshot()
    part.write_batch(["3-uncommitted"])
    part.close()
    resumed = sink.build_part("out", str(path), snap)
    resumed.write_batch(["3"])
    resumed.close()
    assert path.read_text() == "1\n2\n3\n"


def test_file_sink_refuses_to_resume_past_end_of_file(tmp_path):
    path = tmp_path / "o.txt"
    path.write_text("ab")
    with pytest.raises(ValueError, match="truncated or replaced"):
        FileSink(path).build_part("out", str(path), 10)
    with pytest.raises(ValueError, match="truncated or replaced"):
        FileSink(path).build_part("out", str(path), (10, b"t" * 16, 0))
    assert path.read_text() == "ab"


def test_file_sink_refuses_a_file_rewritten_since_the_snapshot(tmp_path):
    path = tmp_path / "o.txt"
    part = FileSink(path).build_part("out", str(path), None)
    part.write_batch(["one", "two"])
    snap = part.snapshot()
    part.commit(1)
    part.close()
    path.write_text("ONE\ntwo\nmore\n")
    with pytest.raises(ValueError, match=r"o\.txt: the bytes before byte 8 are not those"):
        FileSink(path).build_part("out", str(path), snap)
    assert path.read_text() == "ONE\ntwo\nmore\n", "a refused resume changed the file"


def test_file_sink_resumes_from_a_plain_offset_of_older_snapshots(tmp_path):
    path = tmp_path / "o.txt"
    path.write_text("a\nb\n")
    part = FileSink(path).build_part("out", str(path), 2)
    part.write_batch(["c"])
    part.close()
    assert path.read_text() == "a\nc\n"


# --- FileSink: what a resume cuts off is kept until the run commits ----------------


def _undo_files(path: Path) -> List[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.millpond-undo"))


def _committed_run(path: Path, lines: List[str]) -> "tuple[object, object]":
    """A run that writes ``lines`` one batch each, snapshotting after each;
    returns the snapshots after the first and the last batch."""
    part = FileSink(path).build_part("out", str(path), None)
    snaps = []
    for line in lines:
        part.write_batch([line])
        snaps.append(part.snapshot())
    part.commit(1)
    part.close()
    return snaps[0], snaps[-1]


@pytest.mark.parametrize("wrong_state", ["older", "none"])
def test_file_sink_puts_back_what_a_resume_from_a_wrong_state_cut_off(tmp_path, wrong_state):
    """A run handed an older state (or none) by a damaged local store cuts
    committed output off; it commits nothing (the store's check stops it),
    and the next resume, from the right state, finds the file as it was."""
    path = tmp_path / "o.txt"
    old, committed = _committed_run(path, ["1", "2", "3"])
    bad = FileSink(path).build_part("out", str(path), old if wrong_state == "older" else None)
    assert path.read_text() == ("1\n" if wrong_state == "older" else "")
    bad.write_batch(["x", "y", "z", "w"])  # replayed from the wrong state
    bad.close()  # stopped before any commit
    good = FileSink(path).build_part("out", str(path), committed)
    assert path.read_text() == "1\n2\n3\n"
    good.write_batch(["4"])
    good.commit(2)
    good.close()
    assert path.read_text() == "1\n2\n3\n4\n"
    assert _undo_files(path) == [], "the record outlived the commit"


def test_file_sink_keeps_the_cut_of_a_run_that_committed(tmp_path):
    """A run whose commit landed but that was killed before it dropped its
    record: the resume state carries that run's token, and its writes stay."""
    path = tmp_path / "o.txt"
    first, _ = _committed_run(path, ["1", "2", "3"])
    run = FileSink(path).build_part("out", str(path), first)
    run.write_batch(["b"])
    committed = run.snapshot()  # this epoch commits; the kill comes before commit()
    run.write_batch(["uncommitted"])
    run.close()
    assert _undo_files(path), "the record is kept until the commit"
    again = FileSink(path).build_part("out", str(path), committed)
    assert path.read_text() == "1\nb\n"
    again.close()


def test_file_sink_undo_survives_a_second_run_that_commits_nothing(tmp_path):
    """Two runs in a row resume from a wrong state and commit nothing: the
    file still comes back as the last committing run left it."""
    path = tmp_path / "o.txt"
    old, committed = _committed_run(path, ["1", "2", "3"])
    for state in (old, None):
        bad = FileSink(path).build_part("out", str(path), state)
        bad.write_batch(["junk"])
        bad.close()
    good = FileSink(path).build_part("out", str(path), committed)
    good.close()
    assert path.read_text() == "1\n2\n3\n"


@pytest.mark.parametrize("left", ["description only", "data only", "damaged description"])
def test_file_sink_ignores_an_incomplete_undo_record(tmp_path, left):
    """A kill while the record was being made leaves part of it, and the
    file untouched: the part is removed and the file used as it is."""
    path = tmp_path / "o.txt"
    old, committed = _committed_run(path, ["1", "2", "3"])
    bad = FileSink(path).build_part("out", str(path), old)
    bad.close()
    data = path.with_name(f".{path.name}.millpond-undo")
    meta = data.with_name(data.name + ".meta")
    path.write_text("1\n2\n3\n")  # as the file was before the cut
    if left == "description only":
        data.unlink()
    elif left == "data only":
        meta.unlink()
    else:
        raw = bytearray(meta.read_bytes())
        raw[20] ^= 1
        meta.write_bytes(bytes(raw))
    good = FileSink(path).build_part("out", str(path), committed)
    good.close()
    assert path.read_text() == "1\n2\n3\n"
    assert _undo_files(path) == []


def test_file_sink_empties_a_symlinked_file_in_place(tmp_path):
    """A fresh run keeps the old file by renaming it aside, which would
    replace a symbolic link (or a hard-linked file) by a plain file: such a
    path is emptied in place instead, without a record."""
    target = tmp_path / "target.txt"
    target.write_text("old\n")
    link = tmp_path / "o.txt"
    link.symlink_to(target)
    part = FileSink(link).build_part("out", str(link), None)
    part.write_batch(["new"])
    part.close()
    assert link.is_symlink() and target.read_text() == "new\n"
    assert _undo_files(link) == []


def test_file_sink_keeps_the_files_mode_when_it_renames_it_aside(tmp_path):
    path = tmp_path / "o.txt"
    path.write_text("old\n")
    path.chmod(0o640)
    part = FileSink(path).build_part("out", str(path), None)
    part.close()
    assert path.stat().st_mode & 0o777 == 0o640
    assert path.read_text() == ""


def test_file_sink_truncates_without_a_record_when_none_can_be_made(tmp_path, monkeypatch, caplog):
    """A directory that does not take the record (read-only, full) costs
    the safety net, not the resume."""
    from millpond.connectors import _undo

    path = tmp_path / "o.txt"
    _, committed = _committed_run(path, ["1", "2"])
    with open(path, "a") as f:
        f.write("uncommitted\n")

    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_undo, "_write_synced", full)
    part = FileSink(path).build_part("out", str(path), committed)
    part.write_batch(["3"])
    part.close()
    assert path.read_text() == "1\n2\n3\n"
    assert "cannot keep the 12 bytes" in caplog.text
    assert _undo_files(path) == []


@settings(max_examples=100, deadline=None)
@given(runs=st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=6))
def test_file_sink_output_is_what_the_committed_runs_wrote(runs):
    """Runs resume either from the committed state (then write and may
    commit) or from a wrong one (older, or none; then write and never
    commit). After a last resume from the committed state, the file holds
    exactly the committed output; or, only when a run was killed between
    its commit and dropping its undo record and a later one resumed from a
    wrong state (the record can then not tell), a resume refuses the file."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "o.txt"
        committed: object = None
        history: List[object] = [None]  # every committed state so far
        expected = ""
        window = False  # a commit whose record was not dropped
        double_fault = False
        try:
            for n, (wrong, back, writes) in enumerate(runs):
                state = history[max(0, len(history) - 1 - back)] if wrong else committed
                if wrong and back == 0:
                    state = None
                double_fault = double_fault or (wrong and window)
                part = FileSink(path).build_part("out", str(path), state)
                lines = [f"r{n}-{i}" for i in range(writes)]
                for line in lines:
                    part.write_batch([line])
                if not wrong and writes:
                    committed = part.snapshot()
                    history.append(committed)
                    expected += "".join(line + "\n" for line in lines)
                    if n % 2:
                        part.commit(n)
                        window = False
                    else:
                        window = True  # killed between the commit and commit()
                part.write_batch(["uncommitted"])
                part.close()
            last = FileSink(path).build_part("out", str(path), committed)
            last.close()
        except ValueError as ex:
            assert double_fault, f"refused without a double fault: {ex}"
            assert "o.txt" in str(ex)
            return
        assert path.read_text() == expected


def test_file_sink_rejects_non_str_values_naming_the_file(tmp_path):
    path = tmp_path / "o.txt"
    part = FileSink(path).build_part("out", str(path), None)
    with pytest.raises(TypeError, match=r"o\.txt.*str.*int"):
        part.write_batch(["ok", 3])


def test_file_sink_close_is_idempotent(tmp_path):
    part = FileSink(tmp_path / "o.txt").build_part("out", "x", None)
    part.close()
    part.close()


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(st.text(max_size=5), max_size=4), max_size=8),
    data=st.data(),
)
def test_file_sink_crash_and_resume_equals_uninterrupted_output(batches, data):
    """Whatever was written after the last snapshot is replaced by the replay."""
    expected = "".join(v + "\n" for b in batches for v in b)
    commit_at = data.draw(st.integers(0, len(batches)))
    crash_at = data.draw(st.integers(commit_at, len(batches)))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "o.txt"
        sink = FileSink(path)
        part = sink.build_part("out", str(path), None)
        snap = part.snapshot()
        for i, b in enumerate(batches[:crash_at]):
            part.write_batch(b)
            if i + 1 == commit_at:
                snap = part.snapshot()
        part.close()
        resumed = sink.build_part("out", str(path), snap)
        for b in batches[commit_at:]:
            resumed.write_batch(b)
        resumed.close()
        assert path.read_bytes().decode("utf-8") == expected


# --- DirSink ---------------------------------------------------------------------


def test_dir_sink_lists_one_partition_per_file(tmp_path):
    sink = DirSink(tmp_path, 3)
    assert sink.list_parts() == ["part_0", "part_1", "part_2"]
    named = DirSink(tmp_path, 2, file_namer=lambda i, n: f"{i}-of-{n}.txt")
    assert named.list_parts() == ["0-of-2.txt", "1-of-2.txt"]


def test_dir_sink_assigns_files_by_key(tmp_path):
    sink = DirSink(tmp_path, 4, assign_file=lambda k: int(k))
    assert [sink.part_fn(k) for k in ["0", "1", "5", "7"]] == [0, 1, 1, 3]
    default = DirSink(tmp_path, 4)
    assert all(0 <= default.part_fn(k) < 4 for k in ["a", "b", "c", "ü"])
    assert default.part_fn("a") == default.part_fn("a")


def test_dir_sink_partitions_write_and_resume_like_file_sink(tmp_path):
    out = tmp_path / "out"
    sink = DirSink(out, 2)
    part = sink.build_part("out", "part_1", None)
    part.write_batch(["x"])
    snap = part.snapshot()
    part.write_batch(["lost"])
    part.close()
    resumed = sink.build_part("out", "part_1", snap)
    resumed.write_batch(["y"])
    resumed.close()
    assert (out / "part_1").read_text() == "x\ny\n"
    assert not (out / "part_0").exists()


@pytest.mark.parametrize("count", [0, -1])
def test_dir_sink_rejects_non_positive_file_count(tmp_path, count):
    with pytest.raises(ValueError, match="file_count"):
        DirSink(tmp_path, count)


def test_dir_sink_rejects_duplicate_file_names(tmp_path):
    with pytest.raises(ValueError, match="file_namer"):
        DirSink(tmp_path, 2, file_namer=lambda i, n: "same")


def test_file_to_file_copy_with_crash_is_exactly_once(tmp_path):
    """Source and sink snapshots taken together make a replay invisible."""
    src_path = tmp_path / "in.txt"
    lines = [f"line {i}" for i in range(10)]
    src_path.write_text("".join(x + "\n" for x in lines))
    out = tmp_path / "out.txt"
    src, sink = FileSource(src_path, batch_size=3), FileSink(out)
    sp, kp = src.build_part("in", _only_part(src), None), sink.build_part("out", str(out), None)
    kp.write_batch(sp.next_batch())
    committed = (sp.snapshot(), kp.snapshot())  # an epoch closes
    kp.write_batch(sp.next_batch())  # then the process dies mid-epoch
    sp.close()
    kp.close()
    sp = src.build_part("in", _only_part(src), committed[0])
    kp = sink.build_part("out", str(out), committed[1])
    kp.write_batch(_drain(sp))
    kp.close()
    assert out.read_text().splitlines() == lines
    assert os.path.getsize(out) == src_path.stat().st_size


# --- through the engine, with its fake recovery run -----------------------------------


class _AbortingFileSource(FileSource):
    """A FileSource whose partition crashes the execution after N batches, once."""

    def __init__(self, path, abort_after, batch_size):
        super().__init__(path, batch_size=batch_size)
        self.abort_after = abort_after

    def build_part(self, step_id, for_part, resume_state):
        from millpond.errors import AbortExecution

        inner = super().build_part(step_id, for_part, resume_state)
        src = self
        real_next_batch = inner.next_batch

        def next_batch():
            if src.abort_after is not None:
                if src.abort_after == 0:
                    src.abort_after = None
                    raise AbortExecution("crash for the test")
                src.abort_after -= 1
            return real_next_batch()

        inner.next_batch = next_batch
        return inner


@pytest.mark.parametrize("abort_after", [0, 1, 3, 6, 20])
@pytest.mark.parametrize("epoch_ms", [0, 1000])
def test_engine_file_to_file_flow_aborted_then_resumed_is_exactly_once(tmp_path, monkeypatch, abort_after, epoch_ms):
    from datetime import timedelta

    import millpond.operators as op
    from millpond.dataflow import Dataflow
    from millpond.testing import run_main

    from helpers.engine_fakes import FakeDurable, install

    install(monkeypatch)
    lines = [f"line {i}" for i in range(17)]
    (tmp_path / "in.txt").write_text("".join(x + "\n" for x in lines))
    out = tmp_path / "out.txt"
    out.write_text("stale output of an older run\n")
    flow = Dataflow("copy")
    src = _AbortingFileSource(tmp_path / "in.txt", abort_after, batch_size=2)
    up = op.map("upper", op.input("in", flow, src), str.upper)
    op.output("out", op.key_on("one", up, lambda _x: "one"), FileSink(out))
    durable = FakeDurable()
    interval = timedelta(milliseconds=epoch_ms)
    run_main(flow, epoch_interval=interval, recovery_config=durable)  # aborts (unless past EOF)
    run_main(flow, epoch_interval=interval, recovery_config=durable)
    assert out.read_text() == "".join(x.upper() + "\n" for x in lines)
