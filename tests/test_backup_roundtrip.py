"""millpond.backup against the Go core: DirBackup, S3Backup (over the
mp-s3server test binary, checked with boto3), backup_from_uri, and the
errors for missing keys and unknown schemes."""

from __future__ import annotations

from pathlib import Path

import pytest

from millpond.backup import Backup, DirBackup, S3Backup, backup_from_uri

from helpers.s3server import run_child


def _roundtrip(b, tmp_path: Path, prefix: str = "job") -> None:
    src = tmp_path / "src.bin"
    payload = bytes(range(256)) * 40 + b"tail"
    src.write_bytes(payload)
    assert b.list_keys() == [] or all(not k.startswith(prefix) for k in b.list_keys())
    b.upload(src, f"{prefix}/b/two")
    b.upload(str(src), f"{prefix}/a/one")
    (tmp_path / "small").write_bytes(b"x")
    b.upload(tmp_path / "small", f"{prefix}/a/zero")
    assert b.list_keys(f"{prefix}/") == [f"{prefix}/a/one", f"{prefix}/a/zero", f"{prefix}/b/two"]
    assert b.list_keys(f"{prefix}/a/") == [f"{prefix}/a/one", f"{prefix}/a/zero"]
    assert b.list_keys(f"{prefix}/nothing") == []
    assert b.list_objects(f"{prefix}/a/") == [(f"{prefix}/a/one", len(payload)), (f"{prefix}/a/zero", 1)]
    dst = tmp_path / "dst.bin"
    b.download(f"{prefix}/b/two", dst)
    assert dst.read_bytes() == payload
    # overwrite replaces the object
    b.upload(tmp_path / "small", f"{prefix}/b/two")
    b.download(f"{prefix}/b/two", str(dst))
    assert dst.read_bytes() == b"x"
    with pytest.raises(FileNotFoundError, match="missing"):
        b.download(f"{prefix}/missing", tmp_path / "never")
    b.delete(f"{prefix}/a/one")
    b.delete(f"{prefix}/a/one")  # deleting a missing key is fine
    b.delete(f"{prefix}/never/was")
    assert b.list_keys(f"{prefix}/") == [f"{prefix}/a/zero", f"{prefix}/b/two"]
    with pytest.raises(FileNotFoundError):
        b.download(f"{prefix}/a/one", tmp_path / "never")


def test_dir_backup_round_trip(tmp_path):
    root = tmp_path / "bk"
    b = DirBackup(root)
    assert isinstance(b, Backup)
    _roundtrip(b, tmp_path)
    assert (root / "job" / "a" / "zero").read_bytes() == b"x"
    assert not (root / "job" / "a" / "one").exists()
    # no temp files left behind by uploads
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert names == ["job/a/zero", "job/b/two"]
    b.close()
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.list_keys()


@pytest.mark.parametrize("form", ["path", "file"])
def test_backup_from_uri_dir_forms(tmp_path, form):
    root = tmp_path / "bk"
    uri = str(root) if form == "path" else f"file://{root}"
    b = backup_from_uri(uri)
    assert isinstance(b, DirBackup)
    _roundtrip(b, tmp_path)
    # the same directory seen through a second handle
    assert DirBackup(root).list_keys() == ["job/a/zero", "job/b/two"]


@pytest.mark.parametrize("uri", ["ftp://host/x", "gs://bucket/x", "http://127.0.0.1/x"])
def test_unknown_scheme_is_a_value_error_listing_the_supported_ones(uri):
    with pytest.raises(ValueError, match="unknown backup URI scheme") as exc:
        backup_from_uri(uri)
    assert "s3://" in str(exc.value) and "file://" in str(exc.value)


@pytest.mark.parametrize("bad", ["", None])
def test_empty_uri_is_rejected(bad):
    with pytest.raises(ValueError):
        backup_from_uri(bad)


# The core's S3 backend runs in a child Python that starts with the test
# credentials (see s3server.py); the parent checks the bucket with boto3.

