"""An S3-protocol test server for pytest: ``gostore/cmd/mp-s3server``.

Import the fixtures into a test module::

    from helpers.s3server import s3_server, s3_env  # noqa: F401  (pytest fixtures)

``s3_server`` builds the binary once per session (``go build``, cwd = repo
root), starts it on 127.0.0.1 with a bucket ``flows``, and always stops it
afterwards. It yields an :class:`S3Server` with the endpoint, a ``uri()``
helper for ``s3://flows/PREFIX?endpoint=...&region=us-east-1`` and a boto3
client to check what really landed in the bucket.

Credentials: the Go core reads ``AWS_*`` with Go's ``os.Getenv``, which in
a c-shared library sees only the environment the *process started with*;
setting ``os.environ`` in the test process, even before the extension is
loaded, does not reach it (see the xfail in test_backup_roundtrip.py). So
whatever drives the core's S3 backend runs in a child Python started with
the test credentials: :func:`run_child`. boto3 checks run in-process.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
BUCKET = "flows"
REGION = "us-east-1"
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_REGION": REGION,
}

_build_lock = threading.Lock()
_binary: Optional[Path] = None
_build_dir: Optional[str] = None


def build_binary() -> Path:
    """``go build`` the server once per process; return the binary's path."""
    global _binary, _build_dir
    with _build_lock:
        if _binary is None:
            if shutil.which("go") is None:
                pytest.skip("the go toolchain is needed to build mp-s3server")
            _build_dir = tempfile.mkdtemp(prefix="mp-s3server-")
            atexit.register(shutil.rmtree, _build_dir, True)
            target = Path(_build_dir) / "mp-s3server"
            res = subprocess.run(
                ["go", "build", "-o", str(target), "./gostore/cmd/mp-s3server"],
                cwd=REPO, capture_output=True, text=True, timeout=300,
            )
            if res.returncode != 0:
                raise RuntimeError(f"go build ./gostore/cmd/mp-s3server failed:\n{res.stderr}")
            _binary = target
        return _binary


@dataclass
class S3Server:
    endpoint: str
    proc: "subprocess.Popen[str]"
    bucket: str = BUCKET

    def uri(self, prefix: str) -> str:
        """A backup URI for ``prefix`` in the test bucket."""
        return f"s3://{self.bucket}/{prefix}?endpoint={self.endpoint}&region={REGION}"

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id="test", aws_secret_access_key="test",
        )

    def objects(self, prefix: str = "") -> dict:
        """``{key: size}`` of every object under ``prefix``, listed with boto3."""
        out = {}
        paginator = self.client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = obj["Size"]
        return out

    def get(self, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()


def start_server(binary: Path, buckets: List[str] = [BUCKET]) -> S3Server:
    args = [str(binary), "-addr", "127.0.0.1:0"]
    for b in buckets:
        args += ["-bucket", b]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        m = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)\n", line)
        if not m:
            raise RuntimeError(f"mp-s3server did not print its address; got {line!r}")
    except BaseException:
        stop_server(proc)
        raise
    return S3Server(endpoint=m.group(1), proc=proc, bucket=buckets[0])


def stop_server(proc: "subprocess.Popen[str]") -> Optional[int]:
    """SIGTERM, then SIGKILL if it does not exit; return its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for f in (proc.stdout, proc.stderr):
        if f:
            f.close()
    return proc.returncode


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = start_server(build_binary())
    try:
        yield server
    finally:
        stop_server(server.proc)


def child_env(server: Optional[S3Server] = None, aws: bool = True) -> dict:
    """Environment for a child Python: repo sources and tests importable,
    test credentials (``aws=False`` leaves every AWS_* out), the endpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MILLPOND_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "pysrc"), str(REPO / "tests")])
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["AWS_CONFIG_FILE"] = os.devnull
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    if aws:
        env.update(TEST_ENV)
    if server is not None:
        env["MP_TEST_S3_ENDPOINT"] = server.endpoint
        env["MP_TEST_S3_URI_BASE"] = f"s3://{server.bucket}"
    return env


def run_child(code: str, server: Optional[S3Server], cwd: Path, *args: str, aws: bool = True,
              timeout: float = 120, check: bool = True) -> "subprocess.CompletedProcess[str]":
    """Run ``python -c code args...`` with :func:`child_env`; with ``check``,
    fail the test (showing stderr) unless it exits 0."""
    import sys

    res = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=child_env(server, aws),
        capture_output=True, text=True, timeout=timeout,
    )
    if check and res.returncode != 0:
        pytest.fail(f"child exited {res.returncode}:\n{res.stderr[-4000:]}", pytrace=False)
    return res
