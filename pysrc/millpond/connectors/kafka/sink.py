"""``KafkaSink``: one topic written at least once or exactly once.

Exactly once (``exactly_once=True``), per sink partition (one per partition
of the topic):

1. The writes of an epoch go into one Kafka transaction of the
   partition's transactional producer (``transactional.id`` =
   ``millpond.<step id>.<topic>-<partition>``), and are kept in memory.
2. At the epoch's close (:meth:`prepare`) the transaction is sealed: it
   takes no more records. The epoch's records are in the partition's
   snapshot, which millpond commits with the epoch.
3. Once millpond has committed the epoch (:meth:`commit`), a background
   job gives the transaction its marker (a transactional offset commit of
   the epoch number for the group named after the transactional id) and
   commits it: records and marker become visible together. Records of
   later epochs wait in memory meanwhile, and go out right after.
4. A resumed partition starts its producer (``init_transactions`` aborts
   whatever transaction a failed run left open and fences that run's
   producer), reads the marker, and publishes, in one transaction, the
   records of every epoch in its resume state that the marker does not
   cover: those were committed by millpond but not yet by Kafka. Epochs
   the marker covers are not repeated; epochs after the resume point
   are gone with the aborted transaction. Until that is done, the resume
   state's epochs stay in the partition's snapshots, so a crash meanwhile
   leaves them to the next resume.

Readers with ``isolation.level=read_committed`` see every record once.
"""

from __future__ import annotations

import logging
import marshal
import threading
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from millpond.connectors.kafka.client import (
    METADATA_TIMEOUT_SECONDS,
    KafkaConnectorError,
    brokers_str,
    client_config,
    describe,
    topic_partitions,
)
from millpond.connectors.kafka.message import KafkaSinkMessage
from millpond.outputs import FixedPartitionedSink, StatefulSinkPartition, TwoPhaseSinkPartition

__all__ = ["KafkaSink"]

logger = logging.getLogger("millpond.kafka")

# A record as kept in memory and in a snapshot: (key, value, headers).
Record = Tuple[Optional[bytes], Optional[bytes], Any]

#: How long a flush or a transaction call may take before the sink gives
#: up with an error (the flow then stops; nothing committed is lost).
TRANSACTION_TIMEOUT_SECONDS = 60.0


def _as_bytes(what: str, x: Any) -> Optional[bytes]:
    if x is None or type(x) is bytes:
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    raise TypeError(
        f"KafkaSinkMessage {what} must be bytes, str or None; got {type(x).__name__} "
        "(use a serialize operator of millpond.connectors.kafka.operators first)"
    )


class _Producing:
    """A producer writing to one topic partition, reporting failed
    deliveries instead of dropping them."""

    def __init__(self, conf: Dict[str, Any], topic: str, partition: int, name: str) -> None:
        self.topic = topic
        self.partition = partition
        self.name = name
        self.failed: Optional[str] = None
        self.producer = Producer(conf)

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None and self.failed is None:
            self.failed = describe(err)

    def produce(self, records: List[Record]) -> None:
        produce = self.producer.produce
        topic, partition, cb = self.topic, self.partition, self._delivered
        for key, value, headers in records:
            while True:
                try:
                    produce(topic, value, key, partition, on_delivery=cb, headers=headers)
                    break
                except BufferError:
                    # The local queue is full: serve deliveries, then retry.
                    self.producer.poll(0.05)
        self.producer.poll(0)
        self.check()

    def flush(self) -> None:
        left = self.producer.flush(TRANSACTION_TIMEOUT_SECONDS)
        self.check()
        if left:
            raise KafkaConnectorError(
                f"Kafka sink {self.name}: {left} records not delivered within "
                f"{TRANSACTION_TIMEOUT_SECONDS:g} s; are the brokers up?"
            )

    def check(self) -> None:
        if self.failed is not None:
            raise KafkaConnectorError(f"Kafka sink {self.name}: writing failed: {self.failed}")


def _records(topic: str, values: List[Any]) -> List[Record]:
    out: List[Record] = []
    for msg in values:
        if type(msg) is not KafkaSinkMessage:
            raise TypeError(f"a KafkaSink takes KafkaSinkMessage items; got {msg!r:.80}")
        if msg.topic is not None and msg.topic != topic:
            raise ValueError(
                f"KafkaSinkMessage names topic {msg.topic!r} but the sink writes {topic!r} "
                "(a KafkaSink writes one topic: use one output step per topic)"
            )
        out.append((_as_bytes("key", msg.key), _as_bytes("value", msg.value),
                    list(msg.headers) if msg.headers else None))
    return out


