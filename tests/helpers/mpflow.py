"""A small word-count flow and the subprocess plumbing the "never silently
wrong" suites (test_never_wrong.py, test_backup_bounds.py) share.

Every run is a child ``python -m millpond.run`` (never a fork of a process
that imported millpond), with ``PYTHONPATH=pysrc`` and no ``MILLPOND_*``
variable inherited, so the developer's environment cannot change what a
test sees. Every helper that starts a process also stops it: on timeout it
is killed and the test fails with what the child said so far.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
#: The package the children run. ``MP_TEST_PYSRC`` points them at another
#: build (say, an export of an older commit, to see which tests it fails).
PYSRC = Path(os.environ.get("MP_TEST_PYSRC") or REPO / "pysrc")
PYTHON = sys.executable

FLOW_ID = "wc"

#: The flow module every run dir gets. ``stateful_map`` emits a running
#: count per word, so the output file shows every item exactly once and in
#: order: any state restored wrong (a count off by one) changes the file.
#: ``pybackup`` is a pure-Python backup (a directory), for the code paths
#: the core takes only with a backup written in Python.
FLOW_SOURCE = '''
import os
import shutil
import time
from pathlib import Path

import millpond.operators as op
from millpond.connectors.files import FileSink, FileSource
from millpond.dataflow import Dataflow


def get_flow(src, dst, delay=0.0, name="wc", first_delay=0.0):
    flow = Dataflow(name)
    lines = op.input("in", flow, FileSource(src, batch_size=4))
    first = [first_delay]

    def split(line):
        if first[0]:
            time.sleep(first[0])
            first[0] = 0.0
        if delay:
            time.sleep(delay)
        return line.split()

    words = op.flat_map("split", lines, split)
    keyed = op.key_on("key", words, lambda w: w)
    counts = op.stateful_map("count", keyed, lambda n, w: ((n or 0) + 1, f"{w} {(n or 0) + 1}"))
    op.output("out", counts, FileSink(dst))
    return flow


class PyDirBackup:
    """A directory backup written in Python; record uploads are slowed
    down so a SIGKILL is likely to land in the middle of one."""

    def __init__(self, root, record_delay=0.0):
        self.root = Path(root)
        self.root.mkdir(exist_ok=True)
        self.record_delay = record_delay

    def list_keys(self, prefix=""):
        out = []
        for p in self.root.rglob("*"):
            if p.is_file():
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)

    def upload(self, from_local, to_key):
        if self.record_delay and ("/commits/" in to_key or "/executions/" in to_key):
            time.sleep(self.record_delay)
        dst = self.root / to_key
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copyfile(from_local, tmp)
        os.replace(tmp, dst)

    def download(self, from_key, to_local):
        src = self.root / from_key
        if self.record_delay and ("/commits/" in from_key or "/executions/" in from_key):
            time.sleep(self.record_delay)
        if not src.exists():
            raise FileNotFoundError(from_key)
        shutil.copyfile(src, to_local)

    def delete(self, key):
        try:
            (self.root / key).unlink()
        except FileNotFoundError:
            pass


def pybackup(root, record_delay=0.0):
    return PyDirBackup(root, record_delay)
'''

N_LINES = 3000
N_WORDS = 300  # under 1024 keys: the local store is rewritten in place, one file
WORDS_PER_LINE = 5
DELAY = 0.0004  # per line: a run takes about 1.5 s, so a kill lands mid-run

#: The import string of the flow in a run dir.
IMPORT = f'wcflow:get_flow("in.txt", "out.txt", delay={DELAY})'
EPOCH = "0.05"


def child_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a child run: the repo's pysrc on the path, no
    ``MILLPOND_*`` or ``AWS_*`` from outside, test S3 credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MILLPOND_", "AWS_"))}
    env["PYTHONPATH"] = str(PYSRC)
    env["AWS_ACCESS_KEY_ID"] = "test"
    env["AWS_SECRET_ACCESS_KEY"] = "test"
    env["AWS_REGION"] = "us-east-1"
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["AWS_CONFIG_FILE"] = os.devnull
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    if extra:
        env.update(extra)
    return env


def input_text(seed: int = 1, lines: int = N_LINES) -> str:
    """The input: ``lines`` lines of ``WORDS_PER_LINE`` words out of ``N_WORDS``."""
    rng = random.Random(seed)
    vocab = [f"w{i:03d}" for i in range(N_WORDS)]
    return "".join(" ".join(rng.choice(vocab) for _ in range(WORDS_PER_LINE)) + "\n" for _ in range(lines))


def make_run_dir(d: Path, lines: int = N_LINES) -> Path:
    """A directory holding the flow module and its input."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "wcflow.py").write_text(FLOW_SOURCE)
    (d / "in.txt").write_text(input_text(lines=lines))
    return d


@functools.lru_cache(maxsize=None)
def expected_output(lines: int = N_LINES) -> str:
    """What an uninterrupted run without recovery writes (computed once per
    session). Not a Counter replay: within an input batch the engine emits
    in its own order, so only a real run gives the exact bytes to compare."""
    d = Path(tempfile.mkdtemp(prefix="mp-reference-"))
    try:
        make_run_dir(d, lines=lines)
        res = run([PYTHON, "-m", "millpond.run", IMPORT, "-s", EPOCH], d)
        assert res.returncode == 0, f"the reference run failed: {res}"
        text = (d / "out.txt").read_text()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert sorted(text.splitlines()) == sorted(_counted(lines)), "the reference run counted wrong"
    return text


