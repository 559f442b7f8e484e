"""The producer side of the first promise (issue 29), through the public classes on a real
broker: only the group that wrote a half message decides it, a message the coordinator could
never promote is refused before its local transaction runs, and a porting user's listener is
called."""

from __future__ import annotations

import asyncio

import pytest

from rmq_semantics import (
    AsyncTransactionProducer,
    Message,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics import LocalTransactionState as S
from tests.integration.txn_helpers import (
    FAST,
    ScriptedListener,
    ThreadCoordinator,
    no_pending,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration


def _sample(coordinator: ThreadCoordinator, name: str, **labels: str) -> float:
    return coordinator.server.metrics.registry.get_sample_value(name, labels) or 0.0


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
    with ThreadCoordinator(conf, topic_prefix=prefix, transaction_timeout_ms=8000) as c, \
            TransactionProducer(conf, producer_group=unique("ga"), listener=ga_listener,
                                **options) as ga, \
            TransactionProducer(conf, producer_group=unique("gb"), listener=gb_listener,
                                **options) as gb:
        first = ga.send_message_in_transaction(Message(topic, b"ga-1"))
        second = ga.send_message_in_transaction(Message(topic, b"ga-2"))
        gb.end_transaction(first, S.COMMIT_MESSAGE)

        async def from_async_gb() -> None:
            async with AsyncTransactionProducer(conf, producer_group=gb.producer_group,
                                                listener=gb_listener, **options) as agb:
                await agb.end_transaction(second, S.COMMIT_MESSAGE)

        asyncio.run(from_async_gb())
        wait_for(lambda: _sample(c, "rmq_rejected_requests_total", reason="mismatch") == 2,
                 60, "both of gb's requests to be rejected")
        wait_for(lambda: no_pending(c, FAST["half_partitions"]), 60, "ga's checks to decide")
        assert _sample(c, "rmq_promotions_total") == 0
    assert sorted(ga_listener.checked) == [b"ga-1", b"ga-2"]
    rejected = [r.getMessage() for r in caplog.records if "does not match" in r.getMessage()]
    assert {first.transaction_id, second.transaction_id} == {
        t for t in (first.transaction_id, second.transaction_id) for m in rejected if t in m}
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
        async with AsyncTransactionProducer(conf, producer_group=unique("aj"),
                                            listener=async_listener, **options) as producer:
            result = await producer.send_message_in_transaction(Message(topic, b"commit-aio"))
            return result.local_transaction_state

    with ThreadCoordinator(conf, topic_prefix=prefix) as c, TransactionProducer(
            conf, producer_group=unique("j"), listener=listener, **options) as producer:
        inline = producer.send_message_in_transaction(Message(topic, b"commit-inline"))
        checked = producer.send_message_in_transaction(Message(topic, b"checked"))
        assert (inline.local_transaction_state, checked.local_transaction_state) == (
            S.COMMIT_MESSAGE, S.UNKNOW)
        assert asyncio.run(send_async()) is S.COMMIT_MESSAGE
        wait_for(lambda: _sample(c, "rmq_promotions_total") == 3, 60, "three promotions")
    assert listener.executed == [b"commit-inline", b"checked"]
    assert listener.checked == [b"checked"] and async_listener.executed == [b"commit-aio"]
    assert sorted(m.value() for m in read_to_end(conf, topic, 1)) == [
        b"checked", b"commit-aio", b"commit-inline"]
