"""The Go core's log reaches Python's logging (logger ``millpond.core``):
retries, failures and maintenance warnings of the recovery pipeline are no
longer thrown away."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.recovery import RecoveryConfig
from millpond.testing import TestingSink, TestingSource, run_main


class FlakyBackup:
    """A backup in a dict whose first ``failures`` uploads raise."""

    def __init__(self, failures: int) -> None:
        self.objects: Dict[str, bytes] = {}
        self.failures = failures
        self.lock = threading.Lock()

    def list_keys(self, prefix: str = "") -> List[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def upload(self, from_local: Any, to_key: str) -> None:
        with self.lock:
            if self.failures > 0 and "/segments/" in to_key:
                self.failures -= 1
                raise ConnectionError("injected upload failure")
        self.objects[to_key] = Path(from_local).read_bytes()

    def download(self, from_key: str, to_local: Any) -> None:
        try:
            Path(to_local).write_bytes(self.objects[from_key])
        except KeyError:
            raise FileNotFoundError(from_key) from None

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)


def _run(tmp_path: Path, backup: Any) -> List[Any]:
    flow = Dataflow("logged")
    out: List[Any] = []
    counts = op.count_final("count", op.input("in", flow, TestingSource(list("abcab"))), lambda w: w)
    op.output("out", counts, TestingSink(out))
    run_main(flow, recovery_config=RecoveryConfig(tmp_path / "state", backup=backup))
    return out


def _core_records(caplog: pytest.LogCaptureFixture) -> List[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "millpond.core"]


def test_a_fault_injected_upload_retry_reaches_python_logging(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="millpond.core")
    backup = FlakyBackup(failures=1)
    assert sorted(_run(tmp_path, backup)) == [("a", 2), ("b", 2), ("c", 1)]
    retries = [r for r in _core_records(caplog) if "segment upload failed; retrying" in r.getMessage()]
    assert len(retries) == 1, [r.getMessage() for r in _core_records(caplog)]
    rec = retries[0]
    assert rec.levelno == logging.WARNING
    # The attributes are kept: in the message, and apart in core_attrs.
    assert rec.core_attrs["attempt"] == "1"  # type: ignore[attr-defined]
    assert "injected upload failure" in rec.core_attrs["err"]  # type: ignore[attr-defined]
    assert rec.core_attrs["key"].startswith("logged/segments/")  # type: ignore[attr-defined]
    assert "attempt=1" in rec.getMessage()
    # Routine records are Debug: not passed on at INFO.
    assert not [r for r in _core_records(caplog) if r.levelno < logging.INFO]


def test_a_run_that_gives_up_logs_why_before_it_raises(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="millpond.core")
    from millpond.errors import DataflowError, RecoveryError

    with pytest.raises((RecoveryError, DataflowError)):
        _run(tmp_path, FlakyBackup(failures=100))
    messages = [r.getMessage() for r in _core_records(caplog)]
    assert any("recovery pipeline failed" in m for m in messages), messages
    assert sum("retrying" in m for m in messages) >= 1


def test_records_below_the_loggers_level_are_not_passed_on(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="millpond.core")
    _run(tmp_path, FlakyBackup(failures=1))
    assert not [r for r in _core_records(caplog) if r.levelno < logging.ERROR]


def test_debug_records_arrive_when_the_logger_asks_for_them(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="millpond.core")
    _run(tmp_path, FlakyBackup(failures=0))
    messages = [r.getMessage() for r in _core_records(caplog) if r.levelno == logging.DEBUG]
    assert any("epoch committed" in m for m in messages)
    assert any(m.startswith("execution recorded flow=logged execution=0") for m in messages)


def test_a_full_resume_says_why_at_info(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="millpond.core")
    backup = FlakyBackup(failures=0)
    _run(tmp_path, backup)
    import shutil

    shutil.rmtree(tmp_path / "state")
    _run(tmp_path, backup)
    restored = [r for r in _core_records(caplog) if r.getMessage().startswith("worker restored")]
    assert [(r.levelno, r.core_attrs["kind"], r.core_attrs["reason"]) for r in restored] == [  # type: ignore[attr-defined]
        (logging.INFO, "full", "no local store")
    ]
