"""The ``threads`` case: N threads each calling ``send_message_in_transaction`` in a loop,
as a service does with one transaction per request (issue 13). It reports calls returned
per second, promoted records seen per second by a read_committed consumer, and the
per-call latency."""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid

from benchmarks.collector import Collector
from benchmarks.common import CASE_TIMEOUT_S, WARM_UP, BenchSettings, percentile
from benchmarks.machine import process_cpu_s
from rmq_semantics.message import Message
from rmq_semantics.topics import ensure_topics
from rmq_semantics.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics.transaction_api import Transaction

__all__ = ["bench_threads"]


class _CommitListener(TransactionListener):
    def execute_local_transaction(
        self, msg: Message | Transaction, arg: object
    ) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message | Transaction) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def _one_run(
    conf: dict,
    prefix: str,
    s: BenchSettings,
    threads: int,
    coordinator_pid: int | None,
    broker_pid: int | None,
) -> dict:
    topic = f"bench-thr-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    per_thread = s.calls_per_thread
    total = threads * per_thread
    collector = Collector(conf, topic, s.partitions, total, warm_up=WARM_UP)
    collector.start()
    value = os.urandom(s.size)
    call_ms: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    # The user's conf as they would pass it: no tuning of linger or batching here.
    with TransactionProducer(
        conf,
        producer_group=f"bench-thr-{threads}",
        listener=_CommitListener(),
        topic_prefix=prefix,
        half_partitions=s.partitions,
    ) as producer:
        producer.send_messages_in_transaction([Message(topic, value) for _ in range(WARM_UP)])
        collector.wait_warm()
        go = threading.Event()

        def worker(n: int) -> None:
            go.wait(CASE_TIMEOUT_S)
            out = call_ms[n]
            try:
                for i in range(per_thread):
                    began = time.monotonic()
                    producer.send_message_in_transaction(Message(topic, value, key=f"{n}-{i}"))
                    out.append((time.monotonic() - began) * 1000)
            except Exception as exc:  # reported after the run, not lost in a thread
                errors.append(exc)

        workers = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(threads)]
        for w in workers:
            w.start()
        pids = (None, coordinator_pid, *([broker_pid] if broker_pid else []))
        cpu_before = [process_cpu_s(pid) for pid in pids]
        start = time.monotonic()
        go.set()
        for w in workers:
            w.join(CASE_TIMEOUT_S)
        confirmed_at = time.monotonic()
        producer.flush(60)
        collector.join(CASE_TIMEOUT_S)
        cpu_after = [process_cpu_s(pid) for pid in pids]
        wall = time.monotonic() - start
    if errors:
        raise RuntimeError(f"threads={threads}: {len(errors)} calls failed: {errors[0]!r}")
    latencies = [ms for per in call_ms for ms in per]
    spent = [after - before for after, before in zip(cpu_after, cpu_before, strict=True)]
    return {
        "confirmed_per_s": len(latencies) / (confirmed_at - start),
        "consumed_per_s": collector.measured / ((collector.done_at or time.monotonic()) - start),
        "consumed": collector.measured,
        "calls": len(latencies),
        # CPU, not wall time, per 1,000 calls: what sizing a deployment needs.
        "producer_cpu_s_per_1000": spent[0] * 1000 / total,
        "coordinator_cpu_s_per_1000": spent[1] * 1000 / total,
        # The broker's share (None on an external broker): with the two above, where the
        # machine's cores went, so the ceiling of this case can be computed, not guessed.
        "broker_cpu_s_per_1000": spent[2] * 1000 / total if broker_pid else None,
        "cores_busy": sum(spent) / wall,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
    }


def _summary(runs: list[dict]) -> dict:
    out: dict = {"runs": runs}
    for key in (
        "confirmed_per_s",
        "consumed_per_s",
        "p50_ms",
        "p99_ms",
        "producer_cpu_s_per_1000",
        "coordinator_cpu_s_per_1000",
        "broker_cpu_s_per_1000",
        "cores_busy",
    ):
        values = [r[key] for r in runs if r[key] is not None]
        if not values:
            continue
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def bench_threads(
    conf: dict,
    prefix: str,
    s: BenchSettings,
    log=print,
    coordinator_pid: int | None = None,
    broker_pid: int | None = None,
) -> dict:
    """``{"threads": {"32": {"confirmed_per_s": {"median", "min", "max"}, ..., "runs"}}}``."""
    results: dict = {}
    for threads in s.thread_counts:
        runs = []
        for n in range(s.repeat):
            run = _one_run(conf, prefix, s, threads, coordinator_pid, broker_pid)
            log(
                f"  threads={threads} run {n + 1}/{s.repeat}: "
                f"{run['confirmed_per_s']:.0f} confirmed/s, {run['consumed_per_s']:.0f} "
                f"consumed/s, p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms, CPU s "
                f"per 1,000: producer {run['producer_cpu_s_per_1000']:.2f}, coordinator "
                f"{run['coordinator_cpu_s_per_1000']:.2f}, broker "
                f"{run['broker_cpu_s_per_1000'] or float('nan'):.2f}; "
                f"{run['cores_busy']:.2f} cores busy"
            )
            runs.append(run)
        results[str(threads)] = _summary(runs)
    return {"threads": results}
