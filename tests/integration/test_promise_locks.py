"""The lock service's promise through the public API: a crafted lock request written by a
plain ``confluent_kafka.Producer`` never wedges a lock-service partition, and neither does a
transactional call librdkafka never returns from; a real client still gets its lock."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as RawProducer

from coordinator import kafka_txn
from coordinator.lock_service import lock_topic_specs
from coordinator.settings import CoordinatorSettings
from rmq_semantics.lock_client import LockClient
from rmq_semantics.records.codec import encode
from rmq_semantics.records.locks import LockKey, LockRequest
from rmq_semantics.topics import ensure_topics
from tests.integration.txn_helpers import FAST, ThreadCoordinator

pytestmark = pytest.mark.integration


def test_a_crafted_lock_request_never_wedges_its_partition(broker, unique):
    prefix = unique("pl").replace("-", "")
    conf = broker.conf()
    partitions = FAST["half_partitions"]
    group, topic = unique("g"), unique("orders")
    key = LockKey(group, topic, 0)
    ensure_topics(conf, lock_topic_specs(CoordinatorSettings(**FAST, topic_prefix=prefix)))
    # The reply repeats the client id in its key and value: ~1.2 MB, over the broker's 1 MB.
    crafted = LockRequest.from_body(
        {
            "kind": "lock",
            "request_id": unique("r"),
            "client_id": "x" * 600_000,
            "group": group,
            "reply_partition": 0,
            "queues": [{"topic": topic, "partition": 0, "epoch": None}],
            "lease_ms": 60000,
            "sent_at_ms": int(time.time() * 1000),
            "wait_ms": 60000,
        }
    )
    raw = RawProducer(conf)
    raw.produce(
        f"{prefix}_lock_request",
        encode(crafted),
        key=key.record_key(),
        partition=key.request_partition(partitions),
    )
    assert raw.flush(10) == 0
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        LockClient(conf, topic_prefix=prefix, client_id="live-client") as client,
    ):
        grants = client.lock(group, [(topic, 0)], 60000, timeout=30)
        assert grants[(topic, 0)].granted, "the partition is wedged by the crafted request"
        assert coordinator.server.locks.counts["invalid_request"] == 1


class _HangsOnce:
    """A transactional producer whose next ``send_offsets_to_transaction`` does not return
    until released, as librdkafka's does while it waits for a group coordinator that left
    the cluster (librdkafka #5456, #5511; campaign seed 3 froze a lock service so)."""

    def __init__(self, producer: object, release: threading.Event) -> None:
        self._producer, self._release = producer, release
        self.hung = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._producer, name)

    def send_offsets_to_transaction(self, *args: object) -> None:
        if not self.hung.is_set():
            self.hung.set()
            self._release.wait()
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        self._producer.send_offsets_to_transaction(*args)


def test_a_lock_service_call_that_never_returns_is_abandoned_and_its_requests_answered(
    broker, unique, monkeypatch
):
    monkeypatch.setattr(kafka_txn, "WEDGED_AFTER_S", 3.0)
    prefix = unique("pw").replace("-", "")
    conf = broker.conf()
    group, topic = unique("g"), unique("orders")
    release = threading.Event()
    try:
        with (
            ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
            LockClient(conf, topic_prefix=prefix, client_id="client") as client,
        ):
            assert client.lock(group, [(topic, 0)], 60000, timeout=30)[(topic, 0)].granted
            txn = coordinator.server.locks._clients().txn
            stuck = txn.producer = _HangsOnce(txn.producer, release)
            grants = client.lock(group, [(topic, 1)], 60000, timeout=30)
            assert stuck.hung.is_set()
            assert grants[(topic, 1)].granted, "the lock service is stuck in its call"
            assert coordinator.server.locks.counts["abandoned"] == 1
        assert coordinator.exit_code == 0
    finally:
        release.set()
