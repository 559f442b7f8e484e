"""Queue selection: murmur2 matches Java's, selectors are checked, send() validates."""

from __future__ import annotations

import pytest

from rmq_semantics import ConfigError, Message, Producer, SelectorError
from rmq_semantics.selector import (
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
    apply_selector,
    java_partition,
    murmur2,
    placement,
    placement_reads_partitions,
)

# Apache Kafka's UtilsTest.testMurmur2 vectors (Java's signed int results).
KAFKA_UTILS_TEST = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}
# librdkafka's rdmurmur2.c unit test (unsigned there), one per remainder length.
LIBRDKAFKA = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"34": 0x873930DA,
    b"4": 0x5A4B5CA1,
    b"PreAmbleWillBeRemoved,ThePrePartThatIs": 0x78424F1C,
    b"reAmbleWillBeRemoved,ThePrePartThatIs": 0x4A62B377,
    b"eAmbleWillBeRemoved,ThePrePartThatIs": 0xE0E4E09E,
    b"AmbleWillBeRemoved,ThePrePartThatIs": 0x62B8B43F,
    b"": 0x106E08D9,
}


@pytest.mark.parametrize("data, expected", sorted(KAFKA_UTILS_TEST.items()))
def test_murmur2_matches_kafkas_java_vectors(data, expected):
    assert murmur2(data) == expected


@pytest.mark.parametrize("data, expected", sorted(LIBRDKAFKA.items()))
def test_murmur2_matches_librdkafkas_vectors(data, expected):
    assert murmur2(data) & 0xFFFFFFFF == expected


def test_java_partition_masks_the_sign_bit_like_the_java_client():
    # Utils.toPositive(murmur2("foobar")) % 50, as Kafka's default partitioner computes it.
    assert java_partition(b"foobar", 50) == (-790332482 & 0x7FFFFFFF) % 50 == 16
    assert all(0 <= java_partition(k, 7) < 7 for k in KAFKA_UTILS_TEST)


def test_select_by_hash_is_stable_and_in_range():
    partitions = list(range(6))
    by_hash = SelectMessageQueueByHash()
    chosen = {by_hash(partitions, None, order_id) for order_id in range(100)}
    assert chosen <= set(partitions) and len(chosen) > 1
    assert (
        by_hash(partitions, None, 42)
        == by_hash.select(partitions, None, 42)
        == java_partition(b"42", 6)
    )


@pytest.mark.parametrize(
    "selector",
    [
        SelectMessageQueueByHash(),
        SelectMessageQueueByHash().select,
        SelectMessageQueueByHash,
        lambda mqs, msg, arg: SelectMessageQueueByHash()(mqs, msg, arg),
    ],
)
def test_a_selector_instance_its_select_the_bare_class_and_a_function_agree(selector):
    assert apply_selector(selector, [0, 1, 2, 3], None, 42) == java_partition(b"42", 4)


def test_an_object_with_only_select_is_a_selector():
    class ByOrderId:  # RocketMQ's MessageQueueSelector interface
        def select(self, mqs, msg, arg):
            return mqs[arg % len(mqs)]

    assert [apply_selector(ByOrderId(), [0, 1, 2], None, i) for i in range(4)] == [0, 1, 2, 0]


def test_select_by_random_stays_in_range_and_spreads():
    by_random = SelectMessageQueueByRandom()
    chosen = {apply_selector(by_random, [0, 1, 2], None, None) for _ in range(200)}
    assert chosen == {0, 1, 2}


def test_a_selector_class_that_needs_arguments_or_a_non_callable_is_one_clear_error():
    class NeedsArgs:
        def __init__(self, n):
            self.n = n

        def select(self, mqs, msg, arg):
            return mqs[0]

    with pytest.raises(SelectorError, match="NeedsArgs needs arguments"):
        apply_selector(NeedsArgs, [0], None, None)
    with pytest.raises(SelectorError, match="must be callable"):
        apply_selector(42, [0], None, None)


def test_selector_result_may_be_a_queue_object_with_a_partition():
    class Queue:
        partition = 2

    assert apply_selector(lambda mqs, msg, arg: Queue(), [0, 1, 2], None, None) == 2


@pytest.mark.parametrize("returned", [3, -1, None, "1", True, 1.0])
def test_selector_naming_a_partition_the_topic_lacks_raises(returned):
    msg = Message("orders", b"v")
    with pytest.raises(SelectorError, match="orders"):
        apply_selector(lambda mqs, m, arg: returned, [0, 1, 2], msg, None)


def test_rocketmq_style_modulo_selector():
    def by_order_id(mqs, msg, arg):
        return mqs[arg % len(mqs)]

    assert [apply_selector(by_order_id, [0, 1, 2, 3], None, i) for i in range(6)] == [
        0,
        1,
        2,
        3,
        0,
        1,
    ]


def test_send_with_an_out_of_range_selector_raises_selector_error(monkeypatch):
    producer = Producer({"bootstrap.servers": "127.0.0.1:1"})
    # The topic's partitions, as metadata would say (no broker needed).
    monkeypatch.setattr(producer, "partitions_for", lambda topic, timeout=None: [0, 1])
    try:
        with pytest.raises(SelectorError):
            producer.send(Message("orders", b"v"), selector=lambda mqs, m, arg: 5)
        with pytest.raises(ConfigError, match="not both"):
            producer.send(Message("orders", b"v"), selector=lambda *a: 0, sharding_key="k")
    finally:
        producer.close(timeout=0)


def test_placement_precedence_selector_sharding_key_partition_group_then_key():
    """One rule for Producer.send and the TransactionProducer: the first that applies."""
    reads: list[str] = []

    def four() -> list[int]:
        reads.append("metadata")
        return [0, 1, 2, 3]

    grouped = Message("t", b"v", key="line-1", message_group="order-7")
    pinned = Message("t", b"v", key="line-1", message_group="order-7", partition=3)
    plain = Message("t", b"v", key="line-1")
    group_p = java_partition(b"order-7", 4)
    assert placement(grouped, None, None, None, four) == group_p
    assert placement(grouped, lambda ps, m, a: ps[0], None, None, four) == 0
    assert placement(grouped, None, None, "c-1", four) == java_partition(b"c-1", 4)
    reads.clear()
    assert placement(pinned, None, None, None, four) == 3
    assert placement(plain, None, None, None, four) is None
    assert reads == []  # no metadata read when nothing needs it
    assert placement_reads_partitions(grouped, None, None)
    assert not placement_reads_partitions(pinned, None, None)
    assert not placement_reads_partitions(plain, None, None)
    assert placement_reads_partitions(plain, None, b"k")
