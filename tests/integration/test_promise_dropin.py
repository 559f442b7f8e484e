"""The drop-ins keep confluent-kafka's promises on a real broker, and the product's own: a
forger with the drop-in ``Producer`` cannot write the headers the coordinator owns
(``rmq.promoted_from`` is what the Spark job trusts), ``produce_batch`` keeps each
message's headers, ``cluster_id`` and ``close`` behave as confluent-kafka 2.16's, rebalance
callbacks get the drop-in (which refuses system topics), and listeners ported from Java
(``consumeMessage``) are called."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from rmq_semantics import Consumer, Producer
from rmq_semantics.errors import ConfigError, SystemTopicError
from rmq_semantics.orderly import ConsumeOrderlyStatus, MessageListenerOrderly, OrderlyConsumer
from rmq_semantics.push import ConsumeConcurrentlyStatus, PushConsumer
from rmq_semantics.records.headers import H
from rmq_semantics.topics import SystemTopics
from tests.group_protocol import group_conf
from tests.integration.push_helpers import headers_of, read_all
from tests.integration.test_orderly import LEASE_MS, RENEW_MS, orderly_conf, produce
from tests.integration.test_orderly_keys import lock_service_of
from tests.integration.txn_helpers import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def locks(broker, unique):
    with lock_service_of(broker, unique) as runner:
        yield runner


# -- forged coordinator headers ----------------------------------------------------------------
FORGED = [
    [(H.PROMOTED_FROM, b"0:1")],
    {H.PROMOTED_FROM: "0:1"},
    [("app", b"x"), (H.PROMOTED_AT, b"1")],
    [(H.TXN_ID, b"t-1")],
    [(H.DLQ_ORIGINAL_TOPIC, b"orders")],
]


def test_a_forged_promoted_from_header_is_refused_and_never_written(broker, make_topic):
    topic = make_topic("forged")
    with Producer(broker.conf()) as producer:
        for headers in FORGED:
            with pytest.raises(ConfigError, match="rmq"):
                producer.produce(topic, b"forged", headers=headers)
            # positional headers too (produce's 8th argument)
            with pytest.raises(ConfigError, match="rmq"):
                producer.produce(topic, b"forged", None, -1, None, None, 0, headers)
            with pytest.raises(ConfigError, match="rmq"):
                producer.produce_batch(
                    topic, [{"value": b"ok"}, {"value": b"forged", "headers": headers}]
                )
        # What the drop-in's own send writes for a Message's fields stays allowed.
        producer.produce(topic, b"tagged", headers=[(H.TAGS, b"TagA"), (H.KEYS, b"k1")])
        assert producer.flush(30) == 0
    records = read_all(broker.conf(), topic)
    assert [r.value() for r in records] == [b"tagged"]
    assert headers_of(records[0]) == {H.TAGS: b"TagA", H.KEYS: b"k1"}


# -- produce_batch, cluster_id, close, truthiness -----------------------------------------------
def test_produce_batch_keeps_each_messages_headers_and_callbacks(broker, make_topic):
    topic = make_topic("batch", partitions=2)
    reports: list[tuple[str, bytes]] = []
    with Producer(broker.conf()) as producer:
        messages = [
            {"value": b"a", "key": b"k", "headers": [("h", b"1")]},
            {"value": "b", "partition": 1, "headers": {"h": "2", "g": b"x"}},
            {"value": b"c", "callback": lambda e, m: reports.append(("own", m.value()))},
        ]
        queued = producer.produce_batch(
            topic, messages, on_delivery=lambda e, m: reports.append(("batch", m.value()))
        )
        assert queued == 3 and not any("_error" in m for m in messages)
        assert producer.flush(30) == 0
    assert sorted(reports) == [("batch", b"a"), ("batch", b"b"), ("own", b"c")]
    got = {
        r.value(): (r.key(), r.partition(), headers_of(r)) for r in read_all(broker.conf(), topic)
    }
    assert got[b"a"] == (b"k", got[b"a"][1], {"h": b"1"})
    assert got[b"b"] == (None, 1, {"h": b"2", "g": b"x"})
    assert got[b"c"][2] == {}


def test_cluster_id_of_producer_and_consumer_is_the_clusters(broker, unique):
    expected = AdminClient(broker.conf()).list_topics(timeout=30).cluster_id
    assert expected
    with Producer(broker.conf()) as producer:
        assert producer.cluster_id(30) == expected
    with Consumer(broker.conf(**{"group.id": unique("g")})) as consumer:
        assert consumer.cluster_id(30) == expected


def test_close_delivers_what_is_queued_then_shuts_the_producer_down(broker, make_topic):
    topic = make_topic("close")
    producer = Producer(broker.conf(**{"linger.ms": 2000}))
    assert producer  # an idle producer is truthy, as confluent_kafka's is
    for i in range(20):
        producer.produce(topic, str(i).encode())
    assert len(producer) == 20 and producer
    assert producer.close(30) is True
    assert sorted(int(r.value()) for r in read_all(broker.conf(), topic)) == list(range(20))
    with pytest.raises(RuntimeError, match="closed"):
        producer.produce(topic, b"after close")
    assert producer.close() is True  # idempotent


# -- rebalance callbacks -------------------------------------------------------------------------
def test_rebalance_callback_gets_the_drop_in_which_refuses_system_topics(
    broker, make_topic, unique
):
    topic = make_topic("cb")
    seen: list[object] = []
    refused: list[BaseException] = []
    done = threading.Event()

    def on_assign(consumer, partitions):
        seen.append(consumer)
        try:
            consumer.assign([TopicPartition(SystemTopics().half, 0)])
        except SystemTopicError as exc:
            refused.append(exc)
        consumer.assign(partitions)
        done.set()

    with Consumer(group_conf(broker.conf(**{"group.id": unique("g")}))) as consumer:
        consumer.subscribe([topic], on_assign=on_assign)
        wait_for(lambda: consumer.poll(0.2) is None and done.is_set(), 30, "the assignment")
        assert seen == [consumer] and len(refused) == 1
        assert [tp.topic for tp in consumer.assignment()] == [topic]


# -- Java-named listener methods ------------------------------------------------------------------
class JavaOrderly(MessageListenerOrderly):
    """Ported from Java: RocketMQ's method name, not the snake_case one."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    def consumeMessage(self, msgs, context):  # RocketMQ's name
        self.values.extend(m.value for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS


class JavaConcurrently:
    """A duck-typed port: no base class, RocketMQ's method name."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    def consumeMessage(self, msgs, context):  # RocketMQ's name
        self.values.extend(m.value for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_orderly_listener_with_rocketmqs_consume_message_name_is_called(
    broker, make_topic, unique, locks, ordering
):
    topic, group = make_topic("java-orderly"), unique("g")
    produce(broker, topic, [(b"k", f"m{i}".encode(), 0) for i in range(3)])
    listener = JavaOrderly()
    with OrderlyConsumer(
        orderly_conf(broker, group),
        listener=listener,
        ordering=ordering,
        lock_lease_ms=LEASE_MS,
        lock_renew_ms=RENEW_MS,
        topic_prefix=locks.prefix,
    ) as consumer:
        consumer.subscribe([topic])
        consumer.start()
        wait_for(lambda: len(listener.values) >= 3, 60, "the listener's calls")
    assert listener.values == [b"m0", b"m1", b"m2"]


def test_push_listener_with_rocketmqs_consume_message_name_is_called(broker, make_topic, unique):
    topic, group = make_topic("java-push"), unique("g")
    produce(broker, topic, [(b"k", f"m{i}".encode(), 0) for i in range(3)])
    listener = JavaConcurrently()
    consumer = PushConsumer(
        group_conf(broker.conf(**{"group.id": group, "auto.offset.reset": "earliest"})),
        listener=listener,
        topic_prefix=unique("rmqp").replace("-", ""),
    )
    with consumer:
        consumer.subscribe([topic])
        consumer.start()
        wait_for(lambda: len(listener.values) >= 3, 60, "the listener's calls")
    assert sorted(listener.values) == [b"m0", b"m1", b"m2"]


# -- the orderly DLQ ---------------------------------------------------------------------------
def _topic_config_source(broker, topic: str, name: str) -> int:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient(broker.conf())  # kept alive until the answer came
    [future] = admin.describe_configs([resource]).values()
    return future.result(timeout=30)[name].source


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_orderly_dead_letters_carry_reason_and_exception_on_a_replicated_dlq(
    broker, make_topic, unique, locks, ordering
):
    topic, group = make_topic("dlq-reason"), unique("g")
    produce(broker, topic, [(b"k", b"poison", 0)])

    def listener(msgs, context):
        context.suspend_ms = 50
        raise ValueError(f"bad row {msgs[0].offset}")

    with OrderlyConsumer(
        orderly_conf(broker, group),
        listener=listener,
        ordering=ordering,
        max_reconsume_times=1,
        lock_lease_ms=LEASE_MS,
        lock_renew_ms=RENEW_MS,
        topic_prefix=locks.prefix,
    ) as consumer:
        consumer.subscribe([topic])
        consumer.start()
        dlq = SystemTopics(locks.prefix).dlq(group)
        wait_for(
            lambda: getattr(consumer.status().get((topic, 0)), "committed_offset", -1) == 1,
            60,
            "the poison message to be dead-lettered",
        )
    [dead] = read_all(broker.conf(), dlq)
    headers = headers_of(dead)
    assert (
        headers.get(H.DLQ_REASON),
        headers.get(H.DLQ_EXCEPTION),
        headers.get(H.DLQ_EXCEPTION_MESSAGE),
    ) == (b"raised", b"ValueError", b"bad row 0")
    assert int(headers[H.DLQ_LAST_FAILURE_TS]) >= int(headers[H.DLQ_FIRST_FAILURE_TS]) > 0
    # Created like every system topic (replication_for): min.insync.replicas set on the
    # topic, not left to the broker's default.
    assert (
        _topic_config_source(broker, dlq, "min.insync.replicas")
        == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    )
