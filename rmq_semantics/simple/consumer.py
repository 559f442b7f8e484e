"""``SimpleConsumer``: RocketMQ 5's receive / ack / change_invisible_duration over Kafka.

The Kafka edge of the lease engine (:mod:`.engine`; docs/design/simple-consumer.md): the
instance is a member of the Kafka group ``consumer_group`` and keeps one
:class:`~.engine.PartitionEngine` per assigned partition, restored from the group's committed
offset and metadata (done records skipped, leases kept). ``receive`` reads as needed, takes a
batch from the engines and **commits before it hands the batch out** (offsets, done bitmap
and leases in one synchronous offset commit), so a delivery's attempt and deadline outlive
the instance; a failed commit hands out nothing. Acks are in memory and travel with the next
commit (every receive's, one at least every ``commit_interval_ms``, the revocation's and
close's); ``ack_async``'s future resolves once such a commit landed. Dead letters go to
``<prefix>_dlq_<group>`` synchronously before their record is done.

Threads: the caller's, and one background thread that polls between receives (so the member
stays in the group while the user works) and commits the acks every ``commit_interval_ms``.
Every call takes the one lock; ``receive`` polls in short slices and lets the lock go between
them, so an ``ack`` from another thread waits at most one slice. The rebalance callbacks run
inside those polls.

Over 500 lines because the class is RocketMQ 5's SimpleConsumer surface (receive, ack,
invisible durations, their async forms, subscriptions, lifecycle) over one lock and one
poller; the Kafka edge is :mod:`.poller` and the decisions :mod:`.engine`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import Enum
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException

from rmq_semantics.clientconf import client_conf, new_client, self_committing_conf
from rmq_semantics.consumed import headers_of, offset_of, partition_of, topic_of
from rmq_semantics.errors import (
    ConfigError,
    IllegalStateError,
    KafkaOperationError,
    ReceiptError,
)
from rmq_semantics.records.headers import H
from rmq_semantics.settings import SimpleConsumerSettings, load
from rmq_semantics.simple.engine import (
    Delivery,
    PartitionEngine,
    Receipt,
    message_group_of,
)
from rmq_semantics.simple.poller import Poller, group_text, now_ms
from rmq_semantics.tags import TagFilter
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemPartitionFilter,
    SystemTopics,
    ensure_topics,
    refuse_system_topics,
    validate_prefix,
)

__all__ = [
    "MAX_INVISIBLE_S",
    "MIN_INVISIBLE_S",
    "FilterExpression",
    "FilterType",
    "MessageView",
    "SimpleConsumer",
]

log = logging.getLogger(__name__)

#: Bounds of ``invisible_duration`` (RocketMQ's client checks the same range on the server).
MIN_INVISIBLE_S = 1.0
MAX_INVISIBLE_S = 12 * 3600.0
# One poll slice: the longest an ack from another thread waits for the lock.
POLL_SLICE_S = 0.05
# The classic protocol's session timeout unless conf sets one: with a 3 s heartbeat, a dead
# instance's partitions reach a live instance within 15 s (docs/guides/simple-consumer.md).
DEFAULT_SESSION_TIMEOUT_MS = 10_000
# The background poll's pace between receives (at most; commit_interval_ms if shorter).
KEEP_INTERVAL_S = 0.5
# Threads running the *_async calls: receives wait up to await_duration each, and acks
# queue behind them on the one lock, so a few suffice (RocketMQ's client has one pool too).
ASYNC_THREADS = 4


class FilterType(Enum):
    """The kind of a :class:`FilterExpression`: ``TAG`` (the only one supported) or ``SQL``
    (RocketMQ's SQL92 property filter, refused with a ConfigError)."""

    TAG = "TAG"
    SQL = "SQL92"


@dataclass(frozen=True)
class FilterExpression:
    """RocketMQ's filter of a subscription: a tag expression (``"*"``, ``"TagA || TagB"``).
    SQL92 expressions are refused (one ConfigError line)."""

    expression: str = "*"
    filter_type: FilterType = FilterType.TAG

    def __post_init__(self) -> None:
        if self.filter_type is not FilterType.TAG:
            raise ConfigError(
                "SQL92 filter expressions are not supported: filter by tags "
                "(FilterExpression('TagA || TagB'))"
            )
        TagFilter(self.expression)  # a malformed expression fails here, not at receive


@dataclass(frozen=True)
class MessageView:
    """A received message (RocketMQ's ``Message`` of a SimpleConsumer): RocketMQ's names and
    Kafka's. ``message_id`` is ``<topic>:<partition>:<offset>``, stable across redeliveries
    (retries are in place); ``receipt_handle`` names this delivery (ack it, or change its
    invisible duration, while it is current)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    tag: str | None
    keys: str | None
    message_group: str | None
    born_timestamp: int | None
    delivery_attempt: int
    invisible_until_ms: int
    receipt_handle: Receipt

    @property
    def message_id(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    @property
    def body(self) -> bytes | None:
        return self.value

    @property
    def properties(self) -> dict[str, bytes | None]:
        """The user's headers (the product's ``rmq.*`` ones left out)."""
        return {k: v for k, v in self.headers if not k.startswith("rmq.")}


def _text(headers: tuple[tuple[str, bytes | None], ...], name: str) -> str | None:
    value = None
    for key, raw in headers:
        if key == name and raw is not None:
            value = raw
    return None if value is None else value.decode("utf-8", "replace")


def _view(delivery: Delivery) -> MessageView:
    msg = delivery.record
    headers = tuple(headers_of(msg))
    born = _text(headers, H.BORN_TS)
    group = message_group_of(headers)
    timestamp = msg.timestamp()[1]
    return MessageView(
        topic=topic_of(msg),
        partition=partition_of(msg),
        offset=offset_of(msg),
        key=msg.key(),
        value=msg.value(),
        headers=headers,
        tag=_text(headers, H.TAGS),
        keys=_text(headers, H.KEYS),
        message_group=None if group is None else group_text(group),
        born_timestamp=int(born) if born and born.isdigit() else (timestamp or None),
        delivery_attempt=delivery.delivery_attempt,
        invisible_until_ms=delivery.invisible_until_ms,
        receipt_handle=delivery.receipt,
    )


def _receive_invisible_ms(max_message_num: Any, invisible_duration: Any) -> int:
    """A receive's arguments checked (ConfigError), its invisible duration in ms."""
    if isinstance(max_message_num, bool) or not isinstance(max_message_num, int):
        raise ConfigError(f"max_message_num must be an int, got {max_message_num!r}")
    if max_message_num < 1:
        raise ConfigError(f"max_message_num must be >= 1, got {max_message_num}")
    invisible_s = _seconds(invisible_duration, "invisible_duration")
    if not MIN_INVISIBLE_S <= invisible_s <= MAX_INVISIBLE_S:
        raise ConfigError(
            f"invisible_duration must be within [{MIN_INVISIBLE_S:g}, "
            f"{MAX_INVISIBLE_S:g}] seconds, got {invisible_s:g}"
        )
    return int(invisible_s * 1000)


