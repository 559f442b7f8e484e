"""The measuring consumer of the bench: a read_committed consumer in a process of its own
that reports how many records came, when, and when each transaction id became visible."""

from __future__ import annotations

import time
import uuid
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from benchmarks.common import CASE_TIMEOUT_S
from rmq_semantics.consumed import headers_of
from rmq_semantics.records.headers import H

__all__ = ["Collector", "note_record"]


def _consumer(conf: dict, topic: str, partitions: int) -> confluent_kafka.Consumer:
    consumer = confluent_kafka.Consumer(
        {
            **conf,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign(
        [TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)]
    )
    return consumer


def note_record(
    headers: list[tuple[str, bytes | None]],
    now: float,
    visible: dict[bytes | None, float],
    seen: set[tuple[bytes | None, bytes | None]] | None,
) -> bool:
    """Note one consumed record's ``rmq.txn_id`` as visible at ``now``; False when it is a
    copy of a record already noted, which then counts for nothing.

    ``seen`` None: every record counts, and a transaction id is visible when its last
    record came (the records of a batch transaction commit together). With a set (a sink
    that delivers at least once): a record is the pair (``rmq.txn_id``,
    ``rmq.promoted_from``), kept at its first copy as the docs tell consumers, and a
    transaction id is visible when its first record came."""
    txn_id = next((v for k, v in reversed(headers) if k == H.TXN_ID), None)
    if seen is None:
        if any(k == H.TXN_ID for k, _ in headers):
            visible[txn_id] = now
        return True
    key = (txn_id, next((v for k, v in reversed(headers) if k == H.PROMOTED_FROM), None))
    if key in seen:
        return False
    seen.add(key)
    if txn_id is not None:
        visible.setdefault(txn_id, now)
    return True


def _collect(
    conf: dict,
    topic: str,
    partitions: int,
    want: int,
    warm_up: int,
    distinct: bool,
    warmed: Any,
    results: Any,
) -> None:
    """The collector process: consume until ``want`` records came; send back the count, when
    it finished and when each txn id became visible (CLOCK_MONOTONIC is system-wide)."""
    consumer = _consumer(conf, topic, partitions)
    count, visible = 0, dict[bytes | None, float]()
    seen: set[tuple[bytes | None, bytes | None]] | None = set() if distinct else None
    deadline = time.monotonic() + CASE_TIMEOUT_S
    try:
        while count < want and time.monotonic() < deadline:
            # Wait for one record, then take what is queued without waiting for more.
            first = consumer.poll(0.05)
            if first is None:
                continue
            for msg in [first, *consumer.consume(999, 0)]:
                if msg.error() is not None:
                    continue
                if not note_record(headers_of(msg), time.monotonic(), visible, seen):
                    continue
                count += 1
                if count == warm_up:
                    warmed.set()
        results.send((count, time.monotonic(), visible))
    finally:
        consumer.close()


class Collector:
    """Consumes ``topic`` until ``warm_up + want`` records came, in a process of its own (as
    a real consumer would be: in the producer's process it competed with the producer for
    the GIL and measured itself). The clock starts once the ``warm_up`` records came: then
    every client on the path is connected and knows the topic. ``distinct``: the topic is
    written at least once (the Spark job's Kafka sink); copies count for nothing and a
    transaction id is visible at its first record (:func:`note_record`)."""

    def __init__(
        self,
        conf: dict,
        topic: str,
        partitions: int,
        want: int,
        warm_up: int = 1,
        distinct: bool = False,
    ) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # never fork a process with librdkafka
        self.warm_up = max(1, warm_up)
        self.warmed = ctx.Event()
        self._results, child_end = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_collect,
            daemon=True,
            args=(
                conf,
                topic,
                partitions,
                self.warm_up + want,
                self.warm_up,
                distinct,
                self.warmed,
                child_end,
            ),
        )
        self.count = 0
        self.done_at: float | None = None
        self.visible: dict[bytes, float] = {}

    def start(self) -> None:
        self._process.start()

    def wait_warm(self) -> None:
        if not self.warmed.wait(CASE_TIMEOUT_S):
            raise RuntimeError(f"the {self.warm_up} warm-up records never arrived")

    def join(self, timeout: float) -> None:
        if self._results.poll(timeout):
            self.count, self.done_at, self.visible = self._results.recv()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()

    @property
    def measured(self) -> int:
        return max(0, self.count - self.warm_up)
