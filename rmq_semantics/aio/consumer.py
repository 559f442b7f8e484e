"""``AsyncConsumer``: ``Consumer`` for asyncio, ``async for msg in consumer``."""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

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
    :class:`FatalKafkaError`. Only records handed to the application have their offsets
    stored (as each is yielded, or returned by ``poll``/``consume``), so a commit, auto
    commit or ``close()`` never covers a prefetched record the loop did not see.
    Every call to librdkafka runs on one thread of the consumer's
    own, so calls never overlap (the client is not to be used by two threads at once) and
    none blocks the loop.
    """

    def __init__(self, conf: dict, *, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> None:
        # librdkafka would store the offset of every record consume() returns, and the
        # iterator prefetches a batch: a commit (or auto commit) would cover records the
        # application never saw. So offsets are stored here, as records are handed out.
        self._store_seen = isinstance(conf, Mapping) and str(
            conf.get("enable.auto.offset.store", True)
        ).lower() not in ("false", "0")
        if isinstance(conf, Mapping):
            conf = {**conf, "enable.auto.offset.store": False}
        self._sync = Consumer(conf, topic_prefix=topic_prefix)
        self.topic_prefix = self._sync.topic_prefix
        self._executor = new_executor("consumer", threads=1)
        # (record, handed out?) in offset order; the others the tag filter skipped.
        self._buffer: collections.deque[tuple[confluent_kafka.Message, bool]] = collections.deque()
        self._to_store: dict[tuple[str, int], int] = {}  # next offset of what was passed
        self._closed = False

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise IllegalStateError("AsyncConsumer is closed")
        stores = self._take_stores()
        return await run_blocking(self._executor, lambda: self._stored(stores, fn(*args, **kwargs)))

    def _take_stores(self) -> dict[tuple[str, int], int]:
        stores, self._to_store = self._to_store, {}
        return stores

    def _stored(self, stores: dict[tuple[str, int], int], result: Any = None) -> Any:
        """On the consumer's thread: store the offsets of what was handed out or skipped
        (before ``result``'s call returns to the loop); returns ``result``."""
        if stores:
            try:
                self._sync.store_offsets(
                    offsets=[TopicPartition(t, p, offset) for (t, p), offset in stores.items()]
                )
            except KafkaException as exc:  # e.g. revoked meanwhile: the new owner reads it
                log.info("consumer: storing offsets %s: %s", stores, exc.args[0].str())
        return result

    def _pass(self, msg: confluent_kafka.Message) -> None:
        self._to_store[(msg.topic(), msg.partition())] = msg.offset() + 1

    def _handed(self, records: list) -> list:
        """``poll``/``consume`` hand records out at once: their offsets are stored."""
        if self._store_seen:
            for msg in records:
                if msg.error() is None:
                    self._pass(msg)
        return records

    async def subscribe(self, topics: list[str], tags: str | None = None, **kwargs: Any) -> None:
        """``Consumer.subscribe``: RocketMQ's tag expression for all ``topics``."""
        await self._call(self._sync.subscribe, topics, tags, **kwargs)

    async def assign(self, partitions: list) -> None:
        await self._call(self._sync.assign, partitions)

    async def poll(self, timeout: float = CONSUME_SLICE_S) -> confluent_kafka.Message | None:
        """One record or event, or None after ``timeout`` (finite: it holds the thread)."""
        msg = await self._call(self._sync.poll, timeout)
        if msg is not None:
            self._handed([msg])
        return msg

    async def consume(self, num_messages: int = 1, timeout: float = CONSUME_SLICE_S) -> list:
        return self._handed(await self._call(self._sync.consume, num_messages, timeout))

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
        """The next record; its offset is stored as it is handed out (with
        ``enable.auto.offset.store`` on, the default), so a commit covers only records the
        loop saw. Records the tag filter skips are stored as they are passed."""
        while True:
            while self._buffer:
                msg, visible = self._buffer.popleft()
                if self._store_seen or not visible:
                    self._pass(msg)
                if visible:
                    return msg
            if self._closed:
                raise StopAsyncIteration
            try:
                batch = await self._call(self._raw_consume)
            except IllegalStateError:
                raise StopAsyncIteration from None  # closed while waiting for the thread
            self._buffer.extend(batch)

    def _raw_consume(self) -> list[tuple[confluent_kafka.Message, bool]]:
        """On the consumer's thread: a batch, each record with whether it is handed out;
        records of a system topic (assigned by hand through the raw client) are dropped."""
        sync = self._sync
        batch = sync._consumer.consume(CONSUME_BATCH, CONSUME_SLICE_S)
        return [
            (msg, skipped is None)
            for msg in self._usable(batch)
            if (skipped := sync._skipped(msg)) != "system"
        ]

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
        stores = self._take_stores()
        try:
            await run_blocking(self._executor, lambda: self._close_stored(stores))
        finally:
            self._executor.shutdown(wait=False)

    def _close_stored(self, stores: dict[tuple[str, int], int]) -> None:
        self._stored(stores)  # before close(), whose auto commit then covers them
        self._sync.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
