"""The timers case: how late timer messages become visible at a steady due rate.

The window's messages are scheduled with ``Producer.send`` from several caller threads before
the window opens, each at least :data:`LEAD_MS` ahead of its time, so that ``s.rate`` of them
fall due per second for ``s.latency_seconds`` whatever rate the sends reach; the bench's
coordinator moves them through the level topics and delivers them. A read_committed
consumer of the real topic, in a process of its own, notes each record's wall-clock arrival
against the due time the sender wrote in a header of its own: lateness = due -> visible.
One run is this function; the runner repeats it."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from benchmarks.common import CASE_TIMEOUT_S, BenchSettings
from rmq_semantics.consumed import headers_of
from rmq_semantics.message import Message
from rmq_semantics.producer import Producer
from rmq_semantics.topics import ensure_topics

__all__ = [
    "DUE_HEADER",
    "GOAL_P99_MS",
    "LEAD_MS",
    "bench_timers",
    "due_schedule",
    "lateness_ms",
]

#: How far ahead of its time each message is sent at least: a few seconds, so every message
#: passes through level topics and the coordinator's due-heap before it is due.
LEAD_MS = 3000
# The window's first message is due LEAD_MS after the sends' expected end, their expected
# length (at the warm-up's rate) taken this many times over.
SEND_MARGIN = 1.5
#: The sender's own header: the message's due time (epoch ms), read by the measuring consumer.
DUE_HEADER = "bench.due"
#: Issue 35's goal: lateness p99 <= 100 ms at 1,000 due messages/s.
GOAL_P99_MS = 100.0
# Messages due at once before the clock starts: clients connected, the topic's metadata
# known to the coordinator's producer, the level lanes' first reads done.
WARM_UP = 100
WARM_UP_AFTER_MS = 1500


def due_schedule(start_ms: int, rate: int, seconds: float, lead_ms: int = LEAD_MS) -> list[int]:
    """Due times (epoch ms) of ``rate * seconds`` messages: ``rate`` per second from
    ``start_ms + lead_ms`` on. Message ``i`` is sent ``lead_ms`` before its time."""
    count = int(rate * seconds)
    return [start_ms + lead_ms + (i * 1000) // rate for i in range(count)]


def lateness_ms(headers: list[tuple[str, bytes | None]], visible_ms: float) -> float | None:
    """Due -> visible (ms) of a consumed record, or None for one without the due header
    (a warm-up record)."""
    due = next((v for k, v in headers if k == DUE_HEADER), None)
    if not due or not due.isdigit():
        return None
    return visible_ms - int(due)


def _collect(conf: dict, topic: str, partitions: int, want: int, warmed: Any, out: Any) -> None:
    """The measuring process: consume ``topic`` until ``want`` timed records came; send back
    their lateness (ms). Wall clock: the due times are epoch ms of the same machine."""
    consumer = confluent_kafka.Consumer(
        {
            **conf,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign(
        [TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)]
    )
    late: list[float] = []
    warm = 0
    deadline = time.monotonic() + CASE_TIMEOUT_S
    try:
        while len(late) < want and time.monotonic() < deadline:
            first = consumer.poll(0.05)
            if first is None:
                continue
            for msg in [first, *consumer.consume(999, 0)]:
                if msg.error() is not None:
                    continue
                value = lateness_ms(headers_of(msg), time.time() * 1000)
                if value is None:
                    warm += 1
                    if warm == WARM_UP:
                        warmed.set()
                else:
                    late.append(value)
        out.send(late)
    finally:
        consumer.close()


def _send_all(
    producer: Producer, topic: str, dues: list[int], s: BenchSettings, timed: bool = True
) -> list[float]:
    """Send a message due at each of ``dues`` from ``s.latency_threads`` threads, as fast as
    they go, in due order (``timed``: with its due time in :data:`DUE_HEADER`); when each
    send returned (epoch ms). Raises once every caller is done if one of them failed."""
    threads = max(1, s.latency_threads)
    value = os.urandom(s.size)
    errors: list[BaseException] = []
    sent = [0.0] * len(dues)

    def caller(first: int) -> None:
        try:
            for i in range(first, len(dues), threads):
                producer.send(
                    Message(
                        topic,
                        value,
                        key=str(i % 1000),
                        headers={DUE_HEADER: str(dues[i]).encode()} if timed else None,
                        deliver_at_ms=dues[i],
                    )
                )
                sent[i] = time.time() * 1000
        except Exception as exc:  # reported after the run, not lost in a thread
            errors.append(exc)

    callers = [
        threading.Thread(target=caller, args=(n,), daemon=True, name=f"bench-timer-{n}")
        for n in range(threads)
    ]
    for c in callers:
        c.start()
    for c in callers:
        c.join(CASE_TIMEOUT_S)
    if errors:
        raise RuntimeError(f"timers: {len(errors)} callers failed: {errors[0]!r}")
    return sent


def bench_timers(conf: dict, prefix: str, s: BenchSettings) -> dict:
    """One run: lateness samples (ms) of ``s.rate`` due messages/s for ``s.latency_seconds``
    through the coordinator of ``prefix``, with the rate the scheduling sends achieved."""
    import multiprocessing

    topic = f"bench-timer-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    ctx = multiprocessing.get_context("spawn")  # never fork a process with librdkafka
    warmed = ctx.Event()
    results, child_end = ctx.Pipe(duplex=False)
    count = int(s.rate * s.latency_seconds)
    collector = ctx.Process(
        target=_collect,
        daemon=True,
        args=(conf, topic, s.partitions, count, warmed, child_end),
    )
    collector.start()
    late: list[float] = []
    try:
        with Producer(conf, topic_prefix=prefix) as producer:
            warm = [int(time.time() * 1000) + WARM_UP_AFTER_MS] * WARM_UP
            started = time.monotonic()
            _send_all(producer, topic, warm, dataclasses.replace(s, size=1), timed=False)
            send_rate = WARM_UP / max(1e-3, time.monotonic() - started)
            if not warmed.wait(CASE_TIMEOUT_S):
                raise RuntimeError(f"timers: the {WARM_UP} warm-up messages never arrived")
            # Every message is sent before the window opens, at least LEAD_MS before its
            # time: the sends take count / send_rate, with a margin for a slower stretch.
            ahead_ms = LEAD_MS + int(SEND_MARGIN * 1000 * count / send_rate)
            dues = due_schedule(int(time.time() * 1000), s.rate, s.latency_seconds, ahead_ms)
            started = time.monotonic()
            sent = _send_all(producer, topic, dues, s)
            achieved = count / max(1e-3, time.monotonic() - started)
        if results.poll(CASE_TIMEOUT_S):
            late = results.recv()
    finally:
        collector.join(10)
        if collector.is_alive():
            collector.kill()
    return {
        "timer_lateness_ms": {
            "samples": late,
            "due_msgs_per_s": s.rate,
            "lead_ms": LEAD_MS,
            "first_due_after_ms": ahead_ms,
            # Sends that returned less than LEAD_MS before their time (0 when the margin held).
            "sent_late": sum(1 for at, due in zip(sent, dues, strict=True) if at > due - LEAD_MS),
            "scheduled_msgs_per_s": achieved,
            "threads": max(1, s.latency_threads),
            "expected": count,
        }
    }
