"""Ordered consumption with queue locks: RocketMQ's ``MessageListenerOrderly`` on Kafka.

Per assigned partition there is one thread of control that hands the listener the
partition's messages in offset order (RocketMQ's ``ProcessQueue`` + per-queue lock);
partitions run in parallel. A partition is processed only while this consumer holds the
coordinator's queue lock for (group, topic, partition): a lock thread takes and renews
the locks for every assigned partition in one batch request (``lockBatchMQ``) and keeps
this consumer's own, shorter view of each lease (see :mod:`rmq_semantics.lock_client`).

Fencing: the lease is checked with a monotonic clock before every batch and again before
every commit, together with the epoch the batch started under; a consumer that was
paused (SIGSTOP, GC, swap) past its lease neither processes nor commits for partitions it
lost. A new epoch re-reads the committed offset before anything is processed, so work
resumes exactly where the previous holder committed.

Threads: one poll thread owns the ``confluent_kafka.Consumer`` (confluent-kafka serializes
calls on one handle, so every consumer call — commits, committed offsets, seeks — runs on
that thread; workers hand them over), one lock thread, one worker per partition.
A worker does not wait for its batch's commit: it leaves the offset with its queue and goes
on, and the poll thread commits every queue's offset in one request between polls, each
checked against its lock right before (like RocketMQ's offset store, but not periodic). A
crash between a batch and that commit redelivers the batch to the next holder, in order.

Rebalances use ``cooperative-sticky`` assignment: only partitions that move are revoked,
so the other queues keep their locks and go on in order during a rebalance (an eager
rebalance would stop, commit and unlock every queue of every member). On revocation the
in-flight batch finishes, its offset is committed, then the lock is released (in
``finally``); a *lost* partition (session expired) is dropped and never committed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rmq_semantics.clientconf import client_conf
from rmq_semantics.errors import (
    CommitRefusedError,
    ConfigError,
    KafkaOperationError,
    RmqError,
    RmqTimeoutError,
)
from rmq_semantics.lock_client import CLIENT_LEASE_FRACTION, LockClient
from rmq_semantics.producer import producer_defaults
from rmq_semantics.records.headers import H
from rmq_semantics.retry import retrying
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemTopics,
    ensure_topics,
    refuse_system_topics,
    validate_prefix,
)

__all__ = [
    "DLQ_ORIGINAL_OFFSET",
    "DLQ_ORIGINAL_PARTITION",
    "DLQ_ORIGINAL_TOPIC",
    "DLQ_RECONSUME_TIMES",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "MessageListenerOrderly",
    "OrderlyConsumer",
    "OrderlyMessage",
    "PartitionStatus",
]

log = logging.getLogger(__name__)

#: Headers of a dead-lettered message (besides its own key, value and headers); the names
#: live in records.headers, these are their public spellings in this module.
DLQ_ORIGINAL_TOPIC = H.DLQ_ORIGINAL_TOPIC
DLQ_ORIGINAL_PARTITION = H.DLQ_ORIGINAL_PARTITION
DLQ_ORIGINAL_OFFSET = H.DLQ_ORIGINAL_OFFSET
DLQ_RECONSUME_TIMES = H.DLQ_RECONSUME_TIMES

DEFAULT_SUSPEND_MS = 1000
# RocketMQ's pullThresholdForQueue: a partition with this many unconsumed messages is
# paused, so a suspended or unlocked queue never holds up the others. Higher than RocketMQ's
# 1000: pausing makes librdkafka drop what it prefetched for the partition, and at 1000 the
# pause/resume churn cut throughput by two thirds (10 MiB of 1 KiB messages per queue).
MAX_QUEUED = 10_000
POLL_BATCH = 500
# The poll thread runs the workers' consumer calls and sends their commits between polls:
# this bounds how late they run.
POLL_WAIT_S = 0.01
# Wait slice: how late a stop flag, a lease end or a suspension end is noticed.
WAIT_SLICE_S = 0.1
# A partition without a lock is asked for again this often (a lapsed lease elsewhere
# becomes ours within this); held locks are renewed every lock_renew_ms.
LOCK_RETRY_S = 0.5
# One lock round trip (see lock_client); also bounded by the renew interval.
LOCK_TIMEOUT_S = 5.0
# Committed-offset look-ups and synchronous commits on a loaded broker.
COMMIT_TIMEOUT_S = 10.0
# Dead-letter sends wait for the broker's acknowledgement.
DLQ_TIMEOUT_S = 30.0
# Revocation waits for the in-flight batch at most this long (and never past the lease:
# after that the batch could not commit anyway).
REVOKE_WAIT_CAP_S = 30.0
# shutdown(): joining the poll thread (which finishes in-flight batches) and the others.
SHUTDOWN_TIMEOUT_S = 60.0
# Shutdown keeps polling at most this long for in-flight batches and refused commits.
DRAIN_CAP_S = 10.0
# Revocation retries a refused commit (a rebalance starting again) this long.
COMMIT_RETRY_FOR_S = 2.0


class ConsumeOrderlyStatus(Enum):
    """What an orderly listener returns for a batch."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class ConsumeOrderlyContext:
    """Per-call context: the queue, and how long to suspend it if the batch is not done.

    ``lock_epoch`` is the fencing epoch of the queue lock the batch runs under; a
    listener can store it with its side effects to reject writes of a deposed holder.
    """

    def __init__(self, topic: str, partition: int, lock_epoch: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        self.lock_epoch = lock_epoch
        self._suspend_ms = DEFAULT_SUSPEND_MS

    @property
    def suspend_ms(self) -> int:
        """Delay before a suspended batch is retried (RocketMQ's
        ``suspendCurrentQueueTimeMillis``), default 1000."""
        return self._suspend_ms

    @suspend_ms.setter
    def suspend_ms(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"suspend_ms must be an int >= 0, got {value!r}")
        self._suspend_ms = value

    def __repr__(self) -> str:
        return (f"ConsumeOrderlyContext(topic={self.topic!r}, partition={self.partition}, "
                f"lock_epoch={self.lock_epoch}, suspend_ms={self._suspend_ms})")


class MessageListenerOrderly:
    """Base class of orderly listeners; any callable ``(msgs, context) -> status`` works too."""

    def consume_message(self, msgs: list[OrderlyMessage],
                        context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        """Process ``msgs`` (one partition, offset order); return SUCCESS or SUSPEND."""
        raise NotImplementedError


@dataclass(frozen=True)
class OrderlyMessage:
    """A message handed to an orderly listener. ``reconsume_times`` counts earlier
    deliveries of the same message that were suspended."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    reconsume_times: int = 0

    @classmethod
    def from_kafka(cls, msg: confluent_kafka.Message) -> OrderlyMessage:
        # One per consumed message on the poll thread: filling __dict__ directly skips the
        # frozen __init__'s per-field object.__setattr__ (0.7 -> 0.2 us, measured).
        headers = msg.headers()
        out = cls.__new__(cls)
        out.__dict__.update(
            topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), key=msg.key(),
            value=msg.value(), timestamp=msg.timestamp()[1], reconsume_times=0,
            headers=tuple((k, v if v is not None else b"") for k, v in headers)
            if headers else ())
        return out

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True)
class PartitionStatus:
    """One assigned partition as this consumer sees it (see :meth:`OrderlyConsumer.status`).

    ``lock_state`` is ``"held"`` (granted, and this consumer's view of the lease has not
    lapsed), ``"lapsed"`` (granted, but not renewed in time: not processing) or
    ``"unlocked"``. ``committed_offset`` is the next offset to consume (-1: none committed
    yet); ``lag`` is the partition's end minus that (-1 when unknown).
    """

    topic: str
    partition: int
    lock_state: str
    epoch: int
    lease_remaining_ms: int
    committed_offset: int
    lag: int
    queued: int
    in_flight: int
    reconsume_times: int
    suspended: bool

    @property
    def locked(self) -> bool:
        """The queue lock is held and its lease is live in this consumer's view."""
        return self.lock_state == "held"


REBALANCE_CODES = frozenset({KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION})


def _event(name: str, **fields: Any) -> dict[str, Any]:
    """``extra=`` of a log line that marks a protocol event (for log-based monitoring)."""
    return {"rmq_event": name, "rmq_fields": fields}


class _Queue:
    """RocketMQ's ``ProcessQueue``: the state of one assigned partition.

    Fields are guarded by ``cv``; ``consume_lock`` is held while a batch is in the
    listener or being committed, and is shared by every assignment of the partition.
    """

    def __init__(self, tp: tuple[str, int], consume_lock: threading.Lock) -> None:
        self.tp = tp
        self.cv = threading.Condition()
        self.consume_lock = consume_lock
        self.msgs: deque[OrderlyMessage] = deque()
        self.inflight: list[OrderlyMessage] = []
        self.pending_commit: int | None = None  # processed; only the commit is missing
        self.pending_epoch = -1  # the epoch the processed batch ran under
        self.released = -1  # messages below this were processed (committed or not yet)
        self.commit_sent = -1  # the offset of the commit request in flight (poll thread)
        self.reconsume_times = 0
        self.suspended_until = 0.0
        self.granted = False
        self.epoch = -1
        self.deadline = 0.0
        self.ready_epoch = -1  # epoch whose committed offset this queue is aligned with
        self.min_offset = -1
        self.committed = -1
        self.reset_to: int | None = None  # backward seek for the poll thread
        self.revoking = False
        self.dropped = False
        self.lost = False
        self.paused = False
        self.high = -1  # partition end as last seen by the fetcher (for lag)
        self.thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"{self.tp[0]}[{self.tp[1]}]"

    def lease_ok(self, now: float) -> bool:
        return self.granted and now < self.deadline and not self.lost

    def runnable(self, now: float) -> bool:
        return (self.lease_ok(now) and self.ready_epoch == self.epoch and not self.revoking
                and not self.dropped and self.reset_to is None
                and (bool(self.inflight) or bool(self.msgs))
                and now >= self.suspended_until)


class _Command:
    """A consumer call handed to the poll thread, and its outcome."""

    def __init__(self, fn: Callable[[confluent_kafka.Consumer], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.cancelled = False
        self.result: Any = None
        self.error: BaseException | None = None


def _epoch_of(metadata: str | None) -> int:
    """The lock epoch in a commit's metadata ("client:epoch"); -1 when there is none."""
    try:
        return int((metadata or "").rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


def consumer_conf(conf: dict) -> dict:
    """Copy ``conf`` with what ordered consumption needs (the caller's dict is untouched)."""
    if isinstance(conf, dict) and str(conf.get("enable.auto.commit", "false")).lower() not in (
            "false", "0"):
        raise ConfigError("enable.auto.commit must be false: the orderly consumer commits "
                          "each batch itself, under its queue lock")
    out = client_conf(conf, who="OrderlyConsumer", defaults={
        "isolation.level": "read_committed"}, forced={
        "enable.auto.commit": False, "enable.auto.offset.store": False})
    if not out.get("group.id"):
        raise ConfigError("conf needs 'group.id': the orderly consumer group")
    if out.get("group.protocol", "classic") == "classic":
        out.setdefault("partition.assignment.strategy", "cooperative-sticky")
    return out


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
    random; never reuse one across processes).

    ``subscribe(topics)``, ``start()`` (background threads), ``shutdown()`` (idempotent,
    bounded); a context manager that shuts down on exit. No network in ``__init__``.
    """

    def __init__(self, conf: dict, *,
                 listener: MessageListenerOrderly | Callable[..., Any],
                 max_reconsume_times: int = -1, lock_lease_ms: int = 60000,
                 lock_renew_ms: int = 20000, topic_prefix: str = DEFAULT_TOPIC_PREFIX,
                 batch_size: int = 1, client_id: str | None = None) -> None:
        self._conf = consumer_conf(conf)
        self.group: str = str(self._conf["group.id"])
        self.topic_prefix = validate_prefix(topic_prefix)
        self.topics = SystemTopics(self.topic_prefix)
        if isinstance(listener, MessageListenerOrderly):
            self._listener: Callable[..., Any] = listener.consume_message
        elif callable(listener):
            self._listener = listener
        else:
            raise ConfigError("listener must be a MessageListenerOrderly or a callable "
                              f"(msgs, context) -> ConsumeOrderlyStatus, got {listener!r}")
        for name, value, low in (("max_reconsume_times", max_reconsume_times, -1),
                                 ("lock_lease_ms", lock_lease_ms, 1),
                                 ("lock_renew_ms", lock_renew_ms, 1),
                                 ("batch_size", batch_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
        if not lock_renew_ms < lock_lease_ms * CLIENT_LEASE_FRACTION:
            raise ConfigError(
                f"need 0 < lock_renew_ms < {CLIENT_LEASE_FRACTION:.2f} * lock_lease_ms (the "
                f"consumer's own view of the lease), got lock_renew_ms={lock_renew_ms}, "
                f"lock_lease_ms={lock_lease_ms}")
        self.max_reconsume_times = max_reconsume_times
        self.lock_lease_ms = lock_lease_ms
        self.lock_renew_ms = lock_renew_ms
        self.batch_size = batch_size
        self.client_id = client_id or f"{self.group}@{uuid.uuid4().hex[:12]}"
        self._lock_client = LockClient(self._conf, self.topic_prefix, self.client_id)
        self._topics: list[str] = []
        self._consumer: confluent_kafka.Consumer | None = None
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._consume_locks: dict[tuple[str, int], threading.Lock] = {}
        self._registry = threading.RLock()
        # Held around every lock/unlock round trip, so an unlock is never overtaken by a
        # lock request for the same queue from the lock thread.
        self._lock_calls = threading.Lock()
        self._stopping = threading.Event()
        self._lock_stop = threading.Event()
        self._wake_locks = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []
        self._started = False
        self._shutdown_lock = threading.Lock()
        self._shut = False
        self._dlq_producer: confluent_kafka.Producer | None = None
        self._dlq_ready = False
        self._dlq_lock = threading.Lock()
        self._commands: deque[_Command] = deque()
        self._commit_retry_at = 0.0  # poll thread: no commit round before this (refused)
        self._commands_lock = threading.Lock()
        self._poll_thread: threading.Thread | None = None
        self._poll_done = threading.Event()

    # -- public API ------------------------------------------------------------------------
    def subscribe(self, topics: Sequence[str]) -> None:
        """Topics to consume in order (before ``start()``); system topics are refused."""
        if isinstance(topics, str) or not topics or not all(
                isinstance(t, str) and t for t in topics):
            raise ConfigError(f"subscribe wants a non-empty list of topic names, got {topics!r}")
        if self._started:
            raise ConfigError("subscribe() must be called before start()")
        refuse_system_topics(list(topics), self.topic_prefix)
        self._topics = list(topics)

    def start(self) -> None:
        """Join the group and consume in background threads."""
        if self._shut:
            raise ConfigError("this OrderlyConsumer was shut down; make a new one")
        if self._started:
            return
        if not self._topics:
            raise ConfigError("call subscribe(topics) before start()")
        try:
            self._consumer = confluent_kafka.Consumer({**self._conf,
                                                       "on_commit": self._on_commit})
        except KafkaException as exc:
            raise ConfigError(f"invalid consumer conf: {exc.args[0].str()}") from exc
        self._started = True
        for name, target in (("poll", self._poll_loop), ("locks", self._lock_loop)):
            thread = threading.Thread(target=target, name=f"rmq-orderly-{name}-{self.group}",
                                      daemon=True)
            self._threads.append(thread)
        self._poll_thread = self._threads[0]
        for thread in self._threads:
            thread.start()
        log.info("orderly consumer %s started on %s", self.client_id, self._topics)

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Finish in-flight batches, commit, release the locks, leave the group. Idempotent;
        returns within about ``timeout`` seconds even if a listener hangs."""
        with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
        deadline = time.monotonic() + timeout
        self._stopping.set()
        poll_thread = self._threads[0] if self._threads else None
        if poll_thread is not None:
            poll_thread.join(max(0.0, deadline - time.monotonic()))
            if poll_thread.is_alive():
                log.warning("orderly consumer %s: poll thread still busy after %.0f s",
                            self.client_id, timeout)
        elif self._consumer is not None:
            self._consumer.close()
        self._lock_stop.set()
        self._wake_locks.set()
        with self._registry:
            others = self._threads[1:] + self._workers
        for thread in others:
            if thread is not threading.current_thread():  # shutdown() from a listener
                thread.join(max(0.1, deadline - time.monotonic()))
        self._lock_client.close()
        if self._dlq_producer is not None:
            self._dlq_producer.flush(max(0.1, deadline - time.monotonic()))
        log.info("orderly consumer %s shut down", self.client_id)

    def __enter__(self) -> OrderlyConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def status(self) -> dict[tuple[str, int], PartitionStatus]:
        """Lock state, epoch, lease left, committed offset and lag of each assigned queue."""
        now = time.monotonic()
        with self._registry:
            queues = list(self._queues.values())
        out = {}
        for q in queues:
            with q.cv:
                if q.dropped:
                    continue
                locked = q.lease_ok(now)
                state = "held" if locked else "lapsed" if q.granted else "unlocked"
                committed = q.committed
                lag = max(0, q.high - committed) if q.high >= 0 and committed >= 0 else -1
                out[q.tp] = PartitionStatus(
                    q.tp[0], q.tp[1], state, q.epoch,
                    int(max(0.0, q.deadline - now) * 1000) if locked else 0, committed,
                    lag, len(q.msgs), len(q.inflight), q.reconsume_times,
                    now < q.suspended_until)
        return out

    # -- consumer calls go through the poll thread ---------------------------------------------
    def _submit(self, fn: Callable[[confluent_kafka.Consumer], Any], what: str,
                timeout: float = COMMIT_TIMEOUT_S) -> Any:
        """Run ``fn(consumer)`` on the poll thread (at once if we are on it) and return its
        result; raises what it raised, or RmqTimeoutError."""
        consumer = self._consumer
        if consumer is None:
            raise KafkaOperationError(f"{what}: the consumer is not running")
        if threading.current_thread() is self._poll_thread:
            return fn(consumer)
        command = _Command(fn)
        with self._commands_lock:
            if self._poll_done.is_set():
                raise KafkaOperationError(f"{what}: the consumer is shutting down")
            self._commands.append(command)
        # The poll thread answers within a poll slice plus the call itself.
        if not command.done.wait(timeout + POLL_WAIT_S):
            command.cancelled = True
            raise RmqTimeoutError(f"{what}: the poll thread did not run it within "
                                  f"{timeout:.0f} s")
        if command.error is not None:
            raise command.error
        return command.result

    def _run_commands(self, consumer: confluent_kafka.Consumer) -> None:
        while True:
            with self._commands_lock:
                if not self._commands:
                    return
                command = self._commands.popleft()
            if command.cancelled:
                continue
            try:
                command.result = command.fn(consumer)
            except BaseException as exc:  # handed to the waiting thread
                command.error = exc
            finally:
                command.done.set()

    def _fail_commands(self) -> None:
        with self._commands_lock:
            self._poll_done.set()
            pending, self._commands = list(self._commands), deque()
        for command in pending:
            command.error = KafkaOperationError("the consumer shut down")
            command.done.set()

    # -- poll thread -----------------------------------------------------------------------
    def _poll_loop(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        try:
            consumer.subscribe(self._topics, on_assign=self._on_assign,
                               on_revoke=self._on_revoke, on_lost=self._on_lost)
            while not self._stopping.is_set():
                self._poll_once(consumer)
            self._drain(consumer)
        except Exception:  # a bug must not leave the queues running without a poller
            log.exception("orderly consumer %s: poll thread failed", self.client_id)
        finally:
            try:
                with self._registry:
                    queues = list(self._queues.values())
                self._release(queues, lost=False)
            finally:
                self._fail_commands()
                try:
                    consumer.close()
                except (KafkaException, RuntimeError) as exc:
                    log.warning("orderly consumer %s: closing the consumer: %s",
                                self.client_id, exc)

    def _poll_once(self, consumer: confluent_kafka.Consumer) -> None:
        try:
            msgs = consumer.consume(POLL_BATCH, POLL_WAIT_S)
        except KafkaException as exc:
            log.warning("orderly consumer %s: %s", self.client_id, exc.args[0].str())
            self._stopping.wait(POLL_WAIT_S)
            return
        by_partition: dict[tuple[str, int], list[confluent_kafka.Message]] = {}
        for msg in msgs:
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("orderly consumer %s: %s", self.client_id, msg.error().str())
                continue
            by_partition.setdefault((msg.topic(), msg.partition()), []).append(msg)
        for tp, batch in by_partition.items():
            self._dispatch(tp, batch)
        self._run_commands(consumer)
        self._flush_commits(consumer)
        self._flow_control(consumer)

    def _drain(self, consumer: confluent_kafka.Consumer) -> None:
        """Shutdown: start no new batch, but keep polling until the in-flight batches and
        their commits are done. A commit is refused while a group rebalance is under way;
        polling lets the rebalance complete (bounded by the leases and DRAIN_CAP_S)."""
        with self._registry:
            queues = list(self._queues.values())
        deadline = time.monotonic()
        for q in queues:
            with q.cv:
                q.revoking = True
                q.cv.notify_all()
                deadline = max(deadline, q.deadline)
        deadline = min(deadline, time.monotonic() + DRAIN_CAP_S)
        while time.monotonic() < deadline:
            busy = False
            for q in queues:
                with q.cv:
                    if q.dropped:
                        continue
                    pending = q.pending_commit is not None
                if q.consume_lock.acquire(blocking=False):
                    try:
                        if pending:
                            self._commit_pending(q)
                        with q.cv:
                            busy = busy or (q.pending_commit is not None and not q.dropped)
                    finally:
                        q.consume_lock.release()
                else:
                    busy = True  # a batch is in the listener
            if not busy:
                return
            self._poll_once(consumer)

    def _dispatch(self, tp: tuple[str, int], msgs: list[confluent_kafka.Message]) -> None:
        """Queue one partition's fetched messages (in offset order) for its worker."""
        with self._registry:
            q = self._queues.get(tp)
        if q is None:
            return
        built = [OrderlyMessage.from_kafka(msg) for msg in msgs]
        with q.cv:
            if q.dropped or q.reset_to is not None:
                return
            q.msgs.extend(m for m in built if m.offset >= q.min_offset)
            q.cv.notify_all()

    def _flow_control(self, consumer: confluent_kafka.Consumer) -> None:
        with self._registry:
            queues = list(self._queues.values())
        for q in queues:
            with q.cv:
                if q.dropped:
                    continue
                reset_to, q.reset_to = q.reset_to, None
                if reset_to is not None:
                    q.msgs.clear()
                    q.inflight = []
                pause = len(q.msgs) >= MAX_QUEUED
                resume = q.paused and len(q.msgs) <= MAX_QUEUED // 2
            tp = TopicPartition(q.tp[0], q.tp[1])
            with contextlib.suppress(KafkaException, RuntimeError):
                q.high = consumer.get_watermark_offsets(tp, cached=True)[1]
            try:
                if reset_to is not None:
                    consumer.seek(TopicPartition(q.tp[0], q.tp[1], reset_to))
                    log.info("%s rewound to committed offset %d", q.where, reset_to)
                if pause and not q.paused:
                    consumer.pause([tp])
                    q.paused = True
                elif resume:
                    consumer.resume([tp])
                    q.paused = False
            except KafkaException as exc:
                log.warning("%s: flow control: %s", q.where, exc.args[0].str())
                if reset_to is not None:
                    with q.cv:
                        q.reset_to = reset_to  # try again on the next round

    # -- rebalance callbacks (poll thread, inside consume()) --------------------------------
    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        added = []
        with self._registry:
            for tp in partitions:
                key = (tp.topic, tp.partition)
                if key in self._queues:
                    continue
                lock = self._consume_locks.setdefault(key, threading.Lock())
                q = _Queue(key, lock)
                q.revoking = self._stopping.is_set()  # assigned while shutting down: idle
                q.thread = threading.Thread(target=self._work, args=(q,), daemon=True,
                                            name=f"rmq-orderly-{tp.topic}[{tp.partition}]")
                self._queues[key] = q
                added.append(q)
            self._workers = [t for t in self._workers if t.is_alive()]
            self._workers.extend(q.thread for q in added if q.thread is not None)
        for q in added:
            q.thread.start()  # type: ignore[union-attr]
        if added:
            log.info("orderly consumer %s assigned %s", self.client_id,
                     [q.where for q in added])
            self._wake_locks.set()

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        self._release(self._take(partitions), lost=False)

    def _on_lost(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        self._release(self._take(partitions), lost=True)

    def _take(self, partitions: list) -> list[_Queue]:
        with self._registry:
            return [q for tp in partitions
                    if (q := self._queues.get((tp.topic, tp.partition))) is not None]

    def _release(self, queues: list[_Queue], lost: bool) -> None:
        """Revocation: finish the in-flight batch, commit, then unlock (finally). A lost
        partition is dropped at once and never committed (someone else may own it)."""
        if not queues:
            return
        for q in queues:
            with q.cv:
                q.revoking = True
                q.lost = q.lost or lost
                q.cv.notify_all()
        finished: list[_Queue] = []
        try:
            for q in queues:
                if lost:
                    self._drop(q)
                    continue
                with q.cv:
                    wait = min(REVOKE_WAIT_CAP_S, max(0.0, q.deadline - time.monotonic()))
                if self._await_batch(q, wait):
                    try:
                        self._commit_pending(q, retry_for=COMMIT_RETRY_FOR_S)
                        finished.append(q)
                    finally:
                        self._drop(q)
                        q.consume_lock.release()
                else:
                    self._drop(q)
                    log.warning("%s: batch still in the listener at revocation; not "
                                "unlocking (the lease will lapse)", q.where)
        finally:
            # Also queues whose first grant is still in flight: unlock is by client id.
            if finished:
                self._unlock(finished)
            log.info("orderly consumer %s %s %s", self.client_id,
                     "lost" if lost else "released", [q.where for q in queues])

    def _await_batch(self, q: _Queue, wait: float) -> bool:
        """Acquire ``q.consume_lock`` within ``wait`` s. On the poll thread, keep running the
        workers' consumer calls meanwhile: the in-flight batch needs them to commit."""
        deadline = time.monotonic() + wait
        on_poll_thread = threading.current_thread() is self._poll_thread
        consumer = self._consumer
        while True:
            if q.consume_lock.acquire(timeout=0.005 if on_poll_thread else wait):
                return True
            if on_poll_thread and consumer is not None:
                self._run_commands(consumer)
            if not on_poll_thread or time.monotonic() >= deadline:
                return False

    def _drop(self, q: _Queue) -> None:
        with q.cv:
            q.dropped = True
            q.msgs.clear()
            q.cv.notify_all()
        with self._registry:
            if self._queues.get(q.tp) is q:
                del self._queues[q.tp]

    def _unlock(self, queues: list[_Queue]) -> None:
        epochs = {q.tp: q.epoch for q in queues if q.granted}
        # The lock thread holds this for at most one lock round trip.
        if not self._lock_calls.acquire(timeout=LOCK_TIMEOUT_S + 1):
            log.warning("orderly consumer %s: lock thread busy; not unlocking %s (the leases "
                        "will lapse)", self.client_id, [q.where for q in queues])
            return
        try:
            self._lock_client.unlock(self.group, [q.tp for q in queues], epochs=epochs,
                                     timeout=LOCK_TIMEOUT_S)
        except RmqError as exc:
            log.warning("orderly consumer %s: unlock failed (%s); the leases will lapse",
                        self.client_id, exc)
        finally:
            self._lock_calls.release()

    # -- lock thread -----------------------------------------------------------------------
    def _lock_loop(self) -> None:
        next_renew = 0.0
        lease_s = self.lock_lease_ms / 1000
        timeout = min(LOCK_TIMEOUT_S, self.lock_renew_ms / 1000)
        while not self._lock_stop.is_set():
            self._wake_locks.clear()  # before the snapshot: a later assignment wakes us
            now = time.monotonic()
            renew_all = now >= next_renew
            due: list[_Queue] = []
            grants: dict = {}
            # Held by an unlock on revocation for at most one round trip.
            if self._lock_calls.acquire(timeout=LOCK_TIMEOUT_S + 1):
                try:
                    with self._registry:
                        queues = [q for q in self._queues.values() if not q.revoking]
                    due = [q for q in queues if renew_all or not q.lease_ok(now)]
                    if due:
                        grants = self._lock_client.lock(self.group, [q.tp for q in due],
                                                        self.lock_lease_ms, timeout=timeout)
                except RmqError as exc:
                    log.warning("orderly consumer %s: lock request failed: %s", self.client_id,
                                exc)
                finally:
                    self._lock_calls.release()
            if renew_all:
                # A round that went unanswered (coordinator down or taking over) is retried
                # soon, not a renew interval later: the lease keeps running meanwhile.
                answered = all((g := grants.get(q.tp)) is not None and (g.granted or g.epoch >= 0)
                               for q in due)
                next_renew = now + (self.lock_renew_ms / 1000 if answered else LOCK_RETRY_S)
            for q in due:
                self._apply_grant(q, grants.get(q.tp))
            with self._registry:
                unheld = any(not q.lease_ok(time.monotonic()) for q in self._queues.values())
            wait = max(0.0, next_renew - time.monotonic())
            if unheld:
                wait = min(wait, LOCK_RETRY_S)
            self._wake_locks.wait(min(wait, lease_s))

    def _apply_grant(self, q: _Queue, grant: Any) -> None:
        new_epoch = None
        with q.cv:
            if q.dropped or q.revoking:
                return
            if grant is not None and grant.granted:
                if grant.epoch != q.epoch or not q.granted:
                    new_epoch = grant.epoch
                    if grant.epoch != q.epoch:
                        q.ready_epoch = -1
                q.epoch, q.granted, q.deadline = grant.epoch, True, grant.expires
            elif grant is not None and grant.epoch >= 0:
                # Denied: someone else holds it (or our lease lapsed and it was taken over).
                if q.granted:
                    log.warning("%s: lock lost (now held with epoch %d)", q.where, grant.epoch,
                                extra=_event("lock_lost", topic=q.tp[0], partition=q.tp[1],
                                             epoch=q.epoch))
                q.granted = False
                q.deadline = 0.0
            q.cv.notify_all()
        if new_epoch is not None:
            log.info("%s locked by %s with epoch %d", q.where, self.client_id, new_epoch,
                     extra=_event("lock_granted", topic=q.tp[0], partition=q.tp[1],
                                  epoch=new_epoch))
            if q.ready_epoch != new_epoch:
                self._align(q, new_epoch)

    def _align(self, q: _Queue, epoch: int) -> None:
        """After a new grant: resume exactly at the committed offset (the previous holder
        may have committed past what we fetched, or we may hold work it redid)."""
        try:
            [tp] = self._submit(
                lambda c: c.committed([TopicPartition(*q.tp)], timeout=COMMIT_TIMEOUT_S),
                f"reading the committed offset of {q.where}")
        except (RmqError, KafkaException, RuntimeError, ValueError) as exc:
            log.warning("%s: reading the committed offset failed (%s); retrying", q.where, exc)
            with q.cv:
                q.granted = False  # asked for again on the next lock round
            return
        committed = tp.offset
        with q.cv:
            if q.dropped or q.epoch != epoch:
                return
            if committed >= 0:
                q.inflight = [m for m in q.inflight if m.offset >= committed]
                while q.msgs and q.msgs[0].offset < committed:
                    q.msgs.popleft()
                if 0 <= committed < max(q.committed, q.released):
                    # Moved back behind what this queue already let go of: re-read from it.
                    q.reset_to = committed
                    q.msgs.clear()
                    q.inflight = []
                if q.pending_commit is not None and q.pending_commit <= committed:
                    q.pending_commit = None
                q.min_offset = committed
            q.committed = q.released = committed
            q.ready_epoch = epoch
            q.cv.notify_all()

    # -- per-partition worker ---------------------------------------------------------------
    def _work(self, q: _Queue) -> None:
        while True:
            with q.cv:
                while True:
                    if q.dropped:
                        return
                    now = time.monotonic()
                    if q.runnable(now):
                        break
                    wait = WAIT_SLICE_S
                    if now < q.suspended_until:
                        wait = min(wait, q.suspended_until - now)
                    q.cv.wait(wait)
            # Held by revocation, or by a previous assignment's batch still in the listener.
            if not q.consume_lock.acquire(timeout=WAIT_SLICE_S):
                continue
            try:
                self._consume_once(q)
            except Exception:  # a bug in one queue must not kill its thread silently
                log.exception("%s: orderly worker error", q.where)
                with q.cv:
                    q.suspended_until = time.monotonic() + DEFAULT_SUSPEND_MS / 1000
            finally:
                q.consume_lock.release()

    def _consume_once(self, q: _Queue) -> None:
        with q.cv:
            if q.dropped or not q.runnable(time.monotonic()):
                return
            epoch = q.epoch
            if not q.inflight:
                for _ in range(min(self.batch_size, len(q.msgs))):
                    q.inflight.append(q.msgs.popleft())
            # Messages are built with reconsume_times 0: copy only for a redelivery.
            batch = list(q.inflight) if not q.reconsume_times else [
                dataclasses.replace(m, reconsume_times=q.reconsume_times) for m in q.inflight]
        context = ConsumeOrderlyContext(q.tp[0], q.tp[1], epoch)
        status = self._call_listener(batch, context)
        if status is ConsumeOrderlyStatus.SUCCESS:
            self._processed(q, batch[-1].offset + 1, epoch)
            return
        if 0 <= self.max_reconsume_times <= q.reconsume_times:
            if self._send_to_dlq(q, batch, epoch):
                self._processed(q, batch[-1].offset + 1, epoch)
                return
        else:
            with q.cv:
                q.reconsume_times += 1
        with q.cv:
            q.suspended_until = time.monotonic() + context.suspend_ms / 1000

    def _call_listener(self, batch: list[OrderlyMessage],
                       context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        try:
            status = self._listener(batch, context)
        except Exception as exc:
            log.warning("%s: listener raised %r; suspending the queue for %d ms",
                        batch[0].where, exc, context.suspend_ms)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        if not isinstance(status, ConsumeOrderlyStatus):
            log.warning("%s: listener returned %r, not a ConsumeOrderlyStatus; suspending",
                        batch[0].where, status)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return status

    def _processed(self, q: _Queue, offset: int, epoch: int) -> None:
        """The batch up to ``offset`` is done: the worker goes on with the next one while the
        poll thread commits (see _flush_commits), like RocketMQ's offset store does."""
        reason = self._may_commit(q, epoch)  # checked here, and again before the commit
        if reason is not None:
            self._skip_commit(q, offset, epoch, reason)  # the batch stays in flight
            return
        with q.cv:
            q.inflight = []
            q.reconsume_times = 0
            q.pending_commit = offset
            q.pending_epoch = epoch
            q.released = offset

    def _flush_commits(self, consumer: confluent_kafka.Consumer) -> None:
        """Poll thread: send every queue's processed offset in one asynchronous commit, each
        checked against its lock right before (a lapsed or lost lock drops it: the holder
        redoes the batch). The outcome comes back in _on_commit; a refused commit stays
        pending and is sent again on a later round."""
        if time.monotonic() < self._commit_retry_at:
            return
        with self._registry:
            queues = list(self._queues.values())
        batch: list[tuple[_Queue, int, int]] = []
        for q in queues:
            with q.cv:
                if q.dropped or q.pending_commit is None or q.pending_commit == q.commit_sent:
                    continue
                offset, epoch = q.pending_commit, q.pending_epoch
            reason = self._may_commit(q, epoch)
            if reason is not None:
                self._skip_commit(q, offset, epoch, reason)
            else:
                batch.append((q, offset, epoch))
        if not batch:
            return
        tps = [TopicPartition(q.tp[0], q.tp[1], offset, metadata=f"{self.client_id}:{epoch}")
               for q, offset, epoch in batch]
        try:
            consumer.commit(offsets=tps, asynchronous=True)
        except KafkaException as exc:
            log.warning("orderly consumer %s: commit not sent (%s); retrying", self.client_id,
                        exc.args[0].str())
            self._commit_retry_at = time.monotonic() + WAIT_SLICE_S
            return
        for q, offset, _epoch in batch:
            with q.cv:
                q.commit_sent = offset

    def _on_commit(self, err: KafkaError | None, partitions: list) -> None:
        """librdkafka's commit outcome (poll thread, inside consume()); then the caller's own
        ``on_commit``, if its conf had one."""
        user_callback = self._conf.get("on_commit")
        if user_callback is not None:
            try:
                user_callback(err, partitions)
            except Exception:  # the caller's bug must not stop our bookkeeping
                log.exception("orderly consumer %s: on_commit callback raised", self.client_id)
        with self._registry:
            queues = {tp: self._queues.get((tp.topic, tp.partition)) for tp in partitions}
        for tp, q in queues.items():
            error = tp.error or err
            if q is None:
                continue
            if error is None:
                self._committed(q, tp.offset, _epoch_of(tp.metadata))
                continue
            with q.cv:
                if q.commit_sent == tp.offset:
                    q.commit_sent = -1  # send it again
            # Refused while the group rebalances: expected, and retried.
            level = logging.INFO if error.code() in REBALANCE_CODES else logging.WARNING
            log.log(level, "commit %s@%d failed (%s); retrying", q.where, tp.offset,
                    error.str())
            self._commit_retry_at = time.monotonic() + WAIT_SLICE_S

    def _skip_commit(self, q: _Queue, offset: int, epoch: int, reason: str) -> None:
        log.warning("not committing %s@%d: %s (epoch %d); the holder will redo the batch",
                    q.where, offset, reason, epoch,
                    extra=_event("commit_skipped", topic=q.tp[0], partition=q.tp[1],
                                 offset=offset, epoch=epoch, reason=reason))
        with q.cv:
            if q.pending_commit == offset:
                q.pending_commit = None

    def _committed(self, q: _Queue, offset: int, epoch: int) -> None:
        with q.cv:
            if q.pending_commit == offset:
                q.pending_commit = None
            q.committed = max(q.committed, offset)
        log.debug("committed %s@%d epoch=%d", q.where, offset, epoch,
                  extra=_event("committed", topic=q.tp[0], partition=q.tp[1], offset=offset,
                               epoch=epoch))

    def _may_commit(self, q: _Queue, epoch: int) -> str | None:
        """None when the batch started under ``epoch`` may be committed; else why not."""
        with q.cv:
            if q.lost:
                return "partition lost"
            if q.epoch != epoch or not q.granted:
                return "lock lost"
            if time.monotonic() >= q.deadline:
                return "lease lapsed"
        return None

    def _commit(self, q: _Queue, offset: int, epoch: int) -> bool:
        """Commit ``offset`` synchronously now (revocation, shutdown) if the lock of
        ``epoch`` still holds; a refused commit stays pending."""
        reason = self._may_commit(q, epoch)
        if reason is not None:
            self._skip_commit(q, offset, epoch, reason)
            return False
        where = f"{q.where}@{offset}"
        tp = TopicPartition(q.tp[0], q.tp[1], offset, metadata=f"{self.client_id}:{epoch}")

        def commit(consumer: confluent_kafka.Consumer) -> None:
            result = consumer.commit(offsets=[tp], asynchronous=False)
            err = next((r.error for r in result or [] if r.error is not None), None)
            if err is not None:
                raise KafkaException(err)

        try:
            self._submit(commit, f"committing {where}")
        except (RmqError, KafkaException, RuntimeError) as exc:
            detail = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            code = exc.args[0].code() if isinstance(exc, KafkaException) else None
            # Refused while the group rebalances: expected, and retried.
            level = logging.INFO if code in REBALANCE_CODES else logging.WARNING
            log.log(level, "commit %s failed (%s); retrying", where, detail)
            return False
        self._committed(q, offset, epoch)
        return True

    def _commit_pending(self, q: _Queue, retry_for: float = 0.0) -> None:
        """Commit a processed batch whose commit was refused; retry for ``retry_for`` s
        (only while the lock holds: a lost lock clears the pending commit)."""
        with contextlib.suppress(CommitRefusedError):
            for attempt in retrying(retry_for):
                with attempt:
                    with q.cv:
                        pending, epoch = q.pending_commit, q.pending_epoch
                    if pending is not None and not self._commit(q, pending, epoch):
                        with q.cv:
                            if q.pending_commit is not None:
                                raise CommitRefusedError(f"commit of {q.where}@{pending} "
                                                         "refused")

    # -- dead letters ----------------------------------------------------------------------
    def _dlq_send(self, topic: str, batch: list[OrderlyMessage]) -> None:
        if not self._dlq_ready:
            ensure_topics(self._conf, {topic: (1, {})})
            self._dlq_ready = True
        if self._dlq_producer is None:
            self._dlq_producer = confluent_kafka.Producer(
                producer_defaults(self._conf, internal=True))
        producer = self._dlq_producer
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(err)

        for m in batch:
            headers = [*m.headers,
                       (DLQ_ORIGINAL_TOPIC, m.topic.encode()),
                       (DLQ_ORIGINAL_PARTITION, str(m.partition).encode()),
                       (DLQ_ORIGINAL_OFFSET, str(m.offset).encode()),
                       (DLQ_RECONSUME_TIMES, str(m.reconsume_times).encode())]
            producer.produce(topic, m.value, key=m.key, headers=headers,
                             on_delivery=on_delivery)
        left = producer.flush(DLQ_TIMEOUT_S)
        if left or errors:
            detail = errors[0].str() if errors else f"{left} not delivered in time"
            raise KafkaOperationError(f"dead-lettering to {topic}: {detail}",
                                      errors[0] if errors else None)

    def _send_to_dlq(self, q: _Queue, batch: list[OrderlyMessage], epoch: int) -> bool:
        reason = self._may_commit(q, epoch)
        if reason is not None:
            log.warning("%s: not dead-lettering: %s", batch[0].where, reason)
            return False
        topic = self.topics.dlq(self.group)
        try:
            # One producer for every worker; another's flush holds it at most DLQ_TIMEOUT_S.
            if not self._dlq_lock.acquire(timeout=DLQ_TIMEOUT_S):
                raise RmqTimeoutError(f"another queue is dead-lettering to {topic}")
            try:
                self._dlq_send(topic, batch)
            finally:
                self._dlq_lock.release()
        except (RmqError, KafkaException, BufferError) as exc:
            log.warning("%s: could not dead-letter (%s); will retry", batch[0].where, exc)
            return False
        for m in batch:
            log.warning("%s sent to %s after %d reconsumes", m.where, topic, m.reconsume_times,
                        extra=_event("dlq", topic=m.topic, partition=m.partition,
                                     offset=m.offset, epoch=epoch))
        return True
