"""A coordinator that takes half/op partitions over while the previous owner's promotion
transaction is still open there (the fault campaign, seed 30: its commit markers were held
up 17 s by a partitioned transaction coordinator) must not decide what that transaction
decides. A read_committed reader stops at the open transaction, so the partition's end
arrives before the previous owner's done marker, and an end request read before it would
promote the message a second time.

The previous owner is played by a plain confluent_kafka transactional producer holding the
coordinators' marker key (as every coordinator does): it promotes the message and writes
the signed done marker in a transaction it commits only once the new coordinator runs."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer as RawProducer

from coordinator.marker_auth import MarkerKey
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

KEY = "the-coordinators-marker-key-for-the-takeover-test"


def test_a_takeover_waits_for_the_previous_owners_open_transaction(broker, make_topic, unique):
    """The producer's COMMIT is in Op; after it, the previous owner's open transaction holds
    the promotion and its done marker. The new coordinator waits for that transaction to end
    and promotes nothing itself: the message is visible once."""
    prefix = unique("tk").replace("-", "")
    topic = make_topic("takeover")
    conf = broker.conf()
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    with TransactionProducer(
        conf, producer_group=unique("pg"), listener=listener, topic_prefix=prefix, half_partitions=1
    ) as producer:
        sent = producer.send_message_in_transaction(Message(topic, b"once"))
        previous_owner = RawProducer(
            {**conf, "transactional.id": unique("previous-owner"), "transaction.timeout.ms": 120000}
        )
        previous_owner.init_transactions(30)
        previous_owner.begin_transaction()
        previous_owner.produce(topic, b"once")
        op = f"{prefix}_op"
        done = DoneMarkers(
            (DoneEntry(sent.half_offset, sent.transaction_id, Outcome.COMMITTED, 0),),
            int(time.time() * 1000),
        )
        previous_owner.produce(op, encode(MarkerKey(KEY.encode()).sign(op, 0, done)), partition=0)
        assert previous_owner.flush(30) == 0
        with ThreadCoordinator(
            conf, topic_prefix=prefix, half_partitions=1, marker_key=KEY
        ) as coordinator:
            # The defect promotes at once; the fix waits and says so.
            wait_for(
                lambda: (
                    metric(coordinator, "rmq_promotions_total") == 1
                    or metric(coordinator, "rmq_takeover_waiting_partitions") == 1
                ),
                60,
                "a promotion, or the takeover waiting for the open transaction",
            )
            previous_owner.commit_transaction(30)
            wait_for(lambda: no_pending(coordinator, 1), 60, "the half decided")
            assert metric(coordinator, "rmq_takeover_waiting_partitions") == 0
            assert metric(coordinator, "rmq_promotions_total") == 0
    assert [m.value() for m in read_to_end(conf, topic, 1)] == [b"once"]
