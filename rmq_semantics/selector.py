"""Queue selection: ``MessageQueueSelector`` and Java-compatible key hashing (murmur2)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rmq_semantics.errors import SelectorError

__all__ = [
    "MessageQueueSelector",
    "SelectMessageQueueByHash",
    "SelectMessageQueueByRandom",
    "apply_selector",
    "java_partition",
    "murmur2",
    "placement",
    "placement_reads_partitions",
]


class MessageQueueSelector(Protocol):
    """``(partitions, message, arg) -> partition``, as RocketMQ's ``select(mqs, msg, arg)``.

    A selector is any callable with that signature, or an object with that ``select``
    method (RocketMQ's interface).
    """

    def __call__(self, partitions: Sequence[int], message: Any, arg: Any) -> int: ...


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (32-bit, seed 0x9747b28c), as a signed int."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    index = length & ~3
    if extra == 3:
        h ^= data[index + 2] << 16
    if extra >= 2:
        h ^= data[index + 1] << 8
    if extra >= 1:
        h ^= data[index]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, num_partitions: int) -> int:
    """The partition Java's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class _StockSelector:
    """RocketMQ's stock selectors: constructed with no arguments; ``select(partitions, msg,
    arg)``, and callable with the same three arguments (a plain selector function)."""

    def select(self, partitions: Sequence[int], message: Any, arg: Any) -> int:
        raise NotImplementedError

    def __call__(self, partitions: Sequence[int], message: Any, arg: Any) -> int:
        return self.select(partitions, message, arg)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SelectMessageQueueByHash(_StockSelector):
    """``hash(arg) % len(partitions)``, with murmur2 of ``str(arg)`` as the hash (the same
    partition from Java and Python, where RocketMQ uses Java's ``hashCode``)."""

    def select(self, partitions: Sequence[int], message: Any, arg: Any) -> int:
        return partitions[java_partition(str(arg).encode(), len(partitions))]


class SelectMessageQueueByRandom(_StockSelector):
    """A random partition (``arg`` unused), as RocketMQ's ``SelectMessageQueueByRandom``."""

    def select(self, partitions: Sequence[int], message: Any, arg: Any) -> int:
        return random.choice(partitions)


def apply_selector(selector: Any, partitions: Sequence[int], message: Any, arg: Any) -> int:
    """Run a selector and check that it named a partition the topic has.

    ``selector``: an object with ``select(partitions, msg, arg)``, a callable with those
    arguments, or a selector class whose instances are one (built with no arguments, so
    ``selector=SelectMessageQueueByHash`` works as it did when that was a function).
    """
    if isinstance(selector, type):
        try:
            selector = selector()
        except TypeError as exc:
            raise SelectorError(
                f"selector class {selector.__name__} needs arguments ({exc}); pass an instance"
            ) from None
    select = getattr(selector, "select", None)
    if not callable(select):
        select = selector
    if not callable(select):
        raise SelectorError(
            f"selector must be callable (partitions, msg, arg) or have "
            f"select(partitions, msg, arg), got {selector!r}"
        )
    chosen = select(partitions, message, arg)
    partition = getattr(chosen, "partition", chosen)
    if (
        isinstance(partition, bool)
        or not isinstance(partition, int)
        or (partition not in partitions)
    ):
        raise SelectorError(
            f"selector returned {chosen!r} for topic {getattr(message, 'topic', '?')!r}, "
            f"which has partitions 0..{len(partitions) - 1}"
        )
    return partition


def placement_reads_partitions(message: Any, selector: Any, sharding_key: object) -> bool:
    """Whether :func:`placement` of ``message`` needs its topic's partitions."""
    return (
        selector is not None
        or sharding_key is not None
        or (message.partition is None and message.message_group is not None)
    )


def placement(
    message: Any,
    selector: Any,
    arg: Any,
    sharding_key: bytes | str | None,
    partitions: Callable[[], Sequence[int]],
) -> int | None:
    """The partition a producer writes ``message`` to, the first that applies: a
    ``selector``, a ``sharding_key``, ``message.partition``, ``message.message_group``
    (murmur2 of the group's UTF-8 bytes: one group, one partition, so a FIFO consumer can
    keep its order whatever the record keys); None: by record key. ``partitions()`` reads
    the topic's partitions (called only when needed: it may block)."""
    if selector is not None:
        return apply_selector(selector, partitions(), message, arg)
    if sharding_key is not None:
        key = sharding_key.encode() if isinstance(sharding_key, str) else sharding_key
        return java_partition(key, len(partitions()))
    if message.partition is None and message.message_group is not None:
        return java_partition(message.message_group.encode(), len(partitions()))
    return message.partition
