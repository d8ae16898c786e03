"""End to end: a flow run as a cluster of processes (``python -m
millpond.run -i I -a ADDRS``, or ``-p N``; docs/cluster.md).

* The same flows give the same output on 1 process x 4 workers, 2 x 2 and
  4 x 1, started with ``-p`` or with explicit ``-i``/``-a``, as on 1 x 1.
* All-to-all exchange of batches far larger than
  ``MILLPOND_MAX_IN_FLIGHT_BYTES`` completes (back-pressure never
  deadlocks).
* A process with the wrong cluster secret is refused and processes
  nothing; an address that is not loopback needs a secret.
* Bad settings are refused with one clear line and a non-zero status.
* The run log has a line per peer with batches and bytes out and in.

Every process is a child ``python -m millpond.run`` (helpers/clusterflows.py);
recovery across processes (SIGKILL, rescaling) is in
test_cluster_recovery.py.
"""

from __future__ import annotations

import http.server
import re
import socket
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

import pytest

from helpers.clusterflows import (
    PEER_LINE_RE,
    Cluster,
    addresses,
    assert_all_ok,
    cluster_env,
    diff_outputs,
    expected_big,
    expected_many,
    expected_wordcount,
    make_big_dir,
    make_run_dir,
    read_outputs,
    run_argv,
    run_cluster,
    seen_lines,
    start_process,
    start_processes,
    tails,
)
from helpers.mpflow import Result

#: Start and peer timeouts for runs that should work: short enough that a
#: broken start fails the test in seconds rather than a minute.
OK_ENV = {"MILLPOND_START_TIMEOUT": "30", "MILLPOND_PEER_TIMEOUT": "5"}
#: For starts that must fail: how long the processes wait for each other.
START_TIMEOUT = 2.0
FAIL_ENV = {"MILLPOND_START_TIMEOUT": str(START_TIMEOUT), "MILLPOND_PEER_TIMEOUT": "3"}

MANY = 'cflows:many(delay=0.002)'
EPOCH = ["-s", "0.05"]

#: The one line a refused start writes (``python -m millpond.run: error: ...``).
ERROR_LINE = re.compile(r"^python -m millpond\.run: error: (.*)$", re.M)


def error_lines(res: Result) -> List[str]:
    return ERROR_LINE.findall(res.stderr)


# ---------------------------------------------------------------------------
# 1. Same output for any number of processes and workers


@pytest.fixture(scope="module")
def many_reference(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, List[str]]:
    """The output of ``many`` on one process with one worker (checked
    against the same computation in plain Python)."""
    d = make_run_dir(tmp_path_factory.mktemp("ref-1x1"), worker_counts=(2, 4))
    res = run_cluster(d, d / "logs", MANY, 1, 1, "single", lambda i: EPOCH, OK_ENV)
    assert_all_ok(res)
    out = read_outputs(d)
    problem = diff_outputs(out, expected_many(d))
    assert not problem, f"the 1 x 1 reference run is wrong:\n{problem}"
    return out


