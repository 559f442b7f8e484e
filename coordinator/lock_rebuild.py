"""The takeover of lock-service partitions: their lock tables read back from the compacted
lock topic (the Kafka side of :class:`coordinator.lock.LockTable`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import confluent_kafka
from confluent_kafka import KafkaError, TopicPartition

from coordinator.lock import LockTable
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
    and how many records were loaded. Malformed records are counted and skipped."""
    tables = {p: LockTable() for p in parts}
    eof: set[int] = set()
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
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                    continue
                raise KafkaOperationError.wrap(f"reading {topic}", msg.error())
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
            tables[msg.partition()].restore(entry, _now_ms(), entry.lease_ms or default_lease_ms)
            loaded += 1
    finally:
        reader.unassign()
    return tables, loaded
