"""Dead letters: a batch retried ``max_reconsume_times`` times goes to the group's DLQ topic.

Each record keeps its key, value and headers, plus where it came from, how often it was
retried, why its last call failed, the listener's exception if it raised, and its first and
last failure (the ``rmq.dlq.*`` headers). The topic is a system topic, replicated as the
others (:func:`~rmq_semantics.topics.replication_for`). Sends are synchronous (the queue
moves on only once the broker has them); the caller checks the queue lock first, like a
commit.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from rmq_semantics.errors import KafkaOperationError, RmqError, RmqTimeoutError
from rmq_semantics.orderly.api import OrderlyMessage
from rmq_semantics.orderly.runtime import event
from rmq_semantics.producer import producer_defaults
from rmq_semantics.records.dead_letter import dlq_headers
from rmq_semantics.topics import ensure_topics

__all__ = ["DeadLetters", "Failure"]

log = logging.getLogger(__name__)

# Dead-letter sends wait for the broker's acknowledgement.
DLQ_TIMEOUT_S = 30.0


@dataclass
class Failure:
    """Why a batch's last call failed (one of ``records.headers.DLQ_REASONS``), the
    listener's exception if it raised, and its first and last failure (epoch ms)."""

    reason: str = "suspended"
    error: BaseException | None = None
    first_ms: int = 0
    last_ms: int = 0

    def record(self, reason: str, error: BaseException | None = None) -> None:
        now = int(time.time() * 1000)
        self.first_ms = self.first_ms or now
        self.reason, self.error, self.last_ms = reason, error, now


class DeadLetters:
    """The DLQ topic of one consumer group, created and connected on first use; one
    producer shared by every worker."""

    def __init__(self, conf: dict, topic: str) -> None:
        self.topic = topic
        self._conf = conf
        self._producer: confluent_kafka.Producer | None = None
        self._topic_ready = False
        self._lock = threading.Lock()

    def send(self, batch: list[OrderlyMessage], epoch: int, failure: Failure | None = None) -> bool:
        """Dead-letter ``batch`` (run under the lock of ``epoch``) with its last
        ``failure``; False when it could not be sent: the caller retries later."""
        try:
            # Another worker's flush holds the producer at most DLQ_TIMEOUT_S.
            if not self._lock.acquire(timeout=DLQ_TIMEOUT_S):
                raise RmqTimeoutError(f"another queue is dead-lettering to {self.topic}")
            try:
                self._send(batch, failure or Failure())
            finally:
                self._lock.release()
        except (RmqError, KafkaException, BufferError) as exc:
            log.warning("%s: could not dead-letter (%s); will retry", batch[0].where, exc)
            return False
        for m in batch:
            log.warning(
                "%s sent to %s after %d reconsumes (last call: %s)",
                m.where,
                self.topic,
                m.reconsume_times,
                (failure or Failure()).reason,
                extra=event(
                    "dlq", topic=m.topic, partition=m.partition, offset=m.offset, epoch=epoch
                ),
            )
        return True

    def _send(self, batch: list[OrderlyMessage], failure: Failure) -> None:
        if not self._topic_ready:
            ensure_topics(self._conf, {self.topic: (1, {})}, replicated=True)
            self._topic_ready = True
        if self._producer is None:
            self._producer = confluent_kafka.Producer(producer_defaults(self._conf, internal=True))
        producer = self._producer
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(err)

        for m in batch:
            headers = dlq_headers(
                m.headers,
                topic=m.topic,
                partition=m.partition,
                offset=m.offset,
                reconsume_times=m.reconsume_times,
                error=failure.error,
                reason=failure.reason,
                first_failure_ms=failure.first_ms or None,
                last_failure_ms=failure.last_ms or None,
            )
            producer.produce(
                self.topic, m.value, key=m.key, headers=headers, on_delivery=on_delivery
            )
        left = producer.flush(DLQ_TIMEOUT_S)
        if left or errors:
            detail = errors[0].str() if errors else f"{left} not delivered in time"
            raise KafkaOperationError(
                f"dead-lettering to {self.topic}: {detail}", errors[0] if errors else None
            )

    def close(self, timeout: float) -> None:
        """Shutdown: wait up to ``timeout`` s for what is still being sent."""
        if self._producer is not None:
            self._producer.flush(timeout)
