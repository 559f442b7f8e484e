"""The concurrent consumer's worker pool: listener calls on ``max_workers`` threads, or, for
an ``async def`` listener, on one event loop thread with at most ``max_workers`` calls at
once. Each call's outcome goes to the :class:`~rmq_semantics.push.ledger.Ledger`; a raise,
a wrong return or a call past ``consume_timeout_ms`` counts as RECONSUME_LATER."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rmq_semantics.errors import ConsumeTimeoutError
from rmq_semantics.orderly.keyed import is_async_listener
from rmq_semantics.push.api import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus
from rmq_semantics.push.ledger import Batch, Ledger
from rmq_semantics.tracing import process_span

__all__ = ["ListenerPool"]

log = logging.getLogger(__name__)
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER


class ListenerPool:
    """Runs listener calls and settles their outcomes in the ledger."""

    def __init__(
        self,
        listener: Callable[..., Any],
        *,
        max_workers: int,
        ledger: Ledger,
        name: str,
        consume_timeout_ms: int,
    ) -> None:
        self._listener = listener
        self._ledger = ledger
        self._timeout_s = consume_timeout_ms / 1000
        self.is_async = is_async_listener(listener)
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None
        if self.is_async:
            self._loop = asyncio.new_event_loop()
            self._slots = asyncio.Semaphore(max_workers)
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, daemon=True, name=f"rmq-push-loop-{name}"
            )
            self._loop_thread.start()
        else:
            self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix=f"rmq-push-{name}")

    def submit(self, batch: Batch) -> None:
        self._ledger.open(batch)
        context = ConsumeConcurrentlyContext(*batch.part.tp, len(batch.msgs))
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._run_async(batch, context), self._loop)
        else:
            assert self._executor is not None
            self._executor.submit(self._run_sync, batch, context)

    def _run_sync(self, batch: Batch, context: ConsumeConcurrentlyContext) -> None:
        if batch.settled:
            return  # timed out while queued
        first = batch.msgs[0]
        try:
            with process_span(first.headers, first.topic, len(batch.msgs)):
                result = self._listener(list(batch.msgs), context)
        except Exception as exc:  # the listener's own failure: RECONSUME_LATER, as RocketMQ
            self._failed(batch, context, exc)
            return
        self._done(batch, context, result)

    async def _run_async(self, batch: Batch, context: ConsumeConcurrentlyContext) -> None:
        assert self._slots is not None
        async with self._slots:
            if batch.settled:
                return
            try:
                first = batch.msgs[0]
                try:
                    with process_span(first.headers, first.topic, len(batch.msgs)):
                        result = await asyncio.wait_for(
                            self._listener(list(batch.msgs), context),
                            max(batch.deadline - time.monotonic(), 0.001),
                        )
                except TimeoutError as exc:  # wait_for cancelled the call
                    raise ConsumeTimeoutError(
                        f"listener call ran past consume_timeout_ms ({self._timeout_s:.3f} s)"
                    ) from exc
            except Exception as exc:  # the listener's own failure, or the timeout
                self._failed(batch, context, exc)
                return
        self._done(batch, context, result)

    def _done(self, batch: Batch, context: ConsumeConcurrentlyContext, result: object) -> None:
        if not isinstance(result, ConsumeConcurrentlyStatus):
            log.warning(
                "%s: listener returned %r, not a ConsumeConcurrentlyStatus; reconsuming later",
                batch.msgs[0].where,
                result,
            )
            result = LATER
        self._ledger.settle(batch, result, context, None)

    def _failed(
        self, batch: Batch, context: ConsumeConcurrentlyContext, error: BaseException
    ) -> None:
        log.warning(
            "%s: listener failed (%s: %s); reconsuming later",
            batch.msgs[0].where,
            type(error).__name__,
            error,
        )
        self._ledger.settle(batch, LATER, context, error)

    def expire(self, batch: Batch) -> None:
        """Poll thread: ``batch`` ran past its deadline; a sync call still running cannot be
        stopped, its outcome is ignored when it returns."""
        self._ledger.counts["timed_out"] += 1
        context = ConsumeConcurrentlyContext(*batch.part.tp, len(batch.msgs))
        self._failed(
            batch,
            context,
            ConsumeTimeoutError(
                f"listener call ran past consume_timeout_ms ({self._timeout_s:.3f} s)"
            ),
        )

    def close(self, timeout: float) -> None:
        """Stop taking calls; wait up to ``timeout`` s for the loop thread (idempotent)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._loop_thread is not None:
            self._loop_thread.join(timeout)
