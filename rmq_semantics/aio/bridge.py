"""Between librdkafka's threads and one event loop: delivery reports that resolve asyncio
futures, listeners that may be ``async def``, and the executor for what blocks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import confluent_kafka
from confluent_kafka import KafkaError

from rmq_semantics.errors import (
    ConfigError,
    IllegalStateError,
    KafkaOperationError,
    RmqTimeoutError,
)
from rmq_semantics.message import Message
from rmq_semantics.producer import DeliveryWaiter
from rmq_semantics.transaction_api import LocalTransactionState, Transaction

__all__ = [
    "EXECUTOR_THREADS",
    "LoopDeliveryWaiter",
    "LoopListener",
    "call_listener",
    "new_executor",
    "run_blocking",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# librdkafka's blocking calls (metadata, flush, close) and synchronous listeners share it:
# a few threads, as confluent-kafka's own asyncio classes have, never one per call.
EXECUTOR_THREADS = 8
# How much longer than check_timeout_ms a check thread waits for an async check: the pool's
# watchdog answers UNKNOW at the timeout; the grace only bounds the abandoned thread's wait.
CHECK_GRACE_S = 5.0


def new_executor(name: str, threads: int = EXECUTOR_THREADS) -> concurrent.futures.Executor:
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=threads, thread_name_prefix=f"rmq-aio-{name}"
    )


async def run_blocking(
    executor: concurrent.futures.Executor, fn: Callable[..., T], *args: Any
) -> T:
    """``fn(*args)`` on ``executor``, with the caller's context variables (a trace's span)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, call)


class LoopDeliveryWaiter(DeliveryWaiter):
    """A :class:`DeliveryWaiter` whose report, served on the producer's delivery thread,
    resolves a future of ``loop`` (through ``call_soon_threadsafe``). Made on the loop."""

    __slots__ = ("_future", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self._future: asyncio.Future[None] = loop.create_future()

    def __call__(self, err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        super().__call__(err, msg)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self._future.done():  # it timed out, or its waiter was cancelled
            self._future.set_result(None)

    def _time_out(self) -> None:
        if not self._future.done():
            self._future.set_exception(TimeoutError())

    async def delivered_within(self, what: str, timeout: float) -> None:
        """Wait for the report; raise as :meth:`DeliveryWaiter.wait` does."""
        if not self.delivered:
            # A timer on the future itself: asyncio.wait_for would wrap it in a task per call.
            timer = self._loop.call_later(max(0.0, timeout), self._time_out)
            try:
                await self._future
            except TimeoutError:
                raise RmqTimeoutError(
                    f"{what}: no delivery report within {timeout:.1f} s"
                ) from None
            finally:
                timer.cancel()
        if self.error is not None:
            raise KafkaOperationError.wrap(what, self.error)


async def call_listener(
    method: Callable[..., Any], executor: concurrent.futures.Executor, *args: Any
) -> tuple[Any, BaseException | None]:
    """(answer, None) or (None, what it raised): an ``async def`` ``method`` is awaited on
    this loop, a plain one runs on ``executor`` (it may block on a database)."""
    try:
        if inspect.iscoroutinefunction(method):
            answer = await method(*args)
        else:
            answer = await run_blocking(executor, method, *args)
            if inspect.isawaitable(answer):  # a plain callable that returned a coroutine
                answer = await answer
        return answer, None
    except Exception as exc:
        return None, exc


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class LoopListener:
    """The user's listener as the check pool's threads ask it: a plain
    ``check_local_transaction`` is called on the pool thread as before; an ``async def`` one
    runs on ``loop`` (set at ``start``) and the pool thread waits for it, bounded by the
    check timeout (past it, the pool has answered UNKNOW already; the coroutine is
    cancelled)."""

    def __init__(self, listener: Any, timeout_s: float) -> None:
        for method in ("execute_local_transaction", "check_local_transaction"):
            if listener is None or not callable(getattr(listener, method, None)):
                raise ConfigError(
                    "listener must implement execute_local_transaction and check_local_transaction"
                )
        self.listener = listener
        self.timeout_s = timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None

    def execute_local_transaction(
        self, msg: Message | Transaction, arg: Any
    ) -> LocalTransactionState:
        raise IllegalStateError("the asyncio producer runs execute_local_transaction itself")

    def check_local_transaction(self, msg: Message | Transaction) -> Any:
        answer = self.listener.check_local_transaction(msg)
        if not inspect.isawaitable(answer):  # a plain listener: answered on this thread
            return answer
        coroutine = answer if inspect.iscoroutine(answer) else _awaited(answer)
        try:
            if self.loop is None:
                raise RuntimeError("the producer was never started on a loop")
            future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        except RuntimeError as exc:  # the loop is closed
            coroutine.close()
            raise IllegalStateError(
                f"an async check_local_transaction cannot be asked: the "
                f"producer's event loop is not running ({exc})"
            ) from exc
        try:
            return future.result(self.timeout_s + CHECK_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RmqTimeoutError(
                f"check_local_transaction did not answer within "
                f"{self.timeout_s + CHECK_GRACE_S:.0f} s"
            ) from None