_S3_ROUNDTRIP = """
import os, sys
from pathlib import Path
from millpond.backup import S3Backup, backup_from_uri
from test_backup_roundtrip import _roundtrip
ep = os.environ["MP_TEST_S3_ENDPOINT"]
tmp = Path(sys.argv[1])
b = S3Backup("flows", "rt1", endpoint_url=ep, region="us-east-1")
b.check()
_roundtrip(b, tmp, prefix="p")
b.close()
b = backup_from_uri(f"s3://flows/rt2?endpoint={ep}&region=us-east-1")
assert isinstance(b, S3Backup), b
_roundtrip(b, tmp, prefix="q")
print("ok")
"""


def test_s3_backup_round_trip_lands_in_the_bucket(tmp_path, s3_server):
    res = run_child(_S3_ROUNDTRIP, s3_server, tmp_path, str(tmp_path))
    assert res.stdout.strip() == "ok"
    assert s3_server.objects("rt1/") == {"rt1/p/a/zero": 1, "rt1/p/b/two": 1}
    assert s3_server.get("rt1/p/a/zero") == b"x"
    assert s3_server.objects("rt2/") == {"rt2/q/a/zero": 1, "rt2/q/b/two": 1}


def test_s3_backup_sees_objects_of_other_clients_only_under_its_prefix(tmp_path, s3_server):
    c = s3_server.client()
    c.put_object(Bucket="flows", Key="rt3/q/c", Body=b"from boto3")
    c.put_object(Bucket="flows", Key="rt3x/q/c", Body=b"no")
    c.put_object(Bucket="flows", Key="elsewhere/q/c", Body=b"no")
    code = """
import os, sys
from millpond.backup import backup_from_uri
b = backup_from_uri(os.environ["MP_TEST_S3_URI_BASE"] + "/rt3?endpoint=" + os.environ["MP_TEST_S3_ENDPOINT"])
print(b.list_keys())
b.download("q/c", sys.argv[1])
"""
    res = run_child(code, s3_server, tmp_path, str(tmp_path / "c"))
    assert res.stdout.strip() == "['q/c']"
    assert (tmp_path / "c").read_bytes() == b"from boto3"


def test_s3_backup_large_object_round_trip(tmp_path, s3_server):
    import hashlib
    import os

    data = os.urandom(1 << 16) * 200  # 12.5 MiB: more than one part of a multipart upload
    (tmp_path / "big").write_bytes(data)
    code = """
import os, sys
from millpond.backup import backup_from_uri
b = backup_from_uri(os.environ["MP_TEST_S3_URI_BASE"] + "/big?part_size=5242880&endpoint=" + os.environ["MP_TEST_S3_ENDPOINT"])
b.upload(sys.argv[1] + "/big", "seg")
b.download("seg", sys.argv[1] + "/back")
"""
    run_child(code, s3_server, tmp_path, str(tmp_path))
    assert s3_server.objects("big/") == {"big/seg": len(data)}
    assert hashlib.sha256(s3_server.get("big/seg")).digest() == hashlib.sha256(data).digest()
    assert (tmp_path / "back").read_bytes() == data


def test_s3_backup_needs_a_bucket():
    with pytest.raises(ValueError, match="bucket"):
        S3Backup("")


def test_s3_backup_to_a_missing_bucket_names_it(tmp_path, s3_server):
    code = """
import os
from millpond.backup import backup_from_uri
b = backup_from_uri("s3://nosuchbucket/x?region=us-east-1&endpoint=" + os.environ["MP_TEST_S3_ENDPOINT"])
b.check()
"""
    res = run_child(code, s3_server, tmp_path, check=False)
    assert res.returncode != 0
    assert "BackupError" in res.stderr and "nosuchbucket" in res.stderr


_ENV_AFTER_START = """
import os, sys
os.environ["AWS_ACCESS_KEY_ID"] = "test"
os.environ["AWS_SECRET_ACCESS_KEY"] = "test"
from millpond.backup import backup_from_uri   # the core is loaded after this point
b = backup_from_uri(os.environ["MP_TEST_S3_URI_BASE"] + "/envp?region=us-east-1&endpoint=" + os.environ["MP_TEST_S3_ENDPOINT"])
print(b.list_keys())
"""


def test_s3_credentials_set_in_os_environ_are_used(tmp_path, s3_server):
    res = run_child(_ENV_AFTER_START, s3_server, tmp_path, aws=False, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"
