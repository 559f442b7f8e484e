"""The isolation promise on every consumer class, through the public API on a real broker:
a pattern subscription matching the system topics (``^<prefix>.*``) while a coordinator runs,
a transaction is pending, another was rolled back and timer messages wait on the timer
topics never hands the application a system-topic record (nor does the SimpleConsumer's
receive), never shows the pending, rolled-back or scheduled message, never commits (nor
locks, for the orderly consumer) a system-topic partition. Also the consumers' own
robustness: the push consumer's poll thread survives an exception, the asyncio iterator
commits only what it handed out."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition

from rmq_semantics import (
    AsyncConsumer,
    Consumer,
    Message,
    Producer,
    SimpleConsumer,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics import LocalTransactionState as S
from rmq_semantics.orderly import ConsumeOrderlyStatus, OrderlyConsumer
from rmq_semantics.push import ConsumeConcurrentlyStatus, PushConsumer
from rmq_semantics.records.headers import H
from rmq_semantics.topics import SystemTopics, ensure_topics, is_system_topic, timer_topic_specs
from tests.group_protocol import GROUP_PROTOCOL, group_conf
from tests.integration.txn_helpers import ThreadCoordinator, TopicReader, wait_for

pytestmark = pytest.mark.integration

ANSWERS = {b"commit": S.COMMIT_MESSAGE, b"rollback": S.ROLLBACK_MESSAGE, b"pending": S.UNKNOW}
WAIT_S = 60


@dataclass
class World:
    """A coordinator of ``prefix`` running, one committed, one rolled-back and one pending
    transaction, all to ``topic`` (``<prefix>biz``: matched by ``^<prefix>.*``, not a system
    topic)."""

    conf: dict
    prefix: str
    topic: str
    seen: list[tuple[str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pattern(self) -> str:
        return f"^{self.prefix}.*"

    def group_conf(self) -> dict:
        return group_conf(
            {**self.conf, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
        )

    def record(self, topic: str, value: bytes | None) -> None:
        with self.lock:
            self.seen.append((topic, value or b""))

    def snapshot(self) -> list[tuple[str, bytes]]:
        with self.lock:
            return list(self.seen)

    def system_seen(self) -> list[tuple[str, bytes]]:
        return [(t, v) for t, v in self.snapshot() if is_system_topic(t, self.prefix)]

    def check(self, consumer: object, fetched: Callable[[], object] = lambda: False) -> None:
        """Wait for the committed message, then until the system partitions were either
        delivered or ``fetched`` (the defect) or left out at assignment; assert only the
        committed one was delivered."""
        wait_for(
            lambda: (self.topic, b"commit-1") in self.snapshot(), WAIT_S, "the committed message"
        )
        wait_for(
            lambda: (
                self.system_seen() or fetched() or getattr(consumer, "skipped_system_partitions", 0)
            ),
            WAIT_S,
            "the system partitions to be delivered or left out",
        )
        assert self.system_seen() == [], self.system_seen()[:5]
        values = [v for _, v in self.snapshot()]
        assert not [v for v in values if v.startswith((b"pending", b"rollback", b"timer"))], values


@pytest.fixture(scope="module")
def txn_world(broker) -> Iterator[World]:
    prefix = f"pc{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}biz"
    conf = broker.conf()
    ensure_topics(conf, {topic: (1, {})})

    class Answers(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return ANSWERS[msg.value.split(b"-")[0]]

        def check_local_transaction(self, msg):
            return ANSWERS[msg.value.split(b"-")[0]]

    # A check interval longer than the module: the pending one stays pending throughout.
    with (
        # Its timer settings are the ones the timer topics below are made with.
        ThreadCoordinator(
            conf,
            topic_prefix=prefix,
            check_interval_ms=600_000,
            timer_partitions=2,
            max_delay_ms=2 * 3_600_000,
        ),
        TransactionProducer(
            conf,
            producer_group=f"pg-{prefix}",
            listener=Answers(),
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer,
    ):
        for kind in (b"pending", b"rollback", b"commit"):
            result = producer.send_message_in_transaction(Message(topic, kind + b"-1"))
            assert result.local_transaction_state is ANSWERS[kind]
        reader = TopicReader(conf, topic, 1)
        try:
            reader.read_until(lambda r: len(r) == 1, WAIT_S, "the commit to be promoted")
        finally:
            reader.close()
        _schedule_on_every_timer_topic(conf, prefix, topic)
        yield World(conf, prefix, topic)


def _schedule_on_every_timer_topic(conf: dict, prefix: str, topic: str) -> None:
    """Records on the timer topics a pattern matches (issue 35): a timer message due in an
    hour, a recalled one (its cancel record), and one on a level topic (written raw, as
    the coordinator would re-append it)."""
    topics = SystemTopics(prefix)
    ensure_topics(conf, timer_topic_specs(topics, 2, 2 * 3_600_000), replicated=True)
    with Producer(conf, topic_prefix=prefix, timer_partitions=2) as producer:
        producer.send(Message(topic, b"timer-1", deliver_after_ms=3_600_000))
        recalled = producer.send(Message(topic, b"timer-2", deliver_after_ms=3_600_000))
        producer.recall_message(recalled.message_id)
    raw = confluent_kafka.Producer(conf)
    raw.produce(topics.timer_level(1), b"timer-level", headers=[(H.TIMER_ID, b"x")])
    assert raw.flush(WAIT_S) == 0


@pytest.fixture
def world(txn_world: World) -> World:
    """The module's scene with a record of its own."""
    return World(txn_world.conf, txn_world.prefix, txn_world.topic)


