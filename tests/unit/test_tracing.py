"""The tracing hooks without a broker: nothing (no header, no span) without an SDK; with one,
the half's headers carry the current context, ``promote`` spans the pending time in the
producer's trace, a check's span is linked to it; the coordinator's OTEL_* switch."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordinator.otel import configure_from_env, wanted
from rmq_semantics import tracing
from tests.fuzz import generators as gen
from tests.otel_sdk import in_memory_spans, reset_tracing_globals


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    with in_memory_spans() as exporter:
        yield exporter


def test_without_an_sdk_nothing_is_written_or_made():
    reset_tracing_globals()
    assert not tracing.enabled()
    with tracing.span("send half") as current:
        assert current is None
        assert tracing.traced_headers([("app", b"1")]) == [("app", b"1")]
    tracing.promote_span(
        [("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")], "orders", "t", 1, 2
    )  # returns at once


def test_the_half_carries_the_current_context_and_promote_spans_the_pending_time(exporter):
    with tracing.span("send half") as half:
        headers = tracing.traced_headers([("app", b"1")])
    names = [name for name, _ in headers]
    assert names[:2] == ["app", "traceparent"]
    traceparent = dict(headers)["traceparent"].decode()
    assert traceparent.split("-")[1] == f"{half.get_span_context().trace_id:032x}"
    tracing.promote_span(headers, "orders", "txn-1", born_ms=1_000, promoted_ms=1_250)
    [promote] = [s for s in exporter.get_finished_spans() if s.name == "promote"]
    assert promote.parent.span_id == half.get_span_context().span_id
    assert (promote.start_time, promote.end_time) == (1_000 * 10**6, 1_250 * 10**6)
    assert promote.attributes["rmq.pending_ms"] == 250
    assert promote.attributes["messaging.destination.name"] == "orders"


def test_an_existing_traceparent_is_kept_and_a_record_without_one_gets_no_promote_span(exporter):
    theirs = [("traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01")]
    with tracing.span("send half"):
        assert tracing.traced_headers(theirs) == theirs
    tracing.promote_span([("app", b"1")], "orders", "t", 1, 2)
    assert [s.name for s in exporter.get_finished_spans()] == ["send half"]


def test_a_check_span_is_a_new_trace_linked_to_the_transactions(exporter):
    with tracing.span("send half") as half:
        headers = tracing.traced_headers([])
        with tracing.check_span(headers, "orders", "txn-1", 2) as check:
            pass
    origin = half.get_span_context()
    assert check.get_span_context().trace_id != origin.trace_id
    [link] = check.links
    assert link.context.span_id == origin.span_id


def test_forged_trace_headers_make_a_span_of_their_own_and_never_raise(exporter):
    # The fuzzer's odd traceparent/tracestate values, read by the coordinator (promote) and
    # the consumers (check, process) with an SDK installed.
    rng = random.Random(20)
    ctx = gen.Ctx()
    for _ in range(300):
        headers = [
            (name, gen.HEADER_VALUES[name](rng, ctx))
            for name in ("traceparent", "tracestate")
            if rng.random() < 0.8
        ]
        tracing.promote_span(headers, "orders", "t", 1_000, 2_000)
        with tracing.check_span(headers, "orders", "t", 1), tracing.process_span(headers, "orders"):
            pass
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans].count("process orders") == 300
    assert [s.name for s in spans].count("check local transaction") == 300


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
    ],
)
def test_the_coordinator_exports_spans_only_when_otel_variables_say_so(env, expected):
    assert wanted(env) is expected


def test_the_coordinator_installs_an_otlp_provider_from_the_variables():
    reset_tracing_globals()
    try:
        assert configure_from_env({}) is None and not tracing.enabled()
        provider = configure_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
        assert provider is not None and tracing.enabled()
        provider.shutdown()
    finally:
        reset_tracing_globals()
