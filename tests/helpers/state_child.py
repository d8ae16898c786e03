"""A child process for the state-store tests, started with ``subprocess``.

Modes (``python tests/state_child.py MODE ...``):

``crash DIR FLOW [--resume E] [--keys N]``
    Open the store (with ``resume_epoch=E`` if given), continue after the
    last epoch it holds, and snapshot epochs forever, printing
    ``committed N`` after each ``snapshot(N)`` returns. The test kills it
    with SIGKILL at a random point.

``hold DIR FLOW``
    Open the store, print ``locked PID``, and keep it open until stdin is
    closed; then close it and print ``closed``.

``try DIR FLOW``
    Try to open the store once and print ``opened`` or
    ``error CLASSNAME MESSAGE``.

The updates each epoch makes are a pure function of the epoch number, so the
test computes the expected state of any epoch with :func:`model_at` (it
imports this file).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from typing import Any, Iterator, Optional

COUNTER_STEP = "crash.counter"
LATEST_STEP = "crash.latest"
DEFAULT_KEYS = 3000


class Counter:
    """Read-modify-write state: exercises hydration from the store."""

    def __init__(self, resume_state: Optional[dict[str, int]]) -> None:
        state = resume_state or {"sum": 0, "count": 0, "last": 0}
        self.sum, self.count, self.last = state["sum"], state["count"], state["last"]

    def add(self, epoch: int) -> None:
        self.sum += epoch
        self.count += 1
        self.last = epoch

    def snapshot(self) -> dict[str, int]:
        return {"sum": self.sum, "count": self.count, "last": self.last}


class Latest:
    """Blind-write state: replaced wholesale with ``set``."""

    def __init__(self, resume_state: Any) -> None:
        self.value = resume_state

    def snapshot(self) -> Any:
        return self.value


def ops(epoch: int, nkeys: int) -> Iterator[tuple[str, str, str]]:
    """Yield the (step, op, key) updates of ``epoch``: op is add, set or discard."""
    rng = random.Random(epoch * 7919)
    for i in rng.sample(range(nkeys), nkeys // 4):
        yield COUNTER_STEP, "discard" if rng.random() < 0.1 else "add", f"k{i:05d}"
    for i in rng.sample(range(nkeys), nkeys // 4):
        yield LATEST_STEP, "discard" if rng.random() < 0.1 else "set", f"k{i:05d}"


def apply_model(model: dict[str, dict[str, Any]], epoch: int, nkeys: int) -> None:
    """Apply ``epoch``'s updates to a plain-dict model {step: {key: snapshot}}."""
    for step, op, key in ops(epoch, nkeys):
        states = model[step]
        if op == "discard":
            states.pop(key, None)
        elif op == "add":
            c = states.get(key) or {"sum": 0, "count": 0, "last": 0}
            states[key] = {"sum": c["sum"] + epoch, "count": c["count"] + 1, "last": epoch}
        else:
            states[key] = (epoch, key)


def empty_model() -> dict[str, dict[str, Any]]:
    return {COUNTER_STEP: {}, LATEST_STEP: {}}


def model_at(epoch: int, nkeys: int = DEFAULT_KEYS) -> dict[str, dict[str, Any]]:
    """The expected snapshots after epochs 1..epoch."""
    model = empty_model()
    for e in range(1, epoch + 1):
        apply_model(model, e, nkeys)
    return model


def _crash(args: argparse.Namespace) -> None:
    from millpond.state import StateStore

    store = StateStore.open(args.dir, args.flow, resume_epoch=args.resume)
    store.register(COUNTER_STEP, Counter)
    store.register(LATEST_STEP, Latest)
    epoch = store.stats()["last_epoch"]
    print(f"opened at {epoch}", flush=True)
    while True:
        epoch += 1
        for step, op, key in ops(epoch, args.keys):
            if op == "discard":
                store.discard(step, key)
            elif op == "add":
                store.get_or_build(step, key).add(epoch)
            else:
                store.set(step, key, Latest((epoch, key)))
        store.snapshot(epoch)
        print(f"committed {epoch}", flush=True)


def _hold(args: argparse.Namespace) -> None:
    from millpond.state import StateStore

    store = StateStore.open(args.dir, args.flow)
    print(f"locked {os.getpid()}", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    store.close()
    print("closed", flush=True)


def _try(args: argparse.Namespace) -> None:
    from millpond.state import StateStore

    try:
        store = StateStore.open(args.dir, args.flow)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        print(f"error {type(exc).__name__} {exc}", flush=True)
        return
    store.close()
    print("opened", flush=True)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["crash", "hold", "try"])
    parser.add_argument("dir")
    parser.add_argument("flow")
    parser.add_argument("--resume", type=int, default=None)
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS)
    args = parser.parse_args(argv)
    {"crash": _crash, "hold": _hold, "try": _try}[args.mode](args)


if __name__ == "__main__":
    main()
