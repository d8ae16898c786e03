"""Key groups: the stable mapping from a state key to its owning worker.

A key's group is ``crc32(key as UTF-8) % key_group_count``. The count is
fixed for the life of a flow's recovery data and recorded in it; worker ``w``
of ``n`` owns the contiguous range of groups ``g`` with ``g * n // count ==
w``. Routing of live data and restoring of state use these same functions,
so an item and its key's state always meet on the same worker, for any
worker count. The Go core (``gostore/keygroup``) computes the same values.
"""

from __future__ import annotations

import zlib

__all__ = ["DEFAULT_KEY_GROUP_COUNT", "key_group", "worker_for_group", "worker_for_key"]

#: Key groups per flow unless the recovery config says otherwise. It bounds
#: the number of workers a flow's state can be spread over.
DEFAULT_KEY_GROUP_COUNT = 256


def key_group(key: str, key_group_count: int = DEFAULT_KEY_GROUP_COUNT) -> int:
    """Return the key group of ``key``; stable across processes and runs."""
    return zlib.crc32(key.encode("utf-8")) % key_group_count


def worker_for_group(group: int, key_group_count: int, worker_count: int) -> int:
    """Return the index of the worker that owns ``group``."""
    return group * worker_count // key_group_count


def worker_for_key(
    key: str, worker_count: int, key_group_count: int = DEFAULT_KEY_GROUP_COUNT
) -> int:
    """Return the index of the worker that owns ``key`` among ``worker_count``."""
    if worker_count == 1:
        return 0
    group = zlib.crc32(key.encode("utf-8")) % key_group_count
    return group * worker_count // key_group_count
