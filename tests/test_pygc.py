"""The garbage-collection thresholds a flow runs with (millpond.engine.pygc)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.engine.main import run_main
from millpond.engine.pygc import DEFAULT_YOUNG_THRESHOLD, YOUNG_THRESHOLD_VAR, flow_gc, young_threshold
from millpond.testing import TestingSink, TestingSource

PYSRC = str(Path(__file__).resolve().parents[1] / "pysrc")


@pytest.fixture(autouse=True)
def _thresholds() -> Iterator[None]:
    """Every test starts from Python's defaults and leaves them as found."""
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    yield
    gc.set_threshold(*before)
    if not enabled:
        gc.disable()


def _seen_thresholds(**kw: object) -> List[int]:
    """Run a flow whose map records the young threshold each item sees."""
    seen: List[int] = []
    out: List[int] = []
    flow = Dataflow("gc_seen")
    s = op.input("inp", flow, TestingSource([1, 2, 3]))
    s = op.map("look", s, lambda x: (seen.append(gc.get_threshold()[0]), x)[1])
    op.output("out", s, TestingSink(out))
    run_main(flow, **kw)  # type: ignore[arg-type]
    assert out == [1, 2, 3]
    return seen


def test_a_flow_runs_with_the_raised_threshold_and_puts_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(YOUNG_THRESHOLD_VAR, raising=False)
    assert _seen_thresholds() == [DEFAULT_YOUNG_THRESHOLD] * 3
    assert gc.get_threshold() == (700, 10, 10)


def test_the_thresholds_come_back_after_a_failing_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(YOUNG_THRESHOLD_VAR, raising=False)
    flow = Dataflow("gc_fail")
    s = op.input("inp", flow, TestingSource([1]))
    s = op.map("boom", s, lambda x: 1 // 0)
    op.output("out", s, TestingSink([]))
    with pytest.raises(Exception, match="ZeroDivisionError"):
        run_main(flow)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize(
    "setup, expected",
    [
        pytest.param(lambda: gc.set_threshold(50_000, 10, 10), 50_000, id="a higher threshold stays"),
        pytest.param(lambda: gc.set_threshold(0, 10, 10), 0, id="threshold 0 (collection off) stays"),
    ],
)
def test_a_program_that_chose_its_thresholds_keeps_them(monkeypatch: pytest.MonkeyPatch, setup, expected) -> None:
    monkeypatch.delenv(YOUNG_THRESHOLD_VAR, raising=False)
    setup()
    assert _seen_thresholds() == [expected] * 3
    assert gc.get_threshold()[0] == expected


def test_disabled_collection_stays_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(YOUNG_THRESHOLD_VAR, raising=False)
    gc.disable()
    assert _seen_thresholds() == [700] * 3
    assert not gc.isenabled()


def test_the_variable_chooses_the_threshold_and_0_keeps_pythons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(YOUNG_THRESHOLD_VAR, "2500")
    assert _seen_thresholds() == [2500] * 3
    monkeypatch.setenv(YOUNG_THRESHOLD_VAR, "0")
    assert _seen_thresholds() == [700] * 3
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("raw", ["lots", "-1", "1.5"])
def test_a_bad_variable_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(YOUNG_THRESHOLD_VAR, raw)
    with pytest.raises(ValueError, match=rf"{YOUNG_THRESHOLD_VAR}='{raw}': expected a whole number"):
        young_threshold()
    with pytest.raises(ValueError, match=YOUNG_THRESHOLD_VAR):
        _seen_thresholds()
    assert gc.get_threshold() == (700, 10, 10)


def test_thresholds_the_flow_set_itself_are_not_undone() -> None:
    with flow_gc(10_000):
        assert gc.get_threshold()[0] == 10_000
        gc.set_threshold(1234, 10, 10)
    assert gc.get_threshold()[0] == 1234


def test_the_cli_refuses_a_bad_variable_before_starting(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env.update({"PYTHONPATH": PYSRC, YOUNG_THRESHOLD_VAR: "often"})
    res = subprocess.run(
        [sys.executable, "-m", "millpond.run", "no_such_module:flow"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"{YOUNG_THRESHOLD_VAR}='often': expected a whole number" in lines[0]
