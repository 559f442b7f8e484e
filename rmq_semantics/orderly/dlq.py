"""Dead letters: a batch retried ``max_reconsume_times`` times goes to the group's DLQ topic.

Each record keeps its key, value and headers, plus where it came from and how often it was
retried (the ``DLQ_*`` headers). Sends are synchronous (the queue moves on only once the
broker has them); the caller checks the queue lock first, like a commit.
"""

from __future__ import annotations

import logging
import threading

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from rmq_semantics.errors import KafkaOperationError, RmqError, RmqTimeoutError
from rmq_semantics.orderly.api import OrderlyMessage
from rmq_semantics.orderly.runtime import event
from rmq_semantics.producer import producer_defaults
from rmq_semantics.records.dead_letter import dlq_headers
from rmq_semantics.topics import ensure_topics

__all__ = ["DeadLetters"]

log = logging.getLogger(__name__)

# Dead-letter sends wait for the broker's acknowledgement.
DLQ_TIMEOUT_S = 30.0


class DeadLetters:
    """The DLQ topic of one consumer group, created and connected on first use; one
    producer shared by every worker."""

    def __init__(self, conf: dict, topic: str) -> None:
        self.topic = topic
        self._conf = conf
        self._producer: confluent_kafka.Producer | None = None
        self._topic_ready = False
        self._lock = threading.Lock()

    def send(self, batch: list[OrderlyMessage], epoch: int) -> bool:
        """Dead-letter ``batch`` (run under the lock of ``epoch``); False when it could not
        be sent: the caller retries later."""
        try:
            # Another worker's flush holds the producer at most DLQ_TIMEOUT_S.
            if not self._lock.acquire(timeout=DLQ_TIMEOUT_S):
                raise RmqTimeoutError(f"another queue is dead-lettering to {self.topic}")
            try:
                self._send(batch)
            finally:
                self._lock.release()
        except (RmqError, KafkaException, BufferError) as exc:
            log.warning("%s: could not dead-letter (%s); will retry", batch[0].where, exc)
            return False
        for m in batch:
            log.warning("%s sent to %s after %d reconsumes", m.where, self.topic,
                        m.reconsume_times,
                        extra=event("dlq", topic=m.topic, partition=m.partition,
                                    offset=m.offset, epoch=epoch))
        return True

    def _send(self, batch: list[OrderlyMessage]) -> None:
        if not self._topic_ready:
            ensure_topics(self._conf, {self.topic: (1, {})})
            self._topic_ready = True
        if self._producer is None:
            self._producer = confluent_kafka.Producer(producer_defaults(self._conf,
                                                                        internal=True))
        producer = self._producer
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(err)

        for m in batch:
            headers = dlq_headers(m.headers, topic=m.topic, partition=m.partition,
                                  offset=m.offset, reconsume_times=m.reconsume_times)
            producer.produce(self.topic, m.value, key=m.key, headers=headers,
                             on_delivery=on_delivery)
        left = producer.flush(DLQ_TIMEOUT_S)
        if left or errors:
            detail = errors[0].str() if errors else f"{left} not delivered in time"
            raise KafkaOperationError(f"dead-lettering to {self.topic}: {detail}",
                                      errors[0] if errors else None)

    def close(self, timeout: float) -> None:
        """Shutdown: wait up to ``timeout`` s for what is still being sent."""
        if self._producer is not None:
            self._producer.flush(timeout)
