"""RocketMQ's client APIs over the product (issue 37), without a broker: addresses and
credentials as a Kafka conf, messages both ways with RocketMQ's units, the answers of a
checker or a callback as the product's states, per-topic tag filters, and what is refused."""

from __future__ import annotations

import pytest

from rmq_semantics import ConfigError, LocalTransactionState
from rmq_semantics.compat import rocketmq as v5
from rmq_semantics.compat import rocketmq_client as v2
from rmq_semantics.compat.common import TopicFilters, bootstrap_servers, kafka_conf
from rmq_semantics.compat.v2.clients import _Callbacks
from rmq_semantics.compat.v2.model import Received
from rmq_semantics.compat.v5.producer import _CheckerListener
from rmq_semantics.errors import IllegalStateError
from rmq_semantics.message import Message as ProductMessage
from rmq_semantics.records.headers import H


@pytest.mark.parametrize(
    "addresses, expected",
    [
        ("127.0.0.1:9876", "127.0.0.1:9876"),
        ("a:1;b:2", "a:1,b:2"),
        ("http://a:1; https://b:2/;", "a:1,b:2"),
        ("a:1,b:2", "a:1,b:2"),
    ],
)
def test_rocketmq_address_lists_become_the_bootstrap_list(addresses, expected):
    assert bootstrap_servers(addresses) == expected


def test_an_empty_address_list_is_refused_with_what_to_give():
    with pytest.raises(ConfigError, match="names no broker: give the Kafka bootstrap"):
        bootstrap_servers(" ; ")


def test_credentials_are_sasl_plain_and_the_callers_kafka_conf_wins():
    assert kafka_conf("a:1") == {"bootstrap.servers": "a:1"}
    assert kafka_conf("a:1", username="ak", password="sk", tls=True) == {
        "bootstrap.servers": "a:1",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "ak",
        "sasl.password": "sk",
    }
    conf = kafka_conf("a:1", username="ak", extra={"sasl.mechanisms": "SCRAM-SHA-512"})
    assert (conf["security.protocol"], conf["sasl.mechanisms"]) == (
        "SASL_PLAINTEXT",
        "SCRAM-SHA-512",
    )
    assert kafka_conf("a:1", tls=True)["security.protocol"] == "SSL"


def test_a_5x_message_becomes_the_products_with_seconds_turned_into_ms():
    config = v5.ClientConfiguration("a:1", v5.Credentials())
    msg = v5.Message()
    msg.topic, msg.body, msg.tag = "orders", b"paid", "TagA"
    msg.keys = "k1"
    msg.keys = "k2"  # RocketMQ's setter adds
    msg.add_property("app", "shop")
    msg.delivery_timestamp = 1_700_000_000
    sent = msg.product(config, transactional=False)
    assert (sent.topic, sent.value, sent.tags, sent.keys) == ("orders", b"paid", "TagA", "k1 k2")
    assert sent.deliver_at_ms == 1_700_000_000_000
    assert sent.headers == [("app", b"shop")]
    assert msg.message_type == 3 and v5.Message.message_type_desc(3) == "DELAY"


def test_a_received_5x_message_reads_rocketmqs_fields_from_the_headers():
    config = v5.ClientConfiguration("a:1", v5.Credentials(), "prod")
    headers = [
        ("app", b"shop"),
        (H.TAGS, b"TagA"),
        (H.KEYS, b"k1 k2"),
        (H.MESSAGE_GROUP, b"g1"),
        (H.DELIVERED_AT, b"1700000000123"),
    ]
    got = v5.Message.received(
        config,
        topic="prod.orders",
        value=b"paid",
        headers=headers,
        message_id="prod.orders:0:7",
        born_timestamp=5,
        delivery_attempt=2,
    )
    assert (got.topic, got.namespace, got.body, got.tag, got.keys) == (
        "orders",
        "prod",
        b"paid",
        "TagA",
        {"k1", "k2"},
    )
    assert got.properties == {"app": "shop"}  # the product's rmq.* headers left out
    assert (got.message_group, got.delivery_timestamp) == ("g1", 1_700_000_000_123)
    assert (got.message_id, got.born_timestamp, got.delivery_attempt) == ("prod.orders:0:7", 5, 2)


