"""A hypothesis state machine for StateStore against a plain-dict model.

Random sequences of set / get_or_build+mutate / discard / snapshot /
hydrate_all / reopen (latest, or at an older committed epoch, which rolls
back the newer ones) are checked against:

* ``live``: what the store should show now, ``{(step, key): value}``;
* ``committed``: the snapshot taken at each epoch, ``{epoch: live-copy}``.

Reopening loses what was not snapshotted; reopening with
``resume_epoch = c + 1`` shows ``committed[c]`` and forgets every epoch
after ``c``.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Optional

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from millpond.state import StateStore

FLOW = "machine"
STEPS = ["count", "s\u00e9ssion"]
KEYS = ["a", "b", "c", "\u00fc", "\U0001f600", "", "k\x00"]

steps = st.sampled_from(STEPS)
keys = st.sampled_from(KEYS)


class Cell:
    """An int state; ``builder(None)`` starts at 0."""

    def __init__(self, resume_state: Optional[int]) -> None:
        self.value = 0 if resume_state is None else resume_state

    def snapshot(self) -> int:
        return self.value


class StateStoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="millpond-statemachine-")
        self.epoch = 0
        self.committed: dict[int, dict[tuple[str, str], int]] = {0: {}}
        self.live: dict[tuple[str, str], int] = {}
        self.store = self._open(None)

    def _open(self, resume_epoch: Optional[int]) -> StateStore:
        store = StateStore.open(self.dir, FLOW, resume_epoch=resume_epoch)
        for step in STEPS:
            store.register(step, Cell)
        return store

    def teardown(self) -> None:
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- changes --------------------------------------------------------------

    @rule(step=steps, key=keys, value=st.integers(-(2**63), 2**63))
    def set(self, step: str, key: str, value: int) -> None:
        cell = Cell(None)
        cell.value = value
        self.store.set(step, key, cell)
        self.live[(step, key)] = value

    @rule(step=steps, key=keys, delta=st.integers(1, 1000))
    def add(self, step: str, key: str, delta: int) -> None:
        self.store.get_or_build(step, key).value += delta
        self.live[(step, key)] = self.live.get((step, key), 0) + delta

    @rule(step=steps, key=keys)
    def discard(self, step: str, key: str) -> None:
        self.store.discard(step, key)
        self.live.pop((step, key), None)

    @rule()
    def snapshot(self) -> None:
        self.epoch += 1
        self.store.snapshot(self.epoch)
        self.committed[self.epoch] = dict(self.live)

    # -- reads that must not change anything ----------------------------------

    @rule(step=steps, key=keys)
    def get(self, step: str, key: str) -> None:
        obj = self.store.get(step, key)
        expected = self.live.get((step, key))
        assert (None if obj is None else obj.value) == expected, (step, key)

    @rule(step=steps, chunk_rows=st.integers(1, 4))
    def hydrate_all(self, step: str, chunk_rows: int) -> None:
        self.store.hydrate_all(step, chunk_rows=chunk_rows)

    # -- restarts -------------------------------------------------------------

    @rule()
    def reopen_latest(self) -> None:
        self.store.close()
        self.store = self._open(None)
        self.live = dict(self.committed[self.epoch])

    @rule(data=st.data())
    def reopen_at_older_epoch(self, data: st.DataObject) -> None:
        # resume_epoch = c + 1 for a committed epoch c (0: nothing committed)
        resume = data.draw(st.integers(1, self.epoch + 1), label="resume_epoch")
        self.store.close()
        self.store = self._open(resume)
        kept = resume - 1
        for epoch in [e for e in self.committed if e > kept]:
            del self.committed[epoch]
        self.epoch = kept
        self.live = dict(self.committed[kept])

    # -- invariants -------------------------------------------------------------

    @invariant()
    def keys_match_the_model(self) -> None:
        for step in STEPS:
            expected = sorted(k for (s, k) in self.live if s == step)
            assert self.store.keys(step) == expected, step

    @invariant()
    def last_epoch_is_the_newest_snapshot(self) -> None:
        assert self.store.stats()["last_epoch"] == self.epoch


StateStoreMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_state_store_matches_a_dict_model_across_snapshots_and_reopens = StateStoreMachine.TestCase
