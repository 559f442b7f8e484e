"""The asyncio case (issue 20): ``AsyncTransactionProducer`` with :data:`AIO_CONCURRENCY`
tasks on one event loop against ``TransactionProducer`` with as many threads, each making
``calls_per_thread`` calls of ``send_message_in_transaction`` (calls returned per second),
and the loop's lag meanwhile: how late a task that sleeps :data:`TICK_S` wakes up, which is
what every other coroutine of a service waits when something holds the loop."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid

from benchmarks.common import CASE_TIMEOUT_S, WARM_UP, BenchSettings
from rmq_semantics.aio import AsyncTransactionProducer
from rmq_semantics.message import Message
from rmq_semantics.topics import ensure_topics
from rmq_semantics.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
)

__all__ = ["AIO_CONCURRENCY", "TICK_S", "bench_aio"]

AIO_CONCURRENCY = 32  # tasks on the loop, and threads for the sync producer
TICK_S = 0.005  # the lag probe's sleep


class _SyncCommit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


class _AsyncCommit(TransactionListener):
    # The asyncio producer awaits a listener's async def methods (the base types plain ones).
    async def execute_local_transaction(self, msg, arg):  # type: ignore[override]  # async listener
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, msg):  # type: ignore[override]  # async listener
        return LocalTransactionState.COMMIT_MESSAGE


def _sync_rate(conf: dict, prefix: str, s: BenchSettings, topic: str) -> float:
    value, errors = os.urandom(s.size), []
    with TransactionProducer(
        conf,
        producer_group="bench-aio-sync",
        listener=_SyncCommit(),
        topic_prefix=prefix,
        half_partitions=s.partitions,
    ) as producer:
        for _ in range(WARM_UP // AIO_CONCURRENCY + 1):
            producer.send_message_in_transaction(Message(topic, value))

        def caller() -> None:
            try:
                for _ in range(s.calls_per_thread):
                    producer.send_message_in_transaction(Message(topic, value))
            except Exception as exc:  # reported after the run, not lost in a thread
                errors.append(exc)

        callers = [
            threading.Thread(target=caller, daemon=True, name=f"bench-aio-{n}")
            for n in range(AIO_CONCURRENCY)
        ]
        start = time.monotonic()
        for c in callers:
            c.start()
        for c in callers:
            c.join(CASE_TIMEOUT_S)
        elapsed = time.monotonic() - start
    if errors:
        raise RuntimeError(f"aio (sync): {len(errors)} callers failed: {errors[0]!r}")
    return AIO_CONCURRENCY * s.calls_per_thread / elapsed


async def _async_run(
    conf: dict, prefix: str, s: BenchSettings, topic: str
) -> tuple[float, list[float]]:
    value, lags = os.urandom(s.size), []
    stop = asyncio.Event()

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            began = loop.time()
            await asyncio.sleep(TICK_S)
            lags.append((loop.time() - began - TICK_S) * 1000)

    async with AsyncTransactionProducer(
        conf,
        producer_group="bench-aio-async",
        listener=_AsyncCommit(),
        topic_prefix=prefix,
        half_partitions=s.partitions,
    ) as producer:
        for _ in range(WARM_UP // AIO_CONCURRENCY + 1):
            await producer.send_message_in_transaction(Message(topic, value))

        async def caller() -> None:
            for _ in range(s.calls_per_thread):
                await producer.send_message_in_transaction(Message(topic, value))

        prober = asyncio.create_task(probe())
        start = time.monotonic()
        await asyncio.wait_for(
            asyncio.gather(*(caller() for _ in range(AIO_CONCURRENCY))), CASE_TIMEOUT_S
        )
        elapsed = time.monotonic() - start
        stop.set()
        await prober
    return AIO_CONCURRENCY * s.calls_per_thread / elapsed, lags


def bench_aio(conf: dict, prefix: str, s: BenchSettings) -> dict:
    """One run: calls/s of both producers at the same concurrency, their ratio, and the
    loop lag samples (ms) of the async run."""
    topic = f"bench-aio-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    sync_rate = _sync_rate(conf, prefix, s, topic)
    async_rate, lags = asyncio.run(_async_run(conf, prefix, s, topic))
    return {
        "aio_sync_calls_per_s": sync_rate,
        "aio_async_calls_per_s": async_rate,
        "aio_ratio": async_rate / sync_rate if sync_rate else float("nan"),
        "aio_loop_lag_ms": {"samples": lags, "tick_ms": TICK_S * 1000},
        "aio_concurrency": AIO_CONCURRENCY,
    }