def test_a_namespace_prefixes_topic_and_group_names():
    config = v5.ClientConfiguration("a:1", v5.Credentials(), "prod")
    assert config.resource("orders") == "prod.orders"
    assert config.local("prod.orders") == "orders"
    assert v5.producer_group_for("orders", config) == "prod.orders"
    with pytest.raises(ConfigError, match="namespace"):
        v5.ClientConfiguration("a:1", v5.Credentials(), "a.b")


@pytest.mark.parametrize(
    "setting, match",
    [
        (lambda m: setattr(m, "priority", 1), "priority messages are not supported"),
        (lambda m: setattr(m, "lite_topic", "x"), "lite topics are not supported"),
        (lambda m: setattr(m, "tag", "a|b"), 'tag should not contain "|"'),
        (lambda m: setattr(m, "keys", "a b"), "key should not contain a space"),
        (lambda m: m.add_property("rmq.txn_id", "x"), "reserved"),
        (lambda m: setattr(m, "body", b""), "body should not be blank"),
    ],
)
def test_what_a_5x_message_refuses(setting, match):
    with pytest.raises(ConfigError, match=match):
        setting(v5.Message())


def test_a_message_group_and_a_delivery_time_exclude_each_other_as_in_rocketmq():
    msg = v5.Message()
    msg.message_group = "g"
    with pytest.raises(ConfigError, match="should not be set at same time"):
        msg.delivery_timestamp = 1


def test_sql92_filters_are_refused_and_resolutions_keep_protobufs_numbers():
    with pytest.raises(ConfigError, match="SQL92"):
        v5.FilterExpression("a > 1", v5.FilterType.SQL)
    assert v5.TransactionResolution.items() == [
        ("TRANSACTION_RESOLUTION_UNSPECIFIED", 0),
        ("COMMIT", 1),
        ("ROLLBACK", 2),
    ]
    assert v5.TransactionResolution.Name(1) == "COMMIT"
    assert v5.TransactionResolution.Value("ROLLBACK") == 2


class Answer(v5.TransactionChecker):
    def __init__(self, answer):
        self.answer = answer
        self.seen = []

    def check(self, message):
        self.seen.append(message)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _checked(answer):
    config = v5.ClientConfiguration("a:1", v5.Credentials())
    checker = Answer(answer)
    msg = ProductMessage("orders", b"paid", tags="TagA", transaction_id="t1", check_times=2)
    return _CheckerListener(checker, config).check_local_transaction(msg), checker


@pytest.mark.parametrize(
    "answer, state",
    [
        (v5.TransactionResolution.COMMIT, LocalTransactionState.COMMIT_MESSAGE),
        (2, LocalTransactionState.ROLLBACK_MESSAGE),  # the real package's protobuf int
        (v5.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED, LocalTransactionState.UNKNOW),
        ("COMMIT", LocalTransactionState.UNKNOW),
    ],
)
def test_a_checkers_answer_is_the_products_state(answer, state):
    got, checker = _checked(answer)
    assert got is state
    [seen] = checker.seen
    assert (seen.topic, seen.body, seen.tag, seen.message_id, seen.delivery_attempt) == (
        "orders",
        b"paid",
        "TagA",
        "t1",
        2,
    )


def test_the_5x_send_leaves_the_transaction_to_commit_or_the_checker():
    config = v5.ClientConfiguration("a:1", v5.Credentials())
    listener = _CheckerListener(Answer(v5.TransactionResolution.COMMIT), config)
    assert listener.execute_local_transaction(None, None) is LocalTransactionState.UNKNOW


def test_a_5x_producer_refuses_sends_before_startup_and_transactions_without_a_checker():
    producer = v5.Producer(v5.ClientConfiguration("a:1", v5.Credentials()), ("orders",))
    msg = v5.Message()
    msg.topic, msg.body = "orders", b"x"
    with pytest.raises(IllegalStateError, match="startup"):
        producer.send(msg)
    with pytest.raises(IllegalStateError):
        producer.begin_transaction()
    transaction = v5.Transaction(producer)
    transaction.add_half_message(msg)
    with pytest.raises(ConfigError, match="must send half message at first"):
        transaction.commit()


class Listener(v5.MessageListener):
    def consume(self, message: v5.Message) -> v5.ConsumeResult:
        return v5.ConsumeResult.SUCCESS


