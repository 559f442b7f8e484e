"""OpenTelemetry traces through promotion, on the real broker: one transaction is one trace
holding the producer's spans (``send half``, ``local transaction``, ``end transaction``), the
coordinator's ``promote`` (from the birth to the promotion) and the consumer's span, made
from the promoted record's headers; a back-check's span is linked to that trace.

The spans are collected in-process with the SDK's in-memory exporter; the coordinator's
``Server`` runs in a thread of the test process, so its spans land there too. The SDK is
installed for this module only: the API's no-op provider is put back afterwards, so the
other tests run without one, as a user without an SDK does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from rmq_semantics import AsyncTransactionProducer, Message, TransactionProducer
from rmq_semantics import LocalTransactionState as S
from rmq_semantics.tracing import process_span
from tests.integration.txn_helpers import FAST, ScriptedListener, ThreadCoordinator, wait_for
from tests.otel_sdk import in_memory_spans

pytestmark = pytest.mark.integration

PRODUCER_SPANS = ("send transaction", "send half", "local transaction", "end transaction")


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    with in_memory_spans() as exporter:
        yield exporter


def _consume_one(conf: dict, topic: str, group: str):
    consumer = Consumer(
        {
            **conf,
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    try:
        return wait_for(
            lambda: next((m for m in consumer.consume(10, 0.5) if m.error() is None), None),
            60,
            "the promoted record",
        )
    finally:
        consumer.close()


def _named(exporter: InMemorySpanExporter, trace_id: int | None = None) -> dict:
    return {
        s.name: s
        for s in exporter.get_finished_spans()
        if trace_id is None or s.context.trace_id == trace_id
    }


def _promoted(exporter: InMemorySpanExporter, trace_id: int) -> dict | None:
    """The spans of the trace once the coordinator's ``promote`` span is among them."""
    found = _named(exporter, trace_id)
    return found if "promote" in found else None


def test_one_transaction_is_one_trace_from_send_to_consume(broker, make_topic, unique, exporter):
    exporter.clear()
    prefix = unique("tr").replace("-", "")
    topic = make_topic("traced")
    conf = broker.conf()
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    with (
        ThreadCoordinator(conf, topic_prefix=prefix),
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        result = producer.send_message_in_transaction(Message(topic, b"order-1"))
        record = _consume_one(conf, topic, unique("reader"))
        with process_span(record.headers(), record.topic()):
            pass  # the application handles the event here
        half = _named(exporter)["send half"]
        spans = wait_for(lambda: _promoted(exporter, half.context.trace_id), 30, "the promote span")
    expected = {*PRODUCER_SPANS, "promote", f"process {topic}"}
    assert expected <= set(spans), sorted(spans)
    root = spans["send transaction"]
    assert {spans[n].parent.span_id for n in PRODUCER_SPANS[1:]} == {root.context.span_id}
    # The coordinator's and the consumer's spans hang off the half record's context.
    assert spans["promote"].parent.span_id == half.context.span_id
    assert spans[f"process {topic}"].parent.span_id == half.context.span_id
    promote = spans["promote"]
    assert promote.kind is SpanKind.PRODUCER
    assert promote.attributes["messaging.system"] == "kafka"
    assert promote.attributes["messaging.destination.name"] == topic
    assert promote.attributes["messaging.message.conversation_id"] == result.transaction_id
    # From the birth time (the record's CreateTime) to the promotion: the pending time.
    assert promote.start_time == record.timestamp()[1] * 1_000_000
    assert promote.end_time >= promote.start_time
    assert (
        dict(record.headers())["traceparent"].decode().split("-")[1]
        == f"{half.context.trace_id:032x}"
    )


def test_a_back_check_runs_in_a_span_linked_to_the_transactions_trace(
    broker, make_topic, unique, exporter
):
    exporter.clear()
    prefix = unique("tc").replace("-", "")
    topic = make_topic("traced-check")
    conf = broker.conf()
    listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.COMMIT_MESSAGE)
    with (
        ThreadCoordinator(conf, topic_prefix=prefix),
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        producer.send_message_in_transaction(Message(topic, b"order-2"))
        half = _named(exporter)["send half"]
        check = wait_for(
            lambda: _named(exporter).get("check local transaction"), 60, "the check span"
        )
        wait_for(
            lambda: "promote" in _named(exporter, half.context.trace_id), 30, "the promote span"
        )
    assert check.context.trace_id != half.context.trace_id  # a trace of its own...
    assert [link.context.trace_id for link in check.links] == [half.context.trace_id]
    assert check.attributes["rmq.check_times"] == 1  # ... linked to the transaction's


def test_the_async_producer_makes_the_same_trace(broker, make_topic, unique, exporter):
    exporter.clear()
    prefix = unique("ta").replace("-", "")
    topic = make_topic("traced-async")
    conf = broker.conf()

    class AsyncListener:
        async def execute_local_transaction(self, msg, arg):
            return S.COMMIT_MESSAGE

        async def check_local_transaction(self, msg):
            return S.COMMIT_MESSAGE

    async def send() -> None:
        async with AsyncTransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=AsyncListener(),
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer:
            await producer.send_message_in_transaction(Message(topic, b"order-3"))

    with ThreadCoordinator(conf, topic_prefix=prefix):
        asyncio.run(send())
        half = _named(exporter)["send half"]
        spans = wait_for(lambda: _promoted(exporter, half.context.trace_id), 30, "the promote span")
    assert {*PRODUCER_SPANS, "promote"} <= set(spans), sorted(spans)
    root = spans["send transaction"]
    assert {spans[n].parent.span_id for n in PRODUCER_SPANS[1:]} == {root.context.span_id}
    assert spans["promote"].parent.span_id == half.context.span_id
