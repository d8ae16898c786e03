"""Spilling state to disk in a run without recovery.

A flow run with a live-key limit or byte budget (``max_live_keys``,
``max_live_bytes``) but without recovery
still needs somewhere to put the state it evicts. :class:`SpillStore` is a
:class:`~millpond.state.StateStore` in a temporary directory, removed when
the store closes: nothing is snapshotted at epoch ends and nothing is
uploaded; evicted keys are written when they leave memory and read back
when touched again.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from millpond.keygroup import DEFAULT_KEY_GROUP_COUNT
from millpond.livelimit import LiveLimit
from millpond.state import StateStore

__all__ = ["SpillStore"]

logger = logging.getLogger("millpond")

# Every row is written at this one epoch: a newer write of a key replaces
# its row in place, so the spill file never holds superseded versions.
_SPILL_EPOCH = 1


class SpillStore(StateStore):
    """A worker's state store for a run without recovery, bounded by a
    :class:`~millpond.livelimit.LiveLimit`, spilling the rest to a temporary
    directory (under ``dir``, default the system's temporary directory)."""

    @classmethod
    def open_spill(
        cls,
        flow_id: str,
        worker_index: int,
        worker_count: int,
        live_limit: LiveLimit,
        *,
        key_group_count: int = DEFAULT_KEY_GROUP_COUNT,
        dir: Optional[str] = None,
    ) -> "SpillStore":
        """Open a store in a new temporary directory, removed at :meth:`close`."""
        root = Path(tempfile.mkdtemp(prefix=f"millpond-spill-w{worker_index}-", dir=dir))
        try:
            store = cls.open(root, flow_id, worker_index, worker_count, key_group_count=key_group_count)
            live_limit.apply(store)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        assert isinstance(store, SpillStore)
        store._root = root
        logger.debug("worker %d spills state beyond %s to %s", worker_index, live_limit.describe(), root)
        return store

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._root: Optional[Path] = None

    def snapshot(self, epoch: int) -> int:
        """Write pending deletions of keys (so a spilled key that was
        discarded stays gone); touched keys are written when evicted."""
        self._require_handle()
        deletions = {step: dict.fromkeys(keys) for step, keys in self._deleted.items() if keys}
        if not deletions:
            return 0
        written, _, _ = self._write(_SPILL_EPOCH, deletions)
        for step, keys in deletions.items():
            dirty = self._dirty[step]
            for key in keys:
                dirty.pop(key, None)
            self._deleted[step].clear()
        return written

    def _spill_epoch(self, epoch: int) -> int:
        return _SPILL_EPOCH

    def close(self) -> None:
        """Close the store and remove its directory."""
        try:
            super().close()
        finally:
            root, self._root = self._root, None
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)
