"""Cluster scaling: the same flow on one process and on two (``-p 2``), and Bytewax.

Every figure is a ratio against a baseline run in the same session: the
runs take turns within each round, and a ratio is taken per round; the
table shows the median of the rounds and every round's raw figures. The
flows (this file) are run through ``python -m millpond.run`` as a user
would, each run a fresh cluster with ``-w 1 -s 1``:

1. **cpu**: a stateless flow, ``map`` with about 20 µs of pure-Python work
   per item (``burn``; its loop count is calibrated at start so it takes
   20 µs on this machine), over a ``DirSource`` of 4 files whose names give
   each of two workers two of them (every process has input);
2. **wordcount**: ``flat_map(split)`` + ``key_on(word)`` + ``stateful_map``
   (a running count per word, one output per input word), 10 words a line,
   100k distinct words: every word goes to the worker that owns it, so
   with two processes half of them cross;
3. both with recovery on (``-d DIR``, batch mode, ``-s 1``, DirBackup in
   ``DIR/backup``);
4. both on Bytewax 0.21.1 (``bench/bytewax_flows.py``, the same files, the
   same per-item work), one process, and two processes started as
   ``python -m bytewax.run FLOW -i I -a "127.0.0.1:P0;127.0.0.1:P1"``;
5. **exchange**: items of a fixed size (100 bytes and 1000 bytes) from a
   ``DynamicSource`` (one partition per worker, prebuilt distinct strings)
   through ``redistribute`` to a sink that drops them: with two processes
   half of every batch is pickled and crosses. The figures of the
   transport are read from the run log: per peer
   ``process A -> process B (...): X batches / Y bytes out, ...`` and the
   leader's epoch decisions (epoch-close and settle latency p50/p99; the
   line ``process 0: N epoch decisions in W waves; ...`` in seconds, or the
   older ``process 0: epoch decisions {json}`` in ns).

The machine is shared and has 2 cores: before each run the script waits
(``--calm-wait``) until the rest of the machine uses under ``--calm``
cores, measures per run the cores its processes used and those the rest
used (``/proc/stat``), and runs a pair again (``--retries``) when the rest
took more than ``--max-others`` cores during it. CPU µs per item (all the
run's processes) is printed as well: unlike items/s it hardly moves when
the machine is shared.

Every sink partition prints one line when it closes (``BENCH pid=...
items=... built=... first=... closed=...``, wall-clock times), so each run
gives two throughputs: items / wall time of the whole run (the first
process spawned to the last one exited: imports, joining the cluster,
recovery setup and the final commit included), and items / flow time (the
first sink partition built to the last one closed: the processing itself).
``startup`` is spawn to the first partition built, ``tail`` the last close
to the last exit.

    python bench/cluster_scaling.py                    # 3 rounds, ~13 minutes on a calm machine
    python bench/cluster_scaling.py --rounds 5 --json /tmp/cs.json
    python bench/cluster_scaling.py --quick            # a short smoke run
    python bench/cluster_scaling.py --only cpu,exchange --no-bytewax
    python bench/cluster_scaling.py --profile DIR      # cProfile of every process into DIR

Bytewax is installed from PyPI into ``--bytewax-venv`` (default
``/work/bench-venvs/bytewax``) when missing.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import millpond.operators as op
from millpond.connectors.files import DirSource
from millpond.dataflow import Dataflow
from millpond.inputs import DynamicSource, StatelessSourcePartition
from millpond.outputs import DynamicSink, StatelessSinkPartition

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BW_VERSION = "0.21.1"
BW_VENV_DEFAULT = Path("/work/bench-venvs/bytewax")
BATCH = 1000
INTERVAL_S = 1
TARGET_US = 20.0
RUN_TIMEOUT_S = 600.0


# -- flows (run in the processes of the cluster) ------------------------------


def burn(iters: int, seed: int) -> int:
    """About ``iters`` steps of pure-Python work (bytewax_flows.burn is the same)."""
    x = seed
    for i in range(iters):
        x = (x * 31 + i) & 0xFFFFF
    return x


class _BenchPartition(StatelessSinkPartition[Any]):
    def __init__(self, worker_index: int) -> None:
        self.worker = worker_index
        self.built = time.time()
        self.first = 0.0
        self.n = 0

    def write_batch(self, items: List[Any]) -> None:
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


class BenchSink(DynamicSink[Any]):
    """Counts and drops items; one ``BENCH`` line per partition when it closes."""

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _BenchPartition:
        return _BenchPartition(worker_index)


def _maybe_profile() -> None:
    """With ``MP_BENCH_PROFILE=DIR``, profile this process's main thread
    (where the engine runs) into ``DIR/<pid>.prof`` when it exits."""
    out = os.environ.get("MP_BENCH_PROFILE")
    if not out:
        return
    import cProfile

    prof = cProfile.Profile()

    def dump() -> None:
        prof.disable()
        prof.dump_stats(str(Path(out) / f"{os.getpid()}.prof"))

    atexit.register(dump)
    prof.enable()


def _source(data_dir: str) -> DirSource:
    return DirSource(data_dir, "*.txt", batch_size=BATCH)


def cpu_flow(data_dir: str, iters: int) -> Dataflow:
    _maybe_profile()
    flow = Dataflow("cluster_cpu")
    lines = op.input("inp", flow, _source(data_dir))
    out = op.map("burn", lines, lambda line: burn(iters, len(line)))
    op.output("out", out, BenchSink())
    return flow


def _count(state: Optional[int], _word: str) -> Tuple[int, int]:
    n = (state or 0) + 1
    return n, n


def wordcount_flow(data_dir: str) -> Dataflow:
    _maybe_profile()
    flow = Dataflow("cluster_wordcount")
    lines = op.input("inp", flow, _source(data_dir))
    words = op.flat_map("split", lines, str.split)
    counts: Any = op.stateful_map("count", op.key_on("key", words, lambda w: w), _count)
    op.output("out", counts, BenchSink())
    return flow


class _GenPartition(StatelessSourcePartition[str]):
    def __init__(self, batch: List[str], batches: int) -> None:
        self.batch = batch
        self.left = batches

    def next_batch(self) -> List[str]:
        if self.left <= 0:
            raise StopIteration()
        self.left -= 1
        return list(self.batch)


class GenSource(DynamicSource[str]):
    """``items`` strings of ``size`` characters over all workers, in batches
    of BATCH distinct strings (made once; every batch pickles to full size)."""

    def __init__(self, items: int, size: int) -> None:
        self.items = items
        self.size = size

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _GenPartition:
        batch = [f"{worker_index:02d}{i:0{self.size - 2}d}" for i in range(BATCH)]
        return _GenPartition(batch, self.items // BATCH // worker_count)


def exchange_flow(items: int, size: int) -> Dataflow:
    _maybe_profile()
    flow = Dataflow("cluster_exchange")
    s = op.input("inp", flow, GenSource(items, size))
    op.output("out", op.redistribute("spread", s), BenchSink())
    return flow


# -- inputs -------------------------------------------------------------------


def balanced_names(files: int) -> List[str]:
    """``files`` file names of which each of two workers owns half (millpond
    assigns a DirSource partition ``local::NAME`` to the worker owning that
    key; Bytewax deals partitions out in turn, so any even count is even)."""
    from millpond.keygroup import worker_for_key

    per = {0: [], 1: []}  # type: Dict[int, List[str]]
    i = 0
    while min(len(v) for v in per.values()) < files // 2:
        name = f"part-{i:03d}.txt"
        w = worker_for_key(f"local::{name}", 2)
        if len(per[w]) < files // 2:
            per[w].append(name)
        i += 1
    return sorted(per[0] + per[1])


def write_cpu_input(d: Path, n_items: int, files: int, rnd: random.Random) -> None:
    d.mkdir()
    names = balanced_names(files)
    per = n_items // files
    for name in names:
        with open(d / name, "w") as f:
            f.write("".join(f"{rnd.randrange(10**9)}\n" for _ in range(per)))


def write_words_input(d: Path, n_words: int, n_keys: int, files: int, per_line: int,
                      rnd: random.Random) -> int:
    d.mkdir()
    names = balanced_names(files)
    lines = n_words // per_line // files
    vocab = [f"w{i:06d}" for i in range(n_keys)]
    for name in names:
        with open(d / name, "w") as f:
            for _ in range(lines):
                f.write(" ".join(rnd.choice(vocab) for _ in range(per_line)) + "\n")
    return lines * files * per_line


# -- calibration --------------------------------------------------------------


def _per_call_us(iters: int, calls: int, trials: int = 3) -> float:
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for k in range(calls):
            burn(iters, k)
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def calibrate(target_us: float) -> Dict[str, Any]:
    """The loop count that makes ``burn`` take ``target_us`` here. Each
    figure is the best of many short trials: on a shared machine the best
    is the closest to the speed of a core of one's own."""
    probe = 1000
    per_iter = _per_call_us(probe, 100, 20) / probe
    iters = max(1, round(target_us / per_iter))
    for _ in range(3):  # correct for the per-call overhead
        got = _per_call_us(iters, 500, 20)
        iters = max(1, round(iters * target_us / got))
    return {"iters": iters, "us": _per_call_us(iters, 500, 20)}


