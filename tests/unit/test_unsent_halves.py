"""A check of a transaction whose half write the producer has not seen land (issue 29),
without a broker: while the half write is in flight (queued, its caller has no delivery
report yet) the producer that sent it answers UNKNOW, once the write was reported failed
ROLLBACK, in both cases without asking the listener (the seeds' sample listener answers
COMMIT for ids it never saw). A multi-message transaction whose first member was not
written is rolled back by its id. The check path is fed directly: the producer's check
pool asks exactly this function."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError

from rmq_semantics import (
    AsyncTransactionProducer,
    Message,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics import LocalTransactionState as S
from rmq_semantics.errors import KafkaOperationError, RmqError
from rmq_semantics.producer import PartitionCache
from rmq_semantics.records.codec import decode
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import CheckRequest, EndRequest, EndRequests, EndState
from rmq_semantics.unsent import FAILED_KEEP_S, FAILED_MAX, UnsentHalves
from tests.unit.test_edges import NOWHERE, FakeMetadataClient, RecordingProducer
from tests.unit.test_multi_producer import OffsetProducer, _messages, _producer

COUNTS = {"orders": 2, "lines": 3, "__rmq_half": 4}
TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT)


class CommitsAnything(TransactionListener):
    """The seeds' sample listener: COMMIT for every check, ids it never saw included."""

    def __init__(self) -> None:
        self.executed: list[bytes] = []
        self.checked: list[str] = []

    def execute_local_transaction(self, msg, arg):
        self.executed.append(msg.value)
        return S.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        self.checked.append(msg.transaction_id)
        return S.COMMIT_MESSAGE


class WithheldReports:
    """A producer that queues every record and reports it only when the test says so."""

    def __init__(self) -> None:
        self.records: list[SimpleNamespace] = []
        self.queued = threading.Event()
        self.polls = 0

    def produce(
        self, topic, value=None, *, key=None, headers=None, partition=-1, on_delivery=None
    ) -> None:
        self.records.append(
            SimpleNamespace(
                topic=topic,
                value=value,
                headers=headers,
                partition=partition,
                on_delivery=on_delivery,
                reported=False,
            )
        )
        self.queued.set()

    def report(
        self,
        record: SimpleNamespace,
        error: KafkaError | None = None,
        partition: int = 1,
        offset: int = 100,
    ) -> None:
        record.reported = True
        record.on_delivery(
            error,
            SimpleNamespace(
                partition=lambda: partition, offset=lambda: offset, topic=lambda: record.topic
            ),
        )

    def halves(self) -> list[SimpleNamespace]:
        return [r for r in self.records if r.topic == "__rmq_half"]

    def poll(self, timeout=0) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout=0) -> int:
        return 0


def _txn_id(record: SimpleNamespace) -> str:
    return dict(record.headers)[H.TXN_ID].decode()


def _check(txn_id: str, seq: int = 1) -> CheckRequest:
    return CheckRequest(
        txn_id,
        "pg",
        1,
        100,
        seq,
        1_700_000_000_000,
        "orders",
        None,
        b"k",
        b"v",
        [(H.TXN_ID, txn_id.encode())],
        1_700_000_001_000,
    )


def _started(listener: TransactionListener, call) -> TransactionProducer:
    producer = TransactionProducer(
        NOWHERE, producer_group="pg", listener=listener, send_timeout_s=5
    )
    producer._producer = RecordingProducer()
    producer._partitions = PartitionCache(FakeMetadataClient(COUNTS))
    producer._started = True
    producer._call.producer = call  # as CallProducer.get leaves it, without a broker
    return _sized(producer)


def _sized(producer: TransactionProducer) -> TransactionProducer:
    """No size check of the test's topics (their config cannot be described here)."""
    checks = producer.send_checks()
    checks._max_bytes.update({t: (time.monotonic(), None) for t in COUNTS})
    return producer


def _ask(producer, txn_id: str, seq: int = 1) -> S:
    """What the producer's check pool would reply to a check of ``txn_id``."""
    return producer._checks._pool._ask(_check(txn_id, seq))


