"""What transaction listeners see, on the real broker: ``check_times`` and
``born_timestamp`` in ``check_local_transaction`` ("give up after N checks"), a str key
as bytes everywhere, and a promoted record whose timestamp is the birth time (CreateTime)
with ``rmq.promoted_at`` added."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionListener, TransactionProducer
from rmq_semantics.records.headers import H
from tests.integration.txn_helpers import FAST, ThreadCoordinator, read_to_end, wait_for

pytestmark = pytest.mark.integration

GIVE_UP_AFTER = 2  # commit on the second check (RocketMQ samples: "after N checks")


class CountingListener(TransactionListener):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executed: list[tuple[object, object]] = []
        self.checks: list[tuple[int | None, int | None, object]] = []

    def execute_local_transaction(self, msg, arg):
        with self.lock:
            self.executed.append((msg.key, type(msg.key)))
        return S.UNKNOW

    def check_local_transaction(self, msg):
        with self.lock:
            self.checks.append((msg.check_times, msg.born_timestamp, msg.key))
        return S.COMMIT_MESSAGE if msg.check_times >= GIVE_UP_AFTER else S.UNKNOW


def test_checks_see_their_count_and_birth_and_the_promoted_record_keeps_the_birth_time(
    broker, make_topic, unique
):
    prefix = unique("p").replace("-", "")
    topic = make_topic("born")
    listener = CountingListener()
    conf = broker.conf()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix),
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        producer.send_message_in_transaction(Message(topic, b"v", key="order-7"))
        [record] = wait_for(lambda: read_to_end(conf, topic, 1), 60, "the promotion")
    assert listener.executed == [(b"order-7", bytes)]  # one key type: bytes
    times = [c[0] for c in listener.checks]
    assert times == list(range(1, GIVE_UP_AFTER + 1)), listener.checks
    born = {c[1] for c in listener.checks}
    assert len(born) == 1 and {c[2] for c in listener.checks} == {b"order-7"}
    [born_ts] = born
    headers = dict(record.headers())
    assert record.timestamp() == (TIMESTAMP_CREATE_TIME, born_ts)  # birth time = CreateTime
    promoted_at = int(headers[H.PROMOTED_AT])
    assert promoted_at >= born_ts and H.PROMOTED_FROM in headers
    assert record.key() == b"order-7"
