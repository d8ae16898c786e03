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

Tools (``--help`` for each; BACKUP is anything ``-b`` of ``python -m
millpond.run`` takes, ``module:factory()`` included)::

    python -m millpond.recovery inspect BACKUP [--flow ID] [--keys] [--json]
    python -m millpond.recovery verify  BACKUP [--flow ID]
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # pragma: no cover
    from typing import NoReturn

from millpond.backup import Backup, backup_from_uri
from millpond.backupkey import KEY_VAR, backup_key_from_env, check_key
from millpond.errors import BackupError, CorruptObjectError, RecoveryError, StateStoreError
from millpond.keygroup import DEFAULT_KEY_GROUP_COUNT
from millpond.livelimit import check_max_live_bytes, check_max_live_keys
from millpond.redact import redact_uri

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
    - ``backup_key``: the key that authenticates the flow's recovery
      records (bytes or str, at least 16 bytes; see
      :mod:`millpond.backupkey`). ``None`` reads ``MILLPOND_BACKUP_KEY`` or
      ``MILLPOND_BACKUP_KEY_FILE``; with neither set, records carry a plain
      checksum, and write access to the backup means code execution on the
      machine that resumes from it (its state is pickled).
    - ``max_live_keys``: the most keyed state objects a worker keeps live
      in memory; colder ones are evicted to its local store and read back
      when touched (``None``: no bound; see docs/recovery.md, "State larger
      than memory"). The ``max_live_keys`` keyword of ``run_main`` and
      ``cluster_main`` overrides it, and works without recovery too.
    - ``max_live_bytes``: about how many bytes of keyed state a worker
      keeps live, estimated from a sample of its keys (``None``: no
      budget). With ``max_live_keys`` as well, the tighter bound wins; the
      keyword of that name overrides it as above.
    """

    local_state_dir: Path
    backup: Union[Backup, str, None] = None
    snapshot_mode: SnapshotMode = SnapshotMode.BATCH
    key_group_count: int = DEFAULT_KEY_GROUP_COUNT
    retain_epochs: int = 2
    retain_for: Optional[timedelta] = None
    max_epochs_in_flight: int = 4
    compact_ratio: float = 0.5
    compact_min_bytes: int = 256 << 10
    backup_key: Union[bytes, str, None] = field(default=None, repr=False)
    max_live_keys: Optional[int] = None
    max_live_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        check_max_live_keys(self.max_live_keys)
        check_max_live_bytes(self.max_live_bytes)
        if self.backup_key is None:
            object.__setattr__(self, "backup_key", backup_key_from_env())
        elif isinstance(self.backup_key, str):
            object.__setattr__(self, "backup_key", check_key(self.backup_key.encode(), "backup_key"))
        elif isinstance(self.backup_key, bytes):
            check_key(self.backup_key, "backup_key")
        else:
            raise TypeError(f"backup_key must be bytes, str or None, got {type(self.backup_key).__name__}")
        d = Path(self.local_state_dir)
        object.__setattr__(self, "local_state_dir", d)
        if d.exists() and not d.is_dir():
            raise ValueError(
                f"local state directory {str(d)!r} exists and is not a directory; "
                "pass a directory, or a path that does not exist yet (it is created)"
            )
        object.__setattr__(self, "snapshot_mode", SnapshotMode.parse(self.snapshot_mode))
        if isinstance(self.backup, str) and not self.backup.strip():
            raise ValueError(f"backup {self.backup!r} is blank; pass a directory, file:///path or s3://bucket/prefix")
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
            # State is the owner's alone: every directory made here is 0700
            # (the umask can only narrow that).
            # (exist_ok: the processes of a local cluster sharing one
            # directory may make it at the same moment.)
            for d in reversed([path, *path.parents]):
                if not d.exists():
                    d.mkdir(mode=0o700, exist_ok=True)
            return backup_from_uri(str(path))
        if isinstance(self.backup, str):
            return backup_from_uri(self.backup)
        return self.backup


# -- command line -------------------------------------------------------------

_PROG = "python -m millpond.recovery"

_DESCRIPTION = "Inspect and verify the recovery data of flows in a backup, without running them."

_EPILOG = """\
BACKUP is what -b of python -m millpond.run takes: a directory,
file:///dir, s3://bucket/prefix (endpoint, region and credentials from the
AWS_* variables or ?endpoint=...&region=...), or 'MODULE:FACTORY()' that
returns a Backup object.

