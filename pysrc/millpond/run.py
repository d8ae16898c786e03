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
``-w/--workers-per-process N``          ``MILLPOND_WORKERS_PER_PROCESS``  workers (threads) in this process
``-i/--process-id I``                   ``MILLPOND_PROCESS_ID``           this process's index in ``--addresses``
``-a/--addresses "h:p;h:p"``            ``MILLPOND_ADDRESSES``            every process of the cluster
``-s/--epoch-interval SECONDS``         ``MILLPOND_EPOCH_INTERVAL``       epoch length (float, default 10)
``-d/--local-state-dir DIR``            ``MILLPOND_LOCAL_STATE_DIR``      turns recovery on; the local store
``-b/--backup URI|module:factory()``    ``MILLPOND_BACKUP``               the durable store
``--snapshot-mode batch|immediate``     ``MILLPOND_SNAPSHOT_MODE``        when state is snapshotted
``--log-level LEVEL``                   ``MILLPOND_LOG_LEVEL``            logging level (default ``INFO``)
======================================  ===============================  =========================================

Exit status: 0 when the flow finished; 2 for bad options or an
``IMPORT_STR`` that does not give a ``Dataflow`` (one line on stderr); 1
when the flow failed (the error and its cause on stderr); 130 on Ctrl-C.
Run with ``--log-level DEBUG`` to get full tracebacks in the log.

From Python, :func:`cli_main` runs a flow with the same settings::

    if __name__ == "__main__":
        cli_main(flow, workers_per_process=2, epoch_interval=1.0)
"""

from __future__ import annotations

import argparse
import ast
import importlib
import logging
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple, Union

__all__ = ["cli_main", "locate_dataflow", "parse_addresses", "main", "ImportStringError"]

logger = logging.getLogger("millpond.run")

_PROG = "python -m millpond.run"


class ImportStringError(ValueError):
    """An import string could not be resolved to what it must name."""


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
) -> None:
    """Run ``flow`` in this process with the command line's settings.

    ``workers_per_process`` worker threads run here. For a cluster, give
    every process the same ``addresses`` (``"host:port"`` strings) and its own
    ``process_id`` (its index in ``addresses``); leave both unset for a
    single process. ``epoch_interval`` is a ``timedelta`` or seconds (``None``
    means the engine default, 10 seconds). ``recovery_config`` is a
    :class:`millpond.recovery.RecoveryConfig` or ``None`` for no recovery.

    Returns when the flow's inputs are exhausted. Errors in user code raise
    :class:`millpond.errors.DataflowError`; Ctrl-C raises
    ``KeyboardInterrupt``. Raises ``ValueError`` or ``TypeError`` for bad
    arguments, before anything runs.
    """
    from millpond.dataflow import Dataflow
    from millpond.testing import cluster_main

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
    cluster_main(
        flow,
        addrs,
        proc_id,
        epoch_interval=interval,
        recovery_config=recovery_config,
        worker_count_per_proc=workers_per_process,
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
# Import strings


def _parse_target(text: str, what: str) -> Tuple[List[str], Optional[Tuple[List[Any], Dict[str, Any]]]]:
    """Parse ``name``, ``a.b`` or ``name(literal, key=literal)``.

    Returns the dotted name's parts and, for a call, its arguments.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ImportStringError(f"{what}: the part after ':' must be a name or a call like get_flow(\"x\", n=3)") from None
    call_args: Optional[Tuple[List[Any], Dict[str, Any]]] = None
    if isinstance(node, ast.Call):
        args: List[Any] = []
        kwargs: Dict[str, Any] = {}
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise ImportStringError(f"{what}: *args are not supported, list the arguments")
            args.append(_literal(arg, text, what))
        for kw in node.keywords:
            if kw.arg is None:
                raise ImportStringError(f"{what}: **kwargs are not supported, name the arguments")
            kwargs[kw.arg] = _literal(kw.value, text, what)
        call_args = (args, kwargs)
        node = node.func
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise ImportStringError(f"{what}: the part after ':' must be a name or a call like get_flow(\"x\", n=3)")
    parts.append(node.id)
    parts.reverse()
    return parts, call_args


