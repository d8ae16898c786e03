"""The key that authenticates a flow's recovery records.

Recovery state is pickled, and unpickling runs code: whoever can write to a
flow's backup can make the machine that resumes from it run code of their
choosing, unless the records are authenticated. With a key, every commit
and execution record is sealed with an HMAC-SHA256 of its content, and each
record names its objects by SHA-256, which is checked before an object is
opened: a record or object that was not written by a holder of the key is
refused by name before anything in it is decoded. Without a key the same
fields are a plain SHA-256: they find damage, not forgery.

The key comes from the environment, never from the command line (where other
users of the machine can read it):

- ``MILLPOND_BACKUP_KEY``: the key itself (its UTF-8 bytes; at least 16);
- ``MILLPOND_BACKUP_KEY_FILE``: a file holding it (its bytes, without a
  final newline), e.g. a mounted secret.

Set one of them for every run of a flow, from its first run on: a flow's
records are all written with the key or all without it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

__all__ = ["KEY_VAR", "KEY_FILE_VAR", "MIN_KEY_BYTES", "backup_key_from_env", "check_key"]

#: The variable holding the key.
KEY_VAR = "MILLPOND_BACKUP_KEY"
#: The variable naming a file that holds the key.
KEY_FILE_VAR = "MILLPOND_BACKUP_KEY_FILE"
#: The shortest key accepted (the core refuses shorter ones too).
MIN_KEY_BYTES = 16


def check_key(key: bytes, source: str) -> bytes:
    """Return ``key`` if it is long enough; ``ValueError`` naming ``source`` otherwise."""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{source} holds a backup key of {len(key)} bytes; use at least {MIN_KEY_BYTES} "
            "(e.g. the output of `openssl rand -hex 32`)"
        )
    return key


def backup_key_from_env(environ: Optional[Mapping[str, str]] = None) -> Optional[bytes]:
    """The backup key the environment configures, or ``None``.

    ``ValueError`` when both variables are set, the file cannot be read, or
    the key is too short; the message never contains the key.
    """
    env = os.environ if environ is None else environ
    value, path = env.get(KEY_VAR), env.get(KEY_FILE_VAR)
    if value and path:
        raise ValueError(f"set {KEY_VAR} or {KEY_FILE_VAR}, not both")
    if value:
        return check_key(value.encode(), KEY_VAR)
    if path:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"{KEY_FILE_VAR}={path}: cannot read the backup key: {exc.strerror}") from None
        return check_key(data.rstrip(b"\r\n"), f"{KEY_FILE_VAR}={path}")
    return None
