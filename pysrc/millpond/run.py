"""Run a dataflow from the command line: ``python -m millpond.run IMPORT_STR``.

``IMPORT_STR`` names the flow as ``MODULE_OR_PATH[:ATTR]``:

* ``flows.wordcount`` or ``flows/wordcount.py``: the module's ``flow``;
* ``flows.wordcount:counts``: the module's ``counts``;
* ``flows.wordcount:get_flow("/tmp/in.txt", n=3)``: the result of calling
  the module's ``get_flow`` with those arguments, which must be Python
  literals (strings, numbers, ``None``, booleans, lists, tuples, dicts,
  sets); nothing in them is executed.

Options, each with an environment variable used when the flag is absent:

======================================  ===============================  =========================================
flag                                    environment variable             meaning
======================================  ===============================  =========================================
``-w/--workers-per-process N``          ``MILLPOND_WORKERS_PER_PROCESS``  workers in this process; they take turns
                                                                         on one thread and split the keys
``-i/--process-id I|auto``              ``MILLPOND_PROCESS_ID``           this process's index in ``--addresses``;
                                                                         ``auto``: the host name's trailing ordinal
``-a/--addresses "h:p;h:p"``            ``MILLPOND_ADDRESSES``            every process of the cluster
``-p/--processes N``                    ``MILLPOND_PROCESSES``            start N local processes as one cluster
                                                                         (127.0.0.1, free ports)
``-s/--epoch-interval SECONDS``         ``MILLPOND_EPOCH_INTERVAL``       epoch length (float, default 10)
``-d/--local-state-dir DIR``            ``MILLPOND_LOCAL_STATE_DIR``      turns recovery on; the local store
``-b/--backup URI|module:factory()``    ``MILLPOND_BACKUP``               the durable store
``--snapshot-mode batch|immediate``     ``MILLPOND_SNAPSHOT_MODE``        when state is snapshotted
``--max-live-keys N``                   ``MILLPOND_MAX_LIVE_KEYS``        keyed state objects kept in memory per
                                                                         worker; colder ones go to disk
``--max-live-bytes SIZE``               ``MILLPOND_MAX_LIVE_BYTES``       the same as an approximate size
                                                                         (``512MiB``, ``2GB``), estimated
                                                                         from a sample of the keys
``--tls-cert FILE``                     ``MILLPOND_TLS_CERT``             TLS between the processes of a cluster:
                                                                         this process's certificate (PEM)
``--tls-key FILE``                      ``MILLPOND_TLS_KEY``              the certificate's private key (PEM)
``--tls-ca FILE``                       ``MILLPOND_TLS_CA``               the CA of every process's certificate:
                                                                         mutual TLS
``--metrics-port N``                    ``MILLPOND_METRICS_PORT``         serve Prometheus metrics at
                                                                         ``http://127.0.0.1:N/metrics`` (0: a free
                                                                         port); needs ``millpond[metrics]``
``--metrics-address HOST``              ``MILLPOND_METRICS_ADDRESS``      listen on HOST instead of 127.0.0.1
``--log-level LEVEL``                   ``MILLPOND_LOG_LEVEL``            logging level (default ``INFO``)
``--version``                                                            print ``millpond X.Y.Z`` and exit
======================================  ===============================  =========================================

Exit status (the full table is in docs/cli.md): 0 when the flow finished;
2 for anything found wrong before the flow starts (a bad flag or
environment variable, a backup that cannot be opened, an ``IMPORT_STR``
that does not give a valid ``Dataflow``), with one line on stderr naming
the flag, variable or ``IMPORT_STR``; 1 when the flow failed while
starting or running (the error and its cause on stderr); 130 on Ctrl-C;
143 on SIGTERM (both stop the run as a crash would, closing its stores).
Run with ``--log-level DEBUG`` to get full tracebacks in the log.

From Python, :func:`cli_main` runs a flow with the same settings::

    if __name__ == "__main__":
        cli_main(flow, workers_per_process=2, epoch_interval=1.0)
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple, Union

from millpond.importstr import (
    ImportStringError,
    backup_from_spec,
    headline,
    is_backup_spec_factory,
    locate_dataflow,
    summarize,
    user_location,
)
from millpond.redact import redact_uri

if TYPE_CHECKING:
    from millpond.engine.interrupts import CoreInterrupts

__all__ = ["cli_main", "locate_dataflow", "parse_addresses", "main", "ImportStringError"]

logger = logging.getLogger("millpond.run")

_PROG = "python -m millpond.run"


# ---------------------------------------------------------------------------
# Running a flow


def cli_main(
    flow: Any,
    *,
    workers_per_process: int = 1,
    process_id: Optional[int] = None,
    addresses: Optional[Sequence[str]] = None,
    epoch_interval: Union[timedelta, float, int, None] = None,
    recovery_config: Any = None,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
    tls_ca: Optional[str] = None,
    max_live_keys: Optional[int] = None,
    metrics_port: Optional[int] = None,
    metrics_address: str = "127.0.0.1",
    max_live_bytes: Optional[int] = None,
) -> None:
    """Run ``flow`` in this process with the command line's settings.

    ``workers_per_process`` workers run in this process: they take turns on
    the calling thread and each owns a share of the keys. For a cluster, give
    every process the same ``addresses`` (``"host:port"`` strings) and its own
    ``process_id`` (its index in ``addresses``); leave both unset for a
    single process. ``epoch_interval`` is a ``timedelta`` or seconds (``None``
    means the engine default, 10 seconds). ``recovery_config`` is a
    :class:`millpond.recovery.RecoveryConfig` or ``None`` for no recovery.
    ``tls_cert``/``tls_key`` (PEM files) turn on TLS between the processes
    of a cluster, ``tls_ca`` mutual TLS (default: ``MILLPOND_TLS_*``).
    ``max_live_keys`` bounds the keyed state objects each worker keeps in
    memory (default: ``MILLPOND_MAX_LIVE_KEYS``, else no bound), and
    ``max_live_bytes`` their approximate bytes (default:
    ``MILLPOND_MAX_LIVE_BYTES``, else no budget).
    ``metrics_port`` serves Prometheus metrics at
    ``http://METRICS_ADDRESS:PORT/metrics`` while the flow runs (0 picks a
    free port; needs ``pip install 'millpond[metrics]'``, else
    ``ImportError``; docs/operations.md).

    Returns when the flow's inputs are exhausted. Errors in user code raise
    :class:`millpond.errors.DataflowError`; Ctrl-C raises
    ``KeyboardInterrupt``. Raises ``ValueError`` or ``TypeError`` for bad
    arguments, before anything runs.
    """
    from millpond.dataflow import Dataflow
    from millpond.engine import cluster_main

    if not isinstance(flow, Dataflow):
        raise TypeError(f"flow must be a millpond.dataflow.Dataflow, got {type(flow).__name__}")
    if not isinstance(workers_per_process, int) or workers_per_process < 1:
        raise ValueError(f"workers_per_process must be a positive int, got {workers_per_process!r}")
    if (process_id is None) != (addresses is None):
        raise ValueError("process_id and addresses go together: give both for a cluster, neither for one process")
    addrs: List[str] = list(addresses) if addresses is not None else []
    proc_id = 0 if process_id is None else process_id
    if addrs and not 0 <= proc_id < len(addrs):
        raise ValueError(f"process_id must be between 0 and {len(addrs) - 1} for {len(addrs)} addresses, got {proc_id}")
    interval = _as_interval(epoch_interval)
    tls: Dict[str, Optional[str]] = {}
    if tls_cert is not None or tls_key is not None or tls_ca is not None:
        # Only when set: cluster_main takes them from MILLPOND_TLS_* otherwise.
        tls = {"tls_cert": tls_cert, "tls_key": tls_key, "tls_ca": tls_ca}
    cluster_main(
        flow,
        addrs,
        proc_id,
        epoch_interval=interval,
        recovery_config=recovery_config,
        worker_count_per_proc=workers_per_process,
        max_live_keys=max_live_keys,
        max_live_bytes=max_live_bytes,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
        **tls,
    )


def _as_interval(value: Union[timedelta, float, int, None]) -> Optional[timedelta]:
    if value is None:
        return None
    if isinstance(value, timedelta):
        interval = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        interval = timedelta(seconds=value)
    else:
        raise TypeError(f"epoch_interval must be a timedelta or seconds, got {value!r}")
    if interval < timedelta(0):
        raise ValueError(f"epoch_interval must not be negative, got {value!r}")
    return interval


# ---------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage first; one line is easier to read
        # in a log, and --help is one flag away.
        self.exit(2, f"{_PROG}: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _size(text: str) -> int:
    from millpond.livelimit import parse_size

    try:
        return parse_size(text)
    except ValueError as ex:
        raise argparse.ArgumentTypeError(str(ex)) from None


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _process_id(text: str) -> int:
    """An index, or ``auto``: the trailing ordinal of the host name, as a
    Kubernetes StatefulSet names its pods (``millpond-2`` is process 2)."""
    if text.strip().lower() != "auto":
        return _non_negative_int(text)
    host = os.environ.get("HOSTNAME", "").strip() or socket.gethostname()
    m = re.search(r"-(\d+)$", host)
    if not m:
        raise argparse.ArgumentTypeError(
            f"auto takes the process id from the host name's trailing ordinal, as a StatefulSet names its pods "
            f"(millpond-2 is process 2), but the host name is {host!r}; give the index instead"
        )
    return int(m.group(1))


def _seconds(text: str) -> timedelta:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds as a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return timedelta(seconds=value)


def parse_addresses(text: str) -> List[str]:
    """Split ``"host:port;host:port"`` into a list, checking each entry.

    Raises ``ValueError`` for an empty list or an entry without a valid port.
    """
    addrs = [a.strip() for a in text.split(";") if a.strip()]
    if not addrs:
        raise ValueError(f"expected 'host:port;host:port', got {text!r}")
    for addr in addrs:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"address {addr!r} is not host:port with a port from 1 to 65535")
    return addrs


def _addresses(text: str) -> List[str]:
    try:
        return parse_addresses(text)
    except ValueError as ex:
        raise argparse.ArgumentTypeError(str(ex)) from None


def _snapshot_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in ("batch", "immediate"):
        raise argparse.ArgumentTypeError(f"expected 'batch' or 'immediate', got {text!r}")
    return mode


_LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(_LOG_LEVELS)}, got {text!r}")
    return level


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535 (0 picks a free one), got {text!r}")
    return value


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a value, got an empty string")
    return text


# (dest, env var, converter) for every option that an environment variable can set.
_ENV: List[Tuple[str, str, Callable[[str], Any]]] = [
    ("workers_per_process", "MILLPOND_WORKERS_PER_PROCESS", _positive_int),
    ("process_id", "MILLPOND_PROCESS_ID", _process_id),
    ("addresses", "MILLPOND_ADDRESSES", _addresses),
    ("processes", "MILLPOND_PROCESSES", _positive_int),
    ("epoch_interval", "MILLPOND_EPOCH_INTERVAL", _seconds),
    ("local_state_dir", "MILLPOND_LOCAL_STATE_DIR", _nonempty),
    ("backup", "MILLPOND_BACKUP", _nonempty),
    ("snapshot_mode", "MILLPOND_SNAPSHOT_MODE", _snapshot_mode),
    ("max_live_keys", "MILLPOND_MAX_LIVE_KEYS", _positive_int),
    ("max_live_bytes", "MILLPOND_MAX_LIVE_BYTES", _size),
    ("log_level", "MILLPOND_LOG_LEVEL", _log_level),
    ("tls_cert", "MILLPOND_TLS_CERT", _nonempty),
    ("tls_key", "MILLPOND_TLS_KEY", _nonempty),
    ("tls_ca", "MILLPOND_TLS_CA", _nonempty),
    ("metrics_port", "MILLPOND_METRICS_PORT", _port),
    ("metrics_address", "MILLPOND_METRICS_ADDRESS", _nonempty),
]

# The flag of each option, as error messages name it.
_FLAGS: Dict[str, str] = {
    "workers_per_process": "-w/--workers-per-process",
    "process_id": "-i/--process-id",
    "addresses": "-a/--addresses",
    "processes": "-p/--processes",
    "epoch_interval": "-s/--epoch-interval",
    "local_state_dir": "-d/--local-state-dir",
    "backup": "-b/--backup",
    "snapshot_mode": "--snapshot-mode",
    "max_live_keys": "--max-live-keys",
    "max_live_bytes": "--max-live-bytes",
    "log_level": "--log-level",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "tls_ca": "--tls-ca",
    "metrics_port": "--metrics-port",
    "metrics_address": "--metrics-address",
}

# Bytewax 0.21's flags that millpond does not take, and what to use instead.
# (-s is the same idea in both: Bytewax's snapshot interval is millpond's
# epoch interval, since millpond snapshots at the end of every epoch.)
_BYTEWAX_FLAGS: List[Tuple[Tuple[str, ...], str]] = [
    (
        ("-r", "--recovery-directory"),
        "millpond keeps recovery data in a local state directory, -d/--local-state-dir DIR, and a "
        "durable store, -b/--backup URI (both made on first use; there are no partitions to "
        "initialize)",
    ),
    (
        ("--snapshot-interval",),
        "millpond snapshots state at the end of every epoch: use -s/--epoch-interval SECONDS",
    ),
    (
        ("--backup-interval",),
        "millpond has no backup interval: every committed epoch is backed up to -b/--backup, "
        "and RecoveryConfig(retain_epochs=..., retain_for=...) sets how long older epochs are kept",
    ),
]


class _BytewaxFlag(argparse.Action):
    """A Bytewax flag millpond does not take: exit 2 with a pointer to the
    millpond equivalent instead of argparse's "unrecognized arguments"."""

    def __init__(self, option_strings: Sequence[str], dest: str, hint: str = "", **kwargs: Any) -> None:
        self.hint = hint
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any,
                 option_string: Optional[str] = None) -> None:
        flags = "/".join(self.option_strings)
        parser.exit(2, f"{_PROG}: error: {flags} is a Bytewax flag; {self.hint}\n")


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def _bare_number_hint(value: str) -> Optional[str]:
    """The refusal for a ``-b`` value that is a bare number, as Bytewax's
    ``-b/--backup-interval 60`` would be; ``None`` for anything else."""
    if not _NUMBER.fullmatch(value.strip()):
        return None
    return (
        "-b takes a backup URI or directory, not a number; millpond has no backup interval: "
        "every committed epoch is backed up (see -s/--epoch-interval). "
        f"For a directory named {value.strip()}, write ./{value.strip()}"
    )


