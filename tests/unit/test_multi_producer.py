"""The producer side of multi-message transactions (issue 18), without a broker: the members'
headers, the bounds checked before anything is written, the listener's view, one end request
naming member 0, a ROLLBACK when a member is not written, and what a back-check hands over."""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError

from rmq_semantics import (
    ConfigError,
    LocalTransactionState,
    Message,
    ProducerSettings,
    SystemTopicError,
    Transaction,
    TransactionListener,
    TransactionSizeError,
)
from rmq_semantics.errors import KafkaOperationError
from rmq_semantics.multi import check_view, half_partition_for, member_headers, record_bytes
from rmq_semantics.records.codec import decode
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import CheckRequest, EndRequest, EndState
from rmq_semantics.settings import load
from tests.unit.test_edges import started_txn_producer

GROUP, BORN = b"pg", b"1700000000000"
HALF_PARTITIONS = 4


def _headers(headers) -> dict[str, bytes]:
    return dict(headers)


# -- the members' headers ------------------------------------------------------------------
def test_every_member_carries_the_size_and_its_index_after_the_half_headers():
    msgs = [
        Message("orders", b"a", key="k", headers={"app": "1"}, tags="T"),
        Message("lines", b"b", partition=2),
        Message("lines", b"c", keys="K1 K2"),
    ]
    members = member_headers(msgs, "tx", GROUP, BORN, max_messages=10, max_bytes=10_000)
    for index, (msg, headers) in enumerate(zip(msgs, members, strict=True)):
        assert headers[:-2] == half_headers(msg, "tx", GROUP, BORN)
        assert headers[-2:] == [(H.TXN_SIZE, b"3"), (H.TXN_INDEX, str(index).encode())]
    assert _headers(members[1])[H.REAL_PARTITION] == b"2"
    assert _headers(members[2])[H.REAL_TOPIC] == b"lines"


def test_a_transaction_of_one_is_todays_half_record():
    msg = Message("orders", b"a", key="k")
    assert member_headers([msg], "tx", GROUP, BORN, max_messages=10, max_bytes=10_000) == [
        half_headers(msg, "tx", GROUP, BORN)
    ]


def test_the_half_partition_comes_from_the_transaction_id():
    assert half_partition_for("abc", 8) == zlib.crc32(b"abc") % 8
    assert {half_partition_for(f"t{i}", 4) for i in range(100)} == {0, 1, 2, 3}


# -- bounds ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "msgs, bounds, message",
    [
        ([], {}, "no messages"),
        (
            [Message("t", b"v")] * 4,
            {"max_messages": 3},
            "4 messages, more than max_transaction_messages=3",
        ),
        ([Message("t", b"x" * 600)] * 2, {"max_bytes": 1000}, "more than max_transaction_bytes"),
    ],
)
def test_an_empty_or_oversized_transaction_is_refused(msgs, bounds, message):
    limits = {"max_messages": 1000, "max_bytes": 1 << 24, **bounds}
    with pytest.raises(TransactionSizeError, match=message):
        member_headers(msgs, "tx", GROUP, BORN, **limits)


def test_the_byte_bound_counts_keys_values_and_every_header_written():
    msgs = [Message("t", b"v" * 100, key="k" * 10, headers={"h": "x" * 50})] * 2
    members = member_headers(msgs, "tx", GROUP, BORN, max_messages=10, max_bytes=10_000)
    total = sum(record_bytes(m.key, m.value, h) for m, h in zip(msgs, members, strict=True))
    member_headers(msgs, "tx", GROUP, BORN, max_messages=10, max_bytes=total)
    with pytest.raises(TransactionSizeError, match=f"{total:,} bytes"):
        member_headers(msgs, "tx", GROUP, BORN, max_messages=10, max_bytes=total - 1)


def test_an_item_that_is_not_a_message_is_a_config_error():
    with pytest.raises(ConfigError, match=r"messages\[1\] is a str, not a Message"):
        member_headers(
            [Message("t", b"v"), "oops"], "tx", GROUP, BORN, max_messages=10, max_bytes=10_000
        )


