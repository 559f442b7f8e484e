"""``AsyncTransactionProducer``: ``TransactionProducer`` for asyncio.

The synchronous producer is its core, by composition: validation, the half records, the end
requests, the check consumer and its pool are that producer's, so both behave alike and
raise the same errors. What differs is waiting: a coroutine awaits a future that the
delivery thread resolves, where a thread would sleep on an event, and the listener may be
``async def`` (a plain one runs on the executor).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.trace import SpanKind

from rmq_semantics import tracing
from rmq_semantics.aio.bridge import (
    LoopDeliveryWaiter,
    LoopListener,
    call_listener,
    new_executor,
    run_blocking,
)
from rmq_semantics.errors import IllegalStateError, RmqError
from rmq_semantics.message import Message
from rmq_semantics.multi import (
    check_members,
    half_partition_for,
    listener_message,
    member_headers,
)
from rmq_semantics.producer import SEND_TIMEOUT_S
from rmq_semantics.transaction import TransactionProducer
from rmq_semantics.transaction_api import (
    LocalTransactionState,
    Transaction,
    TransactionListener,
    TransactionSendResult,
    as_listener,
)
from rmq_semantics.txn_writes import (
    DELIVERY_GRACE_S,
    local_outcome,
    new_txn_ids,
    roll_back_unwritten,
    write_halves,
    write_members,
)

__all__ = ["AsyncTransactionProducer"]


class AsyncTransactionProducer:
    """RocketMQ's ``TransactionMQProducer`` for asyncio: the contract, results, errors and
    settings of :class:`~rmq_semantics.TransactionProducer` (every keyword option of it is
    taken here too), with ``await start()``, ``await send_message_in_transaction(msg,
    arg)``, ``await send_transaction(messages, arg)``, ``await end_transaction(result,
    state)``, ``await shutdown()`` and ``async with``.

    Both listener methods may be ``async def``: ``execute_local_transaction`` is awaited on
    the caller's loop, ``check_local_transaction`` is run on the loop the producer was
    started on (the check threads wait for it, bounded by ``check_timeout_ms``). Plain
    methods still work: ``execute_local_transaction`` runs on ``executor`` (default: a few
    threads of the producer's own), checks on the check threads as before. A caller
    cancelled after the half write leaves its transaction to the back-check.
    """

    def __init__(
        self,
        conf: dict,
        *,
        producer_group: str,
        listener: TransactionListener,
        executor: concurrent.futures.Executor | None = None,
        **options: Any,
    ) -> None:
        self.listener = listener = as_listener(listener)
        self._checks_listener = LoopListener(listener, timeout_s=0.0)
        self._core = TransactionProducer(
            conf, producer_group=producer_group, listener=self._checks_listener, **options
        )
        self._checks_listener.timeout_s = self._core.settings.check_timeout_ms / 1000
        self._own_executor = executor is None
        self._executor = executor or new_executor(producer_group)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Future | None = None
        self._stopping: asyncio.Future | None = None

    @property
    def producer_group(self) -> str:
        return self._core.producer_group

    @property
    def instance_id(self) -> str:
        """This instance's id: its check consumer's, and its half records' check affinity."""
        return self._core.instance_id

    @property
    def settings(self) -> Any:
        """The :class:`~rmq_semantics.ProducerSettings` in force."""
        return self._core.settings

    @property
    def topics(self) -> Any:
        return self._core.topics

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> AsyncTransactionProducer:
        """Create the system topics, the producers and the check consumer (on the executor:
        it reads metadata), bound to the running loop. Idempotent."""
        if self._stopping is not None:
            raise IllegalStateError("AsyncTransactionProducer is shut down")
        if self._starting is None:
            loop = asyncio.get_running_loop()
            self._checks_listener.loop = loop
            self._starting = asyncio.ensure_future(run_blocking(self._executor, self._start))
        await asyncio.shield(self._starting)
        self._loop = asyncio.get_running_loop()
        return self

    def _start(self) -> None:
        self._core.start()
        self._core._call_producer()  # made here: its first use must not be on the loop

    async def shutdown(self, timeout: float = SEND_TIMEOUT_S) -> None:
        """Flush end requests, stop the check threads, leave the check group (on the
        executor). Idempotent; calls made meanwhile raise IllegalStateError."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._shutdown(timeout))
        await asyncio.shield(self._stopping)

    async def _shutdown(self, timeout: float) -> None:
        try:
            if self._starting is not None:
                await asyncio.wait([self._starting], timeout=timeout)
            await run_blocking(self._executor, self._core.shutdown, timeout)
        finally:
            if self._own_executor:
                self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncTransactionProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _require_started(self) -> asyncio.AbstractEventLoop:
        if self._stopping is not None:
            raise IllegalStateError("AsyncTransactionProducer is shut down")
        if self._loop is None:
            raise IllegalStateError(
                "AsyncTransactionProducer is not started (await start() or use 'async with')"
            )
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            raise IllegalStateError(
                "AsyncTransactionProducer was started on another event loop; use it on that one"
            )
        return loop

    # -- sending -------------------------------------------------------------------------
    async def send_message_in_transaction(
        self, msg: Message, arg: Any = None
    ) -> TransactionSendResult:
        """Write ``msg`` as a half message, run the local transaction, send its outcome.

        Raises as :meth:`TransactionProducer.send_message_in_transaction` does: the half
        write's failure (the local transaction is not run), :class:`SystemTopicError` and
        :class:`UnknownPartitionError` before anything is written.
        """
        loop = self._require_started()
        core = self._core
        placed = await self._placed([msg])
        producer, txn_ids = core._call_producer(), new_txn_ids(1)
        with tracing.span("send transaction", msg.topic):
            # In flight until this coroutine has the report (a stalled loop included): the
            # producer answers its checks UNKNOW meanwhile, never the listener (issue 29).
            with (
                tracing.span("send half", core.topics.half, kind=SpanKind.PRODUCER),
                core._unsent.sending(txn_ids),
            ):
                [(txn_id, waiter)] = write_halves(
                    producer,
                    core.topics.half,
                    core.producer_group,
                    tracing.traced_messages(placed),
                    txn_ids,
                    functools.partial(LoopDeliveryWaiter, loop),
                    core._checks.affinity(),
                )
                tracing.name_transaction(txn_id)
                try:
                    await waiter.delivered_within(
                        f"writing the half message of txn {txn_id}",
                        core._send_timeout_s + DELIVERY_GRACE_S,
                    )
                except RmqError as exc:  # never promoted, should it land anyway
                    core._unsent.failed(txn_id)
                    await run_blocking(
                        self._executor,
                        roll_back_unwritten,
                        producer,
                        core.topics.op,
                        core.producer_group,
                        txn_id,
                        waiter.partition,
                        core._half_partitions_now,
                        exc,
                    )
                    raise
                core._unsent.landed(txn_id)
            result, state = await self._execute_local(listener_message(msg, txn_id), arg, waiter)
            core._end_inline(result, state, producer)
        return result

    async def send_transaction(
        self, messages: Sequence[Message], arg: Any = None
    ) -> TransactionSendResult:
        """Send ``messages`` (any topics) as ONE transaction: all promoted or none; as
        :meth:`TransactionProducer.send_transaction`, with the same bounds and errors."""
        loop = self._require_started()
        core = self._core
        msgs, [txn_id] = list(messages), new_txn_ids(1)
        with tracing.span("send transaction", core.topics.half, "send", txn_id, messages=len(msgs)):
            with tracing.span("send half", core.topics.half, kind=SpanKind.PRODUCER):
                waiters = await self._write_members(loop, msgs, txn_id)
            view = Transaction(txn_id, tuple(listener_message(m, txn_id) for m in msgs), len(msgs))
            result, state = await self._execute_local(view, arg, waiters[0], len(msgs))
            core._end_inline(result, state, core._call_producer())
        return result

    async def _write_members(
        self, loop: asyncio.AbstractEventLoop, msgs: list[Message], txn_id: str
    ) -> list[LoopDeliveryWaiter]:
        """Write every member and await them; if one was not written, ROLLBACK what was
        (named by member 0) and raise, as the synchronous producer does."""
        core = self._core
        tracing.name_transaction(txn_id)
        check_members(msgs, max_messages=core.settings.max_transaction_messages)
        msgs = await self._placed(msgs)
        headers = member_headers(
            tracing.traced_messages(msgs),
            txn_id,
            core.producer_group.encode(),
            str(int(time.time() * 1000)).encode(),
            max_messages=core.settings.max_transaction_messages,
            max_bytes=core.settings.max_transaction_bytes,
            affinity=core._checks.affinity(),
        )
        half_partitions = await run_blocking(self._executor, core._half_partitions_now)
        partition = half_partition_for(txn_id, len(half_partitions))
        producer = core._call_producer()
        waiters: list[LoopDeliveryWaiter] = []
        deadline = time.monotonic() + core._send_timeout_s  # for all the members together
        with core._unsent.sending([txn_id]):
            try:
                write_members(
                    producer,
                    core.topics.half,
                    partition,
                    msgs,
                    headers,
                    waiters,
                    functools.partial(LoopDeliveryWaiter, loop),
                )
                for index, waiter in enumerate(waiters):
                    await waiter.delivered_within(
                        f"writing the half message {index} of {len(waiters)} of txn {txn_id}",
                        deadline - time.monotonic(),
                    )
            except (RmqError, BufferError) as exc:
                core._unsent.failed(txn_id)
                if waiters:  # else nothing was queued: nothing can land
                    first = await _first_written(waiters, txn_id, deadline)
                    await run_blocking(
                        self._executor,
                        core._roll_back_written,
                        txn_id,
                        first,
                        len(msgs),
                        producer,
                        partition,
                        exc,
                    )
                raise
            core._unsent.landed(txn_id)
        return waiters

    async def _placed(self, msgs: list[Message]) -> list[Message]:
        """The synchronous producer's checks and placement (``TransactionProducer._placed``):
        on the loop when they need no metadata call (cached), else on the executor."""
        core = self._core
        if core.send_checks().cached(msgs):
            return core._placed(msgs)
        return await run_blocking(self._executor, core._placed, msgs)

    async def _execute_local(
        self,
        view: Message | Transaction,
        arg: Any,
        waiter: LoopDeliveryWaiter,
        message_count: int = 1,
    ) -> tuple[TransactionSendResult, LocalTransactionState]:
        with tracing.span("local transaction", view.topic, "process", view.transaction_id):
            answer, error = await call_listener(
                self.listener.execute_local_transaction, self._executor, view, arg
            )
        return local_outcome(
            view,
            answer,
            error,
            waiter,
            self._core.producer_group,
            self._core.topics.half,
            message_count,
        )

    async def end_transaction(
        self,
        result: TransactionSendResult,
        state: LocalTransactionState,
        *,
        timeout: float | None = None,
    ) -> None:
        """Send ``state`` for a transaction (e.g. one left UNKNOW) and wait for the ack."""
        self._require_started()
        await run_blocking(
            self._executor,
            functools.partial(self._core.end_transaction, result, state, timeout=timeout),
        )

    async def flush(self, timeout: float = SEND_TIMEOUT_S) -> int:
        """Wait for queued end requests; returns how many are still queued."""
        self._require_started()
        return await run_blocking(self._executor, self._core.flush, timeout)

    # -- back-checks ---------------------------------------------------------------------
    @property
    def checks_answered(self) -> int:
        """Back-checks this producer answered."""
        return self._core.checks_answered

    @property
    def dropped_checks(self) -> int:
        """Check requests dropped because the check queue was full."""
        return self._core.dropped_checks

    @property
    def checks_timed_out(self) -> int:
        """Back-checks answered UNKNOW because the listener ran past ``check_timeout_ms``."""
        return self._core.checks_timed_out

    @property
    def failed_send_ids_dropped(self) -> int:
        """As :attr:`TransactionProducer.failed_send_ids_dropped`."""
        return self._core.failed_send_ids_dropped


async def _first_written(
    waiters: list[LoopDeliveryWaiter], txn_id: str, deadline: float
) -> LoopDeliveryWaiter | None:
    """Member 0's waiter once it is known to be written (until ``deadline``); None if not
    (then the transaction is rolled back by its id)."""
    try:
        first = waiters[0]
        await first.delivered_within(
            f"writing the first half message of txn {txn_id}", deadline - time.monotonic()
        )
    except (IndexError, RmqError):
        return None
    return first
