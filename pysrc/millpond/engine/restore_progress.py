"""The progress line of a long restore: drawn on a terminal, logged
every few seconds otherwise.

A full resume first downloads and checks the objects, then merges their
rows into the local store; the bar gives each phase half its width, so it
reads full only when the rows are in, not when the last byte arrived.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Mapping, TextIO

__all__ = ["RestoreProgress"]

logger = logging.getLogger("millpond")

_WIDTH = 24
_LOG_EVERY = 5.0


class RestoreProgress:
    """Shows the counters of one worker's restore (``_core.run_progress``)."""

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self.label = label
        self.stream = stream
        self.tty = stream.isatty()
        self.last_log = time.monotonic()
        self.shown = False

    @staticmethod
    def fraction(c: Mapping[str, int]) -> float:
        """How far the restore is, from 0 to 1: downloads by bytes for the
        first half, rows merged for the second."""
        down = c["bytes_done"] / c["bytes_total"] if c["bytes_total"] else 1.0
        rows = min(1.0, c["rows_restored"] / c["rows_total"]) if c["rows_total"] else float(down == 1.0)
        return 0.5 * down + 0.5 * rows if down < 1.0 else 0.5 + 0.5 * rows

    def text(self, c: Mapping[str, int]) -> str:
        """The counters in words."""
        mib = 2**20
        head = (
            f"{self.label}: {c['objects_done']}/{c['objects_total']} objects, "
            f"{c['bytes_done'] / mib:.1f}/{c['bytes_total'] / mib:.1f} MiB"
        )
        if c["objects_done"] < c["objects_total"]:
            return head + " downloaded"
        return head + f"; {c['rows_restored']:,} of at most {c['rows_total']:,} rows loaded"

    def update(self, c: Mapping[str, int]) -> None:
        """Redraw (or, off a terminal, log now and then) the counters."""
        if c["objects_total"] == 0:
            return
        if self.tty:
            filled = min(_WIDTH - 1, int(_WIDTH * self.fraction(c)))
            self.stream.write(f"\r[{'#' * filled}{'.' * (_WIDTH - filled)}] {self.text(c)}")
            self.stream.flush()
            self.shown = True
        elif time.monotonic() - self.last_log > _LOG_EVERY:
            logger.info(self.text(c))
            self.last_log = time.monotonic()

    def done(self, c: Mapping[str, int]) -> None:
        """The restore finished: draw the full bar and end the line."""
        if self.shown:
            self.stream.write(f"\r[{'#' * _WIDTH}] {self.text(c)}\n")
            self.stream.flush()
