"""Ordered consumption through the SIGKILL of the node that leads the lock topics, under both
consumer group protocols: the lock service rebuilds its table from the lock log on the new
leaders, per-key order holds, a partition is never processed by two consumers at once, and no
lock epoch is granted to two consumers."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient

from rmq_semantics.orderly import OrderlyConsumer
from rmq_semantics.topics import SystemTopics
from tests.cluster.faults import describe_leaders
from tests.integration.test_orderly import (
    Journal,
    assert_keys_in_order_and_partitions_exclusive,
    produce,
)
from tests.integration.txn_helpers import CoordinatorProcess, wait_for

pytestmark = pytest.mark.cluster

LEASE_MS, RENEW_MS = 3000, 1000
PARTITIONS = 4
KEYS = [f"key-{i:02d}" for i in range(20)]
ROUNDS = 20


def _lock_leaders(admin: AdminClient, topics: SystemTopics) -> Counter:
    meta = admin.list_topics(timeout=10).topics
    return Counter(
        p.leader
        for t in (topics.lock, topics.lock_request, topics.lock_reply)
        for p in meta[t].partitions.values()
    )


def _conf(broker, group: str, protocol: str) -> dict:
    membership = (
        {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
        if protocol == "classic"
        else {"group.protocol": "consumer"}
    )
    return broker.conf(**{"group.id": group, "auto.offset.reset": "earliest", **membership})


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_orderly_consumers_keep_order_and_exclusivity_through_a_lock_leader_kill(
    cluster, broker, make_topic, unique, tmp_path, protocol
):
    prefix = unique("l").replace("-", "")
    topics = SystemTopics(prefix)
    topic, group = make_topic("locked", partitions=PARTITIONS), unique("g")
    admin = AdminClient(broker.conf())
    journal = Journal()
    coordinator = CoordinatorProcess(
        broker.bootstrap,
        tmp_path / "coordinator.log",
        topic_prefix=prefix,
        lock_lease_ms=LEASE_MS,
        lock_renew_ms=RENEW_MS,
    )
    consumers: list[OrderlyConsumer] = []
    victim = None

    def send(rounds: range) -> None:
        produce(
            broker, topic, [(k.encode(), f"{k}:{s}".encode(), None) for s in rounds for k in KEYS]
        )

    def processed_at_least(n: int) -> bool:
        coordinator.require_running()
        return len({r.value for r in journal.snapshot()}) >= n

    try:
        coordinator.wait_ready()
        for name in ("c1", "c2"):
            consumer = OrderlyConsumer(
                _conf(broker, group, protocol),
                listener=journal.listener(name, work_s=0.003),
                lock_lease_ms=LEASE_MS,
                lock_renew_ms=RENEW_MS,
                topic_prefix=prefix,
                client_id=f"{name}-{uuid.uuid4().hex[:6]}",
            )
            consumer.subscribe([topic])
            consumer.start()
            consumers.append(consumer)
        send(range(0, 5))
        wait_for(lambda: processed_at_least(5 * len(KEYS)), 120, "the first rounds")
        victim = _lock_leaders(admin, topics).most_common(1)[0][0]
        assert cluster.stop(victim, kill=True) == [victim]
        send(range(5, 10))
        wait_for(
            lambda: victim not in _lock_leaders(admin, topics),
            60,
            f"the lock leaderships of node {victim} to move",
            details=lambda: describe_leaders(admin, topics.lock, topics.lock_request),
        )
        wait_for(
            lambda: processed_at_least(10 * len(KEYS)), 180, "progress with the lock leader dead"
        )
        cluster.start_node(victim)
        victim = None
        send(range(10, ROUNDS))
        wait_for(lambda: processed_at_least(ROUNDS * len(KEYS)), 180, "every message")
    finally:
        for consumer in consumers:
            consumer.shutdown()
        if victim is not None:
            cluster.start_node(victim)
        exit_code = coordinator.stop()
    assert exit_code == 0, coordinator.log[-3000:]

    assert_keys_in_order_and_partitions_exclusive(journal, KEYS, ROUNDS)
