"""The poll thread: it owns the ``confluent_kafka.Consumer``.

Every consumer call of other threads reaches it through
:class:`~rmq_semantics.orderly.calls.ConsumerCalls`. Between polls the thread hands each
partition's messages to its queue, runs those calls, sends the commits and pauses the
partitions whose queue is full or whose queue lock is not held; on shutdown it drains.

The fast path (partition mode): when a fetch holds one partition's messages and no other
queue has work (nothing buffered or in flight, no batch in its listener), the poll thread
runs that queue's batches itself, for at most :data:`INLINE_BUDGET_S`, under the queue's
consume lock and with the worker's own code, instead of waking the worker: under one GIL
the hand-off (a wake-up and a thread switch per fetch) cost more than the batches. As soon
as a second queue has work, fetched messages go to the workers again. A listener call that
holds the poll thread past :data:`INLINE_SLOW_S` turns the fast path off for
:data:`INLINE_BACKOFF_S` (the poll thread must keep fetching, committing and running the
lock thread's consumer calls).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rmq_semantics.consumed import partition_of, topic_of
from rmq_semantics.orderly.calls import ConsumerCalls
from rmq_semantics.orderly.queue import QueuePhase
from rmq_semantics.orderly.runtime import POLL_WAIT_S, LiveQueue, QueueRegistry

if TYPE_CHECKING:
    from rmq_semantics.orderly.commits import Commits
    from rmq_semantics.orderly.rebalance import Rebalance

__all__ = [
    "DEFAULT_MAX_QUEUED_BYTES",
    "INLINE_BACKOFF_S",
    "INLINE_BUDGET_S",
    "INLINE_SLOW_S",
    "MAX_QUEUED",
    "PollThread",
    "flow_control",
]

log = logging.getLogger(__name__)

# RocketMQ's pullThresholdForQueue: a partition with this many unconsumed messages is
# paused, so a suspended queue never holds up the others. Higher than RocketMQ's 1000:
# pausing makes librdkafka drop what it prefetched for the partition, and at 1000 the
# pause/resume churn cut throughput by two thirds (10 MiB of 1 KiB messages per queue).
# A queue whose lock is not held (not granted yet, lapsed, leaving) is paused too, as
# RocketMQ pulls a queue only while locked: fetching it only filled the buffer up to here
# while the first lock was on its way, and the pause and refetch then cost a fetch round.
MAX_QUEUED = 10_000
#: RocketMQ's pullThresholdSizeForQueue: a partition whose buffered values reach this many
#: bytes is paused too (10,000 records of 1 MiB would otherwise be 10 GiB).
DEFAULT_MAX_QUEUED_BYTES = 100 * 1024 * 1024
POLL_BATCH = 500
# How often the partition ends (for status().lag) are read from librdkafka's cache; each
# turn of the poll loop (about a thousand a second at full speed) was too often.
WATERMARK_INTERVAL_S = 0.1
# Shutdown keeps polling at most this long for in-flight batches and refused commits.
DRAIN_CAP_S = 10.0
# The fast path (see above): the poll thread runs a lone queue's batches at most this long
# per fetch (checked between batches); a turn overrunning it by INLINE_SLOW_S (a slow
# listener call) hands every queue to its worker for INLINE_BACKOFF_S.
INLINE_BUDGET_S = 0.005
INLINE_SLOW_S = 0.05
INLINE_BACKOFF_S = 10.0


def flow_control(
    queued: int, queued_bytes: int, *, paused: bool, held: bool, max_queued_bytes: int
) -> tuple[bool, bool]:
    """(pause, resume) of a partition with ``queued`` records of ``queued_bytes`` buffered:
    pause when its lock is not held or either bound is reached; resume once held and both
    are at half (hysteresis, so a busy partition is not paused and resumed every poll)."""
    pause = not paused and (not held or queued >= MAX_QUEUED or queued_bytes >= max_queued_bytes)
    resume = paused and held and queued <= MAX_QUEUED // 2 and queued_bytes <= max_queued_bytes // 2
    return pause, resume


class PollThread:
    """The poll loop: dispatch, consumer calls, commits and flow control, then the drain."""

    def __init__(
        self,
        consumer: confluent_kafka.Consumer,
        topics: list[str],
        *,
        client_id: str,
        queues: QueueRegistry,
        calls: ConsumerCalls,
        commits: Commits,
        rebalance: Rebalance,
        stopping: threading.Event,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        inline: Callable[[LiveQueue, float], bool] | None = None,
    ) -> None:
        """``inline(q, until)``: run ``q``'s batches on this thread until ``until``, False
        when its worker holds it (:meth:`Worker.run_inline`); None: always hand over."""
        self.client_id = client_id
        self.max_queued_bytes = max_queued_bytes
        self._consumer = consumer
        self._topics = topics
        self._queues = queues
        self._calls = calls
        self._commits = commits
        self._rebalance = rebalance
        self._stopping = stopping
        self._next_watermarks = 0.0  # when _flow_control reads the partition ends again
        self._inline = inline
        # Subscribed to one topic by name: a run of the fetch is told by its partition alone
        # (topic() makes a new str each call). A "^" pattern may match several.
        self._one_topic = len(topics) == 1 and not topics[0].startswith("^")
        self._inline_off_until = 0.0  # the fast path is off until then (a slow listener)

    def run(self) -> None:
        consumer = self._consumer
        try:
            consumer.subscribe(
                self._topics,
                on_assign=self._rebalance.on_assign,
                on_revoke=self._rebalance.on_revoke,
                on_lost=self._rebalance.on_lost,
            )
            while not self._stopping.is_set():
                self.poll_once()
            self._drain()
        except Exception:  # a bug must not leave the queues running without a poller
            log.exception("orderly consumer %s: poll thread failed", self.client_id)
        finally:
            try:
                self._rebalance.release(self._queues.all(), lost=False)
            finally:
                self._calls.close()
                try:
                    consumer.close()
                except (KafkaException, RuntimeError) as exc:
                    log.warning(
                        "orderly consumer %s: closing the consumer: %s", self.client_id, exc
                    )

    def poll_once(self) -> None:
        consumer = self._consumer
        try:
            msgs = consumer.consume(POLL_BATCH, POLL_WAIT_S)
        except KafkaException as exc:
            log.warning("orderly consumer %s: %s", self.client_id, exc.args[0].str())
            self._stopping.wait(POLL_WAIT_S)
            return
        # The per-message work of the poll thread, the orderly consumer's critical path:
        # the split per partition (the workers make the listener's views, see QueueState).
        # A fetch hands over runs of one partition: the bucket is looked up once per run.
        by_partition: dict[tuple[str, int], list[confluent_kafka.Message]] = {}
        bucket: list[confluent_kafka.Message] = []
        topic: str | None = None
        partition = -1
        one_topic = self._one_topic
        for msg in msgs:
            if (err := msg.error()) is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("orderly consumer %s: %s", self.client_id, err.str())
                continue
            if msg.partition() != partition or (not one_topic and msg.topic() != topic):
                topic, partition = topic_of(msg), partition_of(msg)
                bucket = by_partition.setdefault((topic, partition), [])
            bucket.append(msg)
        if len(by_partition) == 1 and self._inline is not None:
            for tp, batch in by_partition.items():
                self._dispatch_one(tp, batch)
        else:
            for tp, batch in by_partition.items():
                self._dispatch(tp, batch)
        self._calls.run_pending(consumer)
        self._commits.flush(consumer)
        self._flow_control()

    def _dispatch(self, tp: tuple[str, int], msgs: list[confluent_kafka.Message]) -> None:
        """Queue one partition's fetched messages (in offset order) for its worker."""
        q = self._queues.get(tp)
        if q is None:
            return
        with q.cv:
            if q.state.add(msgs):
                q.cv.notify_all()

    def _dispatch_one(self, tp: tuple[str, int], msgs: list[confluent_kafka.Message]) -> None:
        """The only partition of a fetch: its batches run here when no other queue has
        work (the fast path), else its worker gets them."""
        q = self._queues.get(tp)
        if q is None or self._inline is None:
            return
        start = time.monotonic()
        if start < self._inline_off_until or not self._alone(q):
            self._dispatch(tp, msgs)
            return
        with q.cv:
            if not q.state.add(msgs):
                return
        until = start + INLINE_BUDGET_S
        ran = self._inline(q, until)
        if ran and time.monotonic() - until > INLINE_SLOW_S:
            self._inline_off_until = time.monotonic() + INLINE_BACKOFF_S
            log.info(
                "%s: a listener call held the poll thread; handing batches to the workers "
                "for %.0f s",
                q.where,
                INLINE_BACKOFF_S,
            )
        with q.cv:  # what is left (budget spent, suspended, not aligned yet) is the worker's
            if q.state.msgs or q.state.inflight:
                q.cv.notify_all()

    def _alone(self, q: LiveQueue) -> bool:
        """No queue but ``q`` has work: nothing buffered or in flight, no batch in its
        listener (read without the queues' locks: a stale answer only picks the slow path,
        or runs ``q`` here for one budget while another queue's worker starts)."""
        for other in self._queues.all():
            if other is q:
                continue
            st = other.state
            if st.msgs or st.inflight or other.consume_lock.locked():
                return False
        return True

    def _flow_control(self) -> None:
        consumer = self._consumer
        now = time.monotonic()
        watermarks = now >= self._next_watermarks
        if watermarks:
            self._next_watermarks = now + WATERMARK_INTERVAL_S
        for q in self._queues.all():
            st = q.state
            with q.cv:
                if st.gone:
                    continue
                reset_to = st.take_reset()
                held = st.phase is QueuePhase.ALIGNED and st.lease_ok(now)
                pause, resume = flow_control(
                    len(st.msgs),
                    st.queued_bytes,
                    paused=st.paused,
                    held=held,
                    max_queued_bytes=self.max_queued_bytes,
                )
            if not (watermarks or reset_to is not None or pause or resume):
                continue
            tp = TopicPartition(q.tp[0], q.tp[1])
            if watermarks:
                with contextlib.suppress(KafkaException, RuntimeError):
                    st.high = consumer.get_watermark_offsets(tp, cached=True)[1]
            try:
                if reset_to is not None:
                    consumer.seek(TopicPartition(q.tp[0], q.tp[1], reset_to))
                    log.info("%s rewound to committed offset %d", q.where, reset_to)
                if pause:
                    consumer.pause([tp])
                    st.paused = True
                elif resume:
                    consumer.resume([tp])
                    st.paused = False
            except KafkaException as exc:
                log.warning("%s: flow control: %s", q.where, exc.args[0].str())
                if reset_to is not None:
                    with q.cv:
                        st.reset_to = reset_to  # try again on the next round

    def _drain(self) -> None:
        """Shutdown: start no new batch, but keep polling until the in-flight batches and
        their commits are done. A commit is refused while a group rebalance is under way;
        polling lets the rebalance complete (bounded by the leases and DRAIN_CAP_S)."""
        queues = self._queues.all()
        deadline = time.monotonic()
        for q in queues:
            with q.cv:
                q.state.revoke()
                q.cv.notify_all()
                deadline = max(deadline, q.state.deadline)
        deadline = min(deadline, time.monotonic() + DRAIN_CAP_S)
        while time.monotonic() < deadline:
            busy = False
            for q in queues:
                with q.cv:
                    if q.state.gone:
                        continue
                    pending = q.state.pending_commit is not None
                if q.consume_lock.acquire(blocking=False):
                    try:
                        if pending:
                            self._commits.commit_pending(q)
                        with q.cv:
                            busy = busy or (q.state.pending_commit is not None and not q.state.gone)
                    finally:
                        q.consume_lock.release()
                else:
                    busy = True  # a batch is in the listener
            if not busy:
                return
            self.poll_once()
