"""Worker-to-worker routing of items.

Steps that must see all items of a key on one worker (``stateful_batch``,
fixed-partition sinks) and ``redistribute`` hand items to an
:class:`Exchange` addressed to a worker index. The engine drains each
worker's inbox between activations. :class:`LocalExchange` connects workers
of one process; an implementation carrying messages across processes only
has to implement the same four methods (and count what it sent and received
so the progress tracker can tell when nothing is in flight).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, List, Protocol, Tuple

__all__ = ["Message", "Exchange", "LocalExchange"]


@dataclass(frozen=True)
class Message:
    """A batch of items for one input port of one step on one worker."""

    step: int
    port: int
    epoch: int
    items: List[Any]


class Exchange(Protocol):
    """Delivers item batches between workers."""

    def send(self, to_worker: int, message: Message) -> None:
        """Queue ``message`` for ``to_worker`` (which may be the sender)."""

    def receive(self, worker: int) -> List[Message]:
        """Take every message queued for ``worker``, oldest first."""

    def pending(self) -> bool:
        """True while any message sent by this process is not yet received."""

    def counts(self) -> Tuple[int, int]:
        """``(sent, received)`` message totals, for termination detection."""


class LocalExchange:
    """In-process exchange between ``worker_count`` cooperative workers."""

    def __init__(self, worker_count: int) -> None:
        self._inboxes: List[Deque[Message]] = [deque() for _ in range(worker_count)]
        self._sent = 0
        self._received = 0

    def send(self, to_worker: int, message: Message) -> None:
        self._inboxes[to_worker].append(message)
        self._sent += 1

    def receive(self, worker: int) -> List[Message]:
        box = self._inboxes[worker]
        if not box:
            return []
        out = list(box)
        box.clear()
        self._received += len(out)
        return out

    def pending(self) -> bool:
        return self._sent != self._received

    def counts(self) -> Tuple[int, int]:
        return (self._sent, self._received)
