"""The orderly consumer case: its throughput against a plain consumer's, and how long a
survivor takes to consume after the consumer holding every queue lock is killed -9."""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from benchmarks.common import CASE_TIMEOUT_S, BenchSettings, fill, started_rate
from rmq_semantics.orderly.consumer import FETCH_QUEUE_BACKOFF_MS
from rmq_semantics.topics import ensure_topics

# The source checkout holding this package.
CHECKOUT = Path(__file__).resolve().parents[1]

__all__ = ["ORDERLY_BATCH", "bench_orderly"]

ORDERLY_BATCH = 32
# Short leases so the takeover case finishes in seconds (recorded in the JSON).
TAKEOVER_LEASE_MS, TAKEOVER_RENEW_MS, TAKEOVER_SESSION_MS = 6000, 1500, 6000


def _fill(conf: dict, topic: str, count: int, size: int) -> None:
    fill(conf, topic, count, size, key=lambda i: f"key-{i % 100}")


class _CountingListener:
    """The listener both consumers of the orderly case call. The rate is taken between the
    10th and the 90th percent of ``count``: steady state, without start-up (group join,
    first lock grants) or the last partition's tail."""

    def __init__(self, count: int) -> None:
        self.lock = threading.Lock()
        self.count = count
        self.seen = 0
        self.marks: dict[int, float] = {}

    def add(self, n: int) -> None:
        with self.lock:
            self.seen += n
            for pct in (10, 90):
                if pct not in self.marks and self.seen >= self.count * pct // 100:
                    self.marks[pct] = time.monotonic()

    def __call__(self, msgs: list, context: Any = None) -> Any:
        from rmq_semantics.orderly import ConsumeOrderlyStatus

        self.add(len(msgs))
        return ConsumeOrderlyStatus.SUCCESS

    def rate(self) -> float:
        if 90 not in self.marks:
            return 0.0
        return self.count * 0.8 / max(1e-9, self.marks[90] - self.marks[10])


def _next_offsets(msgs: list) -> list[TopicPartition]:
    """Where each partition of ``msgs`` resumes: found per run of one partition (a fetch
    hands them over in runs), as cheaply as the orderly consumer splits its fetch."""
    ends, last, topic, partition = [], None, None, -1
    for msg in msgs:
        if msg.partition() != partition or msg.topic() != topic:
            if last is not None:
                ends.append(last)
            topic, partition = msg.topic(), msg.partition()
        last = msg
    ends.append(last)
    return [TopicPartition(m.topic(), m.partition(), m.offset() + 1) for m in ends]


