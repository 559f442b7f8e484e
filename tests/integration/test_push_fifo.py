"""PushConsumer FIFO message groups on the real broker: a group's messages one at a time in
send order while other groups go on, RECONSUME_LATER retried in place (never through a retry
topic), the DLQ after max_reconsume_times with the group going on, a message without a group
still retried through the retry topics, ``fifo=False`` as before, and a new instance going on
with a group where the last one left it, at once after a rebalance."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import confluent_kafka
from confluent_kafka import TopicPartition

from rmq_semantics.push import PushConsumer
from rmq_semantics.records.headers import H
from tests.group_protocol import group_conf
from tests.integration.push_helpers import (
    LATER,
    LEVELS,
    SUCCESS,
    PushWorker,
    committed_ends,
    read_all,
)
from tests.integration.txn_helpers import wait_for

RETRY_MS = 200  # the FIFO retry interval of these tests


def send(broker, topic: str, messages: list[tuple[str | None, int]], partition: int = 0) -> None:
    """(group or None, n) in this order, to ``partition``; the value is ``n``."""
    producer = confluent_kafka.Producer(broker.conf())
    for group, n in messages:
        headers = [(H.MESSAGE_GROUP, group.encode())] if group else []
        producer.produce(topic, value=str(n).encode(), partition=partition, headers=headers)
    assert producer.flush(10) == 0


def start(
    broker, unique, topic: str, listener, *, group=None, prefix=None, **kwargs
) -> tuple[PushConsumer, str, str]:
    """A started PushConsumer (of a new group and prefix unless given), and those two."""
    group, prefix = group or unique("fifo-g"), prefix or unique("__rmqf")
    kwargs = {
        "max_workers": 8,
        "max_reconsume_times": 2,
        "delay_levels": LEVELS,
        "fifo_retry_interval_ms": RETRY_MS,
        **kwargs,
    }
    conf = group_conf(broker.conf(**{"group.id": group, "auto.offset.reset": "earliest"}))
    consumer = PushConsumer(conf, listener=listener, topic_prefix=prefix, **kwargs)
    consumer.subscribe([topic])
    consumer.start()
    return consumer, group, prefix


class Seen:
    """The listener's deliveries, (group, n, reconsume_times) in call order, and the most
    calls of one group ever running at once."""

    def __init__(self, decide) -> None:
        self.decide = decide  # (group, n, reconsume_times) -> status
        self.calls: list[tuple[str | None, int, int]] = []
        self.running: dict[str | None, int] = defaultdict(int)
        self.most_at_once: dict[str | None, int] = defaultdict(int)
        self.lock = threading.Lock()

    def __call__(self, msgs, context):
        (m,) = msgs
        group = m.header(H.MESSAGE_GROUP)
        key = group.decode() if group else None
        with self.lock:
            self.calls.append((key, int(m.value), m.reconsume_times))
            self.running[key] += 1
            self.most_at_once[key] = max(self.most_at_once[key], self.running[key])
        try:
            return self.decide(key, int(m.value), m.reconsume_times)
        finally:
            with self.lock:
                self.running[key] -= 1

    def of(self, group: str | None) -> list[tuple[int, int]]:
        with self.lock:
            return [(n, times) for g, n, times in self.calls if g == group]


def test_two_interleaved_groups_each_in_send_order_one_at_a_time_while_the_other_goes_on(
    broker, make_topic, unique
):
    topic = make_topic("fifo")
    send(broker, topic, [(g, n) for n in range(6) for g in ("a", "b")])
    b_finished = threading.Event()
    a_first_saw_b_finished: list[bool] = []

    def decide(group, n, times):
        if (group, n) == ("a", 0):  # group a's head is held until group b is through
            a_first_saw_b_finished.append(b_finished.wait(20))
        if (group, n) == ("b", 5):
            b_finished.set()
        return SUCCESS

    seen = Seen(decide)
    consumer, group, _ = start(broker, unique, topic, seen)
    try:
        wait_for(lambda: len(seen.of("a")) == 6, 30, "group a consumed")
    finally:
        consumer.shutdown()
    assert a_first_saw_b_finished == [True]  # b went on while a's head was in flight
    assert seen.of("a") == [(n, 0) for n in range(6)]
    assert seen.of("b") == [(n, 0) for n in range(6)]
    assert dict(seen.most_at_once) == {"a": 1, "b": 1}
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends == {0: 12}


def test_reconsume_later_is_retried_in_place_and_a_message_without_a_group_takes_a_retry_topic(
    broker, make_topic, unique
):
    topic = make_topic("fifo")
    send(broker, topic, [("a", 0), (None, 100), ("a", 1), ("a", 2)])

    def decide(group, n, times):
        return LATER if n in (0, 100) and times < (2 if n == 0 else 1) else SUCCESS

    seen = Seen(decide)
    consumer, group, prefix = start(broker, unique, topic, seen)
    try:
        wait_for(lambda: len(seen.of("a")) == 5 and len(seen.of(None)) == 2, 30, "consumed")
        wait_for(lambda: consumer.counts["consumed"] == 4, 10, "acked")
    finally:
        consumer.shutdown()
    assert seen.of("a") == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)]
    assert seen.of(None) == [(100, 0), (100, 1)]
    retried = [
        r
        for level in range(1, len(LEVELS) + 1)
        for r in read_all(broker.conf(), f"{prefix}_retry_{group}_{level}")
    ]
    assert [int(r.value()) for r in retried] == [100]  # the FIFO record never went there
    assert read_all(broker.conf(), f"{prefix}_dlq_{group}") == []
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends == {0: 4}


def test_a_fifo_message_out_of_reconsumes_goes_to_the_dlq_and_its_group_goes_on(
    broker, make_topic, unique
):
    topic = make_topic("fifo")
    send(broker, topic, [("a", 0), ("a", 1)])

    def decide(group, n, times):
        if n == 0:
            raise ValueError("message 0 always fails")
        return SUCCESS

    seen = Seen(decide)
    consumer, group, prefix = start(broker, unique, topic, seen)
    try:
        wait_for(lambda: len(seen.of("a")) == 4, 30, "a consumed")
        wait_for(lambda: consumer.counts["consumed"] == 1, 10, "acked")
    finally:
        consumer.shutdown()
    assert seen.of("a") == [(0, 0), (0, 1), (0, 2), (1, 0)]
    (dead,) = read_all(broker.conf(), f"{prefix}_dlq_{group}")
    headers = {k: v for k, v in dead.headers() or ()}
    assert dead.value() == b"0"
    assert headers[H.DLQ_ORIGINAL_TOPIC] == topic.encode()
    assert headers[H.DLQ_ORIGINAL_OFFSET] == b"0"
    assert headers[H.DLQ_RECONSUME_TIMES] == b"2"
    assert headers[H.DLQ_EXCEPTION] == b"ValueError"
    assert headers[H.MESSAGE_GROUP] == b"a"
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends == {0: 2}


def test_fifo_false_consumes_a_group_concurrently_through_the_retry_topics(
    broker, make_topic, unique
):
    topic = make_topic("fifo")
    send(broker, topic, [("a", 0), ("a", 1)])

    def decide(group, n, times):
        return LATER if n == 0 and times == 0 else SUCCESS

    seen = Seen(decide)
    consumer, group, prefix = start(broker, unique, topic, seen, fifo=False)
    try:
        wait_for(lambda: len(seen.of("a")) == 3, 30, "a consumed")
    finally:
        consumer.shutdown()
    assert seen.of("a") == [(0, 0), (1, 0), (0, 1)]  # 1 overtook 0's retry
    (copy,) = read_all(broker.conf(), f"{prefix}_retry_{group}_1")
    assert copy.value() == b"0"


def test_a_new_instance_goes_on_with_a_group_where_the_last_one_left_it(broker, make_topic, unique):
    topic = make_topic("fifo")
    send(broker, topic, [("a", 0), ("a", 1)])
    seen = Seen(lambda group, n, times: LATER)
    consumer, group, prefix = start(
        broker, unique, topic, seen, fifo_retry_interval_ms=2000, max_reconsume_times=5
    )
    try:
        wait_for(lambda: consumer.counts["retried"] >= 1, 30, "a retry")
    finally:
        consumer.shutdown()  # commits the lease: its attempts, invisible for the interval
    tries = len(seen.of("a"))
    assert seen.of("a") == [(0, n) for n in range(tries)]
    again = Seen(lambda group, n, times: SUCCESS)
    conf = group_conf(broker.conf(**{"group.id": group, "auto.offset.reset": "earliest"}))
    second = PushConsumer(conf, listener=again, topic_prefix=prefix)
    second.subscribe([topic])
    second.start()
    try:
        wait_for(lambda: second.counts["consumed"] == 2, 30, "a consumed by the second")
    finally:
        second.shutdown()
    assert again.of("a") == [(0, tries), (1, 0)]  # its attempts counted, the group in order


def test_a_rebalance_lets_the_calls_in_flight_finish_and_the_new_owner_goes_on_at_once(
    broker, make_topic, unique
):
    topic = make_topic("fifo", 3)
    for partition, group_name in enumerate("abc"):
        send(broker, topic, [(group_name, 0), (group_name, 1)], partition)
    second_called = threading.Event()

    def decide(group, n, times):  # the first instance's calls run while the second joins
        second_called.wait(6)
        return SUCCESS

    def second_listener(msgs, context):
        second_called.set()
        return seen(msgs, context)

    seen = Seen(decide)
    # Leases far longer than the test: a message in flight at the revocation and not finished
    # by it would come back on the new owner only after one.
    # One retry topic of one partition: of the four partitions the second instance takes two,
    # so at least one of the topic's.
    kwargs = {"consume_timeout_ms": 60_000, "delay_levels": (0.2,)}
    first, group, prefix = start(broker, unique, topic, seen, **kwargs)
    second = None
    try:
        wait_for(lambda: len(seen.calls) == 3, 30, "the three heads in flight")
        second, _, _ = start(
            broker, unique, topic, second_listener, group=group, prefix=prefix, **kwargs
        )
        wait_for(
            lambda: first.counts["consumed"] + second.counts["consumed"] == 6,
            30,
            "every message consumed once",
        )
    finally:
        first.shutdown()
        if second is not None:
            second.shutdown()
    assert second.counts["consumed"] >= 1  # a partition moved to it
    for group_name in "abc":
        assert seen.of(group_name) == [(0, 0), (1, 0)]
    assert dict(seen.most_at_once) == {"a": 1, "b": 1, "c": 1}


def lease_committed(broker, group: str, topic: str) -> bool:
    """Whether ``group``'s commit on ``topic[0]`` carries a FIFO lease."""
    reader = confluent_kafka.Consumer(broker.conf(**{"group.id": group}))
    try:
        (tp,) = reader.committed([TopicPartition(topic, 0)], timeout=10)
        return "rmqlease1." in (tp.metadata or "")
    finally:
        reader.close()


