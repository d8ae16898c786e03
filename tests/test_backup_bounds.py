"""Bounded failure at the edges of the backup: an S3 endpoint that hangs,
answers slowly or fails makes a run stop within a bounded time with an
error naming the endpoint (and Ctrl-C or SIGTERM still stop it at once);
recovery files are private to their owner; secrets in a backup URI never
reach the output; a blank ``-b`` is a usage error.

The S3 tests put helpers/faultproxy.py between the run and the test S3
server (``s3_server``), all on 127.0.0.1. The message fragments and the
URI parameter names the tests depend on are the constants below.
"""

from __future__ import annotations

import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest

from helpers.faultproxy import FaultProxy
from helpers.mpflow import (
    child_env,
    commit_records,
    expected_output,
    make_run_dir,
    run,
    run_and_kill,
    run_argv,
)
from helpers.s3server import S3Server

# --- names and message fragments the feature defines --------------------------------

#: URI parameter: how long one S3 request may take.
TIMEOUT_PARAM = "timeout"
#: URI parameter: how many times a request is tried (the core's name for
#: it, documented in docs/recovery.md; the brief called it ``attempts``).
ATTEMPTS_PARAM = "max_attempts"
#: An S3 request that got no answer in time.
NO_ANSWER = "did not answer"
#: What an HTTP 500 answer is reported as (any one of these).
ERROR_500 = ("500", "Internal Server Error", "InternalError")
#: The usage error for a blank ``-b``.
BLANK_BACKUP_FLAG = "-b/--backup"

#: A bound on how long a run may take to give up on a bad endpoint.
GIVE_UP_WITHIN = 30.0
#: A bound on how long a run blocked on a hung request takes to obey a signal.
SIGNAL_WITHIN = 2.0



