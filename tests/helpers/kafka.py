"""A real Apache Kafka broker for pytest: ``tools/kafka/broker.py``.

``kafka_broker`` (session scope, registered in ``tests/conftest.py``)
fetches the broker's jars once (``build/kafka``, or ``MILLPOND_KAFKA_CACHE``;
about a minute the first time, a file lock keeps two xdist workers from
fetching at once), starts one KRaft broker on 127.0.0.1 for the worker and
always stops it afterwards. It yields a :class:`KafkaTestBroker` with the
bootstrap address and helpers built on confluent-kafka's own clients
(an independent check of what millpond's connector wrote).

Under pytest-xdist a session fixture is made once per worker: keep the
tests that use it in few modules (``--dist loadfile`` hands out whole
modules), so at most one broker runs per worker. Use
:meth:`KafkaTestBroker.topic_name` for a topic per test.

Without ``java``, ``mvn`` (for a first fetch) or an importable
``confluent_kafka`` the fixture skips its tests with the reason, shown in
the ``-ra`` summary; a broker that fails to start is an error.

The broker has a second listener, SASL_PLAINTEXT with users ``admin`` (a
super user) and ``limited`` (only what ACLs grant it), for tests of a
client that is refused: see :meth:`KafkaTestBroker.sasl_config` and
:meth:`KafkaTestBroker.allow`. The PLAINTEXT listener's clients may do
anything.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import pytest

REPO = Path(__file__).resolve().parents[2]
BROKER_PY = REPO / "tools" / "kafka" / "broker.py"

log = logging.getLogger(__name__)

Bytesish = Union[bytes, str, None]
#: A record read back: (key, value, partition, offset).
Record = Tuple[Optional[bytes], Optional[bytes], int, int]


def broker_module() -> ModuleType:
    """``tools/kafka/broker.py``, loaded by path (once per process)."""
    name = "mp_kafka_broker"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, BROKER_PY)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def _b(x: Bytesish) -> Optional[bytes]:
    return x.encode() if isinstance(x, str) else x


class KafkaTestBroker:
    """A running broker and confluent-kafka helpers to set up and check topics."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.bootstrap: str = broker.bootstrap
        self.sasl_bootstrap: str = broker.sasl_bootstrap
        self._admin: Any = None

    # ---- clients

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    def sasl_config(self, user: str) -> Dict[str, str]:
        """Client settings to connect as ``user`` (``admin`` or ``limited``) over SASL/PLAIN."""
        return dict(self.broker.sasl_config(user))

    def log_tail(self, lines: int = 40) -> str:
        return str(self.broker.log_tail(lines))

    # ---- topics

    @staticmethod
    def topic_name(prefix: str = "t") -> str:
        """A topic name no other test uses."""
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    def create_topic(self, name: str, partitions: int = 1, config: Optional[Dict[str, str]] = None,
                     timeout: float = 30) -> str:
        """Create ``name`` and wait until every partition has a leader; return the name."""
        from confluent_kafka.admin import NewTopic

        fut = self.admin().create_topics([NewTopic(name, partitions, 1, config=config or {})],
                                         operation_timeout=timeout, request_timeout=timeout)
        fut[name].result(timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            md = self.admin().list_topics(topic=name, timeout=timeout).topics.get(name)
            if md is not None and md.error is None and len(md.partitions) == partitions \
                    and all(p.leader >= 0 for p in md.partitions.values()):
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} has no leader for every partition after {timeout} s")
            time.sleep(0.05)

    def partitions(self, topic: str) -> int:
        md = self.admin().list_topics(topic=topic, timeout=10).topics[topic]
        if md.error is not None:
            raise RuntimeError(f"topic {topic}: {md.error}")
        return len(md.partitions)

    def end_offsets(self, topic: str) -> Dict[int, int]:
        """``{partition: high watermark}`` (transaction markers included)."""
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "mp-test-offsets",
                      "enable.auto.commit": False})
        try:
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in range(self.partitions(topic))}
        finally:
            c.close()

    # ---- writing

    def produce(self, topic: str, records: Iterable[Sequence[Any]], *, transactional: Optional[str] = None,
                abort: bool = False, timeout: float = 30) -> int:
        """Write ``records`` to ``topic``: each ``(key, value)`` or
        ``(key, value, partition)`` (str is UTF-8 encoded, None stays None;
        without a partition librdkafka's murmur2 partitioner picks one, as
        Java's default does). With ``transactional`` (a transactional id)
        they go in one transaction, committed, or aborted with ``abort``.
        Raises on any delivery error; returns how many were written."""
        from confluent_kafka import KafkaError, KafkaException, Producer

        conf: Dict[str, Any] = {"bootstrap.servers": self.bootstrap, "partitioner": "murmur2_random",
                                "linger.ms": 5, "enable.idempotence": True, "log.connection.close": False}
        if transactional:
            conf["transactional.id"] = transactional
        p = Producer(conf)
        errors: List[Any] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        if transactional:
            p.init_transactions(timeout)
            p.begin_transaction()
        n = 0
        for rec in records:
            kw: Dict[str, Any] = {"key": _b(rec[0]), "value": _b(rec[1]), "on_delivery": delivered}
            if len(rec) > 2 and rec[2] is not None:
                kw["partition"] = rec[2]
            while True:
                try:
                    p.produce(topic, **kw)
                    break
                except BufferError:
                    p.poll(0.1)
            n += 1
        if transactional:
            if abort:
                p.flush(timeout)  # the records reach the log, then the abort marker
                p.abort_transaction(timeout)
                errors = [e for e in errors if e.code() != KafkaError._PURGE_QUEUE]
            else:
                p.commit_transaction(timeout)
        left = p.flush(timeout)
        if left:
            raise TimeoutError(f"{left} records to {topic} not delivered within {timeout} s")
        if errors:
            raise KafkaException(errors[0])
        return n

    # ---- reading

    def read_all(self, topic: str, isolation: str = "read_committed", timeout: float = 30) -> List[Record]:
        """Every record of every partition of ``topic`` up to its end (with
        ``read_committed``: committed transactions and non-transactional
        records only), as ``(key, value, partition, offset)`` sorted by
        partition and offset."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

        n = self.partitions(topic)
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"mp-test-read-{uuid.uuid4().hex[:8]}",
                      "enable.auto.commit": False, "enable.partition.eof": True,
                      "isolation.level": isolation, "auto.offset.reset": "earliest"})
        out: List[Record] = []
        try:
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(n)])
            at_end: set = set()
            deadline = time.monotonic() + timeout
            while len(at_end) < n:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"read_all({topic!r}): partitions {sorted(set(range(n)) - at_end)} "
                                       f"not read to their end within {timeout} s (an open transaction?)")
                for m in c.consume(num_messages=1000, timeout=0.5):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            at_end.add(m.partition())
                            continue
                        raise KafkaException(err)
                    at_end.discard(m.partition())
                    out.append((m.key(), m.value(), m.partition(), m.offset()))
        finally:
            c.close()
        out.sort(key=lambda r: (r[2], r[3]))
        return out

    # ---- ACLs (for the SASL user ``limited``)

    def allow(self, principal: str, resource_type: str, name: str, operations: Sequence[str],
              prefixed: bool = False) -> None:
        """Grant ``principal`` (e.g. ``"User:limited"``) ``operations``
        (``"READ"``, ``"WRITE"``, ``"DESCRIBE"``...) on a resource
        (``"TOPIC"``, ``"GROUP"``, ``"TRANSACTIONAL_ID"``, ``"CLUSTER"``)."""
        from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                           ResourceType)

        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        bindings = [AclBinding(ResourceType[resource_type], name, pattern, principal, "*",
                               AclOperation[op], AclPermissionType.ALLOW) for op in operations]
        for fut in self.admin().create_acls(bindings, request_timeout=30).values():
            fut.result(timeout=30)

    def close(self) -> None:
        """Drop the cached clients (before the broker stops: they would
        retry connecting to it until the process ends)."""
        self._admin = None
        gc.collect()

    # ---- set-up

    def warm_up(self, timeout: float = 60) -> None:
        """Make the broker create its internal topics now (the transaction
        coordinator's first ``init_transactions`` retries while its topic
        loads), so the first test does not pay for it."""
        topic = self.create_topic(self.topic_name("warmup"), 1)
        self.produce(topic, [("k", "v")], transactional=f"mp-warmup-{uuid.uuid4().hex[:6]}", timeout=timeout)
        assert len(self.read_all(topic, timeout=timeout)) == 1


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaTestBroker]:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError as e:
        pytest.skip(f"Kafka tests need confluent-kafka ({e}); pip install -e '.[test]' brings it")
    mod = broker_module()
    broker = mod.Broker(sasl_users=mod.DEFAULT_SASL_USERS)
    try:
        broker.start()  # stops what it started if it fails
    except mod.BrokerUnavailable as e:
        pytest.skip(f"no Kafka broker on this machine: {e}")
    try:
        kb = KafkaTestBroker(broker)
        t0 = time.monotonic()
        kb.warm_up()
        log.info("Kafka broker %s: started in %.1f s, warmed up in %.1f s", kb.bootstrap,
                 broker.start_seconds, time.monotonic() - t0)
        yield kb
        kb.close()
    finally:
        broker.stop()
