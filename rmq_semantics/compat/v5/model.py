"""The RocketMQ 5 client's value types: its configuration, ``Message``, ``SendReceipt``,
``FilterExpression`` and ``TransactionResolution``, with RocketMQ's names and units, and how
each becomes the product's. Pure: no Kafka import."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from rmq_semantics.compat.common import (
    KEY_SEPARATOR,
    header_text,
    kafka_conf,
    split_keys,
    user_properties,
)
from rmq_semantics.errors import ConfigError
from rmq_semantics.message import Message as ProductMessage
from rmq_semantics.records.headers import H
from rmq_semantics.simple.consumer import FilterExpression as ProductFilter
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX

__all__ = [
    "ClientConfiguration",
    "Credentials",
    "FilterExpression",
    "FilterType",
    "Message",
    "MessageQueue",
    "SendReceipt",
    "TransactionResolution",
]

# Message types (RocketMQ 5's ``MessageType``), as ``Message.message_type`` reports them.
_TYPES = {1: "NORMAL", 2: "FIFO", 3: "DELAY", 4: "TRANSACTION", 5: "LITE", 6: "PRIORITY"}


class Credentials:
    """An access key and secret: the SASL/PLAIN user name and password on Kafka (empty: no
    authentication)."""

    def __init__(self, ak: str = "", sk: str = "") -> None:
        self._ak = ak if ak is not None else ""
        self._sk = sk if sk is not None else ""

    @property
    def ak(self) -> str:
        return self._ak

    @property
    def sk(self) -> str:
        return self._sk


class ClientConfiguration:
    """Where the clients connect. ``endpoints`` is the Kafka bootstrap list (RocketMQ's
    ``host:port;host:port``); ``credentials`` map to SASL/PLAIN; ``namespace`` prefixes topic
    and group names (``<namespace>.<name>``); ``request_timeout`` (s) bounds each send.

    Keyword-only, the product's: ``kafka_conf`` (librdkafka settings added last, e.g.
    ``sasl.mechanisms`` or ``auto.offset.reset``) and ``topic_prefix`` (its system topics).
    """

    def __init__(
        self,
        endpoints: str,
        credentials: Credentials | None = None,
        namespace: str = "",
        request_timeout: float = 3,
        *,
        kafka_conf: dict[str, Any] | None = None,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
    ) -> None:
        self._endpoints = endpoints
        self._credentials = credentials or Credentials()
        if namespace and (not isinstance(namespace, str) or "." in namespace):
            raise ConfigError(f"namespace must be a str without '.', got {namespace!r}")
        self._namespace = namespace or ""
        if isinstance(request_timeout, bool) or not isinstance(request_timeout, (int, float)):
            raise ConfigError(f"request_timeout must be seconds, got {request_timeout!r}")
        if request_timeout <= 0:
            raise ConfigError(f"request_timeout must be > 0 seconds, got {request_timeout!r}")
        self._request_timeout = request_timeout
        self._kafka_conf = dict(kafka_conf or {})
        self.topic_prefix = topic_prefix
        self.conf(tls=False)  # a bad address list fails here, not at startup

    @property
    def endpoints(self) -> str:
        return self._endpoints

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def credentials(self) -> Credentials:
        return self._credentials

    @property
    def request_timeout(self) -> float:
        return self._request_timeout

    def conf(self, *, tls: bool, **extra: Any) -> dict[str, Any]:
        """The confluent-kafka conf of a client (``extra`` before the caller's
        ``kafka_conf``, which wins)."""
        return kafka_conf(
            self._endpoints,
            username=self._credentials.ak,
            password=self._credentials.sk,
            tls=tls,
            extra={**extra, **self._kafka_conf},
        )

    def resource(self, name: str) -> str:
        """A topic or group name as Kafka knows it: ``<namespace>.<name>`` in a namespace."""
        return f"{self._namespace}.{name}" if self._namespace else name

    def local(self, name: str) -> str:
        """A Kafka topic name as the application knows it (the namespace taken off)."""
        prefix = f"{self._namespace}." if self._namespace else ""
        return name[len(prefix) :] if prefix and name.startswith(prefix) else name


class TransactionResolution(IntEnum):
    """A checker's answer (RocketMQ's protobuf enum: the same names and numbers, and its
    ``Name``/``Value``/``keys``/``values``/``items``, spelled as protobuf spells them)."""

    TRANSACTION_RESOLUTION_UNSPECIFIED = 0
    COMMIT = 1
    ROLLBACK = 2

    @classmethod
    def Name(cls, number: int) -> str:
        return cls(number).name

    @classmethod
    def Value(cls, name: str) -> int:
        return int(cls[name])

    @classmethod
    def keys(cls) -> list[str]:
        return [m.name for m in cls]

    @classmethod
    def values(cls) -> list[int]:
        return [int(m) for m in cls]

    @classmethod
    def items(cls) -> list[tuple[str, int]]:
        return [(m.name, int(m)) for m in cls]


class FilterType(IntEnum):
    """RocketMQ's filter types (protobuf numbers); only ``TAG`` is supported."""

    FILTER_TYPE_UNSPECIFIED = 0
    TAG = 1
    SQL = 2