def test_the_bounds_are_settings_from_kwargs_then_env_then_defaults():
    assert load(ProducerSettings, env={}) == ProducerSettings(1000, 16 * 1024 * 1024)
    s = load(
        ProducerSettings,
        {"max_transaction_bytes": 5000},
        env={"RMQ_MAX_TRANSACTION_MESSAGES": "20", "RMQ_MAX_TRANSACTION_BYTES": "9"},
    )
    assert (s.max_transaction_messages, s.max_transaction_bytes) == (20, 5000)
    with pytest.raises(ConfigError, match="at most 1000"):
        ProducerSettings(max_transaction_messages=1001)
    with pytest.raises(ConfigError, match="max_transaction_bytes must be a positive int, got 0"):
        ProducerSettings(max_transaction_bytes=0)


# -- send_transaction, with fakes ------------------------------------------------------------
class ViewListener(TransactionListener):
    def __init__(self, answer=LocalTransactionState.COMMIT_MESSAGE) -> None:
        self.answer = answer
        self.executed: list = []
        self.checked: list = []

    def execute_local_transaction(self, msg, arg):
        self.executed.append((msg, arg))
        return self.answer

    def check_local_transaction(self, msg):
        self.checked.append(msg)
        return LocalTransactionState.COMMIT_MESSAGE


class OffsetProducer:
    """A per-call producer that acknowledges every record at once at the next offset of its
    partition, failing the ``fail``-th record (0-based) it is given."""

    def __init__(self, fail: int | None = None) -> None:
        self.fail = fail
        self.records: list[SimpleNamespace] = []

    def produce(
        self, topic, value=None, *, key=None, headers=None, partition=-1, on_delivery=None
    ) -> None:
        offset = 100 + sum(1 for r in self.records if r.topic == topic)
        self.records.append(
            SimpleNamespace(topic=topic, value=value, key=key, headers=headers, partition=partition)
        )
        error = (
            KafkaError(KafkaError._MSG_TIMED_OUT) if len(self.records) - 1 == self.fail else None
        )
        on_delivery(
            error,
            SimpleNamespace(
                partition=lambda: partition, offset=lambda: offset, topic=lambda: topic
            ),
        )

    def poll(self, timeout=0) -> int:
        return 0

    def flush(self, timeout=0) -> int:
        return 0


def _producer(fail: int | None = None, **settings):
    producer, main, _ = started_txn_producer(
        {"orders": 2, "lines": 3, "__rmq_half": HALF_PARTITIONS}
    )
    listener = ViewListener()
    producer.listener = listener
    producer.settings = ProducerSettings(**settings)
    call = OffsetProducer(fail)
    producer._call.producer = call  # as CallProducer.get leaves it, without a broker
    return producer, main, call, listener


def _messages(n: int) -> list[Message]:
    return [
        Message(
            "orders" if i % 2 == 0 else "lines",
            f"m-{i}".encode(),
            key=f"k{i}",
            headers={"app": str(i)},
        )
        for i in range(n)
    ]


def test_one_transaction_is_its_members_in_one_partition_one_local_call_and_one_end():
    producer, main, call, listener = _producer()
    result = producer.send_transaction(_messages(10), arg="the-arg")
    halves = [r for r in call.records if r.topic == producer.topics.half]
    [end_record] = [r for r in call.records if r.topic == producer.topics.op]
    partition = zlib.crc32(result.transaction_id.encode()) % HALF_PARTITIONS
    assert {r.partition for r in halves} == {partition} and len(halves) == 10
    assert [_headers(r.headers)[H.TXN_INDEX] for r in halves] == [
        str(i).encode() for i in range(10)
    ]
    assert {_headers(r.headers)[H.TXN_ID] for r in halves} == {result.transaction_id.encode()}
    assert (result.half_partition, result.half_offset, result.message_count) == (partition, 100, 10)
    end = decode(end_record.value)
    assert isinstance(end, EndRequest) and end_record.partition == partition
    assert (end.txn_id, end.half_partition, end.half_offset, end.state, end.from_check) == (
        result.transaction_id,
        partition,
        100,
        EndState.COMMIT,
        False,
    )
    [(view, arg)] = listener.executed
    assert arg == "the-arg" and isinstance(view, Transaction)
    assert view.transaction_id == result.transaction_id and view.message_count == 10
    assert [m.value for m in view.messages] == [f"m-{i}".encode() for i in range(10)]
    assert {m.transaction_id for m in view.messages} == {result.transaction_id}
    # The first message's fields, for a listener written for one message.
    assert (view.topic, view.value, view.key, view.user_headers()) == (
        "orders",
        b"m-0",
        b"k0",
        [("app", b"0")],
    )
    assert main.produced == []


