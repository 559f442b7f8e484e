"""The RocketMQ 2.x clients, ``Producer``, ``TransactionMQProducer`` and ``PushConsumer``,
over the product's ``Producer``, ``TransactionProducer``, ``PushConsumer`` and
``OrderlyConsumer``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from rmq_semantics.compat.common import TopicFilters, kafka_conf
from rmq_semantics.compat.v2.model import (
    ConsumeStatus,
    Message,
    MessageModel,
    ReceivedMessage,
    SendResult,
    SendStatus,
    TransactionStatus,
    in_transaction,
    received,
    text_of,
)
from rmq_semantics.errors import ConfigError, IllegalStateError, MessageSizeError
from rmq_semantics.message import Message as ProductMessage
from rmq_semantics.orderly import ConsumeOrderlyStatus, OrderlyConsumer
from rmq_semantics.producer import SEND_TIMEOUT_S
from rmq_semantics.producer import Producer as ProductProducer
from rmq_semantics.push import ConsumeConcurrentlyStatus
from rmq_semantics.push import PushConsumer as ProductPushConsumer
from rmq_semantics.push.consumer import DEFAULT_PUSH_WORKERS
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX
from rmq_semantics.transaction import TransactionProducer
from rmq_semantics.transaction_api import LocalTransactionState, TransactionListener

__all__ = ["Producer", "PushConsumer", "TransactionMQProducer"]

log = logging.getLogger(__name__)
# A group new to Kafka starts at the oldest retained record, as RocketMQ's broker starts a
# new group at a queue's first message while that is still in memory.
NEW_GROUP_START = {"auto.offset.reset": "earliest"}


class _Client:
    """The address, credentials and Kafka conf every 2.x client sets the same way."""

    def __init__(self, kafka_conf: dict[str, Any] | None, topic_prefix: str) -> None:
        self._address: str | None = None
        self._credentials: tuple[str, str] = ("", "")
        self._kafka_conf = dict(kafka_conf or {})
        self.topic_prefix = topic_prefix

    def set_name_server_address(self, addr: str) -> None:
        """The Kafka bootstrap list (``host:port``, several separated by ``;``)."""
        self._address = text_of(addr, "addr")

    def set_name_server_domain(self, domain: str) -> None:
        """Refused: give the bootstrap list with ``set_name_server_address``."""
        raise ConfigError(
            "set_name_server_domain: a name-server lookup URL has no Kafka counterpart; "
            "call set_name_server_address with the bootstrap list"
        )

    def set_session_credentials(self, access_key: str, access_secret: str, channel: str) -> None:
        """SASL/PLAIN user and password (``channel`` is not used)."""
        self._credentials = (text_of(access_key, "access_key"), text_of(access_secret, "secret"))

    def _conf(self, **extra: Any) -> dict[str, Any]:
        if self._address is None:
            raise ConfigError("call set_name_server_address(bootstrap list) before start()")
        user, password = self._credentials
        return kafka_conf(
            self._address,
            username=user,
            password=password,
            extra={**extra, **self._kafka_conf},
        )


class Producer(_Client):
    """RocketMQ's producer: ``set_name_server_address``, ``start``, ``send_sync``,
    ``send_oneway``, ``send_orderly_with_sharding_key``, ``shutdown``. ``timeout`` is in ms;
    ``compress_level`` turns gzip on at that level; ``max_message_size`` refuses bigger
    bodies. Keyword-only, the product's: ``kafka_conf`` (librdkafka settings) and
    ``topic_prefix``."""

    def __init__(
        self,
        group_id: str,
        orderly: bool = False,
        timeout: int | None = None,
        compress_level: int | None = None,
        max_message_size: int | None = None,
        *,
        kafka_conf: dict[str, Any] | None = None,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
    ) -> None:
        super().__init__(kafka_conf, topic_prefix)
        self.group_id = text_of(group_id, "group_id")
        self.orderly = orderly
        self._timeout_s = SEND_TIMEOUT_S
        self._compress: dict[str, Any] = {}
        self._max_size: int | None = None
        self._producer: ProductProducer | None = None
        if timeout is not None:
            self.set_timeout(timeout)
        if compress_level is not None:
            self.set_compress_level(compress_level)
        if max_message_size is not None:
            self.set_max_message_size(max_message_size)

    def __enter__(self) -> Producer:
        self.start()
        return self

    def __exit__(self, exec_type: object, value: object, traceback: object) -> None:
        self.shutdown()

    def set_group(self, group_name: str) -> None:
        self.group_id = text_of(group_name, "group_name")

    def set_timeout(self, timeout: int) -> None:
        """How long a send waits for the broker (ms)."""
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
            raise ConfigError(f"timeout must be a positive int (ms), got {timeout!r}")
        self._timeout_s = timeout / 1000

    def set_compress_level(self, level: int) -> None:
        """gzip at ``level`` (librdkafka compresses whole batches, not single bodies)."""
        self._compress = {"compression.type": "gzip", "compression.level": level}

    def set_max_message_size(self, max_size: int) -> None:
        self._max_size = max_size

    def start(self) -> None:
        if self._producer is None:
            self._producer = ProductProducer(
                self._conf(**self._compress), topic_prefix=self.topic_prefix
            )

    def shutdown(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()

    def _started(self) -> ProductProducer:
        if self._producer is None:
            raise IllegalStateError("the producer is not started: call start()")
        return self._producer

    def _product(self, msg: Message) -> ProductMessage:
        if not isinstance(msg, Message):
            raise ConfigError(f"send takes a Message, got {msg!r}")
        if self._max_size is not None and len(msg.body or b"") > self._max_size:
            raise MessageSizeError(
                f"message body of {len(msg.body or b'')} bytes is over max_message_size "
                f"({self._max_size})"
            )
        return msg.product()

    def send_sync(self, msg: Message) -> SendResult:
        """Send and wait for the broker; a :class:`SendResult`."""
        result = self._started().send(self._product(msg), timeout=self._timeout_s)
        return _result(
            result.message_id or f"{result.topic}:{result.partition}:{result.offset}", result.offset
        )

    def send_oneway(self, msg: Message) -> None:
        """Send without a result (it still waits for the broker, so a failure raises)."""
        self.send_sync(msg)

    def send_orderly_with_sharding_key(self, msg: Message, sharding_key: str) -> SendResult:
        """Send to the partition of ``sharding_key`` (its messages stay in order)."""
        product = self._product(msg)
        result = self._started().send(
            product, sharding_key=text_of(sharding_key, "sharding_key"), timeout=self._timeout_s
        )
        return _result(f"{result.topic}:{result.partition}:{result.offset}", result.offset)


def _result(msg_id: str, offset: int) -> SendResult:
    return SendResult(SendStatus.OK, msg_id, offset)


_STATES = {
    TransactionStatus.COMMIT: LocalTransactionState.COMMIT_MESSAGE,
    TransactionStatus.ROLLBACK: LocalTransactionState.ROLLBACK_MESSAGE,
    TransactionStatus.UNKNOWN: LocalTransactionState.UNKNOW,
}


def _state(answer: Any, what: str) -> LocalTransactionState:
    if isinstance(answer, bool) or not isinstance(answer, int) or answer not in _STATES:
        log.warning("%s returned %r, not a TransactionStatus (counts as UNKNOWN)", what, answer)
        return LocalTransactionState.UNKNOW
    return _STATES[TransactionStatus(answer)]


class _Callbacks(TransactionListener):
    """The product's listener for 2.x callbacks: each send carries its own ``local_execute``
    (in the send's ``arg``), the producer its checker."""

    def __init__(self, checker: Callable[[ReceivedMessage], Any]) -> None:
        self.checker = checker

    def execute_local_transaction(self, msg: Any, arg: Any) -> LocalTransactionState:
        local_execute, user_args = arg
        answer = local_execute(ReceivedMessage(in_transaction(msg)), user_args)
        return _state(answer, "local_execute")

    def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return _state(self.checker(ReceivedMessage(in_transaction(msg))), "checker_callback")


class TransactionMQProducer(Producer):
    """RocketMQ's transactional producer: ``send_message_in_transaction(message,
    local_execute, user_args)`` writes a half message, calls ``local_execute(message,
    user_args)`` and commits or rolls back by its :class:`TransactionStatus`; UNKNOWN leaves
    it to ``checker_callback(message)``, asked by the coordinator. The producer group is
    ``group_id``. Plain sends work too."""

    def __init__(
        self,
        group_id: str,
        checker_callback: Callable[[ReceivedMessage], Any],
        user_args: Any = None,
        timeout: int | None = None,
        compress_level: int | None = None,
        max_message_size: int | None = None,
        *,
        kafka_conf: dict[str, Any] | None = None,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
    ) -> None:
        if not callable(checker_callback):
            raise ConfigError(f"checker_callback must be callable, got {checker_callback!r}")
        super().__init__(
            group_id,
            False,
            timeout,
            compress_level,
            max_message_size,
            kafka_conf=kafka_conf,
            topic_prefix=topic_prefix,
        )
        self._checker = checker_callback
        self.user_args = user_args
        self._transactional: TransactionProducer | None = None

    def __enter__(self) -> TransactionMQProducer:
        self.start()
        return self

    def start(self) -> None:
        """Connect, and answer this group's back-checks from now on."""
        super().start()
        if self._transactional is None:
            producer = TransactionProducer(
                self._conf(**self._compress),
                producer_group=self.group_id,
                listener=_Callbacks(self._checker),
                topic_prefix=self.topic_prefix,
                send_timeout_s=self._timeout_s,
            )
            producer.start()
            self._transactional = producer

    def shutdown(self) -> None:
        producer, self._transactional = self._transactional, None
        if producer is not None:
            producer.shutdown()
        super().shutdown()

    def send_message_in_transaction(
        self, message: Message, local_execute: Callable[..., Any], user_args: Any = None
    ) -> SendResult:
        """The transactional send; the result's ``msg_id`` is the transaction id."""
        if self._transactional is None:
            raise IllegalStateError("the producer is not started: call start()")
        result = self._transactional.send_message_in_transaction(
            self._product(message), (local_execute, user_args)
        )
        return _result(result.transaction_id, result.half_offset)


class PushConsumer(_Client):
    """RocketMQ's push consumer: ``subscribe(topic, callback, expression="*")`` per topic,
    ``start``, ``shutdown``. ``callback(message)`` returns ``ConsumeStatus``;
    ``RECONSUME_LATER`` (or a raise) redelivers it later (16 times at most, then the group's
    DLQ topic). ``orderly=True`` consumes each partition in order, one message at a time,
    retrying a message in place. Keyword-only, the product's: ``kafka_conf`` and
    ``topic_prefix``."""

    def __init__(
        self,
        group_id: str,
        orderly: bool = False,
        message_model: MessageModel = MessageModel.CLUSTERING,
        *,
        kafka_conf: dict[str, Any] | None = None,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
    ) -> None:
        super().__init__(kafka_conf, topic_prefix)
        self.group_id = text_of(group_id, "group_id")
        self.orderly = orderly
        self.set_message_model(message_model)
        self._filters = TopicFilters()
        self._callbacks: dict[str, Callable[[ReceivedMessage], Any]] = {}
        self._threads = DEFAULT_PUSH_WORKERS
        self._instance: str | None = None
        self._inner: ProductPushConsumer | OrderlyConsumer | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> PushConsumer:
        self.start()
        return self

    def __exit__(self, exec_type: object, value: object, traceback: object) -> None:
        self.shutdown()

    def set_message_model(self, model: MessageModel) -> None:
        if model != MessageModel.CLUSTERING:
            raise ConfigError(
                "only MessageModel.CLUSTERING is supported (a Kafka consumer group); for "
                "broadcasting give each consumer its own group_id"
            )

    def set_group(self, group_id: str) -> None:
        self.group_id = text_of(group_id, "group_id")

    def set_thread_count(self, thread_count: int) -> None:
        self._threads = thread_count

    def set_message_batch_max_size(self, max_size: int) -> None:
        """Accepted, not used: the callback takes one message (as the 2.x client's does)."""

    def set_instance_name(self, name: str) -> None:
        self._instance = text_of(name, "name")

    def subscribe(
        self, topic: str, callback: Callable[[ReceivedMessage], Any], expression: str = "*"
    ) -> None:
        """Consume ``topic``'s messages whose tag matches ``expression`` with ``callback``."""
        if self._inner is not None:
            raise IllegalStateError("subscribe before start()")
        if not callable(callback):
            raise ConfigError(f"callback must be callable, got {callback!r}")
        name = text_of(topic, "topic")
        self._filters.add(name, text_of(expression, "expression"))
        self._callbacks[name] = callback

    def _consumed(self, msgs: list[Any]) -> bool:
        for msg in msgs:
            if not self._filters.keeps(msg.topic, msg.headers):
                continue
            try:
                status = self._callbacks[msg.topic](ReceivedMessage(received(msg)))
            except Exception:
                log.exception(
                    "%s[%d]@%d: the callback raised", msg.topic, msg.partition, msg.offset
                )
                return False
            if status != ConsumeStatus.CONSUME_SUCCESS:
                if status != ConsumeStatus.RECONSUME_LATER:
                    log.warning("the callback returned %r, not a ConsumeStatus", status)
                return False
        return True

    def _concurrently(self, msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
        if self._consumed(msgs):
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    def _orderly(self, msgs: list[Any], context: Any) -> ConsumeOrderlyStatus:
        if self._consumed(msgs):
            return ConsumeOrderlyStatus.SUCCESS
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    def start(self) -> None:
        """Join the group and consume in the background."""
        with self._lock:
            if self._inner is not None:
                return
            if not self._callbacks:
                raise IllegalStateError("subscribe(topic, callback) before start()")
            conf = self._conf(**NEW_GROUP_START)
            conf["group.id"] = self.group_id
            inner: ProductPushConsumer | OrderlyConsumer
            if self.orderly:
                inner = OrderlyConsumer(
                    conf,
                    listener=self._orderly,
                    topic_prefix=self.topic_prefix,
                    client_id=self._instance,
                )
            else:
                inner = ProductPushConsumer(
                    conf,
                    listener=self._concurrently,
                    max_workers=self._threads,
                    topic_prefix=self.topic_prefix,
                    client_id=self._instance,
                )
            inner.subscribe(self._filters.topics, tags=self._filters.common())
            inner.start()
            self._inner = inner

    def shutdown(self) -> None:
        """Finish running callbacks, commit, leave the group. Idempotent."""
        with self._lock:
            inner, self._inner = self._inner, None
        if inner is not None:
            inner.shutdown()
