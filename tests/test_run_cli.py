"""``python -m millpond.run`` and ``cli_main``: flags, env vars, import strings, errors.

The first part checks parsing and wiring in-process, with stand-ins for the
engine's ``cluster_main`` and the recovery config, so it pins exactly what
the CLI passes on. The subprocess tests at the end run real flows and need
the engine (``millpond.testing``, ``millpond.operators``) and, for ``-d``,
the Go extension.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List

import pytest

import millpond
from millpond import run
from millpond.dataflow import Dataflow
from millpond.errors import DataflowError

PYSRC = str(Path(millpond.__file__).resolve().parent.parent)
_REAL_CHECK_FLOW = getattr(run, "_check_flow", None)


# --- stand-ins for the engine and the recovery module --------------------------


class _Calls:
    def __init__(self) -> None:
        self.cluster: List[Dict[str, Any]] = []
        self.raise_exc: BaseException | None = None


@pytest.fixture
def engine(monkeypatch):
    calls = _Calls()

    def cluster_main(flow, addresses, proc_id, *, epoch_interval=None, recovery_config=None, worker_count_per_proc=1,
                     max_live_keys=None, metrics_port=None, metrics_address="127.0.0.1", max_live_bytes=None):
        calls.cluster.append(
            dict(
                flow=flow,
                addresses=addresses,
                proc_id=proc_id,
                epoch_interval=epoch_interval,
                recovery_config=recovery_config,
                worker_count_per_proc=worker_count_per_proc,
                max_live_keys=max_live_keys,
                max_live_bytes=max_live_bytes,
                metrics_port=metrics_port,
                metrics_address=metrics_address,
            )
        )
        if calls.raise_exc is not None:
            raise calls.raise_exc


    class SnapshotMode(Enum):
        BATCH = "batch"
        IMMEDIATE = "immediate"

    class RecoveryConfig:
        def __init__(self, local_state_dir, backup=None, snapshot_mode=SnapshotMode.BATCH):
            self.local_state_dir = local_state_dir
            self.backup = backup
            self.snapshot_mode = snapshot_mode

    recovery = types.ModuleType("millpond.recovery")
    recovery.RecoveryConfig = RecoveryConfig
    recovery.SnapshotMode = SnapshotMode
    import millpond.engine

    monkeypatch.setattr(millpond.engine, "cluster_main", cluster_main)
    # The stand-in flows have no steps; the tests of the preflight put it back.
    monkeypatch.setattr(run, "_check_flow", lambda flow: None, raising=False)
    monkeypatch.setitem(sys.modules, "millpond.recovery", recovery)
    for var in [v for _d, v, _c in run._ENV]:
        monkeypatch.delenv(var, raising=False)
    return calls


_counter = iter(range(10**6))


@pytest.fixture
def flows_pkg(tmp_path, monkeypatch):
    """A uniquely named package holding a flow module, on sys.path."""
    name = f"cliflows{next(_counter)}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "wc.py").write_text(
        textwrap.dedent(
            """
            from millpond.dataflow import Dataflow

            flow = Dataflow("default_flow")
            other = Dataflow("other_flow")
            not_a_flow = 42

            class Holder:
                inner = Dataflow("inner_flow")

            def get_flow(path, n=1, *, tags=()):
                if n < 0:
                    raise ValueError("n must be >= 0")
                f = Dataflow("made")
                f.args = (path, n, tags)
                return f

            def returns_int():
                return 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return name


# --- import strings -------------------------------------------------------------


def test_import_str_module_defaults_to_attr_flow(flows_pkg):
    assert run.locate_dataflow(f"{flows_pkg}.wc").flow_id == "default_flow"


def test_import_str_names_an_attribute(flows_pkg):
    assert run.locate_dataflow(f"{flows_pkg}.wc:other").flow_id == "other_flow"


def test_import_str_dotted_attribute(flows_pkg):
    assert run.locate_dataflow(f"{flows_pkg}.wc:Holder.inner").flow_id == "inner_flow"


def test_import_str_path_to_py_file_inside_a_package(flows_pkg, tmp_path):
    assert run.locate_dataflow(f"{flows_pkg}/wc.py:other").flow_id == "other_flow"


def test_import_str_path_to_standalone_py_file(tmp_path):
    d = tmp_path / "loose"
    d.mkdir()
    (d / f"standalone{next(_counter)}.py").write_text(
        "from millpond.dataflow import Dataflow\nflow = Dataflow('loose')\n"
    )
    (path,) = d.glob("*.py")
    assert run.locate_dataflow(str(path)).flow_id == "loose"


def test_import_str_factory_call_with_literal_args(flows_pkg):
    flow = run.locate_dataflow(f'{flows_pkg}.wc:get_flow("/tmp/in.txt", n=3, tags=("a", {{"k": [1, None]}}))')
    assert flow.args == ("/tmp/in.txt", 3, ("a", {"k": [1, None]}))


def test_import_str_factory_args_may_contain_colons(flows_pkg):
    flow = run.locate_dataflow(f'{flows_pkg}.wc:get_flow("s3://bucket/a:b")')
    assert flow.args[0] == "s3://bucket/a:b"


@pytest.mark.parametrize(
    "target, message",
    [
        ("get_flow(open('x'))", "not a literal"),
        ("get_flow(__import__('os').system('true'))", "not a literal"),
        ("get_flow(*['a'])", r"\*args"),
        ("get_flow(**{'path': 'a'})", r"\*\*kwargs"),
        ("get_flow(", "must be a name or a call"),
        ("1 + 2", "must be a name or a call"),
    ],
)
def test_import_str_rejects_non_literal_or_malformed_targets(flows_pkg, target, message):
    with pytest.raises(run.ImportStringError, match=message):
        run.locate_dataflow(f"{flows_pkg}.wc:{target}")


