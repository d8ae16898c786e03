"""End to end: recovery of a flow run as a cluster of processes
(docs/cluster.md, "Recovery across processes").

* SIGKILL one process of a 3-process cluster at a random moment (seeded),
  or SIGSTOP it (silent, not dead): the others stop within the peer
  timeout, naming the lost process, with
  a non-zero status; running the whole cluster again gives exactly the
  output of an uninterrupted run (file to file: nothing twice, nothing
  missing). An error in user code in one process stops the others the
  same way, naming it and the cause.
* Rescaling across processes, 1 x 1 -> 2 x 2 -> 3 x 1 -> 1 x 2, with a
  SIGKILL (of one process or of all) between runs, on a directory backup
  and on S3: every run resumes where the last one committed, and the
  final output equals an uninterrupted single-worker run's.

The flow is ``wordcount`` of helpers/clusterflows.py: ``DirSource`` over
several files -> running count per word (``stateful_map``) -> ``DirSink``;
every output line ``word n`` must appear exactly once.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Callable, List, Sequence

import pytest

from helpers.clusterflows import (
    LOST_RE,
    Cluster,
    Proc,
    assert_all_ok,
    cluster_env,
    committed_epochs_dir,
    diff_outputs,
    expected_wordcount,
    group_members,
    make_run_dir,
    newest_commit,
    read_outputs,
    run_argv,
    run_cluster,
    start_processes,
    tails,
    wait_until,
)
from helpers.mpflow import Result
from helpers.s3server import S3Server
from millpond.keygroup import worker_for_key

FLOW_ID = "wc"
#: Seconds of sleep per input line: a run lasts long enough to be killed
#: in the middle of it.
DELAY = 0.003
EPOCH = "0.1"
PEER_TIMEOUT = 2.0
#: How much later than the peer timeout a survivor may stop (a loaded
#: 2-core machine, the interpreter's exit).
SLACK = 4.0
ENV = {"MILLPOND_PEER_TIMEOUT": str(PEER_TIMEOUT), "MILLPOND_START_TIMEOUT": "30"}
IMPORT = f"cflows:wordcount(delay={DELAY})"

#: The resume line every process logs: ``resume flow 'wc': fast resume,
#: execution 1, resume epoch 6, ...``.
RESUME_RE = re.compile(r"resume flow 'wc': [a-z]+ resume, execution (\d+), resume epoch (\d+)")


def _started(p: Proc) -> bool:
    return "starts at epoch" in p.stderr


def _newest_dir(backup: Path) -> Callable[[], int]:
    return lambda: max(committed_epochs_dir(backup, FLOW_ID) or [0])


def _check_resumed(results: Sequence[Result], epoch: int) -> None:
    """Every process of a run resumed at ``epoch``, in one execution."""
    found = [RESUME_RE.findall(r.stderr) for r in results]
    assert all(len(f) == 1 for f in found), f"expected one resume line per process: {found}\n{tails(results)}"
    executions = {f[0][0] for f in found}
    epochs = {int(f[0][1]) for f in found}
    assert len(executions) == 1, f"the processes disagree on the execution: {found}"
    assert epochs == {epoch}, f"resumed at {epochs}, the last committed epoch was {epoch - 1}: {found}"


def _check_survivors(procs: Sequence[Proc], victims: Sequence[int], killed_at: float,
                     bound: float = PEER_TIMEOUT + SLACK) -> None:
    for i, p in enumerate(procs):
        res = p.result()
        if i in victims:
            assert res.returncode == -9, f"process {i} was SIGKILLed but exited {res.returncode}"
            continue
        assert res.returncode != 0, f"process {i} survived the loss of {victims} with status 0:\n{res}"
        took = (p.ended or killed_at) - killed_at
        assert took <= bound, f"process {i} stopped {took:.1f} s after the kill (bound {bound:.1f} s)"
        assert LOST_RE.search(res.stderr), f"process {i} does not name the lost process:\n{res.stderr[-2000:]}"
        assert "Traceback" not in res.stderr, res.stderr[-3000:]


# ---------------------------------------------------------------------------
# 2. SIGKILL of one process at a random moment; the whole cluster reruns


def _kill_trial(tmp_path: Path, seed: int, sig: int = signal.SIGKILL) -> None:
    """Start a 3 x 1 cluster with recovery, send ``sig`` to one process at
    a random moment, check the others stop in time naming it, then run
    the whole cluster again and compare with the uninterrupted output.
    (A SIGSTOPped process is SIGKILLed once the others stopped.)"""
    rng = random.Random(seed)
    victim = seed % 3  # the leader (0) and both followers, over the trials
    shared = seed % 2 == 1  # one local state dir for all, or one per process
    d = make_run_dir(tmp_path / "run", files=3, lines=400, worker_counts=(3,), seed=seed + 1)
    backup = d / "backup"

    def args(i: int) -> List[str]:
        return ["-s", EPOCH, "-d", "state" if shared else f"state/p{i}", "-b", "backup"]

    with Cluster(tmp_path / "logs") as cluster:
        procs = start_processes(cluster, d, IMPORT, 3, 1, args, ENV)
        wait_until(lambda: all(_started(p) for p in procs), 30, procs, "the start of every process")
        time.sleep(rng.uniform(0.0, 1.0))
        assert all(p.poll() is None for p in procs), (
            "a process ended before the kill: make the input longer\n" + cluster.describe()
        )
        cluster.kill(procs[victim], sig)
        killed_at = time.monotonic()
        cluster.wait([p for i, p in enumerate(procs) if i != victim], PEER_TIMEOUT + SLACK + 30)
        if sig != signal.SIGKILL:
            cluster.kill(procs[victim])  # SIGKILL works on a stopped process
            cluster.wait(procs, 30)
        _check_survivors(procs, [victim], killed_at)
    committed = _newest_dir(backup)()

    results = run_cluster(d, tmp_path / "logs-rerun", IMPORT, 3, 1, "ia", args, ENV, timeout=90)
    assert_all_ok(results)
    _check_resumed(results, committed + 1)
    problem = diff_outputs(read_outputs(d), expected_wordcount(d))
    assert not problem, (
        f"seed {seed}: signal {sig} to process {victim}, committed epoch {committed}; the rerun's output is "
        f"not exactly-once:\n{problem}"
    )


def _compacted_in_newest_record(backup: Path) -> bool:
    epochs = committed_epochs_dir(backup, FLOW_ID)
    if not epochs:
        return False
    try:
        rec = json.loads((backup / FLOW_ID / "commits" / f"{epochs[-1]:010d}.json").read_text())
    except (OSError, ValueError):  # replaced meanwhile
        return False
    return any(o["kind"] == "compacted" and o["first_epoch"] == o["last_epoch"] > 1 for o in rec["objects"])


def test_whole_state_epochs_across_processes_then_sigkill(tmp_path: Path) -> None:
    """A word count over twelve words touches most of them every epoch:
    each worker snapshots its whole state, and process 0 commits epochs
    whole on every worker of both processes as compacted state (a segment
    of one epoch named compacted in the record: no compaction pass wrote
    it). SIGKILL a follower mid-run; the rerun is exactly-once."""
    d = make_run_dir(tmp_path / "run", files=4, lines=500, vocab=12, worker_counts=(4,))
    backup = d / "backup"

    def args(i: int) -> List[str]:
        return ["-s", EPOCH, "-d", f"state/p{i}", "-b", "backup"]

    with Cluster(tmp_path / "logs") as cluster:
        procs = start_processes(cluster, d, IMPORT, 2, 2, args, ENV)
        wait_until(lambda: _compacted_in_newest_record(backup), 60, procs, "a whole-state epoch's commit")
        assert all(p.poll() is None for p in procs), "a process ended before the kill\n" + cluster.describe()
        cluster.kill(procs[1])
        cluster.wait([procs[0]], PEER_TIMEOUT + SLACK + 30)
    committed = _newest_dir(backup)()
    results = run_cluster(d, tmp_path / "logs-rerun", IMPORT, 2, 2, "ia", args, ENV, timeout=90)
    assert_all_ok(results)
    _check_resumed(results, committed + 1)
    problem = diff_outputs(read_outputs(d), expected_wordcount(d))
    assert not problem, f"committed epoch {committed}; the rerun's output is not exactly-once:\n{problem}"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_one_process_then_rerun_is_exactly_once(tmp_path: Path, seed: int) -> None:
    _kill_trial(tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 12))
def test_sigkill_one_process_then_rerun_is_exactly_once_more_seeds(tmp_path: Path, seed: int) -> None:
    _kill_trial(tmp_path, seed)


def test_sigkill_one_process_of_a_p_cluster(tmp_path: Path) -> None:
    """``-p 3`` with one shared ``-d``: SIGKILL one of the launcher's
    processes; the launcher exits with that process's status (128 + 9)
    and no process is left running; ``-p 3`` again gives exactly-once
    output."""
    d = make_run_dir(tmp_path / "run", files=3, lines=400, worker_counts=(3,))
    args = ["-p", "3", "-s", EPOCH, "-d", "state", "-b", "backup"]
    with Cluster(tmp_path / "logs") as cluster:
        launcher = cluster.spawn("launcher", run_argv(IMPORT, args), d, cluster_env(ENV))
        wait_until(lambda: launcher.stderr.count("starts at epoch") == 3, 30, [launcher], "the start")
        time.sleep(random.Random(5).uniform(0.0, 0.8))
        children = [pid for pid in group_members(launcher.pid) if pid != launcher.pid]
        assert len(children) == 3, f"the launcher's processes: {children}\n{launcher.stderr[-2000:]}"
        os.kill(children[1], signal.SIGKILL)
        killed_at = time.monotonic()
        [res] = cluster.wait([launcher], PEER_TIMEOUT + SLACK + 30)
        took = (launcher.ended or killed_at) - killed_at
        left = [pid for pid in group_members(launcher.pid) if pid != launcher.pid]
    assert res.returncode == 128 + signal.SIGKILL, f"the launcher exited {res.returncode}:\n{res.stderr[-2000:]}"
    assert took <= PEER_TIMEOUT + SLACK, f"the cluster stopped {took:.1f} s after the kill"
    assert left == [], f"processes {left} still ran after the launcher exited"
    assert LOST_RE.search(res.stderr), res.stderr[-2000:]
    committed = _newest_dir(d / "backup")()
    results = run_cluster(d, tmp_path / "logs-rerun", IMPORT, 3, 1, "p", lambda i: args[2:], ENV, timeout=90)
    assert_all_ok(results)
    assert len(RESUME_RE.findall(results[0].stderr)) == 3
    assert {int(e) for _x, e in RESUME_RE.findall(results[0].stderr)} == {committed + 1}
    problem = diff_outputs(read_outputs(d), expected_wordcount(d))
    assert not problem, problem


@pytest.mark.parametrize("seed", [
    pytest.param(0, id="leader"),
    pytest.param(4, id="follower", marks=pytest.mark.slow),
])
def test_silent_process_is_lost_after_the_peer_timeout(tmp_path: Path, seed: int) -> None:
    """SIGSTOP: the process neither dies nor closes its connections; the
    others notice its silence within the peer timeout."""
    _kill_trial(tmp_path, seed, signal.SIGSTOP)


def test_error_in_user_code_stops_every_process(tmp_path: Path) -> None:
    """User code raises in one process (the one reading the file with the
    bad line): it fails as a one-process run would, and every other
    process stops within the peer timeout with a line naming it and the
    cause."""
    d = make_run_dir(tmp_path / "run", files=3, lines=100, worker_counts=(3,))
    names = sorted((d / "in").iterdir())
    needle = names[1].read_text().splitlines()[50]
    owner = [worker_for_key(f"local::{p.name}", 3) for p in names][1]
    with Cluster(tmp_path / "logs") as cluster:
        procs = start_processes(cluster, d, f"cflows:failing({needle!r})", 3, 1, lambda i: ["-s", EPOCH], ENV)
        results = cluster.wait(procs, 60)
    failed = procs[owner]
    assert results[owner].returncode == 1, tails(results)
    assert "the dataflow failed" in results[owner].stderr and f"ValueError: boom on {needle}" in results[owner].stderr
    for i, (p, res) in enumerate(zip(procs, results)):
        if i == owner:
            continue
        assert res.returncode == 1, tails(results)
        took = (p.ended or 0) - (failed.ended or 0)
        assert took <= PEER_TIMEOUT + SLACK, f"process {i} stopped {took:.1f} s after process {owner} failed"
        lost = [line for line in res.stderr.splitlines() if "error:" in line and LOST_RE.search(line)]
        assert lost, f"process {i} does not name a lost process:\n{res.stderr[-2000:]}"
        assert f"ValueError: boom on {needle}" in lost[-1], f"process {i} does not give the cause: {lost[-1]}"


@pytest.mark.slow
def test_processes_must_share_one_backup(tmp_path: Path) -> None:
    """After a kill, process 1 comes back on a fresh local state dir (a
    new pod's empty disk) but names another, empty backup: the start is
    refused on both processes, naming the backup, and nothing is changed.
    With the right backup, process 1 does a full resume and the output is
    exactly-once."""
    d = make_run_dir(tmp_path / "run", files=2, lines=300, worker_counts=(2,))
    newest = _newest_dir(d / "backup")
    with Cluster(tmp_path / "logs") as cluster:
        procs = start_processes(cluster, d, IMPORT, 2, 1,
                                lambda i: ["-s", EPOCH, "-d", f"state/p{i}", "-b", "backup"], ENV)
        wait_until(lambda: newest() >= 2, 60, procs, "two commits")
        assert all(p.poll() is None for p in procs), cluster.describe()
        cluster.kill(procs[0])
        cluster.wait(procs, PEER_TIMEOUT + SLACK + 30)
    committed = newest()
    before = read_outputs(d)

    def fresh(backup_of_1: str) -> Callable[[int], List[str]]:
        return lambda i: ["-s", EPOCH, "-d", "state/p0" if i == 0 else "state/fresh",
                          "-b", "backup" if i == 0 else backup_of_1]

    results = run_cluster(d, tmp_path / "logs-wrong", IMPORT, 2, 1, "ia", fresh("other-backup"), ENV, timeout=60)
    for i, res in enumerate(results):
        assert res.returncode == 1, tails(results)
        assert "every process must use the same backup" in res.stderr, f"process {i}:\n{res.stderr[-2000:]}"
    assert newest() == committed and read_outputs(d) == before, "a refused start changed the backup or the output"

    results = run_cluster(d, tmp_path / "logs-right", IMPORT, 2, 1, "ia", fresh("backup"), ENV, timeout=60)
    assert_all_ok(results)
    _check_resumed(results, committed + 1)
    assert "full resume" in results[1].stderr, results[1].stderr[-2000:]
    problem = diff_outputs(read_outputs(d), expected_wordcount(d))
    assert not problem, problem


# ---------------------------------------------------------------------------
# 3. Rescaling across processes, with kills between the runs

#: (processes, workers per process, what is killed once the run committed
#: two more epochs: "all", "one", or None to run to the end).
STAGES = [(1, 1, "all"), (2, 2, "one"), (3, 1, "one"), (1, 2, None)]


def _rescale(tmp_path: Path, backup: str, newest: Callable[[], int], shared: bool, seed: int) -> None:
    rng = random.Random(seed)
    # Long enough that each killed stage is still running at its kill on a
    # loaded 2-core machine (200 lines once ran out in the 3 x 1 stage).
    d = make_run_dir(tmp_path / "run", files=4, lines=320, worker_counts=(2, 3, 4), seed=seed)

    def args(i: int) -> List[str]:
        return ["-s", EPOCH, "-d", "state" if shared else f"state/p{i}", "-b", backup]

    history = []
    for k, (n, w, kill) in enumerate(STAGES):
        before = newest()
        with Cluster(tmp_path / f"logs-{k}-{n}x{w}") as cluster:
            procs = start_processes(cluster, d, IMPORT, n, w, args, ENV)
            if kill is None:
                results = cluster.wait(procs, 90)
                assert_all_ok(results)
            else:
                wait_until(lambda: newest() >= before + 2, 60, procs, f"two commits of the {n} x {w} run")
                time.sleep(rng.uniform(0.0, 0.2))
                assert all(p.poll() is None for p in procs), (
                    f"the {n} x {w} run ended before its kill: make the input longer\n" + cluster.describe()
                )
                victims = list(range(n)) if kill == "all" else [rng.randrange(n)]
                for v in victims:
                    cluster.kill(procs[v])
                killed_at = time.monotonic()
                results = cluster.wait(procs, PEER_TIMEOUT + SLACK + 30)
                if kill == "one":
                    _check_survivors(procs, victims, killed_at)
                else:
                    assert all(r.returncode == -9 for r in results), tails(results)
            history.append((n, w, kill, before, newest()))
            if before > 0:
                _check_resumed([p.result() for p in procs], before + 1)
    problem = diff_outputs(read_outputs(d), expected_wordcount(d))
    assert not problem, f"after the rescales {history} (n, w, kill, committed before, after):\n{problem}"


def test_rescale_across_processes_dir_backup(tmp_path: Path) -> None:
    """A directory backup; a local state dir per process (they change
    hands: process 1 of 2 x 2 hosted workers 2-3, of 3 x 1 worker 1)."""
    backup = tmp_path / "run" / "backup"
    _rescale(tmp_path, "backup", _newest_dir(backup), shared=False, seed=11)


def test_rescale_across_processes_s3(tmp_path: Path, s3_server: S3Server) -> None:
    """The S3 test server as the backup; one local state dir shared by
    every process (each worker has its own store in it)."""
    prefix = f"cluster-rescale-{tmp_path.name}"

    def newest() -> int:
        return newest_commit(lambda: list(s3_server.objects(prefix + "/")))

    _rescale(tmp_path, s3_server.uri(prefix), newest, shared=True, seed=12)
    assert newest() > 0


def test_uninterrupted_recovery_run_matches(tmp_path: Path) -> None:
    """The reference the kill trials compare with: an uninterrupted 3 x 1
    run with recovery writes exactly the expected lines, and commits."""
    d = make_run_dir(tmp_path / "run", files=3, lines=100, worker_counts=(3,))
    results = run_cluster(d, tmp_path / "logs", IMPORT, 3, 1, "ia",
                          lambda i: ["-s", EPOCH, "-d", f"state/p{i}", "-b", "backup"], ENV, timeout=90)
    assert_all_ok(results)
    _check_resumed(results, 1)
    assert _newest_dir(d / "backup")() > 0
    problem = diff_outputs(read_outputs(d), expected_wordcount(d))
    assert not problem, problem
