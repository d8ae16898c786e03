"""A windowed file-to-file flow, SIGKILLed and resumed, is exactly-once (issue 14).

``python -m millpond.run`` on: ``FileSource`` of timestamped lines -> an
event-time tumbling ``count_window`` (1 minute, per key, a few seconds of
out-of-order wait; some lines are late) -> the counts and the late lines ->
``FileSink``, with recovery on (``-d``, ``-b``), killed with SIGKILL at seeded
random moments, rerun after each kill, then run to completion: the output
file is identical to that of a run that was never killed, and after every
kill the file on disk is a prefix of it (nothing written twice, nothing
lost, no half line).

The clock's ``now_getter`` is frozen, so a key's watermark depends only on
the lines of that key, and the source reads one line a batch: the output
order is then a function of the input alone, and the files can be compared
byte for byte. Subprocesses only (never fork); every process started is
stopped.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from helpers.mpflow import kill_at_random_points

pytest.importorskip("millpond.operators.windowing")

import millpond  # noqa: E402

PYSRC = str(Path(millpond.__file__).resolve().parent.parent)

pytestmark = pytest.mark.slow  # crash loops: skipped by `make test-fast`

FLOW = """
import time
from datetime import datetime, timedelta, timezone

import millpond.operators as op
import millpond.operators.windowing as win
from millpond.connectors.files import FileSource, FileSink
from millpond.dataflow import Dataflow

BASE = datetime(2024, 3, 1, tzinfo=timezone.utc)


def frozen_now():
    return BASE


def no_wakeup(_close):
    return None


def line_ts(line):
    return datetime.fromisoformat(line.split()[0])


def line_key(line):
    return line.split()[1]


def fmt_count(kv):
    key, (wid, n) = kv
    return f"count {key} w{wid} {n}"


def fmt_late(kv):
    key, (wid, line) = kv
    return f"late {key} w{wid} {line}"


def get_flow(src, dst, delay=0.0):
    flow = Dataflow("wincount")
    lines = op.input("in", flow, FileSource(src, batch_size=1))

    def slow(line):
        time.sleep(delay)
        return line

    lines = op.map("slow", lines, slow)
    clock = win.EventClock(line_ts, wait_for_system_duration=timedelta(seconds=5), now_getter=frozen_now,
                           to_system_utc=no_wakeup)
    windower = win.TumblingWindower(length=timedelta(minutes=1), align_to=BASE)
    wo = win.count_window("count", lines, clock, windower, line_key)
    out = op.merge("both", op.map("fmt_count", wo.down, fmt_count), op.map("fmt_late", wo.late, fmt_late))
    op.output("out", op.key_on("all", out, lambda _x: "all"), FileSink(dst))
    return flow
"""

N_LINES = 400
IMPORT = 'winflow:get_flow("in.txt", "out.txt", delay=0.003)'
BASE = datetime(2024, 3, 1, tzinfo=timezone.utc)


def _input_lines() -> str:
    rng = random.Random(14)
    t = 0
    lines = []
    for i in range(N_LINES):
        t += rng.randint(0, 6)
        r = rng.random()
        back = 0 if r < 0.8 else (rng.randint(1, 4) if r < 0.95 else rng.randint(70, 150))  # late
        ts = BASE + timedelta(seconds=max(0, t - back))
        lines.append(f"{ts.isoformat()} k{rng.randrange(6)} {i}\n")
    return "".join(lines)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env["PYTHONPATH"] = PYSRC
    return env


def _setup(d: Path) -> Path:
    d.mkdir()
    (d / "winflow.py").write_text(FLOW)
    (d / "in.txt").write_text(_input_lines())
    return d


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    d = _setup(tmp_path_factory.mktemp("ref") / "run")
    res = subprocess.run([sys.executable, "-m", "millpond.run", IMPORT, "-s", "0.05"], cwd=d, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    text = (d / "out.txt").read_text()
    lines = text.splitlines()
    # the flow does what it says: every line counted once or reported late
    counted = sum(int(x.split()[3]) for x in lines if x.startswith("count "))
    late = sum(1 for x in lines if x.startswith("late "))
    assert late > 0 and counted + late == N_LINES, text
    return text


@pytest.mark.parametrize("mode, seed, lose_local_after", [("batch", 141, ()), ("immediate", 142, ()),
                                                           ("batch", 143, (1,))],
                         ids=["batch", "immediate", "batch-lose-local-state"])
def test_windowed_count_killed_at_random_points_ends_identical_to_an_uninterrupted_run(
    tmp_path, uninterrupted, mode, seed, lose_local_after
):
    d = _setup(tmp_path / "run")
    argv = [sys.executable, "-m", "millpond.run", IMPORT, "-d", "state", "-b", str(tmp_path / "backup"),
            "-s", "0.05", "--snapshot-mode", mode]
    (d / "state").mkdir()
    rng = random.Random(seed)
    logs, killed = kill_at_random_points(argv, d, _env(), 4, rng, 0.5, d / "out.txt", uninterrupted,
                                         lose_local_after)
    assert killed >= 3
    final = subprocess.run(argv, cwd=d, env=_env(), capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr
    assert (d / "out.txt").read_text() == uninterrupted
    resumes = [line for err in [*logs, final.stderr] for line in err.splitlines() if "resume flow" in line]
    assert any(" fast resume" in line for line in resumes), resumes
    if lose_local_after:
        assert any(" full resume" in line for line in resumes), resumes
