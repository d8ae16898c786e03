"""Python objects as backups: a dict-backed store with list_keys/upload/
download/delete carries a whole flow run and its resumes."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, Dict, List

import pytest

from millpond.backup import Backup
from millpond.recovery import RecoveryConfig, SnapshotMode

from test_recovery_e2e import check_against_uninterrupted, make_data, resume_lines, run_scenario


class DictBackup:
    """A backup kept in a dict; counts its calls."""

    def __init__(self) -> None:
        self.objects: Dict[str, bytes] = {}
        self.calls: Dict[str, int] = {"list_keys": 0, "upload": 0, "download": 0, "delete": 0}

    def list_keys(self, prefix: str = "") -> List[str]:
        self.calls["list_keys"] += 1
        return sorted(k for k in self.objects if k.startswith(prefix))

    def upload(self, from_local: Any, to_key: str) -> None:
        self.calls["upload"] += 1
        self.objects[to_key] = Path(from_local).read_bytes()

    def download(self, from_key: str, to_local: Any) -> None:
        self.calls["download"] += 1
        try:
            data = self.objects[from_key]
        except KeyError:
            raise FileNotFoundError(from_key) from None
        Path(to_local).write_bytes(data)

    def delete(self, key: str) -> None:
        self.calls["delete"] += 1
        self.objects.pop(key, None)

    def __repr__(self) -> str:
        return f"DictBackup({len(self.objects)} objects)"


def test_dict_backup_is_a_backup():
    assert isinstance(DictBackup(), Backup)


@pytest.mark.parametrize("mode", [SnapshotMode.BATCH, SnapshotMode.IMMEDIATE], ids=lambda m: m.name)
def test_flow_runs_and_resumes_on_a_python_backup(tmp_path, caplog, mode):
    caplog.set_level(logging.INFO, logger="millpond")
    state = tmp_path / "state"
    state.mkdir()
    backup = DictBackup()
    cfg = RecoveryConfig(state, backup=backup, snapshot_mode=mode)

    def before(i: int) -> None:
        if i == 2:  # the third run starts on a new machine: only the backup is left
            shutil.rmtree(state)
            state.mkdir()

    data = make_data(60, 7)
    result = run_scenario(lambda i: cfg, data, aborts=[25], workers=[1, 1, 1], before_run=before)
    check_against_uninterrupted(result, data)
    lines = resume_lines(caplog)
    assert "fast resume" in lines[1] and "full resume" in lines[2], lines
    assert backup.calls["upload"] > 10 and backup.calls["download"] > 0
    keys = backup.list_keys()
    assert any(k.startswith("counts/commits/") for k in keys)
    assert any(k.startswith("counts/segments/") for k in keys)
    assert any(k.startswith("counts/executions/") for k in keys)
    # nothing of the flow is kept outside the backup object
    assert not (state / "backup").exists()
