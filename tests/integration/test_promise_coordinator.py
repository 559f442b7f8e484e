"""The coordinator's promise on paths only a real broker walks (issue 29): a marker forged
before the first coordinator ever started settles nothing, and a destination the cluster
has just grown (a new partition, a new topic) is promoted into, never discarded."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from confluent_kafka import Producer as RawProducer
from confluent_kafka.admin import AdminClient, NewPartitions

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.records.codec import encode
from rmq_semantics.records.txn import DoneEntry, DoneMarkers, Outcome
from tests.integration.txn_helpers import (
    ScriptedListener,
    ThreadCoordinator,
    metric,
    no_pending,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_a_marker_forged_before_the_first_coordinator_starts_settles_nothing(
    broker, make_topic, unique
):
    """Fresh prefix: a half is pending, a plain producer writes an unsigned DONE_MARKERS
    {COMMITTED} for it, and only then does the first coordinator start (generated key).
    No coordinator ever wrote that marker: the transaction is checked and promoted once."""
    prefix = unique("fresh").replace("-", "")
    topic = make_topic("forged-fresh")
    conf = broker.conf()
    listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.COMMIT_MESSAGE)
    with TransactionProducer(
        conf, producer_group=unique("pg"), listener=listener, topic_prefix=prefix, half_partitions=1
    ) as producer:
        result = producer.send_message_in_transaction(Message(topic, b"forged-before-start"))
        forged: list[int] = []
        forger = RawProducer(conf)
        forger.produce(
            f"{prefix}_op",
            encode(
                DoneMarkers(
                    (DoneEntry(result.half_offset, result.transaction_id, Outcome.COMMITTED, 0),),
                    int(time.time() * 1000),
                )
            ),
            partition=result.half_partition,
            on_delivery=lambda err, msg: forged.append(msg.offset()),
        )
        assert forger.flush(10) == 0 and forged
        with ThreadCoordinator(conf, topic_prefix=prefix, half_partitions=1) as coordinator:
            wait_for(
                lambda: (
                    no_pending(coordinator, 1)
                    and coordinator.server.transactions.states[0].op_position > forged[0]
                ),
                60,
                "the coordinator to read the forged marker and settle the half",
            )
            assert metric(coordinator, "rmq_forged_markers_total", reason="unsigned") == 1
            assert metric(coordinator, "rmq_promotions_total") == 1
    assert listener.checked == [b"forged-before-start"]
    assert Counter(m.value() for m in read_to_end(conf, topic, 1)) == {b"forged-before-start": 1}


def _discarded(coordinator: ThreadCoordinator) -> float:
    registry = coordinator.server.metrics.registry
    return sum(
        s.value
        for m in registry.collect()
        if m.name == "rmq_discarded"
        for s in m.samples
        if s.name == "rmq_discarded_total"
    )


def test_a_commit_into_a_partition_added_just_before_is_promoted_not_discarded(
    broker, make_topic, unique
):
    """The coordinator has promoted into the topic (its clients know one partition); the
    topic then grows a partition and a COMMIT goes straight into it."""
    prefix = unique("grow").replace("-", "")
    topic = make_topic("grown", partitions=1)
    conf = broker.conf()
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, half_partitions=1) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=1,
        ) as producer,
    ):
        producer.send_message_in_transaction(Message(topic, b"before", partition=0))
        wait_for(
            lambda: metric(coordinator, "rmq_promotions_total") == 1, 60, "the first promotion"
        )
        admin = AdminClient(conf)
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
        producer.send_message_in_transaction(Message(topic, b"after", partition=1))
        wait_for(
            lambda: metric(coordinator, "rmq_promotions_total") == 2 or _discarded(coordinator),
            60,
            "the second transaction to be decided",
        )
        assert _discarded(coordinator) == 0
    records = read_to_end(conf, topic, 2)
    assert sorted((m.value(), m.partition()) for m in records) == [(b"after", 1), (b"before", 0)]
