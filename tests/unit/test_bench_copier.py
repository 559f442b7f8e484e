"""The bench's bare copier: its client confs, and its cap per transaction, which must stay
the coordinator's."""

from __future__ import annotations

from benchmarks.copier import (
    MAX_BATCH,
    CopierTuning,
    consumer_conf,
    producer_conf,
)
from coordinator.txn_service import MAX_BATCH as COORDINATOR_MAX_BATCH


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
