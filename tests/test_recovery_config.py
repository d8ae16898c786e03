"""RecoveryConfig validation and SnapshotMode parsing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from millpond.backup import DirBackup
import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.testing import TestingSink, TestingSource, run_main


def test_defaults(tmp_path):
    cfg = RecoveryConfig(str(tmp_path))
    assert cfg.local_state_dir == tmp_path
    assert cfg.snapshot_mode is SnapshotMode.BATCH
    assert cfg.backup is None
    b = cfg.open_backup()
    assert isinstance(b, DirBackup) and (tmp_path / "backup").is_dir()


def test_missing_local_state_dir_is_accepted_and_made_when_the_run_starts(tmp_path):
    missing = tmp_path / "nope" / "state"
    cfg = RecoveryConfig(missing)
    assert not missing.exists(), "a config alone makes nothing"
    flow = Dataflow("mk")
    op.output("out", op.input("in", flow, TestingSource([1])), TestingSink([]))
    run_main(flow, recovery_config=cfg)
    assert (missing / "mk").is_dir() and (missing / "backup").is_dir()


def test_local_state_dir_that_is_a_file_is_named(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory") as exc:
        RecoveryConfig(f)
    assert str(f) in str(exc.value)
    assert "mkdir" not in str(exc.value)


@pytest.mark.parametrize("mode", ["sometimes", "", 3, None])
def test_bad_snapshot_mode(tmp_path, mode):
    with pytest.raises(ValueError, match="unknown snapshot mode"):
        RecoveryConfig(tmp_path, snapshot_mode=mode)


@pytest.mark.parametrize(
    "value, expected",
    [("batch", SnapshotMode.BATCH), ("BATCH", SnapshotMode.BATCH), ("Immediate", SnapshotMode.IMMEDIATE),
     (SnapshotMode.IMMEDIATE, SnapshotMode.IMMEDIATE)],
)
def test_snapshot_mode_parse(tmp_path, value, expected):
    assert SnapshotMode.parse(value) is expected
    assert RecoveryConfig(tmp_path, snapshot_mode=value).snapshot_mode is expected


def test_snapshot_mode_parse_error_lists_the_modes():
    with pytest.raises(ValueError, match="'batch' or 'immediate'"):
        SnapshotMode.parse("often")


@pytest.mark.parametrize("uri", ["ftp://host/x", "gs://bucket/p", "https://x/y"])
def test_bad_backup_scheme(tmp_path, uri):
    with pytest.raises(ValueError, match="unknown backup URI scheme") as exc:
        RecoveryConfig(tmp_path, backup=uri)
    assert uri in str(exc.value)


@pytest.mark.parametrize("uri", ["/some/dir", "file:///some/dir", "s3://bucket/prefix?region=x", "rel/dir"])
def test_good_backup_uris_are_kept_as_given(tmp_path, uri):
    assert RecoveryConfig(tmp_path, backup=uri).backup == uri


def test_backup_object_without_the_methods_is_a_type_error(tmp_path):
    class Half:
        def list_keys(self, prefix=""):
            return []

        def upload(self, a, b):
            pass

    with pytest.raises(TypeError, match="download"):
        RecoveryConfig(tmp_path, backup=Half())


@pytest.mark.parametrize(
    "name, value",
    [("key_group_count", 0), ("key_group_count", -3), ("key_group_count", 1.5), ("key_group_count", True),
     ("retain_epochs", 0), ("max_epochs_in_flight", 0), ("max_epochs_in_flight", "4"),
     ("compact_min_bytes", -1)],
)
def test_non_positive_numbers_are_rejected_with_their_name(tmp_path, name, value):
    with pytest.raises(ValueError, match=name):
        RecoveryConfig(tmp_path, **{name: value})


@pytest.mark.parametrize("ratio", [0, -1.0, float("nan")])
def test_compact_ratio_must_be_positive(tmp_path, ratio):
    with pytest.raises(ValueError, match="compact_ratio"):
        RecoveryConfig(tmp_path, compact_ratio=ratio)


def test_config_is_frozen(tmp_path):
    cfg = RecoveryConfig(tmp_path)
    with pytest.raises(Exception):
        cfg.retain_epochs = 3  # type: ignore[misc]


@pytest.mark.parametrize("value", [5, "1h", timedelta(seconds=-1)])
def test_retain_for_must_be_a_non_negative_timedelta(tmp_path, value):
    with pytest.raises(ValueError, match="retain_for"):
        RecoveryConfig(tmp_path, retain_for=value)


@pytest.mark.parametrize("retain_for, keeps_all", [(None, False), (timedelta(hours=1), True)])
def test_retain_for_keeps_every_commit_record_of_the_window(tmp_path, retain_for, keeps_all):
    import millpond.operators as op
    from millpond.dataflow import Dataflow
    from millpond.testing import TestingSink, TestingSource, run_main

    flow = Dataflow("keep")
    items = [(f"k{i % 7}", i) for i in range(60)]
    s = op.input("inp", flow, TestingSource(items, batch_size=5))
    op.output("out", op.stateful_map("sum", s, lambda st, v: ((st or 0) + v, v)), TestingSink([]))
    (tmp_path / "state").mkdir()
    cfg = RecoveryConfig(tmp_path / "state", backup=str(tmp_path / "backup"), retain_epochs=1,
                         retain_for=retain_for, compact_min_bytes=1)
    run_main(flow, epoch_interval=timedelta(0), recovery_config=cfg)
    commits = sorted(int(p.stem) for p in (tmp_path / "backup" / "keep" / "commits").iterdir())
    # 12 batches, each its own epoch; a commit record may cover several
    # epochs that finished together, so fewer records than epochs exist.
    if keeps_all:
        assert len(commits) >= 3 and commits[0] < 10, commits
    else:
        assert len(commits) <= 2 and commits[0] >= 10, commits
