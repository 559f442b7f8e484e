"""The one retry policy: bounded, targeted, stoppable (tenacity).

Only retriable errors are retried (our ``RmqError.retriable`` or librdkafka's
``KafkaError.retriable()``); retrying stops at a deadline or when the shutdown event is set,
and every sleep is logged first.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import KafkaException
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_delay,
    stop_never,
    stop_when_event_set,
    wait_exponential,
)

__all__ = ["is_retriable", "retrying"]

log = logging.getLogger(__name__)


def is_retriable(exc: BaseException) -> bool:
    if isinstance(exc, KafkaException) and exc.args:
        err = exc.args[0]
        return bool(err.retriable()) and not err.fatal() and not err.txn_requires_abort()
    return bool(getattr(exc, "retriable", False))


def retrying(deadline_s: float, stop: threading.Event | None = None) -> Retrying:
    """``for attempt in retrying(30, stop): with attempt: call()`` — re-raises the last error."""
    return Retrying(
        retry=retry_if_exception(is_retriable),
        stop=stop_after_delay(deadline_s) | (stop_when_event_set(stop) if stop else stop_never),
        wait=wait_exponential(multiplier=0.1, max=5.0),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
