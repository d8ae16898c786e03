"""The flows of ``bench/cluster_scaling.py``, written for Bytewax 0.21.1.

Run only with the interpreter of the Bytewax venv (``bench/cluster_scaling.py``
creates it and drives these flows through Bytewax's own CLI, as a black box,
one process or two)::

    python -m bytewax.run 'bytewax_flows:cpu_flow("DIR", 250)'
    python -m bytewax.run 'bytewax_flows:wordcount_flow("DIR")' -i 0 -a "127.0.0.1:P0;127.0.0.1:P1"
    python -m bytewax.run 'bytewax_flows:wordcount_flow("DIR")' -i 1 -a "127.0.0.1:P0;127.0.0.1:P1"

Both flows read every file of ``DIR`` with ``DirSource`` (one partition per
file) and write to a sink that counts and drops what it gets. The per-item
work is the same code as in ``cluster_scaling.py`` (``burn``; keep the two
copies equal): ``cpu_flow`` is ``map(burn)``, ``wordcount_flow`` is
``flat_map(split)`` + ``key_on(word)`` + ``stateful_map`` (a running count
per word, one output per input word). Each sink partition prints one line
when it closes::

    BENCH pid=... worker=... items=... built=... first=... closed=...

with wall-clock times (``time.time()``) of the partition being built, of
its first batch and of its close, which ``cluster_scaling.py`` reads to
tell the flow's own time from the processes' start and stop.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import bytewax.operators as op
from bytewax.connectors.files import DirSource
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition


def burn(iters: int, seed: int) -> int:
    """About ``iters`` steps of pure-Python work (the same as cluster_scaling.burn)."""
    x = seed
    for i in range(iters):
        x = (x * 31 + i) & 0xFFFFF
    return x


class _BenchPartition(StatelessSinkPartition):
    def __init__(self, worker_index: int) -> None:
        self.worker = worker_index
        self.built = time.time()
        self.first = 0.0
        self.n = 0

    def write_batch(self, items) -> None:
        if not self.n:
            self.first = time.time()
        self.n += len(items)

    def close(self) -> None:
        # One write of the whole line: the processes of a cluster share
        # one stdout, and print() writes the line and its newline apart
        # when Python runs unbuffered (PYTHONUNBUFFERED).
        line = (f"BENCH pid={os.getpid()} worker={self.worker} items={self.n} built={self.built:.6f} "
                f"first={self.first:.6f} closed={time.time():.6f}\n")
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), line.encode())


class BenchSink(DynamicSink):
    """Counts and drops items; one ``BENCH`` line per partition when it closes."""

    def build(self, step_id, worker_index, worker_count):
        return _BenchPartition(worker_index)


def _source(data_dir: str) -> DirSource:
    # Every process sees the same files: a constant filesystem id, as the
    # millpond side uses ("local").
    return DirSource(Path(data_dir), "*.txt", batch_size=1000, get_fs_id=lambda _d: "local")


def cpu_flow(data_dir: str, iters: int) -> Dataflow:
    flow = Dataflow("cluster_cpu")
    lines = op.input("inp", flow, _source(data_dir))
    out = op.map("burn", lines, lambda line: burn(iters, len(line)))
    op.output("out", out, BenchSink())
    return flow


def _count(state, _word):
    n = (state or 0) + 1
    return n, n


def wordcount_flow(data_dir: str) -> Dataflow:
    flow = Dataflow("cluster_wordcount")
    lines = op.input("inp", flow, _source(data_dir))
    words = op.flat_map("split", lines, str.split)
    counts = op.stateful_map("count", op.key_on("key", words, lambda w: w), _count)
    op.output("out", counts, BenchSink())
    return flow


if __name__ == "__main__":
    print(__doc__, file=sys.stderr)
    sys.exit(2)
