"""The one retry policy: bounded, targeted, stoppable (tenacity).

Only retriable errors are retried (our ``RmqError.retriable``, or a Kafka error by
:func:`retriable_kafka_error`); retrying stops at a deadline or when the shutdown event is
set, and every sleep is logged first.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import KafkaError, KafkaException
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_delay,
    stop_never,
    stop_when_event_set,
    wait_exponential,
)

__all__ = ["RETRIABLE_CODES", "is_retriable", "retriable_kafka_error", "retrying"]

log = logging.getLogger(__name__)

#: Errors of the cluster's state at the moment (a group coordinator loading its offsets
#: after a start or a leader move, a leader moving, a request timing out): the same call can
#: succeed later. librdkafka flags only transactional errors ``retriable()``; an offset fetch,
#: an admin call or a metadata request carries its code alone.
RETRIABLE_CODES = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
    }
)


def retriable_kafka_error(err: KafkaError) -> bool:
    """Whether calling again can succeed: flagged retriable, or a code of
    :data:`RETRIABLE_CODES`; never a fatal error or one that needs a transaction aborted."""
    if err.fatal() or err.txn_requires_abort():
        return False
    return bool(err.retriable()) or err.code() in RETRIABLE_CODES


def is_retriable(exc: BaseException) -> bool:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return retriable_kafka_error(exc.args[0])
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