def _counted(lines: int) -> List[str]:
    """The output lines (in input order) of counting the input in Python."""
    counts: Dict[str, int] = {}
    out: List[str] = []
    for line in input_text(lines=lines).splitlines():
        for w in line.split():
            counts[w] = counts.get(w, 0) + 1
            out.append(f"{w} {counts[w]}")
    return out


def run_argv(local: str = "LOCAL", backup: Optional[str] = "BACKUP", import_str: str = IMPORT,
             extra: Sequence[str] = ()) -> List[str]:
    """``python -m millpond.run IMPORT -d local -b backup -s EPOCH``."""
    argv = [PYTHON, "-m", "millpond.run", import_str, "-s", EPOCH, "-d", local]
    if backup is not None:
        argv += ["-b", backup]
    return argv + list(extra)


@dataclass
class Result:
    """What a finished child did."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def __str__(self) -> str:
        return f"exit {self.returncode} after {self.seconds:.1f} s; stderr:\n{self.stderr[-3000:]}"


def run(argv: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None, timeout: float = 60) -> Result:
    """Run a child to its end; kill it (and report) if it outlives ``timeout``."""
    t0 = time.monotonic()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env or child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(argv)} did not exit within {timeout} s; stderr:\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Result(proc.returncode, out, err, time.monotonic() - t0)


def bound_flag_runs(tmp_path: Path, flag: str, var: str, good: Sequence[str],
                    env: Optional[Dict[str, str]] = None) -> Tuple[Result, Result, Result]:
    """The word count of ``wcflow`` run three times from the command line:
    with ``flag 0``, with ``var=lots`` (both must exit 2 before writing
    anything), then with the ``good`` arguments (must exit 0). Returns the
    three results for the caller's checks of their messages."""
    d = make_run_dir(tmp_path / "run", lines=200)
    flow = 'wcflow:get_flow("in.txt", "out.txt")'
    bad_flag = run([PYTHON, "-m", "millpond.run", flow, flag, "0"], d)
    assert bad_flag.returncode == 2, bad_flag
    bad_var = run([PYTHON, "-m", "millpond.run", flow], d, env=child_env({var: "lots"}))
    assert bad_var.returncode == 2, bad_var
    assert not (d / "out.txt").exists()
    ok = run([PYTHON, "-m", "millpond.run", flow, *good], d, env=child_env(env))
    assert ok.returncode == 0, ok
    return bad_flag, bad_var, ok


def commit_records(backup: Path, flow: str = FLOW_ID) -> List[Path]:
    """The commit records in a directory backup, oldest first."""
    d = backup / flow / "commits"
    return sorted(d.glob("*.json")) if d.is_dir() else []


def committed_epoch(backup: Path, flow: str = FLOW_ID) -> int:
    """The newest committed epoch in a directory backup (0 for none); not the
    number of records, since only the newest ten are retained."""
    records = commit_records(backup, flow)
    return int(records[-1].stem) if records else 0


def run_and_kill(argv: Sequence[str], cwd: Path, until: Callable[[], bool], env: Optional[Dict[str, str]] = None,
                 timeout: float = 30, extra_delay: float = 0.0) -> Result:
    """Start a run, wait until ``until()`` holds (e.g. some epochs are
    committed), then SIGKILL it. If the run ends first, that is returned."""
    t0 = time.monotonic()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env or child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = t0 + timeout
        while proc.poll() is None and not until():
            if time.monotonic() > deadline:
                raise AssertionError(f"the run never reached its kill point within {timeout} s")
            time.sleep(0.005)
        if extra_delay:
            time.sleep(extra_delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Result(proc.returncode, "", err, time.monotonic() - t0)


def verify(backup: str, cwd: Path, env: Optional[Dict[str, str]] = None) -> Result:
    """``python -m millpond.recovery verify BACKUP``."""
    return run([PYTHON, "-m", "millpond.recovery", "verify", backup], cwd=cwd, env=env, timeout=60)


def copy_tree(src: Path, dst: Path) -> Path:
    """A copy of a run dir (no hard links shared with the original, so a
    bit flipped in the copy stays in the copy)."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


def read_until_started(proc: "subprocess.Popen[str]") -> str:
    """Read a child run's log until its execution starts (or it exits)."""
    seen = []
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if " starts at epoch " in line:
            break
    return "".join(seen)


def kill_at_random_points(argv: Sequence[str], cwd: Path, env: Dict[str, str], rounds: int,
                          rng: random.Random, max_delay: float, out: Path, uninterrupted: str,
                          lose_local_after: Sequence[int] = ()) -> "tuple[List[str], int]":
    """Run ``argv`` ``rounds`` times, each SIGKILLed a random time (up to
    ``max_delay`` s) after its execution started; after each, ``out`` may
    only be a prefix of ``uninterrupted`` (nothing twice, no half lines);
    after the rounds in ``lose_local_after`` the local state dir
    ``cwd/state`` is emptied. Returns the runs' logs and how many were
    killed (rather than finished)."""
    logs: List[str] = []
    killed = 0
    for i in range(rounds):
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            # a random point after processing started (startup time varies with load)
            head = read_until_started(proc)
            time.sleep(rng.uniform(0.0, max_delay))
            proc.send_signal(signal.SIGKILL)
            _out, err = proc.communicate(timeout=30)
            err = head + err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode in (-signal.SIGKILL, 0), err
        killed += proc.returncode == -signal.SIGKILL
        logs.append(err)
        if out.exists():
            assert uninterrupted.startswith(out.read_text())
        if i in lose_local_after:
            shutil.rmtree(cwd / "state")
            (cwd / "state").mkdir()
    return logs, killed
