"""The orderly consumer's public types: what a listener receives and returns, and status.

No Kafka client here: :class:`OrderlyMessage` is built from a ``confluent_kafka.Message``
but only reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.headers import H

if TYPE_CHECKING:
    import confluent_kafka

__all__ = [
    "DEFAULT_SUSPEND_MS",
    "DLQ_ORIGINAL_OFFSET",
    "DLQ_ORIGINAL_PARTITION",
    "DLQ_ORIGINAL_TOPIC",
    "DLQ_RECONSUME_TIMES",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "MessageListenerOrderly",
    "OrderlyMessage",
    "PartitionStatus",
    "kafka_view",
    "kafka_views",
    "listener_callable",
]

#: Headers of a dead-lettered message (besides its own key, value and headers); the names
#: live in records.headers, these are their public spellings in this package.
DLQ_ORIGINAL_TOPIC = H.DLQ_ORIGINAL_TOPIC
DLQ_ORIGINAL_PARTITION = H.DLQ_ORIGINAL_PARTITION
DLQ_ORIGINAL_OFFSET = H.DLQ_ORIGINAL_OFFSET
DLQ_RECONSUME_TIMES = H.DLQ_RECONSUME_TIMES

#: RocketMQ's ``suspendCurrentQueueTimeMillis`` default.
DEFAULT_SUSPEND_MS = 1000


class ConsumeOrderlyStatus(Enum):
    """What an orderly listener returns for a batch."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
    #: With ``context.auto_commit`` False: commit everything delivered up to this batch.
    COMMIT = "COMMIT"
    #: With ``context.auto_commit`` False: re-deliver everything since the last commit.
    ROLLBACK = "ROLLBACK"


