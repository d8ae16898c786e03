"""Worker-to-worker routing of items.

Steps that must see all items of a key on one worker (``stateful_batch``,
fixed-partition sinks) and ``redistribute`` hand items to an
:class:`Exchange` addressed to a worker index. The engine drains each
worker's inbox between activations. :class:`LocalExchange` connects workers
of one process; :class:`~millpond.engine.cluster.ClusterExchange` carries
messages across processes behind the same methods.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, List, Protocol, Tuple

__all__ = ["Message", "Exchange", "LocalExchange", "take_all"]


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

    def flush(self) -> None:
        """Hand what was sent since the last flush on (to other processes)."""

    def begin_epoch(self, epoch: int) -> None:
        """The process moved to ``epoch``: messages held for it may go."""

    def congested(self) -> bool:
        """True while sources should wait for sent batches to drain."""


def take_all(box: Deque[Message]) -> List[Message]:
    """Empty ``box``, returning what it held, oldest first."""
    if not box:
        return []
    out = list(box)
    box.clear()
    return out


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
        out = take_all(self._inboxes[worker])
        self._received += len(out)
        return out

    def pending(self) -> bool:
        return self._sent != self._received

    def counts(self) -> Tuple[int, int]:
        return (self._sent, self._received)

    def flush(self) -> None:
        pass

    def begin_epoch(self, epoch: int) -> None:
        pass

    def congested(self) -> bool:
        return False
