"""Backup URIs as they may be shown: without secrets.

A backup URI can carry a secret by mistake: a password in the endpoint's
userinfo (``http://user:PASS@host``), or a credential pasted into a query
parameter millpond does not know. Messages and logs show URIs through
:func:`redact_uri`, which masks both; the Go core does the same in its own
messages.

>>> redact_uri("s3://b/p?endpoint=http://u:pw@127.0.0.1:9000&region=eu&token=abc")
's3://b/p?endpoint=http://u:xxxxx@127.0.0.1:9000&region=eu&token=xxxxx'
>>> redact_uri("/var/lib/backups")
'/var/lib/backups'
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit, urlunsplit

__all__ = ["MASK", "S3_URI_PARAMETERS", "redact_uri"]

#: What a secret is replaced with.
MASK = "xxxxx"

#: The query parameters of an ``s3://`` backup URI (the Go core's backupuri
#: package reads them; tests/test_never_wrong checks the two lists agree).
S3_URI_PARAMETERS = frozenset(
    {"endpoint", "region", "max_attempts", "part_size", "timeout", "stall_timeout", "max_backoff"}
)


def _mask_userinfo(url: str) -> str:
    """``url`` with the password of its userinfo masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def redact_uri(uri: str) -> str:
    """``uri`` with the userinfo password of it and of its ``endpoint``
    masked, and the values of unknown query parameters masked."""
    if "://" not in uri:
        return uri
    shown = _mask_userinfo(uri)
    base, sep, query = shown.partition("?")
    if not sep:
        return shown
    params = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in S3_URI_PARAMETERS:
            value = MASK
        elif name == "endpoint":
            value = _mask_userinfo(value)
        params.append(f"{name}={value}")
    return f"{base}?{'&'.join(params)}"
