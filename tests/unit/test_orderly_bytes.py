"""The orderly consumer's byte bound (RocketMQ's pullThresholdSizeForQueue, 100 MiB): the
buffered bytes of a partition are counted through every move of its buffer, fetching
pauses at the bound and resumes at half of it, and key mode takes no more records into
its pool while the taken and unfinished ones reach it."""

from __future__ import annotations

import pytest

from rmq_semantics.errors import ConfigError
from rmq_semantics.orderly import OrderlyConsumer, OrderlyMessage
from rmq_semantics.orderly.keyed import KeyPool
from rmq_semantics.orderly.keyfeed import KeyFeeder, Session
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.orderly.queue import QueueState
from tests.unit.test_orderly_keyed import FakeCommits, FakeRecord, aligned_queue

TP = ("orders", 3)
MIB = 1024 * 1024


def sized(*offsets: int, size: int = 100) -> list[OrderlyMessage]:
    return [OrderlyMessage(TP[0], TP[1], o, None, b"x" * size, (), 0) for o in offsets]


def test_buffered_bytes_follow_every_move_of_the_buffer():
    q = QueueState(TP)
    q.grant(7, 100.0)
    q.align(7, 0)
    q.add(sized(0, 1, 2, 3, 4))
    assert q.queued_bytes == 500
    q.next_batch(2)
    assert q.queued_bytes == 300  # the in-flight batch left the buffer
    q.hold()
    q.next_batch(1)
    q.rollback()  # everything since the last commit goes back in front
    assert (len(q.msgs), q.queued_bytes) == (5, 500)
    q.align(7, 2)  # a newer commit drops what is below it
    assert q.queued_bytes == 300
    q.revoke()
    q.drop()
    assert q.queued_bytes == 0
    assert q.status(0.0) is None


def test_fetching_pauses_at_the_byte_bound_below_the_count_bound_and_resumes_at_half():
    from rmq_semantics.orderly.poller import flow_control

    bound = 100 * MIB
    # Ten records of 10 MiB: far below the 10,000-record bound, at the byte bound.
    assert flow_control(10, bound, paused=False, held=True, max_queued_bytes=bound) == (True, False)
    assert flow_control(9, bound - 1, paused=False, held=True, max_queued_bytes=bound) == (
        False,
        False,
    )
    assert flow_control(6, bound // 2 + 1, paused=True, held=True, max_queued_bytes=bound) == (
        False,
        False,
    )
    assert flow_control(5, bound // 2, paused=True, held=True, max_queued_bytes=bound) == (
        False,
        True,
    )
    # The count bound and the lock still apply.
    assert flow_control(10_000, 0, paused=False, held=True, max_queued_bytes=bound) == (True, False)
    assert flow_control(0, 0, paused=False, held=False, max_queued_bytes=bound) == (True, False)


def test_key_mode_takes_no_more_records_while_the_taken_bytes_reach_the_bound():
    q = aligned_queue()
    session = Session(q, 3, OffsetTracker())
    q.state.add([FakeRecord(i, b"k%d" % i) for i in range(10)])  # values of 2 bytes
    pool = KeyPool(
        lambda m, c: None,
        max_workers=2,
        max_reconsume_times=-1,
        commits=FakeCommits(),
        dead_letters=None,
        name="t",
    )
    feeder = KeyFeeder(pool, batch_size=1, max_taken_bytes=5)
    units = feeder._take(q.state, session)
    assert [u.offset for u in units] == [0, 1, 2]  # the bound is reached at the third
    assert feeder._take(q.state, session) == []
    assert q.state.queued_bytes == 14  # seven records of 2 bytes still buffered
    pool.done_offsets(session, [0], freed_bytes=2)
    assert [u.offset for u in feeder._take(q.state, session)] == [3]


def test_max_queued_bytes_defaults_to_rocketmqs_100_mib_and_must_be_positive():
    conf = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
    listener = lambda msgs, context: None  # noqa: E731
    assert OrderlyConsumer(conf, listener=listener).max_queued_bytes == 100 * MIB
    with pytest.raises(ConfigError, match="max_queued_bytes"):
        OrderlyConsumer(conf, listener=listener, max_queued_bytes=0)