def _changed_invisible_ms(invisible_duration: Any) -> int:
    invisible_s = _seconds(invisible_duration, "invisible_duration")
    if not 0 <= invisible_s <= MAX_INVISIBLE_S:
        raise ConfigError(
            f"invisible_duration must be within [0, {MAX_INVISIBLE_S:g}] seconds, "
            f"got {invisible_s:g}"
        )
    return int(invisible_s * 1000)


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be seconds (int, float or timedelta), got {value!r}")
    return float(value)


def _closed_before(
    task: concurrent.futures.Future[None],
    durable: concurrent.futures.Future[None],
    message: MessageView,
) -> None:
    """``durable`` fails when close() cancelled its ack before it ran."""
    if task.cancelled():
        durable.set_exception(
            IllegalStateError(
                f"ack of {message.receipt_handle.where}: the consumer closed before the ack "
                "was made; the message will be delivered again"
            )
        )


class SimpleConsumer:
    """RocketMQ 5's ``SimpleConsumer`` (see the module docstring and
    docs/design/simple-consumer.md).

    ``conf`` is the confluent-kafka conf (``bootstrap.servers`` ...); ``consumer_group`` the
    Kafka group (equal to ``conf['group.id']`` if both are given); ``subscription`` maps
    topics to a :class:`FilterExpression` (or a tag expression string, or None for all); a
    topic starting with ``^`` is a pattern (librdkafka's), whose system topics are left out
    (``skipped_system_partitions``) and whose filter applies to every topic it matches (a
    topic's own entry wins; among patterns, the first given).
    Settings: :class:`~rmq_semantics.settings.SimpleConsumerSettings` as kwargs, else env
    ``RMQ_<NAME>``. No network in ``__init__``: ``startup()`` (or ``start()``, or the context
    manager) joins the group; ``shutdown()``/``close()`` commits the acks and leaves it.
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        consumer_group: str | None = None,
        subscription: Mapping[str, FilterExpression | str | None] | None = None,
        *,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
        client_id: str | None = None,
        **settings: Any,
    ) -> None:
        given = dict(conf)
        if consumer_group is not None:
            if given.get("group.id") not in (None, consumer_group):
                raise ConfigError(
                    f"consumer_group={consumer_group!r} and conf group.id="
                    f"{given['group.id']!r} differ: give one of them"
                )
            given["group.id"] = consumer_group
        self._conf = self_committing_conf(
            given,
            who="SimpleConsumer",
            why="the SimpleConsumer commits its offsets and leases before each delivery",
            forced={"isolation.level": "read_committed"},
        )
        if self._conf.get("group.protocol", "classic") == "classic":
            # The rebalance callbacks assign and unassign incrementally.
            self._conf["partition.assignment.strategy"] = "cooperative-sticky"
            # A dead instance holds its partitions until its session times out: 10 s, not
            # librdkafka's 45 s (the keeper thread heartbeats between receives).
            self._conf.setdefault("session.timeout.ms", DEFAULT_SESSION_TIMEOUT_MS)
        self.s: SimpleConsumerSettings = load(SimpleConsumerSettings, settings)
        self.group = str(self._conf["group.id"])
        self.topic_prefix = validate_prefix(topic_prefix)
        self.client_id = client_id or f"{self.group}@{uuid.uuid4().hex[:12]}"
        self.dlq_topic = SystemTopics(self.topic_prefix).dlq(self.group)
        self._system = SystemPartitionFilter(self.topic_prefix, f"simple consumer {self.group}")
        self._filters: dict[str, TagFilter] = {}
        for topic, expression in (subscription or {}).items():
            self._set_filter(topic, expression)
        self._lock = threading.RLock()
        self._consumer: confluent_kafka.Consumer | None = None
        self._closed = False
        self._stopping = threading.Event()
        self._keeper: threading.Thread | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._io = Poller(
            self.s,
            group=self.group,
            client_id=self.client_id,
            dlq_topic=self.dlq_topic,
            system=self._system,
            filters=self._filters,
        )
        #: Counters (docs/design/simple-consumer.md, Metrics).
        self.counts = self._io.counts

    # -- subscription --------------------------------------------------------------------------
    def _set_filter(self, topic: str, expression: FilterExpression | str | None) -> None:
        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"a subscription topic must be a non-empty str, got {topic!r}")
        refuse_system_topics([topic], self.topic_prefix)
        if topic.startswith("^"):
            try:
                re.compile(topic)
            except re.error as exc:
                raise ConfigError(f"subscription pattern {topic!r}: {exc}") from exc
        if isinstance(expression, FilterExpression):
            text: str | None = expression.expression
        elif expression is None or isinstance(expression, str):
            text = expression
        else:
            raise ConfigError(
                f"the filter of {topic!r} must be a FilterExpression, got {expression!r}"
            )
        self._filters[topic] = TagFilter(text)

    def subscribe(
        self, topic: str, filter_expression: FilterExpression | str | None = None
    ) -> None:
        """Add (or replace) ``topic`` (a name, or a ``^`` pattern) in the subscription, with
        its filter."""
        with self._lock:
            self._set_filter(topic, filter_expression)
            if self._consumer is not None:
                self._subscribe()

    def unsubscribe(self, topic: str) -> None:
        with self._lock:
            self._filters.pop(topic, None)
            if self._consumer is not None:
                self._subscribe()

    def _subscribe(self) -> None:
        assert self._consumer is not None
        topics = sorted(self._filters)
        self._system.name(topics)
        self._io.filters_changed()
        if topics:
            self._consumer.subscribe(
                topics,
                on_assign=self._io.on_assign,
                on_revoke=self._io.on_revoke,
                on_lost=self._io.on_lost,
            )
        else:
            self._consumer.unsubscribe()

    # -- lifecycle -----------------------------------------------------------------------------
    def startup(self) -> SimpleConsumer:
        """Create the DLQ topic, join the group. Idempotent; refused after ``close()``."""
        with self._lock:
            if self._closed:
                raise IllegalStateError("this SimpleConsumer was closed; make a new one")
            if self._consumer is not None:
                return self
            ensure_topics(self._conf, {self.dlq_topic: (1, {})}, replicated=True)
            self._io.producer = new_client(
                confluent_kafka.Producer,
                client_conf(
                    self._conf,
                    who="SimpleConsumer DLQ producer",
                    internal=True,
                    forced={"enable.idempotence": True, "acks": "all"},
                ),
                "SimpleConsumer DLQ producer",
            )
            self._consumer = new_client(confluent_kafka.Consumer, self._conf, "SimpleConsumer")
            self._subscribe()
            self._keeper = threading.Thread(
                target=self._keep, name=f"simple-consumer-{self.group}", daemon=True
            )
            self._keeper.start()
            return self

    def _keep(self) -> None:
        """Between receives: poll (the group keeps this member past ``max.poll.interval.ms``,
        rebalances are served) and commit the acks every ``commit_interval_ms``."""
        interval = min(KEEP_INTERVAL_S, self.s.commit_interval_ms / 1000)
        while not self._stopping.wait(interval):
            with self._lock:
                consumer = self._consumer
                if consumer is None:
                    return
                try:
                    self._io.poll(consumer, 0)
                    self._io.commit_if_due(consumer)
                except Exception:  # the keeper must not die: log and go on
                    log.exception("simple consumer %s: background poll", self.client_id)

    start = startup

    def close(self) -> None:
        """Commit the acks, leave the group (the revocation commits again), release the
        clients. Idempotent."""
        self._stopping.set()
        keeper = self._keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(self.s.operation_timeout_s)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            executor, self._executor = self._executor, None
            consumer, self._consumer = self._consumer, None
            if consumer is not None:
                try:
                    self._io.commit(consumer, list(self._io.engines))
                except KafkaOperationError as exc:
                    log.warning("simple consumer %s: last commit: %s", self.client_id, exc)
                try:
                    consumer.close()
                except (KafkaException, RuntimeError) as exc:
                    log.warning("simple consumer %s: closing: %s", self.client_id, exc)
            self._io.engines.clear()
            self._io.acks.lose_all("the consumer closed")
            producer, self._io.producer = self._io.producer, None
            if producer is not None:
                producer.flush(self.s.operation_timeout_s)
        if executor is not None:
            # Queued calls are cancelled; running ones end at their next slice with
            # IllegalStateError ("closed"), through their futures.
            executor.shutdown(wait=False, cancel_futures=True)

    shutdown = close

    def __enter__(self) -> SimpleConsumer:
        return self.startup()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _running(self) -> confluent_kafka.Consumer:
        if self._closed:
            raise IllegalStateError("this SimpleConsumer was closed")
        if self._consumer is None:
            raise IllegalStateError("call startup() first")
        return self._consumer

    # -- the API -------------------------------------------------------------------------------
    def receive(
        self, max_message_num: int, invisible_duration: float | timedelta
    ) -> list[MessageView]:
        """Up to ``max_message_num`` messages, each invisible to the group for
        ``invisible_duration`` seconds (1 s to 12 h) unless acked; waits up to
        ``await_duration`` for the first and returns [] if none came. The batch is committed
        (with its leases) before it is returned."""
        return self._receive(
            max_message_num, _receive_invisible_ms(max_message_num, invisible_duration)
        )

    def _receive(self, max_message_num: int, invisible_ms: int) -> list[MessageView]:
        deadline = time.monotonic() + self.s.await_duration
        while True:
            with self._lock:
                consumer = self._running()
                self._io.poll(consumer, 0)
                batch = self._io.take(consumer, max_message_num, invisible_ms)
                if batch:
                    return [_view(d) for d in batch]
                self._io.commit_if_due(consumer)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._io.poll(consumer, min(POLL_SLICE_S, remaining))
            # the lock is free here a moment: acks of other threads go in

    def _engine_of(self, receipt: Receipt, what: str) -> PartitionEngine:
        engine = self._io.engines.get((receipt.topic, receipt.partition))
        if engine is None:
            self.counts["ack_refused"] += 1
            raise ReceiptError(
                f"{what} {receipt.where} attempt {receipt.attempt}: the partition is no "
                "longer this instance's"
            )
        return engine

    def ack(self, message: MessageView) -> None:
        """``message`` was consumed: it is done, in memory at once (microseconds, no round
        trip), durable with the next offset commit (within ``commit_interval_ms`` while
        commits succeed; an instance that dies or loses its partitions before then has the
        message delivered again). To know when it is durable, use :meth:`ack_async`.
        ReceiptError when its delivery is no longer current (its invisible duration passed,
        it was acked, or its partition moved)."""
        self._ack(message, None)

    def _ack(self, message: MessageView, durable: concurrent.futures.Future[None] | None) -> None:
        with self._lock:
            consumer = self._running()
            receipt = message.receipt_handle
            engine = self._engine_of(receipt, "ack")
            try:
                engine.ack(receipt, now_ms())
            except ReceiptError:
                self.counts["ack_refused"] += 1
                raise
            self.counts["acked"] += 1
            if durable is not None:  # before the commit below, which may carry it
                self._io.wait_for_commit(
                    (receipt.topic, receipt.partition), receipt.offset, durable
                )
            self._io.dirty = True
            self._io.commit_if_due(consumer)

    def _ack_durable(self, message: MessageView, durable: concurrent.futures.Future[None]) -> None:
        try:
            self._ack(message, durable)
        except Exception as exc:  # refused, or closed: the future must end either way
            durable.set_exception(exc)

    def change_invisible_duration(
        self, message: MessageView, invisible_duration: float | timedelta
    ) -> MessageView:
        """Make ``message`` invisible for ``invisible_duration`` seconds from now instead
        (no attempt counted), committed before this returns; the message with its new
        deadline (the receipt stays valid). ReceiptError as :meth:`ack`."""
        return self._change(message, _changed_invisible_ms(invisible_duration))

    def _change(self, message: MessageView, invisible_ms: int) -> MessageView:
        with self._lock:
            consumer = self._running()
            receipt = message.receipt_handle
            engine = self._engine_of(receipt, "change_invisible_duration of")
            try:
                until = engine.change_invisible_duration(receipt, invisible_ms, now_ms())
            except ReceiptError:
                self.counts["ack_refused"] += 1
                raise
            self._io.commit(consumer, [(receipt.topic, receipt.partition)])
            self.counts["invisible_changed"] += 1
            return replace(message, invisible_until_ms=until)

    # -- the async forms (RocketMQ's Python client: concurrent.futures.Future) -----------------
    def _submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        with self._lock:
            self._running()
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=ASYNC_THREADS, thread_name_prefix=f"simple-consumer-{self.group}"
                )
            return self._executor.submit(fn, *args)

    def receive_async(
        self, max_message_num: int, invisible_duration: float | timedelta
    ) -> concurrent.futures.Future[list[MessageView]]:
        """:meth:`receive` on the consumer's threads: a ``concurrent.futures.Future`` of the
        list, done within ``await_duration`` (plus a commit). Bad arguments raise
        ConfigError here, at the call. In asyncio code:
        ``await asyncio.wrap_future(consumer.receive_async(32, 15))``."""
        invisible_ms = _receive_invisible_ms(max_message_num, invisible_duration)
        return self._submit(self._receive, max_message_num, invisible_ms)

    def ack_async(self, message: MessageView) -> concurrent.futures.Future[None]:
        """:meth:`ack` on the consumer's threads, and a Future that resolves (to None) only
        once an offset commit carrying the ack landed: the message is then never delivered
        to the group again, whatever happens to this instance. It fails with
        :class:`ReceiptError` when the ack is refused (as :meth:`ack`), or when the
        partition is revoked or lost, or the consumer closed, before such a commit (the
        message will be delivered again); with ``RmqTimeoutError`` when no commit carried
        it within ``commit_interval_ms + operation_timeout_s`` (commits failing: the ack
        stays in memory and may still go with a later one). It resolves on the thread that
        committed, under the consumer's lock: keep done-callbacks short. Cannot be
        cancelled (the ack may be made already)."""
        durable: concurrent.futures.Future[None] = concurrent.futures.Future()
        durable.set_running_or_notify_cancel()  # ours to end: a cancel could not undo the ack
        task = self._submit(self._ack_durable, message, durable)
        task.add_done_callback(lambda done: _closed_before(done, durable, message))
        return durable

    def change_invisible_duration_async(
        self, message: MessageView, invisible_duration: float | timedelta
    ) -> concurrent.futures.Future[MessageView]:
        """:meth:`change_invisible_duration` on the consumer's threads: a Future of the
        message with its new deadline, done once the change is committed (each commit is
        bounded by ``operation_timeout_s``)."""
        return self._submit(self._change, message, _changed_invisible_ms(invisible_duration))

    def status(self) -> dict[str, dict[str, Any]]:
        """Per assigned partition (``topic[partition]``): ``commit_offset`` (where a commit
        now puts it), ``in_flight`` (invisible), ``leased`` (delivered, not done),
        ``buffered``, ``groups`` (message groups with records), ``paused`` (back-pressure)."""
        with self._lock:
            return self._io.status()

    @property
    def skipped_system_partitions(self) -> int:
        return self._system.skipped_partitions
