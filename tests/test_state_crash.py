"""StateStore across processes: SIGKILL between and during snapshots, and
the store lock held by another process.

Children are started with ``subprocess`` running ``tests/state_child.py``
(never fork); the ``children`` fixture kills and reaps every one of them.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from millpond.errors import StoreLockedError
from millpond.state import StateStore

CHILD = Path(__file__).parent / "helpers" / "state_child.py"
_spec = importlib.util.spec_from_file_location("millpond_tests_state_child", CHILD)
assert _spec is not None and _spec.loader is not None
child_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(child_mod)

LINE_TIMEOUT = 20.0


class Child:
    """A running state_child.py with its stdout read line by line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.pid = self.proc.pid
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout: float = LINE_TIMEOUT) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child {self.pid} printed nothing for {timeout}s") from None
        if line is None:
            raise AssertionError(f"child {self.pid} exited early: {self.stderr()}")
        return line

    def drain(self) -> list[str]:
        """Wait for stdout to end (the child has exited) and return what is left."""
        self._reader.join(LINE_TIMEOUT)
        rest = []
        while True:
            line = self.lines.get_nowait() if not self.lines.empty() else None
            if line is None:
                return rest
            rest.append(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(LINE_TIMEOUT)

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "<still running>"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def stop(self) -> None:
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


@pytest.fixture
def children():
    """Start state_child.py processes; every one is killed and reaped at teardown."""
    started: list[Child] = []

    def start(*args: Any) -> Child:
        child = Child(*map(str, args))
        started.append(child)
        return child

    yield start
    for child in started:
        child.stop()


def restored(store: StateStore) -> dict[str, dict[str, Any]]:
    """Everything the store holds, as {step: {key: snapshot}}."""
    store.register(child_mod.COUNTER_STEP, child_mod.Counter)
    store.register(child_mod.LATEST_STEP, child_mod.Latest)
    out = {}
    for step in (child_mod.COUNTER_STEP, child_mod.LATEST_STEP):
        store.hydrate_all(step, chunk_rows=500)
        out[step] = {key: store.get(step, key).snapshot() for key in store.keys(step)}
    return out


def _committed(line: str) -> int:
    word, _, epoch = line.partition(" ")
    assert word == "committed", line
    return int(epoch)


@pytest.mark.slow
def test_sigkill_at_random_points_leaves_exactly_the_last_written_epoch(tmp_path, children):
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    nkeys = child_mod.DEFAULT_KEYS
    models = {0: child_mod.empty_model()}

    def model(epoch: int) -> dict[str, dict[str, Any]]:
        # Built incrementally: each model is the previous one plus an epoch.
        while epoch not in models:
            last = max(models)
            nxt = {step: dict(states) for step, states in models[last].items()}
            child_mod.apply_model(nxt, last + 1, nkeys)
            models[last + 1] = nxt
        return models[epoch]

    on_disk = 0
    resume: Optional[int] = None
    for round_no in range(10):
        args = ["crash", tmp_path, "flow"] + (["--resume", resume] if resume else [])
        child = children(*args)
        opened = child.next_line()
        # The child continues after what the store holds (after any rollback).
        expect_start = on_disk if resume is None else resume - 1
        where = f"seed {seed} round {round_no}"
        assert opened == f"opened at {expect_start}", (where, opened)
        printed = expect_start
        for _ in range(rng.randint(0, 3)):
            printed = _committed(child.next_line())
        # Kill anywhere: between snapshots, while updating live state, or in
        # the middle of a write.
        threading.Event().wait(rng.uniform(0, 0.04))
        child.kill()
        for line in child.drain():
            printed = _committed(line)

        with StateStore.open(tmp_path, "flow") as store:
            on_disk = store.stats()["last_epoch"]
            # A kill can land after snapshot() returned and before the print.
            assert on_disk in (printed, printed + 1), (where, printed, on_disk)
            assert restored(store) == model(on_disk), f"{where}: state is not exactly epoch {on_disk}"
        # Every other round, restart at the last *reported* epoch, rolling
        # back an epoch the child wrote but never reported.
        resume = printed + 1 if round_no % 2 else None
        if resume is not None:
            on_disk = printed
    assert on_disk > 0, "the child never committed an epoch"


def test_resume_rolls_back_an_epoch_written_but_never_reported(tmp_path, children):
    child = children("crash", tmp_path, "flow", "--keys", 400)
    assert child.next_line() == "opened at 0"
    for expected in (1, 2, 3):
        assert _committed(child.next_line()) == expected
    child.kill()
    with StateStore.open(tmp_path, "flow") as store:
        written = store.stats()["last_epoch"]
    assert written >= 3
    # Resume as if only epoch 2 had committed: 3 and later are rolled back.
    with StateStore.open(tmp_path, "flow", resume_epoch=3) as store:
        assert store.stats()["last_epoch"] == 2
        assert restored(store) == child_mod.model_at(2, 400)
    with StateStore.open(tmp_path, "flow") as store:
        assert restored(store) == child_mod.model_at(2, 400), "the rollback did not stick"


def test_second_process_gets_store_locked_error_naming_the_holder_pid(tmp_path, children):
    holder = children("hold", tmp_path, "flow")
    assert holder.next_line() == f"locked {holder.pid}"
    with pytest.raises(StoreLockedError, match=rf"process {holder.pid}\b"):
        StateStore.open(tmp_path, "flow")
    # Another worker of the same flow has its own store and lock.
    with StateStore.open(tmp_path, "flow", worker_index=1, worker_count=2):
        pass


def test_lock_is_released_when_the_holder_is_killed(tmp_path, children):
    holder = children("hold", tmp_path, "flow")
    assert holder.next_line().startswith("locked ")
    with pytest.raises(StoreLockedError):
        StateStore.open(tmp_path, "flow")
    holder.kill()
    with StateStore.open(tmp_path, "flow") as store:
        assert not store.closed


def test_lock_is_released_when_the_holder_closes_the_store(tmp_path, children):
    holder = children("hold", tmp_path, "flow")
    assert holder.next_line().startswith("locked ")
    holder.proc.stdin.close()
    assert holder.next_line() == "closed"
    holder.proc.wait(LINE_TIMEOUT)
    with StateStore.open(tmp_path, "flow") as store:
        assert not store.closed


def test_other_process_cannot_open_while_this_one_holds_the_store(tmp_path, children):
    store = StateStore.open(tmp_path, "flow")
    try:
        line = children("try", tmp_path, "flow").next_line()
        assert line.startswith("error StoreLockedError "), line
        assert f"process {os.getpid()} " in line, line
    finally:
        store.close()
    assert children("try", tmp_path, "flow").next_line() == "opened"
