"""Flows of tests/test_kafka.py, importable by a child ``python -m millpond.run``
(``PYTHONPATH`` = pysrc and tests: ``helpers.kafkaflows:wordcount(...)``).

Every flow takes the broker address and topic names as arguments, so a
test builds its import string with its own topics.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, Optional

import millpond.operators as op
from millpond.connectors.files import FileSink
from millpond.connectors.kafka import KafkaSinkMessage, KafkaSource
from millpond.connectors.kafka import operators as kop
from millpond.dataflow import Dataflow


def _slow(delay: float, fn: Any) -> Any:
    def wrapped(x: Any) -> Any:
        if delay:
            time.sleep(delay)
        return fn(x)

    return wrapped


def _count(n: Optional[int], _word: str) -> "tuple[int, int]":
    n = (n or 0) + 1
    return n, n


def wordcount(brokers: str, src: str, dst: str, exactly_once: bool = True, delay: float = 0.0,
              batch_size: int = 20, name: str = "kwc", sink_brokers: Optional[str] = None,
              sink_config: Optional[Dict[str, Any]] = None) -> Dataflow:
    """Kafka ``src`` (values: lines of words) -> running count per word ->
    Kafka ``dst``: one record ``key=word, value=str(count)`` per word read,
    so every (word, n) for n in 1..count(word) appears exactly once in an
    exactly-once output. ``delay`` seconds per record slow it down so a
    SIGKILL lands mid-run. The source stops the flow on any broker error."""
    flow = Dataflow(name)
    lines = op.input("in", flow, KafkaSource(brokers, src, tail=False, batch_size=batch_size))
    words = op.flat_map("split", lines, _slow(delay, lambda m: m.value.decode().split()))
    keyed = op.key_on("key", words, lambda w: w)
    counts = op.stateful_map("count", keyed, _count)
    msgs = op.map("msg", counts, lambda kv: KafkaSinkMessage(kv[0].encode(), str(kv[1]).encode()))
    kop.output("out", msgs, brokers=sink_brokers or brokers, topic=dst, exactly_once=exactly_once,
               add_config=sink_config)
    return flow


def wordcount_kafka_never_commits(brokers: str, src: str, dst: str) -> Dataflow:
    """:func:`wordcount`, exactly once, in a process where the sink never
    hears of millpond's commits: every epoch is committed by millpond and
    none by Kafka, as when a process dies between the two commits (its
    open transaction is aborted when the run closes)."""
    from millpond.connectors.kafka import sink

    def never(self: Any, epoch: int) -> None:
        return None

    sink._ExactlyOncePartition.commit = never  # type: ignore[method-assign]
    return wordcount(brokers, src, dst, name="kwc_gap")


def dump(brokers: str, topics: Any, out: str, tail: bool = False, starting_offset: str = "earliest",
         delay: float = 0.0, batch_size: int = 10, name: str = "kdump") -> Dataflow:
    """Kafka ``topics`` -> a file, one line per record:
    ``topic partition offset key value`` (key and value UTF-8, '-' for None)."""
    flow = Dataflow(name)
    recs = op.input("in", flow, KafkaSource(brokers, topics, tail=tail, starting_offset=starting_offset,
                                            batch_size=batch_size))

    def line(m: Any) -> str:
        key = m.key.decode() if m.key is not None else "-"
        value = m.value.decode() if m.value is not None else "-"
        return f"{m.topic} {m.partition} {m.offset} {key} {value}"

    lines = op.map("line", recs, _slow(delay, line))
    op.output("out", op.key_on("all", lines, lambda _l: "all"), FileSink(out))
    return flow


def deserialize(brokers: str, topic: str, oks_out: str, errs_out: str, name: str = "kjson") -> Dataflow:
    """Kafka JSON values -> ``kop.deserialize_value``; decoded records to
    ``oks_out`` (``partition offset json``), error items to ``errs_out``
    (``partition offset`` of the record, then the error text)."""
    flow = Dataflow(name)
    src = kop.input("in", flow, brokers=brokers, topics=topic, tail=False, batch_size=7)
    dec = kop.deserialize_value("json", src.oks, json.loads)

    def ok_line(m: Any) -> str:
        return f"{m.partition} {m.offset} {json.dumps(m.value, sort_keys=True)}"

    def err_line(e: Any) -> str:
        where = f"{e.msg.partition} {e.msg.offset}" if e.msg is not None else "? ?"
        return f"{where} {e.error}".replace("\n", " ")

    op.output("oks", op.key_on("k1", op.map("okl", dec.oks, ok_line), lambda _l: "all"), FileSink(oks_out))
    errs = op.merge("allerrs", src.errs, dec.errs)
    op.output("errs", op.key_on("k2", op.map("errl", errs, err_line), lambda _l: "all"), FileSink(errs_out))
    return flow
