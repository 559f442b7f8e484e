"""The tracing case (issue 20): what the producer's tracing hooks cost without an
OpenTelemetry SDK, the default. One ``send_message_in_transaction`` runs four span hooks,
the context injection and the transaction-id tag; with no SDK each returns at once. They are
timed alone here (:data:`HOOK_ROUNDS` rounds, the same calls the producer makes) against one
call of the producer from one thread: a whole call's difference would be lost in its
spread, so the hooks are measured where they can be."""

from __future__ import annotations

import os
import time
import uuid

from opentelemetry.trace import SpanKind

from benchmarks.common import WARM_UP, BenchSettings
from rmq_semantics import tracing
from rmq_semantics.message import Message
from rmq_semantics.topics import ensure_topics
from rmq_semantics.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
)

__all__ = ["HOOK_ROUNDS", "bench_tracing"]

HOOK_ROUNDS = 100_000
SEQUENTIAL_CALLS = 500  # one thread's calls, for the call's own time


class _Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def _one_call_of_hooks(msg: Message, half: str, op: str) -> None:
    # The hooks of TransactionProducer.send_message_in_transaction, in its order.
    with tracing.span("send transaction", msg.topic):
        with tracing.span("send half", half, kind=SpanKind.PRODUCER):
            tracing.traced_messages([msg])
            tracing.name_transaction("txn")
        with tracing.span("local transaction", msg.topic, "process", "txn"):
            pass
        with tracing.span(
            "end transaction", op, "send", "txn", kind=SpanKind.PRODUCER, state="COMMIT_MESSAGE"
        ):
            pass


def bench_tracing(conf: dict, prefix: str, s: BenchSettings) -> dict:
    """One run: the hooks' µs per call without an SDK, one call's µs, and the share."""
    if tracing.enabled():
        raise RuntimeError(
            "tracing: an OpenTelemetry SDK is installed in the bench process; "
            "this case measures the hooks without one"
        )
    topic = f"bench-tracing-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    msg = Message(topic, os.urandom(s.size))
    start = time.perf_counter()
    for _ in range(HOOK_ROUNDS):
        _one_call_of_hooks(msg, "half", "op")
    hooks_us = (time.perf_counter() - start) / HOOK_ROUNDS * 1e6
    with TransactionProducer(
        conf,
        producer_group="bench-tracing",
        listener=_Commit(),
        topic_prefix=prefix,
        half_partitions=s.partitions,
    ) as producer:
        for _ in range(WARM_UP):
            producer.send_message_in_transaction(msg)
        start = time.perf_counter()
        for _ in range(SEQUENTIAL_CALLS):
            producer.send_message_in_transaction(msg)
        call_us = (time.perf_counter() - start) / SEQUENTIAL_CALLS * 1e6
    return {
        "tracing_hooks_us": hooks_us,
        "tracing_call_us": call_us,
        "tracing_share_pct": 100 * hooks_us / call_us,
    }
