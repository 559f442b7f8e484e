"""The facade: :class:`OrderlyConsumer`, which builds and runs the parts of this package."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import confluent_kafka

from rmq_semantics.clientconf import new_client, self_committing_conf
from rmq_semantics.errors import ConfigError, IllegalStateError
from rmq_semantics.group_signing import consumer_group_key_of
from rmq_semantics.lock_client import CLIENT_LEASE_FRACTION, LockClient
from rmq_semantics.orderly.api import (
    MessageListenerOrderly,
    PartitionStatus,
    listener_callable,
)
from rmq_semantics.orderly.calls import ConsumerCalls
from rmq_semantics.orderly.commits import Commits
from rmq_semantics.orderly.dlq import DeadLetters
from rmq_semantics.orderly.keyed import DEFAULT_CONSUME_TIMEOUT_MS, DEFAULT_KEY_WORKERS, KeyPool
from rmq_semantics.orderly.keyfeed import KeyFeeder
from rmq_semantics.orderly.leases import LeaseKeeper
from rmq_semantics.orderly.poller import DEFAULT_MAX_QUEUED_BYTES, PollThread
from rmq_semantics.orderly.rebalance import Rebalance
from rmq_semantics.orderly.runtime import QueueRegistry
from rmq_semantics.orderly.worker import Worker
from rmq_semantics.settings import OrderlyConsumerSettings, load
from rmq_semantics.tags import TagFilter
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemPartitionFilter,
    SystemTopics,
    incremental_assignment,
    refuse_system_topics,
    validate_prefix,
)

__all__ = ["FETCH_QUEUE_BACKOFF_MS", "OrderlyConsumer", "consumer_conf"]

log = logging.getLogger(__name__)

# shutdown(): joining the poll thread (which finishes in-flight batches) and the others.
SHUTDOWN_TIMEOUT_S = 60.0
ORDERINGS = ("partition", "key")
#: Key mode's default max_reconsume_times: a failing key holds its partition's offset gap
#: (and, past the metadata bound, the partition) only this long, then goes to the DLQ.
KEY_MAX_RECONSUME_TIMES = 16


#: librdkafka's ``fetch.queue.backoff.ms`` unless the conf sets it: once a partition's local
#: queue passes ``queued.min.messages`` or ``queued.max.messages.kbytes``, librdkafka puts
#: its next fetch off by this long (default 1,000 ms). The poll thread empties that queue
#: into the queues' own buffers (bounded by flow control) within milliseconds, then waited
#: out the rest of the second: see docs/design/measurements.md.
FETCH_QUEUE_BACKOFF_MS = 10


def consumer_conf(conf: dict) -> dict:
    """Copy ``conf`` with what ordered consumption needs (the caller's dict is untouched)."""
    return self_committing_conf(
        conf,
        who="OrderlyConsumer",
        why="the orderly consumer commits each batch itself, under its queue lock",
        defaults={
            "isolation.level": "read_committed",
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        },
    )


def _listener_callable(listener: object) -> Callable[..., Any]:
    return listener_callable(listener, MessageListenerOrderly, "ConsumeOrderlyStatus")


class OrderlyConsumer:
    """RocketMQ's orderly push consumer (``MessageListenerOrderly``) on Kafka.

    ``conf`` is a confluent-kafka consumer conf with ``group.id`` (copied; auto commit must
    stay off). ``listener`` is a :class:`MessageListenerOrderly` or a callable
    ``(msgs, context) -> ConsumeOrderlyStatus``; it receives up to ``batch_size``
    messages of one partition in offset order (RocketMQ's ``consumeMessageBatchMaxSize``).
    A suspended batch (or one whose listener raised or returned something else) is
    retried after ``context.suspend_ms``; once it was retried ``max_reconsume_times``
    times (-1: forever, RocketMQ's orderly default) it goes to ``<topic_prefix>_dlq_<group>``
    and the queue moves on. Locks are leased for ``lock_lease_ms`` and renewed every
    ``lock_renew_ms``. ``client_id`` names this instance at the lock service (default
    random; never reuse one across processes). Under tenant isolation
    ``consumer_group_key`` (or ``consumer_group_key_file``; env ``RMQ_CONSUMER_GROUP_KEY``,
    :class:`~rmq_semantics.settings.OrderlyConsumerSettings`) is the group's key: its lock
    requests are signed with it.

    ``ordering="key"`` (RocketMQ 5's message groups): within the partitions whose lock this
    consumer holds, records of one ordering key (the ``rmq.message_group`` header, else the
    record key, else the partition) are handed over one call at a time in offset order, and
    different keys run in parallel on ``max_workers`` threads (default 16), or on one event
    loop when the listener is ``async def``. Each call gets up to ``batch_size`` consecutive
    records of one key; a suspension delays only that key, and ``max_reconsume_times``
    defaults to 16 there; a call running past ``consume_timeout_ms`` (default 15 min) counts
    as failed (an ``async def`` one is cancelled). The commit carries the done offsets above
    the committed one (see :mod:`~rmq_semantics.orderly.offsets`), so a new holder neither
    redoes nor skips work.

    Flow control (RocketMQ's ``pullThresholdForQueue``/``pullThresholdSizeForQueue``): a
    partition with 10,000 records or ``max_queued_bytes`` of values (default 100 MiB)
    buffered is paused until both are at half; in key mode the records taken into the
    pool and unfinished are bounded by ``max_queued_bytes`` too.

    ``subscribe(topics)``, ``start()`` (background threads), ``shutdown()`` (idempotent,
    bounded); a context manager that shuts down on exit. No network in ``__init__``.
    """

    def __init__(
        self,
        conf: dict,
        *,
        listener: MessageListenerOrderly | Callable[..., Any],
        max_reconsume_times: int | None = None,
        lock_lease_ms: int = 60000,
        lock_renew_ms: int = 20000,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
        batch_size: int = 1,
        client_id: str | None = None,
        ordering: str = "partition",
        max_workers: int | None = None,
        consume_timeout_ms: int = DEFAULT_CONSUME_TIMEOUT_MS,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        consumer_group_key: str | None = None,
        consumer_group_key_file: str | None = None,
    ) -> None:
        self.settings = load(
            OrderlyConsumerSettings,
            {
                "consumer_group_key": consumer_group_key,
                "consumer_group_key_file": consumer_group_key_file,
            },
        )
        self._conf = consumer_conf(conf)
        self.group: str = str(self._conf["group.id"])
        self.topic_prefix = validate_prefix(topic_prefix)
        self.topics = SystemTopics(self.topic_prefix)
        listen = _listener_callable(listener)
        if ordering not in ORDERINGS:
            raise ConfigError(f"ordering must be 'partition' or 'key', got {ordering!r}")
        self.ordering = ordering
        if max_reconsume_times is None:
            max_reconsume_times = KEY_MAX_RECONSUME_TIMES if ordering == "key" else -1
        if max_workers is None:
            max_workers = DEFAULT_KEY_WORKERS
        for name, value, low in (
            ("max_reconsume_times", max_reconsume_times, -1),
            ("max_workers", max_workers, 1),
            ("consume_timeout_ms", consume_timeout_ms, 1),
            ("lock_lease_ms", lock_lease_ms, 1),
            ("lock_renew_ms", lock_renew_ms, 1),
            ("batch_size", batch_size, 1),
            ("max_queued_bytes", max_queued_bytes, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
        if not lock_renew_ms < lock_lease_ms * CLIENT_LEASE_FRACTION:
            raise ConfigError(
                f"need 0 < lock_renew_ms < {CLIENT_LEASE_FRACTION:.2f} * lock_lease_ms (the "
                f"consumer's own view of the lease), got lock_renew_ms={lock_renew_ms}, "
                f"lock_lease_ms={lock_lease_ms}"
            )
        self.max_reconsume_times = max_reconsume_times
        self.lock_lease_ms = lock_lease_ms
        self.lock_renew_ms = lock_renew_ms
        self.batch_size = batch_size
        self.max_queued_bytes = max_queued_bytes
        self.client_id = client_id or f"{self.group}@{uuid.uuid4().hex[:12]}"
        self._topics: list[str] = []
        self._system = SystemPartitionFilter(
            self.topic_prefix, f"orderly consumer {self.client_id}"
        )
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []  # the poll thread, then the lock thread
        self._started = False
        self._shutdown_lock = threading.Lock()
        self._shut = False
        # The parts, wired here; the Kafka consumer itself is created by start().
        self._lock_client = LockClient(
            self._conf,
            self.topic_prefix,
            self.client_id,
            group_key=consumer_group_key_of(self.settings),
        )
        self._queues = QueueRegistry()
        self._calls = ConsumerCalls()
        self._commits = Commits(
            self.client_id, self._queues, self._calls, user_on_commit=self._conf.get("on_commit")
        )
        self._dead_letters = DeadLetters(self._conf, self.topics.dlq(self.group))
        self._leases = LeaseKeeper(
            self._lock_client,
            group=self.group,
            client_id=self.client_id,
            lease_ms=lock_lease_ms,
            renew_ms=lock_renew_ms,
            queues=self._queues,
            calls=self._calls,
        )
        self.max_workers = max_workers
        self._key_pool: KeyPool | None = None
        self._key_feeder: KeyFeeder | None = None
        self._worker: Worker | None = None
        if ordering == "key":
            self._key_pool = KeyPool(
                listen,
                max_workers=max_workers,
                max_reconsume_times=max_reconsume_times,
                commits=self._commits,
                dead_letters=self._dead_letters,
                name=self.group,
                consume_timeout_ms=consume_timeout_ms,
            )
            self._key_feeder = KeyFeeder(
                self._key_pool, batch_size=batch_size, max_taken_bytes=max_queued_bytes
            )
            run_queue = self._key_feeder.run
        else:
            self._worker = Worker(
                listen,
                batch_size=batch_size,
                max_reconsume_times=max_reconsume_times,
                commits=self._commits,
                dead_letters=self._dead_letters,
            )
            run_queue = self._worker.run
        self._rebalance = Rebalance(
            client_id=self.client_id,
            queues=self._queues,
            calls=self._calls,
            commits=self._commits,
            leases=self._leases,
            worker=run_queue,
            stopping=self._stopping,
            system=self._system,
            incremental=incremental_assignment(self._conf),
        )

    # -- public API ------------------------------------------------------------------------
    def subscribe(self, topics: Sequence[str], tags: str | None = None) -> None:
        """Topics to consume in order (before ``start()``); system topics are refused, but
        for a DLQ or retry topic named explicitly. ``tags``: RocketMQ's expression
        (``"TagA || TagB"``, ``"*"``) on ``rmq.tags``; records it leaves out are committed
        past without reaching the listener."""
        if (
            isinstance(topics, str)
            or not topics
            or not all(isinstance(t, str) and t for t in topics)
        ):
            raise ConfigError(f"subscribe wants a non-empty list of topic names, got {topics!r}")
        if self._started:
            raise IllegalStateError("subscribe() must be called before start()")
        tag_filter = TagFilter(tags)
        refuse_system_topics(list(topics), self.topic_prefix)
        self._topics = list(topics)
        self._system.name(self._topics)
        for part in (self._worker, self._key_feeder):
            if part is not None:
                part.tag_filter = tag_filter

    def start(self) -> None:
        """Join the group and consume in background threads."""
        if self._shut:
            raise IllegalStateError("this OrderlyConsumer was shut down; make a new one")
        if self._started:
            return
        if not self._topics:
            raise IllegalStateError("call subscribe(topics) before start()")
        consumer = new_client(
            confluent_kafka.Consumer,
            {**self._conf, "on_commit": self._commits.on_commit},
            "consumer",
        )
        self._started = True
        poller = PollThread(
            consumer,
            self._topics,
            client_id=self.client_id,
            queues=self._queues,
            calls=self._calls,
            commits=self._commits,
            rebalance=self._rebalance,
            stopping=self._stopping,
            max_queued_bytes=self.max_queued_bytes,
            inline=self._worker.run_inline if self._worker is not None else None,
        )
        for name, target in (("poll", poller.run), ("locks", self._leases.run)):
            thread = threading.Thread(
                target=target, name=f"rmq-orderly-{name}-{self.group}", daemon=True
            )
            self._threads.append(thread)
        self._calls.consumer, self._calls.thread = consumer, self._threads[0]
        if self._key_pool is not None:
            self._key_pool.start()
        for thread in self._threads:
            thread.start()
        log.info("orderly consumer %s started on %s", self.client_id, self._topics)

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Finish in-flight batches, commit, release the locks, leave the group. Idempotent;
        returns within about ``timeout`` seconds even if a listener hangs. Called from a
        listener the poll thread runs (see :mod:`~rmq_semantics.orderly.poller`), it
        returns at once and the shutdown completes in the background."""
        with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
        self._stopping.set()
        if self._threads and self._threads[0] is threading.current_thread():
            # From a listener the poll thread runs (its fast path): it cannot wait for
            # itself. It finishes the batch, drains and leaves; the rest runs beside it.
            threading.Thread(
                target=self._finish_shutdown,
                args=(timeout,),
                name=f"rmq-orderly-shutdown-{self.group}",
                daemon=True,
            ).start()
            return
        self._finish_shutdown(timeout)

    def _finish_shutdown(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if self._threads:
            poll_thread = self._threads[0]
            poll_thread.join(max(0.0, deadline - time.monotonic()))
            if poll_thread.is_alive():
                log.warning(
                    "orderly consumer %s: poll thread still busy after %.0f s",
                    self.client_id,
                    timeout,
                )
        self._leases.stop()
        for thread in self._threads[1:] + self._queues.workers():
            if thread is not threading.current_thread():  # shutdown() from a listener
                thread.join(max(0.1, deadline - time.monotonic()))
        if self._key_pool is not None:
            self._key_pool.stop(deadline)
        self._lock_client.close()
        self._dead_letters.close(max(0.1, deadline - time.monotonic()))
        log.info("orderly consumer %s shut down", self.client_id)

    def __enter__(self) -> OrderlyConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def skipped_system_partitions(self) -> int:
        """System-topic partitions a subscription pattern matched, left out at assignment
        (never fetched, locked, delivered or committed)."""
        return self._system.skipped_partitions

    def status(self) -> dict[tuple[str, int], PartitionStatus]:
        """Lock state, epoch, lease left, committed offset and lag of each assigned queue."""
        now = time.monotonic()
        out = {}
        for q in self._queues.all():
            with q.cv:
                status = q.state.status(now)
            if status is not None:
                if self._key_feeder is not None:
                    status = self._key_feeder.status(q, status)
                out[q.tp] = status
        return out
