"""The RocketMQ 2.x client's values: its enums, the ``Message`` it sends and the
``ReceivedMessage`` its callbacks get, read from the product's messages. Pure: no Kafka
import."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

from rmq_semantics.compat.common import header_text
from rmq_semantics.errors import ConfigError
from rmq_semantics.message import Message as ProductMessage
from rmq_semantics.records.headers import RESERVED_PREFIX, H

__all__ = [
    "ConsumeStatus",
    "Message",
    "MessageModel",
    "MessageProperty",
    "Received",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "TransactionStatus",
    "in_transaction",
    "received",
    "text_of",
]

#: What a send returns: ``status`` (a :class:`SendStatus`), ``msg_id`` and ``offset``.
SendResult = namedtuple("SendResult", ["status", "msg_id", "offset"])


class SendStatus(IntEnum):
    """A send's status; on Kafka a send that returns was acknowledged by every in-sync
    replica (``acks=all``), so it is always ``OK``."""

    OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3


class TransactionStatus(IntEnum):
    """A local transaction's (or a back-check's) outcome."""

    COMMIT = 0
    ROLLBACK = 1
    UNKNOWN = 2


class ConsumeStatus(IntEnum):
    """A consumer callback's answer."""

    CONSUME_SUCCESS = 0
    RECONSUME_LATER = 1


class MessageModel(IntEnum):
    """Clustering (each message to one consumer of the group) is Kafka's consumer group;
    broadcasting is refused."""

    BROADCASTING = 0
    CLUSTERING = 1


class MessageProperty(Enum):
    """RocketMQ's property names; ``ReceivedMessage.get_property`` takes them."""

    TRACE_SWITCH = "TRACE_ON"
    MSG_REGION = "MSG_REGION"
    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_TIME_LEVEL = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    BUYER_ID = "BUYER_ID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    TRANSFER_FLAG = "TRANSFER_FLAG"
    CORRECTION_FLAG = "CORRECTION_FLAG"
    MQ2_FLAG = "MQ2_FLAG"
    RECONSUME_TIME = "RECONSUME_TIME"
    UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"


# Properties that are fields of the product's message, not headers.
_FIELDS = {MessageProperty.KEYS.value: H.KEYS, MessageProperty.TAGS.value: H.TAGS}


def text_of(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise ConfigError(f"{what} must be str or bytes, got {value!r}")


class Message:
    """A message to send: ``Message(topic)``, then ``set_body``, ``set_keys``, ``set_tags``,
    ``set_property`` and ``set_delay_time_level`` (RocketMQ 4's levels: 3 is 10 s)."""

    def __init__(self, topic: str | bytes) -> None:
        self.topic = text_of(topic, "topic")
        self.body: bytes | None = None
        self.keys: str | None = None
        self.tags: str | None = None
        self.properties: dict[str, str] = {}
        self.delay_time_level: int | None = None

    def set_keys(self, keys: str | bytes) -> None:
        self.keys = text_of(keys, "keys")

    def set_tags(self, tags: str | bytes) -> None:
        self.tags = text_of(tags, "tags")

    def set_body(self, body: str | bytes) -> None:
        self.body = body.encode() if isinstance(body, str) else bytes(body)

    def set_property(self, key: str | bytes, value: str | bytes) -> None:
        name = text_of(key, "key")
        if name.startswith(RESERVED_PREFIX):
            raise ConfigError(f"property {name!r}: the rmq.* header namespace is reserved")
        self.properties[name] = text_of(value, "value")

    def set_delay_time_level(self, delay_time_level: int) -> None:
        self.delay_time_level = delay_time_level

    def product(self) -> ProductMessage:
        """This message as the product sends it."""
        return ProductMessage(
            self.topic,
            self.body or b"",
            headers=dict(self.properties),
            tags=self.tags,
            keys=self.keys,
            delay_time_level=self.delay_time_level or None,
        )


@dataclass(frozen=True)
class Received:
    """What a :class:`ReceivedMessage` reads: a consumed record, or a transaction's message
    in a local-transaction call or a back-check."""

    topic: str
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    msg_id: str
    queue_id: int = -1
    offset: int = -1
    reconsume_times: int = 0
    born_timestamp: int = 0
    store_timestamp: int = 0
    prepared_offset: int = 0


def received(msg: Any) -> Received:
    """A product listener's message (push, orderly) as the 2.x client shows it."""
    return Received(
        topic=msg.topic,
        value=msg.value,
        headers=tuple(msg.headers or ()),
        msg_id=f"{msg.topic}:{msg.partition}:{msg.offset}",
        queue_id=msg.partition,
        offset=msg.offset,
        reconsume_times=msg.reconsume_times,
        born_timestamp=msg.born_timestamp,
        store_timestamp=msg.timestamp,
    )


def in_transaction(msg: Any) -> Received:
    """A transaction's message (``execute_local_transaction`` or a back-check)."""
    return Received(
        topic=msg.topic,
        value=msg.value,
        headers=(*msg.user_headers(), *msg.rmq_headers()),
        msg_id=msg.transaction_id or "",
        reconsume_times=max(0, (msg.check_times or 1) - 1),
        born_timestamp=msg.born_timestamp or 0,
    )


class ReceivedMessage:
    """A message a callback gets: ``topic``, ``body``, ``tags``, ``keys`` (bytes, as the
    C++ client returns them), ``id``, ``queue_id`` (the partition), ``queue_offset``,
    ``reconsume_times``, ``born_timestamp``, ``get_property(name)``."""

    def __init__(self, handle: Received) -> None:
        self._handle = handle

    @property
    def topic(self) -> str:
        return self._handle.topic

    @property
    def tags(self) -> bytes:
        return self.get_property(MessageProperty.TAGS)

    @property
    def keys(self) -> bytes:
        return self.get_property(MessageProperty.KEYS)

    @property
    def body(self) -> bytes:
        return self._handle.value or b""

    @property
    def id(self) -> str:
        return self._handle.msg_id

    @property
    def delay_time_level(self) -> int:
        return 0

    @property
    def queue_id(self) -> int:
        return self._handle.queue_id

    @property
    def reconsume_times(self) -> int:
        return self._handle.reconsume_times

    @property
    def store_size(self) -> int:
        return len(self.body)

    @property
    def born_timestamp(self) -> int:
        return self._handle.born_timestamp

    @property
    def store_timestamp(self) -> int:
        return self._handle.store_timestamp

    @property
    def queue_offset(self) -> int:
        return self._handle.offset

    @property
    def commit_log_offset(self) -> int:
        return self._handle.offset

    @property
    def prepared_transaction_offset(self) -> int:
        return self._handle.prepared_offset

    def get_property(self, prop: str | MessageProperty) -> bytes:
        """A property's value (bytes; empty when absent, as the C++ client returns it)."""
        name = prop.value if isinstance(prop, MessageProperty) else text_of(prop, "property")
        value = header_text(self._handle.headers, _FIELDS.get(name, name))
        return b"" if value is None else value.encode()

    def __getitem__(self, key: str | MessageProperty) -> bytes:
        return self.get_property(key)

    def __str__(self) -> str:
        return self.body.decode("utf-8")

    def __bytes__(self) -> bytes:
        return self.body

    def __repr__(self) -> str:
        return f"<ReceivedMessage topic={self.topic!r} id={self.id!r} body={self.body!r}>"
