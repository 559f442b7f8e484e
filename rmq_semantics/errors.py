"""The one error family of the product.

Every exception raised by ``rmq_semantics`` and the coordinator derives from
:class:`RmqError`; each carries a stable ``code`` and says whether retrying the same
call can succeed (``retriable``). Subclasses also derive the matching builtin so callers
can keep catching ``ValueError``/``TimeoutError``/``RuntimeError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the pure cores import this module and no Kafka client
    from confluent_kafka import KafkaError

__all__ = [
    "AuthenticationError",
    "BarrierRollback",
    "BrokerUnavailableError",
    "CommitRefusedError",
    "ConfigError",
    "ConsumeTimeoutError",
    "EmbeddedKafkaError",
    "FatalKafkaError",
    "IllegalStateError",
    "IllegalTransitionError",
    "KafkaOperationError",
    "LockLostError",
    "MalformedRecordError",
    "MessageSizeError",
    "ReceiptError",
    "RmqError",
    "RmqTimeoutError",
    "SelectorError",
    "SparkJobError",
    "SystemTopicError",
    "TimerRecallRefused",
    "TransactionAborted",
    "TransactionSizeError",
    "UnknownPartitionError",
    "UnknownTopicError",
]


class RmqError(Exception):
    """Base of every error this product raises."""

    code: str = "rmq_error"
    retriable: bool = False


class ConfigError(RmqError, ValueError):
    """A setting is missing or out of range; the message names the field and the value."""

    code = "config"


class SystemTopicError(ConfigError):
    """A business client was pointed at one of the product's system topics."""

    code = "system_topic"


class SelectorError(RmqError, ValueError):
    """A MessageQueueSelector returned a partition the topic does not have."""

    code = "selector"


class MalformedRecordError(RmqError, ValueError):
    """A record on a system topic could not be decoded."""

    code = "malformed_record"


class IllegalTransitionError(RmqError, RuntimeError):
    """A lifecycle (half message, queue lock) was asked to make a move it does not allow."""

    code = "illegal_transition"


class IllegalStateError(RmqError, RuntimeError):
    """An object was used in a state that does not allow the call (closed, not started)."""

    code = "illegal_state"


class ReceiptError(RmqError, RuntimeError):
    """A SimpleConsumer's ``ack`` or ``change_invisible_duration`` named a receipt that is no
    longer the message's current delivery (acked, past its invisible duration, delivered
    again, or from before a rebalance): RocketMQ's INVALID_RECEIPT_HANDLE."""

    code = "invalid_receipt_handle"


class RmqTimeoutError(RmqError, TimeoutError):
    """A blocking call did not complete within its timeout."""

    code = "timeout"
    retriable = True


class LockLostError(RmqError, RuntimeError):
    """An orderly consumer no longer holds the queue lock it needs."""

    code = "lock_lost"


class EmbeddedKafkaError(RmqError, RuntimeError):
    """The embedded broker could not be set up, started or stopped."""

    code = "embedded_kafka"


class KafkaOperationError(RmqError, RuntimeError):
    """A Kafka client call failed; ``kafka_error`` keeps librdkafka's error."""

    code = "kafka"

    def __init__(self, message: str, kafka_error: KafkaError | None = None) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error

    @property
    def retriable(self) -> bool:  # type: ignore[override]  # a property for a class attribute
        if self.kafka_error is None:
            return False
        # Here, not at the top: the pure cores import this module and no Kafka client.
        from rmq_semantics.retry import retriable_kafka_error

        return retriable_kafka_error(self.kafka_error)

    @classmethod
    def wrap(cls, what: str, error: KafkaError) -> KafkaOperationError:
        return cls(f"{what}: {error.str()} ({error.name()})", error)


class BrokerUnavailableError(KafkaOperationError, ConnectionError):
    """No broker answered at the configured bootstrap servers within the call's timeout.

    Check ``bootstrap.servers`` and that the brokers run and are reachable from here.
    """

    code = "broker_unavailable"

    @property
    def retriable(self) -> bool:  # type: ignore[override]  # a property for a class attribute
        return True


class AuthenticationError(KafkaOperationError):
    """The broker refused the client's credentials (SASL) or its TLS handshake failed.

    Retrying with the same settings cannot succeed: fix ``security.protocol``, ``sasl.*`` or
    ``ssl.*`` (``--kafka-option`` / ``RMQ_KAFKA_*`` on the command line).
    """

    code = "authentication"

    @property
    def retriable(self) -> bool:  # type: ignore[override]  # a property for a class attribute
        return False


class FatalKafkaError(KafkaOperationError):
    """A transactional producer is fenced or broken; the process that owns it must stop.

    The one fatal error of the coordinator's services: another instance with the same
    transactional id took over, or librdkafka raised a fatal error.
    """

    code = "kafka_fatal"

    @property
    def retriable(self) -> bool:  # type: ignore[override]  # a property for a class attribute
        return False


class TransactionAborted(RmqError, RuntimeError):
    """A Kafka transaction was aborted; the caller replays from its committed offsets."""

    code = "transaction_aborted"
    retriable = True


class CommitRefusedError(RmqError):
    """The group refused an offset commit (it is rebalancing); retried while locked."""

    code = "commit_refused"
    retriable = True


class SparkJobError(RmqError, RuntimeError):
    """The streaming query failed; the message carries Spark's reason."""

    code = "spark_job"


class UnknownPartitionError(ConfigError):
    """A message names a partition its topic does not have (RocketMQ's queue check)."""

    code = "unknown_partition"


class UnknownTopicError(ConfigError):
    """A message names a topic that does not exist (a fresh metadata read said so): RocketMQ's
    "topic route not found", refused before anything is written."""

    code = "unknown_topic"


class MessageSizeError(RmqError, ValueError):
    """A message's body is empty, or the message is over its topic's ``max.message.bytes``
    (RocketMQ's ``Validators.checkMessage``): refused before anything is written."""

    code = "message_size"


class ConsumeTimeoutError(RmqTimeoutError):
    """A concurrent listener call ran past ``consume_timeout_ms`` (RocketMQ's
    ``consumeTimeout``): its messages are reconsumed later."""

    code = "consume_timeout"


class BarrierRollback(RmqError, RuntimeError):
    """A back-check decided ROLLBACK before this local transaction began (its barrier row
    was already there): the local transaction is refused before its body runs."""

    code = "barrier_rollback"


class TransactionSizeError(RmqError, ValueError):
    """A multi-message transaction is empty, or over ``max_transaction_messages`` or
    ``max_transaction_bytes``; raised before anything is written."""

    code = "transaction_size"


class TimerRecallRefused(RmqError, RuntimeError):
    """``recall_message`` wrote its cancel past the coordinators' bound on the cancels of
    its timer partition (``timer_cancels_max``): the coordinators do not hold it, and the
    message is delivered at its time. The message says how many there were."""

    code = "timer_recall_refused"
