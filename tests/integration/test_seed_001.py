"""Seed 001's orderly sample (RocketMQ's ``MessageListenerOrderly`` with
``context.setAutoCommit(false)`` and a SUCCESS/ROLLBACK/COMMIT/SUSPEND rotation), ported
line for line, on the real broker; every listener call is checked against a small model of
RocketMQ's ``ProcessQueue`` (``msgTreeMap`` + ``consumingMsgOrderlyTreeMap``).

The sample as written never returns COMMIT: every ``consumeTimes`` divisible by 4 is even
and already returned SUCCESS. In RocketMQ it therefore rolls back to the first message for
ever and commits nothing; the first test shows we do the same. The second test reorders the
rotation so COMMIT is reachable and shows every message finally consumed once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from rmq_semantics import Message, Producer
from rmq_semantics.orderly import ConsumeOrderlyStatus, MessageListenerOrderly
from tests.integration.test_orderly import committed, start_consumer, wait_for
from tests.integration.test_orderly_keys import lock_service_of

pytestmark = pytest.mark.integration

S = ConsumeOrderlyStatus
MESSAGES = 10


@pytest.fixture
def locks(broker, unique):
    with lock_service_of(broker, unique) as runner:
        yield runner


@dataclass
class ProcessQueueModel:
    """RocketMQ's ProcessQueue under ``autoCommit=false``, batch size 1: ``tree`` = not yet
    taken, ``consuming`` = taken and not committed; ``committed`` = the offset store's."""

    tree: list[int]
    consuming: list[int] = field(default_factory=list)
    committed: int | None = None
    consumed: list[int] = field(default_factory=list)  # deliveries not rolled back

    def next_batch(self) -> list[int]:
        return self.tree[:1]

    def settle(self, batch: list[int], status: ConsumeOrderlyStatus) -> None:
        del self.tree[: len(batch)]
        if status is S.SUSPEND_CURRENT_QUEUE_A_MOMENT:  # makeMessageToConsumeAgain
            self.tree[:0] = batch
            return
        if status is S.ROLLBACK:  # rollback(): everything since the last commit again
            self.tree[:0] = self.consuming + batch
            del self.consumed[len(self.consumed) - len(self.consuming) :]
            self.consuming = []
            return
        self.consuming += batch
        self.consumed += batch
        if status is S.COMMIT:  # commit(): the offset after the last consuming message
            self.committed = self.consuming[-1] + 1
            self.consuming = []


class Journal:
    """(batch offsets, status returned) of every listener call, in call order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[list[int], ConsumeOrderlyStatus]] = []

    def record(self, msgs, status: ConsumeOrderlyStatus) -> ConsumeOrderlyStatus:
        with self.lock:
            self.calls.append(([m.offset for m in msgs], status))
        return status

    def snapshot(self) -> list[tuple[list[int], ConsumeOrderlyStatus]]:
        with self.lock:
            return list(self.calls)


def replay(calls, first: int, count: int) -> ProcessQueueModel:
    """Feed the observed calls to the model; each batch must be the one it predicts."""
    model = ProcessQueueModel(list(range(first, first + count)))
    for i, (batch, status) in enumerate(calls):
        assert batch == model.next_batch(), (i, batch, model, calls)
        model.settle(batch, status)
    return model


def send_orders(broker, topic: str) -> int:
    """The seed's producer side: a MessageQueueSelector object picking ``id % size``."""

    class ByOrderId:  # new MessageQueueSelector() { public MessageQueue select(...) }
        def select(self, mqs, msg, arg):
            id = arg
            index = id % len(mqs)
            return mqs[index]

    with Producer(broker.conf()) as producer:
        offsets = [
            producer.send(Message(topic, f"order-{i}".encode()), ByOrderId(), i * 1).offset
            for i in range(MESSAGES)
        ]
    return offsets[0]


