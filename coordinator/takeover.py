"""What a coordinator reads when it takes half/op partitions over, and the end its
recovery of them waits for.

A read_committed consumer stops at the first record of a transaction still open, and reports
the partition's end there. After a takeover, such a transaction can be the previous owner's
promotion: committed (its EndTxn reached the transaction coordinator) while its markers are
held up by a fault, its done markers beyond that end. An end request read before them would
be applied and the message promoted a second time (the fault campaign, seed 30: markers held
up 17 s by a partitioned transaction coordinator). So the recovery of a partition ends only
at an end at or past the high watermark read right after the committed offsets: every
transaction open there by then has ended, its done markers read or aborted.

The order matters. The committed offsets are read first, with require_stable (librdkafka
asks for it under read_committed), so a previous owner's transaction whose offsets reached
the group coordinator has ended, and written all it ever will, before the high watermark is
read. One whose offsets had not reached it is fenced by the group generation and aborts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import confluent_kafka
from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client import Gauge
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_delay,
    stop_when_event_set,
    wait_exponential,
)

from rmq_semantics.errors import KafkaOperationError

__all__ = ["Takeover"]

log = logging.getLogger(__name__)

# One read (committed offsets, high watermarks); inside a rebalance callback they are retried
# this long, then left to the loop's replay (the callback raising would end the coordinator).
READ_TIMEOUT_S = 10.0
READ_DEADLINE_S = 30.0


class Takeover:
    """The committed offsets and ends of the half/op partitions this instance is assigned,
    and which of them still wait for an end at or past their high watermark."""

    def __init__(self, admin: Callable[[], AdminClient], waiting: Gauge,
                 stop: Callable[[], threading.Event]) -> None:
        self._admin = admin
        self._waiting_gauge = waiting  # partitions whose recovery waits for such an end
        self._stop = stop
        self._ends: dict[tuple[str, int], int] = {}
        self._waiting: set[tuple[str, int]] = set()

    def read(self, consumer: confluent_kafka.Consumer, partitions: list) -> list:
        """The committed offsets of ``partitions`` (returned), then their high watermarks,
        which their recovery's end must reach. KafkaOperationError once retries run out."""
        committed = self._retrying("reading the committed offsets of half/op partitions",
                                   partitions, consumer.committed, partitions,
                                   timeout=READ_TIMEOUT_S)
        ends = self._retrying("reading the ends of half/op partitions", partitions,
                              self._high_watermarks, partitions)
        for tp in partitions:
            self._ends[(tp.topic, tp.partition)] = ends[(tp.topic, tp.partition)]
        return committed

    def at_end(self, topic: str, partition: int, offset: int) -> bool:
        """Whether a partition end reported at ``offset`` ends the recovery's read of it: at
        or past the high watermark read at the takeover (any end once that one came)."""
        key = (topic, partition)
        end = self._ends.get(key)
        if end is None or offset >= end:
            self._ends.pop(key, None)
            self._settled(key)
            return True
        if key not in self._waiting:
            log.info("%s[%d]: recovery waits for a transaction open at the takeover (read "
                     "up to %d of %d): the previous owner's decisions may be behind it",
                     topic, partition, offset, end)
            self._waiting.add(key)
            self._publish()
        return False

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._ends.pop((tp.topic, tp.partition), None)
            self._settled((tp.topic, tp.partition))

    def _settled(self, key: tuple[str, int]) -> None:
        if key in self._waiting:
            self._waiting.discard(key)
            self._publish()

    def _publish(self) -> None:
        self._waiting_gauge.set(len({partition for _, partition in self._waiting}))

    def _high_watermarks(self, partitions: list) -> dict[tuple[str, int], int]:
        futures = self._admin().list_offsets(
            {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest() for tp in partitions},
            isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=READ_TIMEOUT_S)
        return {(tp.topic, tp.partition): future.result(READ_TIMEOUT_S).offset
                for tp, future in futures.items()}

    def _retrying(self, what: str, partitions: list, fn: Callable, *args: object,
                  **kwargs: object):
        """``fn(*args, **kwargs)`` retried (any Kafka error but a fatal one) until
        READ_DEADLINE_S or shutdown; KafkaOperationError after that."""
        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, KafkaException)
                                     and not e.args[0].fatal()),
            stop=stop_after_delay(READ_DEADLINE_S) | stop_when_event_set(self._stop()),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            before_sleep=before_sleep_log(log, logging.WARNING), reraise=True)
        try:
            return retrying(fn, *args, **kwargs)
        except KafkaException as exc:
            raise KafkaOperationError.wrap(
                f"{what} {sorted({tp.partition for tp in partitions})}", exc.args[0]) from exc
