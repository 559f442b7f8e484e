"""The retry policy retries only retriable errors and stops on shutdown."""

from __future__ import annotations

import threading

import pytest

from rmq_semantics.errors import ConfigError, RmqTimeoutError
from rmq_semantics.retry import retrying


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