class FilterExpression:
    """A subscription's filter: a tag expression (``"*"``, ``"TagA || TagB"``). SQL92
    (``FilterType.SQL``) is refused with a ConfigError: filter by tags."""

    TAG_EXPRESSION_SUB_ALL = "*"

    def __init__(
        self, expression: str = TAG_EXPRESSION_SUB_ALL, filter_type: int = FilterType.TAG
    ) -> None:
        if int(filter_type) == FilterType.SQL:
            raise ConfigError(
                "SQL92 filter expressions are not supported: filter by tags "
                "(FilterExpression('TagA || TagB'))"
            )
        self._expression = expression
        self._filter_type = FilterType(int(filter_type))
        self._product = ProductFilter(expression)  # a malformed expression fails here

    @property
    def expression(self) -> str:
        return self._expression

    @property
    def filter_type(self) -> FilterType:
        return self._filter_type


def filter_expression(value: Any) -> str | None:
    """A subscription value (a FilterExpression, a tag expression or None) as an expression."""
    if isinstance(value, FilterExpression):
        return value.expression
    if value is None or isinstance(value, str):
        return value
    raise ConfigError(f"a subscription's filter must be a FilterExpression, got {value!r}")


@dataclass(frozen=True)
class MessageQueue:
    """Where a message went: its topic and queue (the Kafka partition; -1 for a delayed
    message, placed when it is delivered)."""

    topic: str
    queue_id: int


class SendReceipt:
    """What a send returns: the message id (a transactional message's is its transaction
    id; a delayed message's is its timer id, also its ``recall_handle``), the queue and the
    offset."""

    def __init__(
        self,
        message_id: str,
        transaction_id: str | None,
        message_queue: MessageQueue,
        offset: int,
        recall_handle: str | None = None,
    ) -> None:
        self._message_id = message_id
        self._transaction_id = transaction_id
        self._message_queue = message_queue
        self._offset = offset
        self._recall_handle = recall_handle

    def __str__(self) -> str:
        return f"message_id:{self._message_id}"

    @property
    def message_id(self) -> str:
        return self._message_id

    @property
    def transaction_id(self) -> str | None:
        return self._transaction_id

    @property
    def message_queue(self) -> MessageQueue:
        return self._message_queue

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def recall_handle(self) -> str | None:
        return self._recall_handle


def _not_blank(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} should not be blank, got {value!r}")
    return value


