"""Below min ISR on a 3-node cluster: with `min.insync.replicas=3` on the real topic and one
node stopped, promotion stops without losing or doubling anything, the coordinator shows why
(`rmq_promotion_blocked{reason="not_enough_replicas"}`), and it resumes by itself when the
node returns. (Two nodes down would also lose the KRaft quorum: hence min ISR 3, not 2.)"""

from __future__ import annotations

import re
import urllib.request
from collections import Counter

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, RmqError, TransactionProducer
from rmq_semantics.embedded import free_port
from tests.cluster.faults import java_partition, warm_up_internal_topics
from tests.integration.txn_helpers import (
    CoordinatorProcess,
    ScriptedListener,
    ThreadCoordinator,
    TopicReader,
    no_pending,
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
    for internal, keys in (
        ("__consumer_offsets", [group]),
        ("__transaction_state", [f"{group}-{instance}", f"{group}-{instance}.2"]),
    ):
        parts = meta[internal].partitions
        busy |= {parts[java_partition(k, len(parts))].leader for k in keys}
    return next((n for n in (1, 2, 3) if n not in busy), None)


def test_below_min_isr_promotion_waits_shows_why_and_resumes_once(
    cluster, broker, unique, tmp_path
):
    prefix = unique("i").replace("-", "")
    topic = unique("minisr")
    conf = broker.conf()
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={"min.insync.replicas": "3"})])[
        topic
    ].result(30)
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    port = free_port()
    warm_up_internal_topics(conf, topic)
    # An instance id whose coordinators leave one node free: that node is stopped.
    instance, stopped_node = next(
        (i, n)
        for i, n in (
            (i, _bystander(admin, topic, prefix, i)) for i in (unique("c") for _ in range(200))
        )
        if n is not None
    )
    coordinator = CoordinatorProcess(
        broker.bootstrap,
        tmp_path / "coordinator.log",
        topic_prefix=prefix,
        metrics_port=port,
        instance_id=instance,
    )
    reader = TopicReader(conf, topic, PARTITIONS)
    stopped = None
    try:
        coordinator.wait_ready()
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer:
            for i in range(BATCH):
                producer.send_message_in_transaction(Message(topic, f"a{i}".encode()))
            reader.read_until(lambda r: len(r) >= BATCH, 120, "the first promotions")
            stopped = stopped_node
            assert cluster.stop(stopped) == [stopped]
            for i in range(BATCH):
                producer.send_message_in_transaction(Message(topic, f"b{i}".encode()))
            wait_for(
                lambda: _blocked(port, "not_enough_replicas") == 1,
                120,
                "rmq_promotion_blocked{reason=not_enough_replicas} to show it",
                details=lambda: coordinator.log[-1500:],
            )
            assert len(reader.settle(1.0)) == BATCH  # nothing promoted meanwhile
            cluster.start_node(stopped)
            stopped = None
            reader.read_until(
                lambda r: coordinator.require_running() or len(r) >= 2 * BATCH,
                180,
                "every promotion once the node is back",
            )
            wait_for(lambda: _blocked(port, "not_enough_replicas") == 0, 60, "the gauge to clear")
        assert "promotion blocked (not_enough_replicas)" in coordinator.log
    finally:
        reader.close()
        if stopped is not None:
            cluster.start_node(stopped)
        coordinator.stop()
    counts = Counter(m.value() for m in read_to_end(conf, topic, PARTITIONS))
    assert set(counts) == {f"{c}{i}".encode() for c in "ab" for i in range(BATCH)}
    assert set(counts.values()) == {1}


def _half_bystander(admin: AdminClient, prefix: str, instance: str) -> int | None:
    """A node that leads neither the half nor the Op partition and coordinates none of the
    coordinator's group and transactional ids."""
    meta = admin.list_topics(timeout=10).topics
    busy = {meta[f"{prefix}_{t}"].partitions[0].leader for t in ("half", "op")}
    others = _bystander(admin, f"{prefix}_op", prefix, instance)
    return next((n for n in (1, 2, 3) if n not in busy and n == others), None)


def _producer_with_bystander(
    conf: dict, listener: ScriptedListener, unique
) -> tuple[TransactionProducer, str, str, int]:
    """A producer and a coordinator instance id that leave one node free of the half and Op
    leaders and of the coordinator's group and transactional ids. The group's coordinator
    follows the prefix, so a prefix whose half leader, Op leader and group coordinator are
    the three nodes is given up for a fresh one (CI: no instance id could help)."""
    admin = AdminClient(conf)
    for _ in range(20):
        prefix = unique("r").replace("-", "")
        producer = TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=1,
        ).start()
        found = next(
            (
                (i, n)
                for i, n in (
                    (i, _half_bystander(admin, prefix, i))
                    for i in (unique("c") for _ in range(100))
                )
                if n is not None
            ),
            None,
        )
        if found is not None:
            return producer, prefix, *found
        producer.shutdown()
    raise AssertionError("20 prefixes in a row kept every node busy")


def _set_config(admin: AdminClient, topic: str, name: str, value: str) -> None:
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_a_half_write_reported_failed_is_never_promoted_once_the_cluster_recovers(
    cluster, broker, unique
):
    """The half topic's min.insync.replicas above its live replicas for about 40 s (a node
    stopped): send_message_in_transaction raises after its send timeout, the node returns, a
    check listener that answers COMMIT for any id is running, and nothing of the failed send
    is promoted (librdkafka's message.timeout.ms of 300 s wrote it once the ISR was back)."""
    topic = unique("failedhalf")
    conf = broker.conf()
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(30)
    warm_up_internal_topics(conf, topic)
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    stopped = None
    producer, prefix, instance, node = _producer_with_bystander(conf, listener, unique)
    with (
        producer,
        ThreadCoordinator(
            conf, topic_prefix=prefix, half_partitions=1, instance_id=instance
        ) as coordinator,
    ):
        try:
            _set_config(admin, f"{prefix}_half", "min.insync.replicas", "3")
            stopped = node
            assert cluster.stop(stopped) == [stopped]
            with pytest.raises(RmqError) as failed:
                producer.send_message_in_transaction(Message(topic, b"failed", key=b"k"))
            cluster.start_node(stopped)
            stopped = None
            # Written after the failed one to the same half partition, if that lands.
            producer.send_message_in_transaction(Message(topic, b"after", key=b"k"))
            wait_for(
                lambda: (
                    no_pending(coordinator, 1)
                    and coordinator.server.metrics.registry.get_sample_value("rmq_promotions_total")
                ),
                180,
                "the second message's promotion",
            )
        finally:
            if stopped is not None:
                cluster.start_node(stopped)
    assert listener.executed == [b"after"]
    assert [m.value() for m in read_to_end(conf, topic, PARTITIONS)] == [b"after"]
    assert "ROLLBACK" in str(failed.value)