def _committed_system_offsets(world: World, conf: dict) -> list[TopicPartition]:
    """The group's committed offsets on system topics (none may exist)."""
    raw = confluent_kafka.Consumer(
        {"bootstrap.servers": world.conf["bootstrap.servers"], "group.id": conf["group.id"]}
    )
    try:
        topics = raw.list_topics(timeout=10).topics
        parts = [
            TopicPartition(t, p)
            for t, meta in topics.items()
            if is_system_topic(t, world.prefix)
            for p in meta.partitions
        ]
        return [tp for tp in raw.committed(parts, timeout=10) if tp.offset >= 0]
    finally:
        raw.close()


def test_consumer_pattern_never_reads_or_commits_system_partitions(world):
    conf = {**world.group_conf(), "enable.auto.commit": False}
    with Consumer(conf, topic_prefix=world.prefix) as consumer:
        consumer.subscribe([world.pattern])

        assigned: list[list[TopicPartition]] = [[]]

        def poll() -> None:
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                world.record(msg.topic(), msg.value())
            assigned[0] = consumer.assignment()  # on this thread: one caller at a time

        stop = threading.Event()
        thread = threading.Thread(target=lambda: [poll() for _ in iter(stop.is_set, True)])
        thread.start()
        try:
            world.check(
                consumer,
                lambda: (
                    consumer.skipped_system_records
                    or any(is_system_topic(tp.topic, world.prefix) for tp in assigned[0])
                ),
            )
        finally:
            stop.set()
            thread.join(30)
        assert [tp for tp in assigned[0] if is_system_topic(tp.topic, world.prefix)] == []
        consumer.commit(asynchronous=False)
    assert _committed_system_offsets(world, conf) == []


def test_async_consumer_pattern_never_reads_or_commits_system_partitions(world):
    conf = {**world.group_conf(), "enable.auto.commit": False}

    async def main() -> list:
        async with AsyncConsumer(conf, topic_prefix=world.prefix) as consumer:
            await consumer.subscribe([world.pattern])

            async def read() -> None:
                async for msg in consumer:
                    world.record(msg.topic(), msg.value())

            reader = asyncio.ensure_future(read())
            try:
                await asyncio.to_thread(
                    world.check, consumer, lambda: consumer.skipped_system_records
                )
            finally:
                reader.cancel()
            assignment = await consumer.assignment()
            await consumer.commit(asynchronous=False)
            return assignment

    assignment = asyncio.run(asyncio.wait_for(main(), 120))
    assert not [tp for tp in assignment if is_system_topic(tp.topic, world.prefix)]
    assert _committed_system_offsets(world, conf) == []


def test_push_consumer_pattern_never_delivers_system_records(world):
    def listener(msgs, context):
        for m in msgs:
            world.record(m.topic, m.value)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        world.group_conf(), listener=listener, topic_prefix=world.prefix, max_workers=2
    )
    consumer.subscribe([world.pattern])
    consumer.start()
    try:
        world.check(consumer)
    finally:
        consumer.shutdown()


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_orderly_consumer_pattern_never_delivers_or_locks_system_partitions(world, ordering):
    def listener(msgs, context):
        for m in msgs:
            world.record(m.topic, m.value)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = OrderlyConsumer(
        world.group_conf(),
        listener=listener,
        topic_prefix=world.prefix,
        ordering=ordering,
        lock_lease_ms=6000,
        lock_renew_ms=2000,
    )
    consumer.subscribe([world.pattern])
    consumer.start()
    try:
        world.check(consumer)
        queues = consumer.status()
        assert (world.topic, 0) in queues
        assert [tp for tp in queues if is_system_topic(tp[0], world.prefix)] == []
    finally:
        consumer.shutdown()


