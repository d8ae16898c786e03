"""Small helpers for building operator arguments.

:func:`map_dict_value` makes the mapper for ``op.map`` that changes one
field of dict items::

    import millpond.operators as op
    from millpond.operators.helpers import map_dict_value

    op.map("parse_ts", events, map_dict_value("ts", datetime.fromisoformat))
"""

from __future__ import annotations

import copy
from typing import Any, Callable, MutableMapping, TypeVar

__all__ = ["map_dict_value"]

M = TypeVar("M", bound=MutableMapping[Any, Any])


def map_dict_value(key: Any, mapper: Callable[[Any], Any]) -> Callable[[M], M]:
    """Return a function for ``op.map`` that replaces ``item[key]`` with
    ``mapper(item[key])``.

    The item is copied (a shallow copy of the same mapping type), never
    changed in place, so a stream that feeds several steps stays the same
    for the others. A missing ``key`` is a ``KeyError`` naming it.

    >>> f = map_dict_value("n", lambda n: n + 1)
    >>> item = {"n": 1, "name": "a"}
    >>> f(item), item
    ({'n': 2, 'name': 'a'}, {'n': 1, 'name': 'a'})
    """
    if not callable(mapper):
        raise TypeError(f"map_dict_value: mapper must be callable; got {type(mapper).__name__}: {mapper!r:.80}")

    def shim_mapper(obj: M) -> M:
        try:
            value = obj[key]
        except KeyError:
            raise KeyError(f"map_dict_value: item has no key {key!r}; keys: {list(obj)[:10]!r:.120}") from None
        except TypeError:
            raise TypeError(
                f"map_dict_value({key!r}) maps dict items; got {type(obj).__name__}: {obj!r:.80}"
            ) from None
        out = copy.copy(obj)
        out[key] = mapper(value)
        return out

    return shim_mapper
