"""How often Python's cyclic garbage collector runs while a flow runs.

CPython starts a young collection every 700 net allocations of container
objects, and every object still alive at two of them moves to the old
generation, which a full collection walks whole. A stream processor's
objects live just long enough for that: items buffered in windows, state
objects replaced every epoch, batches waiting in the exchange. They reach
the old generation and die there, and every 25% of growth of the old
generation sets off a full collection over all the state the flow keeps.
Measured on the windowing benchmark (1M items over 100k keys, one worker,
``bench/windowing.py``): 39 full collections took 12 of the 30-38 s of a
recovery-off run; with young collections every 10,000 allocations there
were 2, taking 0.03 s, and the run took 19-23 s (recovery on: 45-55 s ->
34 s).

So the engine runs a flow with young collections at most every
:data:`DEFAULT_YOUNG_THRESHOLD` allocations and puts the thresholds back
afterwards. Garbage in cycles is still collected, a little later, which
holds at most that many more container objects in memory. A program that
disabled collection, or set a higher young threshold, keeps its setting;
the variable ``MILLPOND_GC_YOUNG_THRESHOLD`` chooses another value (``0``
keeps Python's own thresholds).
"""

from __future__ import annotations

import gc
import logging
import os
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional

__all__ = ["DEFAULT_YOUNG_THRESHOLD", "YOUNG_THRESHOLD_VAR", "young_threshold", "flow_gc"]

logger = logging.getLogger("millpond")

#: Allocations between young collections while a flow runs.
DEFAULT_YOUNG_THRESHOLD = 10_000

#: The variable that overrides :data:`DEFAULT_YOUNG_THRESHOLD`.
YOUNG_THRESHOLD_VAR = "MILLPOND_GC_YOUNG_THRESHOLD"


def young_threshold(environ: Optional[Mapping[str, str]] = None) -> int:
    """The young-generation threshold a flow runs with (0: Python's own).

    Raises ``ValueError`` naming the variable for a value that is not a
    whole number of at least 0."""
    env = os.environ if environ is None else environ
    raw = env.get(YOUNG_THRESHOLD_VAR, "").strip()
    if not raw:
        return DEFAULT_YOUNG_THRESHOLD
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"{YOUNG_THRESHOLD_VAR}={raw!r}: expected a whole number of allocations between young "
            f"garbage collections (0 keeps Python's own setting; default {DEFAULT_YOUNG_THRESHOLD})"
        )
    return value


@contextmanager
def flow_gc(threshold: int) -> Iterator[None]:
    """Run the body with young collections at most every ``threshold``
    allocations, then restore the thresholds it found. Nothing changes
    when ``threshold`` is 0, when collection is disabled, or when the
    current young threshold is already higher (or 0, which disables it)."""
    before = gc.get_threshold()
    change = threshold > 0 and gc.isenabled() and 0 < before[0] < threshold
    if change:
        gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        # Only a setting this run made is undone: the flow's own code may
        # have chosen thresholds meanwhile, and those stay.
        if change and gc.get_threshold()[0] == threshold:
            gc.set_threshold(*before)
