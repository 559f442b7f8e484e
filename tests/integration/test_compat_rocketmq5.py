"""RocketMQ 5's Python client API on Kafka (issue 37): the official examples of
apache/rocketmq-clients ``python/example`` (normal, async, FIFO, delay and transactional
producers, simple and push consumers), written again in this project's words against
``rmq_semantics.compat.rocketmq`` on the embedded broker with a coordinator beside it.

What is asserted is what a RocketMQ user observes: what a consumer receives, in which order
and how often, and what a plain read_committed ``confluent_kafka`` reader sees on the topic."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from rmq_semantics.compat.rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rmq_semantics.records.headers import H
from rmq_semantics.topics import SystemTopics
from tests.integration.txn_helpers import ThreadCoordinator, TopicReader, wait_for

pytestmark = pytest.mark.integration

WAIT_S = 60
# Timer topics of a small size: the coordinator's wheel and the producers' intake agree.
TIMERS = {"timer_partitions": 2, "max_delay_ms": 60_000}


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"rmq5{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def coordinator(broker, prefix) -> Iterator[ThreadCoordinator]:
    with ThreadCoordinator(broker.conf(), topic_prefix=prefix, **TIMERS) as running:
        yield running


@pytest.fixture
def config(broker, prefix) -> ClientConfiguration:
    """The examples' ``ClientConfiguration(endpoints, Credentials())``: the endpoints are the
    broker's bootstrap list; anything else the test broker needs travels in kafka_conf."""
    extra = {k: v for k, v in broker.conf().items() if k != "bootstrap.servers"}
    return ClientConfiguration(
        broker.bootstrap, Credentials(), kafka_conf=extra, topic_prefix=prefix
    )


