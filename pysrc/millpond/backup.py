"""Durable stores for recovery data: the ``Backup`` protocol and its backends.

A backup holds flat, ``/``-separated keys. Uploads are atomic: a reader
never lists a half-written object. :class:`DirBackup` (a directory on a
local or network filesystem) and :class:`S3Backup` (S3 or an S3-compatible
server) are implemented in the Go core; any Python object with the four
methods of :class:`Backup` works too, for stores the core does not speak.

>>> import tempfile
>>> b = backup_from_uri(tempfile.mkdtemp())
>>> b.list_keys()
[]

URIs: ``/some/dir`` or ``file:///some/dir`` for a directory;
``s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1`` for
S3 (endpoint, region and credentials also come from the usual ``AWS_*``
environment variables). An unknown scheme is a ``ValueError`` that lists the
supported ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Protocol, Union, runtime_checkable
from urllib.parse import quote, urlencode

from millpond import _core

__all__ = ["Backup", "DirBackup", "S3Backup", "backup_from_uri", "SUPPORTED_SCHEMES"]

#: The URI forms :func:`backup_from_uri` accepts.
SUPPORTED_SCHEMES = ("a plain path", "file:///path", "s3://bucket/prefix")


@runtime_checkable
class Backup(Protocol):
    """What recovery needs of a durable store."""

    def list_keys(self, prefix: str = "") -> list[str]:
        """Return the keys that start with ``prefix``, sorted."""
        ...

    def upload(self, from_local: Path, to_key: str) -> None:
        """Store the file ``from_local`` under ``to_key``, atomically."""
        ...

    def download(self, from_key: str, to_local: Path) -> None:
        """Write the object ``from_key`` to the file ``to_local``.

        Raise ``FileNotFoundError`` (or ``KeyError``) if there is no such key.
        """
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""
        ...


class _CoreBackup:
    """A backup implemented in the Go core, reached through a handle."""

    def __init__(self, uri: str, credentials: tuple[str, str, str] = ("", "", "")) -> None:
        self._handle: Optional[int] = _core.backup_open(uri, *credentials)
        self.uri = uri

    def list_keys(self, prefix: str = "") -> list[str]:
        """Return the keys that start with ``prefix``, sorted."""
        return [k for k, _ in _core.backup_list(self.core_handle(), prefix)]

    def list_objects(self, prefix: str = "") -> list[tuple[str, int]]:
        """Return ``(key, size_in_bytes)`` for the keys under ``prefix``."""
        return _core.backup_list(self.core_handle(), prefix)

    def upload(self, from_local: Union[str, "os.PathLike[str]"], to_key: str) -> None:
        """Store a local file under ``to_key`` (atomically)."""
        _core.backup_upload(self.core_handle(), os.fspath(from_local), to_key)

    def download(self, from_key: str, to_local: Union[str, "os.PathLike[str]"]) -> None:
        """Write object ``from_key`` to a local file; ``FileNotFoundError`` if missing."""
        _core.backup_download(self.core_handle(), from_key, os.fspath(to_local))

    def delete(self, key: str) -> None:
        """Remove ``key`` (a missing key is fine)."""
        _core.backup_delete(self.core_handle(), key)

    def check(self) -> None:
        """Check that the store is reachable and usable; raise ``BackupError`` if not."""
        _core.backup_check(self.core_handle())

    def core_handle(self) -> int:
        """The Go core's handle of this backup (internal)."""
        if self._handle is None:
            raise ValueError(f"{self!r} is closed")
        return self._handle

    def close(self) -> None:
        """Release the core's resources. Closing twice is a no-op."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _core.backup_close(handle)

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class DirBackup(_CoreBackup):
    """A directory as the durable store (local disk, NFS, a mounted volume).

    The directory is created if its parent exists. Uploads write a temp
    file, fsync it, rename it into place and fsync the directory.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = Path(path).absolute()
        super().__init__(str(self.path))


class S3Backup(_CoreBackup):
    """S3 or an S3-compatible server as the durable store.

    ``endpoint_url`` switches to path-style addressing for S3-compatible
    servers. Credentials come from the standard ``AWS_*`` environment
    variables. Large objects upload in parts; throttling and 5xx answers are
    retried with backoff. ``access_key_id``/``secret_access_key``/
    ``session_token`` override the environment when given.
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: Optional[str] = None,
                 region: Optional[str] = None, *, access_key_id: Optional[str] = None,
                 secret_access_key: Optional[str] = None, session_token: Optional[str] = None) -> None:
        if not bucket:
            raise ValueError("S3Backup needs a bucket name")
        query = {k: v for k, v in (("endpoint", endpoint_url), ("region", region)) if v}
        uri = f"s3://{bucket}/{quote(prefix.strip('/'))}"
        if query:
            uri += "?" + urlencode(query)
        if bool(access_key_id) != bool(secret_access_key):
            raise ValueError("S3Backup needs both access_key_id and secret_access_key, or neither")
        self.bucket, self.prefix = bucket, prefix
        super().__init__(uri, (access_key_id or "", secret_access_key or "", session_token or ""))


def backup_from_uri(uri: str) -> _CoreBackup:
    """Open the backup a URI names: a path or ``file://`` URI, or ``s3://``.

    Raises ``ValueError`` with a one-line reason for a URI that cannot name
    a backup: an unknown scheme, an ``s3://`` URI without a bucket or with
    a malformed query, a directory whose parent does not exist or that is a
    file. Opening makes no network request, so an S3 endpoint that does
    not answer is reported on first use (``BackupError``).
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"backup URI must be a non-empty string, got {uri!r}")
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if not scheme and uri[:3].lower() == "s3:":
        # "s3:/bucket" or "s3:bucket": a mistyped S3 URI, not a directory
        # named "s3:"; the core's parser says how to write it.
        scheme = "s3"
    if scheme not in ("", "file", "s3"):
        raise ValueError(
            f"unknown backup URI scheme {scheme!r} in {uri!r}; use one of: {', '.join(SUPPORTED_SCHEMES)}"
        )
    if scheme == "s3":
        s3: _CoreBackup = _CoreBackup.__new__(S3Backup)
        _CoreBackup.__init__(s3, uri)
        return s3
    d = _CoreBackup.__new__(DirBackup)
    path = uri[len("file://"):] if scheme == "file" else uri
    d.path = Path(path).absolute()
    _CoreBackup.__init__(d, uri if scheme == "file" else str(d.path))
    return d


def core_handle_for(backup: object) -> tuple[int, bool]:
    """Return ``(handle, owned)`` for any backup; ``owned`` handles must be closed.

    Core backups share their handle; Python objects get a handle whose
    calls go back into Python.
    """
    if isinstance(backup, _CoreBackup):
        return backup.core_handle(), False
    for name in ("list_keys", "upload", "download", "delete"):
        if not callable(getattr(backup, name, None)):
            raise TypeError(
                f"backup {backup!r} has no {name}() method; pass a URI, DirBackup, S3Backup, "
                "or an object with list_keys/upload/download/delete"
            )
    return _core.backup_python(backup, repr(backup)), True
