"""The RocketMQ 2.x Python client's API (``from rocketmq.client import ...``, PyPI
``rocketmq-client-python`` 2.0.0, a binding of the C++ client) on Kafka: change the import to
``from rmq_semantics.compat.rocketmq_client import ...``; the name-server address is the
Kafka bootstrap list.

Over the product's ``Producer`` (``send_sync``, ``send_oneway``,
``send_orderly_with_sharding_key``, delay levels), ``TransactionProducer`` (the producer
group is the ``group_id``) and ``PushConsumer`` (``OrderlyConsumer`` for ``orderly=True``).
What differs from the original is listed on the docs' migration page."""

from __future__ import annotations

from rmq_semantics.compat.v2.clients import Producer, PushConsumer, TransactionMQProducer
from rmq_semantics.compat.v2.model import (
    ConsumeStatus,
    Message,
    MessageModel,
    MessageProperty,
    ReceivedMessage,
    SendResult,
    SendStatus,
    TransactionStatus,
)

__all__ = [
    "ConsumeStatus",
    "Message",
    "MessageModel",
    "MessageProperty",
    "Producer",
    "PushConsumer",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "TransactionMQProducer",
    "TransactionStatus",
]
