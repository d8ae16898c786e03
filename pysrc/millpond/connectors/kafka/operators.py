"""Kafka operators in the shapes Bytewax users know.

::

    from millpond.connectors.kafka import operators as kop, serde

    src = kop.input("in", flow, brokers=["127.0.0.1:9092"], topics=["events"])
    decoded = kop.deserialize_value("json", src.oks, serde.json_deserializer)
    ...
    kop.output("out", messages, brokers=["127.0.0.1:9092"], topic="totals", exactly_once=True)

``input`` and the ``deserialize`` operators return ``(oks, errs)``: records
that could not be read or converted go to ``errs`` as :class:`KafkaError`
items carrying the record (and so its offset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar, Union

import millpond.operators as op
from millpond.connectors.kafka.message import KafkaError, KafkaSinkMessage, KafkaSourceMessage
from millpond.connectors.kafka.serde import apply_optional
from millpond.connectors.kafka.sink import KafkaSink
from millpond.connectors.kafka.source import KafkaSource
from millpond.dataflow import Dataflow, Stream, operator

__all__ = [
    "KafkaSourceOut",
    "KafkaOpOut",
    "input",
    "output",
    "deserialize",
    "deserialize_key",
    "deserialize_value",
    "serialize",
    "serialize_key",
    "serialize_value",
]

T = TypeVar("T")
E = TypeVar("E")


@dataclass(frozen=True)
class KafkaOpOut(Generic[T, E]):
    """The two streams of :func:`input` or of a conversion: the records,
    and the errors."""

    oks: Stream[T]
    errs: Stream[E]


#: The name Bytewax gives :func:`input`'s two streams.
KafkaSourceOut = KafkaOpOut


def _is_ok(item: Any) -> bool:
    return not isinstance(item, KafkaError)


@operator
def input(
    step_id: str,
    flow: Dataflow,
    *,
    brokers: Union[str, Sequence[str]],
    topics: Union[str, Sequence[str]],
    tail: bool = True,
    starting_offset: Union[str, int] = "earliest",
    add_config: Optional[Dict[str, Any]] = None,
    batch_size: int = 1000,
) -> KafkaSourceOut[KafkaSourceMessage[Optional[bytes], Optional[bytes]], KafkaError[Any, Any]]:
    """Read ``topics`` (see :class:`~millpond.connectors.kafka.KafkaSource`);
    broker errors become :class:`KafkaError` items on ``errs`` instead of
    stopping the flow."""
    source = KafkaSource(brokers, topics, tail=tail, starting_offset=starting_offset,
                         add_config=add_config, batch_size=batch_size, raise_on_errors=False)
    items = op.input("inp", flow, source)
    split = op.branch("split_err", items, _is_ok)
    return KafkaSourceOut(split.trues, split.falses)


@operator
def output(
    step_id: str,
    up: Stream[KafkaSinkMessage[Any, Any]],
    *,
    brokers: Union[str, Sequence[str]],
    topic: str,
    add_config: Optional[Dict[str, Any]] = None,
    exactly_once: bool = False,
) -> None:
    """Write ``up``'s messages to ``topic`` (see
    :class:`~millpond.connectors.kafka.KafkaSink`)."""
    op.output("kafka_output", up, KafkaSink(brokers, topic, add_config=add_config, exactly_once=exactly_once))


def _converter(key_fn: Optional[Callable[[Any], Any]], val_fn: Optional[Callable[[Any], Any]],
               ) -> Callable[[List[Any]], Tuple[List[Any], List[Any]]]:
    def convert(batch: List[Any]) -> Tuple[List[Any], List[Any]]:
        oks: List[Any] = []
        errs: List[Any] = []
        for msg in batch:
            try:
                key = msg.key if key_fn is None else apply_optional(key_fn, msg.key)
                value = msg.value if val_fn is None else apply_optional(val_fn, msg.value)
            except Exception as ex:  # a bad record goes to errs, with its offset
                where = ""
                if isinstance(msg, KafkaSourceMessage):
                    where = f" of {msg.topic!r} partition {msg.partition} offset {msg.offset}"
                errs.append(KafkaError(f"{type(ex).__name__}: {ex} (record{where})",
                                       msg if isinstance(msg, KafkaSourceMessage) else None))
                continue
            if isinstance(msg, KafkaSourceMessage):
                oks.append(KafkaSourceMessage(key, value, msg.topic, msg.partition, msg.offset,
                                              msg.timestamp, msg.headers))
            else:
                oks.append(KafkaSinkMessage(key, value, msg.topic, msg.headers))
        return oks, errs

    return convert


def _split(up: Stream[Any], convert: Callable[[List[Any]], Tuple[List[Any], List[Any]]]) -> KafkaOpOut[Any, Any]:
    def tagged(batch: List[Any]) -> List[Any]:
        oks, errs = convert(batch)
        return oks + errs

    both = op.flat_map_batch("convert", up, tagged)
    split = op.branch("split_err", both, _is_ok)
    return KafkaOpOut(split.trues, split.falses)


@operator
def deserialize(
    step_id: str,
    up: Stream[KafkaSourceMessage[Any, Any]],
    *,
    key_deserializer: Callable[[bytes], Any],
    val_deserializer: Callable[[bytes], Any],
) -> KafkaOpOut[KafkaSourceMessage[Any, Any], KafkaError[Any, Any]]:
    """Convert each record's key and value; a record whose conversion
    raises goes to ``errs`` as a :class:`KafkaError` (with its offset)."""
    return _split(up, _converter(key_deserializer, val_deserializer))


@operator
def deserialize_key(
    step_id: str, up: Stream[KafkaSourceMessage[Any, Any]], deserializer: Callable[[bytes], Any]
) -> KafkaOpOut[KafkaSourceMessage[Any, Any], KafkaError[Any, Any]]:
    """Convert each record's key (see :func:`deserialize`)."""
    return _split(up, _converter(deserializer, None))


