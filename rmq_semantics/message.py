"""The message model shared by every client: ``Message`` and the ``rmq.*`` headers."""

from __future__ import annotations

from dataclasses import dataclass, field

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.headers import RESERVED_PREFIX, H

__all__ = ["H", "Headers", "Message", "SendResult", "encode_bytes"]

Headers = list[tuple[str, bytes]]


def encode_bytes(value: bytes | str | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise ConfigError(f"{what} must be bytes or str, got {type(value).__name__}")


def normalize_headers(headers: object) -> Headers:
    """Accept a dict or a list of pairs (as confluent_kafka does); return list of pairs."""
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, dict) else headers
    out: Headers = []
    for item in items:  # type: ignore[union-attr]
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
        object.__setattr__(self, "value", encode_bytes(self.value, "Message.value"))
        object.__setattr__(self, "key", encode_bytes(self.key, "Message.key"))
        object.__setattr__(self, "headers", normalize_headers(self.headers))
        for name, _ in self.headers:  # type: ignore[union-attr]
            if name.startswith(RESERVED_PREFIX):
                raise ConfigError(f"header {name!r}: the rmq.* header namespace is reserved")

    def user_headers(self) -> Headers:
        return list(self.headers or [])  # type: ignore[arg-type]

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


@dataclass(frozen=True)
class SendResult:
    """Where a sent record landed."""

    topic: str
    partition: int
    offset: int
