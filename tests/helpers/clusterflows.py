"""Flows and subprocess plumbing for the multi-process cluster suites
(test_cluster.py, test_cluster_recovery.py).

Every process is a child ``python -m millpond.run`` started with
``subprocess`` (never a fork of a process that loaded the Go runtime), with
``PYTHONPATH=pysrc`` and no ``MILLPOND_*`` variable inherited
(:func:`helpers.mpflow.child_env`), on ports of 127.0.0.1 that
:func:`millpond.launch.free_ports` found free. Every child runs in a new
session, so a ``-p`` launcher and the processes it starts form one process
group; :meth:`Cluster.stop` kills what is still running (and a launcher's
processes, one by one by pid) and runs in a ``finally`` (``with``) of every
helper that starts processes. stdout and stderr go to files (a long log never fills a pipe).

The flows live in :data:`FLOW_SOURCE`, written into each run directory as
``cflows.py``; the children import them from there (their cwd). All flows
are deterministic up to the order in which items of different workers
reach a sink, so outputs are compared as sorted lines per file
(:func:`read_outputs`); the expected outputs are also computed in plain
Python (:func:`expected_wordcount`, :func:`expected_many`,
:func:`expected_big`) to check the reference runs themselves.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from helpers.mpflow import PYSRC, PYTHON, Result, child_env

if str(PYSRC) not in sys.path:  # millpond.launch: pure Python, no Go runtime
    sys.path.insert(0, str(PYSRC))

from millpond.keygroup import worker_for_key  # noqa: E402
from millpond.launch import free_ports  # noqa: E402

FLOW_MODULE = "cflows"

#: The flows every run dir gets (``cflows.py``).
#:
#: * ``wordcount``: ``DirSource`` over several files -> split -> ``key_on``
#:   -> ``stateful_map`` emitting ``"word n"`` (a running count: every word
#:   occurrence appears exactly once, and a count restored wrong shifts the
#:   numbers) -> ``DirSink`` of ``files`` files. File to file, so with
#:   recovery the output is exactly-once. ``delay`` (seconds per line) makes
#:   a run last long enough to be killed in the middle.
#: * ``many``: one flow with a branch per feature the cluster must keep
#:   identical for any process and worker count: the running count
#:   (``DirSink``), ``count_final`` (``FileSink``), ``op.join`` of the final
#:   counts with a second input read by ``FileSource`` (so one side of the
#:   join comes from an ``on_eof``: the EOF phases), a ``final``/``product`` join
#:   of two keyed inputs, and ``op.redistribute``.
#: * ``big``: all-to-all exchange of large items: each line becomes
#:   ``fan`` blobs of ``size`` bytes, ``redistribute``d, then keyed over
#:   many keys into a ``stateful_map`` (so each blob crosses processes
#:   twice); the sink gets a digest per blob.
#: * ``failing``: copies lines and raises ``ValueError`` in user code on
#:   the line holding ``needle``.
#: * ``watch``: a word count whose every step appends what it saw to
#:   ``seen-<pid>.txt`` (to show a refused process processed nothing).
FLOW_SOURCE = '''
import os
import time
import zlib

import millpond.operators as op
from millpond.connectors.files import DirSink, DirSource, FileSink, FileSource
from millpond.dataflow import Dataflow


def _split(delay):
    def split(line):
        if delay:
            time.sleep(delay)
        return line.split()
    return split


def _running(n, w):
    n = (n or 0) + 1
    return n, f"{w} {n}"


def wordcount(src="in", dst="out", delay=0.0, files=3, name="wc", batch=4):
    flow = Dataflow(name)
    lines = op.input("in", flow, DirSource(src, batch_size=batch))
    words = op.flat_map("split", lines, _split(delay))
    keyed = op.key_on("key", words, lambda w: w)
    counts = op.stateful_map("count", keyed, _running)
    op.output("out", counts, DirSink(dst, files))
    return flow


def _kv(line):
    k, v = line.split()
    return k, v


def many(src="in", side="side.txt", left="left.txt", right="right.txt", dst="out", delay=0.0):
    flow = Dataflow("many")
    lines = op.input("in", flow, DirSource(src, batch_size=3))
    words = op.flat_map("split", lines, _split(delay))
    keyed = op.key_on("key", words, lambda w: w)

    running = op.stateful_map("running", keyed, _running)
    op.output("running_out", running, DirSink(f"{dst}/running", 3))

    totals = op.count_final("total", words, lambda w: w)
    op.output("total_out", op.map("fmt_total", totals, lambda kv: (kv[0], f"{kv[0]} {kv[1]}")),
              FileSink(f"{dst}/totals.txt"))

    attrs = op.key_on("side_key", op.map("side_kv", op.input("side", flow, FileSource(side, batch_size=2)), _kv),
                      lambda kv: kv[0])
    tagged = op.join("tag", totals, op.map_value("side_v", attrs, lambda kv: kv[1]), emit_mode="final")
    op.output("tag_out", op.map("fmt_tag", tagged, lambda kv: (kv[0], f"{kv[0]} {kv[1][0]} {kv[1][1]}")),
              FileSink(f"{dst}/tagged.txt"))

    lefts = op.key_on("l_key", op.map("l_kv", op.input("left", flow, FileSource(left, batch_size=2)), _kv),
                      lambda kv: kv[0])
    rights = op.key_on("r_key", op.map("r_kv", op.input("right", flow, FileSource(right, batch_size=2)), _kv),
                       lambda kv: kv[0])
    joined = op.join("pairs", op.map_value("l_v", lefts, lambda kv: kv[1]),
                     op.map_value("r_v", rights, lambda kv: kv[1]),
                     insert_mode="product", emit_mode="final")
    op.output("pairs_out", op.map("fmt_pairs", joined, lambda kv: (kv[0], f"{kv[0]} {kv[1][0]} {kv[1][1]}")),
              FileSink(f"{dst}/pairs.txt"))

    spread = op.redistribute("spread", lines)
    measured = op.map("measure", spread, lambda l: f"{len(l)} {zlib.crc32(l.encode()):08x} {l}")
    op.output("spread_out", op.key_on("spread_key", measured, lambda s: s), FileSink(f"{dst}/spread.txt"))
    return flow


def blob(line, j, size):
    unit = f"{line}/{j}|".encode()
    return (unit * (size // len(unit) + 1))[:size]


def big(src="in", dst="out", size=65536, fan=2, batch=8):
    flow = Dataflow("big")
    lines = op.input("in", flow, DirSource(src, batch_size=batch))
    blobs = op.flat_map("blow", lines, lambda l: [(f"{l}/{j}", blob(l, j, size)) for j in range(fan)])
    spread = op.redistribute("spread", blobs)
    keyed = op.key_on("key", spread, lambda kb: kb[0])
    # A stateful step (keeping no state): every blob crosses to its key's worker.
    digest = op.stateful_map("digest", keyed,
                             lambda _s, kb: (None, f"{kb[0]} {len(kb[1])} {zlib.crc32(kb[1]):08x}"))
    op.output("out", digest, DirSink(dst, 3))
    return flow


def failing(needle, src="in", dst="out", delay=0.003):
    """Copies lines, and raises in user code on the line holding ``needle``."""
    flow = Dataflow("failing")
    lines = op.input("in", flow, DirSource(src, batch_size=2))

    def check(line):
        if delay:
            time.sleep(delay)
        if needle in line:
            raise ValueError(f"boom on {needle}")
        return line

    checked = op.map("check", lines, check)
    op.output("out", op.key_on("key", checked, lambda l: l), DirSink(dst, 2))
    return flow


def watch(src="in", dst="out.txt"):
    flow = Dataflow("watch")
    seen = open(f"seen-{os.getpid()}.txt", "a")

    def note(step):
        def fn(x):
            seen.write(f"{step} {x!r}\\n")
            seen.flush()
            return x
        return fn

    lines = op.map("seen_line", op.input("in", flow, DirSource(src, batch_size=2)), note("line"))
    words = op.flat_map("split", lines, str.split)
    keyed = op.key_on("key", words, lambda w: w)
    counts = op.stateful_map("count", op.map("seen_keyed", keyed, note("keyed")), _running)
    op.output("out", op.map("seen_out", counts, note("out")), FileSink(dst))
    return flow
'''


# ---------------------------------------------------------------------------
# Inputs and expected outputs


def words_text(seed: int, lines: int, vocab: int = 60, per_line: int = 5) -> str:
    """``lines`` lines of ``per_line`` words out of ``vocab`` (seeded)."""
    rng = random.Random(seed)
    names = [f"w{i:03d}" for i in range(vocab)]
    return "".join(" ".join(rng.choice(names) for _ in range(per_line)) + "\n" for _ in range(lines))


def spread_names(files: int, worker_counts: Sequence[int] = (), seed: int = 0) -> List[str]:
    """``files`` input file names such that, for every worker count in
    ``worker_counts``, ``DirSource`` gives every worker its share (at least
    ``files // n`` files each), so every process of a cluster reads."""
    rng = random.Random(seed)
    pool = [f"in-{j * 2654435761 % 2**32:08x}.txt" for j in range(200)]

    def fair(names: List[str]) -> bool:
        for n in worker_counts:
            owners = Counter(worker_for_key(f"local::{name}", n) for name in names)
            if any(owners[w] < files // n for w in range(n)):
                return False
        return True

    for _ in range(20000):
        names = sorted(rng.sample(pool, files))
        if fair(names):
            return names
    raise AssertionError(f"no {files} file names spread over {worker_counts} workers")


def make_run_dir(d: Path, files: int = 3, lines: int = 40, vocab: int = 60, seed: int = 7,
                 worker_counts: Sequence[int] = ()) -> Path:
    """A run dir: the flow module, ``files`` input files of ``lines`` lines
    in ``in/`` (named so each worker count in ``worker_counts`` gets them
    spread evenly), and the side inputs of ``many``."""
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{FLOW_MODULE}.py").write_text(FLOW_SOURCE)
    (d / "in").mkdir(exist_ok=True)
    for i, name in enumerate(spread_names(files, worker_counts)):
        (d / "in" / name).write_text(words_text(seed * 1000 + i, lines, vocab))
    rng = random.Random(seed)
    names = [f"w{i:03d}" for i in range(vocab)]
    # Side input of the join with the totals: one attribute per word
    # (some words have none), written twice for some (the last one wins).
    side = [f"{w} colour{rng.randrange(5)}" for w in names if rng.random() < 0.8]
    side += [f"{w.split()[0]} late{rng.randrange(5)}" for w in rng.sample(side, len(side) // 4)]
    (d / "side.txt").write_text("".join(s + "\n" for s in side))
    # Two keyed inputs for the product join, with repeated keys on both sides.
    keys = [f"k{i:02d}" for i in range(25)]
    (d / "left.txt").write_text("".join(f"{rng.choice(keys)} L{i}\n" for i in range(60)))
    (d / "right.txt").write_text("".join(f"{rng.choice(keys)} R{i}\n" for i in range(50)))
    return d


def _input_words(d: Path) -> List[str]:
    out: List[str] = []
    for p in sorted((d / "in").glob("*")):
        for line in p.read_text().splitlines():
            out.extend(line.split())
    return out


def dirsink_file(key: str, files: int = 3) -> str:
    """The file ``DirSink`` writes ``key`` to (its default assignment)."""
    return f"part_{zlib.crc32(key.encode()) % files}"


def expected_wordcount(d: Path, files: int = 3, prefix: str = "out") -> Dict[str, List[str]]:
    """The sorted lines per output file of ``wordcount`` over ``d/in``."""
    counts = Counter(_input_words(d))
    out: Dict[str, List[str]] = {f"{prefix}/part_{i}": [] for i in range(files)}
    for w, n in counts.items():
        out[f"{prefix}/{dirsink_file(w, files)}"].extend(f"{w} {k}" for k in range(1, n + 1))
    return {k: sorted(v) for k, v in out.items()}


def expected_many(d: Path) -> Dict[str, List[str]]:
    """The sorted lines per output file of ``many``."""
    out = expected_wordcount(d, 3, "out/running")
    counts = Counter(_input_words(d))
    out["out/totals.txt"] = sorted(f"{w} {n}" for w, n in counts.items())
    side: Dict[str, str] = {}
    for line in (d / "side.txt").read_text().splitlines():
        k, v = line.split()
        side[k] = v
    out["out/tagged.txt"] = sorted(f"{w} {counts.get(w)} {side.get(w)}" for w in set(counts) | set(side))
    lefts: Dict[str, List[str]] = {}
    rights: Dict[str, List[str]] = {}
    for name, acc in (("left.txt", lefts), ("right.txt", rights)):
        for line in (d / name).read_text().splitlines():
            k, v = line.split()
            acc.setdefault(k, []).append(v)
    pairs: List[str] = []
    for k in set(lefts) | set(rights):
        for lv in lefts.get(k, ["None"]):  # a missing side is None
            for rv in rights.get(k, ["None"]):
                pairs.append(f"{k} {lv} {rv}")
    out["out/pairs.txt"] = sorted(pairs)
    spread = []
    for p in sorted((d / "in").glob("*")):
        for line in p.read_text().splitlines():
            spread.append(f"{len(line)} {zlib.crc32(line.encode()):08x} {line}")
    out["out/spread.txt"] = sorted(spread)
    return out


def make_big_dir(d: Path, files: int = 3, lines: int = 40) -> Path:
    """A run dir for ``big``: ``files`` input files of ``lines`` distinct
    keys, one per worker of a ``files``-worker cluster (every process sends
    to every other)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{FLOW_MODULE}.py").write_text(FLOW_SOURCE)
    (d / "in").mkdir(exist_ok=True)
    for i, name in enumerate(spread_names(files, [files])):
        (d / "in" / name).write_text("".join(f"f{i}-k{j:04d}\n" for j in range(lines)))
    return d


def expected_big(d: Path, size: int, fan: int) -> Dict[str, List[str]]:
    """The sorted lines per output file of ``big``."""
    out: Dict[str, List[str]] = {f"out/part_{i}": [] for i in range(3)}
    for p in sorted((d / "in").glob("*")):
        for line in p.read_text().splitlines():
            for j in range(fan):
                unit = f"{line}/{j}|".encode()
                data = (unit * (size // len(unit) + 1))[:size]
                key = f"{line}/{j}"
                out[f"out/{dirsink_file(key)}"].append(f"{key} {size} {zlib.crc32(data):08x}")
    return {k: sorted(v) for k, v in out.items()}


def read_outputs(d: Path, under: str = "out") -> Dict[str, List[str]]:
    """Every file under ``d/under``, as sorted lines, by path relative to ``d``."""
    root = d / under
    out: Dict[str, List[str]] = {}
    if root.is_file():
        return {under: sorted(root.read_text().splitlines())}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[p.relative_to(d).as_posix()] = sorted(p.read_text().splitlines())
    return out


def diff_outputs(got: Mapping[str, List[str]], want: Mapping[str, List[str]]) -> str:
    """A short description of how two outputs differ ("" when equal)."""
    problems: List[str] = []
    for name in sorted(set(got) | set(want)):
        g, w = Counter(got.get(name, [])), Counter(want.get(name, []))
        if g == w:
            continue
        extra = sorted((g - w).elements())
        missing = sorted((w - g).elements())
        problems.append(
            f"{name}: {len(got.get(name, []))} lines, want {len(want.get(name, []))}; "
            f"extra (duplicates or wrong) {extra[:8]}{'...' if len(extra) > 8 else ''}; "
            f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}"
        )
    return "\n".join(problems)


# ---------------------------------------------------------------------------
# Processes


def cluster_env(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """A child's environment: pysrc on the path, no inherited ``MILLPOND_*``
    or ``AWS_*`` (test S3 credentials instead), plus ``extra``."""
    return child_env(dict(extra or {}))


def addresses(n: int) -> List[str]:
    """``n`` free addresses on 127.0.0.1."""
    return [f"127.0.0.1:{p}" for p in free_ports(n)]


def group_members(pgid: int) -> List[int]:
    """The pids of the live processes in process group ``pgid``."""
    pids: List[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parens.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


@dataclass
class Proc:
    """One child: its Popen, where its output goes, and when it ended."""

    name: str
    popen: "subprocess.Popen[bytes]"
    stdout_path: Path
    stderr_path: Path
    started: float
    #: A ``-p`` launcher: the processes it starts share its process group.
    launcher: bool = False
    ended: Optional[float] = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> Optional[int]:
        code = self.popen.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def result(self) -> Result:
        code = self.poll()
        assert code is not None, f"{self.name} is still running"
        return Result(code, self.stdout, self.stderr, (self.ended or time.monotonic()) - self.started)


@dataclass
class Cluster:
    """Children started by a test; :meth:`stop` (a context manager exit)
    kills whatever is still running, each process group member by pid."""

    logs: Path
    procs: List[Proc] = field(default_factory=list)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spawn(self, name: str, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        n = len(self.procs)
        out_path = self.logs / f"{n:02d}-{name}.out"
        err_path = self.logs / f"{n:02d}-{name}.err"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            popen = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        launcher = any(a in ("-p", "--processes") or a.startswith("--processes=") for a in argv)
        proc = Proc(name, popen, out_path, err_path, time.monotonic(), launcher)
        self.procs.append(proc)
        return proc

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        """Signal ``proc`` (only it: a ``-p`` launcher's processes live on)."""
        if proc.poll() is None:
            proc.popen.send_signal(sig)

    def wait(self, procs: Sequence[Proc], timeout: float) -> List[Result]:
        """Wait for ``procs`` to end; on timeout kill everything and fail
        with what each one said."""
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                running = [p.name for p in procs if p.poll() is None]
                self.stop()
                raise AssertionError(
                    f"{running} did not exit within {timeout:.0f} s\n" + self.describe(procs)
                )
            time.sleep(0.02)
        return [p.result() for p in procs]

    def describe(self, procs: Optional[Sequence[Proc]] = None) -> str:
        """The exit status and the tail of stderr of each of ``procs``."""
        parts = []
        for p in procs if procs is not None else self.procs:
            parts.append(f"--- {p.name} (exit {p.poll()}):\n{p.stderr[-2500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Kill every process this cluster started that still runs, and
        for a ``-p`` launcher the processes it started (the members of its
        process group, by pid)."""
        for p in self.procs:
            if p.poll() is None:
                p.popen.kill()
            if p.launcher:
                for pid in group_members(p.pid):
                    if pid != p.pid:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
        for p in self.procs:
            try:
                p.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
            p.poll()
        # A killed launcher's processes are reaped by init: give them a
        # moment to go, so no port or store lock outlives the test.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            m != p.pid for p in self.procs if p.launcher for m in group_members(p.pid)
        ):
            time.sleep(0.02)


def run_argv(import_str: str, extra: Sequence[str] = ()) -> List[str]:
    return [PYTHON, "-m", "millpond.run", import_str, *extra]


def start_process(cluster: Cluster, cwd: Path, import_str: str, index: int, addrs: Sequence[str], workers: int,
                  args: Sequence[str] = (), env: Optional[Mapping[str, str]] = None, tag: str = "p") -> Proc:
    """Start process ``index`` of the cluster at ``addrs`` (``-i``/``-a``)."""
    argv = run_argv(import_str, ["-w", str(workers), "-i", str(index), "-a", ";".join(addrs), *args])
    return cluster.spawn(f"{tag}{index}", argv, cwd, cluster_env(env))


def start_processes(cluster: Cluster, cwd: Path, import_str: str, n: int, workers: int,
                    args: Callable[[int], Sequence[str]] = lambda i: (),
                    env: Optional[Mapping[str, str]] = None, addrs: Optional[List[str]] = None,
                    tag: str = "p") -> List[Proc]:
    """Start ``n`` processes of one cluster with explicit ``-i I -a ADDRS``
    (``args(i)`` adds per-process flags such as ``-d``)."""
    addrs = addrs or addresses(n)
    return [start_process(cluster, cwd, import_str, i, addrs, workers, args(i), env, tag) for i in range(n)]


def run_cluster(cwd: Path, logs: Path, import_str: str, n: int, workers: int, mode: str = "ia",
                args: Callable[[int], Sequence[str]] = lambda i: (),
                env: Optional[Mapping[str, str]] = None, timeout: float = 60) -> List[Result]:
    """Run a whole cluster to its end and return each process's result.

    ``mode``: ``"ia"`` starts ``n`` processes with explicit ``-i``/``-a``;
    ``"p"`` one launcher with ``-p n`` (one result, the launcher's, whose
    stderr holds every process's log); ``"single"`` one process (``n`` must
    be 1) without ``-i``/``-a``."""
    with Cluster(logs) as cluster:
        if mode == "ia":
            procs = start_processes(cluster, cwd, import_str, n, workers, args, env)
        elif mode == "p":
            argv = run_argv(import_str, ["-p", str(n), "-w", str(workers), *args(0)])
            procs = [cluster.spawn("launcher", argv, cwd, cluster_env(env))]
        elif mode == "single":
            assert n == 1
            procs = [cluster.spawn("single", run_argv(import_str, ["-w", str(workers), *args(0)]), cwd,
                                   cluster_env(env))]
        else:
            raise ValueError(mode)
        return cluster.wait(procs, timeout)


def assert_all_ok(results: Sequence[Result]) -> None:
    bad = [f"process {i}: {r}" for i, r in enumerate(results) if r.returncode != 0]
    assert not bad, "\n".join(bad)


#: How a surviving process names the one it lost (docs/cluster.md).
LOST_RE = re.compile(r"process \d \(127\.0\.0\.1:\d+\) lost")

#: The per-peer line of the run log: batches and bytes out and in.
PEER_LINE_RE = re.compile(
    r"process (\d+) -> process (\d+) \(127\.0\.0\.1:(\d+)\): (\d+) batches / (\d+) bytes out, "
    r"(\d+) batches / (\d+) bytes in"
)


def wait_until(cond: Callable[[], bool], timeout: float, procs: Sequence[Proc] = (),
               what: str = "the condition") -> None:
    """Poll ``cond`` until it holds; fail if ``timeout`` passes or every one
    of ``procs`` ended first."""
    deadline = time.monotonic() + timeout
    while not cond():
        if procs and all(p.poll() is not None for p in procs):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.01)


def committed_epochs_dir(backup: Path, flow_id: str) -> List[int]:
    """The committed epochs recorded in a directory backup."""
    d = backup / flow_id / "commits"
    return sorted(int(p.stem) for p in d.glob("*.json")) if d.is_dir() else []


def newest_commit(list_keys: Callable[[], List[str]]) -> int:
    """The newest committed epoch among backup keys ``.../commits/N.json``."""
    best = 0
    for key in list_keys():
        m = re.search(r"/commits/(\d+)\.json$", key)
        if m:
            best = max(best, int(m.group(1)))
    return best


def tails(results: Sequence[Result]) -> str:
    return "\n".join(f"--- process {i}: {r}" for i, r in enumerate(results))


def seen_lines(d: Path) -> List[Tuple[str, str]]:
    """What the ``watch`` flow's steps saw, over every process's file."""
    out: List[Tuple[str, str]] = []
    for p in sorted(d.glob("seen-*.txt")):
        out.extend((p.name, line) for line in p.read_text().splitlines())
    return out
