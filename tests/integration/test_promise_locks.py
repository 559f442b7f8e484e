"""The lock service's promise against forged input, through the public API: a crafted lock
request written by a plain ``confluent_kafka.Producer`` never wedges a lock-service
partition; a real client on that partition still gets its lock."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer as RawProducer

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
