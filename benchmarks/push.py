"""The concurrent consumer case: a PushConsumer with a 1 ms I/O listener on 16 workers
against the plain consumer (confluent_kafka) calling the same listener in its poll loop,
over the same topic, in msgs/s (issue 17's bench)."""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import confluent_kafka

from benchmarks.common import CASE_TIMEOUT_S, BenchSettings, fill, started_rate
from benchmarks.orderly import _CountingListener, _next_offsets
from rmq_semantics.topics import ensure_topics

__all__ = ["PUSH_IO_S", "PUSH_MAX_COUNT", "PUSH_WORKERS", "bench_push"]

PUSH_WORKERS = 16
PUSH_IO_S = 0.001  # the listener's simulated I/O per message
# A plain consumer calling a 1 ms listener does at most 1,000 msgs/s: keep each run short.
PUSH_MAX_COUNT = 10000
BENCH_PREFIX = "__rmqbench"


class _IoListener(_CountingListener):
    """Sleeps ``PUSH_IO_S`` per message (blocking I/O, as a database call), then counts."""

    def __call__(self, msgs: list, context: Any = None) -> Any:
        from rmq_semantics.push import ConsumeConcurrentlyStatus

        for _ in msgs:
            time.sleep(PUSH_IO_S)
        self.add(len(msgs))
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


def _plain_rate(conf: dict, topic: str, count: int) -> float:
    """The plain consumer: one message at a time through the listener, its offset stored
    for auto commit after the listener returned (at least once, like the PushConsumer)."""
    consumer = confluent_kafka.Consumer(
        {
            **conf,
            "group.id": f"bench-plain-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.offset.store": False,
        }
    )
    consumer.subscribe([topic])
    listener = _IoListener(count)
    deadline = time.monotonic() + CASE_TIMEOUT_S
    try:
        while listener.seen < count and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            listener([msg])
            consumer.store_offsets(offsets=_next_offsets([msg]))
        return listener.rate()
    finally:
        consumer.close()


def _push_rate(conf: dict, topic: str, count: int) -> float:
    from rmq_semantics.push import PushConsumer

    listener = _IoListener(count)
    consumer = PushConsumer(
        {
            **conf,
            "group.id": f"bench-push-{uuid.uuid4().hex[:12]}",
            "auto.offset.reset": "earliest",
        },
        listener=listener,
        max_workers=PUSH_WORKERS,
        topic_prefix=BENCH_PREFIX,
        delay_levels=(1,),
    )
    return started_rate(consumer, topic, listener, count)


def bench_push(conf: dict, s: BenchSettings) -> dict:
    """msgs/s of both consumers (median of ``s.repeat`` runs) and their ratio."""
    count = min(s.count, PUSH_MAX_COUNT)
    topic = f"bench-push-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    fill(conf, topic, count, s.size, key=lambda i: f"key-{i % 100}")
    plain_runs, push_runs = [], []
    for _ in range(s.repeat):
        plain_runs.append(_plain_rate(conf, topic, count))
        push_runs.append(_push_rate(conf, topic, count))
    plain, push = statistics.median(plain_runs), statistics.median(push_runs)
    # Keys of their own: the orderly case reports its own plain consumer.
    return {
        "push_plain_msgs_per_s": plain,
        "push_msgs_per_s": push,
        "push_ratio": push / plain if plain else float("nan"),
        "push_workers": PUSH_WORKERS,
        "listener_io_ms": PUSH_IO_S * 1000,
        "messages": count,
        "push_runs": push_runs,
        "push_plain_runs": plain_runs,
        "push_plain_mode": "one message at a time through the same listener, offset "
        "stored after it returned (auto commit, at least once)",
    }
