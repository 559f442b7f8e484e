"""``Message.message_group``: validated, and written as ``rmq.message_group`` by the plain
producer and on half records, where promotion keeps it and a back-check reads it back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rmq_semantics import ConfigError, Message, Producer
from rmq_semantics.records.half import half_headers, parse_half
from rmq_semantics.records.headers import PROMOTED_KEEPS, H
from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.selector import java_partition

NOWHERE = {"bootstrap.servers": "127.0.0.1:1"}
T = 1_700_000_000_000


class DeliveringProducer:
    """Stands in for confluent_kafka.Producer: records each produce, delivers at once."""

    def __init__(self) -> None:
        self.produced: list[dict] = []

    def produce(self, topic, value, **kwargs) -> None:
        self.produced.append({"topic": topic, "value": value, **kwargs})
        kwargs["on_delivery"](None, SimpleNamespace(partition=lambda: 1, offset=lambda: 42))

    def poll(self, timeout=0) -> int:
        return 0


@pytest.mark.parametrize("bad", ["", b"g", 7])
def test_a_message_group_must_be_a_non_empty_str(bad):
    with pytest.raises(ConfigError, match="message_group"):
        Message("orders", b"v", message_group=bad)


class FourPartitions:
    """Stands in for the producer's partition cache: every topic has partitions 0..3."""

    def partitions(self, topic, timeout) -> list[int]:
        return [0, 1, 2, 3]


def test_send_writes_the_message_group_header_beside_tags_and_keys():
    producer = Producer(NOWHERE)
    real, fake = producer._producer, DeliveringProducer()
    producer._producer = fake
    producer._partitions = FourPartitions()  # the group places the record: metadata read
    try:
        result = producer.send(
            Message(
                "orders",
                b"v",
                key=b"k",
                headers={"app": "1"},
                tags="A",
                keys="K1",
                message_group="customer-7",
            )
        )
        producer.send(Message("orders", b"w"))
    finally:
        producer._producer = real
        producer.close(timeout=0)
    assert (result.partition, result.offset) == (1, 42)
    assert fake.produced[0]["headers"] == [
        ("app", b"1"),
        (H.TAGS, b"A"),
        (H.KEYS, b"K1"),
        (H.MESSAGE_GROUP, b"customer-7"),
    ]
    assert fake.produced[1]["headers"] == []
    # Placed by its group, not by its key (murmur2, as Java's partitioner); no group: by key.
    assert fake.produced[0]["partition"] == java_partition(b"customer-7", 4)
    assert "partition" not in fake.produced[1]


def test_a_half_record_carries_the_group_and_promotion_keeps_it():
    msg = Message("orders", b"v", key=b"k", message_group="customer-7")
    headers = half_headers(msg, "txn-1", b"pg", str(T).encode())
    assert (H.MESSAGE_GROUP, b"customer-7") in headers
    half = parse_half(0, 5, T, msg.key, msg.value, headers)
    assert H.MESSAGE_GROUP in PROMOTED_KEEPS
    assert (H.MESSAGE_GROUP, b"customer-7") in half.promoted_headers()
    assert CheckRequest.of_half(half, 1, T).header_text(H.MESSAGE_GROUP) == "customer-7"