def test_a_5x_push_consumer_orders_message_groups_with_no_flag_and_fifo_false_opts_out(
    monkeypatch,
):
    config = v5.ClientConfiguration("a:1", v5.Credentials())

    def consumer(**kwargs: object) -> v5.PushConsumer:
        return v5.PushConsumer(config, "g", Listener(), {"orders": None}, **kwargs)

    monkeypatch.delenv("RMQ_FIFO", raising=False)
    assert consumer().fifo is True  # as RocketMQ 5: the client needs no flag
    assert consumer(fifo=False).fifo is False
    monkeypatch.setenv("RMQ_FIFO", "false")  # the product's setting, env included
    assert consumer().fifo is False
    with pytest.raises(ConfigError, match="fifo"):
        consumer(fifo="maybe")


def test_per_topic_tag_filters_over_one_consumer():
    filters = TopicFilters()
    filters.add("a", "TagA")
    filters.add("b", "TagA")
    assert filters.common() == "TagA"  # the consumer filters by itself
    filters.add("b", "TagB || TagC")
    assert filters.common() is None  # every record comes; keeps() drops the rest
    assert filters.keeps("a", [(H.TAGS, b"TagA")])
    assert not filters.keeps("a", [(H.TAGS, b"TagB")])
    assert filters.keeps("b", [(H.TAGS, b"TagC")])
    assert filters.topics == ["a", "b"]


def test_a_2x_message_is_the_products_with_its_delay_level():
    msg = v2.Message("orders")
    msg.set_keys("XXX")
    msg.set_tags(b"TagA")
    msg.set_property("property", "test")
    msg.set_body("message body")
    msg.set_delay_time_level(3)
    sent = msg.product()
    assert (sent.topic, sent.value, sent.keys, sent.tags, sent.delay_time_level) == (
        "orders",
        b"message body",
        "XXX",
        "TagA",
        3,
    )
    assert sent.headers == [("property", b"test")]


def test_a_2x_received_message_gives_bytes_as_the_c_client_does():
    handle = v2.ReceivedMessage(
        Received(
            topic="orders",
            value=b"message body",
            headers=((H.TAGS, b"TagA"), (H.KEYS, b"XXX"), ("property", b"test")),
            msg_id="orders:1:5",
            queue_id=1,
            offset=5,
        )
    )
    assert (handle.tags, handle.keys, handle.body, handle.id) == (
        b"TagA",
        b"XXX",
        b"message body",
        "orders:1:5",
    )
    assert handle.get_property("property") == b"test" == handle["property"]
    assert handle.get_property(v2.MessageProperty.KEYS) == b"XXX"
    assert handle.get_property("absent") == b""
    assert (handle.queue_id, handle.queue_offset, str(handle)) == (1, 5, "message body")


@pytest.mark.parametrize(
    "answer, state",
    [
        (v2.TransactionStatus.COMMIT, LocalTransactionState.COMMIT_MESSAGE),
        (v2.TransactionStatus.ROLLBACK, LocalTransactionState.ROLLBACK_MESSAGE),
        (v2.TransactionStatus.UNKNOWN, LocalTransactionState.UNKNOW),
        (None, LocalTransactionState.UNKNOW),
        (7, LocalTransactionState.UNKNOW),
    ],
)
def test_a_2x_local_transaction_and_check_answer_the_products_state(answer, state):
    seen = []

    def local_execute(msg, user_args):
        seen.append((msg.body, user_args))
        return answer

    callbacks = _Callbacks(lambda msg: answer)
    msg = ProductMessage("orders", b"body", transaction_id="t1")
    assert callbacks.execute_local_transaction(msg, (local_execute, "args")) is state
    assert callbacks.check_local_transaction(msg) is state
    assert seen == [(b"body", "args")]


def test_what_the_2x_clients_refuse():
    with pytest.raises(ConfigError, match="CLUSTERING"):
        v2.PushConsumer("g", message_model=v2.MessageModel.BROADCASTING)
    producer = v2.Producer("g")
    with pytest.raises(ConfigError, match="set_name_server_address"):
        producer.set_name_server_domain("http://ns")
    with pytest.raises(ConfigError, match="set_name_server_address"):
        producer.start()
    with pytest.raises(IllegalStateError, match="start"):
        producer.send_sync(v2.Message("t"))
