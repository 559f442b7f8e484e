"""``Consumer``: a drop-in for ``confluent_kafka.Consumer`` that never yields system records."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka

from rmq_semantics.clientconf import client_conf, new_client
from rmq_semantics.tags import TagFilter
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemPartitionFilter,
    incremental_assignment,
    is_readable_system_topic,
    refuse_system_topics,
    validate_prefix,
)

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

# cluster_id()'s default wait.
CLUSTER_ID_TIMEOUT_S = 30.0


def consumer_defaults(conf: dict) -> dict:
    # Aborted Kafka transactions (the coordinator's) must never surface.
    return client_conf(conf, who="consumer", defaults={"isolation.level": "read_committed"})


class Consumer:
    """Drop-in for ``confluent_kafka.Consumer``: ``read_committed`` by default, and the
    product's system topics (``<topic_prefix>_*``) are never read, even when a subscription
    pattern matches them: their partitions are left out at assignment (never fetched, never
    committed, counted in ``skipped_system_partitions``), and the rebalance callbacks get
    the partitions that remain, with this consumer as their first argument. Subscribing to
    a system topic by name is an error, but for a DLQ or retry topic
    (``<prefix>_dlq_<group>``): named explicitly, it is read.

    ``subscribe(topics, tags="TagA || TagB")`` returns only records whose ``rmq.tags`` is
    one of them. This consumer never commits for the user: a record the tag filter leaves
    out only has its offset stored (``store_offsets``; librdkafka does it itself with
    ``enable.auto.offset.store`` on), so the user's commit, or auto-commit, covers it. A
    system-topic partition is never assigned, so nothing of it is fetched, stored or
    committed: the group keeps no offsets on system topics.
    """

    def __init__(self, conf: dict, *, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> None:
        self.topic_prefix = validate_prefix(topic_prefix)
        self._conf = consumer_defaults(conf)
        self._consumer = new_client(confluent_kafka.Consumer, self._conf, "consumer")
        self._system = SystemPartitionFilter(self.topic_prefix, "consumer")
        #: Records of system topics dropped when polled (none unless assigned by hand
        #: through the raw client: the filter at assignment keeps them from being fetched).
        self.skipped_system_records = 0
        #: Records the tag filter left out.
        self.skipped_tag_records = 0
        self._tags = TagFilter()
        self._incremental = incremental_assignment(self._conf)
        self._rebalance_calls = 0  # assignment changes the user's callback made itself
        # With auto store on, librdkafka stores a record's offset when poll returns it.
        self._store_skipped = str(self._conf.get("enable.auto.offset.store", True)).lower() in (
            "false",
            "0",
        )
        self._closed = False

    def _visible(self, msg: confluent_kafka.Message | None) -> bool:
        if msg is None:
            return False
        skipped = self._skipped(msg)
        if skipped == "tag" and self._store_skipped:
            self._consumer.store_offsets(message=msg)
        return skipped is None

    def _skipped(self, msg: confluent_kafka.Message) -> str | None:
        """Why ``msg`` is not handed out ("system", "tag"; counted), None if it is."""
        topic = msg.topic()
        if topic is not None and not self._system.keeps(topic):
            self.skipped_system_records += 1
            return "system"
        if self._tags.keeps_all or msg.error() is not None or self._tags.matches(msg.headers()):
            return None
        self.skipped_tag_records += 1
        return "tag"

    # -- reading ---------------------------------------------------------------------------
    def poll(self, timeout: float | None = None) -> confluent_kafka.Message | None:
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            remaining = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            msg = self._consumer.poll(remaining)
            if msg is None or self._visible(msg):
                return msg
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        return [m for m in self._consumer.consume(num_messages, timeout) if self._visible(m)]

    def subscribe(
        self,
        topics: list[str],
        tags: str | None = None,
        *,
        on_assign: Callable[..., Any] | None = None,
        on_revoke: Callable[..., Any] | None = None,
        on_lost: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """confluent_kafka's ``subscribe``, plus RocketMQ's tag expression for all ``topics``.
        The callbacks get ``(this consumer, partitions)`` without the system-topic ones."""
        topics = list(topics)
        tag_filter = TagFilter(tags)
        refuse_system_topics(topics, self.topic_prefix)
        self._consumer.subscribe(
            topics,
            on_assign=lambda _c, parts: self._assigned(on_assign, parts),
            on_revoke=lambda _c, parts: self._revoked(on_revoke, parts),
            on_lost=lambda _c, parts: self._revoked(on_lost or on_revoke, parts),
            **kwargs,
        )
        self._tags = tag_filter
        self._system.name(topics)

    def _assigned(self, callback: Callable[..., Any] | None, partitions: list) -> None:
        """Rebalance: assign ``partitions`` but the system ones, or let ``callback`` do it.
        Either way one assignment call is made: else the client assigns them all itself."""
        kept = self._system.keep(partitions)
        self._rebalance(
            callback,
            kept,
            lambda: (
                self._consumer.incremental_assign(kept)
                if self._incremental
                else self._consumer.assign(kept)
            ),
        )

    def _revoked(self, callback: Callable[..., Any] | None, partitions: list) -> None:
        kept = self._system.release(partitions)
        self._rebalance(
            callback,
            kept,
            lambda: (
                self._consumer.incremental_unassign(kept)
                if self._incremental
                else self._consumer.unassign()
            ),
        )

    def _rebalance(
        self, callback: Callable[..., Any] | None, kept: list, default: Callable[[], None]
    ) -> None:
        """``callback`` with this drop-in; ``default`` unless it made the call itself."""
        self._rebalance_calls = 0
        try:
            if callback is not None:
                callback(self, kept)
        finally:
            if not self._rebalance_calls:
                default()

    def _name(self, partitions: list) -> None:
        self._system.named |= {
            tp.topic for tp in partitions if is_readable_system_topic(tp.topic, self.topic_prefix)
        }

    def assign(self, partitions: list) -> None:
        refuse_system_topics([tp.topic for tp in partitions], self.topic_prefix)
        self._rebalance_calls += 1
        self._consumer.assign(partitions)
        self._name(partitions)

    def incremental_assign(self, partitions: list) -> None:
        refuse_system_topics([tp.topic for tp in partitions], self.topic_prefix)
        self._rebalance_calls += 1
        self._consumer.incremental_assign(partitions)
        self._name(partitions)

    @property
    def skipped_system_partitions(self) -> int:
        """System-topic partitions a subscription pattern matched, left out at assignment."""
        return self._system.skipped_partitions

    # -- confluent_kafka.Consumer, delegated ------------------------------------------------
    def unsubscribe(self) -> None:
        self._consumer.unsubscribe()

    def unassign(self) -> None:
        self._rebalance_calls += 1
        self._consumer.unassign()

    def incremental_unassign(self, partitions: list) -> None:
        self._rebalance_calls += 1
        self._consumer.incremental_unassign(partitions)

    def assignment(self) -> list:
        return self._consumer.assignment()

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        return self._consumer.commit(*args, **kwargs)

    def committed(self, *args: Any, **kwargs: Any) -> list:
        return self._consumer.committed(*args, **kwargs)

    def position(self, partitions: list) -> list:
        return self._consumer.position(partitions)

    def seek(self, partition: Any) -> None:
        self._consumer.seek(partition)

    def pause(self, partitions: list) -> None:
        self._consumer.pause(partitions)

    def resume(self, partitions: list) -> None:
        self._consumer.resume(partitions)

    def store_offsets(self, *args: Any, **kwargs: Any) -> None:
        self._consumer.store_offsets(*args, **kwargs)

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> Any:
        return self._consumer.get_watermark_offsets(*args, **kwargs)

    def offsets_for_times(self, *args: Any, **kwargs: Any) -> list:
        return self._consumer.offsets_for_times(*args, **kwargs)

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return self._consumer.list_topics(*args, **kwargs)

    def consumer_group_metadata(self) -> Any:
        return self._consumer.consumer_group_metadata()

    def memberid(self) -> str | None:
        return self._consumer.memberid()

    def cluster_id(self, timeout: float = CLUSTER_ID_TIMEOUT_S) -> str | None:
        """The cluster id from the broker metadata (None if none came within ``timeout``;
        confluent-kafka's default waits for ever)."""
        return self._consumer.cluster_id(timeout)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        self._consumer.set_sasl_credentials(username, password)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Leave the group and release resources. Idempotent."""
        if not self._closed:
            self._closed = True
            self._consumer.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
