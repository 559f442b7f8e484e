"""The transactional cases: raw Kafka as the baseline, the batch API, commit-to-visible at a
fixed offered rate from many caller threads, and how late back-checks come. Each function is
one run; the runner repeats it."""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka

from benchmarks.collector import Collector
from benchmarks.common import CASE_TIMEOUT_S, TXN_BATCH, WARM_UP, BenchSettings
from rmq_semantics.errors import RmqError
from rmq_semantics.message import Message
from rmq_semantics.tools.coordinator_process import CoordinatorProcess
from rmq_semantics.topics import ensure_topics
from rmq_semantics.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics.transaction_api import Transaction

__all__ = [
    "CHECK_TIMEOUT_MS",
    "NoopListener",
    "bench_baseline",
    "bench_check_lateness",
    "bench_latency",
    "bench_txn",
    "commit_to_visible",
    "coordinator_process",
    "latency_producer",
    "offer_load",
    "warm_paths",
]

# The check case's transaction timeout: short, so a run takes seconds; what it measures is
# the lateness past the deadline, which does not depend on the timeout's length.
CHECK_TIMEOUT_MS = 1000
# A send that raised during a failover is sent again this many times at most.
SEND_ATTEMPTS = 5


class NoopListener(TransactionListener):
    """Commits everything; records when each decision was taken and each check came."""

    def __init__(self, answer: LocalTransactionState = LocalTransactionState.COMMIT_MESSAGE):
        self.answer = answer
        self.decided: dict[str, float] = {}
        self.checked: dict[str, float] = {}

    def execute_local_transaction(
        self, msg: Message | Transaction, arg: Any
    ) -> LocalTransactionState:
        self.decided[msg.transaction_id or ""] = time.monotonic()
        return self.answer

    def check_local_transaction(self, msg: Message | Transaction) -> LocalTransactionState:
        self.checked[msg.transaction_id or ""] = time.time()
        return LocalTransactionState.COMMIT_MESSAGE


def coordinator_process(
    bootstrap: str, prefix: str, log_suffix: str = "", **settings: object
) -> CoordinatorProcess:
    """A coordinator for ``prefix``, its log in the temp directory (named by the prefix, and
    by ``log_suffix`` when several share one prefix)."""
    log_path = Path(tempfile.gettempdir()) / f"rmq-bench-{prefix}{log_suffix}.log"
    return CoordinatorProcess(bootstrap, log_path, settings={"topic_prefix": prefix, **settings})


