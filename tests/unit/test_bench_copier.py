"""The bench's bare copier: its pure helpers (offsets to commit, client confs) and its cap
per transaction, which must stay the coordinator's."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import TopicPartition

from coordinator.txn_service import MAX_BATCH as COORDINATOR_MAX_BATCH
from rmq_semantics.tools.bench.copier import (
    MAX_BATCH,
    CopierTuning,
    consumer_conf,
    next_offsets,
    producer_conf,
)


@dataclass
class FakeRecord:
    where: tuple[str, int, int]

    def topic(self) -> str:
        return self.where[0]

    def partition(self) -> int:
        return self.where[1]

    def offset(self) -> int:
        return self.where[2]


def _pairs(offsets: list[TopicPartition]) -> list[tuple[str, int, int]]:
    return [(tp.topic, tp.partition, tp.offset) for tp in offsets]


def test_the_offsets_to_commit_are_one_past_the_last_record_of_each_partition():
    records = [FakeRecord(w) for w in (("in", 1, 7), ("in", 0, 3), ("in", 1, 9),
                                       ("in", 1, 8), ("in", 0, 4))]
    assert _pairs(next_offsets(records)) == [("in", 0, 5), ("in", 1, 10)]
    assert next_offsets([]) == []


def test_the_copier_batches_no_more_than_the_coordinator_per_transaction():
    assert MAX_BATCH == COORDINATOR_MAX_BATCH


def test_the_clients_are_exactly_once_and_keep_the_callers_conf():
    conf = {"bootstrap.servers": "b:9092", "client.id": "mine"}
    tuning = CopierTuning(linger_ms=0, retry_backoff_ms=2, fetch_wait_max_ms=7)
    producer = producer_conf(conf, tuning, "copier-0")
    consumer = consumer_conf(conf, tuning, "copier")
    assert producer["transactional.id"] == "copier-0"
    assert (producer["linger.ms"], producer["retry.backoff.ms"]) == (0, 2)
    assert producer["client.id"] == consumer["client.id"] == "mine"
    assert consumer["isolation.level"] == "read_committed"
    assert consumer["enable.auto.commit"] is False
    assert consumer["fetch.wait.max.ms"] == 7
    assert conf == {"bootstrap.servers": "b:9092", "client.id": "mine"}
