"""The coordinator's spans, turned on by an operator without code: the ``[otel]`` extra
(the OpenTelemetry SDK and its OTLP/HTTP exporter) and the standard ``OTEL_*`` variables.

Spans are exported when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, or ``OTEL_TRACES_EXPORTER=otlp``; never when
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. The SDK reads the rest itself
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, headers, timeouts, batch sizes).
Without the extra the variables are reported once and ignored: the coordinator runs as
before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace

__all__ = ["DEFAULT_SERVICE_NAME", "configure_from_env", "wanted"]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "rmq-semantics-coordinator"


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables ask for exported spans (see module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return exporter == "otlp" or bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure_from_env(env: Mapping[str, str] | None = None) -> Any | None:
    """Install an SDK TracerProvider exporting over OTLP/HTTP when :func:`wanted`; returns it
    (``shutdown()`` flushes it at exit) or None."""
    env = os.environ if env is None else env
    if not wanted(env):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "OTEL_* variables ask for spans, but the [otel] extra is not installed "
            "(%s): pip install 'rmq-semantics[otel]'; running without spans",
            exc,
        )
        return None
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, which win.
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info(
        "exporting spans over OTLP/HTTP to %s",
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "the SDK's default endpoint",
    )
    return provider
