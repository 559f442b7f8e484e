"""Validation at the client edges, on a real broker (issue 12): a system topic is never a
destination, a partition the real topic lacks fails the send before the half write, and a
lock request older than the wait its client named is refused, not granted."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka import Producer as RawProducer

from coordinator.lock_service import lock_topic_specs
from coordinator.server import Server
from coordinator.settings import CoordinatorSettings
from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, Producer, RmqError, SystemTopicError, TransactionProducer
from rmq_semantics.lock_client import LockClient
from rmq_semantics.records.codec import decode_as, encode
from rmq_semantics.records.locks import LockKey, LockReply, LockRequest
from rmq_semantics.topics import ensure_topics
from tests.integration.txn_helpers import (
    FAST,
    ScriptedListener,
    ThreadCoordinator,
    TopicReader,
    wait_for,
)

pytestmark = pytest.mark.integration


def _records_in(conf: dict, topic: str, partitions: int) -> int:
    """How many records ``topic`` holds (high watermarks; nothing was ever deleted)."""
    consumer = RawConsumer({**conf, "group.id": "unused-watermarks"})

    def high_watermarks() -> list[int] | None:
        try:
            return [
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)
            ]
        except KafkaException:  # a topic just created: its leaders may not be known yet
            return None

    try:
        return sum(wait_for(high_watermarks, 60, f"the high watermarks of {topic}"))
    finally:
        consumer.close()


def _txn_producer(conf: dict, prefix: str, group: str, listener) -> TransactionProducer:
    return TransactionProducer(
        conf,
        producer_group=group,
        listener=listener,
        topic_prefix=prefix,
        half_partitions=FAST["half_partitions"],
    )


def test_a_system_topic_is_refused_as_a_destination_by_every_producing_path(
    broker, make_topic, unique
):
    prefix = unique("e").replace("-", "")
    conf = broker.conf()
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    with _txn_producer(conf, prefix, unique("pg"), listener) as producer:
        for topic in (f"{prefix}_op", f"{prefix}_half", "__rmq_op"):
            with pytest.raises(SystemTopicError, match=topic):
                producer.send_message_in_transaction(Message(topic, b"forged"))
        with pytest.raises(SystemTopicError, match=f"{prefix}_op"):
            producer.send_messages_in_transaction(
                [Message(make_topic("ok"), b"fine"), Message(f"{prefix}_op", b"forged")]
            )
    with Producer(conf, topic_prefix=prefix) as plain:
        with pytest.raises(SystemTopicError, match=f"{prefix}_op"):
            plain.send(Message(f"{prefix}_op", b"forged"))
        with pytest.raises(SystemTopicError, match=f"{prefix}_half"):
            plain.produce(f"{prefix}_half", b"forged")
        plain.flush(10)
    # The local transaction never ran, and nothing reached a system topic.
    assert listener.executed == []
    assert _records_in(conf, f"{prefix}_half", FAST["half_partitions"]) == 0
    assert _records_in(conf, f"{prefix}_op", FAST["half_partitions"]) == 0


def test_a_partition_the_real_topic_lacks_fails_the_send_before_the_half_write(
    broker, make_topic, unique
):
    prefix = unique("p").replace("-", "")
    topic = make_topic("narrow", partitions=2)
    conf = broker.conf()
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    with _txn_producer(conf, prefix, unique("pg"), listener) as producer:
        with pytest.raises(RmqError, match=r"partition 5.*2 partitions") as refused:
            producer.send_message_in_transaction(Message(topic, b"far", partition=5))
        assert refused.value.code == "unknown_partition"
        with pytest.raises(RmqError, match="partition 2"):
            producer.send_messages_in_transaction(
                [Message(topic, b"ok", partition=1), Message(topic, b"far", partition=2)]
            )
        assert listener.executed == []
        assert _records_in(conf, f"{prefix}_half", FAST["half_partitions"]) == 0
        # A partition the topic has still goes through.
        result = producer.send_message_in_transaction(Message(topic, b"near", partition=1))
    assert result.half_offset >= 0
    assert listener.executed == [b"near"]


def _reply_to(reader: TopicReader, request_id: str) -> LockReply:
    def answered(records: list) -> bool:
        return any(decode_as(LockReply, m.value()).request_id == request_id for m in records)

    records = reader.read_until(answered, 60, f"the reply to lock request {request_id}")
    return next(
        r for r in (decode_as(LockReply, m.value()) for m in records) if r.request_id == request_id
    )


def test_a_lock_request_older_than_its_clients_wait_is_refused(broker, unique):
    """The request is written before any lock service runs (as if it had queued while the
    service was down); its client waited 1 ms. The service refuses it, so no phantom lease
    keeps the queue from the next consumer that asks."""
    prefix = unique("l").replace("-", "")
    conf = broker.conf()
    partitions = FAST["half_partitions"]
    group, topic = unique("g"), unique("orders")
    key = LockKey(group, topic, 0)
    ensure_topics(conf, lock_topic_specs(CoordinatorSettings(**FAST, topic_prefix=prefix)))
    ghost = LockRequest.from_body(
        {
            "kind": "lock",
            "request_id": unique("r"),
            "client_id": "ghost-client",
            "group": group,
            "reply_partition": 0,
            "queues": [{"topic": topic, "partition": 0, "epoch": None}],
            "lease_ms": 60000,
            "sent_at_ms": int(time.time() * 1000),
            "wait_ms": 1,
        }
    )
    raw = RawProducer(conf)
    raw.produce(
        f"{prefix}_lock_request",
        encode(ghost),
        key=key.record_key(),
        partition=key.request_partition(partitions),
    )
    assert raw.flush(10) == 0
    reader = TopicReader(conf, f"{prefix}_lock_reply", partitions)
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        LockClient(conf, topic_prefix=prefix, client_id="live-client") as client,
    ):
        [refused] = _reply_to(reader, ghost.request_id).results
        assert (refused.granted, refused.reason) == (False, "stale")
        grants = client.lock(group, [(topic, 0)], 60000, timeout=30)
        assert coordinator.server.locks.counts["stale"] == 1
    reader.close()
    assert grants[(topic, 0)].granted and grants[(topic, 0)].epoch == 1


def test_a_coordinator_refuses_to_start_on_half_and_op_topics_of_unequal_size(
    broker, unique, caplog
):
    prefix = unique("c").replace("-", "")
    conf = broker.conf()
    ensure_topics(conf, {f"{prefix}_half": (2, {}), f"{prefix}_op": (3, {})})
    server = Server(conf, CoordinatorSettings(**{**FAST, "topic_prefix": prefix}))
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(server.run()), daemon=True)
    with caplog.at_level(logging.ERROR, logger="coordinator.server"):
        thread.start()
        wait_for(
            lambda: outcome,
            60,
            "the coordinator to stop",
            details=lambda: f"transactions ready: {server.transactions.ready.is_set()}",
        )
    assert outcome == [1]
    assert any(
        f"{prefix}_half has 2 partitions and {prefix}_op has 3" in m for m in caplog.messages
    )
    server.stop()
    thread.join(10)


def test_the_cli_reading_a_prefix_that_has_no_topics_creates_none(broker, unique, capsys):
    """Asking for a topic's metadata by name creates it on a broker that auto-creates topics
    (Kafka's default) when the asking client is a producer or an admin client (librdkafka's
    ``allow.auto.create.topics`` is true for them): one partition, the broker's defaults,
    and a coordinator then refuses timer or half topics of unequal size."""
    from confluent_kafka.admin import AdminClient

    from rmq_semantics.cli import main

    prefix = unique("probe").replace("-", "")
    args = ["--bootstrap-servers", broker.bootstrap, "--topic-prefix", prefix]
    assert main(["txn", "pending", *args]) == 0
    main(["timer", "list", *args])
    capsys.readouterr()
    topics = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=30).topics
    assert [t for t in topics if t.startswith(prefix)] == []
