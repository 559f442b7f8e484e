"""Bounded pending state on a real broker: a transaction its producer group abandoned is
re-appended past the horizon, so it pins neither the coordinator's committed offsets nor its
memory, and a late decision addressed to its old offset still promotes it exactly once."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.embedded import free_port
from rmq_semantics.tools.admin import list_pending
from rmq_semantics.topics import SystemTopics
from tests.integration.ops_helpers import START_TIMEOUT_S, health, samples, value
from tests.integration.txn_helpers import (
    CoordinatorProcess,
    ScriptedListener,
    TopicReader,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration

# Small, so a test sees many re-appends. Passed through the environment: a coordinator that
# does not know the setting still starts (and the test fails on what it observes).
HORIZON_ENV = {"RMQ_REAPPEND_HORIZON_MS": "2000"}
BATCH = 300
BATCHES = 10


def _committed_half_offset(conf: dict, prefix: str) -> int:
    """The coordinator group's committed offset on half partition 0 (README: the lowest
    half offset a new owner must read again)."""
    topics = SystemTopics(prefix)
    consumer = RawConsumer(
        {**conf, "group.id": topics.coordinator_group, "enable.auto.commit": False}
    )
    try:
        [tp] = consumer.committed([TopicPartition(topics.half, 0)], timeout=30)
        return tp.offset
    finally:
        consumer.close()


def test_an_abandoned_transaction_pins_neither_committed_offsets_nor_memory(
    broker, make_topic, unique, tmp_path
):
    prefix = unique("hz").replace("-", "")
    topic = make_topic("horizon")
    conf = broker.conf()
    port = free_port()
    coordinator = CoordinatorProcess(
        broker.bootstrap,
        tmp_path / "coordinator.log",
        "--metrics-port",
        str(port),
        topic_prefix=prefix,
        half_partitions=1,
        env=HORIZON_ENV,
    )
    try:
        wait_for(
            lambda: (health(coordinator, port) or {}).get("owned_partitions") == [0],
            START_TIMEOUT_S,
            "the coordinator to own half partition 0",
        )
        gone = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.UNKNOW)
        with TransactionProducer(
            conf,
            producer_group=unique("gone"),
            listener=gone,
            topic_prefix=prefix,
            half_partitions=1,
        ) as producer:
            abandoned = producer.send_message_in_transaction(Message(topic, b"abandoned"))
        # Its producer group has no member left: checks go unanswered, nothing resolves it.

        committing = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
        most_tracked = 0
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=committing,
            topic_prefix=prefix,
            half_partitions=1,
        ) as producer:
            for batch in range(BATCHES):
                results = producer.send_messages_in_transaction(
                    [Message(topic, f"m-{batch}-{i}".encode()) for i in range(BATCH)]
                )
                last = max(r.half_offset for r in results)

                def moved_past(last: int = last) -> bool:
                    nonlocal most_tracked
                    tracked = value(samples(port), "rmq_tracked_transactions", partition="0")
                    most_tracked = max(most_tracked, tracked)
                    return _committed_half_offset(conf, prefix) > last

                wait_for(
                    moved_past,
                    60,
                    f"the committed half offset to move past batch {batch} (the "
                    f"abandoned transaction is at {abandoned.half_offset})",
                    details=lambda: f"committed {_committed_half_offset(conf, prefix)}",
                )
                # One horizon's traffic at most: this batch, the abandoned transaction and
                # its re-append in flight; never the batches before.
                wait_for(
                    lambda: value(samples(port), "rmq_tracked_transactions", partition="0") <= 3,
                    30,
                    "the coordinator to forget the decided transactions below its "
                    "committed half offset",
                )
        assert most_tracked <= BATCH + 3, most_tracked

        # What a new owner would rebuild from the committed offsets: only the abandoned
        # transaction, at an offset after every commit.
        pending = list_pending(conf, prefix)
        assert [p.txn_id for p in pending] == [abandoned.transaction_id]
        assert pending[0].half_offset > last
        metrics = samples(port)
        assert value(metrics, "rmq_reappended_total") >= 1
        assert value(metrics, "rmq_promotions_total") == BATCH * BATCHES
    finally:
        code = coordinator.stop()
    assert code == 0, coordinator.log
    assert "Traceback" not in coordinator.log
    values = Counter(m.value() for m in read_to_end(conf, topic, 1))
    assert len(values) == BATCH * BATCHES and max(values.values()) == 1
    assert b"abandoned" not in values


def test_a_late_commit_to_the_old_offset_after_a_reappend_is_promoted_once(
    broker, make_topic, unique, tmp_path
):
    """UNKNOWN -> re-append -> COMMIT to the offset the producer knows: with the coordinator
    that re-appended it, and with a new owner that rebuilt its state from the topics."""
    prefix = unique("hl").replace("-", "")
    topic = make_topic("late")
    conf = broker.conf()
    log_path = tmp_path / "coordinator.log"
    settings = {"topic_prefix": prefix, "half_partitions": 1, "check_max": 1000}
    listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.UNKNOW)
    reader = TopicReader(conf, topic, 1)
    coordinator = CoordinatorProcess(broker.bootstrap, log_path, env=HORIZON_ENV, **settings)
    try:
        coordinator.wait_ready()
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=1,
        ) as producer:
            live, restarted = (
                producer.send_message_in_transaction(Message(topic, v))
                for v in (b"live", b"restarted")
            )

            def reappended(*results) -> bool:
                now = {p.txn_id: p.half_offset for p in list_pending(conf, prefix)}
                return all(now.get(r.transaction_id, -1) > r.half_offset for r in results)

            wait_for(
                lambda: reappended(live, restarted),
                90,
                "both transactions to be re-appended past the horizon",
            )
            # The producer decides late, addressing the offset it was given, twice.
            for _ in range(2):
                producer.end_transaction(live, S.COMMIT_MESSAGE)
            reader.read_until(lambda r: len(r) >= 1, 60, "the live late commit")

            coordinator.stop()
            coordinator = CoordinatorProcess(
                broker.bootstrap, log_path, env=HORIZON_ENV, **settings
            )
            coordinator.wait_ready()
            for _ in range(2):
                producer.end_transaction(restarted, S.COMMIT_MESSAGE)
            reader.read_until(lambda r: len(r) >= 2, 90, "the late commit after a restart")
            reader.settle()
        assert listener.checked, "the back-checks went on across the re-appends"
    finally:
        code = coordinator.stop()
        reader.close()
    assert code == 0, coordinator.log
    assert "Traceback" not in coordinator.log
    assert sorted(m.value() for m in reader.records) == [b"live", b"restarted"]
    assert sorted(m.value() for m in read_to_end(conf, topic, 1)) == [b"live", b"restarted"]
