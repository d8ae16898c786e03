"""Recovery end to end through the real Go core: a stateful counting flow
run with ``run_main``/``cluster_main``, aborted with ``TestingSource.ABORT()``
and resumed (fast and full resume, 1 -> 3 -> 2 workers, both snapshot modes),
over a DirBackup here and over the S3 test server in a child process.

The oracle is a run that never failed: every output of the interrupted runs
is one the uninterrupted run also emits (outputs are at-least-once around
the resume point, but a replay repeats the same values), every such output
is emitted at least once, and after an ``EOF`` a round of probe items reads
the final per-key state back out of the restored store.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

import millpond.operators as op
from millpond.backup import DirBackup
from millpond.dataflow import Dataflow
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.testing import TestingSink, TestingSource, cluster_main

from helpers.s3server import run_child

ABORT = TestingSource.ABORT
EOF_ = TestingSource.EOF
ZERO = timedelta(0)
MODES = [SnapshotMode.BATCH, SnapshotMode.IMMEDIATE]


def counting_flow(items: Sequence[Any], out: List[Any], flow_id: str = "counts", batch_size: int = 3) -> Dataflow:
    """``(key, n)`` items -> ``(key, running total)``; ``n == 0`` probes the state."""
    flow = Dataflow(flow_id)
    s = op.input("inp", flow, TestingSource(items, batch_size=batch_size))
    s = op.stateful_map("count", s, lambda st, v: ((st or 0) + v, (st or 0) + v))
    op.output("out", s, TestingSink(out))
    return flow


def make_data(n_items: int = 90, n_keys: int = 11) -> List[Tuple[str, int]]:
    return [(f"k{(i * 7) % n_keys}", 1 + i % 3) for i in range(n_items)]


def expected(data: Sequence[Tuple[str, int]]) -> Tuple[set, Dict[str, int]]:
    """Outputs of a run that never fails, and the final state per key."""
    state: Counter = Counter()
    outs = set()
    for k, v in data:
        state[k] += v
        outs.add((k, state[k]))
    return outs, dict(state)


def with_aborts(data: Sequence[Any], at: Sequence[int]) -> List[Any]:
    """``data`` with an ABORT marker before each index in ``at``, then an EOF
    and one probe ``(key, 0)`` per key."""
    items: List[Any] = []
    for i, x in enumerate(data):
        if i in at:
            items.append(ABORT())
        items.append(x)
    items.append(EOF_())
    items.extend((k, 0) for k in sorted({k for k, _ in data}))
    return items


def run_scenario(
    config_for_run,
    data: Sequence[Tuple[str, int]],
    aborts: Sequence[int],
    workers: Sequence[int],
    before_run=None,
) -> Dict[str, Any]:
    """Run the counting flow once per entry of ``workers`` (one run per
    abort, one to reach EOF, one for the probes) with ``config_for_run(i)``.

    Returns the outputs of the data runs, the probed state, and the
    outputs of each run."""
    assert len(workers) == len(aborts) + 2
    items = with_aborts(data, aborts)
    out: List[Any] = []
    flow = counting_flow(items, out)
    per_run = []
    for i, w in enumerate(workers):
        if before_run is not None:
            before_run(i)
        start = len(out)
        cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=config_for_run(i), worker_count_per_proc=w)
        per_run.append(out[start:])
    data_outs = [x for run in per_run[:-1] for x in run]
    return {"data_outs": data_outs, "probe": dict(per_run[-1]), "per_run": per_run}


def check_against_uninterrupted(result: Dict[str, Any], data: Sequence[Tuple[str, int]]) -> None:
    outs, state = expected(data)
    assert set(map(tuple, result["data_outs"])) == outs
    assert result["probe"] == state
    # at-least-once: nothing is lost, and duplicates stay near the resume points
    assert len(result["data_outs"]) < 2 * len(data)


def resume_lines(caplog) -> List[str]:
    return [r.getMessage() for r in caplog.records if r.name == "millpond" and r.getMessage().startswith("resume flow")]


# --- DirBackup --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_abort_then_fast_resume_equals_uninterrupted_run(tmp_path, caplog, mode):
    caplog.set_level(logging.INFO, logger="millpond")
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=str(tmp_path / "backup"), snapshot_mode=mode)
    data = make_data()
    result = run_scenario(lambda i: cfg, data, aborts=[40], workers=[1, 1, 1])
    check_against_uninterrupted(result, data)
    lines = resume_lines(caplog)
    assert len(lines) == 3
    assert "fresh" in lines[0] and "execution 0" in lines[0]
    for line, execution in zip(lines[1:], (1, 2)):
        assert "fast resume" in line and f"execution {execution}" in line, line
    # the resume after the abort started past epoch 1: committed epochs survived it
    epoch = int(lines[1].split("resume epoch ")[1].split(",")[0])
    assert epoch > 5


def test_state_and_backup_directories_named_with_uri_characters(tmp_path, caplog):
    """The local store and the segments are SQLite files opened both by name
    and through a URI: a directory whose name holds '#', '?' or '%' is the
    same directory on every connection (it was not: such a run failed to
    create its store). Abort, fast resume and full resume are exact."""
    caplog.set_level(logging.INFO, logger="millpond")
    state = tmp_path / "state #1?x=1&y%41"
    state.mkdir()
    cfg = RecoveryConfig(state, backup=str(tmp_path / "backup #2?%"))
    data = make_data()

    def lose_disk(i: int) -> None:
        if i == 2:
            shutil.rmtree(state)
            state.mkdir()

    result = run_scenario(lambda i: cfg, data, aborts=[30, 60], workers=[1, 1, 1, 1], before_run=lose_disk)
    check_against_uninterrupted(result, data)
    lines = resume_lines(caplog)
    assert "fast resume" in lines[1] and "full resume" in lines[2], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup #2?%", "state #1?x=1&y%41"]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_full_resume_after_losing_the_local_state_dir(tmp_path, caplog, mode):
    caplog.set_level(logging.INFO, logger="millpond")
    state = tmp_path / "state"
    state.mkdir()
    cfg = RecoveryConfig(state, backup=DirBackup(tmp_path / "backup"), snapshot_mode=mode)

    def lose_disk(i: int) -> None:
        if i > 0:
            shutil.rmtree(state)
            state.mkdir()

    data = make_data()
    result = run_scenario(lambda i: cfg, data, aborts=[30, 60], workers=[1, 1, 1, 1], before_run=lose_disk)
    check_against_uninterrupted(result, data)
    lines = resume_lines(caplog)
    assert len(lines) == 4
    for line in lines[1:]:
        assert "full resume" in line, line
        assert "0 keys restored" not in line


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_resume_with_another_worker_count(tmp_path, caplog, mode):
    caplog.set_level(logging.INFO, logger="millpond")
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=str(tmp_path / "backup"), snapshot_mode=mode, key_group_count=16)
    data = make_data(80, 17)
    result = run_scenario(lambda i: cfg, data, aborts=[25, 55], workers=[1, 3, 2, 2])
    check_against_uninterrupted(result, data)
    lines = resume_lines(caplog)
    assert "on 3 worker(s)" in lines[1] and "full" in lines[1], lines[1]
    assert "on 2 worker(s)" in lines[2] and "full" in lines[2], lines[2]
    assert "on 2 worker(s)" in lines[3] and "fast" in lines[3], lines[3]


def test_abort_before_any_commit_replays_everything(tmp_path):
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state")
    data = make_data(20, 4)
    items = [*data[:5], ABORT(), *data[5:]]
    out: List[Any] = []
    flow = counting_flow(items, out)
    # a single long epoch: nothing is committed before the abort
    cluster_main(flow, [], 0, epoch_interval=timedelta(hours=1), recovery_config=cfg)
    first = list(out)
    out.clear()
    cluster_main(flow, [], 0, epoch_interval=timedelta(hours=1), recovery_config=cfg)
    outs, _ = expected(data)
    assert set(out) == outs and len(out) == len(data)
    assert first == out[: len(first)]


def test_a_finished_flow_rerun_continues_where_it_stopped(tmp_path):
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", snapshot_mode="immediate")
    items: List[Any] = [("a", 1), ("b", 2)]
    out: List[Any] = []
    flow = counting_flow(items, out)
    cluster_main(flow, [], 0, recovery_config=cfg)
    cluster_main(flow, [], 0, recovery_config=cfg)
    assert out == [("a", 1), ("b", 2)]
    items.extend([("a", 5), ("b", 0)])
    cluster_main(flow, [], 0, recovery_config=cfg, worker_count_per_proc=2)
    assert sorted(out[2:]) == [("a", 6), ("b", 2)]


def test_a_finished_run_leaves_one_row_per_key_and_resumes_exactly(tmp_path):
    """A run that ends cleanly collects its local store's superseded rows
    (when they are few): what stays on disk is the state, and the next run
    resumes from it exactly."""
    import sqlite3

    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state")
    data = make_data(90, 11)  # 30 epochs of 3 items: every key changes many times
    items = list(data) + [EOF_()] + [(k, 0) for k in sorted({k for k, _ in data})]
    out: List[Any] = []
    flow = counting_flow(items, out)
    cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg)
    store = tmp_path / "state" / "counts" / "worker-0000" / "store.sqlite"
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT step_id, state_key, count(*) FROM"
            " (SELECT step_id, state_key FROM snaps UNION ALL SELECT step_id, state_key FROM recent)"
            " GROUP BY step_id, state_key"
        ).fetchall()
    assert {n for _, _, n in rows} == {1}, rows  # the source's position included
    assert sorted(k for step, k, _ in rows if step == "counts.count.stateful_batch") == sorted({k for k, _ in data})
    outs, state = expected(data)
    assert set(out) == outs
    start = len(out)
    cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg)
    assert dict(out[start:]) == state


# --- S3, through the test server, in a child process with AWS_* set ------------------

_S3_SCENARIO = """
import json, logging, sys
from pathlib import Path
from millpond.recovery import RecoveryConfig
from test_recovery_e2e import make_data, run_scenario
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
uri, mode, state, workers, lose = sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5] == "1"
state.mkdir()
cfg = RecoveryConfig(state, backup=uri, snapshot_mode=mode, key_group_count=16)
def before(i):
    if lose and i > 0:
        import shutil
        shutil.rmtree(state)
        state.mkdir()