def measure_burn(py: Path, iters: int) -> float:
    """µs per ``burn(iters)`` call under another interpreter (best of 3)."""
    code = ("import time\n"
            "def burn(iters, seed):\n"
            "    x = seed\n"
            "    for i in range(iters):\n"
            "        x = (x * 31 + i) & 0xFFFFF\n"
            "    return x\n"
            "best = 1e9\n"
            "for _ in range(20):\n"
            "    t0 = time.perf_counter()\n"
            f"    for k in range(500): burn({iters}, k)\n"
            "    best = min(best, (time.perf_counter() - t0) / 500 * 1e6)\n"
            "print(best)\n")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True)
    return float(r.stdout.strip())


# -- running a cluster --------------------------------------------------------

_BENCH = re.compile(r"^BENCH pid=(\d+) worker=(\d+) items=(\d+) built=([\d.]+) first=([\d.]+) closed=([\d.]+)")
_PEER = re.compile(
    r"process (\d+) -> process (-?\d+) \(([^)]*)\): (\d+) batches / (\d+) bytes out, "
    r"(\d+) batches / (\d+) bytes in, ([\d.]+) s blocked")
# The leader's epoch-decision figures, in either of the two forms the log
# has used: a JSON object (Go durations in ns) or a sentence in seconds.
_DECISIONS_JSON = re.compile(r"process (\d+): epoch decisions (\{.*\})")
_DECISIONS_TEXT = re.compile(
    r"process (\d+): (\d+) epoch decisions in (\d+) waves; epoch close across the cluster "
    r"p50 ([\d.]+) s p99 ([\d.]+) s, settling \(all ready -> decided\) p50 ([\d.]+) s p99 ([\d.]+) s")