exit status: 0 done (verify: no problem found); 1 verify found a problem,
the backup holds no recovery data, or the backup failed (unreachable,
denied); 2 a bad argument: an unknown option, a BACKUP that cannot be
opened, a --flow that is not in the backup (one line on stderr); 130
Ctrl-C. See docs/recovery.md."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> "NoReturn":
        # One line, as python -m millpond.run does; --help is one flag away.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=_PROG, description=_DESCRIPTION, epilog=_EPILOG,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{inspect,verify}", parser_class=_Parser)
    p_inspect = sub.add_parser(
        "inspect", help="summarize each flow: executions, committed epoch, layout, objects",
        description="Summarize each flow in BACKUP: its executions, newest committed epoch, worker "
        "layout, the objects of the committed state and the total stored.",
        epilog="Exit status: 0 done; 1 no recovery data or the backup failed; 2 a bad argument.",
    )
    p_inspect.add_argument("target", metavar="BACKUP", help="a directory, file:///dir, s3://bucket/prefix or 'MODULE:FACTORY()'")
    p_inspect.add_argument("--flow", metavar="ID", help="only this flow (default: every flow in the backup)")
    p_inspect.add_argument("--keys", action="store_true", help="download the committed state and count keys per step")
    p_inspect.add_argument("--json", action="store_true", help="print the reports as JSON")
    p_verify = sub.add_parser(
        "verify", help="check every object's checksum and the chain of commit records",
        description="Download every object the retained commit records of each flow in BACKUP name, "
        "check its checksum, and check the chain of commit records. Prints 'FLOW: ok' or one line "
        "per problem.",
        epilog="Exit status: 0 no problem; 1 a problem, no recovery data, or the backup failed; "
        "2 a bad argument.",
    )
    p_verify.add_argument("target", metavar="BACKUP", help="a directory, file:///dir, s3://bucket/prefix or 'MODULE:FACTORY()'")
    p_verify.add_argument("--flow", metavar="ID", help="only this flow (default: every flow in the backup)")
    return ap


class _BadArgument(Exception):
    """A command-line argument that cannot be used: exit status 2."""


def _open_target(target: str) -> Any:
    """The backup ``target`` names, opened as ``python -m millpond.run -b``
    would, except that a directory must exist: the tools only read."""
    from millpond.importstr import ImportStringError, backup_from_spec

    try:
        backup = backup_from_spec(target)
    except ImportStringError as exc:
        raise _BadArgument(f"BACKUP {redact_uri(target)}: {exc}") from None
    if not isinstance(backup, str):
        return backup
    scheme, sep, rest = backup.partition("://")
    if sep:
        backup = f"{scheme.lower()}://{rest}"
    if (not sep and backup[:3].lower() != "s3:") or scheme.lower() == "file":
        path = Path(rest if sep else backup)
        if sep and not rest.startswith("/"):
            pass  # the core explains a relative file:// URI
        elif not path.exists():
            raise _BadArgument(f"BACKUP {redact_uri(target)}: no such directory")
        elif not path.is_dir():
            raise _BadArgument(f"BACKUP {redact_uri(target)}: exists and is not a directory")
    try:
        return backup_from_uri(backup)
    except ValueError as exc:
        raise _BadArgument(f"BACKUP {redact_uri(target)}: {exc}") from None


