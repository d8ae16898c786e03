"""Ctrl-C and SIGTERM while the flow's thread waits in the Go core.

Python runs a signal handler between bytecodes of the main thread; while
that thread waits in a call into the core (a backup request to an endpoint
that never answers, a commit the run waits for), the handler cannot run and
Ctrl-C seems ignored. Python's C-level handler still writes each signal's
number to the wakeup fd (:func:`signal.set_wakeup_fd`), from whatever thread
the signal lands on. :class:`CoreInterrupts` points that fd at a pipe the
core reads: on SIGINT or SIGTERM the core cancels its calls in flight, the
waiting call returns, and Python's own handler runs as usual.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Optional

__all__ = ["CoreInterrupts"]

logger = logging.getLogger("millpond")


class CoreInterrupts:
    """Route SIGINT and SIGTERM to the core while it is open.

    A no-op outside the main thread (only it may set the wakeup fd) and when
    something else already uses the wakeup fd (an asyncio loop, say), which
    is then left alone.
    """

    def __init__(self) -> None:
        self._write_fd: Optional[int] = None

    def start(self) -> None:
        """Start routing (idempotent)."""
        if self._write_fd is not None or threading.current_thread() is not threading.main_thread():
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:  # pragma: no cover - main thread checked above
            os.close(read_fd)
            os.close(write_fd)
            return
        if previous != -1:
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            logger.debug("signal wakeup fd in use; Ctrl-C reaches calls into the core only when they return")
            return
        from millpond import _core

        _core.watch_interrupts(read_fd)  # the core owns read_fd from here
        self._write_fd = write_fd

    def stop(self) -> None:
        """Stop routing; the core's reader sees the pipe close and ends."""
        fd, self._write_fd = self._write_fd, None
        if fd is None:
            return
        try:
            if signal.set_wakeup_fd(-1) != fd:  # pragma: no cover - someone replaced it meanwhile
                logger.debug("signal wakeup fd was replaced while the core watched it")
        except ValueError:  # pragma: no cover - stop() from another thread
            pass
        os.close(fd)
