"""The concurrent consumer's public types: RocketMQ's ``MessageListenerConcurrently``
contract (statuses, context, listener base) and the message a listener receives."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rmq_semantics.errors import ConfigError

__all__ = [
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "MessageListenerConcurrently",
    "PushMessage",
]


class ConsumeConcurrentlyStatus(Enum):
    """What a concurrent listener returns for a batch."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeConcurrentlyContext:
    """Per-call context, as RocketMQ's.

    ``delay_level_when_next_consume``: 0 (default) lets the consumer pick the level
    (reconsume n waits level ``min(n, len(delay_levels))``), ``k > 0`` asks for level k
    (capped at the last), ``< 0`` sends the messages straight to the DLQ.
    ``ack_index``: with CONSUME_SUCCESS, only ``msgs[:ack_index + 1]`` succeeded and the
    rest are reconsumed later (default: all succeeded).
    """

    def __init__(self, topic: str, partition: int, batch_size: int) -> None:
        self.topic = topic
        self.partition = partition
        self._delay_level = 0
        self._ack_index = batch_size - 1

    @property
    def delay_level_when_next_consume(self) -> int:
        return self._delay_level

    @delay_level_when_next_consume.setter
    def delay_level_when_next_consume(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"delay_level_when_next_consume must be an int (0: by "
                f"reconsume count, k > 0: level k, < 0: DLQ), got {value!r}"
            )
        self._delay_level = value

    @property
    def ack_index(self) -> int:
        return self._ack_index

    @ack_index.setter
    def ack_index(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"ack_index must be an int, got {value!r}")
        self._ack_index = value

    def __repr__(self) -> str:
        return (
            f"ConsumeConcurrentlyContext(topic={self.topic!r}, partition={self.partition}, "
            f"delay_level_when_next_consume={self._delay_level}, "
            f"ack_index={self._ack_index})"
        )


class MessageListenerConcurrently:
    """Base class of concurrent listeners; any callable ``(msgs, context) -> status`` (or an
    ``async def`` one) works too, and so does RocketMQ's name ``consumeMessage`` (a listener
    ported from Java, with or without this base class)."""

    def consume_message(
        self, msgs: list[PushMessage], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        """Process ``msgs`` (one partition); return CONSUME_SUCCESS or RECONSUME_LATER."""
        raise NotImplementedError


@dataclass(frozen=True)
class PushMessage:
    """A message handed to a concurrent listener; the orderly message's fields plus
    ``born_timestamp`` (ms, the producer's CreateTime).

    A message redelivered from a retry topic shows its ORIGINAL topic, partition and offset
    (as RocketMQ shows the original), ``reconsume_times`` > 0, and its headers include the
    ``rmq.*`` retry headers; ``retry_topic`` names where this copy was read (else None).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    born_timestamp: int
    reconsume_times: int = 0
    retry_topic: str | None = None

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (None if absent)."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found