class _AtLeastOncePartition(StatefulSinkPartition[KafkaSinkMessage[Any, Any], None]):
    """An idempotent producer, flushed at every epoch close: a committed
    epoch's records are in Kafka; a replayed epoch writes its records again."""

    def __init__(self, conf: Dict[str, Any], topic: str, partition: int, name: str) -> None:
        self._out = _Producing(conf, topic, partition, name)

    def write_batch(self, values: List[KafkaSinkMessage[Any, Any]]) -> None:
        self._out.produce(_records(self._out.topic, values))

    def snapshot(self) -> None:
        self._out.flush()
        return None

    def close(self) -> None:
        self._out.flush()


class _Entry:
    """A closed epoch's records, not yet published, in their marshalled
    form (what the snapshot holds), with how many there are and whether
    they are in the producer's open transaction already.

    Only the marshalled form is kept: the records are needed again only
    to produce an epoch that was not streamed into a transaction, or to
    write a transaction Kafka aborted again, and ``marshal.loads`` gives
    them back in a fraction of what producing them costs. A waiting epoch
    takes the memory of its bytes once, not twice."""

    __slots__ = ("epoch", "blob", "_count", "sent")

    def __init__(self, epoch: int, blob: bytes, count: Optional[int], sent: bool) -> None:
        self.epoch = epoch
        self.blob = blob
        self._count = count
        self.sent = sent

    @property
    def count(self) -> int:
        """How many records; for an entry read back from a snapshot, counted
        when first asked (most such entries Kafka has already published, and
        are dropped unread)."""
        if self._count is None:
            self._count = len(self.records())
        return self._count

    @classmethod
    def of(cls, epoch: int, records: List[Record], sent: bool) -> "_Entry":
        # marshal, not pickle: an epoch's records are plain bytes, tuples
        # and None, which marshal writes about ten times faster (pickle
        # memoizes every object); format 4 is read by every Python 3.
        return cls(epoch, marshal.dumps(records, 4), len(records), sent)

    def records(self) -> List[Record]:
        """The records, from their marshalled form."""
        return marshal.loads(self.blob)  # type: ignore[no-any-return]


def _entry_from_state(epoch: int, data: Any) -> _Entry:
    if isinstance(data, bytes):
        return _Entry(epoch, data, None, False)
    return _Entry.of(epoch, list(data), False)


