"""The message model shared by every client: ``Message`` and the ``rmq.*`` headers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.headers import RESERVED_PREFIX, H

__all__ = ["H", "Headers", "Message", "SendResult", "encode_bytes"]

Headers = list[tuple[str, bytes]]
# A record's headers as a consumer reads them back: a null value is None.
RecordHeaders = list[tuple[str, bytes | None]]
# What confluent-kafka's stubs take for produce(headers=...) in the list form.
ProduceHeaders = list[tuple[str, str | bytes | None]]


def produce_headers(headers: Headers | RecordHeaders) -> ProduceHeaders:
    """``headers`` as produce() is typed to take them (the same list, no copy): the stubs'
    list is invariant, so a list of bytes pairs is not a list of str/bytes/None pairs to mypy,
    though produce() only reads it."""
    return cast(ProduceHeaders, headers)


def encode_bytes(value: bytes | str | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise ConfigError(f"{what} must be bytes or str, got {type(value).__name__}")


def normalize_headers(headers: Mapping[str, object] | Iterable[object] | None) -> Headers:
    """Accept a dict or a list of pairs (as confluent_kafka does); return list of pairs."""
    if headers is None:
        return []
    # Whatever a caller passed: each item is checked to be a pair below.
    items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    out: Headers = []
    for item in items:
        try:
            name, value = item
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"headers must be (name, value) pairs, got {item!r}") from exc
        out.append((str(name), encode_bytes(value, f"header {name!r}") or b""))
    return out


@dataclass(frozen=True)
class Message:
    """A message to send, or one handed to a listener.

    ``value``/``key`` accept bytes or str (str is UTF-8 encoded); ``headers`` a dict or a
    list of ``(name, value)`` pairs. ``partition=None`` places the record by key with the
    Java client's partitioner. ``tags`` and ``keys`` are RocketMQ's, carried in
    ``rmq.tags``/``rmq.keys``. ``check_immunity_ms`` delays the first back-check of a
    transactional message. ``message_group`` is the ordering key of key-ordered consumption
    (RocketMQ 5's MessageGroup), carried in ``rmq.message_group``. Listeners also see
    ``transaction_id``; ``check_local_transaction`` also ``check_times`` (this back-check's
    number, 1 first: RocketMQ's ``TRANSACTION_CHECK_TIMES``) and ``born_timestamp`` (ms).

    A timer message (``Producer.send`` delivers it to its topic at a time, through the
    coordinator): ``deliver_at_ms`` (epoch ms: RocketMQ 5's ``deliveryTimestamp``),
    ``deliver_after_ms`` (from the send) or ``delay_time_level`` (1..18 in RocketMQ 4's
    table: 1s 5s 10s 30s 1m ... 2h; the producer's ``delay_levels``); at most one of them.

    ``key`` is always ``bytes`` (or None) once built: a str key is UTF-8 encoded, and every
    listener (``execute_local_transaction``, ``check_local_transaction``, orderly and
    concurrent consumers) sees bytes, as Kafka and ``confluent_kafka`` do.
    """

    topic: str
    value: bytes | str | None
    key: bytes | str | None = None
    headers: Headers | dict | None = None
    partition: int | None = None
    tags: str | None = None
    keys: str | None = None
    check_immunity_ms: int | None = None
    message_group: str | None = None
    transaction_id: str | None = field(default=None, compare=False)
    check_times: int | None = field(default=None, compare=False)
    born_timestamp: int | None = field(default=None, compare=False)
    deliver_at_ms: int | None = None
    deliver_after_ms: int | None = None
    delay_time_level: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ConfigError(f"Message.topic must be a non-empty str, got {self.topic!r}")
        if self.partition is not None and (
            not isinstance(self.partition, int) or self.partition < 0
        ):
            raise ConfigError(f"Message.partition must be an int >= 0, got {self.partition!r}")
        if self.check_immunity_ms is not None and self.check_immunity_ms < 0:
            raise ConfigError(
                f"Message.check_immunity_ms must be >= 0, got {self.check_immunity_ms!r}"
            )
        if self.message_group is not None and (
            not isinstance(self.message_group, str) or not self.message_group
        ):
            raise ConfigError(
                f"Message.message_group must be a non-empty str or None, got {self.message_group!r}"
            )
        if self.scheduled:
            self._check_timing()
        object.__setattr__(self, "value", encode_bytes(self.value, "Message.value"))
        object.__setattr__(self, "key", encode_bytes(self.key, "Message.key"))
        headers = normalize_headers(self.headers)
        object.__setattr__(self, "headers", headers)
        for name, _ in headers:
            if name.startswith(RESERVED_PREFIX):
                raise ConfigError(f"header {name!r}: the rmq.* header namespace is reserved")

    @property
    def scheduled(self) -> bool:
        """Whether it has a delivery time (``deliver_at_ms``, ``deliver_after_ms`` or
        ``delay_time_level``)."""
        return (
            self.deliver_at_ms is not None
            or self.deliver_after_ms is not None
            or self.delay_time_level is not None
        )

    def _check_timing(self) -> None:
        given = [name for name in _TIMING if getattr(self, name) is not None]
        if len(given) > 1:
            raise ConfigError(
                f"Message: give at most one of deliver_at_ms, deliver_after_ms and "
                f"delay_time_level, got {' and '.join(given)}"
            )
        name = given[0]
        value, low = getattr(self, name), (1 if name == "delay_time_level" else 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"Message.{name} must be an int >= {low}, got {value!r}")

    def user_headers(self) -> Headers:
        # A list since __post_init__ (the dict form is only what a caller may pass).
        return list(self.headers) if isinstance(self.headers, list) else []

    def rmq_headers(self) -> Headers:
        """The ``rmq.*`` headers every producer writes for this message's own fields."""
        out: Headers = []
        if self.tags is not None:
            out.append((H.TAGS, self.tags.encode()))
        if self.keys is not None:
            out.append((H.KEYS, self.keys.encode()))
        if self.message_group is not None:
            out.append((H.MESSAGE_GROUP, self.message_group.encode()))
        return out


_TIMING = ("deliver_at_ms", "deliver_after_ms", "delay_time_level")


@dataclass(frozen=True)
class SendResult:
    """Where a sent record landed. For a timer message that is the timer topic (its timer
    record), and ``message_id`` is its id: ``Producer.recall_message``'s handle."""

    topic: str
    partition: int
    offset: int
    message_id: str | None = None
