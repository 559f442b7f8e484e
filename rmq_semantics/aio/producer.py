"""``AsyncProducer``: ``Producer.send`` for asyncio, with every message's own headers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any

from rmq_semantics.aio.bridge import LoopDeliveryWaiter, new_executor, run_blocking
from rmq_semantics.errors import IllegalStateError, TimerRecallRefused
from rmq_semantics.message import Message, SendResult, produce_headers
from rmq_semantics.producer import SEND_TIMEOUT_S, DeliveryPoller, Producer
from rmq_semantics.selector import placement_reads_partitions
from rmq_semantics.timer_writes import TimerWrite
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX

__all__ = ["AsyncProducer"]


class AsyncProducer:
    """:class:`~rmq_semantics.Producer`'s ``send`` for asyncio: ``await send(msg,
    selector=None, arg=None, sharding_key=None)`` returns the :class:`SendResult` once the
    broker acknowledged, with the same defaults (idempotence, ``acks=all``, Java's
    partitioner), refusals (:class:`SystemTopicError`) and errors.

    Each record is produced on the loop with its own key, headers and partition (librdkafka
    batches them itself; confluent-kafka's ``AIOProducer`` batched path drops per-message
    headers, this one does not). A selector, a sharding key or a message group (placed by
    the group, as ``Producer.send``) needs the topic's partitions:
    read on the executor when the cache is stale. ``flush`` and ``close`` run there too.

    Timer messages and :meth:`recall_message` as the ``Producer``'s, with its keyword
    options; their records are prepared on the executor (the first one creates the timer
    topics).
    """

    def __init__(
        self,
        conf: dict,
        *,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
        executor: concurrent.futures.Executor | None = None,
        **options: Any,
    ) -> None:
        self._sync = Producer(conf, topic_prefix=topic_prefix, **options)
        self.topic_prefix = self._sync.topic_prefix
        self._own_executor = executor is None
        self._executor = executor or new_executor("producer", threads=2)
        self._poller: DeliveryPoller | None = None
        self._poller_lock = threading.Lock()
        self._closed = False

    def _delivery_thread(self) -> None:
        """The delivery thread, started on the first send (a thread start, not a wait)."""
        with self._poller_lock:
            if self._poller is None:
                self._poller = DeliveryPoller(self._sync._producer, "rmq-aio-delivery").start()

    async def send(
        self,
        msg: Message,
        selector: Any = None,
        arg: Any = None,
        sharding_key: bytes | str | None = None,
        *,
        timeout: float = SEND_TIMEOUT_S,
    ) -> SendResult:
        """Send ``msg`` and wait (without blocking the loop) for its acknowledgement."""
        if self._closed:
            raise IllegalStateError("AsyncProducer is closed")
        if msg.scheduled:
            write = await run_blocking(
                self._executor, self._sync._timer_write, msg, selector, arg, sharding_key, timeout
            )
            return await self._write(write, timeout)
        if not placement_reads_partitions(msg, selector, sharding_key):
            record = self._sync._record(msg, None, arg, None, timeout)  # no metadata needed
        else:
            record = await run_blocking(
                self._executor, self._sync._record, msg, selector, arg, sharding_key, timeout
            )
        self._delivery_thread()
        waiter = LoopDeliveryWaiter(asyncio.get_running_loop())
        self._sync._producer.produce(msg.topic, msg.value, **record, on_delivery=waiter)
        await waiter.delivered_within(f"sending to {msg.topic}", timeout)
        return SendResult(msg.topic, waiter.partition, waiter.offset)

    async def recall_message(
        self, message_id: str, *, timeout: float = SEND_TIMEOUT_S
    ) -> SendResult:
        """Cancel the timer message ``message_id``, as :meth:`Producer.recall_message`
        (:class:`TimerRecallRefused` past the coordinators' bound)."""
        if self._closed:
            raise IllegalStateError("AsyncProducer is closed")
        deadline = time.monotonic() + timeout
        write = await run_blocking(self._executor, self._sync._timers.cancel_record, message_id)
        result = await self._write(write, timeout)
        refused = await run_blocking(
            self._executor,
            self._sync._timers.cancel_refusal,
            write,
            result.offset,
            max(0.1, deadline - time.monotonic()),
        )
        if refused is not None:
            raise TimerRecallRefused(refused)
        return result

    async def _write(self, write: TimerWrite, timeout: float) -> SendResult:
        self._delivery_thread()
        waiter = LoopDeliveryWaiter(asyncio.get_running_loop())
        self._sync._producer.produce(
            write.topic,
            write.value,
            key=write.key,
            partition=write.partition,
            headers=produce_headers(write.headers),
            timestamp=write.timestamp or 0,
            on_delivery=waiter,
        )
        await waiter.delivered_within(f"writing to {write.topic} for {write.message_id}", timeout)
        return SendResult(write.topic, waiter.partition, waiter.offset, write.message_id)

    async def partitions_for(self, topic: str, timeout: float = SEND_TIMEOUT_S) -> list[int]:
        """Partition ids of ``topic`` (cached for a short while)."""
        return await run_blocking(self._executor, self._sync.partitions_for, topic, timeout)

    async def flush(self, timeout: float = SEND_TIMEOUT_S) -> int:
        """Wait for queued records; returns how many are still queued."""
        return await run_blocking(self._executor, self._sync.flush, timeout)

    async def close(self, timeout: float = SEND_TIMEOUT_S) -> None:
        """Flush what is queued (bounded by ``timeout``), stop the delivery thread.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await run_blocking(self._executor, self._close, timeout)
        finally:
            if self._own_executor:
                self._executor.shutdown(wait=False)

    def _close(self, timeout: float) -> None:
        # The delivery thread stops first: close() destroys the client it polls (close's
        # own flush serves the last reports).
        with self._poller_lock:
            poller = self._poller
        if poller is not None:
            poller.stop(timeout)
        self._sync.close(timeout)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
