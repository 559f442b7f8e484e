"""RocketMQ semantics on Apache Kafka: transactional messages with back-check, and ordered
consumption with queue locks. See DESIGN.md for the contract."""

from importlib.metadata import PackageNotFoundError, version

from rmq_semantics.aio import AsyncConsumer, AsyncProducer, AsyncTransactionProducer
from rmq_semantics.consumer import Consumer
from rmq_semantics.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ConfigError,
    EmbeddedKafkaError,
    IllegalTransitionError,
    KafkaOperationError,
    LockLostError,
    MalformedRecordError,
    MessageSizeError,
    RmqError,
    RmqTimeoutError,
    SelectorError,
    SystemTopicError,
    TransactionSizeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from rmq_semantics.message import Message, SendResult
from rmq_semantics.orderly import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
    OrderlyConsumer,
    OrderlyMessage,
    PartitionStatus,
)
from rmq_semantics.producer import Producer
from rmq_semantics.push import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
    PushConsumer,
    PushMessage,
)
from rmq_semantics.selector import (
    MessageQueueSelector,
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
)
from rmq_semantics.settings import ProducerSettings
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, SystemTopics
from rmq_semantics.transaction import (
    LocalTransactionState,
    Transaction,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)

try:
    # One source of truth: pyproject.toml's version, as installed.
    __version__ = version("rmq-semantics")
except PackageNotFoundError:  # a source tree on sys.path that pip never installed
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_TOPIC_PREFIX",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncTransactionProducer",
    "AuthenticationError",
    "BrokerUnavailableError",
    "ConfigError",
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "Consumer",
    "EmbeddedKafkaError",
    "IllegalTransitionError",
    "KafkaOperationError",
    "LocalTransactionState",
    "LockLostError",
    "MalformedRecordError",
    "Message",
    "MessageListenerConcurrently",
    "MessageListenerOrderly",
    "MessageQueueSelector",
    "MessageSizeError",
    "OrderlyConsumer",
    "OrderlyMessage",
    "PartitionStatus",
    "Producer",
    "ProducerSettings",
    "PushConsumer",
    "PushMessage",
    "RmqError",
    "RmqTimeoutError",
    "SelectMessageQueueByHash",
    "SelectMessageQueueByRandom",
    "SelectorError",
    "SendResult",
    "SystemTopicError",
    "SystemTopics",
    "Transaction",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionSizeError",
    "UnknownPartitionError",
    "UnknownTopicError",
    "__version__",
]