LAYOUTS = [
    pytest.param(1, 4, "single", False, id="1x4"),
    pytest.param(2, 2, "p", False, id="2x2-p"),
    pytest.param(2, 2, "ia", False, id="2x2-ia"),
    pytest.param(4, 1, "p", False, id="4x1-p", marks=pytest.mark.slow),
    pytest.param(4, 1, "ia", False, id="4x1-ia"),
    pytest.param(2, 2, "ia", True, id="2x2-ia-recovery"),
    pytest.param(3, 1, "p", True, id="3x1-p-recovery", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("processes, workers, mode, recovery", LAYOUTS)
def test_same_output_as_one_worker(tmp_path: Path, many_reference: Dict[str, List[str]], processes: int,
                                   workers: int, mode: str, recovery: bool) -> None:
    """Word count with exchange (running ``stateful_map`` and
    ``count_final``), a join whose one side is emitted at end of input, a
    product join of two keyed inputs, ``redistribute``, ``DirSource`` over
    several files, ``FileSource``, ``DirSink`` and ``FileSink``: each
    output file holds the same lines as on one worker."""
    d = make_run_dir(tmp_path, worker_counts=(2, 4))

    def args(i: int) -> List[str]:
        # A shared local state dir with -p (one command line), one per
        # process otherwise; the backup is shared.
        if not recovery:
            return EPOCH
        return [*EPOCH, "-d", "state" if mode == "p" else f"state/p{i}", "-b", "backup"]

    results = run_cluster(d, tmp_path / "logs", MANY, processes, workers, mode, args, OK_ENV)
    assert_all_ok(results)
    problem = diff_outputs(read_outputs(d), many_reference)
    assert not problem, f"{processes} x {workers} ({mode}) differs from 1 x 1:\n{problem}\n{tails(results)}"
    if mode == "ia":
        # Every process says which workers it hosts: i*w .. i*w+w-1 of n*w.
        for i, res in enumerate(results):
            where = f"(workers {i * workers}-{i * workers + workers - 1} of {processes * workers})"
            assert where in res.stderr, f"process {i} does not log {where}:\n{res.stderr[-2000:]}"


# ---------------------------------------------------------------------------
# 4. All-to-all exchange of large batches under a small in-flight limit


@pytest.mark.parametrize("workers, lines, fan", [
    pytest.param(1, 150, 4, id="3x1"),
    pytest.param(2, 150, 4, id="3x2", marks=pytest.mark.slow),
])
def test_all_to_all_large_batches_do_not_deadlock(tmp_path: Path, workers: int, lines: int, fan: int) -> None:
    """Every process sends batches of 64 KiB items (several per batch) to
    every other, twice (``redistribute``, then a keyed step), with
    ``MILLPOND_MAX_IN_FLIGHT_BYTES=65536``: the run ends in time, with
    every item once, and the queues were really over the limit."""
    size = 65536
    d = make_big_dir(tmp_path, files=3 * workers, lines=lines)
    env = {**OK_ENV, "MILLPOND_MAX_IN_FLIGHT_BYTES": "65536"}
    results = run_cluster(d, tmp_path / "logs", f"cflows:big(size={size}, fan={fan})", 3, workers, "ia",
                          lambda i: ["-s", "0.2"], env, timeout=90)
    assert_all_ok(results)
    problem = diff_outputs(read_outputs(d), expected_big(d, size, fan))
    assert not problem, f"wrong output after the all-to-all exchange:\n{problem}"
    # All to all: every process sent megabytes to every other.
    for i, res in enumerate(results):
        outs = {int(m.group(2)): int(m.group(5)) for m in PEER_LINE_RE.finditer(res.stderr)}
        assert set(outs) == {0, 1, 2} - {i}, f"process {i}'s per-peer lines: {outs}\n{res.stderr[-2000:]}"
        assert all(b > 16 * size for b in outs.values()), f"process {i} sent too little: {outs}"


# ---------------------------------------------------------------------------
# 5. Security


def test_wrong_secret_is_refused_and_gets_no_data(tmp_path: Path) -> None:
    """Two processes with the right secret and one with another: nobody
    starts, every process exits non-zero naming the cluster secret, and
    the intruder's steps saw nothing (nor did anyone's: nothing ran)."""
    d = make_run_dir(tmp_path, files=3, lines=20, worker_counts=(3,))
    right = {**FAIL_ENV, "MILLPOND_CLUSTER_SECRET": "the-right-secret-0123456789"}
    wrong = {**FAIL_ENV, "MILLPOND_CLUSTER_SECRET": "an-intruders-guess-987654321"}
    addrs = addresses(3)
    with Cluster(tmp_path / "logs") as cluster:
        procs = [start_process(cluster, d, "cflows:watch()", i, addrs, 1, ["-s", "0.05"], wrong if i == 2 else right)
                 for i in range(3)]
        results = cluster.wait(procs, START_TIMEOUT + 30)
    for i, res in enumerate(results):
        assert res.returncode not in (0, None), f"process {i} exited 0:\n{res}"
        lines = error_lines(res)
        assert len(lines) == 1, f"process {i}: expected one error line:\n{res}"
    intruder = error_lines(results[2])[0]
    assert "MILLPOND_CLUSTER_SECRET" in intruder, f"the intruder's error does not name the secret: {intruder}"
    # The honest processes name the secret when the intruder's attempt
    # reached them before their start timeout; otherwise (the intruder
    # dialed the other one first and quit) at least the intruder, as a
    # process that did not join. The other honest process may be named
    # with it ("processes 0 (...), 2 (...) did not join"): it may have
    # quit over the secret before the two of them met.
    # Or, on a loaded machine, the other honest process quit over the
    # secret while the two of them were still shaking hands: this one then
    # names it as lost during the handshake, and that one names the secret.
    missing = re.compile(rf"process(?:es)? (?:\d+ \([^)]*\), )*2 \({re.escape(addrs[2])}\)(?:, \d+ \([^)]*\))* did not join")
    honest = [error_lines(res)[0] for res in results[:2]]
    for i, line in enumerate(honest):
        other = 1 - i
        lost = re.search(rf"process {other} \({re.escape(addrs[other])}\) lost: .*handshake", line)
        assert ("MILLPOND_CLUSTER_SECRET" in line or missing.search(line)
                or (lost and "MILLPOND_CLUSTER_SECRET" in honest[other])), (
            f"process {i} names neither the secret, nor the intruder, nor process {other} lost over it: {line}"
            f"\n(process {other}: {honest[other]})"
        )
    assert seen_lines(d) == [], f"steps processed items: {seen_lines(d)[:5]}"
    assert not (d / "out.txt").exists() or (d / "out.txt").read_text() == ""
    assert all(r.stdout == "" for r in results)


def test_impostor_is_refused_and_the_cluster_still_starts(tmp_path: Path) -> None:
    """Process 0 waits for process 1; an impostor with a wrong secret comes
    first, claiming to be process 1: it is refused, exits non-zero naming
    the secret and processes nothing. (Process 0 keeps waiting when the
    impostor dialed it, and stops naming the secret when it dialed the
    impostor; then it is started again.) The real process 1, started
    afterwards on the same address, joins, and the flow gives the right
    output, processed by the real processes only."""
    d = make_run_dir(tmp_path, files=2, lines=20, worker_counts=(2,))
    right = {**OK_ENV, "MILLPOND_CLUSTER_SECRET": "the-right-secret-0123456789"}
    wrong = {**FAIL_ENV, "MILLPOND_CLUSTER_SECRET": "an-intruders-guess-987654321"}
    addrs = ";".join(addresses(2))

    def argv(i: int) -> List[str]:
        return ["-s", "0.05", "-i", str(i), "-a", addrs]

    with Cluster(tmp_path / "logs") as cluster:
        p0 = cluster.spawn("p0", run_argv("cflows:watch()", argv(0)), d, cluster_env(right))
        impostor = cluster.spawn("impostor", run_argv('cflows:watch("in", "intruder.txt")', argv(1)), d,
                                 cluster_env(wrong))
        [res_imp] = cluster.wait([impostor], START_TIMEOUT + 30)
        # When process 0 dialed the impostor, both see the failed
        # handshake at about the same time: give process 0 the moment it
        # takes to exit before deciding that it keeps waiting.
        deadline = time.monotonic() + 5
        while p0.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if p0.poll() is not None:
            # Process 0 dialed the impostor (rather than the other way
            # round) and found that the process at process 1's address
            # does not know the secret: it may stop, naming the secret.
            res0 = p0.result()
            lines = error_lines(res0)
            assert res0.returncode != 0 and len(lines) == 1 and "MILLPOND_CLUSTER_SECRET" in lines[0], (
                f"process 0 stopped without naming the secret:\n{res0}"
            )
            p0 = cluster.spawn("p0-again", run_argv("cflows:watch()", argv(0)), d, cluster_env(right))
        p1 = cluster.spawn("p1", run_argv("cflows:watch()", argv(1)), d, cluster_env(right))
        results = cluster.wait([p0, p1], 60)
    assert res_imp.returncode != 0, f"the impostor exited 0:\n{res_imp}"
    lines = error_lines(res_imp)
    assert len(lines) == 1 and "MILLPOND_CLUSTER_SECRET" in lines[0], f"the impostor's error:\n{res_imp}"
    assert_all_ok(results)
    assert not (d / "intruder.txt").exists() or (d / "intruder.txt").read_text() == ""
    seen_by = {name for name, _line in seen_lines(d)}
    assert f"seen-{impostor.pid}.txt" not in seen_by, "the impostor's steps processed items"
    assert seen_by <= {f"seen-{p0.pid}.txt", f"seen-{p1.pid}.txt"}, seen_by
    got = sorted((d / "out.txt").read_text().splitlines())
    want = sorted(line for lines in expected_wordcount(d, 1, "x").values() for line in lines)
    assert got == want, diff_outputs({"out.txt": got}, {"out.txt": want})


def test_non_loopback_address_needs_a_secret(tmp_path: Path) -> None:
    """``-a`` naming an address that is not loopback, without a secret:
    refused before anything runs, naming the address and the variable."""
    d = make_run_dir(tmp_path, files=1, lines=5)
    [local] = addresses(1)
    remote = "10.255.255.1:2101"
    results = run_cluster(d, tmp_path / "logs", 'cflows:wordcount()', 1, 1, "single",
                          lambda i: ["-i", "0", "-a", f"{local};{remote}"], FAIL_ENV, timeout=30)
    [res] = results
    assert res.returncode != 0, f"exited 0:\n{res}"
    lines = error_lines(res)
    assert len(lines) == 1, f"expected one error line:\n{res}"
    assert remote in lines[0] and "MILLPOND_CLUSTER_SECRET" in lines[0], lines[0]
    assert res.seconds < START_TIMEOUT + 10
    assert not (d / "out").exists()


# ---------------------------------------------------------------------------
# 6. Bad settings: one clear line each, non-zero status


def _refused(res: Result, *fragments: str) -> str:
    assert res.returncode not in (0, None), f"exited 0:\n{res}"
    lines = error_lines(res)
    assert len(lines) == 1, f"expected exactly one error line:\n{res}"
    for frag in fragments:
        assert frag in lines[0], f"the error line does not name {frag!r}: {lines[0]}"
    assert "Traceback" not in res.stderr, res.stderr
    return lines[0]


def _one(tmp_path: Path, argv: Sequence[str], env: Dict[str, str] = FAIL_ENV, timeout: float = 30) -> Result:
    d = make_run_dir(tmp_path / "run", files=1, lines=5)
    [res] = run_cluster(d, tmp_path / "logs", 'cflows:wordcount()', 1, 1, "single", lambda i: list(argv), env,
                        timeout=timeout)
    assert not (d / "out").exists() or not any(p.read_text() for p in (d / "out").iterdir())
    return res


def test_process_id_out_of_range(tmp_path: Path) -> None:
    a = addresses(2)
    res = _one(tmp_path, ["-i", "2", "-a", ";".join(a)])
    _refused(res, "-i/--process-id 2", "out of range")
    assert res.returncode == 2


@pytest.mark.parametrize("how", ["flag", "env"])
def test_process_id_auto_from_the_host_name(tmp_path: Path, how: str) -> None:
    """``-i auto`` (or MILLPOND_PROCESS_ID=auto) reads the StatefulSet
    ordinal at the end of HOSTNAME: pod ``mp-5`` is process 5 (out of range
    for two addresses, which shows the 5 was read); a host name without
    one is refused, naming it."""
    a = ";".join(addresses(2))
    argv = ["-i", "auto", "-a", a] if how == "flag" else ["-a", a]
    extra = {} if how == "flag" else {"MILLPOND_PROCESS_ID": "auto"}
    res = _one(tmp_path / "five", argv, {**FAIL_ENV, **extra, "HOSTNAME": "mp-5"})
    _refused(res, "-i/--process-id 5", "out of range")
    res = _one(tmp_path / "none", argv, {**FAIL_ENV, **extra, "HOSTNAME": "worker"})
    _refused(res, "'worker'", "trailing ordinal")
    assert res.returncode == 2


def test_duplicate_addresses(tmp_path: Path) -> None:
    [a] = addresses(1)
    res = _one(tmp_path, ["-i", "0", "-a", f"{a};{a}"])
    _refused(res, a, "twice")
    assert res.returncode == 2


def test_processes_flag_with_addresses(tmp_path: Path) -> None:
    a = addresses(2)
    res = _one(tmp_path, ["-p", "2", "-i", "0", "-a", ";".join(a)])
    _refused(res, "-p/--processes")
    assert res.returncode == 2


def test_address_already_in_use(tmp_path: Path) -> None:
    a = addresses(2)
    port = int(a[0].rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        res = _one(tmp_path, ["-i", "0", "-a", ";".join(a)])
    line = _refused(res, a[0])
    assert "in use" in line, line
    assert res.seconds < START_TIMEOUT + 10, f"took {res.seconds:.1f} s to notice"


@pytest.fixture()
def junk_server() -> Iterator[str]:
    """A raw TCP server on 127.0.0.1 that writes junk to whoever connects."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.sendall(b"\x00\xffjunk junk junk\r\n" * 64)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        srv.close()


@pytest.fixture()
def http_server() -> Iterator[str]:
    """A tiny HTTP server on 127.0.0.1."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello")

        def do_POST(self) -> None:  # noqa: N802
            self.do_GET()

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


@pytest.mark.parametrize("server", ["junk_server", "http_server"])
def test_peer_address_where_something_else_answers(tmp_path: Path, server: str,
                                                   request: pytest.FixtureRequest) -> None:
    """Process 1's address is a server that is not millpond: process 0
    stops within the start timeout naming it."""
    other = request.getfixturevalue(server)
    [mine] = addresses(1)
    res = _one(tmp_path, ["-i", "0", "-a", f"{mine};{other}"])
    _refused(res, other)
    assert res.seconds < START_TIMEOUT + 10, f"took {res.seconds:.1f} s"


def test_processes_that_disagree_on_workers(tmp_path: Path) -> None:
    """``-w 2`` on one process and ``-w 3`` on the other: the start is
    refused naming ``workers_per_process``; neither runs anything."""
    d = make_run_dir(tmp_path, files=2, lines=10)
    addrs = addresses(2)
    with Cluster(tmp_path / "logs") as cluster:
        procs = [start_process(cluster, d, "cflows:watch()", i, addrs, w, ["-s", "0.05"], FAIL_ENV)
                 for i, w in enumerate((2, 3))]
        results = cluster.wait(procs, START_TIMEOUT + 30)
    for i, res in enumerate(results):
        assert res.returncode not in (0, None), f"process {i} exited 0:\n{res}"
        assert len(error_lines(res)) == 1, f"process {i}: expected one error line:\n{res}"
    named = [line for r in results for line in error_lines(r) if "workers_per_process" in line]
    assert named, f"no process names workers_per_process:\n{tails(results)}"
    assert re.search(r"disagrees on workers_per_process: [23] here, [23] there", named[0]), named[0]
    assert seen_lines(d) == []


# ---------------------------------------------------------------------------
# 7. Observability


def test_run_log_has_per_peer_traffic(tmp_path: Path) -> None:
    """Each process logs, per peer, batches and bytes out and in; what one
    process sent a peer is (up to a last control frame) what that peer
    received from it."""
    d = make_run_dir(tmp_path, files=3, lines=30, worker_counts=(3,))
    addrs = addresses(3)
    with Cluster(tmp_path / "logs") as cluster:
        procs = start_processes(cluster, d, MANY, 3, 1, lambda i: EPOCH, OK_ENV, addrs=addrs)
        results = cluster.wait(procs, 60)
    assert_all_ok(results)
    ports = [int(a.rsplit(":", 1)[1]) for a in addrs]
    figures: Dict[Tuple[int, int], Tuple[int, ...]] = {}
    for i, res in enumerate(results):
        lines = [m for m in PEER_LINE_RE.finditer(res.stderr) if int(m.group(1)) == i]
        peers = sorted(int(m.group(2)) for m in lines)
        assert peers == sorted({0, 1, 2} - {i}), (
            f"process {i} should log one line per peer (not itself):\n"
            + "\n".join(line for line in res.stderr.splitlines() if " -> process" in line)
        )
        for m in lines:
            j = int(m.group(2))
            assert int(m.group(3)) == ports[j], f"process {i} names peer {j} at port {m.group(3)}"
            out_b, out_bytes, in_b, in_bytes = (int(m.group(k)) for k in (4, 5, 6, 7))
            assert out_b > 0 and out_bytes > 0 and in_b > 0 and in_bytes > 0, m.group(0)
            figures[(i, j)] = (out_b, out_bytes, in_b, in_bytes)
    # Each process reads its figures when it finishes, not at the same
    # moment as its peers: a last control frame (a few bytes) may cross
    # in between. The data must match.
    for (i, j), (out_b, out_bytes, _in_b, _in_bytes) in figures.items():
        _o, _ob, in_b, in_bytes = figures[(j, i)]
        assert abs(out_b - in_b) <= 4 and abs(out_bytes - in_bytes) <= 512, (
            f"process {i} sent {out_b} batches / {out_bytes} bytes to {j}, which got {in_b} / {in_bytes}"
        )


class _FakeProc:
    """A child whose exit shows at a given poll (counted across every child,
    as the launcher polls them in turn)."""

    def __init__(self, clock: List[int], exits_at: int, code: int) -> None:
        self.clock, self.exits_at, self.code = clock, exits_at, code
        self.returncode = None

    def poll(self):
        self.clock[0] += 1
        if self.returncode is None and self.clock[0] > self.exits_at:
            self.returncode = self.code
        return self.returncode


@pytest.mark.parametrize("killed", [0, 1, 2])
def test_launcher_reports_the_killed_process_not_the_ones_that_lost_it(killed: int) -> None:
    """One child is SIGKILLed; the others exit 1 right after. Whichever
    child the launcher happens to look at first, it exits 128 + 9."""
    from millpond.launch import _wait_all

    clock = [0]
    # The killed child dies at poll 2; the others exit 1 right after it,
    # before the launcher has looked at every child once more.
    procs = [_FakeProc(clock, 2 if i == killed else 3, -9 if i == killed else 1) for i in range(3)]
    assert _wait_all(procs, peer_timeout=1.0) == 128 + 9  # type: ignore[arg-type]
