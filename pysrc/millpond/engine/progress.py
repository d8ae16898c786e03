"""Epoch progress: when may the current epoch close, and which inputs ended.

The engine runs epochs in lockstep: every input partition emits into the
current epoch until the epoch closes, then all workers close it together
(write outputs, snapshot state) before the next one starts. So inputs never
run ahead of the slowest worker by more than the epoch in progress; the
durable layer adds its own bounded back-pressure in ``close_epoch``.

Deciding to close needs everyone's view: each process reports a
:class:`LocalProgress` and gets back a :class:`ClusterProgress` once all
processes have reported and no exchange message is in flight.
:class:`LocalProgress` answers at once for a single process; a multi-process
tracker implements the same protocol over the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Optional, Protocol

__all__ = ["LocalProgress", "ClusterProgress", "EpochProgress", "SingleProcessProgress"]


@dataclass(frozen=True)
class LocalProgress:
    """One process's view of the current epoch."""

    epoch: int
    #: This process's inputs want the epoch closed: the interval elapsed, a
    #: batch was emitted with a zero interval, or all its partitions ended.
    ready: bool
    #: Exchange messages sent and received by this process so far.
    sent: int
    received: int
    #: Input step indexes whose partitions on this process have all ended.
    done_inputs: FrozenSet[int]
    #: 0 decides the close of the epoch; 1, 2, ... settle the batches sent
    #: by the end-of-input work of each stateful step that ended in it.
    phase: int = 0


@dataclass(frozen=True)
class ClusterProgress:
    """The agreed decision for the current epoch."""

    epoch: int
    close: bool
    #: Input step indexes that ended on every process.
    done_inputs: FrozenSet[int]


class EpochProgress(Protocol):
    """Agreement between processes on closing epochs."""

    def report(self, local: LocalProgress) -> Optional[ClusterProgress]:
        """Report this process's view; return the decision, or ``None`` while
        other processes have not reported yet (the caller keeps draining its
        exchange and reports again)."""


class SingleProcessProgress:
    """Progress for one process: its own view is the cluster's."""

    def report(self, local: LocalProgress) -> Optional[ClusterProgress]:
        if local.sent != local.received:
            # Messages still queued: drain them before deciding.
            return ClusterProgress(local.epoch, False, local.done_inputs)
        return ClusterProgress(local.epoch, local.ready, local.done_inputs)
