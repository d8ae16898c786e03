"""StdOutSink and StdInSource."""

from __future__ import annotations

import io
import os
import sys
from datetime import datetime, timezone

import pytest

from millpond.connectors.stdio import StdInSource, StdOutSink


def test_stdout_sink_prints_str_of_each_item_per_line(capsys):
    part = StdOutSink().build("out", 0, 1)
    part.write_batch(["a", 1, ("k", 2.5)])
    part.write_batch([])
    part.close()
    assert capsys.readouterr().out == "a\n1\n('k', 2.5)\n"


def test_stdout_sink_follows_redirection_made_after_it_was_built(monkeypatch):
    part = StdOutSink().build("out", 0, 1)
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    part.write_batch(["late"])
    assert buf.getvalue() == "late\n"


@pytest.fixture
def stdin_pipe(monkeypatch):
    r, w = os.pipe()
    reader = os.fdopen(r, "rb")
    monkeypatch.setattr(sys, "stdin", reader)
    yield w
    reader.close()
    try:
        os.close(w)
    except OSError:
        pass


def _drain_ready(part):
    out = []
    while True:
        batch = part.next_batch()
        if not batch:
            return out
        out.extend(batch)


def test_stdin_source_reads_lines_until_stdin_closes(stdin_pipe):
    src = StdInSource(batch_size=2)
    assert src.list_parts() == ["stdin"]
    part = src.build_part("in", "stdin", None)
    os.write(stdin_pipe, b"one\ntwo\r\nthree\npart")
    got = []
    got.extend(part.next_batch())
    assert got == ["one", "two"]
    got.extend(part.next_batch())
    assert got == ["one", "two", "three"]
    os.write(stdin_pipe, b"ial\n")
    got.extend(_drain_ready(part))
    assert got[-1] == "partial"
    os.write(stdin_pipe, b"no newline at end")
    os.close(stdin_pipe)
    rest = []
    with pytest.raises(StopIteration):
        for _ in range(10):
            rest.extend(part.next_batch())
    assert rest == ["no newline at end"]
    assert part.snapshot() is None


def test_stdin_source_does_not_block_when_no_input_is_waiting(stdin_pipe):
    part = StdInSource().build_part("in", "stdin", None)
    before = datetime.now(timezone.utc)
    assert part.next_batch() == []
    # It asks to be woken a little later instead of spinning.
    assert part.next_awake() is not None and part.next_awake() > before


def test_stdin_source_replaces_invalid_utf8(stdin_pipe):
    part = StdInSource().build_part("in", "stdin", None)
    os.write(stdin_pipe, b"ok\xff\n")
    assert part.next_batch() == ["ok\ufffd"]


def test_stdin_source_rejects_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        StdInSource(batch_size=0)
