"""The OpenTelemetry SDK for the tests that look at spans: installed with an in-memory
exporter for one test or module, and the API's no-op proxy put back afterwards, so every
other test runs as a user without an SDK does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_tracing_globals() -> None:
    # What opentelemetry-test-utils' reset_trace_globals does: the API's proxy again.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextmanager
def in_memory_spans() -> Iterator[InMemorySpanExporter]:
    """A global SDK provider whose finished spans the yielded exporter holds."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reset_tracing_globals()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        reset_tracing_globals()
