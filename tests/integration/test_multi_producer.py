"""The producer side of multi-message transactions on a real broker (issue 18): one
``send_transaction`` of 10 messages over 2 topics is 10 half records in one half partition,
with the members' headers, one local transaction and one end request naming member 0.
Promotion is the coordinator's (tests/integration/test_multi_txn.py)."""

from __future__ import annotations

import zlib

import pytest

from rmq_semantics import LocalTransactionState, Message, Transaction, TransactionProducer
from rmq_semantics.records.codec import decode
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import EndRequest, EndState
from tests.integration.txn_helpers import read_to_end
from tests.unit.test_multi_producer import ViewListener

pytestmark = pytest.mark.integration

HALF_PARTITIONS = 4


def test_a_transaction_of_ten_over_two_topics_is_ten_members_in_one_partition_and_one_end(
    broker, make_topic, unique
):
    prefix = unique("mp").replace("-", "")
    orders, lines = make_topic("orders", partitions=2), make_topic("lines", partitions=3)
    msgs = [
        Message(
            orders if i < 3 else lines,
            f"m-{i}".encode(),
            key=f"k{i}",
            headers={"app": str(i)},
            tags="T",
            partition=i % 2 if i < 3 else None,
        )
        for i in range(10)
    ]
    listener = ViewListener(LocalTransactionState.COMMIT_MESSAGE)
    conf = broker.conf()
    with TransactionProducer(
        conf,
        producer_group=unique("pg"),
        listener=listener,
        topic_prefix=prefix,
        half_partitions=HALF_PARTITIONS,
    ) as producer:
        result = producer.send_transaction(msgs)
        assert producer.flush(30) == 0
        half = read_to_end(conf, producer.topics.half, HALF_PARTITIONS)
        op = read_to_end(conf, producer.topics.op, HALF_PARTITIONS)

    [(view, _)] = listener.executed
    assert isinstance(view, Transaction) and view.message_count == 10
    assert [m.value for m in view.messages] == [m.value for m in msgs]
    partition = zlib.crc32(result.transaction_id.encode()) % HALF_PARTITIONS
    assert (result.half_partition, result.message_count) == (partition, 10)

    members = sorted(
        (r for r in half if dict(r.headers())[H.TXN_ID] == result.transaction_id.encode()),
        key=lambda r: r.offset(),
    )
    assert len(members) == 10 and {r.partition() for r in members} == {partition}
    assert members[0].offset() == result.half_offset
    for index, (record, msg) in enumerate(zip(members, msgs, strict=True)):
        headers = dict(record.headers())
        assert (record.key(), record.value(), headers["app"]) == (
            msg.key,
            msg.value,
            str(index).encode(),
        )
        assert headers[H.TXN_SIZE] == b"10" and headers[H.TXN_INDEX] == str(index).encode()
        assert headers[H.REAL_TOPIC] == msg.topic.encode() and headers[H.TAGS] == b"T"
        assert headers.get(H.REAL_PARTITION) == (
            None if msg.partition is None else str(msg.partition).encode()
        )

    ends = [(r.partition(), decode(r.value())) for r in op]
    ends = [
        (p, e) for p, e in ends if isinstance(e, EndRequest) and e.txn_id == result.transaction_id
    ]
    assert [(p, e.half_partition, e.half_offset, e.state, e.from_check) for p, e in ends] == [
        (partition, partition, result.half_offset, EndState.COMMIT, False)
    ]
