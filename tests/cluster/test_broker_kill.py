"""Transactional messages through the SIGKILL of a broker on a 3-node cluster: the broker that
leads the most half/op partitions dies mid-stream and comes back; a read_committed reader of
the real topic sees every committed message once and no rolled-back one."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.topics import SystemTopics
from tests.cluster.faults import describe_leaders, half_op_leaders
from tests.integration.txn_helpers import (
    FAST,
    CoordinatorProcess,
    ScriptedListener,
    TopicReader,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.cluster

TOTAL = 1000
KILL_AFTER = 250  # promoted records visible before the kill
PARTITIONS = 3


def _inline(value: bytes) -> S:
    """Every 10th message rolls back, every 10th (offset 5) is UNKNOWN and committed on its
    back-check, the rest commit at once."""
    case = int(value.split(b"-")[1]) % 10
    return {3: S.ROLLBACK_MESSAGE, 7: S.UNKNOW}.get(case, S.COMMIT_MESSAGE)


def _assert_replicated(admin: AdminClient, topics: SystemTopics) -> None:
    meta = admin.list_topics(timeout=10).topics
    for name in (topics.half, topics.op, topics.check):
        assert {len(p.replicas) for p in meta[name].partitions.values()} == {3}, name
    resource = ConfigResource(ConfigResource.Type.TOPIC, topics.half)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["min.insync.replicas"].value == "2"


def test_sigkill_of_the_busiest_half_op_leader_loses_and_duplicates_nothing(
    cluster, broker, make_topic, unique, tmp_path
):
    prefix = unique("k").replace("-", "")
    topics = SystemTopics(prefix)
    topic = make_topic("killed", partitions=PARTITIONS)
    listener = ScriptedListener(_inline, lambda v: S.COMMIT_MESSAGE)
    conf = broker.conf()
    admin = AdminClient(conf)
    messages = [Message(topic, f"m-{i}".encode(), key=f"k{i % 50}") for i in range(TOTAL)]
    committed = {m.value for m in messages if _inline(m.value) != S.ROLLBACK_MESSAGE}
    coordinator = CoordinatorProcess(
        broker.bootstrap,
        tmp_path / "coordinator.log",
        topic_prefix=prefix,
        instance_id=f"c-{uuid.uuid4().hex[:8]}",
    )
    reader = TopicReader(conf, topic, PARTITIONS)
    victim = None
    try:
        coordinator.wait_ready()
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer:
            _assert_replicated(admin, topics)
            sender = threading.Thread(
                target=lambda: [producer.send_message_in_transaction(m) for m in messages]
            )
            sender.start()
            reader.read_until(lambda r: len(r) >= KILL_AFTER, 120, "the first promotions")
            victim = half_op_leaders(admin, topics).most_common(1)[0][0]
            assert cluster.stop(victim, kill=True) == [victim]
            # Restart once the cluster has moved the victim's leaderships: a node back at once
            # would hide the failover.
            wait_for(
                lambda: victim not in half_op_leaders(admin, topics),
                60,
                f"the half/op leaderships of node {victim} to move",
                details=lambda: describe_leaders(admin, topics.half, topics.op, topic),
            )
            cluster.start_node(victim)
            victim = None
            sender.join(300)
            assert not sender.is_alive(), "the producer did not finish sending"
            # The producer stays up: the last UNKNOW transactions wait for its back-checks.
            # require_running: a coordinator that exited fails the test at once, with its log.
            reader.read_until(
                lambda r: coordinator.require_running() or len(r) >= len(committed),
                300,
                "every promotion",
            )
    finally:
        if victim is not None:
            cluster.start_node(victim)
        reader.close()
        exit_code = coordinator.stop()
    assert exit_code == 0, coordinator.log[-3000:]
    counts = Counter(m.value() for m in read_to_end(conf, topic, PARTITIONS))
    assert set(counts) == committed, (
        f"missing {len(committed - set(counts))}, rolled back yet visible "
        f"{len(set(counts) - committed)}"
    )
    assert set(counts.values()) == {1}, [v for v, n in counts.items() if n > 1][:10]
