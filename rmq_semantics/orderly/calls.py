"""Consumer calls handed to the poll thread.

confluent-kafka serializes calls on one consumer handle, so every consumer call of the
orderly consumer (commits, committed-offset reads, seeks) runs on the poll thread: other
threads hand theirs over and wait on a ``concurrent.futures.Future`` for the outcome.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import confluent_kafka

from rmq_semantics.errors import KafkaOperationError, RmqTimeoutError
from rmq_semantics.orderly.runtime import COMMIT_TIMEOUT_S, POLL_WAIT_S

__all__ = ["ConsumerCalls"]


class ConsumerCalls:
    """Consumer calls handed to the poll thread, each with a Future for its outcome."""

    def __init__(self) -> None:
        self.consumer: confluent_kafka.Consumer | None = None
        self.thread: threading.Thread | None = None  # the poll thread
        self._pending: deque[tuple[Callable[[confluent_kafka.Consumer], Any], Future]] = deque()
        self._lock = threading.Lock()
        self._closed = False

    def submit(
        self,
        fn: Callable[[confluent_kafka.Consumer], Any],
        what: str,
        timeout: float = COMMIT_TIMEOUT_S,
    ) -> Any:
        """Run ``fn(consumer)`` on the poll thread (at once if we are on it) and return its
        result; raises what it raised, or RmqTimeoutError."""
        consumer = self.consumer
        if consumer is None:
            raise KafkaOperationError(f"{what}: the consumer is not running")
        if threading.current_thread() is self.thread:
            return fn(consumer)
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise KafkaOperationError(f"{what}: the consumer is shutting down")
            self._pending.append((fn, future))
        try:
            # The poll thread answers within a poll slice plus the call itself.
            error = future.exception(timeout + POLL_WAIT_S)
        except FutureTimeout:
            future.cancel()  # skipped if the poll thread has not started it
            raise RmqTimeoutError(
                f"{what}: the poll thread did not run it within {timeout:.0f} s"
            ) from None
        if error is not None:
            raise error
        return future.result()

    def run_pending(self, consumer: confluent_kafka.Consumer) -> None:
        """Poll thread: run every call handed over so far."""
        while self._pending:  # checked without the lock: a call added meanwhile waits a round
            with self._lock:
                if not self._pending:
                    return
                fn, future = self._pending.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up waiting
            try:
                result = fn(consumer)
            except BaseException as exc:  # handed to the waiting thread
                future.set_exception(exc)
            else:
                future.set_result(result)

    def close(self) -> None:
        """Refuse new calls and fail the pending ones (the consumer is closing)."""
        with self._lock:
            self._closed = True
            pending, self._pending = list(self._pending), deque()
        for _fn, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(KafkaOperationError("the consumer shut down"))
