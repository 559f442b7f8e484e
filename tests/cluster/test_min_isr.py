"""Below min ISR on a 3-node cluster: with `min.insync.replicas=3` on the real topic and one
node stopped, promotion stops without losing or doubling anything, the coordinator shows why
(`rmq_promotion_blocked{reason="not_enough_replicas"}`), and it resumes by itself when the
node returns. (Two nodes down would also lose the KRaft quorum: hence min ISR 3, not 2.)"""

from __future__ import annotations

import re
import urllib.request
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.embedded import free_port
from tests.cluster.faults import java_partition, warm_up_internal_topics
from tests.integration.txn_helpers import (
    CoordinatorProcess,
    ScriptedListener,
    TopicReader,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.cluster

PARTITIONS = 1
BATCH = 20


def _blocked(port: int, reason: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(rf'^rmq_promotion_blocked\{{reason="{reason}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def _bystander(admin: AdminClient, topic: str, prefix: str, instance: str) -> int | None:
    """A node that leads no partition of ``topic`` and coordinates neither the transaction
    service's group nor its two transactional ids: stopping it only takes an in-sync replica
    away. (Losing the group coordinator mid-commit is the broker-kill scenario's business.)"""
    meta = admin.list_topics(timeout=10).topics
    group = f"{prefix}_coordinator"
    busy = {p.leader for p in meta[topic].partitions.values()}
    for internal, keys in (("__consumer_offsets", [group]),
                           ("__transaction_state", [f"{group}-{instance}",
                                                    f"{group}-{instance}.2"])):
        parts = meta[internal].partitions
        busy |= {parts[java_partition(k, len(parts))].leader for k in keys}
    return next((n for n in (1, 2, 3) if n not in busy), None)


def test_below_min_isr_promotion_waits_shows_why_and_resumes_once(
        cluster, broker, unique, tmp_path):
    prefix = unique("i").replace("-", "")
    topic = unique("minisr")
    conf = broker.conf()
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={
        "min.insync.replicas": "3"})])[topic].result(30)
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    port = free_port()
    warm_up_internal_topics(conf, topic)
    # An instance id whose coordinators leave one node free: that node is stopped.
    instance, stopped_node = next(
        (i, n) for i, n in ((i, _bystander(admin, topic, prefix, i))
                            for i in (unique("c") for _ in range(200))) if n is not None)
    coordinator = CoordinatorProcess(broker.bootstrap, tmp_path / "coordinator.log",
                                     topic_prefix=prefix, metrics_port=port,
                                     instance_id=instance)
    reader = TopicReader(conf, topic, PARTITIONS)
    stopped = None
    try:
        coordinator.wait_ready()
        with TransactionProducer(conf, producer_group=unique("pg"), listener=listener,
                                 topic_prefix=prefix, half_partitions=4) as producer:
            for i in range(BATCH):
                producer.send_message_in_transaction(Message(topic, f"a{i}".encode()))
            reader.read_until(lambda r: len(r) >= BATCH, 120, "the first promotions")
            stopped = stopped_node
            assert cluster.stop(stopped) == [stopped]
            for i in range(BATCH):
                producer.send_message_in_transaction(Message(topic, f"b{i}".encode()))
            wait_for(lambda: _blocked(port, "not_enough_replicas") == 1, 120,
                     "rmq_promotion_blocked{reason=not_enough_replicas} to show it",
                     details=lambda: coordinator.log[-1500:])
            assert len(reader.settle(1.0)) == BATCH  # nothing promoted meanwhile
            cluster.start_node(stopped)
            stopped = None
            reader.read_until(lambda r: coordinator.require_running() or len(r) >= 2 * BATCH,
                              180, "every promotion once the node is back")
            wait_for(lambda: _blocked(port, "not_enough_replicas") == 0, 60,
                     "the gauge to clear")
        assert "promotion blocked (not_enough_replicas)" in coordinator.log
    finally:
        reader.close()
        if stopped is not None:
            cluster.start_node(stopped)
        coordinator.stop()
    counts = Counter(m.value() for m in read_to_end(conf, topic, PARTITIONS))
    assert set(counts) == {f"{c}{i}".encode() for c in "ab" for i in range(BATCH)}
    assert set(counts.values()) == {1}