@operator
def deserialize_value(
    step_id: str, up: Stream[KafkaSourceMessage[Any, Any]], deserializer: Callable[[bytes], Any]
) -> KafkaOpOut[KafkaSourceMessage[Any, Any], KafkaError[Any, Any]]:
    """Convert each record's value (see :func:`deserialize`)."""
    return _split(up, _converter(None, deserializer))


def _serialized(key_fn: Optional[Callable[[Any], bytes]], val_fn: Optional[Callable[[Any], bytes]],
                ) -> Callable[[Any], KafkaSinkMessage[Any, Any]]:
    def convert(msg: Any) -> KafkaSinkMessage[Any, Any]:
        if not isinstance(msg, (KafkaSinkMessage, KafkaSourceMessage)):
            raise TypeError(f"expected a KafkaSinkMessage; got {msg!r:.80}")
        key = msg.key if key_fn is None else apply_optional(key_fn, msg.key)
        value = msg.value if val_fn is None else apply_optional(val_fn, msg.value)
        topic = msg.topic if isinstance(msg, KafkaSinkMessage) else None
        return KafkaSinkMessage(key, value, topic, list(msg.headers))

    return convert


@operator
def serialize(
    step_id: str,
    up: Stream[KafkaSinkMessage[Any, Any]],
    *,
    key_serializer: Callable[[Any], bytes],
    val_serializer: Callable[[Any], bytes],
) -> Stream[KafkaSinkMessage[bytes, bytes]]:
    """Turn each message's key and value into bytes; an error stops the
    flow (what to write is the flow's own output)."""
    return op.map("map", up, _serialized(key_serializer, val_serializer))


@operator
def serialize_key(
    step_id: str, up: Stream[KafkaSinkMessage[Any, Any]], serializer: Callable[[Any], bytes]
) -> Stream[KafkaSinkMessage[bytes, Any]]:
    """Turn each message's key into bytes."""
    return op.map("map", up, _serialized(serializer, None))


@operator
def serialize_value(
    step_id: str, up: Stream[KafkaSinkMessage[Any, Any]], serializer: Callable[[Any], bytes]
) -> Stream[KafkaSinkMessage[Any, bytes]]:
    """Turn each message's value into bytes."""
    return op.map("map", up, _serialized(None, serializer))