data = make_data(60, 7)
res = run_scenario(lambda i: cfg, data, aborts=[25], workers=workers, before_run=before)
print(json.dumps({"data_outs": res["data_outs"], "probe": res["probe"]}))
"""


@pytest.mark.parametrize(
    "mode, workers, lose",
    [("batch", [1, 1, 1], False), ("immediate", [1, 3, 2], False), ("batch", [2, 2, 2], True)],
    ids=["batch-fast", "immediate-1-3-2", "batch-full"],
)
def test_abort_and_resume_over_s3(tmp_path, s3_server, mode, workers, lose, live_key_limit):
    prefix = f"e2e-{mode}-{''.join(map(str, workers))}-{int(lose)}-live{live_key_limit}"
    res = run_child(_S3_SCENARIO, s3_server, tmp_path, s3_server.uri(prefix), mode, str(tmp_path / "state"),
                    json.dumps(workers), "1" if lose else "0")
    result = json.loads(res.stdout.strip().splitlines()[-1])
    result["data_outs"] = [tuple(x) for x in result["data_outs"]]
    check_against_uninterrupted(result, make_data(60, 7))
    lines = [x for x in res.stderr.splitlines() if "resume flow" in x]
    assert len(lines) == 3
    assert ("full resume" in lines[1]) == (lose or workers[1] != workers[0])
    # the objects really landed in the bucket, under the prefix, namespaced by flow id
    keys = s3_server.objects(prefix + "/")
    assert keys and all(k.startswith(f"{prefix}/counts/") for k in keys)
    assert any("/commits/" in k for k in keys) and any("/segments/" in k for k in keys)
    assert not (tmp_path / "state" / "backup").exists()


# --- resumed runs that visit every stored key ------------------------------------


class _TotalAtEof(op.StatefulBatchLogic):
    """Sums a key's values and emits the total at EOF; keeps a far-off timer
    so a resumed run re-arms every key."""

    def __init__(self, state: Optional[int]) -> None:
        if state == -1:
            raise ValueError("poisoned state")
        self.total = state or 0

    def on_batch(self, values: List[int]) -> Tuple[List[int], bool]:
        self.total += sum(values)
        return [], False

    def on_eof(self) -> Tuple[List[int], bool]:
        return [self.total], False

    def notify_at(self) -> Any:
        from datetime import datetime, timezone

        return datetime(2999, 1, 1, tzinfo=timezone.utc)

    def snapshot(self) -> int:
        return self.total


def _total_flow(items: List[Any], out: List[Any]) -> Dataflow:
    flow = Dataflow("totals")
    s = op.input("inp", flow, TestingSource(items, batch_size=50))
    op.output("out", op.stateful_batch("total", s, _TotalAtEof), TestingSink(out))
    return flow


@pytest.mark.parametrize("lose_local", [False, True], ids=["fast", "full"])
def test_resumed_end_of_input_runs_on_eof_for_every_stored_key(tmp_path, monkeypatch, lose_local, live_key_limit):
    from millpond.state import StateStore

    bulk: List[str] = []
    real = StateStore.hydrate_all

    def spy(self: StateStore, step_id: str, chunk_rows: int = 8192) -> int:
        bulk.append(step_id)
        return real(self, step_id, chunk_rows)

    singles: List[str] = []
    real_load = StateStore._load

    def load_spy(self: StateStore, step_id: str, key: str) -> Any:
        singles.append(step_id)
        return real_load(self, step_id, key)

    monkeypatch.setattr(StateStore, "hydrate_all", spy)
    monkeypatch.setattr(StateStore, "_load", load_spy)
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=DirBackup(tmp_path / "backup"))
    keys = [f"k{i:04d}" for i in range(300)]
    items: List[Any] = [(k, i) for i, k in enumerate(keys)] + [EOF_(), ("k0001", 1000)]
    out: List[Any] = []
    flow = _total_flow(items, out)
    cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg)
    assert sorted(out) == sorted((k, i) for i, k in enumerate(keys))
    if lose_local:
        shutil.rmtree(tmp_path / "state" / "totals")
    out.clear()
    bulk.clear()
    cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg)
    # Every stored key's on_eof ran, with the state the first run left.
    assert sorted(out) == sorted((k, i + (1000 if k == "k0001" else 0)) for i, k in enumerate(keys))
    # The stored keys were built in one streaming pass (when the timers
    # re-armed; the pass at EOF finds them all live), or under a live-key
    # limit by multi-gets of a chunk of keys at a time, never one lookup
    # each; the input's positions too, all read when its partitions are
    # built.
    # (At most the first key is read alone: asking it whether the logic
    # sets timers at all.)
    assert singles.count("totals.total") <= 1
    if live_key_limit is None:
        assert bulk and set(bulk) == {"totals.total", "totals.inp"}
    else:
        assert set(bulk) == {"totals.inp"}


def test_a_builder_failing_on_a_stored_key_is_named_at_resume(tmp_path):
    from millpond.errors import DataflowError

    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state")
    out: List[Any] = []
    cluster_main(_total_flow([("good", 1), ("bad", -1)], out), [], 0, epoch_interval=ZERO, recovery_config=cfg)
    with pytest.raises(DataflowError, match="bad") as info:
        cluster_main(_total_flow([("good", 1)], out), [], 0, epoch_interval=ZERO, recovery_config=cfg)
    assert isinstance(info.value.__cause__, ValueError)


# --- epochs that rewrite the whole state -----------------------------------------


@pytest.mark.parametrize(
    "workers, n_keys, lose_local",
    [(1, 12, True), (3, 12, True), (1, 1500, False), (2, 3000, True)],
    ids=["1 worker", "3 workers", "local generations, fast resume", "local generations, full resume"],
)
def test_epochs_that_touch_every_key_are_kept_as_compacted_state_and_resume_exactly(
    tmp_path, caplog, workers, n_keys, lose_local, live_key_limit
):
    """Every batch (one epoch each) updates every key: each worker's snapshot
    is its whole state, so the commit names those segments as compacted
    state in place of everything older, and (from 1024 keys a worker) the
    local store takes each such epoch as a new generation. Aborted twice and
    resumed, from the local store or from the backup alone, the outputs and
    final state are those of a run that never failed."""
    caplog.set_level(logging.INFO, logger="millpond")
    state, backup = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    cfg = RecoveryConfig(state, backup=DirBackup(backup), compact_min_bytes=1 << 40)
    data = [(f"k{j}", 1 + (i + j) % 3) for i in range(8) for j in range(n_keys)]

    def lose_disk(i: int) -> None:
        if i > 0 and lose_local:
            shutil.rmtree(state)
            state.mkdir()

    items = with_aborts(data, [4 * n_keys, 6 * n_keys])
    out: List[Any] = []
    flow = counting_flow(items, out, batch_size=n_keys)
    per_run = []
    for i in range(4):
        lose_disk(i)
        start = len(out)
        cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg, worker_count_per_proc=workers)
        per_run.append(out[start:])
        # Under a live-key limit no snapshot is the whole state (evicted
        # keys are not in it): compaction bounds the durable state instead.
        if i == 0 and live_key_limit is None:
            commits = sorted((backup / "counts" / "commits").glob("*.json"))
            record = json.loads(commits[-1].read_text())
            kinds = Counter(o["kind"] for o in record["objects"])
            assert kinds == {"compacted": workers}, record["objects"]
            assert {o["last_epoch"] for o in record["objects"]} == {record["epoch"]}
    result = {"data_outs": [x for run in per_run[:-1] for x in run], "probe": dict(per_run[-1])}
    check_against_uninterrupted(result, data)
    kind = "full resume" if lose_local else "fast resume"
    assert all(kind in line for line in resume_lines(caplog)[1:])
    if not lose_local and n_keys >= 1024 * workers and live_key_limit is None:
        # The store is a copy of a whole epoch's segment (small segments
        # have 1 KiB pages; a store written row by row has SQLite's 4 KiB).
        import sqlite3

        with sqlite3.connect(state / "counts" / "worker-0000" / "store.sqlite") as db:
            assert db.execute("PRAGMA page_size").fetchone()[0] == 1024


def final_count_flow(items: Sequence[Any], out: List[Any], batch_size: int) -> Dataflow:
    """Words -> ``(word, count)`` at the end of the input (``count_final``)."""
    flow = Dataflow("final_counts")
    s = op.input("inp", flow, TestingSource(items, batch_size=batch_size))
    op.output("out", op.count_final("count", s, lambda w: w), TestingSink(out))
    return flow


@pytest.mark.parametrize("workers, lose_local", [(1, False), (2, False), (2, True)],
                         ids=["1 worker", "2 workers", "2 workers, full resume"])
def test_an_epoch_that_ends_every_key_commits_no_deletions(tmp_path, workers, lose_local, live_key_limit):
    """A final count drops every key at the end of its input: that last
    epoch is every worker's whole state, so the commit names no segment of
    deletions (only the small state left: the input's position), and the
    run after it starts from empty counts, as a run that never failed."""
    state, backup = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    cfg = RecoveryConfig(state, backup=DirBackup(backup))
    first = [f"w{(i * 7) % 300}" for i in range(1200)]
    second = [f"w{(i * 5) % 40}" for i in range(200)]
    items = first[:700] + [ABORT()] + first[700:] + [EOF_()] + second + [EOF_()]
    out: List[Any] = []
    flow = final_count_flow(items, out, batch_size=100)
    per_run = []
    for i in range(3):
        if lose_local and i > 0:
            shutil.rmtree(state)
            state.mkdir()
        start = len(out)
        cluster_main(flow, [], 0, epoch_interval=ZERO, recovery_config=cfg, worker_count_per_proc=workers)
        per_run.append(sorted(out[start:]))
        if i == 1 and live_key_limit is None:  # whole-state epochs need every key live
            commits = sorted((backup / "final_counts" / "commits").glob("*.json"))
            record = json.loads(commits[-1].read_text())
            assert {o["kind"] for o in record["objects"]} <= {"compacted"}, record["objects"]
            assert {o["last_epoch"] for o in record["objects"]} <= {record["epoch"]}
            # The 300 deleted keys are in no object; what is left is the
            # input partition's position, on the worker that reads it.
            assert sum(o["rows"] for o in record["objects"]) == 1, record["objects"]
    assert per_run[0] == []
    assert per_run[1] == sorted(Counter(first).items())
    assert per_run[2] == sorted(Counter(second).items())
