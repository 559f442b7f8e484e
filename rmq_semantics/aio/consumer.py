"""``AsyncConsumer``: ``Consumer`` for asyncio, ``async for msg in consumer``."""

from __future__ import annotations

import collections
import logging
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError

from rmq_semantics.aio.bridge import new_executor, run_blocking
from rmq_semantics.consumer import Consumer
from rmq_semantics.errors import FatalKafkaError, IllegalStateError
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX

__all__ = ["AsyncConsumer"]

log = logging.getLogger(__name__)

# One consume call waits at most this long, so close() never waits longer for the thread.
CONSUME_SLICE_S = 0.1
# Records one consume call may take for the iterator.
CONSUME_BATCH = 500


class AsyncConsumer:
    """:class:`~rmq_semantics.Consumer` for asyncio: ``read_committed`` by default, never a
    system-topic record, RocketMQ's tag filter on ``subscribe``.

    ``async for msg in consumer`` yields records (``confluent_kafka.Message``) until
    :meth:`close`; error events are logged and skipped, a fatal one raises
    :class:`FatalKafkaError`. Every call to librdkafka runs on one thread of the consumer's
    own, so calls never overlap (the client is not to be used by two threads at once) and
    none blocks the loop.
    """

    def __init__(self, conf: dict, *, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> None:
        self._sync = Consumer(conf, topic_prefix=topic_prefix)
        self.topic_prefix = self._sync.topic_prefix
        self._executor = new_executor("consumer", threads=1)
        self._buffer: collections.deque = collections.deque()
        self._closed = False

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise IllegalStateError("AsyncConsumer is closed")
        return await run_blocking(self._executor, lambda: fn(*args, **kwargs))

    async def subscribe(self, topics: list[str], tags: str | None = None, **kwargs: Any) -> None:
        """``Consumer.subscribe``: RocketMQ's tag expression for all ``topics``."""
        await self._call(self._sync.subscribe, topics, tags, **kwargs)

    async def assign(self, partitions: list) -> None:
        await self._call(self._sync.assign, partitions)

    async def poll(self, timeout: float = CONSUME_SLICE_S) -> confluent_kafka.Message | None:
        """One record or event, or None after ``timeout`` (finite: it holds the thread)."""
        return await self._call(self._sync.poll, timeout)

    async def consume(self, num_messages: int = 1, timeout: float = CONSUME_SLICE_S) -> list:
        return await self._call(self._sync.consume, num_messages, timeout)

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        """``Consumer.commit`` (a synchronous one waits on the consumer's thread)."""
        return await self._call(self._sync.commit, *args, **kwargs)

    async def assignment(self) -> list:
        return await self._call(self._sync.assignment)

    @property
    def skipped_system_records(self) -> int:
        """Records of system topics that a pattern matched and this consumer dropped."""
        return self._sync.skipped_system_records

    @property
    def skipped_system_partitions(self) -> int:
        """System-topic partitions a subscription pattern matched, left out at assignment."""
        return self._sync.skipped_system_partitions

    @property
    def skipped_tag_records(self) -> int:
        """Records the tag filter left out."""
        return self._sync.skipped_tag_records

    # -- async for -----------------------------------------------------------------------
    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> confluent_kafka.Message:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            try:
                batch = await self._call(self._sync.consume, CONSUME_BATCH, CONSUME_SLICE_S)
            except IllegalStateError:
                raise StopAsyncIteration from None  # closed while waiting for the thread
            self._buffer.extend(self._usable(batch))
        return self._buffer.popleft()

    @staticmethod
    def _usable(batch: list) -> list:
        """Records of ``batch``; an error event is logged, a fatal one raised."""
        records = []
        for msg in batch:
            err = msg.error()
            if err is None:
                records.append(msg)
            elif err.fatal():
                raise FatalKafkaError.wrap("consuming", err)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer: %s", err.str())
        return records

    # -- lifecycle -----------------------------------------------------------------------
    async def close(self) -> None:
        """Leave the group, after the consume call in progress (at most
        ``CONSUME_SLICE_S``). Idempotent; an ``async for`` in progress ends."""
        if self._closed:
            return
        self._closed = True
        try:
            await run_blocking(self._executor, self._sync.close)
        finally:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
