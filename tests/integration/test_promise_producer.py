"""The producer side of the first promise (issue 29), through the public classes on a real
broker: only the group that wrote a half message decides it, a message the coordinator could
never promote is refused before its local transaction runs, and a porting user's listener is
called."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from rmq_semantics import (
    AsyncTransactionProducer,
    Message,
    RmqError,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics import LocalTransactionState as S
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


def test_another_group_cannot_decide_a_transaction(broker, make_topic, unique, caplog):
    """ga's transactions stay UNKNOW; gb (sync and asyncio) asks COMMIT for them with the
    results ga got: both requests are rejected as a group mismatch, and ga's back-check
    decides (ROLLBACK): nothing is promoted."""
    prefix = unique("g").replace("-", "")
    topic = make_topic("groups")
    ga_listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.ROLLBACK_MESSAGE)
    gb_listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    conf = broker.conf()
    options = {"topic_prefix": prefix, "half_partitions": FAST["half_partitions"]}
    # The first check comes after gb's requests were read: they meet pending transactions.
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, transaction_timeout_ms=8000) as c,
        TransactionProducer(
            conf, producer_group=unique("ga"), listener=ga_listener, **options
        ) as ga,
        TransactionProducer(
            conf, producer_group=unique("gb"), listener=gb_listener, **options
        ) as gb,
    ):
        first = ga.send_message_in_transaction(Message(topic, b"ga-1"))
        second = ga.send_message_in_transaction(Message(topic, b"ga-2"))
        gb.end_transaction(first, S.COMMIT_MESSAGE)

        async def from_async_gb() -> None:
            async with AsyncTransactionProducer(
                conf, producer_group=gb.producer_group, listener=gb_listener, **options
            ) as agb:
                await agb.end_transaction(second, S.COMMIT_MESSAGE)

        asyncio.run(from_async_gb())
        wait_for(
            lambda: metric(c, "rmq_rejected_requests_total", reason="mismatch") == 2,
            60,
            "both of gb's requests to be rejected",
        )
        wait_for(lambda: no_pending(c, FAST["half_partitions"]), 60, "ga's checks to decide")
        assert metric(c, "rmq_promotions_total") == 0
    assert sorted(ga_listener.checked) == [b"ga-1", b"ga-2"]
    rejected = [r.getMessage() for r in caplog.records if "does not match" in r.getMessage()]
    assert {first.transaction_id, second.transaction_id} == {
        t for t in (first.transaction_id, second.transaction_id) for m in rejected if t in m
    }
    assert read_to_end(conf, topic, 1) == []


class JavaNamed(TransactionListener):
    """A listener ported from Java: RocketMQ's method names only."""

    def __init__(self) -> None:
        self.executed: list[bytes] = []
        self.checked: list[bytes] = []

    def executeLocalTransaction(self, msg, arg):  # RocketMQ's name
        self.executed.append(msg.value)
        return S.COMMIT_MESSAGE if msg.value.startswith(b"commit") else S.UNKNOW

    def checkLocalTransaction(self, msg):
        self.checked.append(msg.value)
        return S.COMMIT_MESSAGE


class AsyncJavaNamed:
    """The same for asyncio, duck-typed (no TransactionListener base) and ``async def``."""

    def __init__(self) -> None:
        self.executed: list[bytes] = []

    async def executeLocalTransaction(self, msg, arg):
        self.executed.append(msg.value)
        return S.COMMIT_MESSAGE

    async def checkLocalTransaction(self, msg):
        return S.COMMIT_MESSAGE


def test_a_listener_with_rocketmqs_method_names_is_called(broker, make_topic, unique):
    prefix = unique("j").replace("-", "")
    topic = make_topic("javanames")
    conf = broker.conf()
    options = {"topic_prefix": prefix, "half_partitions": FAST["half_partitions"]}
    listener, async_listener = JavaNamed(), AsyncJavaNamed()

    async def send_async() -> S:
        async with AsyncTransactionProducer(
            conf, producer_group=unique("aj"), listener=async_listener, **options
        ) as producer:
            result = await producer.send_message_in_transaction(Message(topic, b"commit-aio"))
            return result.local_transaction_state

    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as c,
        TransactionProducer(
            conf, producer_group=unique("j"), listener=listener, **options
        ) as producer,
    ):
        inline = producer.send_message_in_transaction(Message(topic, b"commit-inline"))
        checked = producer.send_message_in_transaction(Message(topic, b"checked"))
        assert (inline.local_transaction_state, checked.local_transaction_state) == (
            S.COMMIT_MESSAGE,
            S.UNKNOW,
        )
        assert asyncio.run(send_async()) is S.COMMIT_MESSAGE
        wait_for(lambda: metric(c, "rmq_promotions_total") == 3, 60, "three promotions")
    assert listener.executed == [b"commit-inline", b"checked"]
    assert listener.checked == [b"checked"] and async_listener.executed == [b"commit-aio"]
    assert sorted(m.value() for m in read_to_end(conf, topic, 1)) == [
        b"checked",
        b"commit-aio",
        b"commit-inline",
    ]


