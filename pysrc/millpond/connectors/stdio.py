"""Standard input and output as a source and a sink.

``StdOutSink`` writes each item's ``str()`` on its own line; every worker
writes its own items, so with several workers lines interleave in no fixed
order. ``StdInSource`` reads lines from standard input until it closes.
Neither can resume: standard streams do not replay.

Example::

    op.output("print", counts, StdOutSink())
"""

from __future__ import annotations

import os
import select
import sys
from datetime import datetime, timedelta, timezone
from typing import Any, List, Optional

from millpond.inputs import FixedPartitionedSource, StatefulSourcePartition
from millpond.outputs import DynamicSink, StatelessSinkPartition

__all__ = ["StdOutSink", "StdInSource"]


class _StdOutPartition(StatelessSinkPartition[Any]):
    def write_batch(self, items: List[Any]) -> None:
        if not items:
            return
        # Look the stream up on every batch so that redirection (pytest's
        # capsys, contextlib.redirect_stdout) made after the flow was built
        # still applies.
        out = sys.stdout
        out.write("".join(f"{item}\n" for item in items))
        out.flush()


class StdOutSink(DynamicSink[Any]):
    """Write ``str(item)`` and a newline to standard output for each item.

    Output is flushed after each batch, so it shows up promptly when piped.
    """

    def build(self, step_id: str, worker_index: int, worker_count: int) -> StatelessSinkPartition[Any]:
        return _StdOutPartition()


class _StdInPartition(StatefulSourcePartition[str, None]):
    # Polls the file descriptor with select() and reads raw chunks, because
    # a blocking readline() would stall the worker (and every other step on
    # it) whenever no input is waiting.
    _CHUNK = 1 << 16

    def __init__(self, batch_size: int, poll_interval: timedelta) -> None:
        self._fd = sys.stdin.fileno()
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._buf = b""
        self._eof = False
        self._awake: Optional[datetime] = None

    def next_batch(self) -> List[str]:
        self._awake = None
        if not self._eof and b"\n" not in self._buf:
            ready, _, _ = select.select([self._fd], [], [], 0)
            if ready:
                chunk = os.read(self._fd, self._CHUNK)
                if chunk:
                    self._buf += chunk
                else:
                    self._eof = True
        lines = self._buf.split(b"\n")
        # The last element is an incomplete line (or b"" after a newline).
        rest = lines.pop()
        if len(lines) > self._batch_size:
            rest = b"\n".join(lines[self._batch_size :] + [rest])
            lines = lines[: self._batch_size]
        self._buf = rest
        if self._eof and not lines:
            if self._buf:
                lines, self._buf = [self._buf], b""
            else:
                raise StopIteration()
        if not lines and not self._eof:
            self._awake = datetime.now(timezone.utc) + self._poll_interval
        return [line.decode("utf-8", errors="replace").removesuffix("\r") for line in lines]

    def next_awake(self) -> Optional[datetime]:
        return self._awake

    def snapshot(self) -> None:
        return None


class StdInSource(FixedPartitionedSource[str, None]):
    """Read lines (without line endings) from standard input until it closes.

    One partition, read by one worker; up to ``batch_size`` lines per batch.
    When no input is waiting it checks again every ``poll_interval``. It
    cannot resume: a resumed run reads whatever standard input brings then.
    Invalid UTF-8 is replaced with U+FFFD rather than stopping the flow.
    """

    def __init__(self, batch_size: int = 1000, poll_interval: timedelta = timedelta(milliseconds=20)) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._batch_size = batch_size
        self._poll_interval = poll_interval

    def list_parts(self) -> List[str]:
        return ["stdin"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> StatefulSourcePartition[str, None]:
        return _StdInPartition(self._batch_size, self._poll_interval)
