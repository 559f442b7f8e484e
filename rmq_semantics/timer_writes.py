"""The producer side of timer messages (issue 35): what ``Producer.send`` writes for a
message with a delivery time, and what ``recall_message`` writes. The records themselves are
:mod:`rmq_semantics.records.timer`'s; this module decides the time, refuses one too far
ahead, creates the timer topics on first use, picks the timer partition and signs under
tenant isolation. The caller produces the :class:`TimerWrite` and waits for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from rmq_semantics.errors import ConfigError, KafkaOperationError
from rmq_semantics.group_signing import group_key_of
from rmq_semantics.message import Headers, Message, encode_bytes
from rmq_semantics.records.codec import encode
from rmq_semantics.records.group_auth import GroupKey, cancel_canonical, sign_timer_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.timer import (
    TimerCancel,
    cancel_window_start,
    parse_delay_levels,
    timer_headers,
    timer_partition,
    valid_timer_id,
)
from rmq_semantics.retry import retrying
from rmq_semantics.settings import ProducerSettings
from rmq_semantics.topics import (
    SystemTopics,
    admin_client,
    ensure_topics,
    offset_for_time,
    require_copartitioned,
    timer_topic_specs,
)

__all__ = ["TimerWrite", "TimerWrites", "deliver_at"]


@dataclass(frozen=True, slots=True)
class TimerWrite:
    """One record to produce: a timer record or a cancel, and the message id it is about."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    message_id: str
    #: The record's timestamp (ms; None: the producer's clock at send). A cancel's is its
    #: body's ``ts``, from which its window (``cancel_window_start``) is counted.
    timestamp: int | None = None


def deliver_at(msg: Message, now_ms: int, delay_levels_ms: tuple[int, ...]) -> int:
    """When ``msg`` (scheduled) is due, in epoch ms: its ``deliver_at_ms``, ``now_ms`` plus
    its ``deliver_after_ms``, or plus the delay of its ``delay_time_level`` (1-based)."""
    if msg.deliver_at_ms is not None:
        return msg.deliver_at_ms
    if msg.deliver_after_ms is not None:
        return now_ms + msg.deliver_after_ms
    level = msg.delay_time_level
    if level is None or not 1 <= level <= len(delay_levels_ms):
        raise ConfigError(
            f"Message.delay_time_level={level!r}: this producer's delay_levels has "
            f"{len(delay_levels_ms)} levels (1..{len(delay_levels_ms)})"
        )
    return now_ms + delay_levels_ms[level - 1]


