"""What a coordinator reads when it takes half/op partitions over, and the end its
recovery of them waits for.

A read_committed consumer stops at the first record of a transaction still open, and reports
the partition's end there. After a takeover, such a transaction can be the previous owner's
promotion: committed (its EndTxn reached the transaction coordinator) while its markers are
held up by a fault, its done markers beyond that end. An end request read before them would
be applied and the message promoted a second time (the fault campaign, seed 30: markers held
up 17 s by a partitioned transaction coordinator). So the recovery of a partition ends only
at an end at or past the high watermark the first end came with: every transaction open
there by then has ended, its done markers read or aborted.

The order matters. The committed offsets are read first, with require_stable (librdkafka
asks for it under read_committed), so a previous owner's transaction whose offsets reached
the group coordinator has ended, and written all it ever will, before the first fetch
reports a high watermark. One whose offsets had not reached it is fenced by the group
generation and aborts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition
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

# One committed-offset read; inside a rebalance callback they are retried this long, then
# left to the loop's replay (the callback raising would end the coordinator through poll()).
READ_TIMEOUT_S = 10.0
READ_DEADLINE_S = 30.0
# A partition end whose high watermark is not known yet (none read: the first end sets it).
_UNKNOWN = -1


class Takeover:
    """The committed offsets of the half/op partitions this instance is assigned, and which
    of them still wait for an end at or past the high watermark of their first end."""

    def __init__(self, waiting: Gauge, stop: Callable[[], threading.Event]) -> None:
        self._waiting_gauge = waiting  # partitions whose recovery waits for such an end
        self._stop = stop
        self._ends: dict[tuple[str, int], int] = {}
        self._waiting: set[tuple[str, int]] = set()

    def read(self, consumer: confluent_kafka.Consumer, partitions: list) -> list:
        """The committed offsets of ``partitions`` (returned); their recovery waits from now
        on. KafkaOperationError once retries run out."""
        retrying = Retrying(
            retry=retry_if_exception(
                lambda e: isinstance(e, KafkaException) and not e.args[0].fatal()
            ),
            stop=stop_after_delay(READ_DEADLINE_S) | stop_when_event_set(self._stop()),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        try:
            committed = retrying(consumer.committed, partitions, timeout=READ_TIMEOUT_S)
        except KafkaException as exc:
            raise KafkaOperationError.wrap(
                "reading the committed offsets of half/op partitions "
                f"{sorted({tp.partition for tp in partitions})}",
                exc.args[0],
            ) from exc
        for tp in partitions:
            self._ends[(tp.topic, tp.partition)] = _UNKNOWN
        return committed

    def at_end(self, topic: str, partition: int, offset: int, high_watermark: int) -> bool:
        """Whether a partition end reported at ``offset`` (the last stable offset, for a
        read_committed consumer) with ``high_watermark`` ends the recovery's read of it."""
        key = (topic, partition)
        end = self._ends.get(key)
        if end == _UNKNOWN:
            if high_watermark < 0:  # librdkafka sets it before any end: never expected
                log.warning(
                    "%s[%d]: an end with no high watermark; recovery goes on without "
                    "waiting for transactions open there",
                    topic,
                    partition,
                )
                high_watermark = offset
            self._ends[key] = end = high_watermark
        if end is None or offset >= end:
            self._ends.pop(key, None)
            self._settled(key)
            return True
        if key not in self._waiting:
            log.info(
                "%s[%d]: recovery waits for a transaction open at the takeover (read "
                "up to %d of %d): the previous owner's decisions may be behind it",
                topic,
                partition,
                offset,
                end,
            )
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
