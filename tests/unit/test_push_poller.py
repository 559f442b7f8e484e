"""The push consumer's poll loop under faults only the broker can cause, injected through a
fake Kafka consumer: a committed-offset read that fails in the rebalance callback, and the
rewind after a failed round."""

from __future__ import annotations

import threading

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.push.ledger import Ledger, Part
from rmq_semantics.push.poller import PollLoop, PollSettings
from rmq_semantics.push.positions import rewind
from rmq_semantics.tags import TagFilter


class FakeConsumer:
    """Records the assignment calls; ``committed`` fails ``failures`` times, then answers."""

    def __init__(self, failures: int, committed_offset: int = 7) -> None:
        self.failures = failures
        self.committed_offset = committed_offset
        self.assigned: list[TopicPartition] = []
        self.paused: set[tuple[str, int]] = set()
        self.sought: list[TopicPartition] = []

    def committed(self, partitions: list, timeout: float) -> list:
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "committed timed out"))
        return [TopicPartition(tp.topic, tp.partition, self.committed_offset)
                for tp in partitions]

    def incremental_assign(self, partitions: list) -> None:
        self.assigned.extend(partitions)

    def incremental_unassign(self, partitions: list) -> None:
        keys = {(tp.topic, tp.partition) for tp in partitions}
        self.assigned = [tp for tp in self.assigned if (tp.topic, tp.partition) not in keys]

    def assignment(self) -> list:
        return list(self.assigned)

    def pause(self, partitions: list) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def seek(self, partition: TopicPartition) -> None:
        self.sought.append(partition)

    def consume(self, num: int, timeout: float) -> list:
        return []


def _loop() -> PollLoop:
    settings = PollSettings(consumer_conf={}, producer_conf={}, topics=["orders"],
                            retry_levels={}, delay_levels=(1.0,), tags=TagFilter(),
                            batch_size=1, backlog=16, max_reconsume_times=3,
                            consume_timeout_ms=1000, drain_timeout_s=1.0)
    ledger = Ledger(retry_topic=lambda level: f"retry_{level}", dlq_topic="dlq",
                    delay_levels=(1.0,), max_reconsume_times=3)
    return PollLoop(settings, ledger, pool=None, stopping=threading.Event(),  # type: ignore[arg-type]
                    name="test")


def test_a_failed_committed_read_in_on_assign_is_retried_and_never_raises():
    loop = _loop()
    consumer = FakeConsumer(failures=2)
    tp = TopicPartition("orders", 0)
    loop._on_assign(consumer, [tp])  # type: ignore[arg-type]
    # Assigned (the group gave it to us) but paused: nothing is fetched before its offsets.
    assert [(t.topic, t.partition) for t in consumer.assigned] == [("orders", 0)]
    assert ("orders", 0) in consumer.paused
    assert loop.ledger.part(("orders", 0)) is None
    assert loop.ledger.counts["poll_errors"] == 1
    for _ in range(2):  # one more failure, then the read succeeds
        loop._read_unassigned(consumer, force=True)  # type: ignore[arg-type]
    part = loop.ledger.part(("orders", 0))
    assert part is not None and part.tracker.committable()[0] == 7
    assert ("orders", 0) not in consumer.paused
    assert [(s.topic, s.partition, s.offset) for s in consumer.sought] == [("orders", 0, 7)]
    assert loop.ledger.counts["poll_errors"] == 2


def test_a_partition_revoked_while_its_offsets_are_unread_is_forgotten():
    loop = _loop()
    consumer = FakeConsumer(failures=5)
    tp = TopicPartition("orders", 0)
    loop._on_assign(consumer, [tp])  # type: ignore[arg-type]
    loop._on_lost(consumer, [tp])  # type: ignore[arg-type]
    assert consumer.assigned == []
    consumer.failures = 0
    loop._read_unassigned(consumer, force=True)  # type: ignore[arg-type]
    assert loop.ledger.part(("orders", 0)) is None


def test_a_retry_partition_without_a_commit_is_read_from_its_start_once_its_offsets_come():
    loop = _loop()
    loop.s = PollSettings(**{**loop.s.__dict__, "retry_levels": {"retry_1": 1}})
    consumer = FakeConsumer(failures=1, committed_offset=confluent_kafka.OFFSET_INVALID)
    loop._on_assign(consumer, [TopicPartition("retry_1", 0)])  # type: ignore[arg-type]
    loop._read_unassigned(consumer, force=True)  # type: ignore[arg-type]
    assert [(s.topic, s.offset) for s in consumer.sought] == [
        ("retry_1", confluent_kafka.OFFSET_BEGINNING)]


def test_after_a_failed_round_each_partition_is_read_again_from_its_first_record_not_taken():
    """A consume() whose callback raised dropped what it fetched; the tracker reads a gap as
    no work, so without the rewind those records would be committed past unseen."""
    loop = _loop()
    consumer = FakeConsumer(failures=0)
    loop.consumer = consumer  # type: ignore[assignment]
    taken = Part(("orders", 0), OffsetTracker.restore(5, None))
    for offset in (5, 6):
        assert loop.ledger.take(taken, offset)
    loop.ledger.assign(taken)
    loop.ledger.assign(Part(("orders", 1), OffsetTracker.restore(9, None)))
    loop.ledger.assign(Part(("orders", 2), OffsetTracker()))  # no commit, nothing read
    rewind(consumer, loop.ledger, loop.s.consumer_conf, "test")  # type: ignore[arg-type]
    assert sorted((s.topic, s.partition, s.offset) for s in consumer.sought) == [
        ("orders", 0, 7), ("orders", 1, 9)]
