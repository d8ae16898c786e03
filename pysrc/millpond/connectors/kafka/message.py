"""The items Kafka connectors emit and take."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, List, Optional, Sequence, Tuple, TypeVar

__all__ = ["KafkaSourceMessage", "KafkaSinkMessage", "KafkaError"]

K = TypeVar("K")
V = TypeVar("V")


@dataclass(slots=True)
class KafkaSourceMessage(Generic[K, V]):
    """One record read from Kafka.

    ``key`` and ``value`` are the record's bytes (or whatever a
    ``deserialize`` operator made of them); ``timestamp`` is confluent-kafka's
    ``(timestamp type, milliseconds)`` pair; ``headers`` a list of
    ``(name, bytes)``.
    """

    key: K
    value: V
    topic: str
    partition: int
    offset: int
    timestamp: Tuple[int, int] = (0, 0)
    headers: List[Tuple[str, bytes]] = field(default_factory=list)

    def to_sink(self) -> "KafkaSinkMessage[K, V]":
        """A sink message with this record's key, value and headers."""
        return KafkaSinkMessage(self.key, self.value, headers=list(self.headers))

    def _replace(self, **changes: Any) -> "KafkaSourceMessage[Any, Any]":
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        return KafkaSourceMessage(**values)


@dataclass(slots=True)
class KafkaSinkMessage(Generic[K, V]):
    """One record to write to Kafka.

    ``key`` and ``value`` must be ``bytes`` or ``str`` (UTF-8) when they
    reach the sink, or ``None``; ``serialize`` operators turn other values
    into bytes. ``topic``, when given, must be the sink's topic (a
    ``KafkaSink`` writes one topic: use one output step per topic).
    """

    key: K
    value: V
    topic: Optional[str] = None
    headers: Sequence[Tuple[str, bytes]] = ()


@dataclass(slots=True)
class KafkaError(Generic[K, V]):
    """An error met while reading or converting a record: an item on an
    error stream.

    ``msg`` is the record involved, if any (its ``topic``, ``partition``
    and ``offset`` say where it is); ``error`` says what went wrong.
    """

    error: str
    msg: Optional[KafkaSourceMessage[K, V]] = None

    @property
    def offset(self) -> Optional[int]:
        """The offset of the record involved, if any."""
        return self.msg.offset if self.msg is not None else None
