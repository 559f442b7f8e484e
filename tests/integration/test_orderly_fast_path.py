"""The orderly consumer's fast path on a real broker: while one queue alone has work, the
poll thread runs its batches itself; they stay in offset order, under the queue lock, one
at a time, with SUSPEND handing the same messages over again. Once a second queue has
work, or after a listener call held the poll thread too long, fetched messages go to the
workers; a listener may shut the consumer down."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

import pytest

from rmq_semantics.orderly import ConsumeOrderlyStatus, OrderlyConsumer
from tests.integration.test_orderly import (
    committed,
    lock_service,  # noqa: F401 - a fixture, see locks
    produce,
    start_consumer,
    wait_for,
)

pytestmark = pytest.mark.integration

SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
POLL_THREAD = "rmq-orderly-poll-"


@pytest.fixture
def locks(request):
    """test_orderly's lock_service fixture: starts a lock service, returns its runner."""
    return request.getfixturevalue("lock_service")


@dataclass(frozen=True)
class Call:
    """One listener call as the listener saw it."""

    thread: str
    partition: int
    offsets: tuple[int, ...]
    reconsume_times: tuple[int, ...]
    epoch: int
    locked: bool  # consumer.status() during the call: the queue lock held, lease live
    status_epoch: int
    start: float
    end: float


class Recorder:
    """A listener that records every call, then answers with ``decide(call)``."""

    def __init__(self, decide=None) -> None:
        self.calls: list[Call] = []
        self.consumer: OrderlyConsumer | None = None
        self.decide = decide
        self._lock = threading.Lock()

    def __call__(self, msgs, context):
        start = time.monotonic()
        assert self.consumer is not None
        status = self.consumer.status()[(context.topic, context.partition)]
        call = Call(
            threading.current_thread().name,
            context.partition,
            tuple(m.offset for m in msgs),
            tuple(m.reconsume_times for m in msgs),
            context.lock_epoch,
            status.locked,
            status.epoch,
            start,
            time.monotonic(),
        )
        with self._lock:
            self.calls.append(call)
        return self.decide(call, context) if self.decide else SUCCESS

    def of(self, partition: int) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.partition == partition]


def acked_offsets(calls: list[Call], suspended: set[int] = frozenset()) -> list[int]:
    """The offsets handed over, in call order, leaving out the calls listed as suspended."""
    return [o for i, c in enumerate(calls) if i not in suspended for o in c.offsets]


def assert_one_at_a_time_under_the_lock(calls: list[Call], batch_size: int) -> None:
    for call in calls:
        assert call.locked and call.status_epoch == call.epoch, call
        assert 1 <= len(call.offsets) <= batch_size, call
        assert list(call.offsets) == list(range(call.offsets[0], call.offsets[-1] + 1)), call
    for before, after in itertools.pairwise(calls):
        assert before.end <= after.start, (before, after)


def test_a_lone_queue_runs_on_the_poll_thread_in_offset_order_under_its_lock(
    broker, make_topic, unique, locks
):
    service = locks()
    topic, group = make_topic("fast"), unique("g")
    recorder = Recorder()
    consumer = start_consumer(broker, group, topic, service.prefix, recorder, "fast", batch_size=16)
    recorder.consumer = consumer
    try:
        produce(broker, topic, [(b"k", b"first", 0)])
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 1}, 60, "the first message")
        # Fetched now, the queue aligned and alone: these are the poll thread's.
        produce(broker, topic, [(b"k", str(i).encode(), 0) for i in range(1, 600)])
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 600}, 60, "every message")
    finally:
        consumer.shutdown()
    calls = recorder.of(0)
    assert acked_offsets(calls) == list(range(600))  # each once, in offset order
    assert_one_at_a_time_under_the_lock(calls, 16)
    assert any(c.thread.startswith(POLL_THREAD) for c in calls), {c.thread for c in calls}


def test_a_suspended_batch_on_the_poll_thread_comes_back_with_the_same_messages(
    broker, make_topic, unique, locks
):
    service = locks()
    topic, group = make_topic("fast-suspend"), unique("g")

    def decide(call: Call, context) -> ConsumeOrderlyStatus:
        context.suspend_ms = 20
        return SUSPEND if 40 in call.offsets and call.reconsume_times[0] < 2 else SUCCESS

    recorder = Recorder(decide)
    consumer = start_consumer(
        broker, group, topic, service.prefix, recorder, "fast-suspend", batch_size=8
    )
    recorder.consumer = consumer
    try:
        produce(broker, topic, [(b"k", b"first", 0)])
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 1}, 60, "the first message")
        produce(broker, topic, [(b"k", str(i).encode(), 0) for i in range(1, 100)])
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 100}, 60, "every message")
    finally:
        consumer.shutdown()
    calls = recorder.of(0)
    suspended = [i for i, c in enumerate(calls) if 40 in c.offsets and c.reconsume_times[0] < 2]
    assert len(suspended) == 2
    first, again, last = (calls[i] for i in (*suspended, suspended[-1] + 1))
    assert first.thread.startswith(POLL_THREAD), first
    assert first.offsets == again.offsets == last.offsets  # the same messages, each time
    assert (first.reconsume_times[0], again.reconsume_times[0], last.reconsume_times[0]) == (
        0,
        1,
        2,
    )
    assert acked_offsets(calls, set(suspended)) == list(range(100))
    assert_one_at_a_time_under_the_lock(calls, 8)