def test_a_message_held_by_a_killed_instance_comes_back_long_before_its_consume_timeout(
    broker, make_topic, unique, tmp_path
):
    """The killed instance's call would have run up to consume_timeout_ms (15 min by
    default): its lease must not hold the group that long on the next owner."""
    topic, group, prefix = make_topic("fifo"), unique("fifo-g"), unique("__rmqf")
    send(broker, topic, [("a", 0), ("a", 1)])
    worker = PushWorker(
        broker, tmp_path, "hung", prefix=prefix, group=group, topic=topic, args=("--hang-on", "0")
    )
    try:
        wait_for(lambda: [line["n"] for line in worker.lines()] == [0], 60, "a/0 in its call")
        wait_for(lambda: lease_committed(broker, group, topic), 30, "its lease committed")
        worker.proc.kill()
        worker.proc.wait(10)
    finally:
        worker.stop()
    seen = Seen(lambda group, n, times: SUCCESS)
    second, _, _ = start(broker, unique, topic, seen, group=group, prefix=prefix)
    try:
        wait_for(lambda: second.counts["consumed"] == 2, 60, "the group consumed by the next")
    finally:
        second.shutdown()
    assert seen.of("a") == [(0, 1), (1, 0)]  # the lost call counted, the group in order


# -- a slow call keeps its group (issue 45) --------------------------------------------------
# Here, not in test_push.py: this file runs in `make test` only (test-oldest and
# test-group-protocol run test_push.py too), so these 30 s tests cost CI their time once.
SLOW_S = 30.0  # the slow listener's call: longer than the 10 s the committed lease runs ahead


