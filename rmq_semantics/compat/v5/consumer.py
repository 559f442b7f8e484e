"""RocketMQ 5's consumers: ``SimpleConsumer`` over the product's ``SimpleConsumer``, and
``PushConsumer`` (a ``MessageListener`` returning ``ConsumeResult``) over the product's
``PushConsumer``, which consumes the messages of a ``message_group`` in order by itself (a
RocketMQ 5 client does so for what the server's FIFO group hands it; no flag is needed)."""

from __future__ import annotations

import abc
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from enum import Enum
from typing import Any

from rmq_semantics.compat.common import TopicFilters
from rmq_semantics.compat.v5.model import (
    ClientConfiguration,
    FilterExpression,
    Message,
    filter_expression,
)
from rmq_semantics.errors import ConfigError, IllegalStateError
from rmq_semantics.push import ConsumeConcurrentlyStatus
from rmq_semantics.push import PushConsumer as ProductPushConsumer
from rmq_semantics.push.consumer import DEFAULT_PUSH_WORKERS
from rmq_semantics.settings import PushConsumerSettings, load
from rmq_semantics.simple.consumer import FilterExpression as ProductFilter
from rmq_semantics.simple.consumer import MessageView
from rmq_semantics.simple.consumer import SimpleConsumer as ProductSimpleConsumer

__all__ = ["ConsumeResult", "MessageListener", "PushConsumer", "SimpleConsumer"]

# A group new to Kafka starts at the oldest retained record, as RocketMQ's broker starts a
# new group at a queue's first message while that is still in memory.
NEW_GROUP_START = {"auto.offset.reset": "earliest"}
# RocketMQ's ClientType numbers, the consumers' client_type defaults (accepted, not used).
PUSH_CONSUMER, SIMPLE_CONSUMER = 2, 3
# RocketMQ 5's push consumer: 17 attempts, i.e. 16 redeliveries, then the DLQ.
MAX_RECONSUME_TIMES = 16


def _group(consumer_group: Any) -> str:
    if not isinstance(consumer_group, str) or not consumer_group.strip():
        raise ConfigError(f"consumer_group should not be blank, got {consumer_group!r}")
    return consumer_group


def _chained(source: Future[Any], convert: Callable[[Any], Any]) -> Future[Any]:
    out: Future[Any] = Future()

    def done(finished: Future[Any]) -> None:
        try:
            out.set_result(convert(finished.result()))
        except BaseException as exc:
            out.set_exception(exc)

    source.add_done_callback(done)
    return out


def _view_of(message: Message) -> MessageView:
    if not isinstance(message, Message) or not isinstance(message.view, MessageView):
        raise ConfigError("ack and change_invisible_duration take a message receive() returned")
    return message.view


class _Consumer:
    """What RocketMQ's two consumers share: their group, configuration and topics."""

    _config: ClientConfiguration
    _group: str
    _client_id: str

    @property
    def consumer_group(self) -> str:
        return self._group

    @property
    def client_configuration(self) -> ClientConfiguration:
        return self._config

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def topics(self) -> list[str]:
        """The subscribed topics."""
        return sorted(self._config.local(t) for t in self._topic_names())

    def _topic_names(self) -> list[str]:
        raise NotImplementedError

    def is_lite_consumer(self) -> bool:
        """Always False: lite topics have no counterpart here."""
        return False


