"""The RocketMQ 5 Python client's API (``import rocketmq``, PyPI ``rocketmq-python-client``
5.1.2) on Kafka: change ``from rocketmq import ...`` to
``from rmq_semantics.compat.rocketmq import ...`` and point ``ClientConfiguration``'s
endpoints at the Kafka bootstrap list.

Every name keeps RocketMQ's meaning and units (seconds where its client takes seconds); what
differs is on the docs' migration page. A transactional message's back-check goes to the
producers that declared its topic (the topic is the producer group, as RocketMQ 5's proxy
has it): see :func:`producer_group_for`."""

from __future__ import annotations

from rmq_semantics.compat.v5.consumer import (
    ConsumeResult,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)
from rmq_semantics.compat.v5.model import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    FilterType,
    Message,
    MessageQueue,
    SendReceipt,
    TransactionResolution,
)
from rmq_semantics.compat.v5.producer import (
    Producer,
    Transaction,
    TransactionChecker,
    producer_group_for,
)

__all__ = [
    "ClientConfiguration",
    "ConsumeResult",
    "Credentials",
    "FilterExpression",
    "FilterType",
    "Message",
    "MessageListener",
    "MessageQueue",
    "Producer",
    "PushConsumer",
    "SendReceipt",
    "SimpleConsumer",
    "Transaction",
    "TransactionChecker",
    "TransactionResolution",
    "producer_group_for",
]
