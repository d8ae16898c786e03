"""The thin layer between millpond's Python modules and the Go extension.

It imports ``millpond._core`` lazily (so modules that never touch state
import without the extension) and turns the core's ``CoreError(kind,
message)`` into the exception classes of :mod:`millpond.errors`.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable, NoReturn, TypeVar

from millpond import errors

# Error kinds as numbered in pybindings/errors.go; keep the two in step.
_KIND_TO_ERROR: dict[int, type[Exception]] = {
    1: errors.StateStoreError,
    2: errors.StoreLockedError,
    3: errors.ForeignStoreError,
    4: errors.StoreLayoutError,
    5: errors.CorruptObjectError,
    6: errors.StateStoreError,
    7: errors.StateStoreError,
    8: errors.StateStoreError,
    9: errors.BackupError,
    10: ValueError,
    11: errors.RecoveryError,
}


@functools.lru_cache(maxsize=1)
def core() -> ModuleType:
    """Return the ``millpond._core`` extension, importing it on first use."""
    try:
        from millpond import _core
    except ImportError as exc:  # pragma: no cover - depends on the build
        raise ImportError(
            "millpond's Go extension (millpond._core) is not built; run `make ext` "
            "or reinstall with `pip install -e .`"
        ) from exc
    return _core


def raise_core_error(exc: BaseException) -> NoReturn:
    """Re-raise a ``CoreError`` as the matching millpond exception."""
    kind, message = exc.args if len(exc.args) == 2 else (1, str(exc))
    raise _KIND_TO_ERROR.get(kind, errors.StateStoreError)(message) from None


F = TypeVar("F", bound=Callable[..., Any])


def translating(fn: F) -> F:
    """Decorate a function so core errors surface as millpond exceptions."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except core().CoreError as exc:
            raise_core_error(exc)

    return wrapper  # type: ignore[return-value]
