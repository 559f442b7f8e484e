"""The client side of timer messages on a real broker (issue 35): a scheduled send lands a
timer record on the intake topic, in its id's timer partition, with the headers the
coordinator reads, and nothing on its real topic; a recall lands a cancel record beside it;
a delay past the maximum and a scheduled transactional message are refused before anything
is written; the asyncio producer does the same; under tenant isolation both records verify
with the group's key. What is observed is read back with a plain confluent_kafka consumer."""

from __future__ import annotations

import asyncio
import time

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition

from rmq_semantics import (
    AsyncProducer,
    ConfigError,
    Message,
    Producer,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics import LocalTransactionState as S
from rmq_semantics.records.codec import decode_timer_cancel
from rmq_semantics.records.group_auth import cancel_canonical, derive_group_key
from rmq_semantics.records.headers import H
from rmq_semantics.records.timer import parse_timer, timer_partition
from rmq_semantics.topics import SystemTopics, list_topics

pytestmark = pytest.mark.integration

WAIT_S = 30


def _read(conf: dict, topic: str, partition: int, offset: int) -> confluent_kafka.Message:
    """The record at ``topic[partition]@offset``, read with a plain consumer."""
    consumer = confluent_kafka.Consumer({**conf, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                return msg
        raise AssertionError(f"nothing at {topic}[{partition}]@{offset} within {WAIT_S} s")
    finally:
        consumer.close()


def _end_offsets(conf: dict, topic: str) -> list[int]:
    consumer = confluent_kafka.Consumer({**conf, "group.id": "unused"})
    try:
        parts = list_topics(conf).topics[topic].partitions
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts
        ]
    finally:
        consumer.close()


def test_a_scheduled_send_lands_a_timer_record_on_the_intake_not_the_real_topic(
    broker, make_topic, unique
):
    prefix, topic = unique("tc").replace("-", ""), make_topic("orders", partitions=3)
    conf = broker.conf()
    before = int(time.time() * 1000)
    with Producer(conf, topic_prefix=prefix, producer_group="pg", timer_partitions=4) as producer:
        result = producer.send(
            Message(
                topic,
                b"pay",
                key=b"k1",
                headers={"app": "1"},
                tags="TagA",
                keys="order-7",
                deliver_after_ms=3_600_000,
            )
        )
        level = producer.send(Message(topic, b"lvl", partition=2, delay_time_level=3))
        past = producer.send(Message(topic, b"now", deliver_at_ms=before - 60_000))
    after = int(time.time() * 1000)
    topics = SystemTopics(prefix)
    assert result.topic == topics.timer and result.message_id
    assert result.partition == timer_partition(result.message_id, 4)
    raw = _read(conf, topics.timer, result.partition, result.offset)
    record = parse_timer(0, raw.partition(), raw.offset(), 0, raw.key(), raw.value(), raw.headers())
    assert (record.timer_id, record.real_topic, record.real_partition) == (
        result.message_id,
        topic,
        None,
    )
    assert before + 3_600_000 <= record.deliver_at_ms <= after + 3_600_000
    assert before <= record.born_ts <= record.deliver_at_ms - 3_600_000
    assert (record.producer_group, record.key, record.value) == ("pg", b"k1", b"pay")
    assert record.user_headers() == [("app", b"1")]
    assert (H.TAGS, b"TagA") in record.headers and (H.KEYS, b"order-7") in record.headers
    raw = _read(conf, topics.timer, level.partition, level.offset)
    lvl = parse_timer(0, raw.partition(), raw.offset(), 0, raw.key(), raw.value(), raw.headers())
    assert lvl.real_partition == 2 and lvl.deliver_at_ms - lvl.born_ts == 10_000
    raw = _read(conf, topics.timer, past.partition, past.offset)
    assert parse_timer(0, 0, 0, 0, None, b"now", raw.headers()).deliver_at_ms == before - 60_000
    assert _end_offsets(conf, topic) == [0, 0, 0]  # the coordinator delivers, not the send
    meta = list_topics(conf).topics
    assert len(meta[topics.timer].partitions) == len(meta[topics.timer_cancel].partitions) == 4


def test_a_recall_lands_a_cancel_record_in_the_messages_timer_partition(broker, make_topic, unique):
    prefix, topic = unique("tr").replace("-", ""), make_topic("orders")
    conf = broker.conf()
    with Producer(conf, topic_prefix=prefix, producer_group="pg") as producer:
        sent = producer.send(Message(topic, b"v", deliver_after_ms=600_000))
        recalled = producer.recall_message(sent.message_id)
    topics = SystemTopics(prefix)
    assert (recalled.topic, recalled.partition, recalled.message_id) == (
        topics.timer_cancel,
        sent.partition,
        sent.message_id,
    )
    raw = _read(conf, topics.timer_cancel, recalled.partition, recalled.offset)
    cancel = decode_timer_cancel(raw.key(), raw.value())
    assert (cancel.timer_id, cancel.producer_group) == (sent.message_id, "pg")
    assert raw.key() == sent.message_id.encode()


def test_a_delay_past_the_maximum_is_refused_and_nothing_is_written(broker, make_topic, unique):
    prefix, topic = unique("tm").replace("-", ""), make_topic("orders")
    conf = broker.conf()
    with Producer(conf, topic_prefix=prefix, max_delay_ms=60_000, delay_levels="1s") as producer:
        first = producer.send(Message(topic, b"ok", deliver_after_ms=60_000))
        with pytest.raises(ConfigError, match="over max_delay_ms=60000"):
            producer.send(Message(topic, b"far", deliver_after_ms=60_001))
        with pytest.raises(ConfigError, match="has 1 levels"):
            producer.send(Message(topic, b"lvl", delay_time_level=2))
    ends = _end_offsets(conf, SystemTopics(prefix).timer)
    assert sum(ends) == 1 and ends[first.partition] == first.offset + 1


class _Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return S.COMMIT_MESSAGE


def test_a_transactional_message_with_a_delivery_time_is_refused_before_any_half_write(
    broker, make_topic, unique
):
    prefix, topic = unique("tt").replace("-", ""), make_topic("orders")
    conf = broker.conf()
    with TransactionProducer(
        conf, producer_group="pg", listener=_Commit(), topic_prefix=prefix, half_partitions=2
    ) as producer:
        scheduled = Message(topic, b"v", deliver_after_ms=1000)
        calls = [
            lambda: producer.send_message_in_transaction(scheduled),
            lambda: producer.send_transaction([Message(topic, b"a"), scheduled]),
            lambda: producer.send_messages_in_transaction([Message(topic, b"a"), scheduled]),
        ]
        for call in calls:
            with pytest.raises(ConfigError, match=r"cannot be scheduled.*RocketMQ"):
                call()
    assert _end_offsets(conf, SystemTopics(prefix).half) == [0, 0]


def test_the_asyncio_producer_schedules_and_recalls_the_same_way(broker, make_topic, unique):
    prefix, topic = unique("ta").replace("-", ""), make_topic("orders")
    conf = broker.conf()

    async def main():
        async with AsyncProducer(conf, topic_prefix=prefix, producer_group="pg") as producer:
            sent = await producer.send(Message(topic, b"v", key=b"k", deliver_after_ms=5000))
            recalled = await producer.recall_message(sent.message_id)
            with pytest.raises(ConfigError, match="max_delay_ms"):
                await producer.send(Message(topic, b"v", deliver_after_ms=10**10))
            return sent, recalled

    sent, recalled = asyncio.run(main())
    topics = SystemTopics(prefix)
    raw = _read(conf, topics.timer, sent.partition, sent.offset)
    record = parse_timer(0, 0, 0, 0, raw.key(), raw.value(), raw.headers())
    assert (record.timer_id, record.real_topic, record.key) == (sent.message_id, topic, b"k")
    raw = _read(conf, topics.timer_cancel, recalled.partition, recalled.offset)
    assert decode_timer_cancel(raw.key(), raw.value()).timer_id == sent.message_id
    assert _end_offsets(conf, topic) == [0]


def test_under_tenant_isolation_the_records_verify_with_the_groups_key(broker, make_topic, unique):
    prefix, topic = unique("ti").replace("-", ""), make_topic("orders")
    conf = broker.conf()
    key = derive_group_key(b"a-tenant-key-of-the-timer-tests-0123", "pg")
    with Producer(conf, topic_prefix=prefix, producer_group="pg", group_key=key.text()) as producer:
        sent = producer.send(Message(topic, b"v", deliver_after_ms=5000))
        recalled = producer.recall_message(sent.message_id)
    topics = SystemTopics(prefix)
    raw = _read(conf, topics.timer, sent.partition, sent.offset)
    record = parse_timer(0, 0, 0, 0, raw.key(), raw.value(), raw.headers())
    assert key.verifies(record.canonical(), record.group_mac)
    raw = _read(conf, topics.timer_cancel, recalled.partition, recalled.offset)
    mac = dict(raw.headers())[H.GROUP_MAC]
    assert key.verifies(cancel_canonical(topics.timer_cancel, raw.partition(), raw.value()), mac)