def _plain_rate(
    conf: dict, topic: str, count: int, batch: int | None, store_after: bool = True
) -> float:
    """A plain consumer with auto commit. With ``batch``, it hands batches of that size to
    the same listener as the orderly consumer, as an application would; without, it only
    counts what librdkafka hands over (an upper bound). ``store_after`` gives it the
    orderly consumer's commit semantics (at least once): the offsets of a batch are stored
    for the next auto commit only after the listener returned, librdkafka's documented
    pattern; without it, librdkafka stores each offset as it hands the message over, before
    the listener ran (a crash then loses what was handed over but not processed)."""
    store_after = store_after and batch is not None
    consumer = confluent_kafka.Consumer(
        {
            **conf,
            "group.id": f"bench-plain-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.offset.store": not store_after,
            # The orderly consumer's own default (librdkafka's 1 s backoff on a full local
            # queue stalls a backlog): a fair comparison gives the plain side the same.
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    consumer.subscribe([topic])
    listener = _CountingListener(count)
    deadline = time.monotonic() + CASE_TIMEOUT_S
    try:
        while listener.seen < count and time.monotonic() < deadline:
            msgs = [m for m in consumer.consume(batch or 500, 0.1) if m.error() is None]
            if not msgs:
                continue
            if not batch:
                listener.add(len(msgs))
                continue
            listener(msgs, None)
            if store_after:
                consumer.store_offsets(offsets=_next_offsets(msgs))
        return listener.rate()
    finally:
        consumer.close()


def _orderly_rate(conf: dict, prefix: str, topic: str, count: int) -> float:
    from rmq_semantics.orderly import OrderlyConsumer

    listener = _CountingListener(count)
    consumer = OrderlyConsumer(
        {**conf, "group.id": f"bench-orderly-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"},
        listener=listener,
        topic_prefix=prefix,
        batch_size=ORDERLY_BATCH,
    )
    return started_rate(consumer, topic, listener, count)


def _takeover_s(conf: dict, bootstrap: str, prefix: str, s: BenchSettings) -> float:
    """Kill -9 the consumer holding every queue lock; time until a survivor consumes."""
    from rmq_semantics.orderly import ConsumeOrderlyStatus, OrderlyConsumer

    topic = f"bench-takeover-{uuid.uuid4().hex[:8]}"
    group = f"bench-takeover-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    victim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.orderly_child",
            bootstrap,
            prefix,
            group,
            topic,
            str(TAKEOVER_LEASE_MS),
            str(TAKEOVER_RENEW_MS),
            str(TAKEOVER_SESSION_MS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=CHECKOUT,  # where ``-m benchmarks...`` finds the bench, which is not installed
    )
    got = threading.Event()
    survivor = None
    try:
        if victim.stdout is None or not victim.stdout.readline().startswith("LOCKED"):
            raise RuntimeError("the victim consumer never locked its queues")
        killed_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)

        def listener(msgs: list, context: Any) -> ConsumeOrderlyStatus:
            got.set()
            return ConsumeOrderlyStatus.SUCCESS

        survivor = OrderlyConsumer(
            {
                **conf,
                "group.id": group,
                "session.timeout.ms": TAKEOVER_SESSION_MS,
                "auto.offset.reset": "earliest",
            },
            listener=listener,
            topic_prefix=prefix,
            lock_lease_ms=TAKEOVER_LEASE_MS,
            lock_renew_ms=TAKEOVER_RENEW_MS,
        )
        survivor.subscribe([topic])
        survivor.start()
        _fill(conf, topic, 50, 100)
        got.wait(CASE_TIMEOUT_S)
        return time.monotonic() - killed_at
    finally:
        if victim.poll() is None:
            victim.kill()
        if survivor is not None:
            survivor.shutdown()


def bench_orderly(conf: dict, bootstrap: str, prefix: str, s: BenchSettings) -> dict:
    try:
        import rmq_semantics.orderly  # noqa: F401 - the ordered-messages part may be absent
    except ImportError:
        return {}
    topic = f"bench-orderly-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    _fill(conf, topic, s.count, s.size)
    plain_runs, auto_store_runs, count_only_runs, orderly_runs = [], [], [], []
    _plain_rate(conf, topic, s.count, ORDERLY_BATCH)  # warm-up
    for _ in range(s.repeat):
        plain_runs.append(_plain_rate(conf, topic, s.count, ORDERLY_BATCH))
        orderly_runs.append(_orderly_rate(conf, prefix, topic, s.count))
        auto_store_runs.append(_plain_rate(conf, topic, s.count, ORDERLY_BATCH, store_after=False))
        count_only_runs.append(_plain_rate(conf, topic, s.count, None))
    plain, orderly = statistics.median(plain_runs), statistics.median(orderly_runs)
    return {
        "plain_consumer_msgs_per_s": plain,
        "orderly_msgs_per_s": orderly,
        "orderly_ratio": orderly / plain,
        "orderly_batch_size": ORDERLY_BATCH,
        "orderly_runs": orderly_runs,
        "plain_consumer_runs": plain_runs,
        "plain_consumer_mode": f"auto commit of offsets stored after the listener "
        f"returned (at least once, like the orderly consumer), "
        f"the same listener, batches of {ORDERLY_BATCH}",
        "plain_consumer_auto_store_msgs_per_s": statistics.median(auto_store_runs),
        "plain_consumer_count_only_msgs_per_s": statistics.median(count_only_runs),
        "takeover_s": _takeover_s(conf, bootstrap, prefix, s),
        "takeover_settings": {
            "lock_lease_ms": TAKEOVER_LEASE_MS,
            "lock_renew_ms": TAKEOVER_RENEW_MS,
            "session_timeout_ms": TAKEOVER_SESSION_MS,
        },
    }
