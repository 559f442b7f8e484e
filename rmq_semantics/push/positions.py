"""Where the push consumer's poll thread reads from: committed offsets adopted into the
ledger, partitions assigned while their committed offsets could not be read (assigned
paused, read again with a doubling delay: raising in the rebalance callback would end the
poll thread), and the rewind after a failed round."""

from __future__ import annotations

import logging
import time

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition

from rmq_semantics.push.ledger import Ledger

__all__ = [
    "UNREAD_RETRY_MAX_S",
    "UNREAD_RETRY_MIN_S",
    "UnreadOffsets",
    "adopt",
    "assign",
    "pause_full_engines",
    "rewind",
]

log = logging.getLogger("rmq_semantics.push.poller")

UNREAD_RETRY_MIN_S = 1.0
UNREAD_RETRY_MAX_S = 30.0
TP = tuple[str, int]


class UnreadOffsets:
    def __init__(self, name: str, timeout_s: float) -> None:
        self.name, self.timeout_s = name, timeout_s
        self.tps: set[TP] = set()
        self._delay = UNREAD_RETRY_MIN_S / 2
        self._due = 0.0

    def __contains__(self, tp: TP) -> bool:
        return tp in self.tps

    def add(self, partitions: list, exc: KafkaException, count: int) -> None:
        self.tps |= {(tp.topic, tp.partition) for tp in partitions}
        self.failed(exc, count)

    def again(self, partitions: list) -> None:
        """Partitions whose committed offsets are read again at once (a replay)."""
        self.tps |= {(tp.topic, tp.partition) for tp in partitions}
        self._due = 0.0

    def discard(self, tp: TP) -> None:
        self.tps.discard(tp)

    def failed(self, exc: KafkaException, count: int) -> None:
        """A read failed (poll error #``count``): the next one after a longer delay."""
        self._delay = min(UNREAD_RETRY_MAX_S, self._delay * 2)
        self._due = time.monotonic() + self._delay
        log.warning(
            "push consumer %s: reading the committed offsets of %s failed (%s; "
            "poll error #%d); they stay paused, read again in %.0f s",
            self.name,
            sorted(f"{t}[{p}]" for t, p in self.tps),
            exc.args[0],
            count,
            self._delay,
        )

    def due(self, force: bool = False) -> bool:
        return bool(self.tps) and (force or time.monotonic() >= self._due)

    def read(self, consumer: confluent_kafka.Consumer) -> list:
        """The committed offsets of every unread partition, which are then no longer
        unread; raises KafkaException (the caller counts it and calls :meth:`failed`)."""
        committed = consumer.committed(
            [TopicPartition(t, p) for t, p in self.tps], timeout=self.timeout_s
        )
        self.tps = set()
        self._delay = UNREAD_RETRY_MIN_S / 2
        return committed


def adopt(
    committed: list,
    ledger: Ledger,
    retry_levels: dict[str, int],
    name: str,
    replayed: dict[tuple[str, int], int] | None = None,
) -> list:
    """Track ``committed`` partitions in the ledger; returns them, a retry partition
    without a commit set to its start, and one ``replayed`` (read already, its producer
    re-created since) without a commit to its first record read (popped from it)."""
    for tp in committed:
        level = retry_levels.get(tp.topic, 0)
        ledger.assign(ledger.new_part(tp.topic, tp.partition, tp.offset, tp.metadata, level))
        if tp.offset < 0 and level:
            # A retry topic is read from its start: its records exist only for us.
            tp.offset = confluent_kafka.OFFSET_BEGINNING
        start = (replayed or {}).pop((tp.topic, tp.partition), None)
        if tp.offset < 0 and tp.offset != confluent_kafka.OFFSET_BEGINNING and start is not None:
            tp.offset = start
    if committed:
        log.info(
            "push consumer %s assigned %s",
            name,
            [f"{tp.topic}[{tp.partition}]" for tp in committed],
        )
    return committed


def assign(consumer: confluent_kafka.Consumer, partitions: list) -> None:
    """Assign ``partitions`` (their start offsets read) and resume them. librdkafka keeps an
    application's pause across unassign and assign (librdkafka #1849): a partition paused
    for a replay, an unread offset, a held retry head or back-pressure, then lost or revoked,
    came back paused with nothing left to resume it (campaign issue 30, long run seed 2)."""
    consumer.incremental_assign(partitions)
    if partitions:
        consumer.resume(partitions)


def rewind(
    consumer: confluent_kafka.Consumer | None, ledger: Ledger, consumer_conf: dict, name: str
) -> None:
    """After a failed round: seek every partition back to the first record not taken.
    A consume() whose callback raised drops the records it fetched, and the tracker reads
    a gap as no work: without this they would be committed past, never seen."""
    if consumer is None:
        return
    earliest = str(consumer_conf.get("auto.offset.reset", "")).lower() in (
        "earliest",
        "smallest",
        "beginning",
    )
    for part in ledger.parts():
        offset = part.tracker.next_offset
        if offset is None:  # nothing read yet, no commit: where the reset policy says
            if not earliest:
                continue
            offset = confluent_kafka.OFFSET_BEGINNING
        try:
            consumer.seek(TopicPartition(part.tp[0], part.tp[1], offset))
        except KafkaException as exc:  # e.g. revoked meanwhile; the next owner reads it
            log.warning(
                "push consumer %s: rewinding %s[%d] to %d: %s",
                name,
                part.tp[0],
                part.tp[1],
                offset,
                exc.args[0],
            )


def pause_full_engines(
    consumer: confluent_kafka.Consumer, ledger: Ledger, full: set[TP], held: set[TP]
) -> None:
    """Pause a partition whose FIFO engine holds as many records as its tracker allows (a
    group held by its retries while later records pile up; added to ``full``); once it
    accepts again, seek it to where reading stopped (a pause drops the prefetched records)
    and resume it unless ``held`` (paused for another reason)."""
    for part in ledger.parts():
        if part.engine is None:
            continue
        accepting = ledger.accepting(part)
        if not accepting and part.tp not in full:
            consumer.pause([TopicPartition(*part.tp)])
            full.add(part.tp)
        elif accepting and part.tp in full:
            full.discard(part.tp)
            if (offset := part.tracker.next_offset) is not None:
                consumer.seek(TopicPartition(*part.tp, offset))
            if part.tp not in held:
                consumer.resume([TopicPartition(*part.tp)])