class Timed:
    """Each call's (instance, group, n, reconsume_times, start, end), ``time.monotonic`` of
    this process: a call is logged when it starts and its end filled in when it returns.
    ``slow(name, group, n, times)`` says which calls take ``SLOW_S``."""

    def __init__(self, slow) -> None:
        self.slow = slow
        self.calls: list[list] = []
        self.lock = threading.Lock()

    def listener(self, name: str):
        def call(msgs, context):
            (m,) = msgs
            group, n = m.header(H.MESSAGE_GROUP).decode(), int(m.value)
            row = [name, group, n, m.reconsume_times, time.monotonic(), None]
            with self.lock:
                self.calls.append(row)
            if self.slow(name, group, n, m.reconsume_times):
                threading.Event().wait(SLOW_S)  # the listener's work
            row[5] = time.monotonic()
            return SUCCESS

        return call

    def started(self, group: str, n: int) -> bool:
        with self.lock:
            return any(c[1:3] == [group, n] for c in self.calls)

    def ended(self) -> list[list]:
        with self.lock:
            return [c for c in self.calls if c[5] is not None]

    def overlaps(self) -> list[str]:
        """Two calls of one message group running at once (each call's start and end), and
        a group's next message started before its head's first call ended."""
        calls = sorted(self.ended(), key=lambda c: c[4])
        out = []
        for i, a in enumerate(calls):
            for b in calls[i + 1 :]:
                if a[1] == b[1] and b[4] < a[5]:
                    out.append(f"{b[0]}'s {b[1]}/{b[2]} started while {a[0]}'s {a[1]}/{a[2]} ran")
        for group in {c[1] for c in calls}:
            firsts = {n: next(c for c in calls if c[1:3] == [group, n]) for n in (0, 1)}
            if firsts[1][4] < firsts[0][5]:
                out.append(f"{group}/1 started before {group}/0's first call ended")
        return out