def _span(ms: int) -> str:
    """``ms`` in its largest unit, for an error line."""
    for unit, size in (("days", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if ms >= size:
            return f"{ms / size:.4g} {unit}"
    return f"{ms / 1000:.4g} s"


class TimerWrites:
    """A producer's timer settings, its group (and key under tenant isolation), and the
    timer topics' partition count, read once: the topics are created, co-partitioned, on
    the first scheduled send or recall. Thread-safe."""

    def __init__(
        self,
        conf: dict,
        topics: SystemTopics,
        settings: ProducerSettings,
        producer_group: str | None,
    ) -> None:
        if producer_group is not None and (
            not isinstance(producer_group, str) or not producer_group
        ):
            raise ConfigError(
                f"producer_group must be a non-empty str or None, got {producer_group!r}"
            )
        self._conf = conf
        self.topics = topics
        self.settings = settings
        self.producer_group = producer_group
        self.delay_levels_ms = parse_delay_levels(settings.delay_levels)
        self._lock = threading.Lock()
        self._partitions: int | None = None
        # Read on first use: a producer that never schedules needs no key file.
        self._key: GroupKey | None = None
        self._key_read = False
        self._admin: AdminClient | None = None  # for recalls' counts, made on the first

    def timer_record(
        self, msg: Message, real_partition: int | None, now_ms: int | None = None
    ) -> TimerWrite:
        """The timer record of ``msg`` (its real partition already chosen, or None for by
        key at delivery). Raises ConfigError for a delivery time past ``max_delay_ms``."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        due = deliver_at(msg, now, self.delay_levels_ms)
        limit = self.settings.max_delay_ms
        if due - now > limit:
            raise ConfigError(
                f"the message for {msg.topic!r} is due {_span(due - now)} from now, over "
                f"max_delay_ms={limit} ({_span(limit)}; RocketMQ 5's timerMaxDelaySec): "
                f"schedule it sooner, or raise max_delay_ms on the producer and the coordinators"
            )
        key = self._group_key()
        message_id = uuid.uuid4().hex
        headers = timer_headers(
            msg, message_id, due, now, self.producer_group, real_partition=real_partition
        )
        # Bytes since Message.__post_init__ (str is only what a caller may pass).
        record_key, value = encode_bytes(msg.key, "key"), encode_bytes(msg.value, "value")
        if key is not None:
            headers = sign_timer_headers(key, headers, record_key, value)
        return TimerWrite(
            self.topics.timer,
            timer_partition(message_id, self.partitions()),
            record_key,
            value,
            headers,
            message_id,
        )

    def cancel_record(self, message_id: str, now_ms: int | None = None) -> TimerWrite:
        """The cancel record of ``message_id`` (RocketMQ 5's ``recallMessage``), in the
        message's timer partition of the cancel topic."""
        valid_timer_id(message_id)
        key = self._group_key()
        now = int(time.time() * 1000) if now_ms is None else now_ms
        topic = self.topics.timer_cancel
        partition = timer_partition(message_id, self.partitions())
        value = encode(TimerCancel(message_id, self.producer_group, now))
        headers: Headers = []
        if key is not None:
            headers = [(H.GROUP_MAC, key.mac(cancel_canonical(topic, partition, value)))]
        return TimerWrite(topic, partition, message_id.encode(), value, headers, message_id, now)

    def cancel_refusal(self, write: TimerWrite, offset: int, timeout: float) -> str | None:
        """Why the coordinators do not hold the cancel ``write`` that landed at ``offset``,
        or None: the count they apply (``timer_cancels_max``), from the same log. A look-up
        that keeps failing for ``timeout`` is a KafkaOperationError saying the cancel was
        written but not checked."""
        if write.timestamp is None:
            raise ConfigError(f"{write.topic}: a cancel record without its timestamp")
        start = cancel_window_start(write.timestamp, self.settings.max_delay_ms)
        with self._lock:
            if self._admin is None:
                self._admin = admin_client(self._conf)
            admin = self._admin
        where = f"{write.topic}[{write.partition}]@{offset}"
        try:
            for attempt in retrying(timeout):
                with attempt:
                    first = offset_for_time(admin, write.topic, write.partition, start)
        except KafkaOperationError as exc:
            raise KafkaOperationError(
                f"the cancel of {write.message_id} was written at {where}, but whether the "
                f"coordinators hold it (timer_cancels_max) could not be checked: {exc}"
            ) from exc
        counted, bound = offset - first, self.settings.timer_cancels_max
        if counted < bound:
            return None
        return (
            f"recall of {write.message_id} refused: {write.topic}[{write.partition}] holds "
            f"{counted} cancel records before it written since {start} (epoch ms), "
            f"timer_cancels_max={bound} (the coordinators' bound on what they hold): the "
            "message will be delivered at its time; recall later, or ask the operator to "
            "raise timer_cancels_max on the coordinators and producers"
        )

    def _group_key(self) -> GroupKey | None:
        with self._lock:
            if not self._key_read:
                self._key = group_key_of(self.settings)
                self._key_read = True
            key = self._key
        if key is not None and self.producer_group is None:
            raise ConfigError(
                "a group key is set (tenant isolation): give the Producer producer_group= so "
                "its timer messages and recalls are signed as that group's"
            )
        return key

    def partitions(self) -> int:
        """The timer topics' partition count; creates the intake and cancel topics first
        if they do not exist (admin calls, each with a timeout; once per producer)."""
        with self._lock:
            if self._partitions is None:
                specs = timer_topic_specs(
                    self.topics,
                    self.settings.timer_partitions,
                    self.settings.max_delay_ms,
                    levels=False,
                )
                ensure_topics(self._conf, specs, replicated=True)
                # A message's cancel must be in the same partition as the message.
                self._partitions = require_copartitioned(
                    self._conf, self.topics.timer, self.topics.timer_cancel
                )
            return self._partitions
