"""Comparing values as a pickle round trip or a second implementation must
reproduce them: equal, and of the same types all the way down."""

from __future__ import annotations

import struct
from datetime import datetime
from typing import Any


def same(a: Any, b: Any, same_tzinfo: bool = True) -> bool:
    """Equal, of the same exact types all the way down (a float by its bits,
    so NaN and -0.0 count; a dict in its order; a datetime with its fold and,
    with ``same_tzinfo``, the same tzinfo object, which a pickle round trip
    keeps only for UTC); ``1 == 1.0 == True`` would pass a plain
    comparison."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y, same_tzinfo) for x, y in zip(a, b))
    if isinstance(a, dict):
        return (list(a) == list(b) and all(same(a[k], b[k], same_tzinfo) for k in a)
                and all(same(x, y, same_tzinfo) for x, y in zip(a, b)))
    if isinstance(a, datetime):
        return a == b and a.fold == b.fold and (a.tzinfo is b.tzinfo or not same_tzinfo)
    return bool(a == b)
