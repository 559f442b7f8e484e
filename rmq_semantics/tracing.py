"""OpenTelemetry traces of the transactional flow, with ``opentelemetry-api`` only.

One ``send_message_in_transaction`` (or ``send_transaction``) makes a span of the call with
three children: ``send half`` (its context goes into the half records' ``traceparent`` /
``tracestate`` headers, the W3C format that OpenTelemetry's Kafka instrumentations read),
``local transaction`` (around the listener) and ``end transaction``. The headers are user
headers, so they stay on the promoted record; the coordinator adds a ``promote`` span to the
same trace that starts at the birth time and ends at the promotion, so the time the message
spent pending or being checked is visible, and a consumer's span made from the promoted
record's headers joins the producer's trace. A back-check runs in a span of its own, linked
to the transaction's trace (it happens much later, often in another process).

The SDK is the application's choice: until one is installed (a global TracerProvider set),
every function here returns at once and writes no header.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind

from rmq_semantics.message import Headers, Message

__all__ = [
    "TRACE_HEADERS",
    "attributes",
    "check_span",
    "enabled",
    "name_transaction",
    "process_span",
    "promote_span",
    "span",
    "traced_headers",
    "traced_messages",
]

TRACE_HEADERS = ("traceparent", "tracestate")
# What span() gives without an SDK: reentrant and stateless, so one serves every caller.
_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def _tracer() -> trace.Tracer:
    # Asked for each span, never kept: the application may install its SDK after import.
    return trace.get_tracer_provider().get_tracer("rmq_semantics")


def enabled() -> bool:
    """Whether an SDK is installed: the API's proxy provider means nobody listens."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def attributes(
    destination: str, operation: str, txn_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """OpenTelemetry's messaging conventions, plus ``rmq.*`` attributes of our own."""
    out: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.destination.name": destination,
        "messaging.operation.type": operation,
    }
    if txn_id:
        out["messaging.message.conversation_id"] = txn_id
    out.update({f"rmq.{k}": v for k, v in extra.items() if v is not None})
    return out


def span(
    name: str,
    destination: str = "",
    operation: str = "send",
    txn_id: str | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    **extra: Any,
) -> contextlib.AbstractContextManager[Any]:
    """A child of the current span with :func:`attributes`, current inside the block (which
    gets the span); without an SDK a shared do-nothing block, not even the attributes made."""
    if not enabled():
        return _NO_SPAN
    return _tracer().start_as_current_span(
        name, kind=kind, attributes=attributes(destination, operation, txn_id, **extra)
    )


def traced_headers(headers: Headers) -> Headers:
    """``headers`` plus the current span's ``traceparent``/``tracestate``, unless they carry a
    ``traceparent`` already (the application's own instrumentation put it there)."""
    if not enabled() or any(name == "traceparent" for name, _ in headers):
        return headers
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [*headers, *((k, v.encode()) for k, v in carrier.items() if k in TRACE_HEADERS)]


def traced_messages(msgs: list[Message]) -> list[Message]:
    """``msgs`` with the current span's context in their headers (:func:`traced_headers`):
    what the producer writes inside its ``send half`` span. The same list without an SDK."""
    if not enabled():
        return msgs
    return [
        dataclasses.replace(m, headers=traced_headers(m.user_headers()))
        if isinstance(m, Message)
        else m
        for m in msgs
    ]  # the caller refuses the others


def name_transaction(txn_id: str) -> None:
    """Tag the current span with the transaction id, once the half write made it."""
    if enabled():
        trace.get_current_span().set_attribute("messaging.message.conversation_id", txn_id)


def _context(headers: Sequence[tuple[str, bytes | None]] | None) -> Any | None:
    carrier = {
        name: value.decode(errors="replace")
        for name, value in headers or ()
        if name in TRACE_HEADERS and value
    }
    if "traceparent" not in carrier:
        return None
    return propagate.extract(carrier)


@contextlib.contextmanager
def check_span(
    headers: Sequence[tuple[str, bytes | None]] | None,
    destination: str,
    txn_id: str,
    check_times: int,
) -> Iterator[Any]:
    """A new trace around ``check_local_transaction``, linked to the transaction's own."""
    if not enabled():
        yield None
        return
    links = []
    origin = _context(headers)
    if origin is not None:
        linked = trace.get_current_span(origin).get_span_context()
        if linked.is_valid:
            links.append(Link(linked))
    with _tracer().start_as_current_span(
        "check local transaction",
        kind=SpanKind.CONSUMER,
        links=links,
        context=trace.set_span_in_context(trace.INVALID_SPAN),
        attributes=attributes(destination, "process", txn_id, check_times=check_times),
    ) as current:
        yield current


def promote_span(
    headers: Sequence[tuple[str, bytes | None]] | None,
    destination: str,
    txn_id: str,
    born_ms: int,
    promoted_ms: int,
) -> None:
    """The coordinator's ``promote`` span, in the trace the half record's headers name: from
    the birth time to the promotion (the pending time). Nothing for a record without
    ``traceparent`` or without an SDK."""
    if not enabled():
        return
    origin = _context(headers)
    if origin is None:
        return
    start_ns = min(born_ms, promoted_ms) * 1_000_000
    promote = _tracer().start_span(
        "promote",
        context=origin,
        kind=SpanKind.PRODUCER,
        start_time=start_ns,
        attributes=attributes(
            destination, "send", txn_id, pending_ms=max(0, promoted_ms - born_ms)
        ),
    )
    promote.end(end_time=promoted_ms * 1_000_000)


@contextlib.contextmanager
def process_span(
    headers: Sequence[tuple[str, bytes | None]] | None, destination: str, batch_size: int = 1
) -> Iterator[Any]:
    """A consumer's span around handling a promoted record (the first of a batch): a child of
    the trace its ``traceparent`` names, so "event consumed" joins "order committed". The
    concurrent consumer wraps each listener call in one; with the drop-in ``Consumer``,
    ``with process_span(msg.headers(), msg.topic()): handle(msg)``."""
    if not enabled():
        yield None
        return
    with _tracer().start_as_current_span(
        f"process {destination}",
        context=_context(headers),
        kind=SpanKind.CONSUMER,
        attributes=attributes(destination, "process", batch_size=batch_size),
    ) as current:
        yield current
