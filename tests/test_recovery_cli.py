"""``python -m millpond.recovery inspect|verify``: its help, the backups it
takes (every form ``-b`` of ``python -m millpond.run`` takes, a Python
``module:factory()`` included), ``--flow``, and its exit statuses: 0 done,
1 a problem found or the backup failed, 2 a bad argument (one line).

The recovery data comes from real runs in this process; the command runs
in a child Python, as a user runs it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, List

import pytest

import millpond
import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.recovery import RecoveryConfig
from millpond.testing import TestingSink, TestingSource, run_main

from helpers.s3server import child_env

PYSRC = str(Path(millpond.__file__).resolve().parent.parent)
PROG = "python -m millpond.recovery"


def _flow(flow_id: str, words: List[str], out: List[Any]) -> Dataflow:
    flow = Dataflow(flow_id)
    keyed = op.key_on("key", op.input("in", flow, TestingSource(words)), lambda w: w)
    counts = op.stateful_map("count", keyed, lambda n, _w: ((n or 0) + 1, (n or 0) + 1))
    op.output("out", counts, TestingSink(out))
    return flow


@pytest.fixture(scope="module")
def backup_dir(tmp_path_factory) -> Path:
    """A backup directory holding two flows, 'wc' and 'totals'."""
    root = tmp_path_factory.mktemp("recovery-cli")
    for flow_id in ("wc", "totals"):
        run_main(_flow(flow_id, ["a", "b", "a"], []),
                 recovery_config=RecoveryConfig(root / "state", backup=str(root / "backup")))
    return root / "backup"


def recovery_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> "subprocess.CompletedProcess[str]":
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env["PYTHONPATH"] = PYSRC
    return subprocess.run([sys.executable, "-m", "millpond.recovery", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


# --- --help --------------------------------------------------------------------------


def test_help_lists_the_commands_the_backup_forms_and_the_exit_statuses():
    out = recovery_cli("--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert text.startswith(f"usage: {PROG} [-h] {{inspect,verify}} ...")
    assert "inspect summarize each flow" in text and "verify check every object's checksum" in text
    assert "BACKUP is what -b of python -m millpond.run takes" in text and "'MODULE:FACTORY()'" in text
    assert ("exit status: 0 done (verify: no problem found); 1 verify found a problem, the backup holds no "
            "recovery data, or the backup failed (unreachable, denied); 2 a bad argument") in text


@pytest.mark.parametrize("cmd, options", [("inspect", ["--flow ID", "--keys", "--json"]), ("verify", ["--flow ID"])])
def test_subcommand_help(cmd, options):
    out = recovery_cli(cmd, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: {PROG} {cmd} [-h]")
    for option in options:
        assert option in out.stdout
    assert "BACKUP" in out.stdout and "Exit status: 0" in " ".join(out.stdout.split())


# --- --flow -------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["verify", "inspect"])
def test_a_flow_that_is_not_in_the_backup_exits_2_and_lists_the_flows_there(backup_dir, cmd):
    out = recovery_cli(cmd, str(backup_dir), "--flow", "wcc")
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"{PROG}: error: --flow wcc: no flow 'wcc' in {backup_dir}; the flows there: totals, wc\n"
    )


def test_flow_in_an_empty_backup_exits_2(tmp_path):
    out = recovery_cli("verify", str(tmp_path), "--flow", "wc")
    assert out.returncode == 2
    assert out.stderr == f"{PROG}: error: --flow wc: no flow 'wc' in {tmp_path}; it holds no millpond recovery data\n"


#: What verify says on stderr when no backup key is configured.
NO_KEY_NOTE = (f"{PROG}: note: no backup key (MILLPOND_BACKUP_KEY): checked integrity (checksums), "
               "not authenticity; anyone with write access to the backup could have rewritten it\n")


def test_verify_one_flow_and_every_flow(backup_dir):
    out = recovery_cli("verify", str(backup_dir), "--flow", "wc")
    assert (out.returncode, out.stdout, out.stderr) == (0, "wc: ok\n", NO_KEY_NOTE)
    out = recovery_cli("verify", str(backup_dir))
    assert (out.returncode, out.stdout, out.stderr) == (0, "totals: ok\nwc: ok\n", NO_KEY_NOTE)


def test_inspect_one_flow(backup_dir):
    out = recovery_cli("inspect", f"file://{backup_dir}", "--flow", "totals", "--keys")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "flow totals" and not any(line == "flow wc" for line in lines)
    assert "  keys totals.count.stateful_batch" in out.stdout


# --- BACKUP: every form -b takes --------------------------------------------------------


_FACTORY = """
import os
import shutil
from pathlib import Path


class PyDirBackup:
    '''A backup over a directory, in plain Python.'''

    def __init__(self, root):
        self.root = Path(root)

    def list_keys(self, prefix=""):
        keys = (str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix) and ".tmp" not in k)

    def upload(self, from_local, to_key):
        raise OSError("read-only")

    def download(self, from_key, to_local):
        src = self.root / from_key
        if not src.is_file():
            raise FileNotFoundError(from_key)
        shutil.copyfile(src, to_local)

    def delete(self, key):
        raise OSError("read-only")


def make(root):
    return PyDirBackup(root)


def not_a_backup():
    return 42


def broken():
    raise RuntimeError("vault sealed")
