"""The set-up of the Go extension, ``millpond._core``.

The extension calls :func:`setup` as it is imported, so however it is first
imported (``from millpond import _core`` inside the functions that need it:
loading the Go runtime only when state is used keeps a flow without
recovery free to ``fork``), it comes up the same way: the exception class
of each error kind the core names (``_core.ERROR_KINDS``) is registered, so
its calls raise the classes of :mod:`millpond.errors` directly; and the Go
core's log, which goes through a bridge to the logger ``millpond.core``, is
stopped at exit, before the interpreter winds down.
"""

from __future__ import annotations

import atexit
import logging
from types import ModuleType

from millpond import errors

__all__ = ["ERROR_TYPES", "CORE_LOGGER", "setup", "sync_log_level"]

#: The exception class for each error kind of the core.
ERROR_TYPES: dict[str, type[BaseException]] = {
    "store": errors.StateStoreError,
    "locked": errors.StoreLockedError,
    "foreign": errors.ForeignStoreError,
    "layout_changed": errors.StoreLayoutError,
    "corrupt": errors.CorruptObjectError,
    "malformed": errors.StateStoreError,
    "closed": errors.StateStoreError,
    # The Backup protocol's way of saying a key does not exist.
    "not_found": FileNotFoundError,
    "backup": errors.BackupError,
    "config": ValueError,
    "recovery": errors.RecoveryError,
    "damaged": errors.LocalStoreDamagedError,
    "unauthenticated": errors.UnauthenticatedError,
    # A call into the core cut short by SIGINT or SIGTERM.
    "interrupted": KeyboardInterrupt,
    "cluster": errors.ClusterError,
}

#: The logger the Go core's records arrive at.
CORE_LOGGER = logging.getLogger("millpond.core")


def setup(core: ModuleType) -> None:
    """Set up the extension module ``core`` (it calls this as it loads)."""
    unknown = set(core.ERROR_KINDS) - set(ERROR_TYPES)
    if unknown:
        raise ImportError(f"millpond._core reports error kinds this package does not know: {sorted(unknown)}")
    core.set_error_types(ERROR_TYPES)
    # No goroutine may take the GIL once the interpreter winds down.
    atexit.register(core.log_stop)
    sync_log_level(core)


def sync_log_level(core: ModuleType) -> None:
    """Tell the core which of its records ``millpond.core`` would log, so it
    queues no others (the logger's level as it is now)."""
    core.log_set_level(CORE_LOGGER.getEffectiveLevel())