_EPILOG = """\
IMPORT_STR is MODULE_OR_PATH[:ATTR]; ATTR defaults to 'flow' and may call a
factory with literal arguments, e.g. 'flows.wc:get_flow("/tmp/in.txt", n=3)'.

exit status: 0 the flow finished; 2 something was wrong before it started
(a flag, an environment variable, the backup, IMPORT_STR or the flow it
names; one line on stderr); 1 it failed while starting or running; 130
Ctrl-C; 143 SIGTERM. The full table is in docs/cli.md.

Coming from Bytewax: -s is the same; -r/--recovery-directory becomes -d DIR
(and -b URI); there is no --backup-interval (every committed epoch is backed
up), so -b takes a backup URI or directory, not seconds."""


def _build_parser() -> _Parser:
    from millpond import __version__

    p = _Parser(
        prog=_PROG,
        description="Run a millpond dataflow. Flags override the MILLPOND_* environment variables.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("import_str", metavar="IMPORT_STR", help="the dataflow to run")
    p.add_argument(
        "-w", "--workers-per-process", type=_positive_int, default=None, metavar="N",
        help="workers in this process (default 1); they take turns on one thread and split the keys "
        "between them [env: MILLPOND_WORKERS_PER_PROCESS]",
    )
    p.add_argument(
        "-i", "--process-id", type=_process_id, default=None, metavar="I",
        help="this process's index in --addresses, or 'auto': the trailing ordinal of the host name "
        "(a StatefulSet pod millpond-2 is process 2) [env: MILLPOND_PROCESS_ID]",
    )
    p.add_argument(
        "-a", "--addresses", type=_addresses, default=None, metavar="HOST:PORT;...",
        help="addresses of every process of the cluster, in process-id order; they authenticate each "
        "other with MILLPOND_CLUSTER_SECRET (required unless every address is loopback) [env: MILLPOND_ADDRESSES]",
    )
    p.add_argument(
        "-p", "--processes", type=_positive_int, default=None, metavar="N",
        help="start N processes of one cluster on this machine (127.0.0.1, free ports), each with "
        "-w workers; not with -i/-a [env: MILLPOND_PROCESSES]",
    )
    p.add_argument(
        "-s", "--epoch-interval", type=_seconds, default=None, metavar="SECONDS",
        help="length of an epoch in seconds, may be fractional (default 10); state is snapshotted "
        "and committed at the end of every epoch [env: MILLPOND_EPOCH_INTERVAL]",
    )
    p.add_argument(
        "-d", "--local-state-dir", type=_nonempty, default=None, metavar="DIR",
        help="turn recovery on, keeping the local state store in DIR (made if missing) "
        "[env: MILLPOND_LOCAL_STATE_DIR]",
    )
    p.add_argument(
        "-b", "--backup", type=_nonempty, default=None, metavar="URI",
        help="the durable store: a directory, file:///dir, s3://bucket/prefix, or "
        "'MODULE:FACTORY()' returning a Backup object (default DIR/backup) [env: MILLPOND_BACKUP]",
    )
    p.add_argument(
        "--snapshot-mode", type=_snapshot_mode, default=None, metavar="batch|immediate",
        help="snapshot once per epoch (batch, default) or after every activation "
        "[env: MILLPOND_SNAPSHOT_MODE]",
    )
    p.add_argument(
        "--max-live-keys", type=_positive_int, default=None, metavar="N",
        help="keep at most N keyed state objects in memory per worker; colder ones are evicted to the "
        "local store (a temporary directory without -d) and read back when touched (default: no limit) "
        "[env: MILLPOND_MAX_LIVE_KEYS]",
    )
    p.add_argument(
        "--max-live-bytes", type=_size, default=None, metavar="SIZE",
        help="keep about SIZE bytes of keyed state in memory per worker (e.g. 512MiB, 2GB), a key limit "
        "worked out from a sample of the live keys and measured again as they change; with --max-live-keys "
        "too, the tighter bound wins (default: no budget) [env: MILLPOND_MAX_LIVE_BYTES]",
    )
    p.add_argument(
        "--tls-cert", type=_nonempty, default=None, metavar="FILE",
        help="TLS between the processes of a cluster: this process's certificate (PEM), valid for the host "
        "of its address; needs --tls-key [env: MILLPOND_TLS_CERT]",
    )
    p.add_argument(
        "--tls-key", type=_nonempty, default=None, metavar="FILE",
        help="the private key of --tls-cert (PEM, unencrypted) [env: MILLPOND_TLS_KEY]",
    )
    p.add_argument(
        "--tls-ca", type=_nonempty, default=None, metavar="FILE",
        help="mutual TLS: the CA certificate(s) (PEM) that sign every process's certificate; each process "
        "checks the others' against it [env: MILLPOND_TLS_CA]",
    )
    p.add_argument(
        "--metrics-port", type=_port, default=None, metavar="N",
        help="serve Prometheus metrics at http://127.0.0.1:N/metrics while the flow runs (0: a free port, "
        "logged); with -p, process i serves N+i. Needs pip install 'millpond[metrics]' "
        "[env: MILLPOND_METRICS_PORT]",
    )
    p.add_argument(
        "--metrics-address", type=_nonempty, default=None, metavar="HOST",
        help="the address --metrics-port listens on (default 127.0.0.1, this machine only; 0.0.0.0 for "
        "every interface) [env: MILLPOND_METRICS_ADDRESS]",
    )
    p.add_argument(
        "--log-level", type=_log_level, default=None, metavar="LEVEL",
        help="DEBUG, INFO (default), WARNING, ERROR or CRITICAL [env: MILLPOND_LOG_LEVEL]",
    )
    p.add_argument("--version", action="version", version=f"millpond {__version__}",
                   help="print 'millpond X.Y.Z' and exit")
    for i, (flags, hint) in enumerate(_BYTEWAX_FLAGS):
        p.add_argument(*flags, action=_BytewaxFlag, dest=f"_bytewax_{i}", hint=hint)
    return p


class _Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as Ctrl-C does, with status 143."""


# Set by the SIGTERM handler: the core may have turned the same signal into
# a KeyboardInterrupt of a call in flight before Python's handler ran, and
# the handler may then raise while that one is being handled; either way
# the status is 143.
_TERMINATED: List[bool] = []


def _terminate(signum: int, frame: object) -> None:
    if _TERMINATED:
        return
    _TERMINATED.append(True)
    raise _Terminated()


def _fail(message: str, status: int = 2) -> int:
    sys.stderr.write(f"{_PROG}: error: {message}\n")
    return status


def _local_state_dir_problem(path: Path) -> Optional[str]:
    """What makes ``path`` unusable as a local state directory, or ``None``.

    A missing directory is fine: the core makes it, parents and all.
    """
    if path.exists():
        if not path.is_dir():
            return (
                "exists and is not a directory; name a directory, or a path that does not "
                "exist yet (it is made, with its parents)"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            return "is not writable by this user"
        return None
    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be made: {ancestor} exists and is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be made: {ancestor} is not writable by this user"
    return None


def _check_backup(spec: str) -> Any:
    """Resolve and open the backup ``spec`` names, as the run will.

    Returns what ``RecoveryConfig`` takes (the spec for a URI, the object a
    factory returned). Raises ``ImportStringError`` or ``ValueError`` with
    the reason; ``ImportError`` when the Go extension is missing.
    """
    backup = backup_from_spec(spec)
    if isinstance(backup, str):
        scheme, sep, rest = backup.partition("://")
        if sep:
            backup = f"{scheme.lower()}://{rest}"  # S3://b/p is s3://b/p
        from millpond.backup import backup_from_uri

        # Opening parses the URI and checks a directory's path (its parent
        # must exist; the directory itself is made). S3 makes no request:
        # an endpoint that does not answer is found when the run starts.
        opened = backup_from_uri(backup)
        close = getattr(opened, "close", None)
        if close is not None:
            close()
    return backup


def _check_flow(flow: Any) -> None:
    """Compile ``flow`` as the engine will, so that a flow without an input
    or an output is reported before anything starts (``ValueError``)."""
    from millpond.engine.plan import compile_plan

    compile_plan(flow)


def _strip_quoted(message: str, value: str) -> str:
    """Drop a leading ``backup URI "VALUE": `` that repeats the value the
    error line already names (the core quotes it redacted, and may order
    its parameters otherwise, so any quoted URI there is dropped)."""
    m = re.match(r"""backup URI (?:"[^"]*"|'[^']*')(:? )""", message)
    if m is None:
        return message
    rest = message[m.end():]
    return rest if m.group(1) == ": " else rest.lstrip()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the flow, return the exit status."""
    from millpond.engine.interrupts import CoreInterrupts

    # Ctrl-C and SIGTERM must stop a call into the core that waits on a
    # backend (checking the backup happens before the run itself starts).
    interrupts = CoreInterrupts()
    _TERMINATED.clear()
    try:
        status = _main(argv, interrupts)
    except _Terminated:
        status = 143
    except KeyboardInterrupt:
        status = 130
    finally:
        interrupts.stop()
    return 143 if _TERMINATED else status


def _main(argv: Optional[Sequence[str]], interrupts: "CoreInterrupts") -> int:
    args = _build_parser().parse_args(argv)

    # Environment variables fill in what no flag set; a bad value is
    # reported with the variable's name, since no flag was typed.
    source: Dict[str, str] = {}
    for dest, var, convert in _ENV:
        if getattr(args, dest) is not None:
            source[dest] = _FLAGS[dest]
            continue
        raw = os.environ.get(var)
        if raw is None or raw.strip() == "":
            continue
        try:
            setattr(args, dest, convert(raw))
        except (argparse.ArgumentTypeError, ValueError) as ex:
            return _fail(f"{var}={raw!r}: {ex}")
        source[dest] = var

    def named(dest: str) -> str:
        """The flag and value, or the variable and value, for an error line."""
        value = getattr(args, dest)
        if dest == "backup" and isinstance(value, str):
            value = redact_uri(value)
        where = source[dest]
        return f"{where}={value!r}" if where.startswith("MILLPOND_") else f"{where} {value}"

    if args.workers_per_process is None:
        args.workers_per_process = 1
    logging.basicConfig(
        level=args.log_level or "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    if (args.process_id is None) != (args.addresses is None):
        return _fail("-i/--process-id and -a/--addresses go together: give both for a cluster, neither for one process")
    if args.processes is not None and args.addresses is not None:
        return _fail(f"{named('processes')} starts its own local cluster: leave out -i/--process-id and -a/--addresses")
    if args.addresses is not None and args.process_id >= len(args.addresses):
        return _fail(
            f"-i/--process-id {args.process_id} is out of range for {len(args.addresses)} "
            "addresses (process ids start at 0)"
        )
    problem = _tls_problem(args, source, named)
    if problem is not None:
        return _fail(problem)
    if args.local_state_dir is None:
        for dest in ("backup", "snapshot_mode"):
            if getattr(args, dest) is not None:
                flag = _FLAGS[dest] if source[dest].startswith("-") else source[dest]
                return _fail(f"{flag} needs -d/--local-state-dir: recovery is off without a local state dir")
    else:
        problem = _local_state_dir_problem(Path(args.local_state_dir))
        if problem is not None:
            return _fail(f"{named('local_state_dir')}: {problem}")
    if args.metrics_address is not None and args.metrics_port is None:
        return _fail(f"{named('metrics_address')} needs --metrics-port N (or MILLPOND_METRICS_PORT): "
                     "metrics are off without a port")
    if args.metrics_port is not None:
        if args.processes is not None and args.metrics_port and args.metrics_port + args.processes - 1 > 65535:
            return _fail(f"{named('metrics_port')}: with -p {args.processes}, process i serves port N+i, "
                         "which goes past 65535")
        try:
            import millpond.metrics  # noqa: F401 - needs the optional prometheus-client
        except ImportError as ex:
            logger.debug("cannot serve metrics", exc_info=True)
            return _fail(f"{named('metrics_port')}: {ex}")
    from millpond.engine.pygc import young_threshold

    try:
        young_threshold()
    except ValueError as ex:
        return _fail(str(ex))
    if args.backup is not None and not args.backup.strip():
        return _fail(f"{named('backup')}: the backup is blank; pass a directory, file:///path or s3://bucket/prefix")
    if args.backup is not None and not is_backup_spec_factory(args.backup):
        hint = _bare_number_hint(args.backup)
        if hint is not None:
            return _fail(f"{named('backup')}: {hint}")

    try:
        flow = locate_dataflow(args.import_str)
    except ImportStringError as ex:
        return _fail(str(ex))
    try:
        _check_flow(flow)
    except (ValueError, TypeError) as ex:
        logger.debug("the dataflow is not valid", exc_info=True)
        return _fail(f"IMPORT_STR {args.import_str}: the dataflow cannot run: {ex}")

    recovery_config = None
    if args.local_state_dir is not None:
        backup: Any = None
        if args.backup is not None:
            try:
                interrupts.start()
                backup = _check_backup(args.backup)
            except ImportStringError as ex:
                return _fail(f"{named('backup')}: {ex}")
            except ImportError as ex:
                logger.debug("cannot load recovery", exc_info=True)
                return _fail(f"recovery is not available in this installation: {summarize(ex)}", 1)
            except ValueError as ex:
                return _fail(f"{named('backup')}: {_strip_quoted(str(ex), args.backup)}")
        try:
            recovery_config = _recovery_config(args.local_state_dir, backup, args.snapshot_mode)
        except ImportError as ex:
            logger.debug("cannot load recovery", exc_info=True)
            return _fail(f"recovery is not available in this installation: {summarize(ex)}", 1)
        except (ValueError, TypeError) as ex:
            return _fail(f"recovery settings: {ex}")

    if args.processes is not None and args.processes > 1:
        from millpond.launch import launch_local

        child_argv = _without_processes(list(argv if argv is not None else sys.argv[1:]))
        if args.metrics_port is not None:
            # Every process of a -p cluster is on this machine: process i
            # serves port N+i (given to it as MILLPOND_METRICS_PORT).
            child_argv = _without_metrics_port(child_argv)
        return launch_local(child_argv, args.processes, metrics_port=args.metrics_port)

    from millpond.errors import ClusterError, DataflowError, MetricsError, RecoveryError, StateStoreError

    # SIGTERM (a service manager stopping the flow) ends the run as Ctrl-C
    # does: epochs in flight are abandoned, the stores closed cleanly.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli_main(
            flow,
            workers_per_process=args.workers_per_process,
            process_id=args.process_id,
            addresses=args.addresses,
            epoch_interval=args.epoch_interval,
            recovery_config=recovery_config,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_ca=args.tls_ca,
            max_live_keys=args.max_live_keys,
            max_live_bytes=args.max_live_bytes,
            metrics_port=args.metrics_port,
            metrics_address=args.metrics_address or "127.0.0.1",
        )
    except _Terminated:
        logger.debug("terminated")
        return 143
    except KeyboardInterrupt:
        logger.debug("interrupted")
        return 130
    except DataflowError as ex:
        logger.debug("the dataflow failed", exc_info=True)
        lines = [f"{_PROG}: the dataflow failed: {ex}"]
        cause = ex.__cause__
        if cause is not None:
            # The engine's message usually quotes the cause already; then
            # where the user's code raised it is the one thing left to add
            # (nothing, when millpond raised it: a snapshot that cannot be
            # pickled, say).
            if headline(cause) in str(ex) or str(cause) in str(ex):
                where = user_location(cause)
                if where:
                    lines.append(f"  raised at {where}")
            else:
                lines.append(f"  caused by {summarize(cause)}")
        sys.stderr.write("\n".join(lines) + "\n")
        return 1
    except MetricsError as ex:
        # Found before the flow started (the endpoint is up before it).
        logger.debug("cannot serve metrics", exc_info=True)
        return _fail(f"{named('metrics_port')}: {ex}")
    except ClusterError as ex:
        # One line naming the process that was lost or refused.
        logger.debug("the cluster failed", exc_info=True)
        return _fail(str(ex), 1)
    except (RecoveryError, StateStoreError) as ex:
        logger.debug("recovery failed", exc_info=True)
        return _fail(f"{type(ex).__name__}: {ex}", 1)
    except (ValueError, TypeError) as ex:
        # The engine refused these settings before anything ran (e.g. more
        # than one address while multi-process clusters are not supported).
        logger.debug("the flow was not started", exc_info=True)
        return _fail(f"the flow was not started: {ex}")
    return 0


_TLS = ("tls_cert", "tls_key", "tls_ca")


def _tls_problem(args: argparse.Namespace, source: Dict[str, str], named: Callable[[str], str]) -> Optional[str]:
    """What is wrong with the TLS settings, for the error line; ``None``
    when they are fine (or absent). Checked before anything starts, so a
    ``-p`` launcher reports a bad file once, not once per process."""
    given = [d for d in _TLS if getattr(args, d) is not None]
    if not given:
        return None
    cluster = (args.addresses is not None and len(args.addresses) > 1) or (
        args.processes is not None and args.processes > 1
    )
    if not cluster:
        typed = [d for d in given if source[d].startswith("-")]
        if typed:
            return f"{_FLAGS[typed[0]]} is for a cluster: give -i/--process-id and -a/--addresses, or -p/--processes N"
        # Like the other cluster variables, MILLPOND_TLS_* mean nothing to
        # a single process.
        for d in given:
            setattr(args, d, None)
        return None

    def both(dest: str) -> str:
        return f"{_FLAGS[dest]} (or {dict((d, v) for d, v, _ in _ENV)[dest]})"

    if args.tls_cert is not None and args.tls_key is None:
        return f"{named('tls_cert')} needs its private key: give {both('tls_key')} too"
    if args.tls_key is not None and args.tls_cert is None:
        return f"{named('tls_key')} needs its certificate: give {both('tls_cert')} too"
    if args.tls_ca is not None and args.tls_cert is None:
        return (
            f"{named('tls_ca')} needs this process's certificate and key, signed by that CA: "
            f"give {both('tls_cert')} and {both('tls_key')} too"
        )
    from millpond.engine.cluster import TLSFileError, check_tls_files

    try:
        check_tls_files(args.tls_cert, args.tls_key, args.tls_ca)
    except TLSFileError as ex:
        if ex.setting is None:
            return str(ex)
        return f"{named(ex.setting)}: {ex.problem}"
    return None


def _without_processes(argv: List[str]) -> List[str]:
    """``argv`` without its -p/--processes option (each child gets -i/-a)."""
    out: List[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("-p", "--processes"):
            skip = True
            continue
        if arg.startswith("--processes=") or (arg.startswith("-p") and arg[2:].isdigit()):
            continue
        out.append(arg)
    return out


def _without_metrics_port(argv: List[str]) -> List[str]:
    """``argv`` without its --metrics-port option (a -p launcher gives
    each process its own port)."""
    out: List[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--metrics-port":
            skip = True
            continue
        if arg.startswith("--metrics-port="):
            continue
        out.append(arg)
    return out


def _recovery_config(local_state_dir: str, backup: Any, snapshot_mode: Optional[str]) -> Any:
    # Imported here: the recovery module needs the Go extension, and the
    # rest of the CLI (--help, argument errors) should work without it.
    from millpond.recovery import RecoveryConfig, SnapshotMode

    kwargs: Dict[str, Any] = {}
    if backup is not None:
        kwargs["backup"] = backup
    if snapshot_mode is not None:
        kwargs["snapshot_mode"] = SnapshotMode.BATCH if snapshot_mode == "batch" else SnapshotMode.IMMEDIATE
    # A missing directory is made, with its parents, when the run starts.
    return RecoveryConfig(Path(local_state_dir), **kwargs)


if __name__ == "__main__":
    sys.exit(main())
