"""Recovery: configuration, the per-execution recovery run, and inspection tools.

Turn recovery on by passing a :class:`RecoveryConfig` to ``run_main`` /
``cluster_main`` (or ``-d``/``-b`` to ``python -m millpond.run``):

>>> import tempfile
>>> cfg = RecoveryConfig(tempfile.mkdtemp())   # backup defaults to <dir>/backup
>>> cfg.snapshot_mode
<SnapshotMode.BATCH: 'batch'>

Every epoch, each worker's touched state is written to its local store
(``local_state_dir``) and shipped as a segment to the backup; epoch ``e``
is committed once every worker's segments up to ``e`` are uploaded. A new
execution resumes after the newest committed epoch: from the local store
when it is current (fast resume), otherwise by rebuilding it from the
backup (full resume: a new machine, a lost disk, or a different worker
count).

Tools::

    python -m millpond.recovery inspect URI_OR_DIR [--flow ID] [--keys]
    python -m millpond.recovery verify  URI_OR_DIR [--flow ID]
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional, Union

from millpond._corebridge import core, raise_core_error
from millpond.backup import Backup, backup_from_uri, core_handle_for
from millpond.errors import RecoveryError
from millpond.keygroup import DEFAULT_KEY_GROUP_COUNT
from millpond.state import StateStore

__all__ = ["SnapshotMode", "RecoveryConfig", "RecoveryRun", "open_recovery_run", "RecoveryError", "main"]

logger = logging.getLogger("millpond")


class SnapshotMode(enum.Enum):
    """When snapshots become durable segments.

    ``BATCH``: one segment per worker per epoch, written when the epoch
    closes. ``IMMEDIATE``: a segment after every activation, for the
    smallest window of state that is not yet durable; compaction keeps the
    object count bounded.
    """

    BATCH = "batch"
    IMMEDIATE = "immediate"

    @classmethod
    def parse(cls, value: Union[str, "SnapshotMode"]) -> "SnapshotMode":
        """Accept a mode or its name (``"batch"``/``"immediate"``, any case)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(f"unknown snapshot mode {value!r}; use 'batch' or 'immediate'") from None


_GO_MODE = {SnapshotMode.BATCH: 0, SnapshotMode.IMMEDIATE: 1}

# In batch mode, an epoch that touched at least this share of a worker's keys
# snapshots the rest too: the epoch is then the worker's whole state, kept as
# compacted state, where otherwise the segments of an epoch that rewrote most
# of the state soon make a compaction due that writes all of it again.
WHOLE_FROM = 0.5


