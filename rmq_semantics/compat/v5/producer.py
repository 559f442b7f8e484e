"""RocketMQ 5's ``Producer`` (normal, FIFO, delayed and transactional sends), its
``Transaction`` and ``TransactionChecker``, over the product's ``Producer`` and
``TransactionProducer``.

RocketMQ 5 has no producer group: its proxy registers a producer as the producer group
*named after each topic it declared*, and routes a transaction's back-check to a producer of
the message's topic. So here: a transactional message's producer group is its topic's
(Kafka) name, every producer that declared the topic answers its checks, and tenant isolation
names the topic as a group in the tenants file (or ``producer_group=`` gives one group for all
of this producer's topics)."""

from __future__ import annotations

import abc
import logging
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rmq_semantics.compat.v5.model import (
    ClientConfiguration,
    Message,
    MessageQueue,
    SendReceipt,
    TransactionResolution,
)
from rmq_semantics.errors import ConfigError, IllegalStateError
from rmq_semantics.message import Message as ProductMessage
from rmq_semantics.message import SendResult
from rmq_semantics.producer import Producer as ProductProducer
from rmq_semantics.transaction import TransactionProducer
from rmq_semantics.transaction_api import (
    LocalTransactionState,
    TransactionListener,
    TransactionSendResult,
)

__all__ = ["Producer", "Transaction", "TransactionChecker", "producer_group_for"]

log = logging.getLogger(__name__)

# RocketMQ's client tries a send 3 times, each bounded by the request timeout.
SEND_ATTEMPTS = 3
# Threads of send_async and recall_message_async (their sends wait on one Kafka producer).
ASYNC_THREADS = 4

# By number: the real package's resolutions are protobuf ints.
_STATES: dict[int, LocalTransactionState] = {
    TransactionResolution.COMMIT.value: LocalTransactionState.COMMIT_MESSAGE,
    TransactionResolution.ROLLBACK.value: LocalTransactionState.ROLLBACK_MESSAGE,
}


def producer_group_for(topic: str, config: ClientConfiguration | None = None) -> str:
    """The producer group of ``topic``'s transactional messages: the topic's Kafka name (with
    its namespace), as RocketMQ 5's proxy names it. The name a tenants file gives the group."""
    return config.resource(topic) if config is not None else topic


class TransactionChecker(metaclass=abc.ABCMeta):
    """Answers a back-check of a transaction left open: return
    ``TransactionResolution.COMMIT`` or ``ROLLBACK`` (anything else, or a raise, leaves it
    open for the next check)."""

    @abc.abstractmethod
    def check(self, message: Message) -> TransactionResolution:
        """The outcome of ``message``'s local transaction."""


