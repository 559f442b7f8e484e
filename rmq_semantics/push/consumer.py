"""The facade: :class:`PushConsumer`, RocketMQ's concurrent push consumer on Kafka."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from rmq_semantics.clientconf import client_conf, self_committing_conf
from rmq_semantics.errors import ConfigError, IllegalStateError, RmqTimeoutError
from rmq_semantics.orderly.api import listener_callable
from rmq_semantics.orderly.keyed import DEFAULT_CONSUME_TIMEOUT_MS
from rmq_semantics.producer import producer_defaults
from rmq_semantics.push.api import MessageListenerConcurrently
from rmq_semantics.push.ledger import Ledger
from rmq_semantics.push.poller import TRANSACTION_TIMEOUT_MS, PollLoop, PollSettings
from rmq_semantics.push.pool import ListenerPool
from rmq_semantics.push.retry import DEFAULT_DELAY_LEVELS, check_delay_levels
from rmq_semantics.settings import PushConsumerSettings, load
from rmq_semantics.tags import TagFilter
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemPartitionFilter,
    SystemTopics,
    ensure_topics,
    refuse_system_topics,
    validate_prefix,
)

__all__ = ["DEFAULT_PUSH_WORKERS", "PushConsumer"]

log = logging.getLogger(__name__)

#: RocketMQ's ``consumeThreadMin``.
DEFAULT_PUSH_WORKERS = 20
SHUTDOWN_TIMEOUT_S = 60.0
START_TIMEOUT_S = 60.0
# Retry and DLQ topics keep a record for as long as the longest default level, many times.
RETRY_RETENTION_MS = str(7 * 24 * 3600 * 1000)


def push_consumer_conf(conf: dict) -> dict:
    """Copy ``conf`` with what the concurrent consumer needs (the caller's dict is untouched):
    it commits itself, inside its transactions, and reads only committed retry copies."""
    out = self_committing_conf(
        conf,
        who="PushConsumer",
        why="the PushConsumer commits offsets in the transactions that write its retry copies",
        forced={"isolation.level": "read_committed"},
    )
    if out.get("group.protocol", "classic") == "classic":
        # Incremental assignment: the rebalance callbacks assign and unassign themselves.
        out["partition.assignment.strategy"] = "cooperative-sticky"
    return out


def _listener_callable(listener: object) -> Callable[..., Any]:
    return listener_callable(listener, MessageListenerConcurrently, "ConsumeConcurrentlyStatus")


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
    return value


class PushConsumer:
    """RocketMQ's ``DefaultMQPushConsumer`` with a ``MessageListenerConcurrently``.

    ``listener`` gets up to ``consume_message_batch_max_size`` messages of one partition per
    call, on ``max_workers`` threads (one event loop for an ``async def`` listener), and
    returns CONSUME_SUCCESS or RECONSUME_LATER (a raise, a wrong return or a call past
    ``consume_timeout_ms`` counts as RECONSUME_LATER). A message to reconsume goes to
    ``<prefix>_retry_<group>_<level>`` and comes back once its level's delay
    (``delay_levels``, seconds, level 1 first) has passed; after ``max_reconsume_times``
    reconsumes it goes to ``<prefix>_dlq_<group>``. Offsets are committed below the lowest
    unfinished record, in the same Kafka transaction as the retry copies and dead letters.

    FIFO (``fifo``, on by default): a message with a ``message_group`` is consumed in order
    within its group: one call at a time per group, one message per call, in partition
    order, groups in parallel. RECONSUME_LATER (or a raise, a timeout) retries it in place
    after ``fifo_retry_interval_ms``, never through a retry topic, its group waiting behind
    it; after ``max_reconsume_times`` reconsumes it goes to the DLQ and the group goes on.
    ``fifo=False`` consumes every message as above. Settings:
    :class:`~rmq_semantics.settings.PushConsumerSettings` as kwargs, else env ``RMQ_<NAME>``.

    ``subscribe(topics, tags=None)``, ``start()``, ``shutdown()`` (idempotent, bounded); a
    context manager. No network in ``__init__``.
    """

    def __init__(
        self,
        conf: dict,
        *,
        listener: MessageListenerConcurrently | Callable[..., Any],
        max_workers: int = DEFAULT_PUSH_WORKERS,
        max_reconsume_times: int = 16,
        delay_levels: Sequence[float] = DEFAULT_DELAY_LEVELS,
        consume_message_batch_max_size: int = 1,
        consume_timeout_ms: int = DEFAULT_CONSUME_TIMEOUT_MS,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
        client_id: str | None = None,
        fifo: bool | None = None,
        fifo_retry_interval_ms: int | None = None,
    ) -> None:
        self.settings: PushConsumerSettings = load(
            PushConsumerSettings,
            {"fifo": fifo, "fifo_retry_interval_ms": fifo_retry_interval_ms},
        )
        self._conf = push_consumer_conf(conf)
        self.group: str = str(self._conf["group.id"])
        self.topic_prefix = validate_prefix(topic_prefix)
        self.system_topics = SystemTopics(self.topic_prefix)
        self._listener = _listener_callable(listener)
        self.max_workers = _check_int("max_workers", max_workers, 1)
        self.max_reconsume_times = _check_int("max_reconsume_times", max_reconsume_times, 0)
        self.batch_size = _check_int(
            "consume_message_batch_max_size", consume_message_batch_max_size, 1
        )
        self.consume_timeout_ms = _check_int("consume_timeout_ms", consume_timeout_ms, 1)
        self.delay_levels = check_delay_levels(delay_levels)
        self.client_id = client_id or f"{self.group}@{uuid.uuid4().hex[:12]}"
        self.dlq_topic = self.system_topics.dlq(self.group)
        self.retry_topics = [
            self.system_topics.retry(self.group, level)
            for level in range(1, len(self.delay_levels) + 1)
        ]
        self._topics: list[str] = []
        self._system = SystemPartitionFilter(self.topic_prefix, f"push consumer {self.client_id}")
        self._tags = TagFilter()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: PollLoop | None = None
        self._pool: ListenerPool | None = None
        self._shutdown_lock = threading.Lock()
        self._shut = False
        self._reported = False  # start() raised the poll thread's error already
        self.ledger = Ledger(
            retry_topic=lambda level: self.retry_topics[level - 1],
            dlq_topic=self.dlq_topic,
            delay_levels=self.delay_levels,
            max_reconsume_times=self.max_reconsume_times,
            fifo=self.settings.fifo,
            fifo_retry_interval_ms=self.settings.fifo_retry_interval_ms,
        )

    # -- public API ------------------------------------------------------------------------
    def subscribe(self, topics: Sequence[str], tags: str | None = None) -> None:
        """Topics to consume (before ``start()``), with RocketMQ's tag expression
        (``"TagA || TagB"``, ``"*"``/None: all); system topics are refused."""
        if (
            isinstance(topics, str)
            or not topics
            or not all(isinstance(t, str) and t for t in topics)
        ):
            raise ConfigError(f"subscribe wants a non-empty list of topic names, got {topics!r}")
        if self._thread is not None:
            raise IllegalStateError("subscribe() must be called before start()")
        refuse_system_topics(list(topics), self.topic_prefix)
        own = sorted(set(topics) & set(self.retry_topics))
        if own:  # read by this consumer already, at their due times
            raise ConfigError(
                f"{own[0]!r} is one of this consumer's retry topics: a system "
                "topic it reads by itself"
            )
        self._tags = TagFilter(tags)
        self._topics = list(topics)
        # Its own retry topics are system topics it reads by name.
        self._system.name([*self._topics, *self.retry_topics])

    def start(self) -> None:
        """Create the retry and DLQ topics, join the group and consume in the background."""
        if self._shut:
            raise IllegalStateError("this PushConsumer was shut down; make a new one")
        if self._thread is not None:
            return
        if not self._topics:
            raise IllegalStateError("call subscribe(topics) before start()")
        specs = {t: (1, {"retention.ms": RETRY_RETENTION_MS}) for t in self.retry_topics}
        specs[self.dlq_topic] = (1, {})
        ensure_topics(self._conf, specs, replicated=True)
        self._pool = ListenerPool(
            self._listener,
            max_workers=self.max_workers,
            ledger=self.ledger,
            name=self.group,
            consume_timeout_ms=self.consume_timeout_ms,
        )
        settings = PollSettings(
            consumer_conf=self._conf,
            producer_conf=client_conf(
                producer_defaults(self._conf, internal=True),
                forced={
                    "transactional.id": f"{self.topic_prefix}_push_{self.client_id}",
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                },
            ),
            topics=self._topics,
            retry_levels={t: i + 1 for i, t in enumerate(self.retry_topics)},
            delay_levels=self.delay_levels,
            tags=self._tags,
            batch_size=self.batch_size,
            backlog=max(4 * self.max_workers, 16),
            max_reconsume_times=self.max_reconsume_times,
            consume_timeout_ms=self.consume_timeout_ms,
            drain_timeout_s=SHUTDOWN_TIMEOUT_S / 2,
        )
        self._loop = PollLoop(
            settings, self.ledger, self._pool, self._stopping, self.client_id, self._system
        )
        self._thread = threading.Thread(
            target=self._loop.run, daemon=True, name=f"rmq-push-poll-{self.group}"
        )
        self._thread.start()
        if not self._loop.started.wait(START_TIMEOUT_S):
            raise RmqTimeoutError(
                f"PushConsumer {self.client_id} did not start within {START_TIMEOUT_S:.0f} s"
            )
        if self._loop.error is not None:
            self._reported = True
            raise self._loop.error
        log.info(
            "push consumer %s started on %s (tags %s)",
            self.client_id,
            self._topics,
            self._tags.expression,
        )

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Let running calls end, commit, leave the group. Idempotent; returns within about
        ``timeout`` seconds even if a listener hangs."""
        with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                log.warning(
                    "push consumer %s: poll thread still busy after %.0f s", self.client_id, timeout
                )
        if self._pool is not None:
            self._pool.close(max(0.1, deadline - time.monotonic()))
        log.info("push consumer %s shut down (%s)", self.client_id, self.ledger.counts)
        error = self.poll_error
        if error is not None and not self._reported:
            self._reported = True
            raise error

    @property
    def poll_error(self) -> BaseException | None:
        """The error that ended the poll thread (a fatal Kafka error), or None while it runs
        or ended normally; ``shutdown()`` raises it too. Errors it recovered from are counted
        in ``counts["poll_errors"]`` and logged instead."""
        return self._loop.error if self._loop is not None else None

    def __enter__(self) -> PushConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def skipped_system_partitions(self) -> int:
        """System-topic partitions a subscription pattern matched, left out at assignment
        (never fetched, delivered, retried or committed)."""
        return self._system.skipped_partitions

    @property
    def counts(self) -> dict[str, int]:
        """Messages consumed, retried, dead-lettered, skipped (tags), malformed retry
        records, timed-out calls, poll-thread errors recovered from and transactional
        producers re-created (``producer_renewals``: a fatal error, a transaction whose
        outcome is unknown, or a call abandoned past its timeout; the partitions replay from
        their committed offsets), since start."""
        return dict(self.ledger.counts)