def _print_inspect(r: dict[str, Any]) -> None:
    print(f"flow {r['flow_id']}")
    print(f"  executions       {r['executions']}")
    print(f"  committed epoch  {r['committed_epoch']} (commit records: {len(r['commit_epochs'] or [])})")
    print(f"  layout           {r['worker_count']} worker(s), {r['key_group_count']} key groups")
    print(f"  committed state  {r['objects']} objects ({r['segments']} segments, "
          f"{r['compacted']} compacted), {r['object_bytes']:,} bytes")
    if r["stored_bytes"] < 0:  # a Python backup's listing has no sizes
        print(f"  stored in total  {r['stored_objects']} objects (this backup does not report sizes)")
    else:
        print(f"  stored in total  {r['stored_objects']} objects, {r['stored_bytes']:,} bytes")
    for step, n in sorted((r.get("keys_per_step") or {}).items()):
        print(f"  keys {step:<30} {n:,}")


def _run(args: argparse.Namespace) -> int:
    from millpond import _core
    from millpond.backup import core_handle_for

    backup = _open_target(args.target)
    try:
        key = backup_key_from_env() or b""
    except ValueError as exc:
        raise _BadArgument(str(exc)) from None
    try:
        handle, owned = core_handle_for(backup)
    except TypeError as exc:  # pragma: no cover - backup_from_spec checked the methods
        raise _BadArgument(f"BACKUP {redact_uri(args.target)}: {exc}") from None
    try:
        flows = _core.durable_flows(handle)
        if args.flow is not None:
            if args.flow not in flows:
                there = f"the flows there: {', '.join(flows)}" if flows else "it holds no millpond recovery data"
                raise _BadArgument(f"--flow {args.flow}: no flow {args.flow!r} in {redact_uri(args.target)}; {there}")
            flows = [args.flow]
        if not flows:
            sys.stderr.write(f"{_PROG}: no millpond recovery data in {redact_uri(args.target)}\n")
            return 1
        if args.cmd == "inspect":
            reports = [_core.durable_inspect(handle, f, args.keys, key) for f in flows]
            if args.json:
                print(json.dumps(reports, indent=2))
            else:
                for r in reports:
                    _print_inspect(r)
            return 0
        bad = 0
        if not key:
            # On stderr: stdout stays one line per flow or problem.
            sys.stderr.write(
                f"{_PROG}: note: no backup key ({KEY_VAR}): checked integrity (checksums), not authenticity; "
                "anyone with write access to the backup could have rewritten it\n"
            )
        for f in flows:
            problems = _core.durable_verify(handle, f, key)
            for p in problems:
                print(f"{f}: {p['key']}: {p['problem']}")
            bad += len(problems)
            if not problems:
                print(f"{f}: ok")
        return 1 if bad else 0
    finally:
        if owned:
            _core.backup_close(handle)


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m millpond.recovery {inspect,verify} BACKUP``; returns the exit status."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from millpond.engine.interrupts import CoreInterrupts

    # Ctrl-C must stop a call that waits on a backend that never answers.
    interrupts = CoreInterrupts()
    try:
        interrupts.start()
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except _BadArgument as exc:
        sys.stderr.write(f"{_PROG}: error: {exc}\n")
        return 2
    except ValueError as exc:  # the core found the backup the argument names unusable
        logger.debug("%s failed", args.cmd, exc_info=True)
        sys.stderr.write(f"{_PROG}: error: BACKUP {redact_uri(args.target)}: {exc}\n")
        return 2
    except (RecoveryError, StateStoreError) as exc:
        logger.debug("%s failed", args.cmd, exc_info=True)
        sys.stderr.write(f"{_PROG}: error: {exc}\n")
        return 1
    except OSError as exc:
        logger.debug("%s failed", args.cmd, exc_info=True)
        sys.stderr.write(f"{_PROG}: error: {type(exc).__name__}: {exc}\n")
        return 1
    finally:
        interrupts.stop()


if __name__ == "__main__":
    sys.exit(main())
