"""The word count flows of ``bench/wordcount.py``, written for Bytewax 0.21.1.

Run only with the interpreter of ``bench/.venv-bytewax`` (``bench/wordcount.py``
creates it and drives these flows through Bytewax's own CLI, as a black box)::

    python -m bytewax.run 'bytewax_wordcount:get_flow("words.txt", "wordcount")' -s 1
    python -m bytewax.recovery DIR 1
    python -m bytewax.run 'bytewax_wordcount:get_flow("words.txt", "wordcount")' -r DIR -s 1 -b 0
    python -m bytewax.run 'bytewax_wordcount:resume_flow(1000000)' -r DIR -s 1 -b 0

``get_flow`` reads the words (one per line) when the flow is built, so the
timed region, from the flow being built to the sink closing, matches the
``run_main`` call timed on the millpond side; the sink prints one line
``BENCH items=... out=... seconds=...`` when it closes. ``resume_flow`` is
the resume benchmark: a per-key counter over N distinct keys, then an EOF;
each later execution continues after the next EOF with one repeated key,
whose count of 2 is the first (and only) line it prints.
"""

from __future__ import annotations

import sys
import time

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.testing import TestingSource

BATCH = 1000


class _CountingPartition(StatelessSinkPartition):
    def __init__(self, t0: float, n_in: int) -> None:
        self.t0 = t0
        self.n_in = n_in
        self.n = 0

    def write_batch(self, items) -> None:
        self.n += len(items)

    def close(self) -> None:
        elapsed = time.perf_counter() - self.t0
        print(f"BENCH items={self.n_in} out={self.n} seconds={elapsed:.6f}", flush=True)


class CountingSink(DynamicSink):
    """Counts items; reports the time since the flow was built when closed."""

    def __init__(self, t0: float, n_in: int) -> None:
        self.t0 = t0
        self.n_in = n_in

    def build(self, step_id, worker_index, worker_count):
        return _CountingPartition(self.t0, self.n_in)


def _upper(w: str) -> str:
    return w.upper()


def _keep(w: str) -> bool:
    return w[-1] in "02468"


def _key(w: str) -> str:
    return w


def get_flow(words_path: str, kind: str) -> Dataflow:
    """``kind``: ``"wordcount"`` (count_final per word) or ``"stateless"`` (map + filter)."""
    with open(words_path) as f:
        words = f.read().split("\n")
    if words and words[-1] == "":
        words.pop()
    flow = Dataflow(f"bench_{kind}")
    s = op.input("inp", flow, TestingSource(words, batch_size=BATCH))
    if kind == "wordcount":
        out = op.count_final("count", s, _key)
    elif kind == "stateless":
        out = op.filter("keep", op.map("upper", s, _upper), _keep)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    op.output("out", out, CountingSink(time.perf_counter(), len(words)))
    return flow


class _PrintPartition(StatelessSinkPartition):
    def write_batch(self, items) -> None:
        for k, n in items:
            print(k, n, flush=True)


class PrintSink(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _PrintPartition()


def _count(state, _value):
    n = (state or 0) + 1
    return n, n


def resume_items(n_keys: int) -> list:
    keys = [f"key-{i:08d}" for i in range(n_keys)]
    tail = []
    for i in range(4):  # four resumed executions, one repeated key each
        tail += [TestingSource.EOF(), keys[i]]
    return keys + tail


def resume_flow(n_keys: int) -> Dataflow:
    flow = Dataflow("bench_resume")
    s = op.input("inp", flow, TestingSource(resume_items(n_keys), batch_size=BATCH))
    counts = op.stateful_map("count", op.key_on("key", s, _key), _count)
    op.output("out", op.filter("resumed", counts, lambda kv: kv[1] >= 2), PrintSink())
    return flow


if __name__ == "__main__":
    print(__doc__, file=sys.stderr)
    sys.exit(2)