def bench_baseline(conf: dict, s: BenchSettings) -> float:
    """Raw Kafka: an idempotent producer to a read_committed consumer, msgs/s."""
    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    collector = Collector(conf, topic, s.partitions, s.count, warm_up=WARM_UP)
    collector.start()
    producer = confluent_kafka.Producer(
        {**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    value = os.urandom(s.size)
    for _ in range(WARM_UP):
        producer.produce(topic, value)
    producer.flush(60)
    collector.wait_warm()
    start = time.monotonic()
    for i in range(s.count):
        while True:
            try:
                producer.produce(topic, value, key=str(i % 1000).encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    collector.join(CASE_TIMEOUT_S)
    return collector.measured / ((collector.done_at or time.monotonic()) - start)


def commit_to_visible(decided: dict[str, float], visible: dict[bytes, float]) -> list[float]:
    """Commit-to-visible (ms) of every transaction seen: its local transaction's decision
    (``decided``, by transaction id) to its record reaching the measuring consumer
    (``visible``, by the ``rmq.txn_id`` header's bytes); a transaction not seen is left out."""
    return [(visible[t.encode()] - at) * 1000 for t, at in decided.items() if t.encode() in visible]


def _latencies(listener: NoopListener, collector: Collector) -> list[float]:
    return commit_to_visible(listener.decided, collector.visible)


def bench_txn(
    conf: dict,
    prefix: str,
    s: BenchSettings,
    count: int,
    on_clock: Callable[[bool], None] | None = None,
) -> tuple[float, list[float], str]:
    """The batch API at saturation (batches of 500): msgs/s, commit-to-visible latencies
    (ms, queueing included) and the promoted topic (the Spark case reads it).
    ``on_clock(True)`` is called when the clock starts, ``on_clock(False)`` once every
    record was consumed (to read CPU counters over the measured part only)."""
    topic = f"bench-txn-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    listener = NoopListener()
    collector = Collector(conf, topic, s.partitions, count, warm_up=WARM_UP)
    collector.start()
    value = os.urandom(s.size)
    with TransactionProducer(
        {**conf, "linger.ms": 1},
        producer_group="bench",
        listener=listener,
        topic_prefix=prefix,
        half_partitions=s.partitions,
    ) as producer:
        producer.send_messages_in_transaction([Message(topic, value) for _ in range(WARM_UP)])
        collector.wait_warm()
        listener.decided.clear()
        if on_clock is not None:
            on_clock(True)
        start = time.monotonic()
        for i in range(0, count, TXN_BATCH):
            producer.send_messages_in_transaction(
                [
                    Message(topic, value, key=str(j % 1000))
                    for j in range(i, min(count, i + TXN_BATCH))
                ]
            )
        producer.flush(60)
        collector.join(CASE_TIMEOUT_S)
        if on_clock is not None:
            on_clock(False)
    elapsed = (collector.done_at or time.monotonic()) - start
    return collector.measured / elapsed, _latencies(listener, collector), topic


def bench_latency(
    conf: dict, prefix: str, s: BenchSettings, fault: Callable[[], object] | None = None
) -> tuple[list[float], float]:
    """Commit-to-visible (ms) at ``s.rate`` msgs/s offered by ``s.latency_threads`` threads
    (:func:`offer_load`), and the rate the calls achieved (below the offered one when the
    callers fell behind).

    ``fault()`` is called halfway through the offered load, on a thread of its own (a broker
    failover); a send that raises meanwhile is sent again, as a user's retry would."""
    topic = f"bench-lat-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    count = int(s.rate * s.latency_seconds)
    listener = NoopListener()
    collector = Collector(conf, topic, s.partitions, count, warm_up=WARM_UP)
    collector.start()
    value = os.urandom(s.size)
    with latency_producer(conf, prefix, s, listener) as producer:
        warm_paths(producer, topic, value, s)
        collector.wait_warm()
        listener.decided.clear()
        achieved = offer_load(producer, topic, value, s, fault)
        producer.flush(60)
        collector.join(CASE_TIMEOUT_S)
    return _latencies(listener, collector), achieved


def latency_producer(
    conf: dict, prefix: str, s: BenchSettings, listener: NoopListener
) -> TransactionProducer:
    """The latency cases' producer: the user's conf as they would pass it (the one-message
    path picks its own linger), the bench's coordinator (``prefix``)."""
    return TransactionProducer(
        conf,
        producer_group="bench-lat",
        listener=listener,
        topic_prefix=prefix,
        half_partitions=s.partitions,
    )


def warm_paths(producer: TransactionProducer, topic: str, value: bytes, s: BenchSettings) -> None:
    """:data:`WARM_UP` records to ``topic`` through both of the producer's paths: the batch
    producer and the one-message path's own producer (once per caller thread)."""
    threads = max(1, s.latency_threads)
    producer.send_messages_in_transaction([Message(topic, value) for _ in range(WARM_UP - threads)])
    for _ in range(threads):
        producer.send_message_in_transaction(Message(topic, value))


def offer_load(
    producer: TransactionProducer,
    topic: str,
    value: bytes,
    s: BenchSettings,
    fault: Callable[[], object] | None = None,
) -> float:
    """``s.rate * s.latency_seconds`` calls of ``send_message_in_transaction`` to ``topic``
    from ``s.latency_threads`` threads, each on a schedule of absolute due times (a late
    call does not push the later ones back: the offered rate stays the rate); the rate the
    calls achieved. Raises once every caller is done if one of them failed.

    ``fault()`` is called halfway through, on a thread of its own; a send that raises
    meanwhile is sent again (at most :data:`SEND_ATTEMPTS` times), as a user's retry would."""
    threads = max(1, s.latency_threads)
    count = int(s.rate * s.latency_seconds)
    errors: list[BaseException] = []
    start = time.monotonic() + 0.05  # every thread is waiting before the first due time

    def caller(first: int) -> None:
        try:
            for i in range(first, count, threads):
                delay = start + i / s.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                _send(producer, Message(topic, value, key=str(i % 1000)), retry=fault is not None)
        except Exception as exc:  # reported after the run, not lost in a thread
            errors.append(exc)

    callers = [
        threading.Thread(target=caller, args=(n,), daemon=True, name=f"bench-lat-{n}")
        for n in range(threads)
    ]
    if fault is not None:
        callers.append(
            threading.Timer(max(0.0, start - time.monotonic()) + s.latency_seconds / 2, fault)
        )
    for c in callers:
        c.start()
    for c in callers:
        c.join(CASE_TIMEOUT_S)
    achieved = count / (time.monotonic() - start)
    if errors:
        raise RuntimeError(f"latency: {len(errors)} callers failed: {errors[0]!r}")
    return achieved


def _send(producer: TransactionProducer, msg: Message, retry: bool) -> None:
    for attempt in range(1, SEND_ATTEMPTS + 1):
        try:
            producer.send_message_in_transaction(msg)
            return
        except RmqError:
            if not retry or attempt == SEND_ATTEMPTS:
                raise


def bench_check_lateness(conf: dict, bootstrap: str, s: BenchSettings) -> list[float]:
    """How late (ms) the back-check of an UNKNOW transaction reaches the producer after its
    deadline (send time + :data:`CHECK_TIMEOUT_MS`), with a coordinator of its own."""
    prefix = f"__rmqbenchchk{uuid.uuid4().hex[:6]}"
    topic = f"bench-chk-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    listener = NoopListener(LocalTransactionState.UNKNOW)
    born: dict[str, float] = {}
    with (
        coordinator_process(
            bootstrap,
            prefix,
            transaction_timeout_ms=CHECK_TIMEOUT_MS,
            check_interval_ms=60000,
            half_partitions=s.partitions,
        ) as coordinator,
        TransactionProducer(
            conf,
            producer_group="bench-check",
            listener=listener,
            topic_prefix=prefix,
            half_partitions=s.partitions,
        ) as producer,
    ):
        for _ in range(0, s.check_messages, 10):
            sent_at = time.time()
            for r in producer.send_messages_in_transaction(
                [Message(topic, b"x") for _ in range(10)]
            ):
                born[r.transaction_id] = sent_at
            time.sleep(0.05)  # spread deadlines over time, as real traffic would
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while len(listener.checked) < len(born) and time.monotonic() < deadline:
            coordinator.require_running()
            time.sleep(0.1)
    return [
        (listener.checked[t] - (b + CHECK_TIMEOUT_MS / 1000)) * 1000
        for t, b in born.items()
        if t in listener.checked
    ]
