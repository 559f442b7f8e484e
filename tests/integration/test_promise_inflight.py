"""A check that reaches the producer before its caller learned the half write's outcome
(issue 29), through the public classes on a real broker: the producer answers it UNKNOW
itself, never asking a listener that answers COMMIT for ids it never saw (the seeds'
sample), so the local transaction's own answer decides."""

from __future__ import annotations

import asyncio

import pytest

from rmq_semantics import AsyncTransactionProducer, Message
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


def _promotions(coordinator: ThreadCoordinator) -> float:
    return coordinator.server.metrics.registry.get_sample_value("rmq_promotions_total") or 0.0


def test_a_check_before_the_caller_saw_the_half_land_is_answered_unknow_not_asked(
    broker, make_topic, unique
):
    """An asyncio application's loop stalls right after the half write (a blocking call in
    a coroutine): the half lands, the coordinator checks it while the delivery report waits
    for the loop. The producer answers that check UNKNOW without asking the listener; once
    the loop runs again the local transaction rolls back and nothing of it is promoted."""
    prefix = unique("f").replace("-", "")
    topic = make_topic("inflight")
    conf = broker.conf()
    listener = ScriptedListener(
        lambda v: S.COMMIT_MESSAGE if v == b"warm-up" else S.ROLLBACK_MESSAGE,
        lambda v: S.COMMIT_MESSAGE,
    )

    async def main(coordinator: ThreadCoordinator) -> S:
        async with AsyncTransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
            check_partitions=FAST["check_partitions"],
        ) as producer:
            # Caches the topic's metadata: the next send reaches its half write on the loop.
            await producer.send_message_in_transaction(Message(topic, b"warm-up"))
            wait_for(lambda: _promotions(coordinator) == 1, 60, "the warm-up's promotion")
            send = asyncio.ensure_future(
                producer.send_message_in_transaction(Message(topic, b"stalled"))
            )
            await asyncio.sleep(0)  # the send runs up to awaiting its delivery report
            # The loop stalls (this call blocks it) until the producer answered a check.
            wait_for(lambda: producer.checks_answered >= 1, 60, "a check of the stalled half")
            return (await send).local_transaction_state

    with ThreadCoordinator(conf, topic_prefix=prefix) as coordinator:
        state = asyncio.run(main(coordinator))
        wait_for(
            lambda: no_pending(coordinator, FAST["half_partitions"]),
            60,
            "the stalled transaction's end",
        )
    assert state is S.ROLLBACK_MESSAGE and listener.executed == [b"warm-up", b"stalled"]
    assert listener.checked == []
    assert [m.value() for m in read_to_end(conf, topic, 1)] == [b"warm-up"]
