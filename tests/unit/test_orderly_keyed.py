"""Key mode's pool and feeder without a broker: async detection, units of consecutive
same-key records, restored done offsets skipped, back-pressure, and a pool run whose
commits only move forward and end past the last record."""

from __future__ import annotations

import threading
import time

from rmq_semantics.orderly import ConsumeOrderlyStatus, MessageListenerOrderly
from rmq_semantics.orderly.keyed import KeyPool, is_async_listener
from rmq_semantics.orderly.keyfeed import KeyFeeder, Session
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.orderly.runtime import LiveQueue

TP = ("orders", 0)


class FakeRecord:
    """The ``confluent_kafka.Message`` methods the orderly consumer reads."""

    def __init__(self, offset: int, key: bytes | None) -> None:
        self._offset, self._key = offset, key

    def topic(self) -> str:
        return TP[0]

    def partition(self) -> int:
        return TP[1]

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def __len__(self) -> int:  # confluent_kafka.Message's len is its value's
        return len(self.value())

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 1, 0


class FakeCommits:
    def __init__(self, end: int = -1) -> None:
        self.processed_offsets: list[tuple[int, str]] = []
        self.end = end
        self.reached_end = threading.Event()

    def may_commit(self, q, epoch) -> None:
        return None

    def processed(self, q, offset: int, epoch: int, done: str = "") -> None:
        self.processed_offsets.append((offset, done))
        if offset == self.end:
            self.reached_end.set()


def aligned_queue(committed: int = -1, metadata: str = "") -> LiveQueue:
    q = LiveQueue(TP, threading.Lock())
    q.state.grant(3, time.monotonic() + 600)
    q.state.align(3, committed, metadata)
    return q


def test_async_listeners_are_recognised_in_every_shape():
    async def coro(msgs, context):
        return ConsumeOrderlyStatus.SUCCESS

    class AsyncCallable:
        async def __call__(self, msgs, context):
            return ConsumeOrderlyStatus.SUCCESS

    class AsyncListener(MessageListenerOrderly):
        async def consume_message(self, msgs, context):  # type: ignore[override]
            return ConsumeOrderlyStatus.SUCCESS

    assert is_async_listener(coro) and is_async_listener(AsyncCallable())
    assert is_async_listener(AsyncListener().consume_message)
    assert not is_async_listener(lambda msgs, context: ConsumeOrderlyStatus.SUCCESS)


def test_units_hold_consecutive_records_of_one_key_up_to_the_batch_size():
    q = aligned_queue()
    session = Session(q, 3, OffsetTracker())
    keys = [b"a", b"a", b"a", b"a", b"b", b"a", None, None]
    q.state.add([FakeRecord(i, k) for i, k in enumerate(keys)])
    units = KeyFeeder(
        KeyPool(
            lambda m, c: None,
            max_workers=2,
            max_reconsume_times=-1,
            commits=FakeCommits(),
            dead_letters=None,
            name="t",
        ),
        batch_size=3,
    )._take(q.state, session)
    assert [[r.offset() for r in u.records] for u in units] == [[0, 1, 2], [3], [4], [5], [6, 7]]


def test_records_a_restored_commit_marks_done_are_skipped():
    tracker = OffsetTracker(10)
    for offset in range(10, 14):
        tracker.add(offset)
    for offset in (11, 13):
        tracker.done(offset)
    _, metadata = tracker.committable("c:3")
    q = aligned_queue(10, metadata)
    session = Session(q, 3, OffsetTracker.restore(10, metadata))
    q.state.add([FakeRecord(i, b"k%d" % i) for i in range(10, 15)])
    feeder = KeyFeeder(
        KeyPool(
            lambda m, c: None,
            max_workers=2,
            max_reconsume_times=-1,
            commits=FakeCommits(),
            dead_letters=None,
            name="t",
        ),
        batch_size=1,
    )
    assert [u.offset for u in feeder._take(q.state, session)] == [10, 12, 14]


def test_no_records_are_taken_while_the_tracker_is_full():
    q = aligned_queue()
    session = Session(q, 3, OffsetTracker(0, max_span=4))
    q.state.add([FakeRecord(i, b"k%d" % i) for i in range(10)])
    feeder = KeyFeeder(
        KeyPool(
            lambda m, c: None,
            max_workers=2,
            max_reconsume_times=-1,
            commits=FakeCommits(),
            dead_letters=None,
            name="t",
        ),
        batch_size=1,
    )
    feeder._take(q.state, session)  # all ten taken: the bound is checked between rounds
    session.tracker.done(9)
    q.state.add([FakeRecord(10, b"k")])
    assert feeder._take(q.state, session) == []  # the span is over max_span: back-pressure
    assert session.tracker.status().back_pressure


def test_a_pool_run_commits_forward_only_and_ends_past_the_last_record():
    q = aligned_queue()
    session = Session(q, 3, OffsetTracker())
    commits = FakeCommits(end=200)
    seen: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    def listener(msgs, context):
        time.sleep(0.001 * (msgs[0].offset % 3))  # simulated work of varying length
        with lock:
            seen.extend((m.key, m.offset) for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    pool = KeyPool(
        listener,
        max_workers=4,
        max_reconsume_times=-1,
        commits=commits,
        dead_letters=None,
        name="t",
    )
    feeder = KeyFeeder(pool, batch_size=2)
    q.state.add([FakeRecord(i, b"k%d" % (i % 5)) for i in range(200)])
    pool.start()
    try:
        while q.state.msgs:
            with q.cv:
                units = feeder._take(q.state, session)
            pool.offer(units)
        assert commits.reached_end.wait(30)
    finally:
        pool.stop(time.monotonic() + 5)
    offsets = [offset for offset, _ in commits.processed_offsets]
    assert offsets == sorted(offsets) and offsets[-1] == 200
    assert commits.processed_offsets[-1][1] == ""  # nothing done above the end
    for key in {k for k, _ in seen}:
        assert [o for k, o in seen if k == key] == [
            o for o in range(200) if b"k%d" % (o % 5) == key
        ]


def test_a_sync_call_past_consume_timeout_counts_as_failed_and_is_retried():
    q = aligned_queue()
    session = Session(q, 3, OffsetTracker())
    commits = FakeCommits(end=1)
    calls: list[int] = []

    def listener(msgs, context):
        context.suspend_ms = 1
        calls.append(msgs[0].reconsume_times)
        if not msgs[0].reconsume_times:
            time.sleep(0.2)  # past the 50 ms timeout: its SUCCESS does not count
        return ConsumeOrderlyStatus.SUCCESS

    pool = KeyPool(
        listener,
        max_workers=2,
        max_reconsume_times=-1,
        commits=commits,
        dead_letters=None,
        name="t",
        consume_timeout_ms=50,
    )
    q.state.add([FakeRecord(0, b"k")])
    with q.cv:
        units = KeyFeeder(pool, batch_size=1)._take(q.state, session)
    pool.offer(units)
    pool.start()
    try:
        assert commits.reached_end.wait(30)
    finally:
        pool.stop(time.monotonic() + 5)
    assert calls == [0, 1]