class SimpleConsumer(_Consumer):
    """RocketMQ 5's ``SimpleConsumer``: ``receive(max_message_num, invisible_duration)``
    (seconds), ``ack``, ``change_invisible_duration`` and their ``_async`` forms. Extra
    keyword arguments are the product's ``SimpleConsumerSettings`` (e.g.
    ``max_delivery_attempts``)."""

    def __init__(
        self,
        client_configuration: ClientConfiguration,
        consumer_group: str,
        subscription: Mapping[str, FilterExpression | str | None] | None = None,
        await_duration: float = 20,
        client_type: int = SIMPLE_CONSUMER,
        tls_enable: bool = False,
        **settings: Any,
    ) -> None:
        if await_duration is None:
            raise ConfigError("await_duration should not be None")
        self._config = client_configuration
        self._group = _group(consumer_group)
        self._client_id = f"{consumer_group}@{uuid.uuid4().hex[:12]}"
        self._await_duration = await_duration
        self._subscribed = {client_configuration.resource(t) for t in subscription or {}}
        self._inner = ProductSimpleConsumer(
            client_configuration.conf(tls=tls_enable, **NEW_GROUP_START),
            client_configuration.resource(consumer_group),
            {
                client_configuration.resource(topic): filter_expression(expression)
                for topic, expression in (subscription or {}).items()
            },
            topic_prefix=client_configuration.topic_prefix,
            client_id=self._client_id,
            await_duration=await_duration,
            **settings,
        )
        self._running = False

    def __str__(self) -> str:
        return f"SIMPLE_CONSUMER:{self._group}"

    def _topic_names(self) -> list[str]:
        return sorted(self._subscribed)

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def await_duration(self) -> float:
        """How long a receive waits for messages (s); fixed once constructed."""
        return self._await_duration

    def startup(self) -> None:
        """Join the consumer group."""
        self._inner.startup()
        self._running = True

    def shutdown(self) -> None:
        """Commit the acks and leave the group. Idempotent."""
        self._running = False
        self._inner.shutdown()

    def subscribe(self, topic: str, filter_expression: FilterExpression | None = None) -> None:
        """Add ``topic`` (or change its filter)."""
        expression = None if filter_expression is None else filter_expression.expression
        self._inner.subscribe(self._config.resource(topic), ProductFilter(expression or "*"))
        self._subscribed.add(self._config.resource(topic))

    def unsubscribe(self, topic: str) -> None:
        self._inner.unsubscribe(self._config.resource(topic))
        self._subscribed.discard(self._config.resource(topic))

    def _message(self, view: MessageView) -> Message:
        return Message.received(
            self._config,
            topic=view.topic,
            value=view.value,
            headers=view.headers,
            message_id=view.message_id,
            born_timestamp=view.born_timestamp,
            delivery_attempt=view.delivery_attempt,
            view=view,
        )

    def receive(self, max_message_num: int, invisible_duration: float) -> list[Message]:
        """Up to ``max_message_num`` messages, invisible to the group for
        ``invisible_duration`` seconds unless acked; waits up to ``await_duration``."""
        views = self._inner.receive(max_message_num, invisible_duration)
        return [self._message(view) for view in views]

    def receive_async(self, max_message_num: int, invisible_duration: float) -> Future[Any]:
        """``receive`` in the background: a Future of the list."""
        future = self._inner.receive_async(max_message_num, invisible_duration)
        return _chained(future, lambda views: [self._message(v) for v in views])

    def ack(self, message: Message) -> None:
        """Done with ``message``: never delivered to the group again."""
        self._inner.ack(_view_of(message))

    def ack_async(self, message: Message) -> Future[None]:
        """``ack`` in the background: a Future (RocketMQ's returns None) that resolves only
        once an offset commit carrying the ack landed, and fails with ReceiptError when the
        ack is refused or its partition goes first (the message will be delivered again)."""
        return self._inner.ack_async(_view_of(message))

    def change_invisible_duration(self, message: Message, invisible_duration: float) -> None:
        """Keep ``message`` invisible for ``invisible_duration`` seconds from now; ``message``
        then names the new delivery (ack it, not an older copy)."""
        view = self._inner.change_invisible_duration(_view_of(message), invisible_duration)
        message.bind_view(view)

    def change_invisible_duration_async(
        self, message: Message, invisible_duration: float
    ) -> Future[None]:
        """``change_invisible_duration`` in the background."""
        future = self._inner.change_invisible_duration_async(_view_of(message), invisible_duration)
        return _chained(future, message.bind_view)


class ConsumeResult(Enum):
    """A push listener's answer: ``SUCCESS`` acks, ``FAILURE`` redelivers later."""

    SUCCESS = 0
    FAILURE = 1


class MessageListener(metaclass=abc.ABCMeta):
    """A push consumer's callback: one message a call."""

    @abc.abstractmethod
    def consume(self, message: Message) -> ConsumeResult:
        """Process ``message``; return ``ConsumeResult.SUCCESS`` or ``FAILURE``."""


