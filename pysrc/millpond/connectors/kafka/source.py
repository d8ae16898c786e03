"""``KafkaSource``: topics read as a fixed-partitioned, resumable source."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional, Sequence, Union

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as _RdKafkaError

from millpond.connectors.kafka.client import (
    METADATA_TIMEOUT_SECONDS,
    KafkaConnectorError,
    brokers_str,
    client_config,
    describe,
    topic_partitions,
)
from millpond.connectors.kafka.message import KafkaError, KafkaSourceMessage
from millpond.inputs import FixedPartitionedSource, StatefulSourcePartition

__all__ = ["KafkaSource"]

SourceItem = Union[KafkaSourceMessage[Optional[bytes], Optional[bytes]], KafkaError[Optional[bytes], Optional[bytes]]]

# An empty poll backs off this long before the partition is polled again,
# so an idle topic does not keep a core busy.
_IDLE_BACKOFF = timedelta(milliseconds=20)


def _parse_part(name: str) -> tuple[str, int]:
    topic, _, part = name.rpartition("-")
    return topic, int(part)


class _KafkaPartition(StatefulSourcePartition[SourceItem, int]):
    """One topic partition; its resume state is the next offset to read."""

    def __init__(self, conf: Dict[str, Any], topic: str, partition: int, starting_offset: int,
                 resume_offset: Optional[int], tail: bool, batch_size: int, raise_on_errors: bool) -> None:
        self._topic = topic
        self._partition = partition
        self._batch_size = batch_size
        self._raise = raise_on_errors
        self._consumer = Consumer(conf)
        self._awake: Optional[datetime] = None
        try:
            tp = TopicPartition(topic, partition)
            low, high = self._consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT_SECONDS)
            if resume_offset is not None:
                start = resume_offset
            elif starting_offset == OFFSET_END:
                start = high
            elif starting_offset == OFFSET_BEGINNING:
                start = low
            else:
                start = starting_offset
            # The end is fixed at start for a bounded read; it is the high
            # watermark, which counts transaction markers: the end is known
            # reached when the consumer reports the partition's end.
            self._end: Optional[int] = None if tail else high
            self._next = start
            self._consumer.assign([TopicPartition(topic, partition, start)])
        except KafkaException as ex:
            self._consumer.close()
            raise KafkaConnectorError(
                f"Kafka topic {topic!r} partition {partition}: cannot read offsets ({describe(ex)})"
            ) from None

    def next_batch(self) -> List[SourceItem]:
        if self._end is not None and self._next >= self._end:
            raise StopIteration()
        msgs = self._consumer.consume(self._batch_size, 0)
        if not msgs:
            self._awake = datetime.now(timezone.utc) + _IDLE_BACKOFF
            return []
        self._awake = None
        out: List[SourceItem] = []
        append = out.append
        for m in msgs:
            err = m.error()
            if err is None:
                offset: int = m.offset()  # type: ignore[assignment]  # set on a record
                headers: Any = m.headers() or []
                append(KafkaSourceMessage(m.key(), m.value(), self._topic, self._partition, offset,
                                          m.timestamp(), headers))
                self._next = offset + 1
            elif err.code() == _RdKafkaError._PARTITION_EOF:
                # The consumer is at the end: everything before its offset
                # was delivered or was a transaction marker.
                self._next = max(self._next, m.offset() or 0)
            else:
                what = describe(err)
                if err.code() == _RdKafkaError._AUTO_OFFSET_RESET:
                    # The offset to resume from is gone (retention deleted
                    # it): jumping elsewhere would skip records silently.
                    what = (f"offset {self._next} is no longer on the broker (deleted by retention?), so "
                            f"records were lost before this flow read them; {what}")
                if self._raise:
                    raise KafkaConnectorError(
                        f"reading Kafka topic {self._topic!r} partition {self._partition} "
                        f"at offset {self._next}: {what}"
                    )
                append(KafkaError(f"topic {self._topic!r} partition {self._partition}: {what}", None))
        return out

    def next_awake(self) -> Optional[datetime]:
        return self._awake

    def snapshot(self) -> int:
        return self._next

    def lag(self) -> Optional[int]:
        """Records between the next offset and the partition's high
        watermark, as last fetched (``None`` before the first fetch)."""
        try:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, self._partition), cached=True)
        except KafkaException:
            return None
        if high is None or high < 0:
            return None
        return max(0, high - self._next)

    def close(self) -> None:
        self._consumer.close()


class KafkaSource(FixedPartitionedSource[SourceItem, int]):
    """Read ``topics`` from ``brokers``: one source partition per topic
    partition, named ``"<topic>-<partition>"``, spread over the workers.

    A partition's offset is its resume state: a resumed flow reads from
    the offset of the last committed epoch, whichever worker now holds the
    partition, never from a consumer group's committed offset (no group
    offsets are committed). ``starting_offset`` (``"earliest"``,
    ``"latest"``, or confluent-kafka's ``OFFSET_BEGINNING``/``OFFSET_END``)
    applies only to a fresh start. With ``tail=False`` each partition ends
    at the high watermark it had at start; otherwise it reads on forever.
    Records come as :class:`KafkaSourceMessage` with ``bytes`` keys and
    values. Consumers use ``isolation.level=read_committed``, so only
    committed transactions are read. A broker error stops the flow, unless
    ``raise_on_errors=False``: then it is a :class:`KafkaError` item.
    ``add_config`` is merged into every consumer's librdkafka configuration.
    """

    def __init__(self, brokers: Union[str, Sequence[str]], topics: Union[str, Sequence[str]], tail: bool = True,
                 starting_offset: Union[str, int] = "earliest", add_config: Optional[Dict[str, Any]] = None,
                 batch_size: int = 1000, raise_on_errors: bool = True) -> None:
        self._brokers = brokers_str(brokers)
        self._topics = [topics] if isinstance(topics, str) else list(topics)
        if not self._topics or not all(isinstance(t, str) and t for t in self._topics):
            raise ValueError(f"topics must name at least one topic; got {topics!r}")
        if starting_offset in ("earliest", OFFSET_BEGINNING):
            self._start = OFFSET_BEGINNING
        elif starting_offset in ("latest", OFFSET_END):
            self._start = OFFSET_END
        else:
            raise ValueError(f"starting_offset must be 'earliest' or 'latest'; got {starting_offset!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        self._tail = bool(tail)
        self._add_config = dict(add_config or {})
        self._batch_size = batch_size
        self._raise = raise_on_errors
        self._parts: Optional[List[str]] = None

    def list_parts(self) -> List[str]:
        if self._parts is None:
            counts = topic_partitions(self._brokers, self._topics, self._add_config)
            self._parts = [f"{t}-{p}" for t in self._topics for p in range(counts[t])]
        return list(self._parts)

    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _KafkaPartition:
        topic, partition = _parse_part(for_part)
        conf = client_config(
            self._brokers, self._add_config,
            **{"group.id": f"millpond.{step_id}", "enable.auto.commit": False,
               "enable.auto.offset.store": False, "enable.partition.eof": True,
               "isolation.level": "read_committed",
               # An offset out of range is an error, never a silent jump.
               "auto.offset.reset": "error"},
        )
        return _KafkaPartition(conf, topic, partition, self._start, resume_state, self._tail,
                               self._batch_size, self._raise)
