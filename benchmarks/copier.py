"""The physical limit: a bare exactly-once copier (the TransactionalMessageCopier of Kafka's
system tests), to say how close the layer's promotion comes to what Kafka can do.

A read_committed consumer and transactional producers copy one topic to another in Kafka
transactions (``send_offsets_to_transaction``): no header parsed, no state, no check. It runs
in a process of its own, with the layer's sizes, partitions and cap per transaction.
``copier_throughput`` measures msgs/s copied from a filled input; ``copier_latency`` the ms
from an input produce call to the copy being visible to a read_committed consumer process.

Built with care, or it measures itself rather than the limit:
- two transactional producers take turns: a transaction that starts while the previous
  one's markers are still being written gets CONCURRENT_TRANSACTIONS, and librdkafka retries
  AddPartitionsToTxn after a fixed 20 ms (not retry.backoff.ms); the other producer's
  transaction is long finished. Only one transaction is open at a time, so offsets stay
  ordered and exactly-once holds;
- a batch is whatever arrived while the previous transaction committed (no timer), at most
  the coordinator's cap; linger 0, short retry backoffs, a 10 ms fetch wait, no per-record
  delivery callback. (Python's GC barely runs here: confluent-kafka's messages are not
  tracked by it.)
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition

from benchmarks.collector import Collector
from benchmarks.common import CASE_TIMEOUT_S, WARM_UP, BenchSettings, fill
from rmq_semantics.consumed import offset_of, partition_of
from rmq_semantics.records.headers import H
from rmq_semantics.topics import ensure_topics

__all__ = ["copier_latency", "copier_throughput"]

# Records per Kafka transaction at most: the coordinator's cap (coordinator.txn_service).
MAX_BATCH = 4000
# An idle copier waits this long per poll, so it sees a stop this late.
POLL_WAIT_S = 0.05
# Every transactional call's timeout: generous for a loaded 2-core broker (ms normally).
TXN_CALL_TIMEOUT_S = 30.0
# As the coordinator's: a dead copier's open transaction blocks readers this long.
TRANSACTION_TIMEOUT_MS = 10000


@dataclass(frozen=True)
class CopierTuning:
    """The levers the copier is built with; the defaults measured best (or no worse)."""

    #: Transactional producers taking turns, one transaction open at a time.
    producers: int = 2
    linger_ms: int = 0
    #: AddOffsetsToTxn's retry after CONCURRENT_TRANSACTIONS (exponential up to the max).
    retry_backoff_ms: int = 2
    retry_backoff_max_ms: int = 20
    fetch_wait_max_ms: int = 10
    nagle_disable: bool = True


def producer_conf(conf: dict, tuning: CopierTuning, transactional_id: str) -> dict:
    return {
        **conf,
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": tuning.linger_ms,
        "retry.backoff.ms": tuning.retry_backoff_ms,
        "retry.backoff.max.ms": tuning.retry_backoff_max_ms,
        "socket.nagle.disable": tuning.nagle_disable,
        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        "delivery.report.only.error": True,
    }


def consumer_conf(conf: dict, tuning: CopierTuning, group: str) -> dict:
    return {
        **conf,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": tuning.fetch_wait_max_ms,
        "socket.nagle.disable": tuning.nagle_disable,
    }


class _Copier:
    """The copy loop of the copier process; :meth:`step` is one Kafka transaction."""

    def __init__(
        self, conf: dict, tuning: CopierTuning, source: str, target: str, partitions: int
    ) -> None:
        name = f"bench-copier-{uuid.uuid4().hex[:8]}"
        self.source, self.target = source, target
        self.consumer = confluent_kafka.Consumer(consumer_conf(conf, tuning, name))
        self.assignment = [
            TopicPartition(source, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)
        ]
        self.consumer.assign(self.assignment)
        # Where each partition's copy resumes after an aborted transaction.
        self.committed = {p: confluent_kafka.OFFSET_BEGINNING for p in range(partitions)}
        self.producers = [
            confluent_kafka.Producer(producer_conf(conf, tuning, f"{name}-{n}"))
            for n in range(max(1, tuning.producers))
        ]
        for producer in self.producers:
            producer.init_transactions(TXN_CALL_TIMEOUT_S)
        self.metadata = self.consumer.consumer_group_metadata()
        self.turn = 0
        self.copied = 0

    def step(self) -> None:
        first = self.consumer.poll(POLL_WAIT_S)
        if first is None:
            return
        # What arrived while the last transaction committed, without waiting for more.
        records = [
            m for m in (first, *self.consumer.consume(MAX_BATCH - 1, 0)) if m.error() is None
        ]
        if not records:
            return
        producer = self.producers[self.turn]
        self.turn = (self.turn + 1) % len(self.producers)
        resume_at: dict[int, int] = {}
        try:
            producer.begin_transaction()
            for m in records:
                partition = partition_of(m)
                producer.produce(self.target, m.value(), m.key(), partition, headers=m.headers())
                resume_at[partition] = offset_of(m) + 1  # a partition's records come in order
            producer.send_offsets_to_transaction(
                [TopicPartition(self.source, p, o) for p, o in resume_at.items()],
                self.metadata,
                TXN_CALL_TIMEOUT_S,
            )
            producer.commit_transaction(TXN_CALL_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise
            # Abort and copy again from the last committed offsets: exactly once.
            producer.abort_transaction(TXN_CALL_TIMEOUT_S)
            for p, offset in self.committed.items():
                self.consumer.seek(TopicPartition(self.source, p, offset))
            return
        self.committed.update(resume_at)
        self.copied += len(records)

    def close(self) -> None:
        self.consumer.close()
        for producer in self.producers:
            producer.flush(TXN_CALL_TIMEOUT_S)


def _copier_main(
    conf: dict,
    tuning: CopierTuning,
    source: str,
    target: str,
    partitions: int,
    pause_after: int,
    ready: Any,
    go: Any,
    stop: Any,
) -> None:
    """The copier process. With ``pause_after``, it pauses once that many records were
    copied (every client connected and warm), sets ``ready`` and resumes on ``go``."""
    copier = _Copier(conf, tuning, source, target, partitions)
    try:
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while not stop.is_set() and time.monotonic() < deadline:
            copier.step()
            if pause_after and copier.copied >= pause_after and not go.is_set():
                copier.consumer.pause(copier.assignment)
                ready.set()
                while not go.wait(POLL_WAIT_S) and not stop.is_set():
                    copier.consumer.poll(0)
                copier.consumer.resume(copier.assignment)
    finally:
        copier.close()


class _CopierProcess:
    def __init__(
        self,
        conf: dict,
        tuning: CopierTuning,
        source: str,
        target: str,
        partitions: int,
        pause_after: int = 0,
    ) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # never fork a process with librdkafka
        self.ready, self.go, self.stop = ctx.Event(), ctx.Event(), ctx.Event()
        self._process = ctx.Process(
            target=_copier_main,
            daemon=True,
            args=(
                conf,
                tuning,
                source,
                target,
                partitions,
                pause_after,
                self.ready,
                self.go,
                self.stop,
            ),
        )

    def __enter__(self) -> _CopierProcess:
        self._process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._process.join(TXN_CALL_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(TXN_CALL_TIMEOUT_S)
        elif self._process.exitcode and exc[0] is None:
            raise RuntimeError(
                f"the copier process failed (exit code "
                f"{self._process.exitcode}); see its traceback above"
            )

    def wait_ready(self) -> None:
        if not self.ready.wait(CASE_TIMEOUT_S):
            raise RuntimeError("the copier never copied its warm-up records")


def _topics(conf: dict, s: BenchSettings) -> tuple[str, str]:
    run = uuid.uuid4().hex[:8]
    source, target = f"bench-copy-in-{run}", f"bench-copy-out-{run}"
    ensure_topics(conf, {source: (s.partitions, {}), target: (s.partitions, {})})
    return source, target


def _key(i: int) -> str:
    return str(i % 1000)


def _throughput(conf: dict, s: BenchSettings, tuning: CopierTuning) -> float:
    source, target = _topics(conf, s)
    fill(conf, source, WARM_UP, s.size, key=_key)
    collector = Collector(conf, target, s.partitions, s.count, warm_up=WARM_UP)
    collector.start()
    with _CopierProcess(conf, tuning, source, target, s.partitions, pause_after=WARM_UP) as copier:
        collector.wait_warm()
        copier.wait_ready()
        # The input is filled while the copier is paused: the clock covers fetching it too.
        fill(conf, source, s.count, s.size, key=_key)
        start = time.monotonic()
        copier.go.set()
        collector.join(CASE_TIMEOUT_S)
    return collector.measured / ((collector.done_at or time.monotonic()) - start)


def _latency(conf: dict, s: BenchSettings, tuning: CopierTuning) -> list[float]:
    source, target = _topics(conf, s)
    count = int(s.rate * s.latency_seconds)
    fill(conf, source, WARM_UP, s.size, key=_key)
    collector = Collector(conf, target, s.partitions, count, warm_up=WARM_UP)
    collector.start()
    producer = confluent_kafka.Producer(
        {
            **conf,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": tuning.linger_ms,
            "socket.nagle.disable": tuning.nagle_disable,
        }
    )
    value = os.urandom(s.size)
    sent: dict[bytes, float] = {}
    with _CopierProcess(conf, tuning, source, target, s.partitions):
        collector.wait_warm()
        start = time.monotonic()
        for i in range(count):
            delay = start + i / s.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            # The Collector keys visibility by this header; the copier copies it as bytes.
            record_id = f"copy-{i}".encode()
            sent[record_id] = time.monotonic()
            producer.produce(source, value, key=_key(i), headers=[(H.TXN_ID, record_id)])
            producer.poll(0)
        producer.flush(TXN_CALL_TIMEOUT_S)
        collector.join(CASE_TIMEOUT_S)
    return [(collector.visible[r] - at) * 1000 for r, at in sent.items() if r in collector.visible]


def copier_throughput(conf: dict, s: BenchSettings) -> float:
    """Msgs/s the copier copies from an input filled with ``s.count`` records, as seen by a
    read_committed consumer process; the clock starts after a warm-up."""
    return _throughput(conf, s, CopierTuning())


def copier_latency(conf: dict, s: BenchSettings) -> list[float]:
    """Ms from each input produce call to the copy being visible to a read_committed
    consumer process, at ``s.rate`` msgs/s offered for ``s.latency_seconds``."""
    return _latency(conf, s, CopierTuning())