class Message:
    """RocketMQ 5's message: set ``topic`` and ``body`` (bytes), optionally ``tag``, ``keys``,
    properties (``add_property``), ``message_group`` (FIFO) or ``delivery_timestamp``
    (epoch **seconds** when set; a received message reports the delivery time in ms, as
    RocketMQ's client does). A received one also has ``message_id``, ``born_timestamp`` (ms),
    ``delivery_attempt`` and ``receipt_handle``. ``priority`` and ``lite_topic`` are refused
    (RocketMQ 5.4's priority and lite topics have no counterpart here)."""

    def __init__(self) -> None:
        self._body: bytes | None = None
        self._topic: str | None = None
        self._namespace = ""
        self._message_id: str | None = None
        self._tag: str | None = None
        self._message_group: str | None = None
        self._delivery_timestamp: int | None = None
        self._keys: set[str] = set()
        self._properties: dict[str, str] = {}
        self._born_timestamp: int | None = None
        self._delivery_attempt: int | None = None
        self._receipt_handle: Any = None
        self._message_type: int | None = None
        self._decoded_at: int | None = None
        # The product's view a consumer handed out (acks and invisibility changes name it).
        self.view: Any = None

    def __str__(self) -> str:
        return (
            f"topic:{self._topic}, tag:{self._tag}, message_group:{self._message_group}, "
            f"delivery_timestamp:{self._delivery_timestamp}, keys:{self._keys}, "
            f"properties:{self._properties}"
        )

    # -- what a sender sets --------------------------------------------------------------------
    @property
    def topic(self) -> str | None:
        return self._topic

    @topic.setter
    def topic(self, topic: str) -> None:
        self._topic = _not_blank(topic, "topic")

    @property
    def body(self) -> bytes | None:
        return self._body

    @body.setter
    def body(self, body: bytes) -> None:
        if not body:
            raise ConfigError("body should not be blank")
        self._body = body.encode() if isinstance(body, str) else bytes(body)

    @property
    def tag(self) -> str | None:
        return self._tag

    @tag.setter
    def tag(self, tag: str) -> None:
        if "|" in _not_blank(tag, "tag"):
            raise ConfigError(f'tag should not contain "|", got {tag!r}')
        self._tag = tag

    @property
    def keys(self) -> set[str]:
        return self._keys

    @keys.setter
    def keys(self, *keys: str) -> None:
        # RocketMQ's setter adds (``msg.keys = "k"`` adds one key; the set is kept).
        for key in keys:
            if KEY_SEPARATOR in _not_blank(key, "key"):
                raise ConfigError(f"key should not contain a space, got {key!r}")
        self._keys.update(keys)

    @property
    def properties(self) -> dict[str, str]:
        return self._properties

    def add_property(self, key: str, value: str) -> None:
        """Add a user property (a Kafka header on the record)."""
        _not_blank(key, "key")
        _not_blank(value, "value")
        if key.startswith("rmq."):
            raise ConfigError(f"property {key!r}: the rmq.* header namespace is reserved")
        self._properties[key] = value

    @property
    def message_group(self) -> str | None:
        return self._message_group

    @message_group.setter
    def message_group(self, message_group: str) -> None:
        _not_blank(message_group, "message_group")
        if self._delivery_timestamp:
            raise ConfigError("message_group and delivery_timestamp should not be set at same time")
        self._message_group = message_group

    @property
    def delivery_timestamp(self) -> int | None:
        return self._delivery_timestamp

    @delivery_timestamp.setter
    def delivery_timestamp(self, delivery_timestamp: int) -> None:
        if self._message_group:
            raise ConfigError("delivery_timestamp and message_group should not be set at same time")
        if isinstance(delivery_timestamp, bool) or not isinstance(delivery_timestamp, int):
            raise ConfigError(
                f"delivery_timestamp must be epoch seconds (int), got {delivery_timestamp!r}"
            )
        self._delivery_timestamp = delivery_timestamp

    @property
    def priority(self) -> None:
        return None

    @priority.setter
    def priority(self, priority: int) -> None:
        raise ConfigError("priority messages are not supported (no counterpart on Kafka)")

    @property
    def lite_topic(self) -> None:
        return None

    @lite_topic.setter
    def lite_topic(self, lite_topic: str) -> None:
        raise ConfigError("lite topics are not supported (no counterpart on Kafka)")

    # -- what the client fills in ---------------------------------------------------------------
    @property
    def message_id(self) -> str | None:
        return self._message_id

    @message_id.setter
    def message_id(self, message_id: str) -> None:
        self._message_id = message_id

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def born_timestamp(self) -> int | None:
        return self._born_timestamp

    @property
    def born_host(self) -> None:
        return None

    @property
    def delivery_attempt(self) -> int | None:
        return self._delivery_attempt

    @property
    def receipt_handle(self) -> Any:
        return self._receipt_handle

    @property
    def message_type(self) -> int | None:
        return self._message_type

    @property
    def endpoints(self) -> None:
        return None

    @property
    def corrupted(self) -> bool:
        return False

    @property
    def transport_delivery_timestamp(self) -> None:
        return None

    @property
    def decode_message_timestamp(self) -> int | None:
        return self._decoded_at

    @staticmethod
    def message_type_desc(message_type: int) -> str:
        """A message type's name (1 NORMAL, 2 FIFO, 3 DELAY, 4 TRANSACTION ...)."""
        return _TYPES.get(message_type, "MESSAGE_TYPE_UNSPECIFIED")

    # -- to and from the product -------------------------------------------------------------
    def product(self, config: ClientConfiguration, *, transactional: bool) -> ProductMessage:
        """This message as the product sends it (its type set as RocketMQ's client sets it)."""
        if not self._topic:
            raise ConfigError("the message has no topic: set message.topic")
        if not self._body:
            raise ConfigError("the message has no body: set message.body")
        if transactional and self._delivery_timestamp:
            raise ConfigError("a transactional message should not set delivery_timestamp")
        self._message_type = (
            4
            if transactional
            else 2
            if self._message_group
            else 3
            if self.delivery_timestamp
            else 1
        )
        return ProductMessage(
            config.resource(self._topic),
            self._body,
            headers=dict(self._properties),
            tags=self._tag,
            keys=KEY_SEPARATOR.join(sorted(self._keys)) if self._keys else None,
            message_group=self._message_group,
            deliver_at_ms=(
                None if self._delivery_timestamp is None else self._delivery_timestamp * 1000
            ),
        )

    @classmethod
    def received(
        cls,
        config: ClientConfiguration,
        *,
        topic: str,
        value: bytes | None,
        headers: Any,
        message_id: str | None,
        born_timestamp: int | None,
        delivery_attempt: int | None = None,
        view: Any = None,
    ) -> Message:
        """A message as a consumer or checker hands it out."""
        headers = list(headers or ())
        msg = cls()
        msg._topic = config.local(topic)
        msg._namespace = config.namespace
        msg._body = value
        msg._tag = header_text(headers, H.TAGS)
        msg._keys = set(split_keys(headers))
        msg._properties = user_properties(headers)
        msg._message_group = header_text(headers, H.MESSAGE_GROUP) or None
        delivered_at = header_text(headers, H.DELIVERED_AT)
        if delivered_at and delivered_at.isdigit():
            msg._delivery_timestamp = int(delivered_at)
        msg._message_id = message_id
        msg._born_timestamp = born_timestamp
        msg._delivery_attempt = delivery_attempt
        msg._message_type = 2 if msg._message_group else 3 if delivered_at else 1
        msg._decoded_at = int(time.time() * 1000)
        msg.bind_view(view)
        return msg

    def bind_view(self, view: Any) -> None:
        """Name the consumer's delivery ``view`` (its receipt handle is this message's)."""
        self.view = view
        self._receipt_handle = getattr(view, "receipt_handle", None)
