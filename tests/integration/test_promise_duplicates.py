"""A half record appended twice (the fault campaign, seed 1: an idempotent producer's retry
across a controller kill landed the same half at two offsets) is promoted once, through
the public classes on a real broker with a plain confluent_kafka producer writing the
copy: whichever copy the producer's end request names, and whether the copy lands before
or after the decision, the message is visible exactly once."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer as RawProducer

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.topics import SystemTopics
from tests.integration.txn_helpers import (
    FAST,
    ScriptedListener,
    ThreadCoordinator,
    metric,
    no_pending,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration


def _copy_half(conf: dict, half_topic: str, txn_id: str) -> None:
    """Append a byte-for-byte copy of ``txn_id``'s half record to its partition."""
    [original] = [
        m
        for m in read_to_end(conf, half_topic, FAST["half_partitions"])
        if dict(m.headers() or []).get("rmq.txn_id") == txn_id.encode()
    ]
    adversary = RawProducer(conf)
    adversary.produce(
        half_topic,
        original.value(),
        original.key(),
        partition=original.partition(),
        headers=original.headers(),
    )
    assert adversary.flush(30) == 0


@pytest.mark.parametrize("decided_first", [True, False], ids=["copy-after", "copy-before"])
def test_a_half_record_appended_twice_is_promoted_once(broker, make_topic, unique, decided_first):
    """copy-after: the local transaction commits, the copy lands after the promotion and is
    checked (the seeds' checker answers COMMIT). copy-before: the local transaction is
    UNKNOW, the copy lands while both wait for the check, which answers COMMIT for each."""
    prefix = unique("d").replace("-", "")
    topic = make_topic("dup")
    conf = broker.conf()
    listener = ScriptedListener(
        lambda v: S.COMMIT_MESSAGE if decided_first else S.UNKNOW, lambda v: S.COMMIT_MESSAGE
    )
    half_topic = SystemTopics(prefix).half
    with (
        ThreadCoordinator(
            conf, topic_prefix=prefix, transaction_timeout_ms=1500 if decided_first else 6000
        ) as c,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        sent = producer.send_message_in_transaction(Message(topic, b"once"))
        if decided_first:
            wait_for(lambda: metric(c, "rmq_promotions_total") == 1, 60, "the promotion")
        _copy_half(conf, half_topic, sent.transaction_id)
        # Read either way: recognised as a copy, or (the defect) promoted a second time.
        wait_for(
            lambda: (
                metric(c, "rmq_duplicate_halves_total") == 1
                or metric(c, "rmq_promotions_total") == 2
            ),
            60,
            "the copy to be read",
        )
        wait_for(lambda: no_pending(c, FAST["half_partitions"]), 60, "everything decided")
        assert metric(c, "rmq_promotions_total") == 1
    assert [m.value() for m in read_to_end(conf, topic, 1)] == [b"once"]
