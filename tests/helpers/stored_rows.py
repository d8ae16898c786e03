"""What a state store holds on disk for one step, read past its live
objects, and the keys and values the snapshot property tests draw."""

from __future__ import annotations

import pickle
from typing import Any

from hypothesis import strategies as st

from millpond import _core
from millpond.state import StateStore

#: What :func:`stored` returns for a key with no row, or a deletion.
GONE = "<no row, or a deletion>"

#: Six keys, and the values a snapshot property test gives them.
KEYS = st.sampled_from([f"k{i}" for i in range(6)])
VALUES = st.one_of(st.integers(), st.text(max_size=120), st.none())


def stored(s: StateStore, step: str, key: str) -> Any:
    """The value of key's newest row of ``step`` in the store (not its
    live object), or :data:`GONE`."""
    found = _core.store_get(s._require_handle(), step, key)
    if found is None or found[1] is None:
        return GONE
    return pickle.loads(found[1])