def test_a_check_of_a_half_in_flight_is_unknow_and_of_one_reported_failed_rollback():
    listener, call = CommitsAnything(), WithheldReports()
    producer = _started(listener, call)
    outcome: dict[str, BaseException] = {}

    def send() -> None:
        try:
            producer.send_message_in_transaction(Message("orders", b"v"))
        except RmqError as exc:
            outcome["error"] = exc

    sender = threading.Thread(target=send)
    sender.start()
    try:
        assert call.queued.wait(5)
        [half] = call.halves()
        txn_id = _txn_id(half)
        assert _ask(producer, txn_id) is S.UNKNOW  # queued, no delivery report yet
    finally:
        call.report(call.halves()[0], TIMED_OUT)
        sender.join(10)
    assert "a ROLLBACK of txn" in str(outcome["error"])
    assert _ask(producer, txn_id, 2) is S.ROLLBACK_MESSAGE  # reported failed to the caller
    assert listener.checked == [] and listener.executed == []


def test_a_batchs_checks_are_unknow_in_flight_rollback_when_failed_and_asked_once_landed():
    listener = CommitsAnything()
    producer = _started(listener, WithheldReports())
    main = WithheldReports()
    producer._producer = main
    during: list[S] = []

    def first_poll(timeout=0) -> int:  # the checks arrive before any delivery report
        halves = main.halves()
        if not any(r.reported for r in halves):
            during.extend(_ask(producer, _txn_id(r)) for r in halves)
            main.report(halves[0], offset=100)
            main.report(halves[1], TIMED_OUT)
        return 0

    main.poll = first_poll
    landed, failed = producer.send_messages_in_transaction(
        [Message("orders", b"a"), Message("orders", b"b")]
    )
    assert during == [S.UNKNOW, S.UNKNOW]
    assert (failed.half_offset, failed.local_transaction_state) == (-1, S.ROLLBACK_MESSAGE)
    assert _ask(producer, failed.transaction_id, 2) is S.ROLLBACK_MESSAGE
    assert listener.checked == []
    # A half that landed was handed to its local transaction: its checks ask the listener.
    assert _ask(producer, landed.transaction_id, 2) is S.COMMIT_MESSAGE
    assert listener.checked == [landed.transaction_id] and listener.executed == [b"a"]


def test_a_transaction_whose_first_member_was_not_written_is_rolled_back_by_its_id():
    producer, _, call, listener = _producer(fail=0)
    _sized(producer)
    with pytest.raises(KafkaOperationError, match=r"half message 0 of 3.*a ROLLBACK of txn"):
        producer.send_transaction(_messages(3))
    halves = [r for r in call.records if r.topic == producer.topics.half]
    [end_record] = [r for r in call.records if r.topic == producer.topics.op]
    end, txn_id = decode(end_record.value), dict(halves[0].headers)[H.TXN_ID].decode()
    assert (end.txn_id, end.state, end.half_offset, end.from_check) == (
        txn_id,
        EndState.ROLLBACK,
        -1,
        False,
    )
    assert end_record.partition == halves[0].partition  # where every member went
    assert _ask(producer, txn_id) is S.ROLLBACK_MESSAGE
    assert listener.executed == [] and listener.checked == []


def test_the_asyncio_producer_rolls_back_by_id_a_transaction_whose_first_member_failed():
    listener, call = CommitsAnything(), OffsetProducer(fail=0)
    producer = AsyncTransactionProducer(NOWHERE, producer_group="pg", listener=listener)
    core = producer._core
    core._producer = RecordingProducer()
    core._partitions = PartitionCache(FakeMetadataClient(COUNTS))
    core._started = True
    core._call.producer = call
    _sized(core)

    async def main() -> None:
        producer._loop = asyncio.get_running_loop()
        try:
            with pytest.raises(KafkaOperationError, match=r"0 of 2.*a ROLLBACK of txn"):
                await producer.send_transaction(_messages(2))
        finally:
            producer._executor.shutdown(wait=False)

    asyncio.run(main())
    halves = [r for r in call.records if r.topic == core.topics.half]
    [end_record] = [r for r in call.records if r.topic == core.topics.op]
    end, txn_id = decode(end_record.value), dict(halves[0].headers)[H.TXN_ID].decode()
    assert (end.txn_id, end.state, end.half_offset) == (txn_id, EndState.ROLLBACK, -1)
    assert _ask(core, txn_id) is S.ROLLBACK_MESSAGE
    assert listener.executed == [] and listener.checked == []