def _half_end_offsets(conf: dict, prefix: str) -> list[int]:
    consumer = RawConsumer({**conf, "group.id": "unused"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(f"{prefix}_half", p), 10)[1]
            for p in range(FAST["half_partitions"])
        ]
    finally:
        consumer.close()


def test_a_message_that_could_never_be_promoted_is_refused_before_the_local_transaction(
    broker, make_topic, unique
):
    """RocketMQ's send-time checks: a real topic that does not exist, a body over the
    topic's max.message.bytes, an empty body: one clear error, before the half write and the
    local transaction, on every send method (sync, batch, several, asyncio)."""
    prefix = unique("v").replace("-", "")
    small = make_topic("small")
    _set_max_bytes(broker.conf(), small, 1024)
    missing = unique("no-such-topic")
    conf = broker.conf()
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    options = {"topic_prefix": prefix, "half_partitions": FAST["half_partitions"]}
    refused = [
        (Message(missing, b"typo"), "unknown_topic", f"{missing!r} does not exist"),
        (Message(small, b"x" * 2000), "message_size", r"max\.message\.bytes"),
        (Message(small, b""), "message_size", "empty"),
    ]
    with TransactionProducer(
        conf, producer_group=unique("v"), listener=listener, **options
    ) as producer:
        for msg, code, text in refused:
            with pytest.raises(RmqError, match=text) as raised:
                producer.send_message_in_transaction(msg)
            assert raised.value.code == code
        with pytest.raises(RmqError, match="does not exist"):
            producer.send_messages_in_transaction(
                [Message(small, b"ok"), Message(missing, b"typo")]
            )
        with pytest.raises(RmqError, match=r"max\.message\.bytes"):
            producer.send_transaction([Message(small, b"ok"), Message(small, b"y" * 2000)])

    async def send_async() -> None:
        async with AsyncTransactionProducer(
            conf, producer_group=unique("av"), listener=listener, **options
        ) as aio:
            for msg, code, text in refused:
                with pytest.raises(RmqError, match=text) as raised:
                    await aio.send_message_in_transaction(msg)
                assert raised.value.code == code
            with pytest.raises(RmqError, match="empty"):
                await aio.send_transaction([Message(small, b"ok"), Message(small, b"")])

    asyncio.run(send_async())
    assert listener.executed == []
    assert _half_end_offsets(conf, prefix) == [0] * FAST["half_partitions"]
    # The missing topic was not created by asking for it.
    assert missing not in AdminClient(conf).list_topics(timeout=10).topics


def _set_max_bytes(conf: dict, topic: str, max_bytes: int) -> None:
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(max_bytes), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    admin = AdminClient(conf)  # kept alive until the futures are done
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_a_full_queue_after_the_local_transactions_never_raises_past_committed_work(
    broker, make_topic, unique
):
    """send_messages_in_transaction: the local transaction of "outer" commits while the
    producer's queue (one record, lingering) is full of another send's end request; queuing
    its own end request must not raise past that committed work: the result says COMMIT and
    the message is promoted once (by the end request once there is room, or the check)."""
    prefix = unique("q").replace("-", "")
    topic = make_topic("queue")
    conf = broker.conf(**{"queue.buffering.max.messages": 1, "linger.ms": 300})
    started: list[TransactionProducer] = []

    def execute(value: bytes) -> S:
        if value == b"outer":  # another batch's end request now waits in the queue
            started[0].send_messages_in_transaction([Message(topic, b"inner")])
        return S.COMMIT_MESSAGE

    listener = ScriptedListener(execute, lambda v: S.COMMIT_MESSAGE)
    with (
        ThreadCoordinator(broker.conf(), topic_prefix=prefix) as c,
        TransactionProducer(
            conf,
            producer_group=unique("q"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        started.append(producer)
        [outer] = producer.send_messages_in_transaction([Message(topic, b"outer")])
        assert outer.local_transaction_state is S.COMMIT_MESSAGE
        wait_for(lambda: metric(c, "rmq_promotions_total") == 2, 60, "both promotions")
    assert sorted(m.value() for m in read_to_end(broker.conf(), topic, 1)) == [b"inner", b"outer"]