def parse_decisions(text: str) -> Dict[str, Any]:
    """The leader's figures as {decisions, waves, close_p50_s, ...}, or {}."""
    for m in _DECISIONS_JSON.finditer(text):
        d = json.loads(m[2])
        low = {k.lower(): v for k, v in d.items()}
        if not low.get("leader"):
            continue
        out: Dict[str, Any] = {"decisions": low.get("decisions", 0), "waves": low.get("waves", 0),
                               "samples": low.get("closesamples", 0)}
        for k in ("close", "settle"):
            for q in ("p50", "p99"):
                if f"{k}{q}" in low:
                    out[f"{k}_{q}_s"] = low[f"{k}{q}"] / 1e9
                else:
                    out[f"{k}_{q}_s"] = low.get(f"{k}_{q}_seconds", 0.0)
        return out
    for m in _DECISIONS_TEXT.finditer(text):
        return {"decisions": int(m[2]), "waves": int(m[3]), "close_p50_s": float(m[4]),
                "close_p99_s": float(m[5]), "settle_p50_s": float(m[6]), "settle_p99_s": float(m[7])}
    return {}


# The recovery run's summary line of each process (recovery on only).
_FINISHED = re.compile(
    r"execution \d+ finished: committed epoch (\d+), (\d+) segments \((\d+) bytes\) uploaded, "
    r"commit latency p50 ([\d.]+) s p99 ([\d.]+) s, ([\d.]+) s waiting on back-pressure; "
    r"background: ([\d.]+) s local writes, ([\d.]+) s local GC, (\d+) compactions in ([\d.]+) s, "
    r"(\d+) whole-state epochs kept as compacted state")


def parse_finished(text: str) -> List[Dict[str, Any]]:
    return [{"committed_epoch": int(m[1]), "segments": int(m[2]), "bytes": int(m[3]),
             "commit_p50_s": float(m[4]), "commit_p99_s": float(m[5]), "backpressure_s": float(m[6]),
             "local_writes_s": float(m[7]), "local_gc_s": float(m[8]), "compactions": int(m[9]),
             "compaction_s": float(m[10]), "whole_state_epochs": int(m[11])}
            for m in _FINISHED.finditer(text)]