def _literal(node: ast.expr, text: str, what: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ImportStringError(
            f"{what}: argument {ast.unparse(node)!r} is not a literal; only strings, "
            "numbers, None, booleans, lists, tuples, dicts and sets are allowed"
        ) from None


def _describe(obj: Any) -> str:
    text = repr(obj)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} (of type {type(obj).__name__})"


def _headline(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _location(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``exc``, or ``""``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"


def _summarize(exc: BaseException) -> str:
    """``Type: message (at file:line in function)`` for ``exc``."""
    where = _location(exc)
    return f"{_headline(exc)} (at {where})" if where else _headline(exc)


def _module_name_for_path(path: Path) -> Tuple[str, Path]:
    """The dotted module name of a ``.py`` file and the directory to import it from.

    Walks up through packages (directories with ``__init__.py``) so that a
    file inside a package keeps its relative imports working.
    """
    path = path.resolve()
    parts = [path.stem] if path.name != "__init__.py" else []
    root = path.parent
    while (root / "__init__.py").exists():
        parts.insert(0, root.name)
        root = root.parent
    return ".".join(parts), root


def _import_module(spec: str) -> Any:
    looks_like_path = spec.endswith(".py") or "/" in spec or os.sep in spec
    if looks_like_path:
        path = Path(spec)
        if not path.is_file():
            raise ImportStringError(f"no such file: {spec}")
        name, root = _module_name_for_path(path)
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    else:
        name = spec
        # `python -m` puts the working directory first; an entry point or an
        # embedding does not, and users expect `flows.wc` to mean ./flows/wc.py.
        cwd = os.getcwd()
        if "" not in sys.path and cwd not in sys.path:
            sys.path.insert(0, cwd)
    if not name or not all(p.isidentifier() for p in name.split(".")):
        raise ImportStringError(f"{spec!r} is not a module name or a path to a .py file")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as ex:
        missing = ex.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            raise ImportStringError(
                f"no module named {name!r} (looked in {os.getcwd()} and sys.path; "
                "give a path like flows/wc.py or run from the directory that holds the module)"
            ) from None
        logger.debug("importing %s failed", name, exc_info=True)
        raise ImportStringError(f"importing {name!r} failed: {_summarize(ex)}") from ex
    except Exception as ex:  # the user's module raised while being imported
        logger.debug("importing %s failed", name, exc_info=True)
        raise ImportStringError(f"importing {name!r} failed: {_summarize(ex)}") from ex


def _resolve(import_str: str, what: str, default_attr: Optional[str]) -> Tuple[Any, str]:
    """Import ``MODULE[:TARGET]`` and return the object it names and a label."""
    module_spec, sep, target = import_str.partition(":")
    module_spec = module_spec.strip()
    if not module_spec:
        raise ImportStringError(f"{what} {import_str!r} has no module; write MODULE[:ATTR]")
    if not sep or not target.strip():
        if default_attr is None:
            raise ImportStringError(f"{what} {import_str!r} needs a target: MODULE:factory()")
        target = default_attr
    parts, call_args = _parse_target(target, f"{what} {import_str!r}")
    module = _import_module(module_spec)
    obj = module
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            owner = ".".join([module_spec, *parts[:i]]) if i else module_spec
            hint = " (the default when no :ATTR is given)" if not sep and part == default_attr else ""
            raise ImportStringError(f"{owner!r} has no attribute {part!r}{hint}") from None
    label = f"{module_spec}:{'.'.join(parts)}"
    if call_args is not None:
        if not callable(obj):
            raise ImportStringError(f"{label} is {_describe(obj)}, not something to call")
        args, kwargs = call_args
        try:
            obj = obj(*args, **kwargs)
        except Exception as ex:
            logger.debug("%s(...) raised", label, exc_info=True)
            raise ImportStringError(f"{label}(...) raised {_summarize(ex)}") from ex
        label += "(...)"
    return obj, label


def locate_dataflow(import_str: str) -> Any:
    """Return the :class:`~millpond.dataflow.Dataflow` that ``import_str`` names.

    ``import_str`` is ``MODULE_OR_PATH[:ATTR]`` as described in this module's
    docstring; ``ATTR`` defaults to ``flow``. Raises
    :class:`ImportStringError` with a one-line message if the module is
    missing or fails to import, the attribute is missing, a factory raises,
    or the result is not a ``Dataflow``.
    """
    from millpond.dataflow import Dataflow

    obj, label = _resolve(import_str, "IMPORT_STR", "flow")
    if isinstance(obj, Dataflow):
        return obj
    if callable(obj) and not isinstance(obj, type):
        raise ImportStringError(
            f"{label} is a function, not a Dataflow; to call a factory write '{label}()'"
        )
    raise ImportStringError(f"{label} is {_describe(obj)}, not a millpond.dataflow.Dataflow")


def _backup_from_spec(spec: str) -> Any:
    """A URI is passed on as is; ``module:factory(...)`` is called."""
    if "://" in spec or ":" not in spec or spec.startswith(("/", ".")):
        return spec
    obj, _label = _resolve(spec, "backup", None)
    return obj


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


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


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


# (dest, env var, converter) for every option that an environment variable can set.
_ENV: List[Tuple[str, str, Callable[[str], Any]]] = [
    ("workers_per_process", "MILLPOND_WORKERS_PER_PROCESS", _positive_int),
    ("process_id", "MILLPOND_PROCESS_ID", _non_negative_int),
    ("addresses", "MILLPOND_ADDRESSES", _addresses),
    ("epoch_interval", "MILLPOND_EPOCH_INTERVAL", _seconds),
    ("local_state_dir", "MILLPOND_LOCAL_STATE_DIR", Path),
    ("backup", "MILLPOND_BACKUP", str),
    ("snapshot_mode", "MILLPOND_SNAPSHOT_MODE", _snapshot_mode),
    ("log_level", "MILLPOND_LOG_LEVEL", _log_level),
]


def _build_parser() -> _Parser:
    p = _Parser(
        prog=_PROG,
        description="Run a millpond dataflow. Flags override the MILLPOND_* environment variables.",
        epilog=(
            "IMPORT_STR is MODULE_OR_PATH[:ATTR]; ATTR defaults to 'flow' and may call a factory "
            "with literal arguments, e.g. 'flows.wc:get_flow(\"/tmp/in.txt\", n=3)'."
        ),
    )
    p.add_argument("import_str", metavar="IMPORT_STR", help="the dataflow to run")
    p.add_argument(
        "-w", "--workers-per-process", type=_positive_int, default=1, metavar="N",
        help="worker threads in this process (default 1) [env: MILLPOND_WORKERS_PER_PROCESS]",
    )
    p.add_argument(
        "-i", "--process-id", type=_non_negative_int, default=None, metavar="I",
        help="this process's index in --addresses [env: MILLPOND_PROCESS_ID]",
    )
    p.add_argument(
        "-a", "--addresses", type=_addresses, default=None, metavar="HOST:PORT;...",
        help="addresses of every process of the cluster, in process-id order [env: MILLPOND_ADDRESSES]",
    )
    p.add_argument(
        "-s", "--epoch-interval", type=_seconds, default=None, metavar="SECONDS",
        help="length of an epoch in seconds, may be fractional (default 10) [env: MILLPOND_EPOCH_INTERVAL]",
    )
    p.add_argument(
        "-d", "--local-state-dir", type=Path, default=None, metavar="DIR",
        help="turn recovery on, keeping the local state store in DIR [env: MILLPOND_LOCAL_STATE_DIR]",
    )
    p.add_argument(
        "-b", "--backup", type=str, default=None, metavar="URI|MODULE:FACTORY()",
        help="durable store: a directory, file:///dir, s3://bucket/prefix, or a factory returning "
        "a Backup (default DIR/backup) [env: MILLPOND_BACKUP]",
    )
    p.add_argument(
        "--snapshot-mode", type=_snapshot_mode, default=None, metavar="batch|immediate",
        help="snapshot once per epoch (batch, default) or after every activation "
        "[env: MILLPOND_SNAPSHOT_MODE]",
    )
    p.add_argument(
        "--log-level", type=_log_level, default="INFO", metavar="LEVEL",
        help="DEBUG, INFO (default), WARNING, ERROR or CRITICAL [env: MILLPOND_LOG_LEVEL]",
    )
    return p


def _fail(message: str, status: int = 2) -> int:
    sys.stderr.write(f"{_PROG}: error: {message}\n")
    return status


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the flow, return the exit status."""
    parser = _build_parser()
    # Environment variables become defaults, so flags win; a bad value is
    # reported with the variable's name, since no flag was typed.
    env_defaults: Dict[str, Any] = {}
    for dest, var, convert in _ENV:
        raw = os.environ.get(var)
        if raw is None or raw.strip() == "":
            continue
        try:
            env_defaults[dest] = convert(raw)
        except (argparse.ArgumentTypeError, ValueError) as ex:
            return _fail(f"{var}={raw!r}: {ex}")
    parser.set_defaults(**env_defaults)
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    if (args.process_id is None) != (args.addresses is None):
        return _fail("-i/--process-id and -a/--addresses go together: give both for a cluster, neither for one process")
    if args.addresses is not None and args.process_id >= len(args.addresses):
        return _fail(
            f"-i/--process-id {args.process_id} is out of range for {len(args.addresses)} "
            "addresses (process ids start at 0)"
        )
    if args.local_state_dir is None:
        for dest, flag in (("backup", "-b/--backup"), ("snapshot_mode", "--snapshot-mode")):
            if getattr(args, dest) is not None:
                return _fail(f"{flag} needs -d/--local-state-dir: recovery is off without a local state dir")

    try:
        flow = locate_dataflow(args.import_str)
    except ImportStringError as ex:
        return _fail(str(ex))

    recovery_config = None
    if args.local_state_dir is not None:
        try:
            recovery_config = _recovery_config(args.local_state_dir, args.backup, args.snapshot_mode)
        except ImportStringError as ex:
            return _fail(str(ex))
        except ImportError as ex:
            logger.debug("cannot load recovery", exc_info=True)
            return _fail(f"recovery is not available in this installation: {_summarize(ex)}", 1)
        except (ValueError, TypeError) as ex:
            return _fail(f"recovery settings: {ex}")

    from millpond.errors import DataflowError, RecoveryError, StateStoreError

    try:
        cli_main(
            flow,
            workers_per_process=args.workers_per_process,
            process_id=args.process_id,
            addresses=args.addresses,
            epoch_interval=args.epoch_interval,
            recovery_config=recovery_config,
        )
    except KeyboardInterrupt:
        logger.debug("interrupted")
        return 130
    except DataflowError as ex:
        logger.debug("the dataflow failed", exc_info=True)
        lines = [f"{_PROG}: the dataflow failed: {ex}"]
        cause = ex.__cause__
        if cause is not None:
            # The engine's message usually quotes the cause already; then
            # where it was raised is the one thing left to add.
            if _headline(cause) in str(ex) and _location(cause):
                lines.append(f"  raised at {_location(cause)}")
            else:
                lines.append(f"  caused by {_summarize(cause)}")
        sys.stderr.write("\n".join(lines) + "\n")
        return 1
    except (RecoveryError, StateStoreError) as ex:
        logger.debug("recovery failed", exc_info=True)
        return _fail(f"{type(ex).__name__}: {ex}", 1)
    except (ValueError, TypeError) as ex:
        # Build-time mistakes in the flow (no output, duplicate ids, ...)
        # come with messages that say what to change.
        logger.debug("the dataflow was rejected", exc_info=True)
        return _fail(f"the dataflow was rejected: {type(ex).__name__}: {ex}", 1)
    return 0


def _recovery_config(local_state_dir: Path, backup_spec: Optional[str], snapshot_mode: Optional[str]) -> Any:
    # Imported here: the recovery module needs the Go extension, and the
    # rest of the CLI (--help, argument errors) should work without it.
    from millpond.recovery import RecoveryConfig, SnapshotMode

    kwargs: Dict[str, Any] = {}
    if backup_spec is not None:
        kwargs["backup"] = _backup_from_spec(backup_spec)
    if snapshot_mode is not None:
        kwargs["snapshot_mode"] = SnapshotMode.BATCH if snapshot_mode == "batch" else SnapshotMode.IMMEDIATE
    # The user named the directory on the command line: make it, as `mkdir
    # -p` would, rather than fail. A path whose parent is missing, or that
    # is a file, still gets RecoveryConfig's error.
    path = Path(local_state_dir)
    if not path.exists() and path.parent.is_dir():
        path.mkdir()
    return RecoveryConfig(local_state_dir, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
