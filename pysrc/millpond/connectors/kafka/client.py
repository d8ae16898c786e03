"""What the Kafka source and sink share: client settings, the broker's
topic metadata, and errors worded for a user."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Union

from confluent_kafka import KafkaError as _RdKafkaError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

__all__ = [
    "METADATA_TIMEOUT_SECONDS",
    "KafkaConnectorError",
    "client_config",
    "brokers_str",
    "topic_partitions",
    "describe",
]

logger = logging.getLogger("millpond.kafka")

#: How long the connectors wait for the brokers' topic metadata before
#: they give up with an error naming the brokers.
METADATA_TIMEOUT_SECONDS = 10.0


class KafkaConnectorError(RuntimeError):
    """A Kafka source or sink cannot go on: unreachable brokers, a missing
    topic, a refused write, a fenced transaction."""


def brokers_str(brokers: Union[str, Sequence[str]]) -> str:
    """``bootstrap.servers`` from a list of ``host:port`` or a comma list."""
    if isinstance(brokers, str):
        parts = [b.strip() for b in brokers.split(",")]
    else:
        parts = [str(b).strip() for b in brokers]
    parts = [p for p in parts if p]
    if not parts:
        raise ValueError("brokers must name at least one host:port")
    return ",".join(parts)


def client_config(brokers: str, add_config: Optional[Dict[str, Any]], **base: Any) -> Dict[str, Any]:
    """A librdkafka configuration: ``base``, then the user's ``add_config``
    (which wins), logging through the ``millpond.kafka`` logger."""
    conf: Dict[str, Any] = {"bootstrap.servers": brokers, "logger": logger}
    conf.update(base)
    if add_config:
        conf.update(add_config)
    return conf


def describe(err: Any) -> str:
    """A librdkafka error as ``text (NAME)``."""
    if isinstance(err, KafkaException) and err.args:
        err = err.args[0]
    if isinstance(err, _RdKafkaError):
        return f"{err.str()} ({err.name()})"
    return str(err)


def topic_partitions(brokers: str, topics: List[str], add_config: Optional[Dict[str, Any]],
                     timeout: float = METADATA_TIMEOUT_SECONDS) -> Dict[str, int]:
    """The partition count of each topic, read from the brokers.

    Raises :class:`KafkaConnectorError` naming the brokers when they do not
    answer within ``timeout`` seconds, and naming the topic when it does
    not exist (millpond never creates topics)."""
    admin = AdminClient(client_config(brokers, add_config))
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as ex:
        raise KafkaConnectorError(
            f"Kafka brokers {brokers} did not answer within {timeout:g} s ({describe(ex)}); "
            "check the broker addresses and that the brokers are up"
        ) from None
    counts: Dict[str, int] = {}
    for topic in topics:
        tm = meta.topics.get(topic)
        if tm is None or (tm.error is not None and tm.error.code() == _RdKafkaError.UNKNOWN_TOPIC_OR_PART):
            raise KafkaConnectorError(
                f"Kafka topic {topic!r} does not exist on {brokers}; create it first "
                "(millpond does not create topics)"
            )
        if tm.error is not None:
            raise KafkaConnectorError(f"Kafka topic {topic!r} on {brokers}: {describe(tm.error)}")
        counts[topic] = len(tm.partitions)
    return counts