def _cpu_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    # user nice system idle iowait irq softirq steal ...
    busy = sum(fields[:3]) + sum(fields[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


def wait_calm(max_cores: float, max_wait: float) -> float:
    """Wait until the machine (nothing of ours runs now) used less than
    ``max_cores`` cores over 2 s, at most ``max_wait`` seconds; return the
    cores it used in the last 2 s."""
    deadline = time.monotonic() + max_wait
    while True:
        b0 = _cpu_busy_s()
        time.sleep(2.0)
        used = (_cpu_busy_s() - b0) / 2.0
        if used != used or used < max_cores or time.monotonic() >= deadline:
            return used


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _stop(procs: Sequence["subprocess.Popen[str]"]) -> None:
    """Stop what this script started: SIGTERM (the launcher forwards it to
    its processes), then SIGKILL of each one's process group (each was
    started in a session of its own, so the group is it and its children)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.poll() is None:
            p.wait()


def run_procs(cmds: List[List[str]], cwd: Path, log: Path, env: Optional[Dict[str, str]] = None,
              timeout: float = RUN_TIMEOUT_S) -> Dict[str, Any]:
    """Start ``cmds`` together, wait for all; parse BENCH lines and the log."""
    procs: List["subprocess.Popen[str]"] = []
    outs: List[str] = []
    errf = open(log, "w")
    load = os.getloadavg()[0]
    busy0, ours0 = _cpu_busy_s(), _children_cpu_s()
    t_spawn = time.time()
    t0 = time.perf_counter()
    try:
        for cmd in cmds:
            procs.append(subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=errf, text=True,
                                          env=env, start_new_session=True))
        for p in procs:
            remaining = timeout - (time.perf_counter() - t0)
            out, _ = p.communicate(timeout=max(1.0, remaining))
            outs.append(out)
        wall = time.perf_counter() - t0
    finally:
        _stop(procs)
        errf.close()
    busy = _cpu_busy_s() - busy0
    ours = _children_cpu_s() - ours0
    codes = [p.returncode for p in procs]
    text = log.read_text(errors="replace")
    with open(log, "a") as f:
        for i, out in enumerate(outs):
            f.write(f"---- stdout of command {i}\n{out}")
    if any(codes):
        raise RuntimeError(f"{' '.join(cmds[0])} exited {codes}: {text.strip()[-2000:]}")
    bench = [m for o in outs for m in (_BENCH.match(ln) for ln in o.splitlines()) if m]
    if not bench:
        raise RuntimeError(f"{' '.join(cmds[0])}: no BENCH line; log: {text.strip()[-2000:]}")
    parts = [{"pid": int(m[1]), "worker": int(m[2]), "items": int(m[3]), "built": float(m[4]),
              "first": float(m[5]), "closed": float(m[6])} for m in bench]
    built = min(p["built"] for p in parts)
    closed = max(p["closed"] for p in parts)
    res: Dict[str, Any] = {
        "wall_s": wall,
        "flow_s": closed - built,
        "startup_s": built - t_spawn,
        "tail_s": (t_spawn + wall) - closed,
        "items": sum(p["items"] for p in parts),
        "parts": parts,
        "peers": [],
        "decisions": parse_decisions(text),
        "recovery": parse_finished(text),
        # Cores this run's processes used on average, and what the rest of
        # the machine used meanwhile (a 2-core VM shared with other work).
        "cores_used": ours / wall,
        "cpu_s": ours,
        "cores_others": max(0.0, busy - ours) / wall,
        "load_before": load,
        "log": str(log),
    }
    for m in _PEER.finditer(text):
        res["peers"].append({"process": int(m[1]), "peer": int(m[2]), "address": m[3],
                             "batches_out": int(m[4]), "bytes_out": int(m[5]), "batches_in": int(m[6]),
                             "bytes_in": int(m[7]), "blocked_s": float(m[8])})
    res["cpu_us_per_item"] = ours / res["items"] * 1e6
    res["items_per_s"] = res["items"] / wall
    res["flow_items_per_s"] = res["items"] / res["flow_s"] if res["flow_s"] > 0 else 0.0
    return res


class Bench:
    def __init__(self, tmp: Path, bw_py: Optional[Path], profile: Optional[Path],
                 calm: float = 0.0, calm_wait: float = 0.0) -> None:
        self.calm = calm
        self.calm_wait = calm_wait
        self.tmp = tmp
        self.bw_py = bw_py
        self.profile = profile
        self.n = 0

    def _log(self, tag: str) -> Path:
        self.n += 1
        logs = self.tmp / "logs"
        logs.mkdir(exist_ok=True)
        return logs / f"{self.n:03d}-{tag}.log"

    def millpond(self, expr: str, procs: int, recovery: bool) -> Dict[str, Any]:
        cmd = [sys.executable, "-m", "millpond.run", expr, "-p", str(procs), "-w", "1", "-s", str(INTERVAL_S)]
        state = None
        if recovery:
            state = Path(tempfile.mkdtemp(prefix="state-", dir=self.tmp))
            cmd += ["-d", str(state)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
        if self.profile is not None:
            env["MP_BENCH_PROFILE"] = str(self.profile)
        try:
            self._sync()
            return run_procs([cmd], REPO, self._log(f"mp-p{procs}{'-rec' if recovery else ''}"), env)
        finally:
            if state is not None:
                shutil.rmtree(state, ignore_errors=True)

    def bytewax(self, expr: str, procs: int) -> Dict[str, Any]:
        assert self.bw_py is not None
        base = [str(self.bw_py), "-m", "bytewax.run", expr, "-w", "1", "-s", str(INTERVAL_S)]
        if procs == 1:
            cmds = [base]
        else:
            from millpond.launch import free_ports

            addrs = ";".join(f"127.0.0.1:{p}" for p in free_ports(procs))
            cmds = [base + ["-i", str(i), "-a", addrs] for i in range(procs)]
        self._sync()
        return run_procs(cmds, HERE, self._log(f"bw-p{procs}"))

    def _sync(self) -> None:
        # The previous run's writes (recovery state, logs) are not this
        # run's to pay for; nor, as far as we can wait it out, is the other
        # work of a shared machine.
        os.sync()
        if self.calm > 0:
            wait_calm(self.calm, self.calm_wait)


# -- Bytewax venv --------------------------------------------------------------


def ensure_bytewax(venv: Path) -> Tuple[Optional[Path], str]:
    """Return (python of the Bytewax venv, "") or (None, why it is unavailable)."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import importlib.metadata as m; print(m.version('bytewax'))"]
    if py.exists():
        r = subprocess.run(check, capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == BW_VERSION:
            return py, ""
    print(f"creating {venv} with bytewax=={BW_VERSION} from PyPI ...", flush=True)
    base_py = getattr(sys, "_base_executable", None) or "python3"
    for cmd in ([base_py, "-m", "venv", str(venv)],
                [str(venv / "bin" / "pip"), "install", "--quiet", f"bytewax=={BW_VERSION}"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return None, f"{' '.join(cmd)} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}"
    r = subprocess.run(check, capture_output=True, text=True)
    if r.returncode != 0 or r.stdout.strip() != BW_VERSION:
        return None, f"bytewax {BW_VERSION} not importable after install: {r.stderr.strip()[-500:]}"
    return py, ""


# -- report ---------------------------------------------------------------------


def _med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _fmt_list(xs: Sequence[float]) -> str:
    return f"{_med(xs):.2f}x [{', '.join(f'{x:.2f}' for x in xs)}]" if xs else "- (none)"


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x == x else "-"


def _ratios(runs: Dict[str, List[Dict[str, Any]]], num: str, den: str, field: str,
            calm_only: bool = False) -> List[float]:
    return [a[field] / b[field] for a, b in zip(runs.get(num, []), runs.get(den, []))
            if b[field] > 0 and not (calm_only and (a.get("contended") or b.get("contended")))]


def print_run(rnd_i: int, label: str, r: Dict[str, Any]) -> None:
    dec = r["decisions"]
    extra = ""
    if dec:
        extra = (f"; {dec['decisions']} decisions, close p50/p99 {dec['close_p50_s'] * 1e3:.0f}/"
                 f"{dec['close_p99_s'] * 1e3:.0f} ms, settle p50/p99 {dec['settle_p50_s'] * 1e3:.1f}/"
                 f"{dec['settle_p99_s'] * 1e3:.1f} ms")
    split = "/".join(f"{p['items']:,}" for p in sorted(r["parts"], key=lambda p: p["worker"]))
    print(f"  round {rnd_i + 1} {label:<22} {r['items_per_s']:>11,.0f} items/s wall "
          f"({r['wall_s']:.2f} s), {r['flow_items_per_s']:>11,.0f} flow ({r['flow_s']:.2f} s); "
          f"startup {r['startup_s']:.2f} s, tail {r['tail_s']:.2f} s; per worker {split}; "
          f"cores {r['cores_used']:.2f} ours, {r['cores_others']:.2f} others{extra}",
          flush=True)
    for f in r["recovery"]:
        print(f"      recovery: {f['segments']} segments, commit p50/p99 {f['commit_p50_s']:.2f}/"
              f"{f['commit_p99_s']:.2f} s, {f['backpressure_s']:.1f} s waiting on back-pressure, "
              f"local writes {f['local_writes_s']:.1f} s, local GC {f['local_gc_s']:.1f} s, "
              f"{f['compactions']} compactions ({f['compaction_s']:.1f} s), "
              f"{f['whole_state_epochs']} whole-state epochs kept as compacted state", flush=True)
    for p in r["peers"]:
        if p["process"] != p["peer"]:
            print(f"      process {p['process']} -> process {p['peer']} ({p['address']}): "
                  f"{p['batches_out']:,} batches / {p['bytes_out']:,} bytes out, "
                  f"{p['batches_in']:,} / {p['bytes_in']:,} in, {p['blocked_s']:.3f} s blocked",
                  flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="small inputs, 1 round: a smoke run of about a minute (startup dominates its figures)")
    ap.add_argument("--only", default="cpu,wordcount,exchange",
                    help="comma-separated subset of cpu, wordcount, exchange (default all)")
    ap.add_argument("--no-bytewax", action="store_true", help="skip the Bytewax runs")
    ap.add_argument("--no-recovery", action="store_true", help="skip the recovery-on runs")
    ap.add_argument("--cpu-items", type=int, help="items of the cpu flow (default 800,000)")
    ap.add_argument("--words", type=int, help="words of the word count (default 4,000,000)")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct words (default 100,000)")
    ap.add_argument("--exchange-items", type=int, help="items per exchange run at 100 bytes (default 20,000,000; "
                    "a fifth of it at 1000 bytes)")
    ap.add_argument("--target-us", type=float, default=TARGET_US, help="per-item work of the cpu flow (µs)")
    ap.add_argument("--iters", type=int, help="loop count of the cpu flow's work instead of the calibrated one")
    ap.add_argument("--bytewax-venv", type=Path, default=BW_VENV_DEFAULT)
    ap.add_argument("--profile", type=Path, help="cProfile every millpond process into this directory "
                    "(MP_BENCH_PROFILE; the figures are then not comparable)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (inputs, run logs) and print its path")
    ap.add_argument("--calm", type=float, default=0.3,
                    help="before each run, wait until the rest of the machine used less than this many cores "
                    "over 2 s (default 0.3; 0: do not wait)")
    ap.add_argument("--calm-wait", type=float, default=60.0, help="wait at most this long for calm (s, default 60)")
    ap.add_argument("--max-others", type=float, default=0.5,
                    help="run a pair (p1, p2) again when the rest of the machine used more than this many cores "
                    "during either run (default 0.5)")
    ap.add_argument("--retries", type=int, default=2, help="times a pair is run again (default 2)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", type=Path, help="also write every figure here")
    args = ap.parse_args(argv)
    quick = args.quick
    rounds = args.rounds or (1 if quick else 3)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    bad = only - {"cpu", "wordcount", "exchange"}
    if bad:
        ap.error(f"--only: unknown {', '.join(sorted(bad))}")
    n_cpu = args.cpu_items or (40_000 if quick else 800_000)
    n_words = args.words or (200_000 if quick else 4_000_000)
    n_keys = min(args.keys, 20_000) if quick and args.keys == 100_000 else args.keys
    n_x100 = args.exchange_items or (1_000_000 if quick else 20_000_000)
    n_cpu = n_cpu // 4 * 4  # 4 files of equal length
    # Whole batches, as many on either worker of two.
    xsizes = [(100, max(1, n_x100 // (2 * BATCH)) * 2 * BATCH),
              (1000, max(1, n_x100 // (10 * BATCH)) * 2 * BATCH)]
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)

    # SIGTERM (and SIGHUP) stop the benchmark as Ctrl-C does, through the
    # finally blocks that stop every process it started and remove its
    # temporary directory.
    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    if args.calm > 0:
        wait_calm(args.calm, args.calm_wait)
    cal = calibrate(args.target_us)
    if args.iters:
        cal = {"iters": args.iters, "us": _per_call_us(args.iters, 500, 20), "calibrated_iters": cal["iters"]}
    iters = cal["iters"]
    res: Dict[str, Any] = {"rounds": rounds, "calibration": cal, "runs": {}, "bytewax_error": ""}
    print(f"cluster_scaling: {rounds} round(s); nproc {os.cpu_count()}; load {os.getloadavg()[0]:.2f}; "
          f"burn({iters}) takes {cal['us']:.1f} µs here (target {args.target_us:.0f})", flush=True)

    bw_py: Optional[Path] = None
    if not args.no_bytewax and only & {"cpu", "wordcount"}:
        bw_py, err = ensure_bytewax(args.bytewax_venv)
        if bw_py is None:
            res["bytewax_error"] = err
            print(f"  Bytewax unavailable: {err}", flush=True)
        else:
            res["calibration"]["bytewax_us"] = measure_burn(bw_py, iters)
            print(f"  burn({iters}) under the Bytewax venv's python: {res['calibration']['bytewax_us']:.1f} µs",
                  flush=True)

    runs: Dict[str, List[Dict[str, Any]]] = res["runs"]
    tmp = Path(tempfile.mkdtemp(prefix="mp-bench-cluster-"))
    try:
        rnd = random.Random(args.seed)
        cpu_dir, words_dir = tmp / "cpu", tmp / "words"
        if "cpu" in only:
            write_cpu_input(cpu_dir, n_cpu, 4, rnd)
        if "wordcount" in only:
            n_words = write_words_input(words_dir, n_words, n_keys, 4, 10, rnd)
        print(f"  inputs: cpu {n_cpu:,} lines in 4 files; wordcount {n_words:,} words ({n_keys:,} distinct) "
              f"in 4 files, 10 a line; exchange {', '.join(f'{n:,} x {s} B' for s, n in xsizes)}", flush=True)
        bench = Bench(tmp, bw_py, args.profile, args.calm, args.calm_wait)

        expected = {"cpu": n_cpu, "wordcount": n_words}
        expected.update({f"exchange{size}": n for size, n in xsizes})
        # (label, expression, system, processes, recovery)
        plan: List[Tuple[str, str, str, int, bool]] = []
        if "cpu" in only:
            mp = f"bench/cluster_scaling.py:cpu_flow({str(cpu_dir)!r}, {iters})"
            bw = f"bytewax_flows:cpu_flow({str(cpu_dir)!r}, {iters})"
            plan += [("cpu/mp/p1", mp, "mp", 1, False), ("cpu/mp/p2", mp, "mp", 2, False)]
            if not args.no_recovery:
                plan += [("cpu/mp-rec/p1", mp, "mp", 1, True), ("cpu/mp-rec/p2", mp, "mp", 2, True)]
            if bw_py is not None:
                plan += [("cpu/bw/p1", bw, "bw", 1, False), ("cpu/bw/p2", bw, "bw", 2, False)]
        if "wordcount" in only:
            mp = f"bench/cluster_scaling.py:wordcount_flow({str(words_dir)!r})"
            bw = f"bytewax_flows:wordcount_flow({str(words_dir)!r})"
            plan += [("wordcount/mp/p1", mp, "mp", 1, False), ("wordcount/mp/p2", mp, "mp", 2, False)]
            if not args.no_recovery:
                plan += [("wordcount/mp-rec/p1", mp, "mp", 1, True), ("wordcount/mp-rec/p2", mp, "mp", 2, True)]
            if bw_py is not None:
                plan += [("wordcount/bw/p1", bw, "bw", 1, False), ("wordcount/bw/p2", bw, "bw", 2, False)]
        if "exchange" in only:
            for size, n in xsizes:
                mp = f"bench/cluster_scaling.py:exchange_flow({n}, {size})"
                plan += [(f"exchange{size}/mp/p1", mp, "mp", 1, False), (f"exchange{size}/mp/p2", mp, "mp", 2, False)]

        def run_one(rnd_i: int, label: str, expr: str, system: str, procs: int, rec: bool
                    ) -> Optional[Dict[str, Any]]:
            try:
                if system == "mp":
                    r = bench.millpond(expr, procs, rec)
                else:
                    r = bench.bytewax(expr, procs)
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                print(f"  round {rnd_i + 1} {label}: FAILED: {exc}", flush=True)
                res.setdefault("failures", []).append({"round": rnd_i + 1, "label": label, "error": str(exc)})
                return None
            r["round"] = rnd_i + 1
            want = expected[label.split("/")[0]]
            if r["items"] != want:
                # A partition that did not report (or an input that was not
                # read whole): the run does not count.
                print(f"  round {rnd_i + 1} {label}: {r['items']:,} items reported, expected {want:,}; "
                      "not counted", flush=True)
                tail = Path(r["log"]).read_text(errors="replace").splitlines()[-60:]
                res.setdefault("failures", []).append({"round": rnd_i + 1, "label": label,
                                                       "error": f"items {r['items']} != {want}",
                                                       "parts": r["parts"], "log_tail": tail})
                return None
            print_run(rnd_i, label, r)
            return r

        for rnd_i in range(rounds):
            for pair_i in range(0, len(plan), 2):
                pair = plan[pair_i:pair_i + 2]
                if rnd_i % 2:
                    pair = pair[::-1]  # alternate which of each pair goes first
                for attempt in range(args.retries + 1):
                    got = [run_one(rnd_i, *item) for item in pair]
                    done = [r for r in got if r is not None]
                    busy = max((r["cores_others"] for r in done), default=0.0)
                    last = attempt == args.retries
                    if len(done) == len(pair) and (busy <= args.max_others or last):
                        for item, r in zip(pair, done):
                            r["attempt"] = attempt + 1
                            r["contended"] = busy > args.max_others
                            runs.setdefault(item[0], []).append(r)
                        break
                    if len(done) == len(pair):
                        print(f"  round {rnd_i + 1}: the rest of the machine used {busy:.2f} cores during this "
                              f"pair (limit {args.max_others}); discarded, running the pair again", flush=True)
                        for item, r in zip(pair, done):
                            res.setdefault("discarded", []).append({"label": item[0], **{
                                k: r[k] for k in ("round", "items_per_s", "flow_items_per_s", "cores_used",
                                                  "cores_others")}})
                    elif last:
                        print(f"  round {rnd_i + 1}: {' / '.join(i[0] for i in pair)} failed; round left out",
                              flush=True)
    finally:
        if args.keep:
            print(f"  kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    report(res, xsizes)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


def report(res: Dict[str, Any], xsizes: List[Tuple[int, int]]) -> None:
    runs = res["runs"]
    print()
    print("items/s: median of rounds, wall (whole run) and flow (first sink built -> last closed); "
          "ratios per round, median [each round]; cpu µs/item: CPU time of all the run's processes per item")
    hdr = (f"{'flow / system':<26}{'p1 wall':>11}{'p2 wall':>11}{'p2/p1':>7}{'p1 flow':>11}{'p2 flow':>11}"
           f"{'p2/p1':>7}{'cpu µs/item p1':>16}{'p2':>7}")
    print(hdr)
    summary: Dict[str, Any] = {}
    for flow in ("cpu", "wordcount"):
        for sysname in ("mp", "mp-rec", "bw"):
            k1, k2 = f"{flow}/{sysname}/p1", f"{flow}/{sysname}/p2"
            if k1 not in runs or k2 not in runs:
                continue
            w = _ratios(runs, k2, k1, "items_per_s")
            f = _ratios(runs, k2, k1, "flow_items_per_s")
            row: Dict[str, Any] = {
                "p1_wall": _med([r["items_per_s"] for r in runs[k1]]),
                "p2_wall": _med([r["items_per_s"] for r in runs[k2]]),
                "p1_flow": _med([r["flow_items_per_s"] for r in runs[k1]]),
                "p2_flow": _med([r["flow_items_per_s"] for r in runs[k2]]),
                "ratio_wall": _med(w), "ratio_wall_rounds": w,
                "ratio_flow": _med(f), "ratio_flow_rounds": f,
                # Only the rounds in which neither run shared the machine
                # with more than --max-others cores of other work.
                "ratio_wall_calm_rounds": _ratios(runs, k2, k1, "items_per_s", True),
                "ratio_flow_calm_rounds": _ratios(runs, k2, k1, "flow_items_per_s", True),
                "p1_cpu_us": _med([r["cpu_us_per_item"] for r in runs[k1]]),
                "p2_cpu_us": _med([r["cpu_us_per_item"] for r in runs[k2]]),
            }
            summary[f"{flow}/{sysname}"] = row
            name = {"mp": "millpond", "mp-rec": "millpond recovery", "bw": "bytewax"}[sysname]
            print(f"{flow + ' ' + name:<26}{_fmt_rate(row['p1_wall']):>11}{_fmt_rate(row['p2_wall']):>11}"
                  f"{row['ratio_wall']:>7.2f}{_fmt_rate(row['p1_flow']):>11}{_fmt_rate(row['p2_flow']):>11}"
                  f"{row['ratio_flow']:>7.2f}{row['p1_cpu_us']:>16.1f}{row['p2_cpu_us']:>7.1f}"
                  f"   [{', '.join(f'{x:.2f}' for x in w)}] / "
                  f"[{', '.join(f'{x:.2f}' for x in f)}]")
    res["summary"] = summary
    print()
    print("cores the run used / the rest of the machine used meanwhile (median of rounds; 2 cores in all):")
    for label in runs:
        rs = runs[label]
        each = ", ".join(f"{r['cores_used']:.2f}/{r['cores_others']:.2f}" for r in rs)
        print(f"  {label:<22} {_med([r['cores_used'] for r in rs]):.2f} / "
              f"{_med([r['cores_others'] for r in rs]):.2f}   [{each}]")
    print()

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    for flow, target in (("cpu", 1.7), ("wordcount", 1.3)):
        row = summary.get(f"{flow}/mp") or {}
        if row:
            print(f"{flow}: millpond -p 2 vs -p 1: {row['ratio_wall']:.2f}x wall, {row['ratio_flow']:.2f}x flow "
                  f"(target >= {target}x: {verdict(row['ratio_wall'] >= target)} on wall, "
                  f"{verdict(row['ratio_flow'] >= target)} on flow)")
        if row:
            cw, cf = row["ratio_wall_calm_rounds"], row["ratio_flow_calm_rounds"]
            print(f"  calm rounds only ({len(cw)}): {_fmt_list(cw)} wall, {_fmt_list(cf)} flow")
        rec = summary.get(f"{flow}/mp-rec")
        if rec:
            cw, cf = rec["ratio_wall_calm_rounds"], rec["ratio_flow_calm_rounds"]
            print(f"  recovery on, calm rounds only ({len(cw)}): {_fmt_list(cw)} wall, {_fmt_list(cf)} flow")
            print(f"  CPU per item, recovery off: {row['p1_cpu_us']:.1f} µs (-p 1), {row['p2_cpu_us']:.1f} µs (-p 2); "
                  f"recovery on: {rec['p1_cpu_us']:.1f} µs, {rec['p2_cpu_us']:.1f} µs")
        if row and rec:
            for fld in ("ratio_wall", "ratio_flow"):
                rel = rec[fld] / row[fld]
                per = [a / b for a, b in zip(rec[fld + "_rounds"], row[fld + "_rounds"])]
                summary[f"{flow}/rec_vs_off/{fld}"] = per
                print(f"  with recovery on: {rec[fld]:.2f}x ({fld[6:]}), {rel:.2f} of the recovery-off ratio; "
                      f"per round {', '.join(f'{x:.2f}' for x in per)} (target within 10%: "
                      f"{verdict(abs(rel - 1) <= 0.10)})")
        bw = summary.get(f"{flow}/bw")
        if row and bw:
            for p in ("p1", "p2"):
                for kind in ("wall", "flow"):
                    lab_mp, lab_bw = f"{flow}/mp/{p}", f"{flow}/bw/{p}"
                    fld = "items_per_s" if kind == "wall" else "flow_items_per_s"
                    per = _ratios(runs, lab_mp, lab_bw, fld)
                    summary[f"{flow}/mp_vs_bw/{p}/{kind}"] = per
                    print(f"  millpond/bytewax {p} ({kind}): {_med(per):.2f}x [{', '.join(f'{x:.2f}' for x in per)}]"
                          + (f" (target > 1 with 2 processes: {verdict(_med(per) > 1)})" if p == "p2" else ""))
            print(f"  bytewax -p 2 vs 1: {bw['ratio_wall']:.2f}x wall, {bw['ratio_flow']:.2f}x flow")
    print()
    print("exchange: items through redistribute, median of rounds; -p 1 moves nothing between processes")
    print(f"{'item size':<12}{'p1 items/s':>14}{'p2 items/s':>12}{'p2 wall':>12}{'MB crossed':>12}{'batches':>9}"
          f"{'MB/s':>8}{'µs/batch':>10}{'blocked s':>10}{'cpu µs/item p1':>16}{'p2':>6}")
    for size, n in xsizes:
        k1, k2 = f"exchange{size}/mp/p1", f"exchange{size}/mp/p2"
        if k2 not in runs:
            continue
        rs = runs[k2]
        by = [sum(p["bytes_out"] for p in r["peers"] if p["process"] != p["peer"]) for r in rs]
        bt = [sum(p["batches_out"] for p in r["peers"] if p["process"] != p["peer"]) for r in rs]
        blocked = [sum(p["blocked_s"] for p in r["peers"] if p["process"] != p["peer"]) for r in rs]
        mbs = [b / r["flow_s"] / 1e6 for b, r in zip(by, rs)]
        # Flow time per batch that crossed, both processes together.
        per_batch = [r["flow_s"] / b * 1e6 * 2 if b else float("nan") for b, r in zip(bt, rs)]
        row = {"p2_flow_items_per_s": _med([r["flow_items_per_s"] for r in rs]),
               "p2_wall_items_per_s": _med([r["items_per_s"] for r in rs]),
               "p1_flow_items_per_s": _med([r["flow_items_per_s"] for r in runs.get(k1, [])]),
               "bytes_crossed": _med(by), "batches_crossed": _med(bt), "mb_per_s": _med(mbs),
               "mb_per_s_rounds": mbs, "blocked_s": _med(blocked),
               "p1_cpu_us": _med([r["cpu_us_per_item"] for r in runs.get(k1, [])]),
               "p2_cpu_us": _med([r["cpu_us_per_item"] for r in rs])}
        summary[f"exchange{size}"] = row
        print(f"{str(size) + ' B':<12}{_fmt_rate(row['p1_flow_items_per_s']):>14}"
              f"{_fmt_rate(row['p2_flow_items_per_s']):>12}{_fmt_rate(row['p2_wall_items_per_s']):>12}"
              f"{row['bytes_crossed'] / 1e6:>12.1f}{row['batches_crossed']:>9,.0f}{row['mb_per_s']:>8.1f}"
              f"{_med(per_batch):>10.0f}{row['blocked_s']:>10.2f}{row['p1_cpu_us']:>16.2f}{row['p2_cpu_us']:>6.2f}"
              f"   MB/s per round [{', '.join(f'{x:.0f}' for x in mbs)}]")
    print("(items/s over the flow time, MB/s: pickled bytes crossed in both directions over the flow time)")
    print()
    print("epoch-close latency at 1 s epochs, leader's figures (median over rounds of each run's p50 / p99; ms):")
    for label in sorted(runs):
        if not label.endswith("/p2") or "/bw/" in label:
            continue
        decs = [r["decisions"] for r in runs[label] if r["decisions"]]
        if not decs:
            continue

        def ms(key: str) -> float:
            return _med([d[key] * 1e3 for d in decs])

        print(f"  {label:<22} close p50 {ms('close_p50_s'):7.1f}  p99 {ms('close_p99_s'):7.1f}  "
              f"settle p50 {ms('settle_p50_s'):6.2f}  p99 {ms('settle_p99_s'):6.2f}  "
              f"({_med([d['decisions'] for d in decs]):.0f} decisions, "
              f"{_med([d['waves'] / max(1, d['decisions']) for d in decs]):.1f} waves each)")
    if res.get("failures"):
        print(f"{len(res['failures'])} run(s) failed: " + "; ".join(f"{f['label']} (round {f['round']})"
                                                                     for f in res["failures"]))
    if res["bytewax_error"]:
        print(f"Bytewax comparison incomplete: {res['bytewax_error']}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        print(f"cluster_scaling: interrupted ({exc or 'Ctrl-C'}); every process it started was stopped",
              file=sys.stderr)
        sys.exit(130)
