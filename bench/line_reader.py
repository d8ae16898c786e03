"""File line reader: the block reader of FileSource/DirSource against readline.

``FileSource`` and ``DirSource`` read a file a block at a time (256 KiB,
cut at the last newline, decoded and split at once, batches sliced from
the list). Before, every line took a ``readline()``, a ``decode`` and a
``_strip_eol``; that reader is kept here (``ReadlinePartition``, the same
code) as the baseline, run in the same process, taking turns with the
block reader within each round. Figures are medians over the rounds, and
the ratio (block / readline) is taken per round.

1. **reader**: lines/s draining one partition (``_LinePartition`` against
   ``ReadlinePartition``) over a file of 1M lines of about 60 ASCII
   characters, and one of 1M lines of about 60 characters with multi-byte
   ones (é, €, 日本, 🙂), at ``batch_size`` 1000 and 10; the file is in the
   page cache (read once before). Also the cost of one ``snapshot()``
   (the block reader works the offset out when asked).
2. **end to end** (``--no-e2e`` to skip): ``python -m millpond.run`` on
   ``DirSource(batch_size=1000) -> op.map(identity) -> a sink that drops
   the items`` (``e2e_flow`` in this file; ``readline=True`` makes its
   DirSource build ``ReadlinePartition``\\ s), one process, one worker,
   recovery off, over the ASCII file: CPU µs per item of the whole run
   (interpreter start and imports included) and µs per item of the flow
   (first sink partition built to its close).

    python bench/line_reader.py                 # 5 rounds, a few minutes
    python bench/line_reader.py --rounds 3 --lines 300000 --no-e2e
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import millpond.operators as op
from millpond.connectors import files
from millpond.connectors.files import DirSource, _LinePartition
from millpond.dataflow import Dataflow
from millpond.inputs import StatefulSourcePartition
from millpond.outputs import DynamicSink, StatelessSinkPartition

REPO = Path(__file__).resolve().parent.parent


class ReadlinePartition(StatefulSourcePartition[str, Any]):
    """The line reader FileSource/DirSource had before the block reader."""

    def __init__(self, path: Path, batch_size: int, resume_state: Any) -> None:
        self._path = path
        self._batch_size = batch_size
        self._f, self._offset = files._open_at(path, resume_state)

    def next_batch(self) -> List[str]:
        readline = self._f.readline
        out: List[str] = []
        offset = self._offset
        for _ in range(self._batch_size):
            raw = readline()
            if not raw:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as ex:
                raise ValueError(f"{self._path}: line at byte {offset} is not UTF-8: {ex}") from ex
            offset += len(raw)
            out.append(files._strip_eol(line))
        self._offset = offset
        if not out:
            raise StopIteration()
        return out

    def snapshot(self) -> Any:
        return files._position(self._f, self._offset)

    def close(self) -> None:
        self._f.close()


class ReadlineDirSource(DirSource):
    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> ReadlinePartition:
        return ReadlinePartition(self._dir / files._split_part(for_part), self._batch_size, resume_state)


# --- the end-to-end flow ------------------------------------------------------------


class _DropPartition(StatelessSinkPartition[Any]):
    def __init__(self) -> None:
        self.built = time.time()
        self.n = 0

    def write_batch(self, items: List[Any]) -> None:
        self.n += len(items)

    def close(self) -> None:
        line = f"BENCH items={self.n} built={self.built:.6f} closed={time.time():.6f}\n"
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), line.encode())


class DropSink(DynamicSink[Any]):
    """Counts and drops items; one ``BENCH`` line per partition when it closes."""

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _DropPartition:
        return _DropPartition()


def _identity(x: Any) -> Any:
    return x


def e2e_flow(data_dir: str, readline: bool = False, batch_size: int = 1000) -> Dataflow:
    flow = Dataflow("line_reader")
    src_type = ReadlineDirSource if readline else DirSource
    lines = op.input("inp", flow, src_type(data_dir, "*.txt", batch_size=batch_size))
    out = op.map("identity", lines, _identity)
    op.output("out", out, DropSink())
    return flow


# --- inputs ------------------------------------------------------------------------------


_ASCII_WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor".split()
_MB_WORDS = ["café", "über", "€100", "日本語", "naïve", "🙂", "straße", "plain", "ascii", "text"]


def write_lines(path: Path, n: int, words: List[str], rnd: random.Random) -> None:
    """``n`` lines of about 60 characters (whole words; the line number first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        buf = []
        for i in range(n):
            parts = [str(i)]
            size = len(parts[0])
            while size < 60:
                w = rnd.choice(words)
                parts.append(w)
                size += len(w) + 1
            buf.append(" ".join(parts))
            if len(buf) == 10_000:
                f.write("\n".join(buf) + "\n")
                buf = []
        if buf:
            f.write("\n".join(buf) + "\n")


# --- the reader benchmark ----------------------------------------------------------------


def drain_lps(cls: Any, path: Path, batch_size: int) -> float:
    part = cls(path, batch_size, None)
    n = 0
    t0 = time.perf_counter()
    try:
        while True:
            n += len(part.next_batch())
    except StopIteration:
        pass
    dt = time.perf_counter() - t0
    part.close()
    return n / dt


def snapshot_us(cls: Any, path: Path, batch_size: int = 1000, calls: int = 200) -> float:
    """µs of one snapshot() taken in the middle of a block."""
    part = cls(path, batch_size, None)
    for _ in range(3):
        part.next_batch()
    t0 = time.perf_counter()
    for _ in range(calls):
        part.snapshot()
    dt = time.perf_counter() - t0
    part.close()
    return dt / calls * 1e6


def _med(xs: List[float]) -> float:
    return statistics.median(xs)


def reader_bench(inputs: Dict[str, Path], rounds: int) -> List[Dict[str, Any]]:
    rows = []
    for name, path in inputs.items():
        path.read_bytes()  # into the page cache
        for bs in (1000, 10):
            new: List[float] = []
            old: List[float] = []
            for r in range(rounds):
                order = [(_LinePartition, new), (ReadlinePartition, old)]
                if r % 2:
                    order.reverse()
                for cls, out in order:
                    out.append(drain_lps(cls, path, bs))
            ratios = [a / b for a, b in zip(new, old)]
            row = {"input": name, "batch_size": bs, "block_lps": _med(new), "readline_lps": _med(old),
                   "ratio": _med(ratios), "ratios": ratios}
            rows.append(row)
            print(f"  {name:6} batch {bs:5}: block {row['block_lps'] / 1e6:6.2f}M lines/s, "
                  f"readline {row['readline_lps'] / 1e6:6.2f}M lines/s, ratio {row['ratio']:.2f}x "
                  f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})", flush=True)
        snaps_new = [snapshot_us(_LinePartition, path) for _ in range(rounds)]
        snaps_old = [snapshot_us(ReadlinePartition, path) for _ in range(rounds)]
        print(f"  {name:6} snapshot(): block {_med(snaps_new):.0f} µs, readline {_med(snaps_old):.0f} µs",
              flush=True)
    return rows


