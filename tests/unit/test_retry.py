"""The retry policy retries only retriable errors and stops on shutdown."""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from rmq_semantics.errors import ConfigError, KafkaOperationError, RmqTimeoutError
from rmq_semantics.retry import is_retriable, retrying


def _run(fn, stop=None, deadline_s=5.0):
    for attempt in retrying(deadline_s, stop):
        with attempt:
            return fn()


def test_retriable_errors_are_retried_until_success():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RmqTimeoutError("broker busy")
        return "ok"

    assert _run(flaky) == "ok" and len(calls) == 3


def test_non_retriable_errors_surface_at_once():
    calls = []

    def wrong():
        calls.append(1)
        raise ConfigError("check_max must be a positive int, got 0")

    with pytest.raises(ConfigError):
        _run(wrong)
    assert len(calls) == 1


def test_a_set_shutdown_event_stops_retrying():
    stop = threading.Event()
    calls = []

    def down():
        calls.append(1)
        stop.set()
        raise RmqTimeoutError("broker unavailable")

    with pytest.raises(RmqTimeoutError):
        _run(down, stop=stop, deadline_s=60)
    assert len(calls) == 1


# librdkafka builds these with no retriable flag: an offset fetch's, an admin call's error.
CLUSTER_STATE_CODES = [
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT,
]


@pytest.mark.parametrize("code", CLUSTER_STATE_CODES)
def test_a_group_coordinators_state_is_retriable_without_librdkafkas_flag(code):
    err = KafkaError(code)
    assert not err.retriable()
    assert is_retriable(KafkaException(err))
    wrapped = KafkaOperationError.wrap("reading the committed offsets of g", err)
    assert wrapped.retriable and is_retriable(wrapped)


@pytest.mark.parametrize(
    "err",
    [
        KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED),
        KafkaError(KafkaError.INVALID_GROUP_ID),
        KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, fatal=True),
        KafkaError(KafkaError.NOT_COORDINATOR, txn_requires_abort=True),
    ],
)
def test_a_refusal_or_a_fatal_error_is_not_retriable(err):
    assert not is_retriable(KafkaException(err))
    assert not KafkaOperationError.wrap("reading", err).retriable


def test_a_loading_group_coordinator_is_retried_with_one_line_naming_it(caplog):
    caplog.set_level(logging.WARNING, logger="rmq_semantics.retry")
    calls = []

    def loading():
        calls.append(1)
        if len(calls) < 3:
            raise KafkaOperationError.wrap(
                "reading the committed offsets of g",
                KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
            )
        return "ok"

    assert _run(loading) == "ok"
    lines = [r.getMessage() for r in caplog.records if r.name == "rmq_semantics.retry"]
    assert len(lines) == 2 and all("COORDINATOR_LOAD_IN_PROGRESS" in line for line in lines)


def test_a_refusal_surfaces_at_once():
    calls = []

    def refused():
        calls.append(1)
        raise KafkaOperationError.wrap(
            "reading the committed offsets of g", KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)
        )

    with pytest.raises(KafkaOperationError, match="GROUP_AUTHORIZATION_FAILED"):
        _run(refused)
    assert len(calls) == 1
