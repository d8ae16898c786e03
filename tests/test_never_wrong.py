"""Never silently wrong: damage to the local store or the backup, a lost
backup, racing starts, tampered records and stray temp files are either
survived with the exact output of an uninterrupted run, or refused with
an error that names what is wrong. No run may exit 0 with a different
output.

Every run is a child ``python -m millpond.run`` of a word count
(helpers/mpflow.py) that is SIGKILLed after a few committed epochs; the
damage is done between the kill and the rerun. The message fragments the
tests match on are the constants below, so a reworded message is a
one-line change here.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sqlite3
import struct
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Set, Tuple

import pytest

from helpers import bitflip
from helpers.mpflow import (
    FLOW_ID,
    PYTHON,
    Result,
    child_env,
    commit_records,
    committed_epoch,
    copy_tree,
    expected_output,
    make_run_dir,
    run,
    run_and_kill,
    run_argv,
    verify,
)
from helpers.s3server import S3Server

# --- message fragments and names the feature defines ---------------------------

#: A local store found damaged on open: the run stops and says so.
LOCAL_DAMAGED = "local store damaged"
#: The resume line of a run that rebuilt its local store from the backup.
FULL_RESUME = "full resume"
#: A durable object whose bytes do not match its commit record.
CORRUPT_OBJECT = "corrupt durable object"
#: A backup that no longer holds what the local store says was committed.
BACKUP_LOST = "the backup lost committed state"
#: A start that lost the race for its execution number (any one of these).
RACE_LOSER = ("another run", "same time")
#: A run that started a moment earlier and was superseded by a newer
#: execution (docs/recovery.md): also a clear stop, but after it ran.
SUPERSEDED = ("a newer execution of this flow is running",)
#: A commit record that does not carry a valid authentication code.
NOT_AUTHENTICATED = "not authenticated"
#: How an error names a commit record (``FLOW/commits/NNNNNNNNNN.json``).
COMMITS_DIR = "commits/"
#: ``verify`` without a key: it checked integrity only.
NOT_AUTHENTICITY = "not authenticity"
#: The environment variable holding the backup's authentication key.
BACKUP_KEY_ENV = "MILLPOND_BACKUP_KEY"
#: How many seeds the bit-flip loop runs (default below).
BITFLIP_SEEDS_ENV = "MILLPOND_BITFLIP_SEEDS"
DEFAULT_BITFLIP_SEEDS = 12
#: The resume log line: ``resume flow 'wc': fast resume, execution 1, resume epoch 4, ...``.
RESUME_LINE = "resume flow"
EXECUTION_RE = re.compile(r"execution (\d+)")
TEMP_RECORD_GLOB = "mp-record-*"
#: The name a new local store is made under until its schema commits.
STORE_CREATING = "store.creating.sqlite"

KEY = "a-test-key-0123456789abcdef"
COMMITS_BEFORE_KILL = 18  # epochs, of 30-40: late enough that a rerun is short



def _killed(d: Path, env: Dict[str, str] | None = None) -> Path:
    """A run dir whose run was SIGKILLed after ``COMMITS_BEFORE_KILL`` commits."""
    make_run_dir(d)
    res = run_and_kill(run_argv(), d, lambda: committed_epoch(d / "BACKUP") >= COMMITS_BEFORE_KILL, env=env)
    assert res.returncode == -9, f"the run was meant to be killed mid-run: {res}"
    assert (d / "LOCAL" / FLOW_ID / "worker-0000" / "store.sqlite").exists(), "no local store after the kill"
    return d


@pytest.fixture(scope="module")
def plain_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir killed mid-run, without a backup key; tests work on copies."""
    return _killed(tmp_path_factory.mktemp("plain") / "run")


