"""PLACEHOLDER for the bare exactly-once copier case (issue 13), written by the copier
helper; this naive version only keeps the harness runnable until that one is merged: one
Kafka transaction per consumed batch, no tuning. Interface: the two functions below."""

from __future__ import annotations

import os
import threading
import time
import uuid

import confluent_kafka

from rmq_semantics.records.headers import H
from rmq_semantics.tools.bench.collector import Collector
from rmq_semantics.tools.bench.common import CASE_TIMEOUT_S, WARM_UP, BenchSettings, fill
from rmq_semantics.topics import ensure_topics

__all__ = ["copier_latency", "copier_throughput"]


def _copy(conf: dict, source: str, dest: str, stop: threading.Event) -> None:
    consumer = confluent_kafka.Consumer({**conf, "group.id": f"copier-{uuid.uuid4().hex[:8]}",
                                         "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest",
                                         "isolation.level": "read_committed"})
    producer = confluent_kafka.Producer({**conf, "transactional.id": uuid.uuid4().hex,
                                         "linger.ms": 1})
    producer.init_transactions(30)
    consumer.subscribe([source])
    try:
        while not stop.is_set():
            msgs = [m for m in consumer.consume(500, 0.05) if m.error() is None]
            if not msgs:
                continue
            producer.begin_transaction()
            for m in msgs:
                producer.produce(dest, m.value(), key=m.key(), headers=m.headers())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
    finally:
        consumer.close()


def _topics(conf: dict, s: BenchSettings) -> tuple[str, str]:
    source, dest = (f"bench-copy-{n}-{uuid.uuid4().hex[:8]}" for n in ("in", "out"))
    ensure_topics(conf, {source: (s.partitions, {}), dest: (s.partitions, {})})
    return source, dest


def _run(conf: dict, s: BenchSettings, want: int, feed) -> Collector:
    source, dest = _topics(conf, s)
    collector = Collector(conf, dest, s.partitions, want, warm_up=WARM_UP)
    collector.start()
    stop = threading.Event()
    copier = threading.Thread(target=_copy, args=(conf, source, dest, stop), daemon=True)
    copier.start()
    try:
        fill(conf, source, WARM_UP, s.size, key=str)
        collector.wait_warm()
        feed(source)
        collector.join(CASE_TIMEOUT_S)
    finally:
        stop.set()
        copier.join(CASE_TIMEOUT_S)
    return collector


def copier_throughput(conf: dict, s: BenchSettings) -> float:
    """Records copied and visible per second (one run)."""
    started: list[float] = []

    def feed(source: str) -> None:
        started.append(time.monotonic())
        fill(conf, source, s.count, s.size, key=str)

    collector = _run(conf, s, s.count, feed)
    return collector.measured / ((collector.done_at or time.monotonic()) - started[0])


def copier_latency(conf: dict, s: BenchSettings) -> list[float]:
    """Input-to-visible latencies (ms) at ``s.rate`` records/s offered (one run)."""
    count = int(s.rate * s.latency_seconds)
    sent: dict[bytes, float] = {}

    def feed(source: str) -> None:
        producer = confluent_kafka.Producer({**conf, "linger.ms": 0})
        value, start = os.urandom(s.size), time.monotonic()
        for i in range(count):
            delay = start + i / s.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            ident = uuid.uuid4().hex.encode()
            sent[ident] = time.monotonic()
            producer.produce(source, value, key=str(i).encode(), headers=[(H.TXN_ID, ident)])
            producer.poll(0)
        producer.flush(60)

    collector = _run(conf, s, count, feed)
    return [(collector.visible[i] - at) * 1000 for i, at in sent.items()
            if i in collector.visible]
