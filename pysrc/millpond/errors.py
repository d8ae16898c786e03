"""Errors raised by millpond.

``DataflowError`` wraps any exception raised by user code while a flow runs;
the original is its ``__cause__``. The state and recovery errors name the
thing that is wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "DataflowError",
    "StateStoreError",
    "StoreLockedError",
    "ForeignStoreError",
    "StoreLayoutError",
    "SnapshotError",
    "RecoveryError",
    "BackupError",
    "CorruptObjectError",
    "UnauthenticatedError",
    "LocalStoreDamagedError",
    "AbortExecution",
    "ClusterError",
    "MetricsError",
    "keyed_item_error",
]


class DataflowError(RuntimeError):
    """User code raised while the dataflow ran; see ``__cause__``."""


class StateStoreError(RuntimeError):
    """The state store could not do what was asked (I/O, format, misuse)."""


class StoreLockedError(StateStoreError):
    """Another process holds the local state store open."""


class ForeignStoreError(StateStoreError):
    """The local state store belongs to another flow or key-group count."""


class StoreLayoutError(ForeignStoreError):
    """The local state store was written for another worker index or count;
    recovery rebuilds it from the durable store."""


class SnapshotError(StateStoreError):
    """A state object's snapshot could not be serialized; nothing was written."""


class RecoveryError(RuntimeError):
    """Recovery data is missing, inconsistent, or cannot be reached."""


class BackupError(RecoveryError):
    """The durable backup failed (unreachable, denied, or an I/O error)."""


class CorruptObjectError(RecoveryError):
    """A durable or local object failed its checksum or format check."""


class LocalStoreDamagedError(CorruptObjectError, StateStoreError):
    """A worker's local state store failed a checksum or structure check.

    Nothing read from it was used; the store is marked, and the next run
    rebuilds it from the backup (a full resume)."""


class UnauthenticatedError(CorruptObjectError):
    """A recovery record is not sealed by the configured backup key (forged,
    or written without it), or is sealed with a key and none is configured
    (see :mod:`millpond.backupkey`)."""


class ClusterError(RuntimeError):
    """The cluster of processes running a flow could not start or stopped: a
    peer was lost or refused, the processes disagree on the flow, a process
    of an older execution was fenced out. The message names the process
    (``process 2 (10.0.0.7:2101) lost: ...``); run the whole cluster again
    and it resumes from the last committed epoch."""


class MetricsError(RuntimeError):
    """The metrics endpoint (``--metrics-port``) could not be served: its
    address is in use or not this machine's. Nothing ran."""


class AbortExecution(RuntimeError):
    """Raise from a source partition's ``next_batch`` to stop the execution
    at once, as a crash would: no ``on_eof``, no further snapshot, no error
    for the caller. Epochs closed before it still finish committing, nothing
    after the last committed epoch survives. It exists for tests of
    recovery; ``TestingSource.ABORT()`` is the usual way to use it.
    ``millpond.inputs.AbortExecution`` is this same class.
    """


def keyed_item_error(step_id: str, item: object) -> TypeError:
    """The error for an item that is not a ``(str key, value)`` 2-tuple
    reaching a step that needs a keyed stream."""
    if type(item) is tuple and len(item) == 2:
        return TypeError(
            f"step {step_id!r} requires keys to be str; got key of type "
            f"{type(item[0]).__name__}: {item[0]!r:.80} in item {item!r:.80}; "
            "use op.key_on or op.map to make a str key"
        )
    return TypeError(
        f"step {step_id!r} requires a keyed stream of (str key, value) 2-tuples; "
        f"got {type(item).__name__}: {item!r:.80}; use op.key_on to add a key"
    )
