"""What the transactional producers refuse before a half write (RocketMQ's
``Validators.checkMessage`` and its topic route check): a message the coordinator could
never promote, whose local transaction would commit for nothing. A typo in a topic name
must not turn a committed local transaction into a discard."""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.errors import (
    ConfigError,
    KafkaOperationError,
    MessageSizeError,
    UnknownTopicError,
)
from rmq_semantics.message import Message
from rmq_semantics.producer import METADATA_MAX_TOPICS, METADATA_TTL_S, PartitionCache
from rmq_semantics.topics import refuse_system_destination

__all__ = ["RECORD_OVERHEAD", "SendChecks", "refuse_scheduled"]

log = logging.getLogger("rmq_semantics.transaction")

# What a promoted record adds to its key, value and headers in its batch: the batch header
# (61 bytes), the record's varints and the headers the coordinator adds (rmq.promoted_from,
# rmq.promoted_at). Generous: a message this close to the limit is refused, not discarded.
RECORD_OVERHEAD = 256


def refuse_scheduled(msg: Message) -> None:
    """Raise for a transactional message with a delivery time: RocketMQ clears the delay of
    a transactional message silently; here the rule is kept, and said."""
    given = next(
        f"{n}={getattr(msg, n)}"
        for n in ("deliver_at_ms", "deliver_after_ms", "delay_time_level")
        if getattr(msg, n) is not None
    )
    raise ConfigError(
        f"the message for {msg.topic!r} has a delivery time ({given}): a transactional "
        f"message cannot be scheduled (RocketMQ's rule: it clears the delay of a "
        f"transactional message); send it with Producer.send, or schedule it after commit"
    )


def record_size(msg: Message) -> int:
    """The bytes ``msg`` takes when promoted, uncompressed, within ``RECORD_OVERHEAD``."""
    headers = msg.user_headers() + msg.rmq_headers()
    return (
        len(msg.value or b"")
        + len(msg.key or b"")
        + RECORD_OVERHEAD
        + sum(len(k.encode()) + len(v or b"") for k, v in headers)
    )


class SendChecks:
    """Refuses, with one error of the family, a message for a system topic of ``prefix``,
    whose topic does not exist (a fresh
    metadata read says so, after the cached one did), whose body is empty, or which is over
    its topic's ``max.message.bytes`` (described once per ``METADATA_TTL_S``; a topic whose
    config cannot be described, e.g. without the DescribeConfigs ACL, is not size-checked,
    and that is logged once per TTL)."""

    def __init__(self, partitions: PartitionCache, conf: dict, prefix: str) -> None:
        self.partitions = partitions
        self._conf = conf
        self._prefix = prefix
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._max_bytes: dict[str, tuple[float, int | None]] = {}

    def cached(self, msgs: list[Message]) -> bool:
        """Whether :meth:`check` of ``msgs`` needs no metadata call (the asyncio producer
        runs it on the loop then, else on its executor)."""
        now = time.monotonic()
        with self._lock:
            return all(
                now - self._max_bytes.get(m.topic, (-METADATA_TTL_S, None))[0] < METADATA_TTL_S
                for m in msgs
            ) and all(self.partitions.fresh(m.topic) for m in msgs)

    def check(self, msgs: list[Message], timeout: float) -> None:
        for msg in msgs:
            refuse_system_destination(msg.topic, self._prefix)
            if msg.scheduled:
                refuse_scheduled(msg)
        for msg in msgs:
            if not msg.value:
                raise MessageSizeError(
                    f"the message for {msg.topic!r} has an empty body (RocketMQ refuses it too)"
                )
            self._require_topic(msg.topic, timeout)
            if msg.partition is not None:
                self.partitions.require(msg.topic, msg.partition, timeout)
            limit = self._max_message_bytes(msg.topic, timeout)
            if limit is not None and (size := record_size(msg)) > limit:
                raise MessageSizeError(
                    f"the message for {msg.topic!r} takes about {size} bytes ({len(msg.value)} "
                    f"of body), over the topic's max.message.bytes of {limit}"
                )

    def _require_topic(self, topic: str, timeout: float) -> None:
        """Raise UnknownTopicError when two metadata reads in a row (the second fresh) say
        ``topic`` does not exist; any other failure stays a KafkaOperationError."""
        for fresh in (False, True):
            try:
                self.partitions.partitions(topic, timeout, fresh=fresh)
                return
            except KafkaOperationError as exc:
                if not _unknown_topic(exc):
                    raise
        raise UnknownTopicError(
            f"topic {topic!r} does not exist: create it before sending "
            f"to it (nothing was written, the local transaction not run)"
        )

    def _max_message_bytes(self, topic: str, timeout: float) -> int | None:
        with self._lock:
            cached = self._max_bytes.get(topic)
        if cached is not None and time.monotonic() - cached[0] < METADATA_TTL_S:
            return cached[1]
        limit = self._describe(topic, timeout)
        with self._lock:
            self._max_bytes.pop(topic, None)
            self._max_bytes[topic] = (time.monotonic(), limit)
            while len(self._max_bytes) > METADATA_MAX_TOPICS:
                del self._max_bytes[next(iter(self._max_bytes))]
        return limit

    def _describe(self, topic: str, timeout: float) -> int | None:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            entries = (
                self._admin_client()
                .describe_configs([resource], request_timeout=timeout)[resource]
                .result(timeout)
            )
            return int(entries["max.message.bytes"].value)
        except (KafkaException, KeyError, ValueError, TimeoutError) as exc:
            # A missing permission, a timeout: sent unchecked (the broker still refuses).
            log.warning(
                "%s: max.message.bytes not readable (%s); its messages are not "
                "size-checked before sending for %.0f s",
                topic,
                exc,
                METADATA_TTL_S,
            )
            return None

    def _admin_client(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = AdminClient(shared_conf(self._conf, who="transaction producer"))
            return self._admin


def _unknown_topic(exc: KafkaOperationError) -> bool:
    error = exc.kafka_error
    return error is not None and error.code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
    )
