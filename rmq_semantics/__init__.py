"""RocketMQ semantics on Apache Kafka: transactional messages with back-check, ordered
consumption with queue locks, and RocketMQ 5's SimpleConsumer. See DESIGN.md for the
contract."""

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
    ReceiptError,
    RmqError,
    RmqTimeoutError,
    SelectorError,
    SystemTopicError,
    TimerRecallRefused,
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
from rmq_semantics.settings import (
    OrderlyConsumerSettings,
    ProducerSettings,
    PushConsumerSettings,
    SimpleConsumerSettings,
)
from rmq_semantics.simple.consumer import (
    FilterExpression,
    FilterType,
    MessageView,
    SimpleConsumer,
)
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
    "FilterExpression",
    "FilterType",
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
    "MessageView",
    "OrderlyConsumer",
    "OrderlyConsumerSettings",
    "OrderlyMessage",
    "PartitionStatus",
    "Producer",
    "ProducerSettings",
    "PushConsumer",
    "PushConsumerSettings",
    "PushMessage",
    "ReceiptError",
    "RmqError",
    "RmqTimeoutError",
    "SelectMessageQueueByHash",
    "SelectMessageQueueByRandom",
    "SelectorError",
    "SendResult",
    "SimpleConsumer",
    "SimpleConsumerSettings",
    "SystemTopicError",
    "SystemTopics",
    "TimerRecallRefused",
    "Transaction",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionSizeError",
    "UnknownPartitionError",
    "UnknownTopicError",
    "__version__",
]