@pytest.mark.parametrize(
    "suffix, message",
    [
        (":nope", "has no attribute 'nope'"),
        (":not_a_flow", r"42 \(of type int\), not a millpond.dataflow.Dataflow"),
        (":get_flow", r"is a function, not a Dataflow; to call a factory write '.*:get_flow\(\)'"),
        (":returns_int()", r"3 \(of type int\)"),
        (":get_flow('x', n=-1)", r"get_flow\(\.\.\.\) raised ValueError: n must be >= 0 \(at .*wc.py:\d+ in get_flow\)"),
        (":get_flow()", r"raised TypeError"),
        (":not_a_flow()", "not something to call"),
    ],
)
def test_import_str_errors_say_what_is_wrong(flows_pkg, suffix, message):
    with pytest.raises(run.ImportStringError, match=message):
        run.locate_dataflow(f"{flows_pkg}.wc{suffix}")


def test_import_str_missing_module(flows_pkg):
    with pytest.raises(run.ImportStringError, match=f"no module named '{flows_pkg}.nope'"):
        run.locate_dataflow(f"{flows_pkg}.nope")


def test_import_str_module_that_fails_to_import_shows_its_error(flows_pkg, tmp_path):
    (tmp_path / flows_pkg / "broken.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(run.ImportStringError, match="importing .*broken.* failed: ModuleNotFoundError.*no_such_dependency_xyz"):
        run.locate_dataflow(f"{flows_pkg}.broken")


def test_import_str_missing_file(tmp_path):
    with pytest.raises(run.ImportStringError, match="no such file"):
        run.locate_dataflow(str(tmp_path / "nope.py"))


@pytest.mark.parametrize("text", ["a:1", "a:1;b:2", " a:1 ; [::1]:9 ;", "host.example:65535"])
def test_parse_addresses_accepts_host_port_lists(text):
    assert run.parse_addresses(text) == [a.strip() for a in text.split(";") if a.strip()]


@pytest.mark.parametrize("text", ["", ";", "a", "a:", ":1", "a:0", "a:70000", "a:x"])
def test_parse_addresses_rejects_bad_entries(text):
    with pytest.raises(ValueError):
        run.parse_addresses(text)


# --- flags and env vars reach cluster_main -------------------------------------------


def test_defaults_run_one_worker_in_one_process_without_recovery(engine, flows_pkg):
    assert run.main([f"{flows_pkg}.wc"]) == 0
    (call,) = engine.cluster
    assert call["flow"].flow_id == "default_flow"
    assert call["addresses"] == [] and call["proc_id"] == 0
    assert call["worker_count_per_proc"] == 1
    assert call["epoch_interval"] is None
    assert call["recovery_config"] is None
    assert call["metrics_port"] is None


def test_metrics_flags_and_env_reach_cluster_main(engine, flows_pkg, monkeypatch):
    assert run.main(["--metrics-port", "9464", f"{flows_pkg}.wc"]) == 0
    assert (engine.cluster[-1]["metrics_port"], engine.cluster[-1]["metrics_address"]) == (9464, "127.0.0.1")
    assert run.main(["--metrics-port", "0", "--metrics-address", "0.0.0.0", f"{flows_pkg}.wc"]) == 0
    assert (engine.cluster[-1]["metrics_port"], engine.cluster[-1]["metrics_address"]) == (0, "0.0.0.0")
    monkeypatch.setenv("MILLPOND_METRICS_PORT", "9100")
    monkeypatch.setenv("MILLPOND_METRICS_ADDRESS", "::1")
    assert run.main([f"{flows_pkg}.wc"]) == 0
    assert (engine.cluster[-1]["metrics_port"], engine.cluster[-1]["metrics_address"]) == (9100, "::1")
    assert run.main(["--metrics-port", "9200", f"{flows_pkg}.wc"]) == 0  # the flag wins
    assert engine.cluster[-1]["metrics_port"] == 9200


def test_flags_reach_cluster_main(engine, flows_pkg, tmp_path):
    argv = ["-w", "3", "-i", "1", "-a", "h1:2101;h2:2101", "-s", "0.25", f"{flows_pkg}.wc"]
    assert run.main(argv) == 0
    (call,) = engine.cluster
    assert call["worker_count_per_proc"] == 3
    assert call["addresses"] == ["h1:2101", "h2:2101"] and call["proc_id"] == 1
    assert call["epoch_interval"] == timedelta(seconds=0.25)


def test_long_flags_and_zero_epoch_interval(engine, flows_pkg):
    assert run.main(["--workers-per-process", "2", "--epoch-interval", "0", f"{flows_pkg}.wc"]) == 0
    (call,) = engine.cluster
    assert call["worker_count_per_proc"] == 2
    assert call["epoch_interval"] == timedelta(0)


def test_env_vars_set_options(engine, flows_pkg, monkeypatch, tmp_path):
    monkeypatch.setenv("MILLPOND_WORKERS_PER_PROCESS", "4")
    monkeypatch.setenv("MILLPOND_PROCESS_ID", "0")
    monkeypatch.setenv("MILLPOND_ADDRESSES", "a:1;b:2")
    monkeypatch.setenv("MILLPOND_EPOCH_INTERVAL", "1.5")
    monkeypatch.setenv("MILLPOND_LOCAL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MILLPOND_BACKUP", "s3://bucket/prefix")
    monkeypatch.setenv("MILLPOND_SNAPSHOT_MODE", "IMMEDIATE")
    assert run.main([f"{flows_pkg}.wc"]) == 0
    (call,) = engine.cluster
    assert call["worker_count_per_proc"] == 4
    assert call["addresses"] == ["a:1", "b:2"] and call["proc_id"] == 0
    assert call["epoch_interval"] == timedelta(seconds=1.5)
    rc = call["recovery_config"]
    assert rc.local_state_dir == tmp_path / "state"
    assert rc.backup == "s3://bucket/prefix"
    assert rc.snapshot_mode.name == "IMMEDIATE"


def test_flags_override_env_vars(engine, flows_pkg, monkeypatch):
    monkeypatch.setenv("MILLPOND_WORKERS_PER_PROCESS", "4")
    assert run.main(["-w", "2", f"{flows_pkg}.wc"]) == 0
    assert engine.cluster[0]["worker_count_per_proc"] == 2


def test_the_byte_budget_reaches_cluster_main_from_the_flag_or_the_variable(engine, flows_pkg, monkeypatch, capsys):
    monkeypatch.setenv("MILLPOND_MAX_LIVE_BYTES", "2GB")
    assert run.main([f"{flows_pkg}.wc"]) == 0
    assert run.main(["--max-live-bytes", "512MiB", f"{flows_pkg}.wc"]) == 0
    assert [c["max_live_bytes"] for c in engine.cluster] == [2_000_000_000, 512 << 20]
    with pytest.raises(SystemExit) as stop:
        run.main(["--max-live-bytes", "12XB", f"{flows_pkg}.wc"])
    assert stop.value.code == 2
    assert "--max-live-bytes: expected a size such as 1500000, 512MiB or 2GB, got '12XB'" in capsys.readouterr().err


def test_local_state_dir_turns_recovery_on_with_defaults(engine, flows_pkg, tmp_path):
    assert run.main(["-d", str(tmp_path / "st"), f"{flows_pkg}.wc"]) == 0
    rc = engine.cluster[0]["recovery_config"]
    assert rc.local_state_dir == tmp_path / "st"
    assert rc.backup is None
    assert rc.snapshot_mode.name == "BATCH"


@pytest.mark.parametrize("uri", ["{tmp}/backups", "file://{tmp}/backups", "s3://bkt/p?region=eu-west-1", "./rel"])
def test_backup_uri_is_passed_on_as_a_string(engine, flows_pkg, tmp_path, uri):
    uri = uri.format(tmp=tmp_path)
    assert run.main(["-d", str(tmp_path / "st"), "-b", uri, f"{flows_pkg}.wc"]) == 0
    assert engine.cluster[0]["recovery_config"].backup == uri


def test_backup_uri_scheme_is_case_insensitive(engine, flows_pkg, tmp_path):
    assert run.main(["-d", str(tmp_path / "st"), "-b", "S3://bkt/p", f"{flows_pkg}.wc"]) == 0
    assert engine.cluster[0]["recovery_config"].backup == "s3://bkt/p"


_BACKUP_MODULE = """
class MyBackup:
    def __init__(self, root, n=0):
        self.root, self.n = root, n
    def list_keys(self, prefix=""):
        return []
    def upload(self, from_local, to_key):
        pass
    def download(self, from_key, to_local):
        raise FileNotFoundError(from_key)
    def delete(self, key):
        pass

def make(root, n=0):
    return MyBackup(root, n)

def broken():
    raise RuntimeError("no credentials in the vault")

def not_a_backup():
    return {"root": "/x"}
"""


def test_backup_factory_is_called_with_literal_args(engine, flows_pkg, tmp_path):
    (tmp_path / flows_pkg / "bk.py").write_text(_BACKUP_MODULE)
    assert run.main(["-d", str(tmp_path), "-b", f"{flows_pkg}.bk:make('/x', n=2)", f"{flows_pkg}.wc"]) == 0
    backup = engine.cluster[0]["recovery_config"].backup
    assert (type(backup).__name__, backup.root, backup.n) == ("MyBackup", "/x", 2)


def test_snapshot_mode_flag(engine, flows_pkg, tmp_path):
    assert run.main(["-d", str(tmp_path), "--snapshot-mode", "immediate", f"{flows_pkg}.wc"]) == 0
    assert engine.cluster[0]["recovery_config"].snapshot_mode.name == "IMMEDIATE"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-b", "/x"], "-b/--backup needs -d/--local-state-dir"),
        (["--snapshot-mode", "batch"], "--snapshot-mode needs -d/--local-state-dir"),
        (["-i", "0"], "go together"),
        (["-a", "a:1"], "go together"),
        (["-i", "2", "-a", "a:1;b:2"], "out of range for 2 addresses"),
        (["-w", "0"], "workers-per-process: expected a positive integer"),
        (["-w", "x"], "workers-per-process: expected a positive integer"),
        (["-s", "-1"], "epoch-interval: expected a finite number of seconds"),
        (["-s", "nan"], "epoch-interval"),
        (["--snapshot-mode", "sometimes", "-d", "/tmp/x"], "expected 'batch' or 'immediate'"),
        (["--log-level", "LOUD"], "expected one of"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_options_give_one_line_and_exit_2(engine, flows_pkg, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        status = run.main([*argv, f"{flows_pkg}.wc"])
        raise SystemExit(status)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert engine.cluster == []


@pytest.mark.parametrize(
    "var, value, message",
    [
        ("MILLPOND_WORKERS_PER_PROCESS", "many", "MILLPOND_WORKERS_PER_PROCESS='many'"),
        ("MILLPOND_ADDRESSES", "nohost", "MILLPOND_ADDRESSES='nohost'"),
        ("MILLPOND_EPOCH_INTERVAL", "soon", "MILLPOND_EPOCH_INTERVAL='soon'"),
        ("MILLPOND_SNAPSHOT_MODE", "never", "MILLPOND_SNAPSHOT_MODE='never'"),
    ],
)
def test_bad_env_var_is_named_in_the_error(engine, flows_pkg, capsys, monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    assert run.main([f"{flows_pkg}.wc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_dataflow_error_prints_error_and_cause_and_exits_1(engine, flows_pkg, capsys):
    try:
        try:
            1 / 0
        except ZeroDivisionError as inner:
            raise DataflowError("step 'wc.div' on worker 0 raised") from inner
    except DataflowError as outer:
        engine.raise_exc = outer
    assert run.main([f"{flows_pkg}.wc"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "python -m millpond.run: the dataflow failed: step 'wc.div' on worker 0 raised"
    assert err[1].startswith("  caused by ZeroDivisionError: division by zero (at ")
    assert err[1].endswith(" in test_dataflow_error_prints_error_and_cause_and_exits_1)")
    assert len(err) == 2


def test_dataflow_error_that_quotes_its_cause_adds_only_where_it_was_raised(engine, flows_pkg, capsys):
    try:
        try:
            1 / 0
        except ZeroDivisionError as inner:
            raise DataflowError("error in step 'wc.div': ZeroDivisionError: division by zero") from inner
    except DataflowError as outer:
        engine.raise_exc = outer
    assert run.main([f"{flows_pkg}.wc"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[1].startswith("  raised at ") and "test_run_cli.py:" in err[1]


def test_keyboard_interrupt_exits_130_quietly(engine, flows_pkg, capsys):
    engine.raise_exc = KeyboardInterrupt()
    assert run.main([f"{flows_pkg}.wc"]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_settings_the_engine_refuses_before_starting_exit_2(engine, flows_pkg, capsys):
    engine.raise_exc = ValueError("multi-process clusters are not supported yet (2 addresses given)")
    assert run.main(["-i", "0", "-a", "a:1;b:2", f"{flows_pkg}.wc"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "python -m millpond.run: error: the flow was not started: "
        "multi-process clusters are not supported yet (2 addresses given)\n"
    )


def test_cli_main_takes_seconds_or_timedelta(engine):
    flow = Dataflow("f")
    run.cli_main(flow, epoch_interval=2)
    run.cli_main(flow, epoch_interval=timedelta(milliseconds=5), workers_per_process=2)
    assert [c["epoch_interval"] for c in engine.cluster] == [timedelta(seconds=2), timedelta(milliseconds=5)]
    assert engine.cluster[1]["worker_count_per_proc"] == 2


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        (dict(workers_per_process=0), ValueError),
        (dict(process_id=0), ValueError),
        (dict(addresses=["a:1"], process_id=1), ValueError),
        (dict(epoch_interval=-1), ValueError),
        (dict(epoch_interval="1s"), TypeError),
    ],
)
def test_cli_main_rejects_bad_arguments_before_running(engine, kwargs, exc):
    with pytest.raises(exc):
        run.cli_main(Dataflow("f"), **kwargs)
    assert engine.cluster == []


def test_cli_main_rejects_non_dataflow(engine):
    with pytest.raises(TypeError, match="Dataflow"):
        run.cli_main("flows.wc")


# --- checks made before the flow starts: exit 2, one line naming the flag ----------------


@pytest.fixture
def backup_module(flows_pkg, tmp_path):
    (tmp_path / flows_pkg / "bk.py").write_text(_BACKUP_MODULE)
    (tmp_path / "afile").write_text("")
    return flows_pkg


@pytest.mark.parametrize(
    "backup, message",
    [
        ("/nonexistent/dir", "-b/--backup /nonexistent/dir: backup directory /nonexistent/dir does not exist, "
         "and neither does its parent /nonexistent; only the last part is created, so check the path "
         "(a typo, an unmounted volume?)"),
        ("afile", "-b/--backup afile: backup directory {cwd}/afile exists and is not a directory; name a "
         "directory, or a path that does not exist yet in an existing directory (it is created)"),
        ("afile/sub", "-b/--backup afile/sub: backup directory {cwd}/afile/sub cannot be created: "
         "{cwd}/afile is not a directory"),
        ("s3://", "-b/--backup s3://: has no bucket: write s3://BUCKET or s3://BUCKET/PREFIX"),
        ("s3:/bkt/p", "-b/--backup s3:/bkt/p: an S3 URI starts with s3:// (two slashes), as in s3://bucket/prefix"),
        ("s3:bkt", "-b/--backup s3:bkt: an S3 URI starts with s3:// (two slashes), as in s3://bucket/prefix"),
        ("s3://b/p", '-b/--backup s3://b/p: s3 bucket "b": name must be 3 to 63 characters long'),
        # The value of an unknown parameter may be a secret in the wrong
        # place: it is never echoed.
        ("s3://bkt/p?endpiont=http://x", '-b/--backup s3://bkt/p?endpiont=xxxxx: unknown parameter '
         '"endpiont" (known: endpoint, max_attempts, max_backoff, part_size, region, stall_timeout, timeout)'),
        ("gs://bkt/p", "-b/--backup gs://bkt/p: unknown backup URI scheme 'gs' in 'gs://bkt/p'; use one of: "
         "a plain path, file:///path, s3://bucket/prefix"),
        ("60", "-b/--backup 60: -b takes a backup URI or directory, not a number; millpond has no backup "
         "interval: every committed epoch is backed up (see -s/--epoch-interval). For a directory named "
         "60, write ./60"),
        ("1.5", "-b/--backup 1.5: -b takes a backup URI or directory, not a number;"),
        ("{pkg}.nope:make()", "-b/--backup {pkg}.nope:make(): no module named '{pkg}.nope'"),
        ("{pkg}.bk:broken()", "-b/--backup {pkg}.bk:broken(): {pkg}.bk:broken(...) raised RuntimeError: "
         "no credentials in the vault (at {cwd}/{pkg}/bk.py:"),
        ("{pkg}.bk:not_a_backup()", "-b/--backup {pkg}.bk:not_a_backup(): {pkg}.bk:not_a_backup(...) gave "
         "{{'root': '/x'}} (of type dict), which is not a backup: it has no list_keys(), upload(), "
         "download(), delete() (see millpond.backup.Backup)"),
        ("{pkg}.bk:make", "-b/--backup {pkg}.bk:make: {pkg}.bk:make is a function, not a backup; to call "
         "a factory write '{pkg}.bk:make()'"),
    ],
)
def test_bad_backup_exits_2_with_one_line_naming_the_flag(engine, backup_module, tmp_path, capsys, backup, message):
    fill = dict(pkg=backup_module, cwd=os.getcwd())
    backup = backup.format(**fill)
    assert run.main(["-d", "st", "-b", backup, f"{backup_module}.wc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("python -m millpond.run: error: " + message.format(**fill)), err
    assert "rejected" not in err and "ValueError" not in err
    assert engine.cluster == []


@pytest.mark.parametrize(
    "var, value, message",
    [
        ("MILLPOND_BACKUP", "60", "MILLPOND_BACKUP='60': -b takes a backup URI or directory, not a number;"),
        ("MILLPOND_BACKUP", "/nonexistent/dir", "MILLPOND_BACKUP='/nonexistent/dir': backup directory "
         "/nonexistent/dir does not exist"),
        ("MILLPOND_BACKUP", "s3://", "MILLPOND_BACKUP='s3://': has no bucket"),
        ("MILLPOND_LOCAL_STATE_DIR", "afile", "MILLPOND_LOCAL_STATE_DIR='afile': exists and is not a directory"),
    ],
)
def test_bad_value_from_the_environment_names_the_variable(engine, backup_module, capsys, monkeypatch, var, value,
                                                           message):
    monkeypatch.setenv(var, value)
    argv = [] if var == "MILLPOND_LOCAL_STATE_DIR" else ["-d", "st"]
    assert run.main([*argv, f"{backup_module}.wc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m millpond.run: error: " + message), err


def test_backup_factory_that_returns_a_backup_is_passed_on(engine, backup_module):
    assert run.main(["-d", "st", "-b", f"{backup_module}.bk:make('/r')", f"{backup_module}.wc"]) == 0
    assert engine.cluster[0]["recovery_config"].backup.root == "/r"


def test_local_state_dir_that_is_a_file_exits_2_without_suggesting_mkdir(engine, backup_module, capsys):
    assert run.main(["-d", "afile", f"{backup_module}.wc"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "python -m millpond.run: error: -d/--local-state-dir afile: exists and is not a directory; name a "
        "directory, or a path that does not exist yet (it is made, with its parents)\n"
    )
    assert "mkdir" not in err and engine.cluster == []


def test_local_state_dir_below_a_file_exits_2(engine, backup_module, capsys):
    assert run.main(["-d", "afile/state", f"{backup_module}.wc"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"python -m millpond.run: error: -d/--local-state-dir afile/state: cannot be made: "
        f"{os.getcwd()}/afile exists and is not a directory\n"
    )


def test_local_state_dir_whose_parent_is_not_writable_exits_2(engine, backup_module, capsys, monkeypatch):
    monkeypatch.setattr(run.os, "access", lambda path, mode: False)
    assert run.main(["-d", "new/state", f"{backup_module}.wc"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"python -m millpond.run: error: -d/--local-state-dir new/state: cannot be made: "
        f"{os.getcwd()} is not writable by this user\n"
    )


def test_missing_local_state_dir_and_parents_are_left_for_the_core_to_make(engine, backup_module, tmp_path):
    assert run.main(["-d", "a/b/c", f"{backup_module}.wc"]) == 0
    assert engine.cluster[0]["recovery_config"].local_state_dir == Path("a/b/c")
    assert not (tmp_path / "a").exists()  # the CLI makes nothing; the run does (see the subprocess test)


_BYTEWAX_RECOVERY_DIRECTORY = (
    "-r/--recovery-directory is a Bytewax flag; millpond keeps recovery data in a local state directory, "
    "-d/--local-state-dir DIR, and a durable store, -b/--backup URI (both made on first use; there are no "
    "partitions to initialize)"
)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-r", "state"], _BYTEWAX_RECOVERY_DIRECTORY),
        (["--recovery-directory=state"], _BYTEWAX_RECOVERY_DIRECTORY),
        (["-s", "1", "-b", "60", "-r", "state"], _BYTEWAX_RECOVERY_DIRECTORY),
        (["--snapshot-interval", "5"], "--snapshot-interval is a Bytewax flag; millpond snapshots state at "
         "the end of every epoch: use -s/--epoch-interval SECONDS"),
        (["--backup-interval", "60"], "--backup-interval is a Bytewax flag; millpond has no backup interval: "
         "every committed epoch is backed up to -b/--backup, and RecoveryConfig(retain_epochs=..., "
         "retain_for=...) sets how long older epochs are kept"),
    ],
)
def test_bytewax_flags_point_at_the_millpond_equivalent(engine, flows_pkg, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        run.main([*argv, f"{flows_pkg}.wc"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"python -m millpond.run: error: {message}\n"
    assert engine.cluster == []


def test_version_prints_millpond_and_its_version(capsys):
    with pytest.raises(SystemExit) as exc:
        run.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"millpond {millpond.__version__}\n"


_FLOW_MODULE = """
import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.testing import TestingSink, TestingSource


def no_output():
    flow = Dataflow("noout")
    op.map("upper", op.input("in", flow, TestingSource(["a"])), str.upper)
    return flow


def duplicate():
    flow = Dataflow("dup")
    lines = op.input("in", flow, TestingSource(["a"]))
    op.map("upper", lines, str.upper)
    op.map("upper", lines, str.lower)  # line 17
    return flow
"""


def test_flow_without_output_exits_2_naming_import_str(engine, flows_pkg, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "_check_flow", _REAL_CHECK_FLOW, raising=False)
    (tmp_path / flows_pkg / "bad.py").write_text(_FLOW_MODULE)
    assert run.main([f"{flows_pkg}.bad:no_output()"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"python -m millpond.run: error: IMPORT_STR {flows_pkg}.bad:no_output(): the dataflow cannot run: "
        "Dataflow 'noout' has no output or inspect step; add one with op.output(...) "
        "(or op.inspect(...) to only look at the items)\n"
    )
    assert engine.cluster == []


def test_duplicate_step_id_exits_2_pointing_at_the_users_line(engine, flows_pkg, tmp_path, capsys):
    (tmp_path / flows_pkg / "bad.py").write_text(_FLOW_MODULE)
    assert run.main([f"{flows_pkg}.bad:duplicate()"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"python -m millpond.run: error: {flows_pkg}.bad:duplicate(...) raised ValueError: step id 'upper' "
        "is used twice in 'dup'; step ids must be unique within their scope (at "
    ), err
    assert err.endswith(f"{flows_pkg}/bad.py:17 in duplicate)\n"), err


# --- the real thing, in a subprocess ---------------------------------------------------


def _run_cli(args, cwd, timeout=120, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env["PYTHONPATH"] = PYSRC
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "millpond.run", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_subprocess_help_works_without_the_engine(tmp_path):
    out = _run_cli(["--help"], tmp_path)
    assert out.returncode == 0
    for flag in ["--workers-per-process", "--process-id", "--addresses", "--epoch-interval",
                 "--local-state-dir", "--backup", "--snapshot-mode", "MILLPOND_BACKUP", "--version"]:
        assert flag in out.stdout
    help_text = " ".join(out.stdout.split())
    assert "they take turns on one thread and split the keys" in help_text
    assert "thread" not in help_text.replace("on one thread", "")
    assert "exit status: 0 the flow finished; 2 something was wrong before it started" in help_text
    assert "The full table is in docs/cli.md." in help_text
    assert "Coming from Bytewax" in help_text
    assert "[-r" not in help_text and "--backup-interval BACKUP" not in help_text  # Bytewax's are hidden


def test_subprocess_version(tmp_path):
    out = _run_cli(["--version"], tmp_path)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"millpond {millpond.__version__}\n", "")


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the following arguments are required: IMPORT_STR"),
        (["no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["flow_mod:missing"], "'flow_mod' has no attribute 'missing'"),
        (["flow_mod:number"], "not a millpond.dataflow.Dataflow"),
        (["flow_mod:make(-1)"], "make(...) raised ValueError: bad n"),
        (["flow_mod.py:make(x)"], "is not a literal"),
        (["nope.py"], "no such file: nope.py"),
        (["-w", "zero", "flow_mod"], "expected a positive integer"),
    ],
)
def test_subprocess_errors_are_one_line_without_traceback(tmp_path, args, message):
    (tmp_path / "flow_mod.py").write_text(
        "from millpond.dataflow import Dataflow\nnumber = 1\n"
        "def make(n):\n    if n < 0:\n        raise ValueError('bad n')\n    return Dataflow('f')\n"
    )
    out = _run_cli(args, tmp_path)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert message in out.stderr


# These run real flows and wait for the engine (millpond.operators,
# millpond.testing) and, with -d, the Go extension.

_COPY_FLOW = """
import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.connectors.files import FileSource, FileSink
from millpond.inputs import SimplePollingSource
from datetime import timedelta
import time


def get_flow(src, dst, fail_on=None, delay=0.0):
    flow = Dataflow("copy")
    lines = op.input("in", flow, FileSource(src, batch_size=2))

    def check(line):
        if line == fail_on:
            raise ValueError(f"refusing {line!r}")
        if delay:
            time.sleep(delay)
        return line.upper()

    upper = op.map("upper", lines, check)
    op.output("out", op.key_on("all", upper, lambda _x: "all"), FileSink(dst))
    return flow


class Forever(SimplePollingSource):
    def next_item(self):
        return "tick"


def forever():
    flow = Dataflow("forever")
    ticks = op.input("in", flow, Forever(timedelta(milliseconds=10)))
    op.inspect("seen", ticks, lambda _s, _x: open("started", "w").close())
    op.output("out", op.key_on("k", ticks, lambda _x: "k"), FileSink("ticks.txt"))
    return flow
"""


@pytest.fixture
def copy_flow(tmp_path):
    (tmp_path / "copyflow.py").write_text(_COPY_FLOW)
    (tmp_path / "in.txt").write_text("".join(f"line {i}\n" for i in range(7)))
    return tmp_path


def test_subprocess_runs_a_file_to_file_flow(copy_flow):
    out = _run_cli(['copyflow:get_flow("in.txt", "out.txt")', "-s", "0"], copy_flow)
    assert out.returncode == 0, out.stderr
    assert (copy_flow / "out.txt").read_text() == "".join(f"LINE {i}\n" for i in range(7))


def test_subprocess_runs_with_several_workers(copy_flow):
    out = _run_cli(['copyflow.py:get_flow("in.txt", "out.txt")', "-w", "2"], copy_flow)
    assert out.returncode == 0, out.stderr
    assert sorted((copy_flow / "out.txt").read_text().splitlines()) == sorted(f"LINE {i}" for i in range(7))


def test_subprocess_user_error_reports_step_and_cause_in_two_lines(copy_flow):
    out = _run_cli(['copyflow:get_flow("in.txt", "out.txt", fail_on="line 3")'], copy_flow)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    # INFO log lines of the run come first; the error is the last two lines.
    assert lines[-2].startswith("python -m millpond.run: the dataflow failed:")
    assert "upper" in lines[-2] and "refusing 'line 3'" in lines[-2]
    assert "copyflow.py:" in lines[-1] and "in check" in lines[-1]
    assert "Traceback" not in out.stderr


def test_subprocess_with_recovery_continues_after_eof_without_duplicating(copy_flow):
    args = ['copyflow:get_flow("in.txt", "out.txt")', "-d", "state", "-s", "0"]
    first = _run_cli(args, copy_flow)
    assert first.returncode == 0, first.stderr
    with open(copy_flow / "in.txt", "a") as f:
        f.write("line 7\n")
    second = _run_cli([*args, "--snapshot-mode", "immediate"], copy_flow)
    assert second.returncode == 0, second.stderr
    assert (copy_flow / "out.txt").read_text() == "".join(f"LINE {i}\n" for i in range(8))


def test_subprocess_local_state_dir_with_missing_parents_is_made(copy_flow):
    out = _run_cli(['copyflow:get_flow("in.txt", "out.txt")', "-d", "a/b/c", "-s", "0"], copy_flow)
    assert out.returncode == 0, out.stderr
    assert (copy_flow / "a" / "b" / "c" / "copy").is_dir()
    assert (copy_flow / "a" / "b" / "c" / "backup").is_dir()  # the default backup, DIR/backup
    assert (copy_flow / "out.txt").read_text() == "".join(f"LINE {i}\n" for i in range(7))


@pytest.mark.parametrize(
    "args, message",
    [
        (["-d", "afile"], "-d/--local-state-dir afile: exists and is not a directory; name a directory, or a "
         "path that does not exist yet (it is made, with its parents)"),
        (["-d", "st", "-b", "/nonexistent/dir"], "-b/--backup /nonexistent/dir: backup directory "
         "/nonexistent/dir does not exist, and neither does its parent /nonexistent; only the last part is "
         "created, so check the path (a typo, an unmounted volume?)"),
        (["-d", "st", "-b", "afile"], "-b/--backup afile: backup directory {cwd}/afile exists and is not a "
         "directory; name a directory, or a path that does not exist yet in an existing directory (it is "
         "created)"),
        (["-d", "st", "-b", "s3://"], "-b/--backup s3://: has no bucket: write s3://BUCKET or s3://BUCKET/PREFIX"),
        (["-d", "st", "-b", "60"], "-b/--backup 60: -b takes a backup URI or directory, not a number; "
         "millpond has no backup interval: every committed epoch is backed up (see -s/--epoch-interval). "
         "For a directory named 60, write ./60"),
        (["-r", "state"], _BYTEWAX_RECOVERY_DIRECTORY),
    ],
)
def test_subprocess_bad_recovery_settings_exit_2_with_one_line(copy_flow, args, message):
    (copy_flow / "afile").write_text("")
    out = _run_cli(['copyflow:get_flow("in.txt", "out.txt")', *args], copy_flow)
    cwd = str(copy_flow.resolve())
    assert (out.returncode, out.stderr) == (2, f"python -m millpond.run: error: {message.format(cwd=cwd)}\n")
    assert "mkdir" not in out.stderr
    assert not (copy_flow / "st").exists() and not (copy_flow / "60").exists()


def _closed_port() -> str:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _run_cli_s3(args, cwd, server=None):
    from helpers.s3server import child_env

    env = child_env(server)
    env["PYTHONPATH"] = PYSRC
    return subprocess.run([sys.executable, "-m", "millpond.run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _error_lines(stderr: str) -> List[str]:
    """stderr without the run's log lines (``TIME LEVEL logger: ...``)."""
    return [line for line in stderr.splitlines() if not line[:4].isdigit()]


def test_subprocess_unreachable_s3_endpoint_is_one_readable_line_exit_1(copy_flow):
    endpoint = _closed_port()
    uri = f"s3://flows/cli?endpoint={endpoint}&region=us-east-1&max_attempts=1"
    out = _run_cli_s3(['copyflow:get_flow("in.txt", "out.txt")', "-d", "st", "-b", uri], copy_flow)
    assert out.returncode == 1, out.stderr
    (line,) = _error_lines(out.stderr)
    assert line.startswith("python -m millpond.run: error: BackupError: "), line
    assert line.endswith(
        f'cannot reach S3 endpoint {endpoint} for bucket "flows" (connection refused, 1 attempt); '
        "check the endpoint URL and that the server is running"
    ), line
    assert "operation error" not in line and "StatusCode" not in line and "SDK" not in out.stderr


def test_subprocess_missing_s3_bucket_is_one_readable_line_exit_1(copy_flow, s3_server):
    uri = f"s3://no-such-bucket/cli?endpoint={s3_server.endpoint}&region=us-east-1&max_attempts=1"
    out = _run_cli_s3(['copyflow:get_flow("in.txt", "out.txt")', "-d", "st", "-b", uri], copy_flow, s3_server)
    assert out.returncode == 1, out.stderr
    (line,) = _error_lines(out.stderr)
    assert line.startswith("python -m millpond.run: error: BackupError: "), line
    assert line.endswith(
        f'bucket "no-such-bucket" does not exist at {s3_server.endpoint}; check the bucket name in the URI, '
        "or create the bucket"
    ), line
    assert "SDK" not in out.stderr


def test_subprocess_runs_with_an_s3_backup(copy_flow, s3_server):
    out = _run_cli_s3(['copyflow:get_flow("in.txt", "out.txt")', "-d", "st", "-s", "0", "-b",
                       s3_server.uri("cli-ok")], copy_flow, s3_server)
    assert out.returncode == 0, out.stderr
    assert _error_lines(out.stderr) == []
    assert any(k.startswith("cli-ok/copy/") for k in s3_server.objects("cli-ok/"))


def test_subprocess_file_to_file_flow_killed_with_sigkill_is_exactly_once(copy_flow):
    import random

    lines = [f"line {i}" for i in range(600)]
    (copy_flow / "in.txt").write_text("".join(x + "\n" for x in lines))
    argv = [sys.executable, "-m", "millpond.run", 'copyflow:get_flow("in.txt", "out.txt", delay=0.002)',
            "-d", "state", "-s", "0.05"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env["PYTHONPATH"] = PYSRC
    rng = random.Random(4)
    for _ in range(3):
        proc = subprocess.Popen(argv, cwd=copy_flow, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.3, 1.0))
        proc.kill()
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode in (-signal.SIGKILL, 0), err
    final = _run_cli(argv[3:], copy_flow, timeout=300)
    assert final.returncode == 0, final.stderr
    assert (copy_flow / "out.txt").read_text() == "".join(x.upper() + "\n" for x in lines)


def test_subprocess_ctrl_c_exits_130_without_traceback(copy_flow):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env["PYTHONPATH"] = PYSRC
    proc = subprocess.Popen(
        [sys.executable, "-m", "millpond.run", "copyflow:forever()"],
        cwd=copy_flow, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if (copy_flow / "started").exists():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err


# --- the examples, run as their docstrings say -------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_example_wordcount_counts_every_word(tmp_path):
    import collections
    import importlib.util

    spec = importlib.util.spec_from_file_location("wordcount_example", EXAMPLES / "wordcount.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "The cat and the hat.\nA cat's hat, THE end!\n\n42 cats\n"
    (tmp_path / "in.txt").write_text(text)
    out = _run_cli([f'{EXAMPLES}/wordcount.py:get_flow("in.txt", "counts.tsv")', "-w", "2"], tmp_path)
    assert out.returncode == 0, out.stderr
    got = dict(line.split("\t") for line in (tmp_path / "counts.tsv").read_text().splitlines())
    expected = collections.Counter(w for line in text.splitlines() for w in module.words(line))
    assert {k: int(v) for k, v in got.items()} == dict(expected)
    assert expected["the"] == 3 and expected["cat's"] == 1 and expected["42"] == 1


def test_example_wordcount_keeps_digits_in_words():
    import importlib.util

    spec = importlib.util.spec_from_file_location("wordcount_example", EXAMPLES / "wordcount.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The generated input of docs/getting-started.md: words w0 ... w4999.
    assert module.words("w12 w3 w12 2024") == ["w12", "w3", "w12", "2024"]
    assert module.words("Don't stop_now, A-1!") == ["don't", "stop", "now", "a", "1"]


def test_example_csv_totals_runs_as_its_docstring_says_on_the_shipped_sample(tmp_path):
    shutil.copytree(EXAMPLES, tmp_path / "examples")  # the command is run from the repository root
    doc = (EXAMPLES / "csv_totals.py").read_text()
    command = next(line.strip() for line in doc.splitlines() if line.strip().startswith("python -m millpond.run"))
    args = shlex.split(command)[3:]
    out = _run_cli(args, tmp_path)
    assert out.returncode == 0, out.stderr
    files = sorted((tmp_path / "totals").iterdir())
    assert [f.name for f in files] == ["totals_0.txt", "totals_1.txt"]
    lines = [line for f in files for line in f.read_text().splitlines()]
    rows = (EXAMPLES / "data" / "orders.csv").read_text().splitlines()[1:]
    assert len(lines) == len(rows)
    ann = next(f.read_text().splitlines() for f in files if "ann," in f.read_text())
    assert [line for line in ann if line.startswith("ann,")] == ["ann,12.50", "ann,19.75", "ann,49.75"]


def test_example_csv_totals_writes_running_totals_per_customer(tmp_path):
    (tmp_path / "orders.csv").write_text("customer,amount\nann,1.50\nbob,2\nann,3\n")
    out = _run_cli([f'{EXAMPLES}/csv_totals.py:get_flow("orders.csv", "totals")', "-w", "2"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = []
    for f in sorted((tmp_path / "totals").iterdir()):
        lines.extend(f.read_text().splitlines())
    assert sorted(lines) == ["ann,1.50", "ann,4.50", "bob,2.00"]
    ann_file = [f for f in (tmp_path / "totals").iterdir() if "ann" in f.read_text()]
    assert len(ann_file) == 1  # a customer's lines all go to one file, in order
    assert ann_file[0].read_text().splitlines()[:2] == ["ann,1.50", "ann,4.50"]


def test_example_polling_prints_the_requested_samples(tmp_path):
    out = _run_cli([f"{EXAMPLES}/polling.py:get_flow(samples=3, interval=0.05)"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(" load=" in line for line in lines)


_UNPICKLABLE = '''
import millpond.operators as op
from millpond.connectors.stdio import StdOutSink
from millpond.dataflow import Dataflow
from millpond.testing import TestingSource


class Holder:
    def __init__(self, state):
        self.n = state or 0

    def on_batch(self, values):
        return values, False

    def snapshot(self):
        {snapshot}


def get_flow():
    flow = Dataflow("unpicklable")
    keyed = op.key_on("key", op.input("in", flow, TestingSource(["a", "b"])), lambda x: x)
    op.output("out", op.stateful_batch("hold", keyed, Holder), StdOutSink())
    return flow
'''


@pytest.mark.parametrize(
    "snapshot, raised_at",
    [
        ("return lambda: None  # not picklable", False),
        ("raise ValueError('no snapshot today')", True),
    ],
    ids=["unpicklable", "snapshot raises"],
)
def test_subprocess_a_snapshot_error_is_printed_once(tmp_path, snapshot, raised_at):
    (tmp_path / "unpick.py").write_text(_UNPICKLABLE.replace("{snapshot}", snapshot))
    out = _run_cli(["unpick:get_flow()", "-d", "state"], tmp_path)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if not line[:4].isdigit()]  # log lines start with a date
    assert errors[0].startswith("python -m millpond.run: the dataflow failed: error on worker 0 at the close of epoch 1: "
                                "cannot snapshot state of step 'unpicklable.hold' key 'a': ")
    assert out.stderr.count("cannot snapshot") == 1, out.stderr
    if raised_at:
        assert errors[1:] == [errors[1]] and errors[1].startswith("  raised at ") and "unpick.py:16 in snapshot" in errors[1]
    else:
        assert errors[1:] == []
    assert " finished: " not in out.stderr