class _CheckerListener(TransactionListener):
    """The product's listener for a RocketMQ 5 producer: the local transaction is the
    application's code between ``send`` and ``commit``/``rollback``, so the send itself
    leaves the transaction open; a back-check asks the checker."""

    def __init__(self, checker: TransactionChecker, config: ClientConfiguration) -> None:
        self.checker = checker
        self.config = config

    def execute_local_transaction(self, msg: Any, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        first = msg.messages[0] if hasattr(msg, "messages") else msg  # a product Transaction
        view = Message.received(
            self.config,
            topic=msg.topic,
            value=msg.value,
            headers=[*first.user_headers(), *first.rmq_headers()],
            message_id=msg.transaction_id,
            born_timestamp=msg.born_timestamp,
            delivery_attempt=msg.check_times,
        )
        answer = self.checker.check(view)
        if isinstance(answer, bool) or not isinstance(answer, int):
            log.warning(
                "txn %s: the checker returned %r, not a TransactionResolution (left open)",
                msg.transaction_id,
                answer,
            )
            return LocalTransactionState.UNKNOW
        return _STATES.get(int(answer), LocalTransactionState.UNKNOW)


class Transaction:
    """One transactional message: ``producer.send(msg, transaction)`` writes it as a half
    message (invisible), then ``commit()`` or ``rollback()``; left open, the checker decides."""

    def __init__(self, producer: Producer) -> None:
        self._lock = threading.Lock()
        self._producer = producer
        self._message: Message | None = None
        self._receipt: SendReceipt | None = None
        self._sent: tuple[TransactionProducer, TransactionSendResult] | None = None

    def add_half_message(self, message: Message) -> None:
        """Take ``message`` as this transaction's one message."""
        with self._lock:
            if message is None:
                raise ConfigError("add half message error, message is None")
            if self._message is not None:
                raise ConfigError(f"message already existed in transaction, topic:{message.topic}")
            self._message = message

    def add_send_receipt(self, send_receipt: SendReceipt) -> None:
        """Take the half message's receipt (its message id must be the message's)."""
        with self._lock:
            if self._message is None:
                raise ConfigError("add send receipt error, no message in transaction")
            if send_receipt is None:
                raise ConfigError("add send receipt error, send receipt is None")
            if self._message.message_id != send_receipt.message_id:
                raise ConfigError("can't add another send receipt to a half message")
            self._receipt = send_receipt

    @property
    def producer(self) -> Producer:
        """The producer that began it."""
        return self._producer

    def sent(self, producer: TransactionProducer, result: TransactionSendResult) -> None:
        """Record where the half message went (``Producer.send`` calls it)."""
        self._sent = (producer, result)

    def commit(self) -> None:
        """Make the message visible (promoted once by the coordinator)."""
        self._end(LocalTransactionState.COMMIT_MESSAGE)

    def rollback(self) -> None:
        """Drop the message; it is never delivered."""
        self._end(LocalTransactionState.ROLLBACK_MESSAGE)

    def _end(self, state: LocalTransactionState) -> None:
        if self._message is None:
            raise ConfigError("no message in transaction")
        if self._receipt is None or self._sent is None:
            raise ConfigError("no transaction_id in transaction, must send half message at first")
        producer, result = self._sent
        producer.end_transaction(result, state, timeout=self._producer.send_timeout_s)

    @property
    def message_id(self) -> str | None:
        return None if self._message is None else self._message.message_id


class Producer:
    """RocketMQ 5's producer: ``startup()``, ``send(msg, transaction=None)`` (a
    :class:`SendReceipt`), ``send_async`` (a ``concurrent.futures.Future``),
    ``begin_transaction()``, ``recall_message(topic, recall_handle)``, ``shutdown()``.

    ``topics`` are the topics it declares (with a ``checker``, it answers their back-checks
    from ``startup()`` on); a message's ``message_group`` places it in its group's partition,
    a ``delivery_timestamp`` makes it a timer message. Keyword-only, the product's:
    ``producer_group`` (one group for every topic's transactions, e.g. under tenant
    isolation), ``group_key`` / ``group_key_file`` (that group's key); other keyword
    arguments are the product ``Producer``'s timer settings (``max_delay_ms``,
    ``delay_levels``, ``timer_partitions``).
    """

    #: RocketMQ's send attempts; here each send is bounded by ``request_timeout`` times this.
    DEFAULT_MAX_SEND_ATTEMPTS = SEND_ATTEMPTS

    def __init__(
        self,
        client_configuration: ClientConfiguration,
        topics: Iterable[str] | None = None,
        checker: TransactionChecker | None = None,
        tls_enable: bool = False,
        *,
        producer_group: str | None = None,
        group_key: str | None = None,
        group_key_file: str | None = None,
        **settings: Any,
    ) -> None:
        if not isinstance(client_configuration, ClientConfiguration):
            raise ConfigError(
                f"client_configuration must be a ClientConfiguration, got {client_configuration!r}"
            )
        if isinstance(topics, str):
            topics = (topics,)
        self._config = client_configuration
        self._topics = list(topics or ())
        self._checker = checker
        self._tls = tls_enable
        self._group = producer_group
        self._group_key = group_key
        self._group_key_file = group_key_file
        self._settings = settings
        self.send_timeout_s = client_configuration.request_timeout * SEND_ATTEMPTS
        self._client_id = f"rmq5-producer@{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._producer: ProductProducer | None = None
        self._transactional: dict[str, TransactionProducer] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._running = False
        self._closed = False

    def __str__(self) -> str:
        return f"PRODUCER client_id:{self.client_id}"

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    @property
    def client_configuration(self) -> ClientConfiguration:
        return self._config

    def _conf(self) -> dict:
        return self._config.conf(tls=self._tls)

    def startup(self) -> None:
        """Connect; with a checker, answer the declared topics' back-checks from now on."""
        with self._lock:
            if self._closed:
                raise IllegalStateError("this producer was shut down; make a new one")
            if self._running:
                return
            self._producer = ProductProducer(
                self._conf(),
                topic_prefix=self._config.topic_prefix,
                producer_group=self._group,
                group_key=self._group_key,
                group_key_file=self._group_key_file,
                **self._settings,
            )
            self._executor = ThreadPoolExecutor(ASYNC_THREADS, thread_name_prefix="rmq5-send")
            self._running = True
        try:
            if self._checker is not None:
                for topic in self._topics:
                    self._transaction_producer(topic)
        except BaseException:
            self.shutdown()
            raise

    def _require_running(self) -> ProductProducer:
        if not self._running or self._producer is None:
            raise IllegalStateError("producer is not running now (call startup())")
        return self._producer

    def _pool(self) -> ThreadPoolExecutor:
        self._require_running()
        if self._executor is None:
            raise IllegalStateError("producer is not running now (call startup())")
        return self._executor

    def _transaction_producer(self, topic: str) -> TransactionProducer:
        group = self._group or producer_group_for(topic, self._config)
        with self._lock:
            found = self._transactional.get(group)
            if found is None:
                if self._checker is None:
                    raise ConfigError("Transaction checker should not be null")
                found = TransactionProducer(
                    self._conf(),
                    producer_group=group,
                    listener=_CheckerListener(self._checker, self._config),
                    topic_prefix=self._config.topic_prefix,
                    send_timeout_s=self.send_timeout_s,
                    group_key=self._group_key,
                    group_key_file=self._group_key_file,
                )
                found.start()
                self._transactional[group] = found
            return found

    def send(self, message: Message, transaction: Transaction | None = None) -> SendReceipt:
        """Send ``message`` and wait for the broker; with ``transaction``, as its half
        message (invisible until ``transaction.commit()`` or the checker commits it)."""
        producer = self._require_running()
        if transaction is not None:
            return self._send_half(message, transaction)
        sent = message.product(self._config, transactional=False)
        result = producer.send(sent, timeout=self.send_timeout_s)
        receipt = _receipt(message, sent, result)
        message.message_id = receipt.message_id
        return receipt

    def _send_half(self, message: Message, transaction: Transaction) -> SendReceipt:
        if not isinstance(transaction, Transaction) or transaction.producer is not self:
            raise ConfigError("transaction must come from this producer's begin_transaction()")
        sent = message.product(self._config, transactional=True)
        transaction.add_half_message(message)
        producer = self._transaction_producer(message.topic or "")
        result = producer.send_message_in_transaction(sent)
        message.message_id = result.transaction_id
        queue = MessageQueue(sent.topic, -1)
        receipt = SendReceipt(result.transaction_id, result.transaction_id, queue, -1)
        transaction.add_send_receipt(receipt)
        transaction.sent(producer, result)
        return receipt

    def send_async(self, message: Message) -> Future[SendReceipt]:
        """``send`` in the background: a ``concurrent.futures.Future`` of its receipt."""
        return self._pool().submit(self.send, message)

    def recall_message(self, topic: str, recall_handle: str) -> str:
        """Cancel a delayed message before it is due (its receipt's ``recall_handle``);
        returns its message id. One already delivered stays delivered."""
        self._require_running().recall_message(recall_handle, timeout=self.send_timeout_s)
        return recall_handle

    def recall_message_async(self, topic: str, recall_handle: str) -> Future[str]:
        """``recall_message`` in the background."""
        return self._pool().submit(self.recall_message, topic, recall_handle)

    def begin_transaction(self) -> Transaction:
        """A new transaction (this producer needs a checker)."""
        self._require_running()
        if self._checker is None:
            raise ConfigError("Transaction checker should not be null")
        return Transaction(self)

    def shutdown(self) -> None:
        """Wait for async sends, flush, stop answering checks. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed, self._running = True, False
            executor, producer = self._executor, self._producer
            transactional = list(self._transactional.values())
        if executor is not None:
            executor.shutdown(wait=True)
        for each in transactional:
            each.shutdown()
        if producer is not None:
            producer.close()

    def __enter__(self) -> Producer:
        self.startup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _receipt(message: Message, sent: ProductMessage, result: SendResult) -> SendReceipt:
    if result.message_id is not None:  # a timer message: placed when it is delivered
        queue = MessageQueue(sent.topic, -1)
        return SendReceipt(result.message_id, None, queue, -1, recall_handle=result.message_id)
    queue = MessageQueue(sent.topic, result.partition)
    message_id = f"{result.topic}:{result.partition}:{result.offset}"
    return SendReceipt(message_id, None, queue, result.offset)