@dataclass(frozen=True)
class RecoveryConfig:
    """Where and how a flow's state is kept.

    - ``local_state_dir``: an existing directory for the workers' local
      stores (fast resume, reads of restored state).
    - ``backup``: the durable store: a :class:`~millpond.backup.Backup`
      object or a URI (``/dir``, ``file:///dir``, ``s3://bucket/prefix``).
      ``None`` means a directory ``local_state_dir/backup`` (fine for a
      single machine; use a real durable store for anything else).
    - ``snapshot_mode``: :class:`SnapshotMode` or its name.
    - ``key_group_count``: fixed for the life of the flow's recovery data;
      it bounds how many workers the state can be spread over.
    - ``retain_epochs``: commit records (and the objects they name) kept
      for point-in-time restore of recent epochs.
    - ``retain_for``: a :class:`~datetime.timedelta`; commit records
      written within this long are kept too, however many epochs that
      spans (``None``: keep by epochs only).
    - ``max_epochs_in_flight``: epochs closed but not yet committed before
      the flow waits for uploads (back-pressure).
    - ``compact_ratio`` / ``compact_min_bytes``: compact the durable state
      when the segments written since the last compaction exceed
      ``compact_ratio`` times the compacted state (and ``compact_min_bytes``).
    """

    local_state_dir: Path
    backup: Union[Backup, str, None] = None
    snapshot_mode: SnapshotMode = SnapshotMode.BATCH
    key_group_count: int = DEFAULT_KEY_GROUP_COUNT
    retain_epochs: int = 10
    retain_for: Optional[timedelta] = None
    max_epochs_in_flight: int = 4
    compact_ratio: float = 0.5
    compact_min_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        d = Path(self.local_state_dir)
        object.__setattr__(self, "local_state_dir", d)
        if not d.is_dir():
            what = "is not a directory" if d.exists() else "does not exist"
            raise ValueError(f"local state directory {str(d)!r} {what}; create it first (mkdir -p {d})")
        object.__setattr__(self, "snapshot_mode", SnapshotMode.parse(self.snapshot_mode))
        if isinstance(self.backup, str):
            scheme = self.backup.split("://", 1)[0] if "://" in self.backup else ""
            if scheme not in ("", "file", "s3"):
                raise ValueError(
                    f"unknown backup URI scheme {scheme!r} in {self.backup!r}; "
                    "use a path, file:///path or s3://bucket/prefix"
                )
        elif self.backup is not None:
            for name in ("list_keys", "upload", "download", "delete"):
                if not callable(getattr(self.backup, name, None)):
                    raise TypeError(f"backup {self.backup!r} lacks a {name}() method (see millpond.backup.Backup)")
        checks = (
            ("key_group_count", self.key_group_count, 1),
            ("retain_epochs", self.retain_epochs, 1),
            ("max_epochs_in_flight", self.max_epochs_in_flight, 1),
            ("compact_min_bytes", self.compact_min_bytes, 0),
        )
        for name, value, least in checks:
            if type(value) is not int or value < least:
                raise ValueError(f"{name} must be an int of at least {least}, got {value!r}")
        if self.retain_for is not None and (
            not isinstance(self.retain_for, timedelta) or self.retain_for < timedelta(0)
        ):
            raise ValueError(f"retain_for must be a non-negative datetime.timedelta or None, got {self.retain_for!r}")
        if not self.compact_ratio > 0:
            raise ValueError(f"compact_ratio must be positive, got {self.compact_ratio!r}")

    def open_backup(self) -> Any:
        """Return the backup object this config names (a new one for URIs)."""
        if self.backup is None:
            path = self.local_state_dir / "backup"
            path.mkdir(exist_ok=True)
            return backup_from_uri(str(path))
        if isinstance(self.backup, str):
            return backup_from_uri(self.backup)
        return self.backup


