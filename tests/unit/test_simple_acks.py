"""The bookkeeping of ``SimpleConsumer.ack_async``'s futures (pure): a commit resolves the
futures whose record it marks done (below the committed offset or in its done field) and no
other; a partition gone first fails them with ReceiptError, a deadline with RmqTimeoutError."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from rmq_semantics.errors import ReceiptError, RmqTimeoutError
from rmq_semantics.simple.acks import AckWaiters, done_in_commit
from rmq_semantics.simple.engine import PartitionEngine

PART = ("t", 0)


def engine_with(offsets: list[int]) -> tuple[PartitionEngine, dict]:
    engine = PartitionEngine("t", 0)
    for offset in offsets:
        engine.offer(offset, f"r{offset}", 0)
    return engine, {d.receipt.offset: d.receipt for d in engine.receive(len(offsets), 0, 60_000)}


def test_a_commit_marks_done_the_offsets_below_it_and_those_of_its_done_field():
    engine, receipts = engine_with([42, 43, 44])
    engine.ack(receipts[43], 1)
    is_done = done_in_commit(*engine.committable(1, "c:0"))
    assert [is_done(o) for o in (41, 42, 43, 44)] == [True, False, True, False]
    engine.ack(receipts[42], 1)
    is_done = done_in_commit(*engine.committable(1, "c:0"))
    assert [is_done(o) for o in (42, 43, 44)] == [True, True, False]


def test_a_commit_resolves_only_the_futures_whose_record_it_carries():
    waiters, carried, later = AckWaiters(), Future(), Future()
    waiters.add(PART, 42, carried, deadline=10.0)
    waiters.add(PART, 44, later, deadline=10.0)
    waiters.committed(PART, lambda offset: offset < 43)
    assert carried.result(0) is None
    assert not later.done() and later.running() and not later.cancel()
    waiters.committed(("t", 1), lambda offset: True)  # another partition's commit
    assert not later.done()
    waiters.committed(PART, lambda offset: True)
    assert later.result(0) is None and len(waiters) == 0


def test_a_partition_gone_before_its_commit_fails_its_futures_with_receipt_error():
    waiters, here, there = AckWaiters(), Future(), Future()
    waiters.add(PART, 42, here, deadline=10.0)
    waiters.add(("t", 1), 7, there, deadline=10.0)
    waiters.lost(PART, "its partition was lost")
    with pytest.raises(ReceiptError, match=r"t\[0\]@42: its partition was lost .* delivered again"):
        here.result(0)
    assert not there.done()
    waiters.lose_all("the consumer closed")
    with pytest.raises(ReceiptError, match="consumer closed"):
        there.result(0)


def test_a_future_no_commit_carried_by_its_deadline_fails_with_a_timeout():
    waiters, early, late = AckWaiters(), Future(), Future()
    waiters.add(PART, 42, early, deadline=5.0)
    waiters.add(PART, 43, late, deadline=9.0)
    waiters.expire(4.9, "the bound")
    assert not early.done()
    waiters.expire(5.0, "the bound")
    with pytest.raises(RmqTimeoutError, match=r"t\[0\]@42: .* within the bound; .* later commit"):
        early.result(0)
    assert not late.done()
    waiters.committed(PART, lambda offset: True)
    assert late.result(0) is None


def test_a_future_cancelled_before_it_was_added_is_left_out():
    waiters, cancelled = AckWaiters(), Future()
    cancelled.cancel()
    waiters.add(PART, 42, cancelled, deadline=10.0)
    assert len(waiters) == 0