@pytest.fixture(scope="module")
def keyed_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, written with ``MILLPOND_BACKUP_KEY`` set."""
    return _killed(tmp_path_factory.mktemp("keyed") / "run", env=child_env({BACKUP_KEY_ENV: KEY}))


def _out(d: Path) -> str:
    p = d / "out.txt"
    return p.read_text() if p.exists() else ""


def _verify_ok(d: Path, env: Dict[str, str] | None = None) -> None:
    v = verify("BACKUP", d, env)
    assert v.returncode == 0 and f"{FLOW_ID}: ok" in v.stdout, f"verify after the run: {v}\n{v.stdout}"


def _newest_commit(d: Path) -> Path:
    records = commit_records(d / "BACKUP")
    assert records, "no commit record in the backup"
    return records[-1]


def _committed_objects(d: Path) -> List[str]:
    """The keys of the objects the newest commit record names."""
    rec = json.loads(_newest_commit(d).read_text())
    keys = [o["key"] for o in rec["objects"] if "/segments/" in o["key"] or "/compacted/" in o["key"]]
    assert keys, f"the newest commit names no segment or compacted object: {rec}"
    return keys


# --- A. bit flips in the local store --------------------------------------------


def _bitflip_seeds() -> int:
    raw = os.environ.get(BITFLIP_SEEDS_ENV, "")
    return int(raw) if raw.strip() else DEFAULT_BITFLIP_SEEDS


def _checkpoint(store: Path) -> None:
    """Fold the WAL into the main file, as the store's background
    checkpointer would have done before a later kill (with Python's sqlite3:
    the file is a plain SQLite database)."""
    con = sqlite3.connect(str(store))
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


def _flip_for_seed(d: Path, seed: int) -> bitflip.Flip:
    """One bit of the worker's store chosen by ``seed``. Even seeds flip the
    store as the kill left it (most recent rows still in the WAL, so the
    WAL is the first choice); odd seeds checkpoint it first, so the rows are
    in the main file. The kind cycles through random and the targeted ones."""
    rng = random.Random(seed)
    wdir = d / "LOCAL" / FLOW_ID / "worker-0000"
    store = wdir / "store.sqlite"
    wal = wdir / "store.sqlite-wal"
    if seed % 2:
        _checkpoint(store)
    files = [store]
    if wal.exists() and wal.stat().st_size > 0:
        files.insert(0, wal)
    kind = bitflip.KINDS[(seed // 2) % len(bitflip.KINDS)]
    for path in files:
        flip = bitflip.choose(path, kind, rng)
        if flip is not None:
            break
    else:
        flip = bitflip.choose(files[0], "random", rng)
    assert flip is not None, f"nothing to flip in {files}"
    bitflip.flip_bit(flip.path, flip.offset, flip.bit)
    return flip


def _rerun_after_local_damage(d: Path, what: str) -> List[str]:
    """Rerun to completion; the problems found (empty when the outcome is one
    of the two acceptable ones)."""
    argv = run_argv()
    first = run(argv, d)
    if first.returncode == 0:
        if _out(d) != expected_output():
            return [f"{what}: exit 0 with an output that differs from an uninterrupted run's (silently wrong)"]
        return []
    if LOCAL_DAMAGED not in first.stderr:
        return [f"{what}: exit {first.returncode} without {LOCAL_DAMAGED!r}: {first.stderr.strip()[-400:]}"]
    second = run(argv, d)
    if second.returncode != 0:
        return [f"{what}: the rerun after {LOCAL_DAMAGED!r} failed too: {second}"]
    problems = []
    if FULL_RESUME not in second.stderr:
        problems.append(f"{what}: the rerun after {LOCAL_DAMAGED!r} did not do a {FULL_RESUME!r}")
    if _out(d) != expected_output():
        problems.append(f"{what}: the rerun after {LOCAL_DAMAGED!r} wrote a different output")
    return problems


@pytest.mark.slow
def test_a_bit_flipped_in_the_local_store_is_survived_exactly_or_refused(plain_base: Path, tmp_path: Path) -> None:
    """A flipped bit anywhere in a worker's store (row data, a key, a pickled
    value, the header, an interior b-tree page, the WAL) must never give a
    different output with exit 0: either the run is unaffected, or it stops
    with ``local store damaged`` and the next run resumes fully from the
    backup. Seeds: ``MILLPOND_BITFLIP_SEEDS`` (default 12)."""
    problems: List[str] = []
    for seed in range(_bitflip_seeds()):
        d = copy_tree(plain_base, tmp_path / f"seed{seed}")
        flip = _flip_for_seed(d, seed)
        found = _rerun_after_local_damage(d, f"seed {seed} ({flip})")
        if not found:
            v = verify("BACKUP", d)
            if v.returncode != 0 or f"{FLOW_ID}: ok" not in v.stdout:
                found = [f"seed {seed} ({flip}): verify failed afterwards: {v.stdout}{v.stderr}"]
        problems += found
        shutil.rmtree(d)
    assert not problems, "\n".join(problems)


def test_a_step_id_flipped_out_of_utf8_in_the_local_store_is_damage(plain_base: Path, tmp_path: Path) -> None:
    """Listing a store's steps reads step ids without a row's checksum: a
    flipped bit that leaves one not UTF-8 must stop the run as local damage
    (and the next run resume fully), not as a decoding error at start (seen
    once in a new user's run of the bit-flip test above)."""
    d = copy_tree(plain_base, tmp_path / "run")
    store = d / "LOCAL" / FLOW_ID / "worker-0000" / "store.sqlite"
    _checkpoint(store)
    con = sqlite3.connect(str(store))
    try:
        steps = [r[0] for r in con.execute("SELECT DISTINCT step_id FROM snaps")]
    finally:
        con.close()
    assert steps, "the killed run's store holds no step"
    data = store.read_bytes()
    name = steps[0].encode()
    assert name in data
    store.write_bytes(data.replace(name, name[:-1] + b"\xff"))
    assert _rerun_after_local_damage(d, f"step id {steps[0]!r} flipped") == []


def _checkpoint_keeping_wal(store: Path, keep_index: bool) -> int:
    """Copy every frame of the store's WAL into its main file, as the
    store's passive checkpoints do, but keep the WAL as the kill left it
    (SQLite deletes it when its last connection closes), and with
    ``keep_index`` its index (the -shm a killed process leaves) too. A WAL
    of fewer than 6 frames (the kill came soon after a checkpoint) is
    topped up first. Returns the number of frames."""
    wal = store.with_name(store.name + "-wal")
    shm = store.with_name(store.name + "-shm")
    kept, kept_shm = store.with_name("kept.wal"), store.with_name("kept.shm")
    con = sqlite3.connect(str(store))
    try:
        while _wal_frames(wal) < 6:
            # SQLite skips writing a row rewritten as it is; a row added
            # and removed again leaves the same rows.
            with con:
                con.execute("INSERT INTO snaps VALUES ('top-up', 'k', 1, 0, zeroblob(40000), 0)")
            with con:
                con.execute("DELETE FROM snaps WHERE step_id = 'top-up'")
        con.execute("PRAGMA wal_checkpoint(PASSIVE)")
        shutil.copyfile(wal, kept)
        shutil.copyfile(shm, kept_shm)
    finally:
        con.close()
    kept.replace(wal)
    if keep_index:
        kept_shm.replace(shm)
    else:
        kept_shm.unlink()
        shm.unlink(missing_ok=True)
    return _wal_frames(wal)


def _wal_frames(wal: Path) -> int:
    data = wal.read_bytes() if wal.exists() else b""
    if len(data) < bitflip.WAL_HEADER_SIZE:
        return 0
    (size,) = struct.unpack(">I", data[8:12])
    return (len(data) - bitflip.WAL_HEADER_SIZE) // (bitflip.WAL_FRAME_HEADER_SIZE + size)


@pytest.mark.parametrize(
    ("where", "emptied", "index"),
    [(1 / 3, False, True), (2 / 3, False, True), (1 / 2, True, True), (1 / 3, False, False), (2 / 3, False, False)],
)
def test_a_damaged_wal_frame_is_caught_before_the_store_is_read(
    plain_base: Path, tmp_path: Path, where: float, emptied: bool, index: bool
) -> None:
    """A damaged frame in the middle of the WAL makes SQLite drop it and
    every frame after it, while a checkpoint may already have copied those
    frames' pages into the main file: the store SQLite would show mixes old
    and new pages, whose rows all pass their checksums. The run must see
    that before it reads the store (a flow running on it would, say,
    truncate its output file to an older offset) and resume fully from the
    backup with the exact output. With the WAL's index the killed process
    left, the first look at the store finds it (the index counts more
    committed frames than SQLite would replay), or, once in a new user's
    run, the open that writes (a frame of the current log after a damaged
    one); without
    it, either the store's metadata reads older than the committed epoch
    (a full resume for that reason) or the check at the store's open finds
    it. (Without the check, a flip at a third of the WAL resumed fast on
    the mixed store, and one at two thirds failed the background check
    after the flow had run.)"""
    d = copy_tree(plain_base, tmp_path / "run")
    store = d / "LOCAL" / FLOW_ID / "worker-0000" / "store.sqlite"
    wal = store.with_name(store.name + "-wal")
    if emptied:
        _checkpoint(store)  # the WAL as a kill right after a checkpoint leaves it
    frames = _checkpoint_keeping_wal(store, index)
    (page,) = struct.unpack(">I", wal.read_bytes()[8:12])
    frame = int(frames * where)
    offset = bitflip.WAL_HEADER_SIZE + frame * (bitflip.WAL_FRAME_HEADER_SIZE + page)
    bitflip.flip_bit(wal, offset + bitflip.WAL_FRAME_HEADER_SIZE + page // 2, 3)
    res = run(run_argv(), d)
    what = f"frame {frame} of {frames}"
    assert res.returncode == 0, f"{what}: {res}"
    assert FULL_RESUME in res.stderr, f"{what}: want a full resume: {res}"
    # With the index, its count is the first witness; when the index is not
    # taken (its header did not check out against the log: seen in a loaded
    # run), the witnesses are those of a store without one: its metadata,
    # as SQLite shows it, older than the committed epoch, or the writable
    # open's frame-order rule, naming the log. Each finds the damage before
    # the store is read.
    reasons = ("write-ahead log", "local store holds epochs up to")
    if index:
        reasons = ("-shm) says",) + reasons
    assert any(r in res.stderr for r in reasons), f"{what}: want the resume's reason to be one of {reasons}: {res}"
    assert _out(d) == expected_output()
    _verify_ok(d)


def test_a_store_half_made_by_a_kill_is_made_again(plain_base: Path, tmp_path: Path) -> None:
    """A new local store is made under a temporary name and renamed into
    place once its schema has committed. A kill while making it (on a fresh
    disk after commits, or in a first run) leaves that temporary file,
    empty: the next run removes it and goes on, from the backup or from
    nothing, never stopping with ``local store damaged``."""
    d = copy_tree(plain_base, tmp_path / "run")
    wdir = d / "LOCAL" / FLOW_ID / "worker-0000"
    for p in wdir.iterdir():
        if p.name.startswith("store."):
            p.unlink()
    (wdir / STORE_CREATING).write_bytes(b"")
    res = run(run_argv(), d)
    assert res.returncode == 0, f"the rerun failed: {res}"
    assert LOCAL_DAMAGED not in res.stderr, f"a half-made store was taken for damage: {res}"
    assert FULL_RESUME in res.stderr, f"want a {FULL_RESUME!r}: {res}"
    assert not (wdir / STORE_CREATING).exists(), "the half-made store is still there"
    assert _out(d) == expected_output()
    _verify_ok(d)

    fresh = tmp_path / "fresh"
    make_run_dir(fresh)
    wdir = fresh / "LOCAL" / FLOW_ID / "worker-0000"
    wdir.mkdir(parents=True)
    (wdir / STORE_CREATING).write_bytes(b"")
    res = run(run_argv(), fresh)
    assert res.returncode == 0 and LOCAL_DAMAGED not in res.stderr, f"a first run over a half-made store: {res}"
    assert _out(fresh) == expected_output()


def test_a_bit_flipped_in_a_committed_backup_object_is_refused_by_name(plain_base: Path, tmp_path: Path) -> None:
    """With the local store gone, a resume reads the committed objects: a
    flipped bit in one must stop the run with an error naming the object,
    never resume from it."""
    for seed in range(2):
        d = copy_tree(plain_base, tmp_path / f"seed{seed}")
        shutil.rmtree(d / "LOCAL")
        rng = random.Random(seed)
        key = rng.choice(_committed_objects(d))
        obj = d / "BACKUP" / key
        bitflip.flip_bit(obj, rng.randrange(obj.stat().st_size), rng.randrange(8))
        res = run(run_argv(), d)
        assert not (res.returncode == 0 and _out(d) != expected_output()), f"seed {seed}: exit 0 with a wrong output"
        assert res.returncode != 0, f"seed {seed}: a flipped bit in {key} went unnoticed: {res}"
        assert CORRUPT_OBJECT in res.stderr and key in res.stderr, f"seed {seed}: want {CORRUPT_OBJECT!r} naming {key}: {res}"


# --- B. a lost backup -----------------------------------------------------------------


def _files(root: Path) -> Set[str]:
    """Files under ``root`` whose loss would lose data (not the lock, WAL or shm)."""
    skip = ("-wal", "-shm", "LOCK")
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.name.endswith(skip)}


def test_an_emptied_backup_is_refused_and_the_local_state_is_kept(plain_base: Path, tmp_path: Path) -> None:
    """A local store that has committed epochs the backup no longer has means
    the backup lost data: starting over silently would throw the state away
    and rewrite the output from nothing. The run must stop, name the local
    state dir (removing it is how to start over on purpose) and keep it."""
    d = copy_tree(plain_base, tmp_path / "run")
    local = d / "LOCAL"
    before = _files(local)
    for p in (d / "BACKUP").iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    argv = run_argv(local=str(local))
    res = run(argv, d)
    assert res.returncode != 0, f"a run against an emptied backup started: {res}"
    assert BACKUP_LOST in res.stderr, f"want {BACKUP_LOST!r}: {res}"
    assert str(local) in res.stderr, f"the error must name the local state dir {local}: {res}"
    missing = before - _files(local)
    assert not missing, f"the refused run deleted local state: {sorted(missing)}"

    shutil.rmtree(local / FLOW_ID)
    again = run(argv, d)
    assert again.returncode == 0, f"after removing {local / FLOW_ID} the run must start over: {again}"
    assert "resume epoch 1," in again.stderr, f"the run did not start over from epoch 1: {again}"
    assert _out(d) == expected_output()


# --- D. racing starts -------------------------------------------------------------------

RACER = '''
"""Wait at a barrier, then run millpond.run's main in this process."""
import sys
import time
from pathlib import Path

import millpond.run
import millpond.recovery  # loads the core before the barrier
import wcflow  # noqa: F401

ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.write_text("")
while not go.exists():
    time.sleep(0.001)
t = float(go.read_text())
if t - time.time() > 0.005:
    time.sleep(t - time.time() - 0.005)
while time.time() < t:
    pass
sys.exit(millpond.run.main(sys.argv[3:]))
'''

RACE_LINES = 200
RACE_FIRST_DELAY = 1.0  # 0.3 s was too short on a loaded machine (one racer resumed another's commit)
RACE_PROCS = 3


def _race_round(root: Path, backup: str, flow: str, env: Dict[str, str]) -> List[str]:
    """Start ``RACE_PROCS`` runs of one flow at the same instant, each with
    its own local dir and output; the problems found."""
    barrier = root / "barrier"
    barrier.mkdir(parents=True)
    # The first item waits, so no racer commits before every racer has
    # claimed its execution: a later one would otherwise resume another
    # racer's state against its own (empty) output file.
    imp = f'wcflow:get_flow("in.txt", "out.txt", name="{flow}", first_delay={RACE_FIRST_DELAY})'
    procs: List[Tuple[Path, "subprocess.Popen[str]"]] = []
    results: List[Tuple[Path, Result]] = []
    try:
        for i in range(RACE_PROCS):
            d = make_run_dir(root / f"p{i}", lines=RACE_LINES)
            (d / "racer.py").write_text(RACER)
            argv = [PYTHON, "racer.py", str(barrier / f"ready{i}"), str(barrier / "go"),
                    *run_argv(backup=backup, import_str=imp)[3:]]
            procs.append((d, subprocess.Popen(argv, cwd=d, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True)))
        deadline = time.monotonic() + 60
        while len(list(barrier.glob("ready*"))) < RACE_PROCS:
            assert time.monotonic() < deadline, "the racers never got ready"
            assert all(p.poll() is None for _d, p in procs), "a racer died before the barrier"
            time.sleep(0.005)
        tmp = barrier / "go.tmp"
        tmp.write_text(repr(time.time() + 0.2))
        tmp.rename(barrier / "go")
        for d, p in procs:
            t0 = time.monotonic()
            out, err = p.communicate(timeout=60)
            results.append((d, Result(p.returncode, out, err, time.monotonic() - t0)))
    finally:
        for _d, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    problems: List[str] = []
    executions: Dict[int, int] = {}
    expected = expected_output(lines=RACE_LINES)
    winners = 0
    for i, (d, res) in enumerate(results):
        for line in res.stderr.splitlines():
            if RESUME_LINE in line:
                m = EXECUTION_RE.search(line)
                if m:
                    n = int(m.group(1))
                    if n in executions:
                        problems.append(f"{flow}: racers {executions[n]} and {i} both run execution {n}")
                    executions[n] = i
        if res.returncode == 0:
            winners += 1
            if _out(d) != expected:
                problems.append(f"{flow}: racer {i} exited 0 with a wrong output")
        elif any(f in res.stderr for f in RACE_LOSER):
            if _out(d):
                problems.append(f"{flow}: racer {i} lost the race but wrote output first")
        elif not any(f in res.stderr for f in SUPERSEDED):
            problems.append(f"{flow}: racer {i} failed without saying it lost a race ({RACE_LOSER}): "
                            f"{res.stderr.strip()[-300:]}")
    if winners == 0:
        problems.append(f"{flow}: no racer finished: " + "; ".join(r.stderr.strip()[-200:] for _d, r in results))
    return problems


def _race(tmp_path: Path, backup: str, rounds: int, env: Dict[str, str]) -> None:
    problems: List[str] = []
    for r in range(rounds):
        problems += _race_round(tmp_path / f"round{r}", backup, f"race{r}", env)
    assert not problems, "\n".join(problems)
    v = run([PYTHON, "-m", "millpond.recovery", "verify", backup], tmp_path, env=env)
    assert v.returncode == 0, f"verify after the races: {v}\n{v.stdout}"


@pytest.mark.slow
def test_runs_started_at_the_same_instant_never_share_an_execution_dir_backup(tmp_path: Path) -> None:
    """Two processes that claim the same execution number would interleave
    their commit records; exactly one may win each number, and a loser
    stops with a clear error before it writes anything."""
    _race(tmp_path, str(tmp_path / "BACKUP"), rounds=10, env=child_env())


@pytest.mark.slow
def test_runs_started_at_the_same_instant_never_share_an_execution_s3(tmp_path: Path, s3_server: S3Server) -> None:
    """The same race on S3, where claiming a number takes a conditional write."""
    _race(tmp_path, s3_server.uri(f"race-{tmp_path.name}"), rounds=3, env=child_env())


# --- E. authenticated state -------------------------------------------------------------


def _keyed_env() -> Dict[str, str]:
    return child_env({BACKUP_KEY_ENV: KEY})


def test_a_keyed_run_resumes_normally(keyed_base: Path, tmp_path: Path) -> None:
    """With a key set, the records it signs verify on resume."""
    d = copy_tree(keyed_base, tmp_path / "run")
    res = run(run_argv(), d, env=_keyed_env())
    assert res.returncode == 0, f"a keyed run did not resume: {res}"
    assert _out(d) == expected_output()


def test_an_unkeyed_backup_is_not_trusted_once_a_key_is_set(plain_base: Path, tmp_path: Path) -> None:
    """Records written without a key carry no authentication code; a run
    with a key must not take them for authentic."""
    d = copy_tree(plain_base, tmp_path / "run")
    res = run(run_argv(), d, env=_keyed_env())
    assert res.returncode != 0, f"a keyed run trusted unauthenticated records: {res}"
    assert COMMITS_DIR in res.stderr and NOT_AUTHENTICATED in res.stderr, \
        f"want the commit record named and {NOT_AUTHENTICATED!r}: {res}"


def _tamper_checksum(rec: Path) -> None:
    data = json.loads(rec.read_text())
    c = data["checksum"]
    data["checksum"] = ("0" if c[0] != "0" else "1") + c[1:]
    rec.write_text(json.dumps(data, indent=1))


def _tamper_field(rec: Path) -> None:
    data = json.loads(rec.read_text())
    data["objects"][0]["rows"] += 1
    rec.write_text(json.dumps(data, indent=1))


@pytest.mark.parametrize("tamper", [_tamper_checksum, _tamper_field], ids=["checksum", "field"])
def test_a_tampered_commit_record_is_refused_by_name(keyed_base: Path, tmp_path: Path,
                                                   tamper: Callable[[Path], None]) -> None:
    """With a key, a commit record whose authentication fails is refused by
    name before anything it says is used: the run does not start, so the
    output file is left exactly as it was."""
    d = copy_tree(keyed_base, tmp_path / "run")
    rec = _newest_commit(d)
    tamper(rec)
    before = _out(d)
    res = run(run_argv(), d, env=_keyed_env())
    assert res.returncode != 0, f"a tampered commit record was accepted: {res}"
    name = f"{COMMITS_DIR}{rec.name}"
    assert name in res.stderr, f"the error must name {name}: {res}"
    assert _out(d) == before, "the run went ahead (the output file changed) despite the tampered record"


def test_a_rewritten_segment_is_refused_by_name_with_a_key(keyed_base: Path, tmp_path: Path) -> None:
    """An object rewritten in the backup is refused by name on a full resume."""
    d = copy_tree(keyed_base, tmp_path / "run")
    shutil.rmtree(d / "LOCAL")
    key = _committed_objects(d)[0]
    obj = d / "BACKUP" / key
    bitflip.flip_bit(obj, obj.stat().st_size // 2, 3)
    res = run(run_argv(), d, env=_keyed_env())
    assert res.returncode != 0, f"a rewritten segment was used: {res}"
    assert CORRUPT_OBJECT in res.stderr and key in res.stderr, f"want {CORRUPT_OBJECT!r} naming {key}: {res}"


def test_verify_without_a_key_says_it_did_not_check_authenticity(plain_base: Path, tmp_path: Path) -> None:
    """A clean ``verify`` without a key checked checksums only; saying just
    "ok" would read as "nobody rewrote it", which it cannot know."""
    d = copy_tree(plain_base, tmp_path / "run")
    v = verify("BACKUP", d)
    assert v.returncode == 0, f"verify: {v}\n{v.stdout}"
    assert NOT_AUTHENTICITY in v.stdout + v.stderr, f"want {NOT_AUTHENTICITY!r}: {v.stdout}{v.stderr}"


# --- G. temp files --------------------------------------------------------------------


@pytest.mark.slow
def test_killed_runs_leave_no_record_temp_dirs(tmp_path: Path) -> None:
    """Commit and execution records go through a temp dir with a backup
    written in Python; a SIGKILL in the middle must not leave it behind in
    the system temp dir, where nothing would ever collect it."""
    d = make_run_dir(tmp_path / "run")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = child_env({"TMPDIR": str(tmpdir)})
    argv = run_argv(backup='wcflow:pybackup("PYBACKUP", record_delay=0.05)')
    rng = random.Random(7)
    left: List[str] = []
    for i in range(3):
        res = run_and_kill(argv, d, lambda: len(commit_records(d / "PYBACKUP")) >= 1 + 2 * i, env=env,
                           extra_delay=rng.uniform(0.0, 0.2))
        assert res.returncode in (0, -9), f"kill {i}: {res}"
        left += [f"after kill {i}: {p.name}" for p in tmpdir.glob(TEMP_RECORD_GLOB)]
    final = run(argv, d, env=env)
    assert final.returncode == 0, f"the final run: {final}"
    assert _out(d) == expected_output()
    assert not left, f"{TEMP_RECORD_GLOB} dirs left in TMPDIR: {left}"
