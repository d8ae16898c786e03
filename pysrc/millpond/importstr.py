"""Import strings: how ``python -m millpond.run`` and the recovery tools
name a flow, or a backup factory, in a module.

``MODULE_OR_PATH[:TARGET]``, where ``TARGET`` is a dotted name or a call of
one with literal arguments (``get_flow("in.txt", n=3)``; nothing in them is
executed). :func:`locate_dataflow` resolves a flow, :func:`backup_from_spec`
a ``-b`` value. Every failure is an :class:`ImportStringError` with a
one-line message that says what to change.

>>> locate_dataflow("millpond.dataflow:Dataflow")
Traceback (most recent call last):
  ...
millpond.importstr.ImportStringError: millpond.dataflow:Dataflow is <class 'millpond.dataflow.Dataflow'> (of type type), not a millpond.dataflow.Dataflow
"""

from __future__ import annotations

import ast
import importlib
import logging
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "ImportStringError",
    "locate_dataflow",
    "backup_from_spec",
    "is_backup_spec_factory",
    "headline",
    "location",
    "user_location",
    "summarize",
]

logger = logging.getLogger("millpond.run")


class ImportStringError(ValueError):
    """An import string could not be resolved to what it must name."""


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


def headline(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def location(exc: BaseException) -> str:
    """``file:line in function`` where ``exc`` was raised, or ``""``.

    That is the innermost frame outside millpond itself (and outside
    importlib's machinery), so an error that millpond raises on behalf of
    the user's code (a duplicate step id, say) points at the user's line;
    when every frame is millpond's, the innermost one.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    chosen = next((f for f in reversed(frames) if not _ours(f)), frames[-1])
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}"


def user_location(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of the user's code
    where ``exc`` or one of its causes was raised, or ``""`` when millpond
    (or Python itself) raised them all."""
    seen: set[int] = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        frames = [f for f in traceback.extract_tb(cur.__traceback__) if not _ours(f)]
        if frames:
            return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}"
        cur = cur.__cause__
    return ""


def _ours(frame: traceback.FrameSummary) -> bool:
    name = frame.filename
    return name.startswith("<frozen ") or os.path.abspath(name).startswith(_PACKAGE_DIR)


def summarize(exc: BaseException) -> str:
    """``Type: message (at file:line in function)`` for ``exc``."""
    where = location(exc)
    return f"{headline(exc)} (at {where})" if where else headline(exc)


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
        raise ImportStringError(f"importing {name!r} failed: {summarize(ex)}") from ex
    except Exception as ex:  # the user's module raised while being imported
        logger.debug("importing %s failed", name, exc_info=True)
        raise ImportStringError(f"importing {name!r} failed: {summarize(ex)}") from ex


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
            raise ImportStringError(f"{label}(...) raised {summarize(ex)}") from ex
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


_BACKUP_METHODS = ("list_keys", "upload", "download", "delete")

# A name, a dotted name, or a call of one: what may follow MODULE: in a factory.
_TARGET = re.compile(r"\s*[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\s*(\(.*\))?\s*", re.DOTALL)


def is_backup_spec_factory(spec: str) -> bool:
    """Whether a ``-b`` value names a Python factory (``module:factory()``)
    rather than a URI or a directory.

    A factory is ``MODULE:TARGET`` with no ``://``, where ``MODULE`` is a
    dotted module name or a path ending in ``.py`` and ``TARGET`` a (dotted)
    name or a call of one. Anything else (``/backups/wc``, ``data/a:b``,
    ``s3://b/p``, ``s3:/b``) is a URI or a directory.
    """
    if "://" in spec or ":" not in spec:
        return False
    module_spec, _sep, target = spec.partition(":")
    module_spec = module_spec.strip()
    if not module_spec or not _TARGET.fullmatch(target):
        return False
    if module_spec.lower() in ("s3", "file"):
        return False  # s3:bucket, file:dir: mistyped URIs, reported as such
    if module_spec.endswith(".py"):
        return True
    return all(part.isidentifier() for part in module_spec.split("."))


def backup_from_spec(spec: str) -> Any:
    """Resolve a ``-b`` value: a URI or directory is returned as the string
    it is; ``module:factory(...)`` is imported and called, and what it
    returns must be a backup (an object with ``list_keys``, ``upload``,
    ``download`` and ``delete``).

    Raises :class:`ImportStringError` with a one-line message when the
    factory cannot be imported, raises, or returns something else.
    """
    if not is_backup_spec_factory(spec):
        return spec
    obj, label = _resolve(spec, "backup", None)
    missing = [name for name in _BACKUP_METHODS if not callable(getattr(obj, name, None))]
    if missing:
        if callable(obj) and not isinstance(obj, type) and "(" not in spec.partition(":")[2]:
            raise ImportStringError(
                f"{label} is a function, not a backup; to call a factory write '{label}()'"
            )
        raise ImportStringError(
            f"{label} gave {_describe(obj)}, which is not a backup: it has no "
            f"{', '.join(m + '()' for m in missing)} (see millpond.backup.Backup)"
        )
    return obj