# --- the end-to-end benchmark --------------------------------------------------------------


_BENCH = re.compile(r"^BENCH items=(\d+) built=([\d.]+) closed=([\d.]+)", re.M)


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_e2e(data_dir: Path, readline: bool) -> Dict[str, float]:
    expr = f"bench/line_reader.py:e2e_flow({str(data_dir)!r}, {readline})"
    cmd = [sys.executable, "-m", "millpond.run", expr, "-w", "1", "-s", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    cpu0 = _children_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    cpu = _children_cpu_s() - cpu0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    m = _BENCH.search(proc.stdout)
    if m is None:
        raise RuntimeError(f"no BENCH line: {proc.stdout[-500:]} {proc.stderr[-2000:]}")
    items = int(m[1])
    flow_s = float(m[3]) - float(m[2])
    return {"items": items, "wall_s": wall, "cpu_us": cpu / items * 1e6, "flow_us": flow_s / items * 1e6}


def e2e_bench(data_dir: Path, rounds: int) -> Dict[str, Any]:
    runs: Dict[bool, List[Dict[str, float]]] = {False: [], True: []}
    for r in range(rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        for readline in order:
            runs[readline].append(run_e2e(data_dir, readline))
        b, o = runs[False][-1], runs[True][-1]
        print(f"  round {r + 1}: cpu µs/item block {b['cpu_us']:.3f} readline {o['cpu_us']:.3f}; "
              f"flow µs/item block {b['flow_us']:.3f} readline {o['flow_us']:.3f}", flush=True)
    res: Dict[str, Any] = {}
    for key in ("cpu_us", "flow_us"):
        new = [x[key] for x in runs[False]]
        old = [x[key] for x in runs[True]]
        res[key] = (_med(new), _med(old), _med([o / n for n, o in zip(new, old)]))
    print(f"  median cpu µs/item (whole run): block {res['cpu_us'][0]:.3f}, readline {res['cpu_us'][1]:.3f}, "
          f"readline/block {res['cpu_us'][2]:.2f}x")
    print(f"  median flow µs/item: block {res['flow_us'][0]:.3f}, readline {res['flow_us'][1]:.3f}, "
          f"readline/block {res['flow_us'][2]:.2f}x")
    return res


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lines", type=int, default=1_000_000, help="lines per input file")
    ap.add_argument("--no-e2e", action="store_true", help="skip the python -m millpond.run runs")
    ap.add_argument("--e2e-rounds", type=int, default=None, help="default: --rounds")
    args = ap.parse_args(argv)
    print(f"line_reader: {args.rounds} round(s), {args.lines} lines per file; nproc {os.cpu_count()}; "
          f"load {os.getloadavg()[0]:.2f}; block size {files._BLOCK_SIZE}", flush=True)
    with tempfile.TemporaryDirectory(prefix="line_reader-") as d:
        rnd = random.Random(1)
        inputs = {"ascii": Path(d) / "ascii" / "in.txt", "utf8": Path(d) / "utf8" / "in.txt"}
        write_lines(inputs["ascii"], args.lines, _ASCII_WORDS, rnd)
        write_lines(inputs["utf8"], args.lines, _MB_WORDS, rnd)
        for name, p in inputs.items():
            print(f"  {name}: {p.stat().st_size / 1e6:.1f} MB", flush=True)
        print("reader (lines/s, median; ratio = block / readline, median of the rounds):", flush=True)
        reader_bench(inputs, args.rounds)
        if not args.no_e2e:
            print("end to end: DirSource(batch 1000) -> map(identity) -> drop, python -m millpond.run, "
                  "ascii input:", flush=True)
            e2e_bench(inputs["ascii"].parent, args.e2e_rounds or args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