def test_fetches_go_to_the_workers_while_a_second_queue_has_work(broker, make_topic, unique, locks):
    service = locks()
    topic, group = make_topic("fast-two", partitions=2), unique("g")
    second_done = threading.Event()

    def decide(call: Call, context) -> ConsumeOrderlyStatus:
        context.suspend_ms = 50
        if call.partition == 0 and not second_done.is_set():
            return SUSPEND  # partition 0 keeps its message in flight meanwhile
        return SUCCESS

    recorder = Recorder(decide)
    consumer = start_consumer(broker, group, topic, service.prefix, recorder, "fast-two")
    recorder.consumer = consumer
    try:
        produce(broker, topic, [(b"k0", b"held", 0)])
        wait_for(lambda: recorder.of(0), 60, "partition 0's first call")
        produce(broker, topic, [(b"k1", str(i).encode(), 1) for i in range(20)])
        wait_for(lambda: len(recorder.of(1)) == 20, 60, "partition 1's messages")
        second_done.set()
        wait_for(lambda: committed(broker, group, topic, 2) == {0: 1, 1: 20}, 60, "both partitions")
    finally:
        consumer.shutdown()
    second = recorder.of(1)
    assert acked_offsets(second) == list(range(20))
    assert {c.thread for c in second} == {f"rmq-orderly-{topic}[1]"}  # its worker's
    first = recorder.of(0)
    assert {c.offsets for c in first} == {(0,)}
    assert [c.reconsume_times[0] for c in first] == list(range(len(first)))
    for calls in (first, second):
        assert_one_at_a_time_under_the_lock(calls, 1)


def test_a_listener_on_the_poll_thread_may_shut_the_consumer_down(
    broker, make_topic, unique, locks
):
    service = locks()
    topic, group = make_topic("fast-stop"), unique("g")
    returned = threading.Event()

    def decide(call: Call, context) -> ConsumeOrderlyStatus:
        if call.offsets == (1,):
            assert recorder.consumer is not None
            recorder.consumer.shutdown()
            returned.set()
        return SUCCESS

    recorder = Recorder(decide)
    consumer = start_consumer(broker, group, topic, service.prefix, recorder, "fast-stop")
    recorder.consumer = consumer
    try:
        produce(broker, topic, [(b"k", b"first", 0)])
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 1}, 60, "the first message")
        produce(broker, topic, [(b"k", b"stop", 0)])
        assert returned.wait(60), "shutdown() from the listener did not return"
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 2}, 60, "its commit")
        wait_for(lambda: not consumer.status(), 60, "the queue to be released")
    finally:
        consumer.shutdown()  # idempotent: already shut down from the listener
    [stop] = [c for c in recorder.of(0) if c.offsets == (1,)]
    assert stop.thread.startswith(POLL_THREAD), stop


def test_a_slow_listener_call_on_the_poll_thread_sends_the_next_batches_to_the_worker(
    broker, make_topic, unique, locks
):
    service = locks()
    topic, group = make_topic("fast-slow"), unique("g")

    def decide(call: Call, context) -> ConsumeOrderlyStatus:
        if call.offsets == (1,):
            time.sleep(0.3)  # simulated slow work, past the poll thread's turn
        return SUCCESS

    recorder = Recorder(decide)
    consumer = start_consumer(broker, group, topic, service.prefix, recorder, "fast-slow")
    recorder.consumer = consumer
    try:
        produce(broker, topic, [(b"k", b"first", 0)])
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 1}, 60, "the first message")
        produce(broker, topic, [(b"k", b"slow", 0)])
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 2}, 60, "the slow message")
        produce(broker, topic, [(b"k", b"after", 0)])
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 3}, 60, "the next message")
    finally:
        consumer.shutdown()
    calls = recorder.of(0)
    assert acked_offsets(calls) == [0, 1, 2]
    slow, after = calls[1], calls[2]
    assert slow.thread.startswith(POLL_THREAD), slow
    assert after.thread == f"rmq-orderly-{topic}[0]", after  # its worker's, not the poll thread