class PushConsumer(_Consumer):
    """RocketMQ 5's ``PushConsumer``: ``message_listener.consume(message)`` on
    ``consumption_thread_count`` threads; ``FAILURE`` (or a raise) redelivers the message
    with RocketMQ's backoff, up to 16 times, then it goes to the group's DLQ topic. A message
    with a ``message_group`` is consumed in order within its group, one at a time; its
    ``FAILURE`` retries it in place (``fifo_retry_interval_ms`` of the product's
    ``PushConsumerSettings``, 1 s), the group held behind it, then the DLQ.

    Keyword-only, the product's: ``fifo=False`` (every message concurrently, message groups
    too; env ``RMQ_FIFO``) and ``max_reconsume_times``. ``max_cache_message_count`` /
    ``_size`` and ``client_type`` are accepted and not used (the product bounds its queue by
    ``consumption_thread_count``)."""

    def __init__(
        self,
        client_configuration: ClientConfiguration,
        consumer_group: str,
        message_listener: MessageListener,
        subscription: Mapping[str, FilterExpression | str | None],
        max_cache_message_count: int = 1024,
        max_cache_message_size: int = 64 * 1024 * 1024,
        consumption_thread_count: int = DEFAULT_PUSH_WORKERS,
        tls_enable: bool = False,
        client_type: int = PUSH_CONSUMER,
        *,
        fifo: bool | None = None,
        max_reconsume_times: int = MAX_RECONSUME_TIMES,
    ) -> None:
        if not message_listener or not callable(getattr(message_listener, "consume", None)):
            raise ConfigError("message_listener should be a MessageListener (with consume)")
        if not subscription:
            raise ConfigError("subscription should not be empty: {topic: FilterExpression()}")
        self._config = client_configuration
        self._group = _group(consumer_group)
        self._client_id = f"{consumer_group}@{uuid.uuid4().hex[:12]}"
        self._listener = message_listener
        self._tls = tls_enable
        self._threads = consumption_thread_count
        self._settings = load(PushConsumerSettings, {"fifo": fifo})
        self._max_reconsume_times = max_reconsume_times
        self._filters = TopicFilters()
        for topic, expression in subscription.items():
            self._filters.add(client_configuration.resource(topic), filter_expression(expression))
        self._inner: ProductPushConsumer | None = None
        self._lock = threading.Lock()

    #: RocketMQ's attempts of a message (the first and 16 redeliveries), the default here.
    DEFAULT_CONSUME_ATTEMPTS = MAX_RECONSUME_TIMES + 1

    def __str__(self) -> str:
        return f"PUSH_CONSUMER:{self._group}"

    @property
    def fifo(self) -> bool:
        """Whether messages with a ``message_group`` are consumed in order per group."""
        return self._settings.fifo

    def _topic_names(self) -> list[str]:
        return self._filters.topics

    @property
    def is_running(self) -> bool:
        return self._inner is not None

    def subscribe(self, topic: str, filter_expression: FilterExpression | None = None) -> None:
        """Add ``topic`` before ``startup()`` (the subscription is fixed once started)."""
        self._before_start("subscribe")
        expression = None if filter_expression is None else filter_expression.expression
        self._filters.add(self._config.resource(topic), expression)

    def unsubscribe(self, topic: str) -> None:
        """Drop ``topic`` before ``startup()``."""
        self._before_start("unsubscribe")
        self._filters.remove(self._config.resource(topic))

    def _before_start(self, what: str) -> None:
        if self._inner is not None:
            raise IllegalStateError(
                f"{what}: a push consumer's subscription is fixed once started; "
                "change it before startup()"
            )

    def _message(self, msg: Any) -> Message:
        return Message.received(
            self._config,
            topic=msg.topic,
            value=msg.value,
            headers=msg.headers,
            message_id=f"{msg.topic}:{msg.partition}:{msg.offset}",
            born_timestamp=msg.born_timestamp,
            delivery_attempt=msg.reconsume_times + 1,
        )

    def _consumed(self, msgs: list[Any]) -> bool:
        for msg in msgs:
            kept = self._filters.keeps(msg.topic, msg.headers)
            if kept and self._listener.consume(self._message(msg)) is not ConsumeResult.SUCCESS:
                return False
        return True

    def _consume(self, msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
        if self._consumed(msgs):
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    def startup(self) -> None:
        """Join the group and consume in the background."""
        with self._lock:
            if self._inner is not None:
                return
            conf = self._config.conf(tls=self._tls, **NEW_GROUP_START)
            conf["group.id"] = self._config.resource(self._group)
            inner = ProductPushConsumer(
                conf,
                listener=self._consume,
                max_workers=self._threads,
                max_reconsume_times=self._max_reconsume_times,
                topic_prefix=self._config.topic_prefix,
                client_id=self._client_id,
                fifo=self._settings.fifo,
                fifo_retry_interval_ms=self._settings.fifo_retry_interval_ms,
            )
            inner.subscribe(self._filters.topics, tags=self._filters.common())
            inner.start()
            self._inner = inner

    def shutdown(self) -> None:
        """Let running calls finish, commit, leave the group. Idempotent."""
        with self._lock:
            inner, self._inner = self._inner, None
        if inner is not None:
            inner.shutdown()
