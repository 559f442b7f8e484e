"""The takeover of lock-service partitions: their lock tables read back from the compacted
lock topic (the Kafka side of :class:`coordinator.lock.LockTable`).

A read_committed reader reports a partition's end at its last stable offset, before any
transaction still open there. At a takeover that can be the previous owner's grants:
committed, their markers not yet written (the fault campaign, seed 30: a table rebuilt
before them handed queues out again with lower epochs). So, as for half/op partitions
(:mod:`coordinator.takeover`), a partition's read ends only at an end at or past the high
watermark its first end came with: every transaction open there by then has ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import confluent_kafka
from confluent_kafka import KafkaError, TopicPartition

from coordinator.lock import LockTable
from rmq_semantics.consumed import offset_of, partition_of
from rmq_semantics.errors import KafkaOperationError, MalformedRecordError
from rmq_semantics.records.codec import decode_lock_state

__all__ = ["REBUILD_STALL_S", "read_tables"]

log = logging.getLogger(__name__)

# A rebuild that reads nothing for this long fails (and is tried again by the replay).
REBUILD_STALL_S = 30.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def read_tables(
    reader: confluent_kafka.Consumer,
    topic: str,
    parts: list[int],
    default_lease_ms: int,
    count: Callable[[str], None],
) -> tuple[dict[int, LockTable], int]:
    """Read the lock topic's ``parts`` to their end into one table each; returns the tables
    and how many records were loaded. Malformed records are counted and skipped. An end
    before a transaction open at the takeover is waited past (counted ``takeover_waited``)."""
    tables = {p: LockTable() for p in parts}
    eof: set[int] = set()
    ends: dict[int, int] = {}  # the high watermark each partition's first end came with
    reader.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in parts])
    loaded = 0
    try:
        # The limit is on a stall, not on the whole read: a big table takes what it takes.
        deadline = time.monotonic() + REBUILD_STALL_S
        while len(eof) < len(parts):
            if time.monotonic() > deadline:
                raise KafkaOperationError(
                    f"reading {topic} partitions {parts} made no "
                    f"progress for {REBUILD_STALL_S:.0f} s"
                )
            msg = reader.poll(0.1)
            if msg is None:
                continue
            deadline = time.monotonic() + REBUILD_STALL_S
            if (err := msg.error()) is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if _at_end(reader, topic, msg, ends, count):
                        eof.add(partition_of(msg))
                    continue
                raise KafkaOperationError.wrap(f"reading {topic}", err)
            if msg.value() is None:
                continue
            try:
                entry = decode_lock_state(msg.key(), msg.value())
            except MalformedRecordError as exc:
                count("malformed")
                log.warning(
                    "%s[%d]@%d skipped: %s", msg.topic(), msg.partition(), msg.offset(), exc
                )
                continue
            tables[partition_of(msg)].restore(entry, _now_ms(), entry.lease_ms or default_lease_ms)
            loaded += 1
    finally:
        reader.unassign()
    return tables, loaded


def _at_end(
    reader: confluent_kafka.Consumer,
    topic: str,
    msg: confluent_kafka.Message,
    ends: dict[int, int],
    count: Callable[[str], None],
) -> bool:
    """Whether this partition end (at the last stable offset) is at or past the high
    watermark of the partition's first end (librdkafka's cached one, as the txn service)."""
    part, offset = partition_of(msg), offset_of(msg)
    if part not in ends:
        high = reader.get_watermark_offsets(TopicPartition(topic, part), cached=True)
        ends[part] = high[1] if high and high[1] >= 0 else offset
        if offset < ends[part]:
            count("takeover_waited")
            log.info(
                "%s[%d]: the lock table's read waits for a transaction open at the takeover "
                "(read up to %d of %d): the previous owner's grants may be behind it",
                topic,
                part,
                offset,
                ends[part],
            )
    return offset >= ends[part]
