"""RocketMQ parity without a broker: DLQ/retry topics readable by name only, the Spark
job's tags, the dlq tool's input and headers, and the tag filter on both consumers."""

from __future__ import annotations

import pytest

from rmq_semantics import Consumer, Message, SystemTopicError
from rmq_semantics.errors import ConfigError
from rmq_semantics.orderly import OrderlyConsumer
from rmq_semantics.records.headers import H
from rmq_semantics.tools.dlq import STRIPPED, parse_position
from rmq_semantics.topics import is_readable_system_topic, refuse_system_topics
from spark.settings import JobSettings
from spark.subscription import guard_subscription


@pytest.mark.parametrize(
    "topic",
    ["__rmq_dlq_billing", "app_dlq_billing", "__rmq_retry_billing_3", "app_retry_billing_1"],
)
def test_a_dlq_or_retry_topic_named_explicitly_is_allowed(topic):
    assert is_readable_system_topic(topic, "app")
    refuse_system_topics([topic], "app")
    guard_subscription(topic, "app")


@pytest.mark.parametrize("topic", ["__rmq_half", "app_op", "app_lock", "app_check", "app_discard"])
def test_other_system_topics_stay_refused(topic):
    assert not is_readable_system_topic(topic, "app")
    with pytest.raises(SystemTopicError, match="DLQ or retry topics named explicitly"):
        refuse_system_topics([topic], "app")


def test_a_pattern_matching_the_dlq_is_refused_by_the_spark_job():
    with pytest.raises(SystemTopicError):
        guard_subscription("^.*", "app")


def test_spark_tags_are_parsed_once_and_a_bad_expression_is_one_error():
    settings = JobSettings(
        bootstrap_servers="b:9092", topics="orders", output="/tmp/o", tags="TagB || TagA"
    )
    assert settings.tag_values == ("TagA", "TagB")
    assert (
        JobSettings(bootstrap_servers="b:9092", topics="orders", output="/tmp/o").tag_values is None
    )
    with pytest.raises(ConfigError, match="separated by"):
        JobSettings(bootstrap_servers="b:9092", topics="orders", output="/tmp/o", tags="TagA ||")


def test_dlq_positions_and_the_headers_a_redrive_strips():
    assert parse_position("7") == (0, 7) and parse_position("2:9") == (2, 9)
    with pytest.raises(ConfigError, match="want N or PARTITION:N"):
        parse_position("x")
    assert {H.DLQ_ORIGINAL_TOPIC, H.DLQ_EXCEPTION, H.RECONSUME_TIMES} <= STRIPPED
    assert H.TAGS not in STRIPPED and H.TXN_ID not in STRIPPED


def test_a_malformed_tag_expression_is_refused_by_both_consumers_before_subscribing():
    consumer = Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"})
    try:
        with pytest.raises(ConfigError, match="tags"):
            consumer.subscribe(["orders"], tags="||")
    finally:
        consumer.close()
    orderly = OrderlyConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, listener=lambda msgs, ctx: None
    )
    with pytest.raises(ConfigError, match="tags"):
        orderly.subscribe(["orders"], tags="TagA || *")
    orderly.subscribe(["orders", "__rmq_dlq_g"], tags="TagA")
    orderly.shutdown()


def test_a_str_key_is_bytes_once_the_message_is_built():
    assert Message("orders", b"v", key="order-7").key == b"order-7"
    assert Message("orders", b"v").check_times is None
