"""The drop-ins without a broker: truthiness, refusals and listener resolution happen
before any network call."""

from __future__ import annotations

import pytest

from rmq_semantics import Producer
from rmq_semantics.errors import ConfigError, SystemTopicError
from rmq_semantics.orderly import MessageListenerOrderly, OrderlyConsumer
from rmq_semantics.push import MessageListenerConcurrently, PushConsumer

CONF = {"bootstrap.servers": "127.0.0.1:1"}  # never contacted: nothing here needs a broker


@pytest.fixture
def producer():
    p = Producer(CONF)
    yield p
    p.close(0)


def test_an_idle_producer_is_truthy_as_confluent_kafkas_is(producer, monkeypatch):
    # librdkafka's queue length counts its connection-error events too: stub an idle one.
    monkeypatch.setattr(producer, "_producer", type("Idle", (), {"__len__": lambda s: 0})())
    assert len(producer) == 0
    assert bool(producer) is True


def test_produce_batch_refuses_a_system_topic_and_malformed_batches(producer):
    with pytest.raises(SystemTopicError):
        producer.produce_batch("__rmq_half", [{"value": b"x"}])
    with pytest.raises(TypeError, match="list"):
        producer.produce_batch("t", ({"value": b"x"},))
    with pytest.raises(TypeError, match="index 1"):
        producer.produce_batch("t", [{"value": b"x"}, "not a dict"])
    assert producer.produce_batch("t", []) == 0


def test_produce_keeps_headers_outside_the_reserved_namespace(producer):
    producer.produce("t", b"x", headers={"rmq": b"not ours", "app.rmq.x": b"y"})
    producer.produce("t", b"x", headers=None)
    producer.produce("t", b"x", None, -1, None, None, 0, [("rmq-ish", b"z")])


def test_a_listener_without_any_consume_method_is_refused_at_construction():
    class NoOrderly(MessageListenerOrderly):
        pass

    class NoConcurrently(MessageListenerConcurrently):
        pass

    conf = {**CONF, "group.id": "g"}
    for make, listener in (
        (OrderlyConsumer, NoOrderly()),
        (PushConsumer, NoConcurrently()),
        (OrderlyConsumer, object()),
        (PushConsumer, object()),
    ):
        with pytest.raises(ConfigError, match=r"consume_message.*consumeMessage"):
            make(conf, listener=listener)
