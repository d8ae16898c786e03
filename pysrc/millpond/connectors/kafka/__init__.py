"""Kafka sources and sinks, with exactly-once output through recovery.

``KafkaSource`` reads topics as a fixed-partitioned source (one partition
per topic partition, its offset in the recovery state, so a resumed flow
continues exactly where the committed epoch ended). ``KafkaSink`` writes
one topic, at least once (an idempotent producer, flushed at every epoch
close) or exactly once (``exactly_once=True``: one Kafka transaction per
epoch and sink partition, committed only once millpond committed the
epoch). :mod:`millpond.connectors.kafka.operators` wraps both in the
operator shapes Bytewax users know. See ``docs/connectors.md`` (Kafka).

Needs ``confluent-kafka``: ``pip install 'millpond[kafka]'``.
"""

from __future__ import annotations

try:
    import confluent_kafka as _confluent_kafka  # noqa: F401
except ImportError as _ex:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "millpond.connectors.kafka needs confluent-kafka: pip install 'millpond[kafka]'"
    ) from _ex

from millpond.connectors.kafka.message import KafkaError, KafkaSinkMessage, KafkaSourceMessage
from millpond.connectors.kafka.sink import KafkaSink
from millpond.connectors.kafka.source import KafkaSource

__all__ = [
    "KafkaError",
    "KafkaSinkMessage",
    "KafkaSink",
    "KafkaSource",
    "KafkaSourceMessage",
]