@pytest.mark.parametrize(
    "msgs, settings, error",
    [
        ([], {}, TransactionSizeError),
        (_messages(3), {"max_transaction_messages": 2}, TransactionSizeError),
        (_messages(3), {"max_transaction_bytes": 50}, TransactionSizeError),
        ([*_messages(2), Message("__rmq_op", b"v")], {}, SystemTopicError),
        ([*_messages(2), Message("orders", b"v", partition=5)], {}, ConfigError),
    ],
)
def test_a_bad_transaction_raises_before_anything_is_written(msgs, settings, error):
    producer, main, call, listener = _producer(**settings)
    with pytest.raises(error):
        producer.send_transaction(msgs)
    assert call.records == [] and main.produced == [] and listener.executed == []


def test_a_member_not_written_raises_rolls_back_and_never_runs_the_local_transaction():
    producer, _, call, listener = _producer(fail=3)
    with pytest.raises(KafkaOperationError, match=r"half message 3 of 5.*a ROLLBACK of txn"):
        producer.send_transaction(_messages(5))
    assert listener.executed == []
    [end_record] = [r for r in call.records if r.topic == producer.topics.op]
    end = decode(end_record.value)
    assert (end.state, end.half_offset, end.from_check) == (EndState.ROLLBACK, 100, False)


def test_the_one_message_path_is_unchanged_on_the_wire():
    producer, _, call, listener = _producer()
    result = producer.send_message_in_transaction(Message("orders", b"v"))
    [half] = [r for r in call.records if r.topic == producer.topics.half]
    assert H.TXN_SIZE not in _headers(half.headers) and H.TXN_INDEX not in _headers(half.headers)
    assert result.message_count == 1
    [(msg, _)] = listener.executed
    assert isinstance(msg, Message) and msg.transaction_id == result.transaction_id


# -- back-checks -----------------------------------------------------------------------------
def _check(headers) -> CheckRequest:
    return CheckRequest(
        "tx",
        "pg",
        1,
        100,
        2,
        1_700_000_000_000,
        "orders",
        None,
        b"k",
        b"m-0",
        headers,
        1_700_000_001_000,
    )


def test_a_check_of_a_transaction_of_several_hands_over_the_first_message_and_the_count():
    view = check_view(
        _check(
            [
                ("app", b"0"),
                (H.TXN_ID, b"tx"),
                (H.TAGS, b"T"),
                (H.TXN_SIZE, b"10"),
                (H.TXN_INDEX, b"0"),
            ]
        )
    )
    assert isinstance(view, Transaction)
    assert (view.transaction_id, view.message_count, view.check_times, view.born_timestamp) == (
        "tx",
        10,
        2,
        1_700_000_000_000,
    )
    [first] = view.messages
    assert (first.value, first.tags, first.user_headers(), first.transaction_id) == (
        b"m-0",
        "T",
        [("app", b"0")],
        "tx",
    )
    assert view.value == b"m-0"


@pytest.mark.parametrize("size", [None, b"1", b"x", b"\xc2\xb2"])
def test_a_check_of_a_transaction_of_one_hands_over_the_message_as_before(size):
    headers = [(H.TXN_ID, b"tx")] + ([] if size is None else [(H.TXN_SIZE, size)])
    msg = check_view(_check(headers))
    assert isinstance(msg, Message)
    assert (msg.value, msg.transaction_id, msg.check_times) == (b"m-0", "tx", 2)


def test_the_check_answer_names_member_0_and_the_listener_sees_the_count():
    producer, main, _, listener = _producer()
    sent = []
    main.produce = lambda topic, value, **kw: sent.append((topic, value, kw))
    check = _check([(H.TXN_SIZE, b"7"), (H.TXN_INDEX, b"0")])
    producer._reply_check(check, producer._checks._pool._ask(check))
    [view] = listener.checked
    assert isinstance(view, Transaction) and view.message_count == 7
    [(topic, value, kw)] = sent
    end = decode(value)
    assert topic == producer.topics.op and kw["partition"] == 1
    assert (end.half_offset, end.state, end.from_check, end.check_seq) == (
        100,
        EndState.COMMIT,
        True,
        2,
    )


def test_a_transaction_view_needs_a_message():
    with pytest.raises(ConfigError, match="at least one message"):
        Transaction("tx", (), 0)
