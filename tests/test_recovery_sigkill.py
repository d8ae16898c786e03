"""``python -m millpond.run`` on a file-to-file flow with recovery, killed
with SIGKILL at several seeded random points, rerun after each kill: the
final output file is identical to that of a run that was never killed.

test_run_cli.py kills a batch-mode run three times; this adds more kill
points, immediate mode, a separate backup directory, and the loss of the
local state directory between kills (full resume from the backup), and it
checks that the output file is a clean prefix of the final one after every
kill.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from helpers.mpflow import kill_at_random_points, read_until_started

import millpond

PYSRC = str(Path(millpond.__file__).resolve().parent.parent)

pytestmark = pytest.mark.slow  # crash loops: skipped by `make test-fast`

FLOW = """
import time
import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.connectors.files import FileSource, FileSink


def get_flow(src, dst, delay=0.0):
    flow = Dataflow("copy")
    lines = op.input("in", flow, FileSource(src, batch_size=2))

    def slow_upper(line):
        time.sleep(delay)
        return line.upper()

    keyed = op.key_on("all", op.map("upper", lines, slow_upper), lambda _x: "all")
    numbered = op.stateful_map("number", keyed, lambda n, x: ((n or 0) + 1, f"{(n or 0) + 1:05d} {x}"))
    op.output("out", numbered, FileSink(dst))
    return flow
"""

N_LINES = 400
IMPORT = 'copyflow:get_flow("in.txt", "out.txt", delay=0.003)'


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env["PYTHONPATH"] = PYSRC
    return env


def _setup(d: Path) -> Path:
    d.mkdir()
    (d / "copyflow.py").write_text(FLOW)
    (d / "in.txt").write_text("".join(f"line {i}\n" for i in range(N_LINES)))
    return d


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    d = _setup(tmp_path_factory.mktemp("ref") / "run")
    res = subprocess.run([sys.executable, "-m", "millpond.run", IMPORT, "-s", "0.05"], cwd=d, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    text = (d / "out.txt").read_text()
    assert text == "".join(f"{i + 1:05d} LINE {i}\n" for i in range(N_LINES))
    return text


@pytest.mark.parametrize(
    "mode, seed, lose_local_after",
    [("batch", 11, ()), ("immediate", 12, ()), ("batch", 13, (1, 3))],
    ids=["batch", "immediate", "batch-lose-local-state"],
)
def test_killed_at_random_points_ends_identical_to_an_uninterrupted_run(
    tmp_path, uninterrupted, mode, seed, lose_local_after
):
    d = _setup(tmp_path / "run")
    argv = [sys.executable, "-m", "millpond.run", IMPORT, "-d", "state", "-b", str(tmp_path / "backup"),
            "-s", "0.05", "--snapshot-mode", mode]
    (d / "state").mkdir()
    rng = random.Random(seed)
    logs, killed = kill_at_random_points(argv, d, _env(), 5, rng, 0.4, d / "out.txt", uninterrupted,
                                         lose_local_after)
    assert killed >= 3
    final = subprocess.run(argv, cwd=d, env=_env(), capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr
    assert (d / "out.txt").read_text() == uninterrupted
    resumes = [line for err in [*logs, final.stderr] for line in err.splitlines() if "resume flow" in line]
    assert any(" fast resume" in line for line in resumes), resumes
    if lose_local_after:
        assert any(" full resume" in line for line in resumes), resumes
    # the recovery data left behind verifies
    check = subprocess.run([sys.executable, "-m", "millpond.recovery", "verify", str(tmp_path / "backup")],
                           env=_env(), capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and check.stdout.strip() == "copy: ok", check.stdout + check.stderr


def test_each_of_20_random_kill_points_resumes_to_the_uninterrupted_output(tmp_path, uninterrupted):
    """Issue 4's acceptance test: 20 independent runs, each killed with
    SIGKILL at its own random instant and then resumed to completion; every
    resumed run's output file equals the uninterrupted run's."""
    rng = random.Random(20)
    killed = 0
    for point in range(20):
        d = _setup(tmp_path / f"p{point}")
        (d / "state").mkdir()
        argv = [sys.executable, "-m", "millpond.run", IMPORT, "-d", "state", "-s", "0.05"]
        proc = subprocess.Popen(argv, cwd=d, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            read_until_started(proc)
            time.sleep(rng.uniform(0.0, 0.3))
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        killed += proc.returncode == -signal.SIGKILL
        resumed = subprocess.run(argv, cwd=d, env=_env(), capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, f"kill point {point}: {resumed.stderr}"
        assert (d / "out.txt").read_text() == uninterrupted, f"kill point {point}"
        shutil.rmtree(d)
    assert killed >= 15, "most kills must land while the flow runs"
