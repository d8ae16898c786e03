"""The recovery side of one execution: the engine's run when recovery is on.

:func:`open_recovery_run` reads the durable commit records, restores every
worker's local store (fast or full resume, with progress on long
restores), records the new execution and starts the Go core's commit
pipeline. The engine then drives the returned :class:`RecoveryRun` through
the :class:`~millpond.engine.hooks.Run` hooks: snapshot and close each
epoch, finish at the end. What a user configures lives in
:mod:`millpond.recovery`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

from millpond import _core
from millpond._corebridge import sync_log_level
from millpond.backup import core_handle_for
from millpond.engine.interrupts import CoreInterrupts
from millpond.engine.restore_progress import RestoreProgress
from millpond.errors import RecoveryError, StateStoreError
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.state import StateStore

if TYPE_CHECKING:  # pragma: no cover
    from millpond.engine.cluster import ClusterNode

__all__ = ["RecoveryRun", "open_recovery_run", "WHOLE_FROM"]

logger = logging.getLogger("millpond")

#: In batch mode, an epoch that touched at least this share of a worker's
#: keys snapshots the rest too: the epoch is then the worker's whole state,
#: kept as compacted state and as the local store's next generation. An
#: epoch that rewrites a share f of the state otherwise makes a compaction
#: due every 0.5/f epochs (the default compact_ratio), about 3f of the state
#: uploaded per epoch, and costs the local store a write, an index entry and
#: a collection per row, one at a time (the largest CPU cost of a run whose
#: epochs touch a quarter to a half of the keys: docs/benchmarks.md).
WHOLE_FROM = 0.25


class RecoveryRun:
    """One execution of a flow with recovery; the engine drives it.

    Opening it reads the durable commit records, restores every worker's
    local store (fast or full resume) and records the new execution. Use
    :func:`open_recovery_run`.
    """

    def __init__(
        self,
        config: RecoveryConfig,
        flow_id: str,
        worker_count: int,
        hosted: Optional[Sequence[int]] = None,
        node: Optional["ClusterNode"] = None,
    ) -> None:
        self.config = config
        self.flow_id = flow_id
        self.worker_count = worker_count
        self.hosted = list(range(worker_count) if hosted is None else hosted)
        self.key_group_count = config.key_group_count
        self._immediate = config.snapshot_mode is SnapshotMode.IMMEDIATE
        self._backup = config.open_backup()
        self._backup_handle, self._owns_backup = core_handle_for(self._backup)
        self._handle: Optional[int] = None
        self._stores: dict[int, StateStore] = {}
        # The epoch each worker last snapshotted (snapshot_epoch).
        self._snapshotted = {w: 0 for w in self.hosted}
        self.restores: list[dict[str, Any]] = []
        # Ctrl-C must stop a call that waits on a backend that never
        # answers, as it stops the flow anywhere else.
        self._interrupts = CoreInterrupts()
        self._interrupts.start()
        sync_log_level(_core)
        start = time.perf_counter()
        try:
            self._handle = _core.run_open(
                str(config.local_state_dir), flow_id, worker_count, config.key_group_count,
                self._backup_handle, config.snapshot_mode.value, config.max_epochs_in_flight,
                config.retain_epochs, config.retain_for.total_seconds() if config.retain_for else 0.0,
                float(config.compact_ratio), config.compact_min_bytes,
                config.backup_key if isinstance(config.backup_key, bytes) else b"",
                (node.handle or 0) if node is not None else 0, self.hosted[0] if self.hosted else 0,
                len(self.hosted) if node is not None else 0,
            )
            info = _core.run_info(self._handle)
            self.execution: int = info["execution"]
            self.resume_epoch: int = info["resume_epoch"]
            self.committed_epoch_at_open: int = info["committed_epoch"]
            for w in self.hosted:
                self._stores[w] = self._restore(w)
            _core.run_start(self._handle)
        except BaseException:
            self._release()
            raise
        self.resume_seconds = time.perf_counter() - start
        kinds = sorted({str(r["kind"]) for r in self.restores})
        if all(int(r["keys"]) >= 0 for r in self.restores):
            restored = f"{sum(int(r['keys']) for r in self.restores)} keys restored"
        else:
            # A store left uncollected may hold older versions of a key
            # (collected in the background from now on): its rows are not
            # its keys, and counting the keys would hold up the resume.
            restored = (f"{sum(int(r['rows']) for r in self.restores)} stored rows restored "
                        "(keys and older versions not yet collected)")
        logger.info(
            "resume flow %r: %s resume, execution %d, resume epoch %d, %s on %d worker(s) in %.3f s",
            flow_id, "+".join(kinds), self.execution, self.resume_epoch, restored, len(self.hosted), self.resume_seconds,
        )

    def _restore(self, w: int) -> StateStore:
        """Restore worker ``w``, showing progress while a full resume runs."""
        handle = self._require()
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["value"] = _core.run_restore(handle, w)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                result["error"] = exc

        t = threading.Thread(target=work, name=f"millpond-restore-{w}", daemon=True)
        t.start()
        progress = RestoreProgress(f"restore worker {w}")
        while t.is_alive():
            t.join(0.25)
            progress.update(_core.run_progress(handle))
        progress.done(_core.run_progress(handle))
        if "error" in result:
            raise result["error"]
        store_handle, info = result["value"]
        self.restores.append(info)
        # The core knows the handle belongs to the run: snapshots go
        # through it, by the same call as a store's opened alone.
        store = StateStore(
            store_handle, self.flow_id, w, self.worker_count, self.key_group_count, self.resume_epoch,
            self.config.local_state_dir / self.flow_id / f"worker-{w:04d}" / "store.sqlite",
        )
        if not self._immediate:
            store.whole_from = WHOLE_FROM
        return store

    def worker_store(self, worker_index: int) -> StateStore:
        """The state store of worker ``worker_index``, positioned at the resume epoch."""
        return self._stores[worker_index]

    def activation_done(self, worker_index: int, epoch: int) -> None:
        """In immediate mode, make what the activation touched durable now."""
        if self._immediate:
            self._stores[worker_index].snapshot(epoch)

    def snapshot_epoch(self, worker_index: int, epoch: int) -> None:
        """Write the worker's touched state at ``epoch`` (see :meth:`close_epoch`).

        Snapshotting every worker before closing any lets the commit
        pipeline know, as each worker closes, whether the epoch holds every
        worker's whole state: then the deletions in it are not written at
        all (see docs/recovery.md)."""
        self._stores[worker_index].snapshot(epoch)
        self._snapshotted[worker_index] = epoch

    def close_epoch(self, worker_index: int, epoch: int, last: bool = False) -> None:
        """Hand the worker's ``epoch`` to the commit pipeline, snapshotting it
        first unless :meth:`snapshot_epoch` did; waits when too many epochs
        are still uploading or compaction is behind. ``last`` marks the
        final epoch of the run (:meth:`finish` comes next): it does not wait
        for compaction, which only bounds the growth of a run that goes on."""
        if self._snapshotted[worker_index] != epoch:
            self.snapshot_epoch(worker_index, epoch)
        _core.run_close_epoch(self._require(), worker_index, epoch, last)
        if logger.isEnabledFor(logging.DEBUG):
            self._log_commits()

    def committed_epoch(self) -> int:
        """The newest epoch this process knows committed (a cheap core call)."""
        if self._handle is None:
            return self.committed_epoch_at_open
        return _core.run_committed_epoch(self._handle)

    def _log_commits(self) -> None:
        """Log the commits the background pipeline made since the last call."""
        for ev in _core.run_commits(self._require()):
            logger.debug(
                "flow %r epoch %d committed: %d rows in %d objects, %d bytes, %.3f s after its close",
                self.flow_id, ev["epoch"], ev["rows"], ev["objects"], ev["bytes"], ev["latency_seconds"],
            )

    def finish(self, aborted: bool) -> None:
        """Wait for every closed epoch to commit, then stop background work.

        ``aborted``: the run stopped early (an error, an abort, Ctrl-C);
        an epoch not every worker closed is dropped, as a crash would."""
        failed = True
        try:
            _core.run_finish(self._require(), aborted)
            failed = False
        finally:
            if logger.isEnabledFor(logging.DEBUG):
                self._log_commits()
            m = self.metrics()
            if aborted or failed:
                logger.info(
                    "flow %r execution %d stopped early; committed epoch %d is where the next run resumes",
                    self.flow_id, self.execution, m["committed_epoch"],
                )
            else:
                epochs = max(1, m["committed_epoch"] - self.resume_epoch + 1)
                raw = m["segment_raw_bytes"] + m["compacted_raw_bytes"]
                logger.info(
                    "flow %r execution %d finished: committed epoch %d, %d segments (%d bytes) uploaded, "
                    "%d bytes before compression; %d compacted objects (%d bytes, %d before compression); "
                    "%d bytes uploaded in all, %d per epoch over %d epochs (%.1fx compression); "
                    "commit latency p50 %.3f s p99 %.3f s, %.3f s waiting on back-pressure; "
                    "background: %.3f s local writes, %.3f s local GC, %d compactions in %.3f s, "
                    "%d whole-state epochs kept as compacted state",
                    self.flow_id, self.execution, m["committed_epoch"], m["segments_uploaded"],
                    m["segment_bytes"], m["segment_raw_bytes"], m["compacted_uploaded"],
                    m["compacted_bytes"], m["compacted_raw_bytes"], m["bytes_uploaded"],
                    m["bytes_uploaded"] // epochs, epochs, raw / max(1, m["bytes_uploaded"]),
                    m["commit_latency_p50"], m["commit_latency_p99"],
                    m["backpressure_seconds"], m["local_write_seconds"], m["local_gc_seconds"],
                    m["compactions"], m["compaction_seconds"], m["whole_epochs"],
                )

    def metrics(self) -> dict[str, Any]:
        """Commit and upload figures: committed epoch, bytes, latencies, waits."""
        if self._handle is None:
            return {}
        return _core.run_metrics(self._handle)

    def close(self) -> None:
        """Close the stores and release everything. Closing twice is a no-op."""
        self._release()

    def _require(self) -> int:
        if self._handle is None:
            raise RecoveryError("recovery run is closed")
        return self._handle

    def _release(self) -> None:
        for s in self._stores.values():
            s.close()
        self._stores = {}
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                _core.run_close(handle)
            except (RecoveryError, StateStoreError) as exc:
                logger.warning("closing recovery run: %s", exc)
        if self._owns_backup:
            _core.backup_close(self._backup_handle)
            self._owns_backup = False
        self._interrupts.stop()
        # What the core logged while the run went on reaches logging
        # before the run returns.
        _core.log_flush()

    def __enter__(self) -> "RecoveryRun":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_recovery_run(
    config: RecoveryConfig,
    flow_id: str,
    worker_count: int,
    hosted: Optional[Sequence[int]] = None,
    node: Optional["ClusterNode"] = None,
) -> RecoveryRun:
    """Start an execution of ``flow_id`` with recovery: resume point, new
    execution record, restored worker stores. In a cluster (``node``),
    this process hosts ``hosted`` of the ``worker_count`` workers, and the
    processes agree on the execution and resume epoch before it returns."""
    if not isinstance(config, RecoveryConfig):
        raise TypeError(f"recovery_config must be a RecoveryConfig, got {type(config).__name__}")
    return RecoveryRun(config, flow_id, worker_count, hosted, node)
