"""Fault injection and corruption through the real Go core: a backup that
fails uploads, damaged segment objects, and the ``python -m millpond.recovery``
inspect/verify tools on what is left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, List

import pytest

import millpond
from millpond.backup import DirBackup
from millpond.errors import BackupError, CorruptObjectError, RecoveryError
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.testing import cluster_main

from test_recovery_e2e import (
    check_against_uninterrupted,
    counting_flow,
    expected,
    make_data,
    run_scenario,
    with_aborts,
)

from helpers.s3server import run_child

PYSRC = str(Path(millpond.__file__).resolve().parent.parent)
ZERO = timedelta(0)


def recovery_cli(*args: str) -> "subprocess.CompletedProcess[str]":
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env["PYTHONPATH"] = PYSRC
    return subprocess.run([sys.executable, "-m", "millpond.recovery", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def inspect_json(target: Path) -> dict:
    res = recovery_cli("inspect", "--json", str(target))
    assert res.returncode == 0, res.stderr
    (report,) = json.loads(res.stdout)
    return report


def commit_epochs(root: Path, flow: str = "counts") -> List[int]:
    return sorted(int(p.stem) for p in (root / flow / "commits").glob("*.json"))


def newest_commit(root: Path, flow: str = "counts") -> dict:
    return json.loads((root / flow / "commits" / f"{max(commit_epochs(root, flow)):010d}.json").read_text())


class FaultyDirBackup:
    """A Python backup over a directory that fails uploads: from the
    ``fail_at``-th upload on (``permanent``) or only that one."""

    def __init__(self, root: Path, fail_at: int, permanent: bool = True) -> None:
        self.inner = DirBackup(root)
        self.fail_at, self.permanent = fail_at, permanent
        self.uploads = 0
        self.failed: List[str] = []
        self.landed: List[str] = []

    def list_keys(self, prefix: str = "") -> List[str]:
        return self.inner.list_keys(prefix)

    def upload(self, from_local: Any, to_key: str) -> None:
        self.uploads += 1
        if self.uploads == self.fail_at or (self.permanent and self.uploads > self.fail_at):
            self.failed.append(to_key)
            raise OSError(f"injected upload failure for {to_key}")
        self.inner.upload(from_local, to_key)
        self.landed.append(to_key)

    def download(self, from_key: str, to_local: Any) -> None:
        self.inner.download(from_key, to_local)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def __repr__(self) -> str:
        return "FaultyDirBackup()"


def _epoch_of(key: str) -> int:
    """The epoch of a segment (``...-e0000000005-s...``) or commit record key."""
    if "/commits/" in key:
        return int(key.rsplit("/", 1)[1].split(".")[0])
    if "/segments/" in key:
        return int(key.rsplit("-e", 1)[1].split("-")[0])
    return 10**9


def _run_once(items: List[Any], cfg: RecoveryConfig, out: List[Any], workers: int = 1) -> None:
    cluster_main(counting_flow(items, out), [], 0, epoch_interval=ZERO, recovery_config=cfg,
                 worker_count_per_proc=workers)


# --- upload failures -----------------------------------------------------------


@pytest.mark.parametrize("mode", [SnapshotMode.BATCH, SnapshotMode.IMMEDIATE], ids=lambda m: m.name)
def test_permanent_upload_failure_stops_the_run_and_nothing_is_committed_past_it(tmp_path, mode):
    root = tmp_path / "backup"
    state = tmp_path / "state"
    state.mkdir()
    data = make_data(60, 7)
    items = with_aborts(data, [])
    out: List[Any] = []
    faulty = FaultyDirBackup(root, fail_at=12)
    with pytest.raises(RecoveryError) as exc:
        _run_once(items, RecoveryConfig(state, backup=faulty, snapshot_mode=mode, max_epochs_in_flight=2), out)
    # uploads run concurrently: the error names one of the objects that failed
    named = [k for k in faulty.failed if k in str(exc.value)]
    assert named, str(exc.value)
    assert "injected upload failure" in str(exc.value)
    # no failed object landed, and the committed epoch stops before the first failed epoch
    landed = set(DirBackup(root).list_keys())
    assert not landed & set(faulty.failed)
    committed = max(commit_epochs(root))
    assert committed < min(_epoch_of(k) for k in faulty.failed)
    for p in (root / "counts" / "commits").glob("*.json"):
        assert {o["key"] for o in json.loads(p.read_text())["objects"]} <= landed
    report = inspect_json(root)
    assert report["committed_epoch"] == committed
    assert report["executions"] == 1
    text = recovery_cli("inspect", str(root))
    assert f"committed epoch  {committed}" in text.stdout
    assert recovery_cli("verify", str(root)).returncode == 0

    # a rerun with a healthy backup resumes and ends where a run that never failed would
    out2: List[Any] = []
    healthy = RecoveryConfig(state, backup=str(root), snapshot_mode=mode)
    _run_once(items, healthy, out2)
    probe: List[Any] = []
    _run_once(items, healthy, probe)
    outs, state_expected = expected(data)
    assert set(out) | set(out2) >= outs
    assert set(out2) <= outs
    assert dict(probe) == state_expected
    assert inspect_json(root)["executions"] == 3


def test_an_upload_that_fails_once_is_retried_and_the_run_completes(tmp_path):
    root = tmp_path / "backup"
    (tmp_path / "state").mkdir()
    faulty = FaultyDirBackup(root, fail_at=5, permanent=False)
    cfg = RecoveryConfig(tmp_path / "state", backup=faulty)
    data = make_data(40, 5)
    result = run_scenario(lambda i: cfg, data, aborts=[], workers=[1, 1])
    check_against_uninterrupted(result, data)
    assert len(faulty.failed) == 1
    assert faulty.failed[0] in faulty.landed  # the retry landed it (GC may have removed it since)
    assert recovery_cli("verify", str(root)).returncode == 0


class ListFailingBackup(FaultyDirBackup):
    def list_keys(self, prefix: str = "") -> List[str]:
        raise ConnectionError("injected list failure")


def test_a_backup_that_cannot_list_fails_before_processing(tmp_path):
    (tmp_path / "state").mkdir()
    out: List[Any] = []
    cfg = RecoveryConfig(tmp_path / "state", backup=ListFailingBackup(tmp_path / "b", fail_at=10**9))
    with pytest.raises(Exception, match="injected list failure") as exc:
        _run_once(with_aborts(make_data(10, 3), []), cfg, out)
    assert "FaultyDirBackup()" in str(exc.value)
    assert out == []


def test_a_backup_that_cannot_list_raises_a_backup_error(tmp_path):
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=ListFailingBackup(tmp_path / "b", fail_at=10**9))
    with pytest.raises(Exception) as exc:
        _run_once(with_aborts(make_data(10, 3), []), cfg, [])
    assert isinstance(exc.value, BackupError), type(exc.value).__name__


_UNREACHABLE = """
import sys
from pathlib import Path
from millpond.errors import BackupError
from millpond.recovery import RecoveryConfig
from millpond.testing import run_main
from test_recovery_e2e import counting_flow
cfg = RecoveryConfig(Path(sys.argv[1]), backup=sys.argv[2])
try:
    run_main(counting_flow([("a", 1)], []), recovery_config=cfg)
