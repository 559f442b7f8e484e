"""The asyncio API: :class:`AsyncTransactionProducer`, :class:`AsyncProducer` and
:class:`AsyncConsumer`, with the contract of their synchronous classes and ``await`` /
``async with`` / ``async for``.

What runs where: every call runs on the caller's event loop, and nothing there blocks.
Records are queued with librdkafka's non-blocking ``produce``; delivery reports come on the
producer's delivery thread (:class:`~rmq_semantics.producer.DeliveryPoller`) and resolve
asyncio futures through ``loop.call_soon_threadsafe``. librdkafka calls that block (metadata,
flush, consume, close) and synchronous listeners run on a small executor. Back-checks
arrive on the check pool's threads; an ``async def check_local_transaction`` is run on the
producer's loop and waited for there.
"""

from rmq_semantics.aio.consumer import AsyncConsumer
from rmq_semantics.aio.producer import AsyncProducer
from rmq_semantics.aio.transaction import AsyncTransactionProducer

__all__ = ["AsyncConsumer", "AsyncProducer", "AsyncTransactionProducer"]