class _ExactlyOncePartition(TwoPhaseSinkPartition[KafkaSinkMessage[Any, Any], Dict[str, Any]]):
    """A transactional producer publishing each epoch once millpond has
    committed it (the protocol is in this module's docstring).

    The worker's thread produces records as they come while no closed
    epoch waits; Kafka's round trips (starting the producer, the marker,
    committing) run in a background job, one at a time, while the worker
    goes on and holds new records in memory. Only one thread uses the
    producer at any time: the worker's thread touches it only when no job
    runs."""

    def __init__(self, conf: Dict[str, Any], marker_conf: Dict[str, Any], topic: str, partition: int,
                 name: str, resume_state: Optional[Dict[str, Any]]) -> None:
        self._name = name
        self._marker_tp = TopicPartition(topic, partition)
        self._out = _Producing(conf, topic, partition, name)
        # Records of the running epoch; the first _current_sent of them are
        # in the open transaction.
        self._current: List[Record] = []
        self._current_sent = 0
        # Closed epochs not yet published, oldest first. Only the first can
        # be in the open transaction (then the transaction is sealed: it
        # takes no records of later epochs). The resume state's epochs are
        # among them until the start job has published them or found them
        # published, so they are in every snapshot meanwhile: epochs that
        # close during the job get committed by millpond, and a snapshot
        # without them would, after a crash before Kafka's commit, leave
        # them in neither place.
        self._pending: List[_Entry] = [
            _entry_from_state(e, data) for e, data in (resume_state or {}).get("pending", [])]
        self._open = False
        # The newest epoch millpond committed, as far as this partition knows.
        self._committed = 0
        self._changed = resume_state is not None
        self._job: Optional[threading.Thread] = None
        self._job_done = len(self._pending)  # pending entries the running job publishes
        self._error: Optional[BaseException] = None
        self._run_job(self._start, marker_conf, list(self._pending))

    # -- Kafka calls (the job's thread, or the worker's when no job runs) --

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        """Call a transactional API, retrying what librdkafka says is
        retriable; a fenced producer or a fatal error is one clear error."""
        deadline = time.monotonic() + TRANSACTION_TIMEOUT_SECONDS
        while True:
            try:
                return fn(*args)
            except KafkaException as ex:
                err = ex.args[0] if ex.args else None
                retriable = err is not None and hasattr(err, "retriable") and err.retriable()
                if retriable and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                if err is not None and hasattr(err, "fatal") and err.fatal():
                    raise KafkaConnectorError(
                        f"Kafka sink {self._name}: {what} failed: {describe(err)}; another run of this flow "
                        "may have taken over the partition (its transactional id fences this one)"
                    ) from None
                raise

    def _start(self, marker_conf: Dict[str, Any], todo: List[_Entry]) -> None:
        """Start the producer (aborting what a failed run left open), read
        the marker, and publish the resume state's epochs it does not cover."""
        marker_consumer = Consumer(marker_conf)
        try:
            self._group = marker_consumer.consumer_group_metadata()
            self._call("init_transactions", self._out.producer.init_transactions, TRANSACTION_TIMEOUT_SECONDS)
            try:
                got = marker_consumer.committed([self._marker_tp], timeout=METADATA_TIMEOUT_SECONDS)
            except KafkaException as ex:
                raise KafkaConnectorError(
                    f"Kafka sink {self._name}: reading its commit marker: {describe(ex)}") from None
        finally:
            marker_consumer.close()
        published = got[0].offset if got and got[0].offset > 0 else 0
        todo = [entry for entry in todo if entry.epoch > published]
        if todo:
            logger.info("Kafka sink %s: publishing %d records of committed epoch(s) %s that Kafka had not "
                        "committed", self._name, sum(e.count for e in todo), [e.epoch for e in todo])
            self._publish(todo)

    def _marker(self, epoch: int) -> None:
        tp = TopicPartition(self._marker_tp.topic, self._marker_tp.partition, epoch)
        self._call("marking the transaction", self._out.producer.send_offsets_to_transaction,
                   [tp], self._group, TRANSACTION_TIMEOUT_SECONDS)

    def _publish(self, entries: List[_Entry]) -> None:
        """Publish ``entries`` (epochs millpond committed): the first may be
        in the open transaction already; the others go into it, or into a
        new one. One marker, of the last epoch, and one commit."""
        producer = self._out.producer
        if not entries[0].sent:
            self._call("begin", producer.begin_transaction)
        for entry in entries:
            if not entry.sent:
                self._out.produce(entry.records())
        # Every record delivered first: a write the broker refused (no
        # permission, too large) is reported as what it is, not as the
        # transaction's broken state that the marker or commit would meet.
        self._out.flush()
        self._marker(entries[-1].epoch)
        try:
            self._call("commit", producer.commit_transaction, TRANSACTION_TIMEOUT_SECONDS)
        except KafkaException as ex:
            err = ex.args[0] if ex.args else None
            if err is None or not err.txn_requires_abort():
                raise KafkaConnectorError(f"Kafka sink {self._name}: commit failed: {describe(ex)}") from None
            # Kafka aborted it (a timeout, an abortable error): the records
            # are still here, so they go out again in a new transaction.
            logger.warning("Kafka sink %s: the transaction was aborted (%s); writing it again",
                           self._name, describe(ex))
            self._call("abort", producer.abort_transaction, TRANSACTION_TIMEOUT_SECONDS)
            self._out.failed = None
            for entry in entries:
                entry.sent = False
            self._publish(entries)

    # -- the background job ------------------------------------------------

    def _run_job(self, fn: Any, *args: Any) -> None:
        def job() -> None:
            try:
                fn(*args)
            except BaseException as ex:  # noqa: BLE001 - raised again in the worker's thread
                self._error = ex

        self._job = threading.Thread(target=job, name=f"millpond-kafka {self._name}", daemon=True)
        self._job.start()

    def _collect(self, wait: bool = False) -> bool:
        """Take the end of a finished job (raising what failed it); False
        while one still runs."""
        job = self._job
        if job is None:
            return True
        if wait:
            job.join()
        elif job.is_alive():
            return False
        self._job = None
        if self._error is not None:
            raise self._error
        if self._job_done:
            del self._pending[:self._job_done]
            self._job_done = 0
            self._open = False
            self._changed = True
        return True

    def _step(self, wait: bool = False) -> None:
        """The worker's turn: collect a finished job; then publish the
        epochs committed meanwhile (in a new job), or stream the running
        epoch's records into a transaction if no closed epoch waits."""
        if not self._collect(wait):
            return
        ready = 0
        while ready < len(self._pending) and self._pending[ready].epoch <= self._committed:
            ready += 1
        if ready:
            self._job_done = ready
            self._run_job(self._publish, self._pending[:ready])
            return
        if not self._pending and self._current_sent < len(self._current):
            if not self._open:
                self._call("begin", self._out.producer.begin_transaction)
                self._open = True
            self._out.produce(self._current[self._current_sent:])
            self._current_sent = len(self._current)

    # -- the partition protocol -------------------------------------------

    def write_batch(self, values: List[KafkaSinkMessage[Any, Any]]) -> None:
        self._current.extend(_records(self._out.topic, values))
        self._step()

    def prepare(self, epoch: int) -> bool:
        changed = self._changed
        self._changed = False
        if self._current:
            sent = self._current_sent == len(self._current)
            self._pending.append(_Entry.of(epoch, self._current, sent))
            self._current = []
            self._current_sent = 0
            changed = True
        self._step()
        return changed

    def commit(self, epoch: int) -> None:
        self._committed = max(self._committed, epoch)
        self._step()

    def snapshot(self) -> Dict[str, Any]:
        return {"pending": [(entry.epoch, entry.blob) for entry in self._pending]}

    def close(self) -> None:
        # Publish what is committed and waits (the run's last epochs).
        while True:
            self._collect(wait=True)
            if not self._pending or self._pending[0].epoch > self._committed:
                break
            self._step()
        if self._open:
            # Nothing open is committed by millpond: aborting spares
            # read_committed readers the transaction timeout; a resume
            # would abort it anyway.
            try:
                self._out.producer.abort_transaction(TRANSACTION_TIMEOUT_SECONDS)
            except KafkaException as ex:
                logger.debug("Kafka sink %s: abort at close: %s", self._name, describe(ex))
        self._out.producer.flush(TRANSACTION_TIMEOUT_SECONDS)


