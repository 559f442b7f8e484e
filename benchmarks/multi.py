"""The multi-message case (issue 18): ``send_transaction`` of 10 messages each, from a few
caller threads at saturation, measured as promoted messages per second at a read_committed
consumer and the transactions per second they make."""

from __future__ import annotations

import os
import threading
import time
import uuid

from benchmarks.collector import Collector
from benchmarks.common import CASE_TIMEOUT_S, WARM_UP, BenchSettings
from benchmarks.txn import NoopListener
from rmq_semantics.message import Message
from rmq_semantics.topics import ensure_topics
from rmq_semantics.transaction import TransactionProducer

__all__ = ["MULTI_SIZE", "MULTI_THREADS", "bench_multi"]

MULTI_SIZE = 10  # messages per transaction
# Each call waits for its members' acknowledgement: a few callers keep the pipe full.
MULTI_THREADS = 8


def bench_multi(conf: dict, prefix: str, s: BenchSettings, count: int) -> dict:
    """``count`` messages (rounded down to whole transactions, at least one) as transactions
    of :data:`MULTI_SIZE`; ``multi_msgs_per_s`` and ``multi_txns_per_s``."""
    topic = f"bench-multi-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    transactions = max(1, count // MULTI_SIZE)
    warm = max(1, WARM_UP // MULTI_SIZE)
    collector = Collector(
        conf, topic, s.partitions, transactions * MULTI_SIZE, warm_up=warm * MULTI_SIZE
    )
    collector.start()
    value = os.urandom(s.size)
    errors: list[BaseException] = []

    def members(n: int) -> list[Message]:
        return [Message(topic, value, key=f"{n}-{i}") for i in range(MULTI_SIZE)]

    with TransactionProducer(
        conf,
        producer_group="bench-multi",
        listener=NoopListener(),
        topic_prefix=prefix,
        half_partitions=s.partitions,
    ) as producer:
        for n in range(warm):
            producer.send_transaction(members(n))
        collector.wait_warm()
        start = time.monotonic()

        def caller(first: int) -> None:
            try:
                for n in range(first, transactions, MULTI_THREADS):
                    producer.send_transaction(members(n))
            except Exception as exc:  # reported after the run, not lost in a thread
                errors.append(exc)

        callers = [
            threading.Thread(target=caller, args=(n,), daemon=True, name=f"bench-multi-{n}")
            for n in range(MULTI_THREADS)
        ]
        for c in callers:
            c.start()
        for c in callers:
            c.join(CASE_TIMEOUT_S)
        producer.flush(60)
        collector.join(CASE_TIMEOUT_S)
    if errors:
        raise RuntimeError(f"multi: {len(errors)} callers failed: {errors[0]!r}")
    rate = collector.measured / ((collector.done_at or time.monotonic()) - start)
    return {"multi_msgs_per_s": rate, "multi_txns_per_s": rate / MULTI_SIZE}