class ConsumeOrderlyContext:
    """Per-call context: the queue, and how long to suspend it if the batch is not done.

    ``lock_epoch`` is the fencing epoch of the queue lock the batch runs under; a
    listener can store it with its side effects to reject writes of a deposed holder.
    ``auto_commit`` (default True) is RocketMQ's ``setAutoCommit``: with False, SUCCESS
    does not commit, COMMIT does, ROLLBACK re-delivers from the last commit. Partition
    mode only: in key mode the commit point is a watermark across keys.
    """

    def __init__(
        self, topic: str, partition: int, lock_epoch: int = 0, *, key_mode: bool = False
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.lock_epoch = lock_epoch
        self._suspend_ms = DEFAULT_SUSPEND_MS
        self._auto_commit = True
        self._key_mode = key_mode

    @property
    def auto_commit(self) -> bool:
        """Whether SUCCESS commits the batch (RocketMQ's ``autoCommit``), default True."""
        return self._auto_commit

    @auto_commit.setter
    def auto_commit(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ConfigError(f"auto_commit must be a bool, got {value!r}")
        if not value and self._key_mode:
            raise ConfigError(
                "auto_commit=False needs ordering='partition': with "
                "ordering='key' the commit point is a watermark across keys"
            )
        self._auto_commit = value

    # RocketMQ's spellings, so a ported listener runs unchanged.
    def setAutoCommit(self, value: bool) -> None:
        self.auto_commit = value

    def setSuspendCurrentQueueTimeMillis(self, value: int) -> None:
        self.suspend_ms = value

    @property
    def suspend_ms(self) -> int:
        """Delay before a suspended batch is retried (RocketMQ's
        ``suspendCurrentQueueTimeMillis``), default 1000; must be > 0."""
        return self._suspend_ms

    @suspend_ms.setter
    def suspend_ms(self, value: int) -> None:
        # 0 would hand the same batch straight back to the listener: a hot retry loop.
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(
                f"suspend_ms must be an int > 0 (milliseconds before the "
                f"suspended batch is retried), got {value!r}"
            )
        self._suspend_ms = value

    def __repr__(self) -> str:
        return (
            f"ConsumeOrderlyContext(topic={self.topic!r}, partition={self.partition}, "
            f"lock_epoch={self.lock_epoch}, suspend_ms={self._suspend_ms}, "
            f"auto_commit={self._auto_commit})"
        )


class MessageListenerOrderly:
    """Base class of orderly listeners; any callable ``(msgs, context) -> status`` works too,
    and so does RocketMQ's name ``consumeMessage`` (a listener ported from Java, with or
    without this base class)."""

    def consume_message(
        self, msgs: list[OrderlyMessage], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        """Process ``msgs`` (one partition, offset order); return SUCCESS or SUSPEND."""
        raise NotImplementedError


#: The listener method's names: ours, then RocketMQ's (a listener ported from Java).
LISTENER_METHODS = ("consume_message", "consumeMessage")


def listener_callable(listener: object, base: type, returns: str) -> Callable[..., Any]:
    """What a consumer calls for ``listener``: its ``consume_message``, else RocketMQ's
    ``consumeMessage``, else the listener itself when it is a plain callable. ``base``'s
    own unimplemented method does not count: a subclass that implements neither name is
    refused here, instead of being called, raising, and suspending every batch for ever."""
    for name in LISTENER_METHODS:
        method = getattr(listener, name, None)
        if callable(method) and getattr(type(listener), name, None) is not getattr(
            base, name, None
        ):
            return method
    if callable(listener) and not isinstance(listener, base):
        return listener
    raise ConfigError(
        f"listener must implement consume_message(msgs, context) (or RocketMQ's "
        f"consumeMessage) returning {returns}, or be such a callable; got {listener!r}"
    )


@dataclass(frozen=True, eq=False, repr=False)
class OrderlyMessage:
    """A message handed to an orderly listener. ``reconsume_times`` counts earlier
    deliveries of the same message that were suspended.

    Messages consumed from Kafka are :class:`_KafkaMessageView` instances (a subclass that
    reads each field from the ``confluent_kafka.Message`` on access); equality, hashing,
    ``repr``, ``dataclasses.replace`` and pickling treat both kinds alike.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    reconsume_times: int = 0

    @classmethod
    def from_kafka(cls, msg: confluent_kafka.Message) -> OrderlyMessage:
        """A view of ``msg``: one small object, no field copied until it is read."""
        return kafka_view(msg)

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    @property
    def born_timestamp(self) -> int:
        """When the producer made the message (ms): ``rmq.born_ts`` where a record carries
        it, else the record's timestamp (a promoted record keeps the birth time there)."""
        for name, value in self.headers:
            if name == H.BORN_TS:
                try:
                    return int(value)
                except ValueError:
                    break
        return self.timestamp

    def _fields(self) -> tuple:
        return (
            self.topic,
            self.partition,
            self.offset,
            self.key,
            self.value,
            self.headers,
            self.timestamp,
            self.reconsume_times,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OrderlyMessage):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            "OrderlyMessage(topic={!r}, partition={!r}, offset={!r}, key={!r}, value={!r}, "
            "headers={!r}, timestamp={!r}, reconsume_times={!r})".format(*self._fields())
        )

    def __reduce__(self) -> tuple:
        return OrderlyMessage, self._fields()


def _headers_of(msg: confluent_kafka.Message) -> tuple[tuple[str, bytes], ...]:
    headers = msg.headers()
    return tuple((k, v if v is not None else b"") for k, v in headers) if headers else ()


class _KafkaMessageView(OrderlyMessage):
    """An :class:`OrderlyMessage` over a consumed ``confluent_kafka.Message``.

    One is made per message handed to the listener; filling eight fields for each cost
    about 1.7 us a message, most of the orderly consumer's gap to a plain consumer (see
    the README's Benchmarks). Fields are read on access (about 0.05 us each); headers are
    converted on each access. A redelivery (``dataclasses.replace``) yields a plain
    :class:`OrderlyMessage`.
    """

    __slots__ = ("_kafka",)
    _kafka: confluent_kafka.Message

    def __new__(cls, *args: object, **kwargs: object) -> OrderlyMessage:  # type: ignore[misc]
        # Only dataclasses.replace() and copies call the class: they hold every field.
        return OrderlyMessage(*args, **kwargs)  # type: ignore[arg-type]

    def __setattr__(self, name: str, value: object) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    topic = property(lambda self: self._kafka.topic())  # type: ignore[assignment]
    partition = property(lambda self: self._kafka.partition())  # type: ignore[assignment]
    offset = property(lambda self: self._kafka.offset())  # type: ignore[assignment]
    key = property(lambda self: self._kafka.key())  # type: ignore[assignment]
    value = property(lambda self: self._kafka.value())  # type: ignore[assignment]
    headers = property(lambda self: _headers_of(self._kafka))  # type: ignore[assignment]
    timestamp = property(lambda self: self._kafka.timestamp()[1])  # type: ignore[assignment]
    reconsume_times = property(lambda self: 0)  # type: ignore[assignment]


_new = object.__new__
_set_kafka = _KafkaMessageView._kafka.__set__  # type: ignore[attr-defined]


def kafka_view(msg: confluent_kafka.Message) -> OrderlyMessage:
    """The :class:`OrderlyMessage` of a consumed message (a lazy view, see above)."""
    # object.__new__ and the slot's own setter: no __init__, no frozen __setattr__.
    view = _new(_KafkaMessageView)
    _set_kafka(view, msg)
    return view


def kafka_views(msgs: list[confluent_kafka.Message]) -> list[OrderlyMessage]:
    """:func:`kafka_view` of each message (one batch; the loop inlined, a call saved each)."""
    out = []
    for msg in msgs:
        view = _new(_KafkaMessageView)
        _set_kafka(view, msg)
        out.append(view)
    return out


@dataclass(frozen=True)
class PartitionStatus:
    """One assigned partition as this consumer sees it (see ``OrderlyConsumer.status``).

    ``lock_state`` is ``"held"`` (granted, and this consumer's view of the lease has not
    lapsed), ``"lapsed"`` (granted, but not renewed in time: not processing) or
    ``"unlocked"``. ``committed_offset`` is the next offset to consume (-1: none committed
    yet); ``lag`` is the partition's end minus that (-1 when unknown).

    Key mode (``ordering="key"``) also fills ``in_flight_keys`` (keys with a listener call
    running), ``offset_gap`` (offsets from the lowest unfinished to the highest done one,
    carried in the commit metadata) and ``back_pressure`` (no new records are taken from the
    partition until the gap shrinks, or the records taken reach ``max_queued_bytes``);
    ``queued`` and ``in_flight`` then count records. ``queued_bytes``: the values' bytes
    buffered (fetching pauses at ``max_queued_bytes``).
    """

    topic: str
    partition: int
    lock_state: str
    epoch: int
    lease_remaining_ms: int
    committed_offset: int
    lag: int
    queued: int
    in_flight: int
    reconsume_times: int
    suspended: bool
    in_flight_keys: int = 0
    offset_gap: int = 0
    back_pressure: bool = False
    queued_bytes: int = 0

    @property
    def locked(self) -> bool:
        """The queue lock is held and its lease is live in this consumer's view."""
        return self.lock_state == "held"