class KafkaSink(FixedPartitionedSink[KafkaSinkMessage[Any, Any], Any]):
    """Write :class:`KafkaSinkMessage` items to ``topic`` on ``brokers``.

    One sink partition per partition of the topic (named
    ``"<topic>-<partition>"``), spread over the workers; a message goes to
    the Kafka partition the CRC32 of its key picks (librdkafka's default
    partitioner), keyless messages by the CRC32 of their value. So the
    stream need not be keyed: items are messages, as with Bytewax.

    ``exactly_once=False`` (default): an idempotent producer per partition,
    flushed at every epoch close, so every record of a committed epoch is
    in Kafka; a resumed flow writes the records of replayed epochs again
    (at least once). ``exactly_once=True``: one Kafka transaction per epoch
    and partition, committed only after millpond's commit of the epoch, so
    readers with ``isolation.level=read_committed`` see each record exactly
    once across any number of crashes (records appear when their epoch
    commits). See ``docs/connectors.md`` for the protocol. ``add_config``
    is merged into every producer's librdkafka configuration.
    """

    def __init__(self, brokers: Union[str, Sequence[str]], topic: str, add_config: Optional[Dict[str, Any]] = None,
                 exactly_once: bool = False) -> None:
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a topic name; got {topic!r}")
        self._brokers = brokers_str(brokers)
        self._topic = topic
        self._add_config = dict(add_config or {})
        self._exactly_once = bool(exactly_once)
        self._parts: Optional[List[str]] = None

    def list_parts(self) -> List[str]:
        if self._parts is None:
            count = topic_partitions(self._brokers, [self._topic], self._add_config)[self._topic]
            self._parts = [f"{self._topic}-{p}" for p in range(count)]
        return list(self._parts)

    def route_item(self, item: Any) -> int:
        """The partition of a message: CRC32 of its key, else of its value."""
        if type(item) is not KafkaSinkMessage:
            raise TypeError(f"a KafkaSink takes KafkaSinkMessage items; got {item!r:.80}")
        key = item.key if item.key is not None else item.value
        if key is None:
            return 0
        return zlib.crc32(key if type(key) is bytes else _as_bytes("key", key) or b"")

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> StatefulSinkPartition[Any, Any]:
        partition = int(for_part.rpartition("-")[2])
        name = f"{step_id} ({for_part})"
        if not self._exactly_once:
            conf = client_config(self._brokers, self._add_config, **{"enable.idempotence": True, "linger.ms": 5})
            return _AtLeastOncePartition(conf, self._topic, partition, name)
        txn_id = f"millpond.{step_id}.{for_part}"
        conf = client_config(self._brokers, self._add_config,
                             **{"transactional.id": txn_id, "enable.idempotence": True, "linger.ms": 5})
        marker_conf = client_config(self._brokers, self._add_config,
                                    **{"group.id": txn_id, "enable.auto.commit": False,
                                       "isolation.level": "read_committed"})
        marker_conf.pop("transactional.id", None)  # from add_config: a consumer takes none
        return _ExactlyOncePartition(conf, marker_conf, self._topic, partition, name, resume_state)