def test_simple_consumer_pattern_never_delivers_system_records(world):
    consumer = SimpleConsumer(
        world.group_conf(),
        subscription={world.pattern: None},
        topic_prefix=world.prefix,
        await_duration=0.5,
    )
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            for message in consumer.receive(16, 30):
                world.record(message.topic, message.body)
                consumer.ack(message)

    with consumer:
        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        try:
            world.check(consumer)
        finally:
            stop.set()
            receiver.join(30)
        topics = {where.rsplit("[", 1)[0] for where in consumer.status()}
        assert topics == {world.topic}


def _produce(conf: dict, topic: str, values: list[bytes]) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": conf["bootstrap.servers"]})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0


def test_push_consumer_poll_thread_survives_an_exception_and_counts_it(broker, make_topic, unique):
    topic = make_topic("pollerr")
    raised = threading.Event()

    def stats(_json: str) -> None:  # an application's monitoring hook with a bug
        if not raised.is_set():
            raised.set()
            raise RuntimeError("bug in the application's stats_cb")

    got: list[bytes] = []

    def listener(msgs, context):
        got.extend(m.value for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    conf = group_conf(
        broker.conf(
            **{
                "group.id": unique("g"),
                "auto.offset.reset": "earliest",
                "statistics.interval.ms": 100,
                "stats_cb": stats,
            }
        )
    )
    consumer = PushConsumer(
        conf,
        listener=listener,
        max_workers=2,
        delay_levels=(1.0,),
        topic_prefix=unique("pe").replace("-", ""),
    )
    values = [f"v{i}".encode() for i in range(6)]
    _produce(broker.conf(), topic, values[:3])  # maybe fetched by the round that fails
    consumer.subscribe([topic])
    consumer.start()
    try:
        wait_for(raised.is_set, WAIT_S, "the stats callback to raise")
        _produce(broker.conf(), topic, values[3:])
        wait_for(
            lambda: sorted(set(got)) == values,
            WAIT_S,
            "the records before and after the exception",
            details=lambda: f"got {got}",
        )
        assert consumer.counts["poll_errors"] >= 1
        assert consumer.poll_error is None
    finally:
        consumer.shutdown()


def test_async_for_commits_only_the_records_it_handed_out(broker, make_topic, unique):
    topic = make_topic("aiter")
    values = [f"v{i}".encode() for i in range(10)]
    _produce(broker.conf(), topic, values)
    conf = group_conf(broker.conf(**{"group.id": unique("g"), "auto.offset.reset": "earliest"}))

    async def first_three() -> list[bytes]:
        got = []
        async with AsyncConsumer(conf) as consumer:
            await consumer.subscribe([topic])
            async for msg in consumer:
                got.append(msg.value())
                if len(got) == 3:
                    break
        return got

    assert asyncio.run(asyncio.wait_for(first_three(), 60)) == values[:3]
    raw = confluent_kafka.Consumer(
        {"bootstrap.servers": conf["bootstrap.servers"], "group.id": conf["group.id"]}
    )
    try:
        [tp] = raw.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        raw.close()
    assert tp.offset == 3  # auto commit on close covered only what the loop handed out
    rest: list[bytes] = []
    with Consumer(conf) as consumer:
        consumer.subscribe([topic])

        def more() -> bool:
            rest.extend(m.value() for m in consumer.consume(10, 0.2) if m.error() is None)
            return len(rest) >= 7

        wait_for(more, WAIT_S, "the records the first consumer never handed out")
    assert rest == values[3:]


def test_consumer_rebalance_callbacks_get_the_consumer_and_no_system_partition(world):
    conf = {**world.group_conf(), "enable.auto.commit": False}
    calls: list[tuple[str, object, list[str]]] = []
    with Consumer(conf, topic_prefix=world.prefix) as consumer:

        def on_assign(who, partitions):
            calls.append(("assign", who, [tp.topic for tp in partitions]))
            # The user's own assignment (made once, not twice), as their protocol wants it.
            (who.assign if GROUP_PROTOCOL == "classic" else who.incremental_assign)(partitions)

        consumer.subscribe(
            [world.pattern],
            on_assign=on_assign,
            on_revoke=lambda who, parts: calls.append(("revoke", who, [tp.topic for tp in parts])),
        )
        wait_for(
            lambda: (
                (msg := consumer.poll(0.2)) is not None
                and msg.error() is None
                and msg.value() == b"commit-1"
            ),
            WAIT_S,
            "the committed message",
        )
        assert consumer.skipped_system_partitions > 0
    assert calls[0] == ("assign", consumer, [world.topic])
    assert all(who is consumer and topics in ([], [world.topic]) for _, who, topics in calls)
