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
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional, Union

from millpond._corebridge import core
from millpond.backup import Backup, backup_from_uri
from millpond.errors import BackupError, CorruptObjectError, RecoveryError
from millpond.keygroup import DEFAULT_KEY_GROUP_COUNT

__all__ = [
    "SnapshotMode",
    "RecoveryConfig",
    "RecoveryError",
    "BackupError",
    "CorruptObjectError",
    "main",
]

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


@dataclass(frozen=True)
class RecoveryConfig:
    """Where and how a flow's state is kept.

    - ``local_state_dir``: the directory of the workers' local stores
      (fast resume, reads of restored state); made with its parents when
      the run starts if it does not exist yet.
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
        if d.exists() and not d.is_dir():
            raise ValueError(
                f"local state directory {str(d)!r} exists and is not a directory; "
                "pass a directory, or a path that does not exist yet (it is created)"
            )
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
            path.mkdir(parents=True, exist_ok=True)
            return backup_from_uri(str(path))
        if isinstance(self.backup, str):
            return backup_from_uri(self.backup)
        return self.backup


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