def test_a_batch_that_fills_the_local_queue_rolls_back_what_it_queued():
    listener = CommitsAnything()
    producer = _started(listener, WithheldReports())
    main = WithheldReports()
    producer._producer = main
    queue = main.produce

    def produce(topic, *args, **kwargs) -> None:
        if topic == "__rmq_half" and len(main.halves()) == 2:
            raise BufferError("Local: Queue full")
        queue(topic, *args, **kwargs)

    def poll(timeout=0) -> int:  # the first lands, the second fails
        first, second = main.halves()
        if not first.reported:
            main.report(first, offset=100)
            main.report(second, TIMED_OUT)
        return 0

    main.produce, main.poll = produce, poll
    with pytest.raises(BufferError, match="Queue full"):
        producer.send_messages_in_transaction([Message("orders", m) for m in (b"a", b"b", b"c")])
    landed, failed = (_txn_id(r) for r in main.halves())
    assert _ask(producer, landed) is S.ROLLBACK_MESSAGE
    assert _ask(producer, failed) is S.ROLLBACK_MESSAGE
    ends = [decode(r.value) for r in main.records if r.topic == producer.topics.op]
    assert [
        (e.txn_id, e.half_offset, e.state)
        for r in ends
        if isinstance(r, EndRequests)
        for e in r.entries
    ] == [(landed, 100, EndState.ROLLBACK)]
    assert [(r.txn_id, r.half_offset, r.state) for r in ends if isinstance(r, EndRequest)] == [
        (failed, -1, EndState.ROLLBACK)
    ]
    assert listener.executed == [] and listener.checked == []


# -- the ids kept, and their bounds ----------------------------------------------------------
def test_an_id_is_unknow_while_sending_asked_once_landed_and_forgotten_after_a_raise():
    unsent = UnsentHalves()
    with unsent.sending(["a", "b", "c"]):
        assert [unsent.answer(t) for t in "abc"] == [S.UNKNOW] * 3
        unsent.landed("a")
        unsent.failed("b")
        assert [unsent.answer(t) for t in "abc"] == [None, S.ROLLBACK_MESSAGE, S.UNKNOW]
    # "c" was neither when the block ended (a raise, a cancelled caller): not in flight.
    assert [unsent.answer(t) for t in "abc"] == [None, S.ROLLBACK_MESSAGE, None]
    with pytest.raises(RuntimeError), unsent.sending(["d"]):
        raise RuntimeError("cancelled")
    assert unsent.answer("d") is None and len(unsent) == 1


def test_failed_ids_are_kept_for_a_while_and_the_oldest_beyond_the_bound_is_dropped_counted():
    now = [0.0]
    unsent = UnsentHalves(keep_s=60, max_failed=3, clock=lambda: now[0])
    for txn_id in "abcd":
        unsent.failed(txn_id)
        now[0] += 1
    assert unsent.dropped == 1 and unsent.answer("a") is None
    assert [unsent.answer(t) for t in "bcd"] == [S.ROLLBACK_MESSAGE] * 3
    now[0] = 62.5  # "b" and "c" were reported over 60 s ago: forgotten, not counted
    assert [unsent.answer(t) for t in "bcd"] == [None, None, S.ROLLBACK_MESSAGE]
    assert unsent.dropped == 1 and len(unsent) == 1
    assert (FAILED_KEEP_S, FAILED_MAX) == (15 * 60, 10_000)  # as coordinator/rollback_ids.py


def test_the_producer_counts_failed_ids_it_dropped_and_logs_its_own_answers(caplog):
    listener = CommitsAnything()
    producer = _started(listener, WithheldReports())
    producer._unsent = UnsentHalves(max_failed=1)
    producer._unsent.failed("x")
    producer._unsent.failed("y")
    assert producer.failed_send_ids_dropped == 1
    with caplog.at_level(logging.INFO, logger="rmq_semantics"):
        assert _ask(producer, "y") is S.ROLLBACK_MESSAGE
        assert _ask(producer, "x") is S.COMMIT_MESSAGE  # dropped: the listener is asked
    [line] = [r.getMessage() for r in caplog.records if "without asking" in r.getMessage()]
    assert "txn=y" in line and "ROLLBACK" in line and "reported failed" in line
    assert listener.checked == ["x"]
