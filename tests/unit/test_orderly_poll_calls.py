"""Consumer calls handed to the orderly consumer's poll thread (futures), without a broker."""

from __future__ import annotations

import threading
import time

import pytest

from rmq_semantics.errors import KafkaOperationError, RmqTimeoutError
from rmq_semantics.orderly.calls import ConsumerCalls

CONSUMER = object()  # stands in for the confluent_kafka.Consumer the poll thread owns
JOIN_S = 10.0


class PollThread:
    """Runs the handed-over calls until stopped, like the poll loop between polls."""

    def __init__(self, calls: ConsumerCalls) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        calls.consumer, calls.thread = CONSUMER, self.thread
        self.calls = calls

    def _loop(self) -> None:
        while not self.stop.wait(0.001):
            self.calls.run_pending(CONSUMER)

    def __enter__(self) -> PollThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(JOIN_S)


def test_a_call_runs_on_the_poll_thread_and_returns_its_result():
    calls = ConsumerCalls()
    with PollThread(calls) as poller:
        ran_on = calls.submit(lambda c: (c, threading.current_thread()), "where")
    assert ran_on == (CONSUMER, poller.thread)


def test_what_the_call_raised_is_raised_to_the_caller():
    calls = ConsumerCalls()

    def fails(_consumer):
        raise RmqTimeoutError("a TimeoutError of the call itself, not of the hand-over")

    with PollThread(calls), pytest.raises(RmqTimeoutError, match="of the call itself"):
        calls.submit(fails, "failing")


def test_on_the_poll_thread_a_call_runs_at_once():
    calls = ConsumerCalls()
    calls.consumer, calls.thread = CONSUMER, threading.current_thread()
    assert calls.submit(lambda c: c, "inline") is CONSUMER


def test_a_call_the_poll_thread_did_not_start_in_time_times_out_and_never_runs():
    calls = ConsumerCalls()
    calls.consumer, calls.thread = CONSUMER, threading.Thread(target=lambda: None)
    ran = []
    with pytest.raises(RmqTimeoutError, match="did not run it"):
        calls.submit(ran.append, "late", timeout=0.01)
    calls.run_pending(CONSUMER)  # the poll thread comes round afterwards
    assert ran == []


def test_close_fails_waiting_calls_and_refuses_new_ones():
    calls = ConsumerCalls()
    calls.consumer, calls.thread = CONSUMER, threading.Thread(target=lambda: None)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            calls.submit(lambda c: c, "waiting")
        except KafkaOperationError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + JOIN_S
    while not calls._pending and time.monotonic() < deadline:  # until it is handed over
        time.sleep(0.001)
    calls.close()
    waiter.join(JOIN_S)
    assert [str(e) for e in outcome] == ["the consumer shut down"]
    with pytest.raises(KafkaOperationError, match="shutting down"):
        calls.submit(lambda c: c, "after close")


def test_no_consumer_no_call():
    with pytest.raises(KafkaOperationError, match="not running"):
        ConsumerCalls().submit(lambda c: c, "early")