except Exception as exc:
    print(type(exc).__name__, isinstance(exc, BackupError))
    print(exc)
"""


def _unreachable_endpoint(tmp_path: Path) -> List[str]:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    res = run_child(_UNREACHABLE, None, tmp_path, str(tmp_path), f"s3://flows/x?endpoint={endpoint}&region=us-east-1&max_attempts=1")
    lines = res.stdout.splitlines()
    assert len(lines) == 2, res.stdout + res.stderr
    return [endpoint, *lines]


def test_unreachable_s3_endpoint_on_first_use_is_a_clear_error(tmp_path):
    endpoint, _kind, message = _unreachable_endpoint(tmp_path)
    assert endpoint in message and "cannot reach" in message, message


def test_unreachable_s3_endpoint_is_a_backup_error(tmp_path):
    _endpoint, kind, _message = _unreachable_endpoint(tmp_path)
    assert kind == "BackupError True", kind


# --- corruption ------------------------------------------------------------------


def _damage(path: Path, how: str, tmp_path: Path) -> None:
    data = bytearray(path.read_bytes())
    if how == "flipped":
        for i in range(len(data) // 3, len(data) // 3 + 16):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # a segment of another flow, dropped in under this name
        other = tmp_path / "other-state"
        other.mkdir()
        cfg = RecoveryConfig(other, backup=str(tmp_path / "other-backup"))
        out: List[Any] = []
        cluster_main(counting_flow([("x", 1), ("y", 2)], out, flow_id="other"), [], 0, recovery_config=cfg)
        (seg,) = sorted((tmp_path / "other-backup" / "other" / "segments").rglob("*.sqlite"))[:1]
        shutil.copyfile(seg, path)


@pytest.mark.parametrize("how", ["flipped", "truncated", "foreign"])
def test_damaged_segment_is_named_by_resume_and_verify(tmp_path, how):
    root = tmp_path / "backup"
    state = tmp_path / "state"
    state.mkdir()
    data = make_data(40, 5)
    cfg = RecoveryConfig(state, backup=str(root))
    items = with_aborts(data, [20])
    out: List[Any] = []
    _run_once(items, cfg, out)  # aborts with several committed epochs

    ok = recovery_cli("verify", str(root))
    assert ok.returncode == 0 and ok.stdout.strip() == "counts: ok", ok.stdout + ok.stderr

    commit = newest_commit(root)
    victim = commit["objects"][len(commit["objects"]) // 2]["key"]
    _damage(root / victim, how, tmp_path)
    shutil.rmtree(state)
    state.mkdir()

    with pytest.raises(CorruptObjectError) as exc:
        _run_once(items, cfg, out)
    assert victim in str(exc.value)

    bad = recovery_cli("verify", str(root))
    assert bad.returncode != 0
    assert victim in bad.stdout + bad.stderr


def test_inspect_prints_flow_executions_and_committed_epoch(tmp_path):
    root = tmp_path / "backup"
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=str(root))
    data = make_data(30, 4)
    run_scenario(lambda i: cfg, data, aborts=[10], workers=[1, 2, 2])
    committed = max(commit_epochs(root))
    res = recovery_cli("inspect", "--keys", str(root))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "flow counts"
    assert "executions       3" in res.stdout
    assert f"committed epoch  {committed}" in res.stdout
    assert "2 worker(s)" in res.stdout
    keys = {line.split()[1]: int(line.split()[2].replace(",", "")) for line in lines if line.strip().startswith("keys ")}
    assert keys["counts.count.stateful_batch"] == 4
    # file:// URIs and --flow work the same; an unknown flow or empty store is an error
    assert recovery_cli("inspect", "--flow", "counts", f"file://{root}").stdout == recovery_cli("inspect", str(root)).stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    res = recovery_cli("verify", str(empty))
    assert res.returncode != 0 and "no millpond recovery data" in res.stderr
    res = recovery_cli("inspect", "ftp://x/y")
    assert res.returncode == 2 and "unknown backup URI scheme" in res.stderr