def test_a_slow_fifo_call_keeps_its_group_while_a_second_instance_joins(broker, make_topic, unique):
    """A 30 s call of a group's head on the first instance; a second instance joins and
    takes one of the two partitions: the revocation waits for the call (RocketMQ's old owner
    keeps its queue lock until its consumption ends), so the head is never called twice at
    once and the group's next message starts only after it."""
    topic = make_topic("fifo-slow", 3)
    for partition, group_name in enumerate("abc"):
        send(broker, topic, [(group_name, 0), (group_name, 1)], partition)
    timed = Timed(lambda name, group, n, times: name == "first" and n == 0)
    # One retry topic of one partition: of the four partitions the second instance takes two,
    # so at least one of the topic's.
    kwargs = {"delay_levels": (0.2,)}
    first, group, prefix = start(broker, unique, topic, timed.listener("first"), **kwargs)
    second = None
    try:
        wait_for(lambda: all(timed.started(g, 0) for g in "abc"), 30, "the three heads called")
        second, _, _ = start(
            broker, unique, topic, timed.listener("second"), group=group, prefix=prefix, **kwargs
        )
        wait_for(
            lambda: first.counts["consumed"] + second.counts["consumed"] >= 6,
            3 * SLOW_S,
            "every group's next message consumed",
        )
    finally:
        first.shutdown()
        if second is not None:
            second.shutdown()
    assert not (overlaps := timed.overlaps()), overlaps
    assert any(c[0] == "second" for c in timed.ended())  # a partition moved to it
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends == {0: 2, 1: 2, 2: 2}


def test_a_slow_fifo_call_keeps_its_group_across_a_producer_renewal(broker, make_topic, unique):
    """A 30 s call of a group's head while the consumer's transactional producer is fenced
    and re-created (its partitions replay from their commits): the group is not dispatched
    again until that call ends."""
    topic = make_topic("fifo-renewed")
    send(broker, topic, [("a", 0), ("a", 1)])
    timed = Timed(lambda name, group, n, times: n == 0 and times == 0)
    client_id = unique("fifo-client")
    consumer, group, prefix = start(
        broker, unique, topic, timed.listener("only"), client_id=client_id
    )
    try:
        wait_for(lambda: timed.started("a", 0), 30, "a/0 in its call")
        wait_for(lambda: lease_committed(broker, group, topic), 30, "its lease committed")
        # A newer instance of the same transactional.id fences the consumer's producer: its
        # next commit (the lease's renewal) fails and the producer is re-created.
        fencer = confluent_kafka.Producer(
            broker.conf(**{"transactional.id": f"{prefix}_push_{client_id}"})
        )
        fencer.init_transactions(30)
        wait_for(lambda: consumer.counts["producer_renewals"] >= 1, 30, "the producer renewed")
        wait_for(lambda: timed.started("a", 1), 3 * SLOW_S, "a/1 called")
        wait_for(lambda: consumer.counts["consumed"] >= 2, 30, "a/1 acked")
    finally:
        consumer.shutdown()
    assert not (overlaps := timed.overlaps()), overlaps
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends == {0: 2}