class SeedListener(MessageListenerOrderly):
    """Seed 001's listener, line for line (``AtomicLong`` -> a lock and an int)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._lock = threading.Lock()
        self.consume_times = 0

    def increment_and_get(self) -> int:
        with self._lock:
            self.consume_times += 1
            return self.consume_times

    def consume_message(self, msgs, context):
        context.setAutoCommit(False)
        print(f"{threading.current_thread().name} Receive New Messages: {msgs}")
        consume_times = self.increment_and_get()
        if (consume_times % 2) == 0:
            return self.journal.record(msgs, S.SUCCESS)
        elif (consume_times % 3) == 0:
            return self.journal.record(msgs, S.ROLLBACK)
        elif (consume_times % 4) == 0:
            return self.journal.record(msgs, S.COMMIT)
        elif (consume_times % 5) == 0:
            context.setSuspendCurrentQueueTimeMillis(3000)
            return self.journal.record(msgs, S.SUSPEND_CURRENT_QUEUE_A_MOMENT)

        return self.journal.record(msgs, S.SUCCESS)


class CommittingListener(SeedListener):
    """The same rotation with COMMIT reachable (tested before SUCCESS) and short delays."""

    def consume_message(self, msgs, context):
        context.setAutoCommit(False)
        context.suspend_ms = 50  # ROLLBACK and SUSPEND wait this long before re-delivery
        consume_times = self.increment_and_get()
        if (consume_times % 4) == 0:
            return self.journal.record(msgs, S.COMMIT)
        elif (consume_times % 3) == 0:
            return self.journal.record(msgs, S.ROLLBACK)
        elif (consume_times % 5) == 0:
            return self.journal.record(msgs, S.SUSPEND_CURRENT_QUEUE_A_MOMENT)
        return self.journal.record(msgs, S.SUCCESS)


# Calls 1..27 of the literal sample: rollbacks at 3, 9, 15, 21, 27, suspends at 5 and 25.
LITERAL_CALLS = 27


def test_seed_001_as_written_rolls_back_for_ever_and_commits_nothing(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("seed001"), unique("g")
    first = send_orders(broker, topic)
    journal = Journal()
    consumer = start_consumer(
        broker, group, topic, service.prefix, SeedListener(journal), "seed001"
    )
    try:
        wait_for(
            lambda: len(journal.snapshot()) >= LITERAL_CALLS, 120, f"{LITERAL_CALLS} listener calls"
        )
    finally:
        consumer.shutdown()
    calls = journal.snapshot()[:LITERAL_CALLS]
    model = replay(calls, first, MESSAGES)
    assert [status for _, status in calls].count(S.ROLLBACK) == 5
    assert S.COMMIT not in [status for _, status in calls]
    # The first rollback goes back to the first message; none ever gets past the sixth.
    assert calls[3][0] == [first]
    assert max(b[0] for b, _ in calls) <= first + 5
    assert model.committed is None
    assert committed(broker, group, topic, 1)[0] < 0  # the group never committed


def test_seed_001_with_commit_reachable_consumes_every_message_once_in_order(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("seed001c"), unique("g")
    first = send_orders(broker, topic)
    journal = Journal()

    def model_done() -> ProcessQueueModel | None:
        model = replay(journal.snapshot(), first, MESSAGES)
        return model if not model.tree else None

    consumer = start_consumer(
        broker, group, topic, service.prefix, CommittingListener(journal), "seed001c"
    )
    try:
        model = wait_for(model_done, 120, "every message delivered and not rolled back")
        expected = model.committed
        assert expected is not None and expected > first
        wait_for(
            lambda: committed(broker, group, topic, 1)[0] == expected,
            60,
            f"the group's commit at {expected}, after the last COMMIT",
        )
    finally:
        consumer.shutdown()
    calls = journal.snapshot()
    model = replay(calls, first, MESSAGES)
    statuses = [status for _, status in calls]
    assert {S.SUCCESS, S.COMMIT, S.ROLLBACK, S.SUSPEND_CURRENT_QUEUE_A_MOMENT} <= set(statuses)
    assert model.consumed == list(range(first, first + MESSAGES))  # each once, in order
    # SUCCESS after the last COMMIT is not committed: RocketMQ's offset stays there too.
    assert committed(broker, group, topic, 1)[0] == model.committed
