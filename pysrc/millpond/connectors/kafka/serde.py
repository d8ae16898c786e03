"""Converters between Kafka's bytes and Python values, for the
``serialize``/``deserialize`` operators: each is a plain callable, so any
function ``bytes -> value`` or ``value -> bytes`` works in their place."""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

__all__ = [
    "Deserializer",
    "Serializer",
    "bytes_deserializer",
    "bytes_serializer",
    "str_deserializer",
    "str_serializer",
    "json_deserializer",
    "json_serializer",
]

Deserializer = Callable[[bytes], Any]
Serializer = Callable[[Any], bytes]


def bytes_deserializer(data: bytes) -> bytes:
    """The bytes as they are."""
    return data


def bytes_serializer(value: Any) -> bytes:
    """``bytes``/``bytearray``/``memoryview`` as bytes; anything else is a ``TypeError``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"expected bytes; got {type(value).__name__}")


def str_deserializer(data: bytes) -> str:
    """UTF-8 text (invalid UTF-8 is a ``UnicodeDecodeError``)."""
    return data.decode("utf-8")


def str_serializer(value: Any) -> bytes:
    """A ``str`` as UTF-8."""
    if not isinstance(value, str):
        raise TypeError(f"expected str; got {type(value).__name__}")
    return value.encode("utf-8")


def json_deserializer(data: bytes) -> Any:
    """A JSON document (UTF-8)."""
    return json.loads(data)


def json_serializer(value: Any) -> bytes:
    """Compact JSON, UTF-8."""
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def apply_optional(fn: Callable[[Any], Any], x: Optional[Any]) -> Any:
    """``fn(x)``, leaving ``None`` (a record without key or value) as is."""
    return None if x is None else fn(x)
