"""PushConsumer (RocketMQ's concurrent consumer) on the real broker: RECONSUME_LATER through
delay-level retry topics, the DLQ after max_reconsume_times, tags, async listeners,
consume_timeout_ms, and a SIGKILL mid-run (exactly once on the retry path).

N messages: 2,000 by default, ``RMQ_TEST_PUSH_N`` (``make test-push``: 10,000) for more.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import random
import signal
import time
from collections import Counter

import confluent_kafka
import pytest

from rmq_semantics.push import ConsumeConcurrentlyStatus, PushConsumer
from rmq_semantics.records.headers import H
from tests.fuzz.categories import PUSH_CATEGORIES, cases
from tests.fuzz.generators import Ctx
from tests.group_protocol import group_conf
from tests.integration.push_helpers import (
    LEVELS,
    MAX_RECONSUME,
    PushWorker,
    Recorder,
    committed_ends,
    fails_always,
    fails_once,
    headers_of,
    produce_numbers,
    raises,
    read_all,
)
from tests.integration.txn_helpers import wait_for

N = int(os.environ.get("RMQ_TEST_PUSH_N", "2000"))
PARTITIONS = 4
# A retry copy's delay while its partition moves to another member and back.
HELD_S = 8.0


def push_conf(broker, group: str) -> dict:
    return group_conf(broker.conf(**{"group.id": group, "auto.offset.reset": "earliest"}))


def start(
    broker, group: str, topic: str, prefix: str, listener, *, tags=None, **kwargs
) -> PushConsumer:
    kwargs = {
        "max_workers": 16,
        "max_reconsume_times": MAX_RECONSUME,
        "delay_levels": LEVELS,
        **kwargs,
    }
    consumer = PushConsumer(
        push_conf(broker, group), listener=listener, topic_prefix=prefix, **kwargs
    )
    consumer.subscribe([topic], tags=tags)
    consumer.start()
    return consumer


def expected_done(numbers: range) -> tuple[set[int], set[int]]:
    """(consumed successfully, dead-lettered) under the policy."""
    dead = {n for n in numbers if fails_always(n)}
    return set(numbers) - dead, dead


def check_dlq(broker, prefix: str, group: str, topic: str, dead: set[int]) -> None:
    """The DLQ holds each always-failing message once, with its origin, count and reason."""
    records = read_all(broker.conf(), f"{prefix}_dlq_{group}")
    numbers = Counter(int(r.value()) for r in records)
    assert set(numbers) == dead and set(numbers.values()) == {1}, numbers
    for r in records:
        h = headers_of(r)
        n = int(r.value())
        assert h[H.DLQ_ORIGINAL_TOPIC] == topic.encode()
        assert int(h[H.DLQ_ORIGINAL_PARTITION]) in range(PARTITIONS)
        assert int(h[H.DLQ_ORIGINAL_OFFSET]) >= 0
        assert int(h[H.DLQ_RECONSUME_TIMES]) == MAX_RECONSUME
        assert int(h[H.DLQ_FIRST_FAILURE_TS]) <= int(h[H.DLQ_LAST_FAILURE_TS])
        if raises(n):
            assert h[H.DLQ_EXCEPTION] == b"ValueError"
            assert h[H.DLQ_EXCEPTION_MESSAGE] == f"message {n} always fails".encode()
        else:
            assert H.DLQ_EXCEPTION not in h
        assert r.key() == str(n).encode()


def check_retry_waits(recorder: Recorder) -> None:
    """Each retry came no earlier than its due time, which is its level's delay after the
    failure before it (level n for reconsume n, the last one past the end)."""
    by_n: dict[int, list] = {}
    for d in sorted(recorder.snapshot(), key=lambda d: (d.n, d.reconsume_times)):
        by_n.setdefault(d.n, []).append(d)
    checked = 0
    for deliveries in by_n.values():
        for before, retry in itertools.pairwise(deliveries):
            assert retry.reconsume_times == before.reconsume_times + 1
            level = min(retry.reconsume_times, len(LEVELS))
            assert retry.due_ms is not None
            assert retry.due_ms - before.at_ms >= LEVELS[level - 1] * 1000
            assert retry.at_ms >= retry.due_ms
            checked += 1
    assert checked


def test_reconsume_later_retries_by_level_then_dlq_every_message_once(broker, make_topic, unique):
    topic, group, prefix = make_topic("push", PARTITIONS), unique("push-g"), unique("__rmqp")
    numbers = range(N)
    produce_numbers(broker.conf(), topic, numbers)
    recorder = Recorder()
    consumed, dead = expected_done(numbers)
    consumer = start(broker, group, topic, prefix, recorder)
    try:
        wait_for(
            lambda: set(recorder.successes()) >= consumed and consumer.counts["dead"] >= len(dead),
            120,
            "every message consumed",
        )
    finally:
        consumer.shutdown()
    successes = Counter(recorder.successes())
    assert set(successes) == consumed and set(successes.values()) == {1}
    deliveries = Counter((d.n, d.reconsume_times) for d in recorder.snapshot())
    assert set(deliveries.values()) == {1}, "a message was delivered twice at one count"
    for n in numbers:
        tries = sum(1 for k in range(MAX_RECONSUME + 2) if (n, k) in deliveries)
        assert tries == (MAX_RECONSUME + 1 if fails_always(n) else 2 if fails_once(n) else 1)
    # A retry shows its ORIGINAL coordinates and birth time, as RocketMQ does.
    firsts = {
        d.n: (d.topic, d.offset, d.born) for d in recorder.snapshot() if d.reconsume_times == 0
    }
    assert all((d.topic, d.offset, d.born) == firsts[d.n] for d in recorder.snapshot())
    check_retry_waits(recorder)
    check_dlq(broker, prefix, group, topic, dead)
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends


def test_tags_filter_sees_exactly_the_matching_messages_and_commits_past_the_rest(
    broker, make_topic, unique
):
    topic, group, prefix = make_topic("push-tags", 2), unique("push-tg"), unique("__rmqp")
    tag_of = {0: "TagA", 1: "TagB", 2: "TagC", 3: None}
    numbers = range(400)
    produce_numbers(broker.conf(), topic, numbers, tags=lambda n: tag_of[n % 4])
    seen: list[int] = []

    def listener(msgs, context):
        seen.extend(int(m.value) for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = start(broker, group, topic, prefix, listener, tags="TagA || TagB")
    try:
        wanted = {n for n in numbers if n % 4 in (0, 1)}
        wait_for(lambda: set(seen) >= wanted, 60, "the TagA and TagB messages")
        wait_for(lambda: consumer.counts["skipped"] == 200, 30, "the others skipped")
    finally:
        consumer.shutdown()
    assert sorted(seen) == sorted(wanted)
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends


def test_async_listener_retries_and_dead_letters(broker, make_topic, unique):
    topic, group, prefix = make_topic("push-async", 2), unique("push-ag"), unique("__rmqp")
    numbers = range(300)
    produce_numbers(broker.conf(), topic, numbers)
    recorder = Recorder()
    consumed, dead = expected_done(numbers)
    consumer = start(broker, group, topic, prefix, recorder.async_listener)
    try:
        wait_for(
            lambda: set(recorder.successes()) >= consumed and consumer.counts["dead"] >= len(dead),
            60,
            "every message consumed",
        )
    finally:
        consumer.shutdown()
    successes = Counter(recorder.successes())
    assert set(successes) == consumed and set(successes.values()) == {1}
    check_retry_waits(recorder)
    check_dlq(broker, prefix, group, topic, dead)


def test_a_call_past_consume_timeout_is_reconsumed_later(broker, make_topic, unique):
    topic, group, prefix = make_topic("push-timeout"), unique("push-tt"), unique("__rmqp")
    produce_numbers(broker.conf(), topic, range(3))
    calls: list[tuple[int, int]] = []

    def listener(msgs, context):
        m = msgs[0]
        calls.append((int(m.value), m.reconsume_times))
        if int(m.value) == 1 and m.reconsume_times == 0:
            time.sleep(1.5)  # simulated hung work, past consume_timeout_ms
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = start(broker, group, topic, prefix, listener, consume_timeout_ms=500)
    try:
        wait_for(lambda: (1, 1) in calls, 30, "the timed-out message again")
    finally:
        consumer.shutdown()
    assert consumer.counts["timed_out"] == 1
    assert sorted(calls) == [(0, 0), (1, 0), (1, 1), (2, 0)]


# -- SIGKILL mid-run ----------------------------------------------------------------------------
def test_sigkill_mid_run_loses_nothing_and_writes_each_retry_once(
    broker, make_topic, unique, tmp_path
):
    if broker.embedded is not None and broker.embedded.client_conf() != {
        "bootstrap.servers": broker.bootstrap
    }:
        pytest.skip("the worker connects with a bare bootstrap list")
    topic, group, prefix = make_topic("push-kill", PARTITIONS), unique("push-kg"), unique("__rmqp")
    numbers = range(N)
    produce_numbers(broker.conf(), topic, numbers)
    consumed, dead = expected_done(numbers)
    first = PushWorker(broker, tmp_path, "first", prefix=prefix, group=group, topic=topic)
    second = None
    try:
        # Kill once a third is through and some retries came back (the retry path is live).
        wait_for(
            lambda: (
                lambda lines: len(lines) > N // 3 and any(x.get("reconsume", 0) > 0 for x in lines)
            )(first.lines()),
            120,
            "the first worker a third through",
        )
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        second = PushWorker(broker, tmp_path, "second", prefix=prefix, group=group, topic=topic)
        lines = lambda: first.lines() + second.lines()  # noqa: E731
        wait_for(
            lambda: {x["n"] for x in lines() if x["outcome"] == "CONSUME_SUCCESS"} >= consumed,
            180,
            "every message consumed after the kill",
        )
        wait_for(
            lambda: len(read_all(broker.conf(), f"{prefix}_dlq_{group}")) >= len(dead),
            60,
            "the DLQ filled",
        )
    finally:
        first.stop()
        if second is not None:
            second.stop()
    check_dlq(broker, prefix, group, topic, dead)
    # Exactly once on the retry path: one retry copy per message and reconsume count.
    copies = Counter()
    for level in range(1, len(LEVELS) + 1):
        for r in read_all(broker.conf(), f"{prefix}_retry_{group}_{level}"):
            copies[(int(r.value()), int(headers_of(r)[H.RECONSUME_TIMES]))] += 1
    assert copies and set(copies.values()) == {1}, [k for k, v in copies.items() if v > 1]
    wanted = {(n, k) for n in numbers if fails_once(n) for k in (1,)} | {
        (n, k) for n in dead for k in range(1, MAX_RECONSUME + 1)
    }
    assert set(copies) == wanted
    # Each worker got each retry copy once; a copy the killed one was running (not committed)
    # comes again to the second, as any uncommitted delivery does (at least once).
    for worker in (first, second):
        retried = Counter((x["n"], x["reconsume"]) for x in worker.lines() if x["reconsume"] > 0)
        assert set(retried.values()) == {1}, [k for k, v in retried.items() if v > 1]


# -- untrusted retry records -------------------------------------------------------------------
def test_forged_retry_records_are_counted_logged_delivered_and_never_stop_the_consumer(
    broker, make_topic, unique, caplog
):
    topic, group, prefix = make_topic("push-fuzz"), unique("push-fz"), unique("__rmqp")
    seen: list[tuple[bytes | None, str | None]] = []

    def listener(msgs, context):
        seen.extend((m.value, m.retry_topic) for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    caplog.set_level(logging.WARNING, logger="rmq_semantics.push")
    consumer = start(broker, group, topic, prefix, listener)  # creates the retry topics
    try:
        rng = random.Random(17)
        made = cases(rng, Ctx(real_topic=topic), list(PUSH_CATEGORIES), 60)
        retry_topic = f"{prefix}_retry_{group}_1"
        producer = confluent_kafka.Producer(broker.conf())
        for case in made:
            for raw in case.records:
                producer.produce(
                    retry_topic, raw.value, key=raw.key, headers=raw.headers, partition=0
                )
        assert producer.flush(30) == 0
        produce_numbers(broker.conf(), topic, range(20))  # good records after the bad ones
        wait_for(lambda: len(seen) == 80, 60, "every record delivered")
    finally:
        consumer.shutdown()
    bad = sum(1 if c.bad is None else c.bad for c in made)
    assert bad and consumer.counts["malformed"] == bad
    assert sum(1 for _, retry in seen if retry == retry_topic) == 60
    assert sorted(int(v) for v, retry in seen if retry is None) == list(range(20))
    logged = [r.getMessage() for r in caplog.records if "retry record with" in r.getMessage()]
    assert len(logged) == bad
    assert all(line.startswith(f"{retry_topic}[0]@") for line in logged)


def test_a_fenced_transactional_producer_is_replaced_and_consuming_goes_on(
    broker, make_topic, unique
):
    """Campaign seed 30: a broker fault fenced the push consumer's own transactional producer
    (a newer epoch of its transactional.id); the consumer must start a new producer and go
    on, not stop consuming for good."""
    topic, group, prefix = make_topic("push-fenced"), unique("push-fg"), unique("__rmqp")
    client_id = unique("push-client")
    seen: list[int] = []

    def listener(msgs, context):
        seen.extend(int(m.value) for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    produce_numbers(broker.conf(), topic, range(20))
    consumer = start(broker, group, topic, prefix, listener, client_id=client_id)
    try:
        wait_for(lambda: set(seen) >= set(range(20)), 60, "the first messages")
        # A newer instance of the same transactional.id fences the consumer's producer.
        fencer = confluent_kafka.Producer(
            broker.conf(**{"transactional.id": f"{prefix}_push_{client_id}"})
        )
        fencer.init_transactions(30)
        produce_numbers(broker.conf(), topic, range(20, 40))
        wait_for(lambda: set(seen) >= set(range(40)), 60, "the messages after the fence")
        # The new producer replays from the committed offsets (what the fenced transaction
        # held is processed again): consuming goes on until all is committed.
        wait_for(
            lambda: operator.eq(*committed_ends(broker.conf(), group, topic)),
            60,
            "the commits after the fence",
        )
    finally:
        consumer.shutdown()
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends


def test_a_held_retry_partition_moved_away_and_back_is_delivered_when_due(
    broker, make_topic, unique
):
    """Campaign issue 30 (long run, seed 2): librdkafka keeps an application's pause across
    unassign and assign, so a partition the consumer had paused, then lost, came back paused
    for good (3,527 records never processed). Here a retry partition is held (its head not
    due) when a plain consumer of the group takes it; once that one leaves, the retry copy
    must still be delivered."""
    topic, group, prefix = make_topic("push-held"), unique("push-held-g"), unique("__rmqh")
    produce_numbers(broker.conf(), topic, range(1))
    seen: list[int] = []

    def listener(msgs, context):
        seen.extend(m.reconsume_times for m in msgs)
        return (
            ConsumeConcurrentlyStatus.RECONSUME_LATER
            if msgs[0].reconsume_times == 0
            else ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        )

    consumer = start(
        broker, group, topic, prefix, listener, delay_levels=(HELD_S,), max_reconsume_times=1
    )
    other = None
    try:
        retry = consumer.retry_topics[0]
        # Precondition, not the claim: its copy read and held (paused) until due.
        wait_for(
            lambda: consumer._loop is not None and (retry, 0) in consumer._loop._held,
            60,
            "the retry copy held",
        )
        other = confluent_kafka.Consumer(
            group_conf(
                broker.conf(
                    **{
                        "group.id": group,
                        "partition.assignment.strategy": "cooperative-sticky",
                        "enable.auto.commit": False,
                        "isolation.level": "read_committed",
                    }
                )
            )
        )
        other.subscribe([retry])  # the group balances the retry partition over to it

        def moved() -> bool:
            other.poll(0.1)
            return bool(other.assignment())

        wait_for(moved, 60, "the retry partition moved to the other member")
        assert seen == [0]  # not due yet: neither delivered early nor by the other
        other.close()
        other = None
        wait_for(
            lambda: seen == [0, 1],
            HELD_S + 60,
            "the retry copy delivered once due",
            details=lambda: f"deliveries {seen}, counts {consumer.counts}",
        )
    finally:
        if other is not None:
            other.close()
        consumer.shutdown()
    committed, ends = committed_ends(broker.conf(), group, topic)
    assert committed == ends
