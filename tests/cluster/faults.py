"""What the cluster scenarios share: which node leads or coordinates what, and pausing a
node (SIGSTOP) the way a long GC pause or a frozen VM would."""

from __future__ import annotations

import os
import signal
from collections import Counter

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from rmq_semantics.kafka_cluster import EmbeddedCluster
from rmq_semantics.topics import SystemTopics


def java_partition(key: str, partitions: int) -> int:
    """Kafka's coordinator partition for a group or transactional id:
    Utils.abs(key.hashCode()) % partitions."""
    h = 0
    for ch in key:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def coordinator_node(admin: AdminClient, internal_topic: str, key: str) -> int:
    """The node that coordinates ``key`` (a group in ``__consumer_offsets``, a transactional
    id in ``__transaction_state``): the leader of its partition there."""
    parts = admin.list_topics(timeout=10).topics[internal_topic].partitions
    return parts[java_partition(key, len(parts))].leader


def warm_up_internal_topics(conf: dict, topic: str) -> None:
    """Kafka creates its offsets and transaction-state topics on first use: use both."""
    producer = Producer({**conf, "transactional.id": f"warm-{topic}"})
    producer.init_transactions(60)
    consumer = Consumer({**conf, "group.id": f"warm-{topic}"})
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()


def half_op_leaders(admin: AdminClient, topics: SystemTopics) -> Counter:
    """Half/op partitions led by each node."""
    meta = admin.list_topics(timeout=10).topics
    return Counter(p.leader for t in (topics.half, topics.op) for p in meta[t].partitions.values())


def describe_leaders(admin: AdminClient, *names: str) -> str:
    """Leader and ISR of each partition, for a failure message."""
    meta = admin.list_topics(timeout=10).topics
    return "; ".join(
        f"{t}[{n}] leader {p.leader} isr {p.isrs}"
        for t in names
        if t in meta
        for n, p in sorted(meta[t].partitions.items())
    )


def pause(cluster: EmbeddedCluster, node_id: int) -> None:
    os.kill(_pid(cluster, node_id), signal.SIGSTOP)


def resume(cluster: EmbeddedCluster, node_id: int) -> None:
    os.kill(_pid(cluster, node_id), signal.SIGCONT)


def _pid(cluster: EmbeddedCluster, node_id: int) -> int:
    pid = cluster.node(node_id).pid
    if pid is None:
        raise AssertionError(f"node {node_id} is not running")
    return pid
