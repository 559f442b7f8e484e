"""The stall case: how long a crashed coordinator holds back a business topic's readers.

A coordinator promotes inside Kafka transactions, so while one of its transactions is open on
a partition, read_committed readers of that partition see nothing past its first record (the
last stable offset). If the coordinator dies with a transaction open, the broker aborts it
after the coordinator's ``transaction.timeout.ms``, or at once when a coordinator with the same
instance id starts (its ``init_transactions`` fences the old epoch). The producer side never
writes a business topic in a transaction, so a crashed producer holds nothing back.

The case writes a tick to the promoted topic's one partition every few milliseconds with a
plain producer, promotes transactions into the same partition continuously, SIGKILLs the
coordinator, and measures the longest any tick waited to become visible to a read_committed
consumer: once with no coordinator started again, once with one started at once.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import confluent_kafka

from benchmarks.common import CASE_TIMEOUT_S, BenchSettings
from benchmarks.txn import NoopListener, coordinator_process
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.topics import ensure_topics

__all__ = ["bench_stall"]

TICK_S = 0.005
# Ticks flowing with promotions before the kill, and how long ticks must flow freely after.
STEADY_S = 1.5
RECOVERED_S = 1.0
# A tick visible within this long was not held back; one held this long sat behind a
# transaction (not the machine's load).
FREE_S = 0.2
HELD_S = 0.5
# Large transactions keep one open most of the time, so most kills find one.
PROMOTION_BATCH = 500


class _Ticks:
    """A plain producer writing ticks (their send time as the value) and a read_committed
    consumer noting how long each took to become visible."""

    def __init__(self, conf: dict, topic: str) -> None:
        self.topic = topic
        self.delays: list[tuple[float, float]] = []  # (sent at, seconds until visible)
        self._stop = threading.Event()
        self._producer = confluent_kafka.Producer(
            {**conf, "linger.ms": 0, "enable.idempotence": True}
        )
        self._consumer = confluent_kafka.Consumer(
            {
                **conf,
                "group.id": f"bench-stall-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "latest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self._threads = [
            threading.Thread(target=self._tick, daemon=True, name="stall-tick"),
            threading.Thread(target=self._read, daemon=True, name="stall-read"),
        ]

    def start(self) -> None:
        self._consumer.subscribe([self.topic])
        for thread in self._threads:
            thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            self._producer.produce(
                self.topic, repr(time.monotonic()).encode(), b"tick", partition=0
            )
            self._producer.poll(0)

    def _read(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.1)
            if msg is None or msg.error() is not None or msg.key() != b"tick":
                continue
            sent = float(msg.value())  # type: ignore[arg-type]  # a tick has a value
            self.delays.append((sent, time.monotonic() - sent))

    def flowing_since(self, since: float) -> bool:
        """Ticks sent after ``since`` have been visible promptly for RECOVERED_S."""
        recent = [(at, d) for at, d in self.delays if at >= since]
        return (
            bool(recent)
            and recent[-1][0] - recent[0][0] >= RECOVERED_S
            and all(d < FREE_S for at, d in recent if at >= recent[-1][0] - RECOVERED_S)
        )

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._consumer.close()
        self._producer.flush(5)


def _promote(producer: TransactionProducer, topic: str, stop: threading.Event) -> None:
    value = os.urandom(256)
    while not stop.is_set():
        producer.send_messages_in_transaction(
            [Message(topic, value, partition=0) for _ in range(PROMOTION_BATCH)]
        )


def bench_stall(conf: dict, bootstrap: str, s: BenchSettings, restart: bool) -> float:
    """Seconds the longest-held tick waited after the coordinator's SIGKILL, with a new
    coordinator started at once if ``restart``. A kill can fall between two transactions
    (nothing is held then): up to ``s.stall_attempts`` kills, until one finds one open."""
    held = 0.0
    for _ in range(max(1, s.stall_attempts)):
        held = _one_kill(conf, bootstrap, s, restart)
        if held >= HELD_S:
            break
    return held


def _one_kill(conf: dict, bootstrap: str, s: BenchSettings, restart: bool) -> float:
    prefix = f"__rmqstall{uuid.uuid4().hex[:6]}"
    topic = f"bench-stall-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (1, {})})
    instance = f"stall-{uuid.uuid4().hex[:6]}"
    first = coordinator_process(
        bootstrap, prefix, instance_id=instance, half_partitions=s.partitions
    )
    later = None
    ticks = _Ticks(conf, topic)
    stop = threading.Event()
    try:
        first.start()
        first.wait_ready()
        with TransactionProducer(
            conf,
            producer_group="bench-stall",
            listener=NoopListener(),
            topic_prefix=prefix,
            half_partitions=s.partitions,
        ) as producer:
            promoter = threading.Thread(
                target=_promote, args=(producer, topic, stop), daemon=True, name="stall-promote"
            )
            ticks.start()
            promoter.start()
            time.sleep(STEADY_S)  # promotions and ticks share the partition meanwhile
            killed_at = time.monotonic()
            first.kill()
            stop.set()
            if restart:
                later = coordinator_process(
                    bootstrap, prefix, "-2", instance_id=instance, half_partitions=s.partitions
                ).start()
            deadline = killed_at + CASE_TIMEOUT_S
            while not ticks.flowing_since(killed_at) and time.monotonic() < deadline:
                time.sleep(0.1)
            promoter.join(CASE_TIMEOUT_S)
        return max((d for at, d in ticks.delays if at >= killed_at - FREE_S), default=0.0)
    finally:
        ticks.close()
        if later is not None:
            later.stop()
        first.stop()