def committed_to_end(broker, group: str, topic: str, partitions: int) -> bool:
    """Whether ``group`` committed every partition of ``topic`` up to its end (all acked)."""
    consumer = RawConsumer({**broker.conf(), "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        committed = consumer.committed(tps, timeout=10)
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
        return all(c.offset == end for c, end in zip(committed, ends, strict=True))
    finally:
        consumer.close()


def receive_all(consumer: SimpleConsumer, n: int, ack: bool = True) -> list[Message]:
    got: list[Message] = []

    def more() -> bool:
        for msg in consumer.receive(32, 15):
            got.append(msg)
            if ack:
                consumer.ack(msg)
        return len(got) >= n

    wait_for(more, WAIT_S, f"{n} messages", interval_s=0)
    return got


def test_normal_producer_then_simple_consumer_receives_and_acks(broker, make_topic, unique, config):
    topic, group = make_topic("normal"), unique("simple")
    producer = Producer(config, (topic,))
    producer.startup()
    msg = Message()
    msg.topic = topic
    msg.body = b"hello, rocketmq."
    msg.tag = "tag"
    msg.keys = "keys"
    msg.add_property("key", "value")
    receipts = [producer.send(msg) for _ in range(10)]  # one Message sent ten times
    producer.shutdown()
    assert len({r.message_id for r in receipts}) == 10
    assert [r.offset for r in receipts] == list(range(10))

    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        got = receive_all(consumer, 10)
        wait_for(lambda: committed_to_end(broker, group, topic, 1), WAIT_S, "the acks committed")
    finally:
        consumer.shutdown()
    assert len(got) == 10
    assert {m.message_id for m in got} == {r.message_id for r in receipts}
    first = got[0]
    assert (first.topic, first.body, first.tag, first.keys) == (
        topic,
        b"hello, rocketmq.",
        "tag",
        {"keys"},
    )
    assert first.properties == {"key": "value"}
    assert first.delivery_attempt == 1 and first.born_timestamp > 0


def test_async_producer_futures_resolve_and_every_message_lands_once(broker, make_topic, config):
    topic = make_topic("async", partitions=2)
    producer = Producer(config, (topic,))
    producer.startup()
    futures = []
    for i in range(10):
        msg = Message()
        msg.topic = topic
        msg.body = f"hello {i}".encode()
        msg.add_property("send", "async")
        futures.append(producer.send_async(msg))
    receipts = [f.result(timeout=WAIT_S) for f in futures]
    producer.shutdown()
    reader = TopicReader(broker.conf(), topic, 2)
    try:
        records = reader.read_until(lambda r: len(r) >= 10, WAIT_S, "the async sends")
        reader.settle(1.0)
    finally:
        reader.close()
    assert sorted(r.value() for r in records) == sorted(f"hello {i}".encode() for i in range(10))
    assert all(("send", b"async") in r.headers() for r in records)
    assert len({r.message_id for r in receipts}) == 10


def test_fifo_messages_of_a_group_are_received_in_send_order(broker, make_topic, unique, config):
    topic, group = make_topic("fifo", partitions=3), unique("fifo-consumer")
    producer = Producer(config, (topic,))
    producer.startup()
    for i in range(1, 10):
        msg = Message()
        msg.topic = topic
        msg.body = f"{i}".encode()
        msg.tag = "rocketmq-send-fifo-message"
        msg.message_group = "1" if i % 2 else "2"
        producer.send(msg)
    producer.shutdown()

    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        got = receive_all(consumer, 9)
    finally:
        consumer.shutdown()
    order: dict[str, list[int]] = {}
    for m in got:
        order.setdefault(m.message_group, []).append(int(m.body))
    assert order == {"1": [1, 3, 5, 7, 9], "2": [2, 4, 6, 8]}
    # One group, one partition, whatever the topic's partition count.
    assert len({m.message_id.rsplit(":", 2)[1] for m in got if m.message_group == "1"}) == 1


def test_a_delayed_message_is_not_delivered_before_its_time(
    broker, make_topic, unique, config, coordinator
):
    topic, group = make_topic("delay"), unique("delay-consumer")
    producer = Producer(config, (topic,), delay_levels="1s 5s", **TIMERS)
    producer.startup()
    msg = Message()
    msg.topic = topic
    msg.body = b"hello, rocketmq."
    msg.tag = "rocketmq-send-delay-message"
    msg.delivery_timestamp = int(time.time()) + 3  # seconds, as RocketMQ's client takes it
    receipt = producer.send(msg)
    producer.shutdown()
    due_ms = msg.delivery_timestamp * 1000
    assert receipt.recall_handle == receipt.message_id

    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        [got] = receive_all(consumer, 1)
        received_at_ms = time.time() * 1000
    finally:
        consumer.shutdown()
    assert received_at_ms >= due_ms  # never early
    assert got.body == b"hello, rocketmq." and got.tag == "rocketmq-send-delay-message"
    assert got.delivery_timestamp >= due_ms  # read back in ms, as RocketMQ's client does


class CommitOnCheck(TransactionChecker):
    def __init__(self) -> None:
        self.checked: list[Message] = []
        self.lock = threading.Lock()

    def check(self, message: Message) -> TransactionResolution:
        with self.lock:
            self.checked.append(message)
        return TransactionResolution.COMMIT


def test_a_transaction_left_open_is_committed_by_the_checker_and_visible_once(
    broker, make_topic, config, coordinator
):
    topic = make_topic("txn")
    checker = CommitOnCheck()
    producer = Producer(config, (topic,), checker=checker)
    producer.startup()
    reader = TopicReader(broker.conf(), topic, 1)
    try:
        bodies = {}
        for what in ("by-check", "commit", "rollback"):
            transaction = producer.begin_transaction()
            msg = Message()
            msg.topic = topic
            msg.body = what.encode()
            msg.tag = "rocketmq-send-transaction-message"
            receipt = producer.send(msg, transaction)
            assert receipt.transaction_id == transaction.message_id == msg.message_id
            bodies[what] = transaction
        bodies["commit"].commit()
        bodies["rollback"].rollback()
        records = reader.read_until(lambda r: len(r) >= 2, WAIT_S, "the two commits")
        records = reader.settle(3.0)
    finally:
        reader.close()
        producer.shutdown()
    assert sorted(r.value() for r in records) == [b"by-check", b"commit"]
    assert all(any(k == H.PROMOTED_FROM for k, _ in r.headers()) for r in records)
    asked = {m.body for m in checker.checked}
    assert b"by-check" in asked and b"rollback" not in asked
    seen = next(m for m in checker.checked if m.body == b"by-check")
    assert (seen.topic, seen.tag) == (topic, "rocketmq-send-transaction-message")


class Listener(MessageListener):
    """Fails the first delivery of ``fail-once``, acks everything else."""

    def __init__(self) -> None:
        self.consumed: list[tuple[bytes, int]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.consumed.append((message.body, message.delivery_attempt))
        if message.body == b"fail-once" and message.delivery_attempt == 1:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def test_push_consumer_consumes_acks_and_redelivers_a_failure(broker, make_topic, unique, config):
    topic, group = make_topic("push"), unique("push-consumer")
    producer = Producer(config, (topic,))
    producer.startup()
    for body, tag in (("a", "TagA"), ("b", "TagB"), ("fail-once", "TagA"), ("c", "TagA")):
        msg = Message()
        msg.topic = topic
        msg.body = body.encode()
        msg.tag = tag
        producer.send(msg)
    producer.shutdown()

    listener = Listener()
    consumer = PushConsumer(config, group, listener, {topic: FilterExpression("TagA")})
    consumer.startup()
    try:
        wait_for(lambda: (b"fail-once", 2) in listener.consumed, WAIT_S, "the failed message again")
        wait_for(lambda: committed_to_end(broker, group, topic, 1), WAIT_S, "the acks committed")
    finally:
        consumer.shutdown()
    assert sorted(listener.consumed) == [
        (b"a", 1),
        (b"c", 1),
        (b"fail-once", 1),
        (b"fail-once", 2),
    ]


class GroupOrder(MessageListener):
    """Records each group's consumption order; fails ``1-2``'s first delivery."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, int]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.calls.append((message.message_group, message.body, message.delivery_attempt))
        if message.body == b"1-2" and message.delivery_attempt == 1:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def retry_copies(broker, prefix: str, group: str) -> int:
    """How many offsets the push consumer of ``group`` used on its first retry topic (its
    one partition): copies of messages it redelivers later, transaction markers with them."""
    consumer = RawConsumer({**broker.conf(), "group.id": group})
    try:
        retry = TopicPartition(SystemTopics(prefix).retry(group, 1), 0)
        return consumer.get_watermark_offsets(retry, timeout=10)[1]
    finally:
        consumer.close()


def test_a_push_consumer_holds_a_message_group_behind_its_failure_with_no_fifo_flag(
    broker, make_topic, unique, config, prefix
):
    """As a RocketMQ 5 client consumes what a FIFO group hands it: no flag, each group in
    order, a FAILURE retried in place; ``fifo=False`` (ours) redelivers it via a retry topic."""
    topic = make_topic("fifo-push", partitions=2)
    group, concurrent_group = unique("fifo-push"), unique("fifo-off")
    producer = Producer(config, (topic,))
    producer.startup()
    for i in range(1, 5):
        for message_group in ("1", "2"):
            msg = Message()
            msg.topic = topic
            msg.body = f"{message_group}-{i}".encode()
            msg.message_group = message_group
            producer.send(msg)
    producer.shutdown()

    listener, concurrent_listener = GroupOrder(), GroupOrder()
    consumers = [
        PushConsumer(config, group, listener, {topic: FilterExpression()}),
        PushConsumer(
            config, concurrent_group, concurrent_listener, {topic: FilterExpression()}, fifo=False
        ),
    ]
    assert [c.fifo for c in consumers] == [True, False]
    for consumer in consumers:
        consumer.startup()
    try:
        for name, calls in ((group, listener.calls), (concurrent_group, concurrent_listener.calls)):
            wait_for(lambda calls=calls: len(calls) >= 9, WAIT_S, f"{name}: all and the retry")
            wait_for(lambda name=name: committed_to_end(broker, name, topic, 2), WAIT_S, "acks")
    finally:
        for consumer in consumers:
            consumer.shutdown()
    one = [(body, attempt) for g, body, attempt in listener.calls if g == "1"]
    two = [body for g, body, _ in listener.calls if g == "2"]
    assert one == [(b"1-1", 1), (b"1-2", 1), (b"1-2", 2), (b"1-3", 1), (b"1-4", 1)]
    assert two == [b"2-1", b"2-2", b"2-3", b"2-4"]
    assert retry_copies(broker, prefix, group) == 0  # retried in place
    assert retry_copies(broker, prefix, concurrent_group) > 0
    assert sorted(concurrent_listener.calls) == sorted(listener.calls)


def test_a_back_check_goes_to_another_producer_of_the_topic_not_of_another_topic(
    broker, make_topic, config, coordinator
):
    """RocketMQ 5 has no producer group: the check of a transaction whose producer is gone
    goes to a producer that declared the message's topic, never to one of another topic."""
    topic, other_topic = make_topic("orphan"), make_topic("elsewhere")
    gone = Producer(config, (topic,), checker=CommitOnCheck())
    gone.startup()
    msg = Message()
    msg.topic = topic
    msg.body = b"orphan"
    gone.send(msg, gone.begin_transaction())
    gone.shutdown()  # before any check: it never answers

    heir, stranger = CommitOnCheck(), CommitOnCheck()
    producers = [
        Producer(config, (topic,), checker=heir),
        Producer(config, (other_topic,), checker=stranger),
    ]
    reader = TopicReader(broker.conf(), topic, 1)
    try:
        for producer in producers:
            producer.startup()
        records = reader.read_until(lambda r: len(r) >= 1, WAIT_S, "the orphan committed")
        records = reader.settle(2.0)
    finally:
        reader.close()
        for producer in producers:
            producer.shutdown()
    assert [r.value() for r in records] == [b"orphan"]
    assert [m.body for m in heir.checked] == [b"orphan"]
    assert stranger.checked == []