"""


@pytest.fixture
def factory_dir(tmp_path) -> Path:
    (tmp_path / "mybackups.py").write_text(textwrap.dedent(_FACTORY))
    return tmp_path


def test_inspect_takes_a_python_backup_factory(backup_dir, factory_dir):
    spec = f"mybackups:make({str(backup_dir)!r})"
    out = recovery_cli("inspect", spec, "--flow", "wc", "--keys", cwd=factory_dir)
    assert out.returncode == 0, out.stderr
    by_dir = recovery_cli("inspect", str(backup_dir), "--flow", "wc", "--keys").stdout.splitlines()
    # The same report, except that a Python backup's listing has no sizes.
    assert out.stdout.splitlines() == [
        "  stored in total  3 objects (this backup does not report sizes)" if line.startswith("  stored in total")
        else line for line in by_dir
    ]
    out = recovery_cli("inspect", f"mybackups.py:make({str(backup_dir)!r})", "--flow", "nope", cwd=factory_dir)
    assert out.returncode == 2
    assert out.stderr.endswith("; the flows there: totals, wc\n")


def test_verify_takes_a_python_backup_factory(backup_dir, factory_dir):
    out = recovery_cli("verify", f"mybackups:make({str(backup_dir)!r})", cwd=factory_dir)
    assert (out.returncode, out.stdout, out.stderr) == (0, "totals: ok\nwc: ok\n", NO_KEY_NOTE)


@pytest.mark.parametrize(
    "target, message",
    [
        ("mybackups:not_a_backup()", "BACKUP mybackups:not_a_backup(): mybackups:not_a_backup(...) gave 42 "
         "(of type int), which is not a backup: it has no list_keys(), upload(), download(), delete() "
         "(see millpond.backup.Backup)"),
        ("mybackups:broken()", "BACKUP mybackups:broken(): mybackups:broken(...) raised RuntimeError: vault "
         "sealed (at {cwd}/mybackups.py:"),
        ("nomodule:make('x')", "BACKUP nomodule:make('x'): no module named 'nomodule'"),
        ("mybackups:make", "BACKUP mybackups:make: mybackups:make is a function, not a backup; to call a "
         "factory write 'mybackups:make()'"),
        ("missing/dir", "BACKUP missing/dir: no such directory"),
        ("file:///nonexistent/dir", "BACKUP file:///nonexistent/dir: no such directory"),
        ("mybackups.py", "BACKUP mybackups.py: exists and is not a directory"),
        ("s3://", 'BACKUP s3://: backup URI "s3://" has no bucket: write s3://BUCKET or s3://BUCKET/PREFIX'),
        ("s3:/flows", 'BACKUP s3:/flows: backup URI "s3:/flows": an S3 URI starts with s3:// (two slashes)'),
        ("gs://b/p", "BACKUP gs://b/p: unknown backup URI scheme 'gs' in 'gs://b/p'; use one of: a plain "
         "path, file:///path, s3://bucket/prefix"),
    ],
)
def test_a_backup_that_cannot_be_opened_exits_2_with_one_line(factory_dir, target, message):
    out = recovery_cli("inspect", target, cwd=factory_dir)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    cwd = str(factory_dir.resolve())
    assert out.stderr.startswith(f"{PROG}: error: " + message.format(cwd=cwd)), out.stderr
    assert not (factory_dir / "missing").exists()  # the tools only read: nothing is created


def test_an_empty_backup_exits_1(tmp_path):
    out = recovery_cli("verify", str(tmp_path))
    assert (out.returncode, out.stderr) == (1, f"{PROG}: no millpond recovery data in {tmp_path}\n")


def test_a_damaged_object_makes_verify_exit_1(backup_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(backup_dir, copy)
    victim = next(p for p in sorted((copy / "wc").rglob("*.sqlite")))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    out = recovery_cli("verify", str(copy))
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert "totals: ok" in lines
    assert any(line.startswith(f"wc: {victim.relative_to(copy)}: checksum mismatch") for line in lines), out.stdout


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: {inspect,verify}"),
    (["frob", "x"], "argument {inspect,verify}: invalid choice: 'frob'"),
    (["inspect"], "the following arguments are required: BACKUP"),
    (["verify", "x", "--keys"], "unrecognized arguments: --keys"),
])
def test_bad_usage_exits_2_with_one_line(argv, message):
    out = recovery_cli(*argv)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and message in out.stderr and out.stderr.endswith("(see --help)\n")


# --- S3 -------------------------------------------------------------------------------------


def test_an_unreachable_s3_endpoint_exits_1_with_one_readable_line():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    out = recovery_cli("inspect", f"s3://flows/x?endpoint={endpoint}&region=us-east-1&max_attempts=1",
                       env=child_env(None))
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"{PROG}: error: "), out.stderr
    assert out.stderr.endswith(
        f'cannot reach S3 endpoint {endpoint} for bucket "flows" (connection refused, 1 attempt); '
        "check the endpoint URL and that the server is running\n"
    ), out.stderr
    assert "operation error" not in out.stderr


def test_inspect_and_verify_an_s3_backup(tmp_path, s3_server):
    from helpers.s3server import run_child

    code = textwrap.dedent("""
        import sys
        from millpond.recovery import RecoveryConfig
        from millpond.testing import run_main
        from test_recovery_cli import _flow
        run_main(_flow("wc", ["a", "b"], []), recovery_config=RecoveryConfig(sys.argv[1], backup=sys.argv[2]))
    """)
    uri = s3_server.uri("recovery-cli")
    run_child(code, s3_server, tmp_path, str(tmp_path / "state"), uri)
    out = recovery_cli("verify", uri, env=child_env(s3_server))
    assert (out.returncode, out.stdout, out.stderr) == (0, "wc: ok\n", NO_KEY_NOTE)
    out = recovery_cli("verify", uri, "--flow", "w", env=child_env(s3_server))
    assert (out.returncode, out.stderr) == (2, f"{PROG}: error: --flow w: no flow 'w' in {uri}; the flows there: wc\n")
