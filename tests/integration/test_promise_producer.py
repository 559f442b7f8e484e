"""The producer side of the first promise (issue 29), through the public classes on a real
broker: only the group that wrote a half message decides it, a message the coordinator could
never promote is refused before its local transaction runs, and a porting user's listener is
called."""

from __future__ import annotations

import asyncio

import pytest

from rmq_semantics import AsyncTransactionProducer, Message, TransactionProducer
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