@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A fault proxy in ``forward`` mode in front of the test S3 server."""
    p = FaultProxy(s3_server.endpoint)
    try:
        yield p
    finally:
        p.close()


def _uri(endpoint: str, timeout: str = "2s", attempts: int = 2) -> str:
    """A backup URI for a fresh prefix, with a bounded request time."""
    params = f"endpoint={endpoint}&region=us-east-1"
    if timeout:
        params += f"&{TIMEOUT_PARAM}={timeout}&{ATTEMPTS_PARAM}={attempts}"
    return f"s3://flows/bounds-{uuid.uuid4().hex[:10]}?{params}"


# --- C. hung, slow and failing endpoints ---------------------------------------------


def test_a_hung_endpoint_fails_the_run_in_bounded_time(proxy: FaultProxy, tmp_path: Path) -> None:
    """An endpoint that accepts connections and never answers must not hang
    the run: it stops within the request timeout times the attempts, and
    says which endpoint did not answer."""
    d = make_run_dir(tmp_path / "run")
    proxy.mode = "hang"
    res = run(run_argv(backup=_uri(proxy.endpoint)), d, timeout=GIVE_UP_WITHIN + 15)
    assert res.returncode not in (0, 2), f"want a run-time failure (status 1): {res}"
    assert res.seconds < GIVE_UP_WITHIN, f"took {res.seconds:.1f} s to give up: {res}"
    assert NO_ANSWER in res.stderr and proxy.endpoint in res.stderr, \
        f"want {NO_ANSWER!r} and the endpoint {proxy.endpoint}: {res}"


def test_an_endpoint_that_hangs_mid_run_fails_it_and_a_rerun_is_exact(proxy: FaultProxy, tmp_path: Path) -> None:
    """A run that started healthy and whose endpoint then hangs stops in
    bounded time; the same command against the healthy endpoint resumes to
    the exact output."""
    d = make_run_dir(tmp_path / "run")
    argv = run_argv(backup=_uri(proxy.endpoint))
    proc = subprocess.Popen(argv, cwd=d, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while proxy.seen("forward", "/commits/") < 3 and proc.poll() is None:
            assert time.monotonic() < deadline, "no commit record reached the endpoint within 30 s"
            time.sleep(0.005)
        assert proc.poll() is None, f"the run ended before the endpoint hung: {proc.stderr.read() if proc.stderr else ''}"
        proxy.mode = "hang"
        t0 = time.monotonic()
        try:
            _out, err = proc.communicate(timeout=GIVE_UP_WITHIN)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the run did not stop within {GIVE_UP_WITHIN} s of its endpoint hanging")
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, f"the run exited 0 although its backup hung (after {took:.1f} s):\n{err[-2000:]}"
    assert NO_ANSWER in err, f"want {NO_ANSWER!r}:\n{err[-2000:]}"
    proxy.mode = "forward"
    again = run(argv, d)
    assert again.returncode == 0, f"the rerun against the healthy endpoint: {again}"
    assert (d / "out.txt").read_text() == expected_output(), "the rerun's output differs from an uninterrupted run's"


def test_an_endpoint_answering_500_fails_the_run_in_bounded_time(proxy: FaultProxy, tmp_path: Path) -> None:
    """Every request answered with 500: retried a bounded number of times,
    then a clear error naming the endpoint and the status."""
    d = make_run_dir(tmp_path / "run")
    proxy.mode = "error500"
    res = run(run_argv(backup=_uri(proxy.endpoint)), d, timeout=GIVE_UP_WITHIN + 15)
    assert res.returncode not in (0, 2), f"want a run-time failure (status 1): {res}"
    assert res.seconds < GIVE_UP_WITHIN, f"took {res.seconds:.1f} s to give up: {res}"
    assert proxy.endpoint in res.stderr and any(f in res.stderr for f in ERROR_500), \
        f"want the endpoint {proxy.endpoint} and one of {ERROR_500}: {res}"
    assert proxy.seen("error500") <= 20, f"{proxy.seen('error500')} requests: the retries are not bounded"


def test_a_slow_endpoint_is_waited_for(proxy: FaultProxy, tmp_path: Path) -> None:
    """Slow is not dead: answers that come within the timeout are used, and
    the run ends with the exact output."""
    d = make_run_dir(tmp_path / "run", lines=300)
    proxy.mode = "slow"
    proxy.delay = 0.2
    res = run(run_argv(backup=_uri(proxy.endpoint)), d, timeout=60)
    assert res.returncode == 0, f"a slow endpoint failed the run: {res}"
    assert (d / "out.txt").read_text() == expected_output(lines=300)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_run_blocked_on_a_hung_request(proxy: FaultProxy, tmp_path: Path, sig: int) -> None:
    """Ctrl-C (or a service manager's SIGTERM) must not wait for a hung S3
    request to time out. The URI sets no timeout, so only the signal can
    end the run this quickly."""
    d = make_run_dir(tmp_path / "run")
    proxy.mode = "hang"
    argv = run_argv(backup=_uri(proxy.endpoint, timeout=""))
    proc = subprocess.Popen(argv, cwd=d, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        proxy.wait_for("hang", timeout=30)
        time.sleep(1.0)
        assert proc.poll() is None, "the run ended before the signal"
        proc.send_signal(sig)
        t0 = time.monotonic()
        try:
            proc.communicate(timeout=SIGNAL_WITHIN)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the run blocked on a hung request did not exit within {SIGNAL_WITHIN} s of "
                                 f"{signal.Signals(sig).name}")
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, f"exit 0 after {signal.Signals(sig).name} ({took:.2f} s)"


# --- F. permissions and secrets -----------------------------------------------------


def _loose(root: Path) -> List[str]:
    """Everything under ``root`` (and ``root``) that group or others can
    reach: files with any group/other bit, directories not 0700."""
    bad = []
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            if mode != 0o700:
                bad.append(f"dir {p.relative_to(root.parent)} {mode:04o}")
        elif mode & 0o077:
            bad.append(f"file {p.relative_to(root.parent)} {mode:04o}")
    return bad


@pytest.mark.parametrize("umask", ["022", "077"])
def test_recovery_files_are_private_whatever_the_umask(tmp_path: Path, umask: str) -> None:
    """State and backup hold the flow's data: group and others get nothing,
    however permissive the umask, both mid-run and after a completed run."""
    d = make_run_dir(tmp_path / "run")
    shell = ["sh", "-c", f'umask {umask}; exec "$@"', "sh", *run_argv()]
    killed = run_and_kill(shell, d, lambda: len(commit_records(d / "BACKUP")) >= 3)
    assert killed.returncode == -9, f"meant to be killed mid-run: {killed}"
    bad = _loose(d / "LOCAL") + _loose(d / "BACKUP")
    done = run(shell, d)
    assert done.returncode == 0, f"the resumed run: {done}"
    bad += [f"after the rerun: {b}" for b in _loose(d / "LOCAL") + _loose(d / "BACKUP")]
    assert not bad, f"umask {umask}: readable by group/others:\n" + "\n".join(bad)


def test_secrets_in_a_backup_uri_are_never_printed(tmp_path: Path) -> None:
    """A password in the endpoint or a mistyped parameter carrying a secret
    must not end up in logs (stderr goes to journals and CI logs)."""
    d = make_run_dir(tmp_path / "run")
    uri = (f"s3://flows/p?endpoint=http://user:S3CRETPW@127.0.0.1:1&region=us-east-1"
           f"&{TIMEOUT_PARAM}=1s&{ATTEMPTS_PARAM}=1&bogus=S3CRETQ")
    res = run(run_argv(backup=uri), d, timeout=60)
    assert res.returncode != 0, f"the run with a bad URI succeeded: {res}"
    for secret in ("S3CRETPW", "S3CRETQ"):
        assert secret not in res.stdout + res.stderr, f"{secret} was printed: {res}"


def test_a_blank_backup_is_a_usage_error(tmp_path: Path) -> None:
    """``-b ' '`` is a slip (an empty variable in a script), not a
    directory named ' ' to back up into."""
    d = make_run_dir(tmp_path / "run")
    res = run(run_argv(backup=" "), d, timeout=60)
    assert res.returncode == 2, f"want a usage error (status 2): {res}"
    assert BLANK_BACKUP_FLAG in res.stderr, f"the error must name {BLANK_BACKUP_FLAG}: {res}"
    made = [str(p) for p in d.rglob("*") if p.name.strip() == ""]
    assert not made, f"blank-named paths were created: {made}"