class RecoveryRun:
    """One execution of a flow with recovery; the engine drives it.

    Opening it reads the durable commit records, records the new execution,
    and restores every worker's local store (fast or full resume). Use
    :func:`open_recovery_run`.
    """

    def __init__(self, config: RecoveryConfig, flow_id: str, worker_count: int) -> None:
        self.config = config
        self.flow_id = flow_id
        self.worker_count = worker_count
        self.key_group_count = config.key_group_count
        self._immediate = config.snapshot_mode is SnapshotMode.IMMEDIATE
        self._backup = config.open_backup()
        self._backup_handle, self._owns_backup = core_handle_for(self._backup)
        self._handle: Optional[int] = None
        self._stores: list[StateStore] = []
        # The epoch each worker last snapshotted (snapshot_epoch).
        self._snapshotted = [0] * worker_count
        self.restores: list[dict[str, Any]] = []
        c = core()
        start = time.perf_counter()
        try:
            self._handle = c.run_open(
                str(config.local_state_dir), flow_id, worker_count, config.key_group_count,
                self._backup_handle, _GO_MODE[config.snapshot_mode], config.max_epochs_in_flight,
                config.retain_epochs, config.retain_for.total_seconds() if config.retain_for else 0.0,
                float(config.compact_ratio), config.compact_min_bytes,
            )
            self.execution, self.resume_epoch, self.committed_epoch, _ = c.run_info(self._handle)
            for w in range(worker_count):
                self._stores.append(self._restore(w))
            c.run_start(self._handle)
        except c.CoreError as exc:
            self._release()
            raise_core_error(exc)
        except BaseException:
            self._release()
            raise
        self.resume_seconds = time.perf_counter() - start
        kinds = sorted({r["Kind"] for r in self.restores})
        keys = sum(int(r["Rows"]) for r in self.restores)
        logger.info(
            "resume flow %r: %s resume, execution %d, resume epoch %d, %d keys restored on %d worker(s) in %.3f s",
            flow_id, "+".join(kinds), self.execution, self.resume_epoch, keys, worker_count, self.resume_seconds,
        )

    def _restore(self, w: int) -> StateStore:
        """Restore worker ``w``, showing progress while a full resume downloads."""
        c = core()
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["value"] = c.run_restore(self._handle, w)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                result["error"] = exc

        t = threading.Thread(target=work, name=f"millpond-restore-{w}", daemon=True)
        t.start()
        progress = _Progress(f"restore worker {w}")
        while t.is_alive():
            t.join(0.25)
            progress.update(c.run_progress(self._handle))
        progress.done()
        if "error" in result:
            raise result["error"]
        store_handle, info_json = result["value"]
        info = json.loads(info_json)
        self.restores.append(info)
        run_handle = self._handle

        def write(epoch: int, rows: list, whole: bool = False) -> int:
            return c.run_write(run_handle, w, epoch, rows, whole)

        store = StateStore._attach(
            store_handle, self.flow_id, w, self.worker_count, self.key_group_count, self.resume_epoch,
            self.config.local_state_dir / self.flow_id / f"worker-{w:04d}" / "store.sqlite", write,
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
        try:
            core().run_close_epoch(self._require(), worker_index, epoch, last)
        except core().CoreError as exc:
            raise_core_error(exc)
        if logger.isEnabledFor(logging.DEBUG):
            self._log_commits()

    def _log_commits(self) -> None:
        """Log the commits the background pipeline made since the last call."""
        for ev in json.loads(core().run_commits(self._require())) or []:
            logger.debug(
                "flow %r epoch %d committed: %d rows in %d objects, %d bytes, %.3f s after its close",
                self.flow_id, ev["epoch"], ev["rows"], ev["objects"], ev["bytes"], ev["latency_seconds"],
            )

    def finish(self, aborted: bool) -> None:
        """Wait for every closed epoch to commit, then stop background work."""
        try:
            core().run_finish(self._require(), aborted)
        except core().CoreError as exc:
            raise_core_error(exc)
        finally:
            if logger.isEnabledFor(logging.DEBUG):
                self._log_commits()
            m = self.metrics()
            logger.info(
                "flow %r execution %d finished: committed epoch %d, %d segments (%d bytes) uploaded, "
                "commit latency p50 %.3f s p99 %.3f s, %.3f s waiting on back-pressure; "
                "background: %.3f s local writes, %.3f s local GC, %d compactions in %.3f s, "
                "%d whole-state epochs kept as compacted state",
                self.flow_id, self.execution, m["committed_epoch"], m["segments_uploaded"], m["bytes_uploaded"],
                m["commit_latency_p50"], m["commit_latency_p99"], m["backpressure_seconds"],
                m["local_write_seconds"], m["local_gc_seconds"], m["compactions"], m["compaction_seconds"],
                m.get("whole_epochs", 0),
            )

    def metrics(self) -> dict[str, Any]:
        """Commit and upload figures: committed epoch, bytes, latencies, waits."""
        if self._handle is None:
            return {}
        return json.loads(core().run_metrics(self._handle))

    def close(self) -> None:
        """Close the stores and release everything. Closing twice is a no-op."""
        self._release()

    def _require(self) -> int:
        if self._handle is None:
            raise RecoveryError("recovery run is closed")
        return self._handle

    def _release(self) -> None:
        for s in self._stores:
            s.close()
        self._stores = []
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                core().run_close(handle)
            except core().CoreError as exc:
                logger.warning("closing recovery run: %s", exc.args[-1])
        if self._owns_backup:
            core().backup_close(self._backup_handle)
            self._owns_backup = False

    def __enter__(self) -> "RecoveryRun":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_recovery_run(config: RecoveryConfig, flow_id: str, worker_count: int) -> RecoveryRun:
    """Start an execution of ``flow_id`` with recovery: resume point, new
    execution record, restored worker stores."""
    if not isinstance(config, RecoveryConfig):
        raise TypeError(f"recovery_config must be a RecoveryConfig, got {type(config).__name__}")
    return RecoveryRun(config, flow_id, worker_count)


class _Progress:
    """A progress line for long restores: drawn on a terminal, logged otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last_log = time.monotonic()
        self.shown = False

    def update(self, counters: tuple) -> None:
        done, total, bdone, btotal, rows = counters
        if total == 0:
            return
        text = f"{self.label}: {done}/{total} objects, {bdone / 2**20:.1f}/{btotal / 2**20:.1f} MiB, {rows:,} rows"
        if self.tty:
            width = 24
            filled = int(width * bdone / btotal) if btotal else width
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}")
            sys.stderr.flush()
            self.shown = True
        elif time.monotonic() - self.last_log > 5:
            logger.info(text)
            self.last_log = time.monotonic()

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


# -- command line -------------------------------------------------------------


def _open_target(target: str) -> Any:
    return backup_from_uri(target)


def _flows(backup: Any, flow: Optional[str]) -> list[str]:
    if flow:
        return [flow]
    return json.loads(core().durable_report(backup.core_handle(), 2, "", False))


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m millpond.recovery {inspect,verify} URI_OR_DIR``."""
    ap = argparse.ArgumentParser(prog="python -m millpond.recovery", description="Inspect and verify recovery data.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_inspect = sub.add_parser("inspect", help="flows, executions, committed epochs, objects, keys per step")
    p_inspect.add_argument("target", help="backup URI or directory")
    p_inspect.add_argument("--flow", help="only this flow id")
    p_inspect.add_argument("--keys", action="store_true", help="download committed state and count keys per step")
    p_inspect.add_argument("--json", action="store_true", help="print JSON")
    p_verify = sub.add_parser("verify", help="check every checksum and the commit chain")
    p_verify.add_argument("target", help="backup URI or directory")
    p_verify.add_argument("--flow", help="only this flow id")
    args = ap.parse_args(argv)
    try:
        backup = _open_target(args.target)
        flows = _flows(backup, args.flow)
        if not flows:
            print(f"no millpond recovery data in {args.target}", file=sys.stderr)
            return 1
        c = core()
        if args.cmd == "inspect":
            reports = [json.loads(c.durable_report(backup.core_handle(), 0, f, args.keys)) for f in flows]
            if args.json:
                print(json.dumps(reports, indent=2))
                return 0
            for r in reports:
                print(f"flow {r['flow_id']}")
                print(f"  executions       {r['executions']}")
                print(f"  committed epoch  {r['committed_epoch']} (commit records: {len(r['commit_epochs'] or [])})")
                print(f"  layout           {r['worker_count']} worker(s), {r['key_group_count']} key groups")
                print(f"  committed state  {r['objects']} objects ({r['segments']} segments, "
                      f"{r['compacted']} compacted), {r['object_bytes']:,} bytes")
                print(f"  stored in total  {r['stored_objects']} objects, {r['stored_bytes']:,} bytes")
                for step, n in sorted((r.get("keys_per_step") or {}).items()):
                    print(f"  keys {step:<30} {n:,}")
            return 0
        bad = 0
        for f in flows:
            problems = json.loads(c.durable_report(backup.core_handle(), 1, f, False)) or []
            for p in problems:
                print(f"{f}: {p['key']}: {p['problem']}")
            bad += len(problems)
            if not problems:
                print(f"{f}: ok")
        return 1 if bad else 0
    except core().CoreError as exc:
        print(f"error: {exc.args[-1]}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
