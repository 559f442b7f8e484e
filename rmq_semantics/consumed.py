"""Typed accessors of a record a consumer returned (a ``confluent_kafka.Message``).

confluent-kafka's stubs type ``topic()``, ``partition()`` and ``offset()`` as optional,
since a message a caller builds has none. A record ``poll``/``consume`` returned (a partition
EOF event included) has all three; these functions say so in one place and fail loudly if not.
Not for a delivery report: there the client gives None for a record never assigned a
partition, and for an offset it never learnt (acks=0).
Its headers are typed as whatever ``produce`` accepts; a consumed record's are a list of
(name, bytes or None) pairs, and :func:`headers_of` says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # the pure cores may import this module: no Kafka client at run time
    import confluent_kafka

from rmq_semantics.message import RecordHeaders

__all__ = ["headers_of", "offset_of", "partition_of", "topic_of"]


def topic_of(msg: confluent_kafka.Message) -> str:
    topic = msg.topic()
    if topic is None:
        raise TypeError(f"not a consumed record (no topic): {msg!r}")
    return topic


def partition_of(msg: confluent_kafka.Message) -> int:
    partition = msg.partition()
    if partition is None:
        raise TypeError(f"not a consumed record (no partition): {msg!r}")
    return partition


def offset_of(msg: confluent_kafka.Message) -> int:
    offset = msg.offset()
    if offset is None:
        raise TypeError(f"not a consumed record (no offset): {msg!r}")
    return offset


def headers_of(msg: confluent_kafka.Message) -> RecordHeaders:
    """``msg``'s headers, [] when it has none (the client's None)."""
    # The stubs' union also holds the dict and str forms produce() takes; a consumed record
    # never has them (librdkafka builds a list of bytes-or-None pairs).
    return cast(RecordHeaders, msg.headers() or [])
