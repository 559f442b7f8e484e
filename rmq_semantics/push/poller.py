"""The concurrent consumer's poll thread: it owns the Kafka consumer and the transactional
producer, turns records into listener calls, holds retry partitions until their head is
due, and writes retry copies, dead letters and offsets in one transaction per round.

A FIFO record (one with a message group) goes to its partition's engine instead of a call of
its own; each round hands out the heads of its groups that are due (retried in place, never
copied to a retry topic).

It never sleeps: a held retry partition is paused (and sought back to its head) with a
due time the loop checks on every round; back-pressure pauses the other partitions.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition

from rmq_semantics.clientconf import new_client
from rmq_semantics.consumed import headers_of, offset_of, partition_of, topic_of
from rmq_semantics.orderly.runtime import COMMIT_TIMEOUT_S, event
from rmq_semantics.push.api import PushMessage
from rmq_semantics.push.fifo_hold import ReplayHold, fifo_revoke_wait_s, wait_at_revocation
from rmq_semantics.push.ledger import Batch, Ledger, Part
from rmq_semantics.push.pool import ListenerPool
from rmq_semantics.push.positions import (
    UnreadOffsets,
    adopt,
    assign,
    pause_full_engines,
    rewind,
)
from rmq_semantics.push.retry import born_of, read_retry
from rmq_semantics.push.txn import TXN_TIMEOUT_S, PushProducer, Renewed
from rmq_semantics.simple.engine import message_group_of
from rmq_semantics.tags import TagFilter
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, SystemPartitionFilter

__all__ = ["PollLoop", "PollSettings"]

log = logging.getLogger(__name__)

POLL_WAIT_S = 0.05  # one consume() wait: how late a due retry head or a stop is noticed
COMMIT_INTERVAL_S = 0.1  # one transaction per interval at most, for copies and offsets
FETCH_MAX = 500  # records per consume() call
# How long a full backlog waits for room before the partitions are paused: short against
# max.poll.interval.ms, and a due retry head or a timeout is noticed at most this late.
BACKLOG_WAIT_S = 0.5
# A transactional call still running this long ignored its own TXN_TIMEOUT_S: it is
# abandoned and the producer re-created (librdkafka #5456, #5511; campaign seed 2).
WEDGED_AFTER_S = TXN_TIMEOUT_S + 15.0
# The broker aborts a dead instance's open transaction after this: until then the retry
# partitions it wrote to stop at it (read_committed) and its offsets read as unstable.
TRANSACTION_TIMEOUT_MS = 10000
# Reading the committed offsets waits out such a transaction (KIP-447's stable offsets).
COMMITTED_TIMEOUT_S = TRANSACTION_TIMEOUT_MS / 1000 + 20
# After an exception in a round the loop waits this long, doubling while they repeat.
POLL_ERROR_BACKOFF_MIN_S = 0.1
POLL_ERROR_BACKOFF_MAX_S = 5.0
# A FIFO record's lease outlives its call's consume_timeout_ms by this much, so the pool's
# timeout settles the call first (retry after the FIFO interval); the lease is the backstop.
FIFO_LEASE_SLACK_MS = 5000
TP = tuple[str, int]


@dataclass(frozen=True)
class PollSettings:
    consumer_conf: dict
    producer_conf: dict
    topics: list[str]
    retry_levels: dict[str, int]  # retry topic -> its delay level
    delay_levels: tuple[float, ...]
    tags: TagFilter
    batch_size: int
    backlog: int  # listener calls queued or running before the partitions are paused
    max_reconsume_times: int
    consume_timeout_ms: int
    drain_timeout_s: float


def _now_ms() -> int:
    return int(time.time() * 1000)


class PollLoop:
    """Run by the poll thread: :meth:`run` until ``stopping`` is set, then drains."""

    def __init__(
        self,
        settings: PollSettings,
        ledger: Ledger,
        pool: ListenerPool,
        stopping: threading.Event,
        name: str,
        system: SystemPartitionFilter | None = None,
    ) -> None:
        self.s = settings
        self.system = system or SystemPartitionFilter(DEFAULT_TOPIC_PREFIX, name)
        self.ledger = ledger
        self.pool = pool
        self.stopping = stopping
        self.name = name
        self.consumer: confluent_kafka.Consumer | None = None
        self.txn: PushProducer | None = None
        self.started = threading.Event()
        self.error: BaseException | None = None
        self._held: dict[TP, int] = {}  # retry partitions paused until the due ms
        # Assigned, paused, their committed offsets not read yet (the read failed).
        self._unread = UnreadOffsets(name, COMMITTED_TIMEOUT_S)
        self._bp_paused: set[TP] = set()
        self._full: set[TP] = set()  # FIFO partitions paused: their tracker is at its bound
        self._last_commit = 0.0
        # Where a replayed partition without a commit starts again: its first record read.
        self._replay_from: dict[TP, int] = {}
        self._replay_waiting = ReplayHold(ledger)  # replayed, paused while FIFO calls run
        self._revoke_wait_s = fifo_revoke_wait_s(settings.consumer_conf)

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._open()
            self.started.set()
            delay = POLL_ERROR_BACKOFF_MIN_S
            while not self.stopping.is_set():
                try:
                    self._round()
                    delay = POLL_ERROR_BACKOFF_MIN_S
                except Exception as exc:  # anything but a fatal error: go on
                    if isinstance(exc, KafkaException) and exc.args[0].fatal():
                        raise  # the consumer is unusable: end, for shutdown() to report
                    count = self.ledger.count("poll_errors")
                    log.exception(
                        "push consumer %s: error in the poll loop (#%d); going on in %.1f s",
                        self.name,
                        count,
                        delay,
                    )
                    rewind(self.consumer, self.ledger, self.s.consumer_conf, self.name)
                    self.stopping.wait(delay)
                    delay = min(POLL_ERROR_BACKOFF_MAX_S, delay * 2)
            self._drain()
        except BaseException as exc:  # the thread's end: kept for shutdown() to report
            self.error = exc
            log.exception("push consumer %s stopped on an error", self.name)
        finally:
            self.started.set()
            self._close()

    def _open(self) -> None:
        self.txn = PushProducer(
            lambda: new_client(
                confluent_kafka.Producer, self.s.producer_conf, "PushConsumer producer"
            ),
            self.name,
        )
        self.txn.init(WEDGED_AFTER_S)
        self.consumer = new_client(confluent_kafka.Consumer, self.s.consumer_conf, "PushConsumer")
        self.consumer.subscribe(
            [*self.s.topics, *self.s.retry_levels],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _round(self) -> None:
        consumer = self.consumer
        assert consumer is not None
        now = time.monotonic()
        for batch in self.ledger.expired(now):
            self.pool.expire(batch)
        if ended := self._replay_waiting.released():
            self._unread.again(ended)
        self._read_unassigned(consumer)
        self._resume_due()
        self._back_pressure(consumer)
        records = consumer.consume(FETCH_MAX, POLL_WAIT_S)
        if records:
            self._dispatch(consumer, records)
        self._deliver_fifo(consumer)
        if time.monotonic() - self._last_commit >= COMMIT_INTERVAL_S:
            self._commit()

    def _drain(self) -> None:
        """Stop: take nothing new, let running calls end (bounded), commit what is done."""
        consumer = self.consumer
        assert consumer is not None
        assignment = consumer.assignment()
        if assignment:
            consumer.pause(assignment)
        deadline = time.monotonic() + self.s.drain_timeout_s
        while self.ledger.in_flight and time.monotonic() < deadline:
            consumer.consume(FETCH_MAX, POLL_WAIT_S)  # serves callbacks; all paused
        self._commit()

    def _close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close()  # on_revoke commits what is left
            except (KafkaException, RuntimeError) as exc:
                log.warning("push consumer %s: closing the consumer: %s", self.name, exc)
            self.consumer = None
        if self.txn is not None:
            self.txn.close(COMMIT_TIMEOUT_S)
            self.txn = None

    # -- rebalance ---------------------------------------------------------------------------
    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        partitions = self.system.keep(partitions)
        if not partitions:
            consumer.incremental_assign([])  # else the client assigns the left-out ones
            return
        try:
            committed = consumer.committed(partitions, timeout=COMMITTED_TIMEOUT_S)
        except KafkaException as exc:
            # Ours now, but without their offsets: assigned paused, adopted by a later round
            # (_read_unassigned). Raising here would end the poll thread.
            consumer.incremental_assign(partitions)
            consumer.pause(partitions)
            self._unread.add(partitions, exc, self.ledger.count("poll_errors"))
            return
        assign(consumer, adopt(committed, self.ledger, self.s.retry_levels, self.name))

    def _read_unassigned(self, consumer: confluent_kafka.Consumer, force: bool = False) -> None:
        """Adopt the partitions assigned while their committed offsets could not be read:
        read them again (when due), seek to them and resume."""
        if not self._unread.due(force):
            return
        try:
            committed = self._unread.read(consumer)
        except KafkaException as exc:
            self._unread.failed(exc, self.ledger.count("poll_errors"))
            return
        for tp in adopt(committed, self.ledger, self.s.retry_levels, self.name, self._replay_from):
            # Paused since assigned, so nothing was fetched: only a known start needs a seek
            # (else librdkafka's auto.offset.reset start stands).
            if tp.offset >= 0 or tp.offset == confluent_kafka.OFFSET_BEGINNING:
                consumer.seek(tp)
        consumer.resume([tp for tp in committed if (tp.topic, tp.partition) not in self._bp_paused])

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        if not self.stopping.is_set():  # else _drain waited already
            wait_at_revocation(
                self.ledger, lambda b: self.pool.expire(b), revoked, self._revoke_wait_s, self.name
            )
        self._commit()  # what is done of them is committed before another owner starts
        self._forget(consumer, partitions)

    def _on_lost(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        self._forget(consumer, partitions)  # someone else may own them: no commit

    def _forget(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        partitions = self.system.release(partitions)
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self.ledger.revoke(key)
            self._held.pop(key, None)
            self._bp_paused.discard(key)
            self._full.discard(key)
            self._unread.discard(key)
            self._replay_from.pop(key, None)
            self._replay_waiting.discard(key)
        # Even an empty one: without a call the client unassigns the left-out ones too,
        # which it refuses (they are not in the assignment).
        consumer.incremental_unassign(partitions)

    # -- pausing -----------------------------------------------------------------------------
    def _resume_due(self) -> None:
        if not self._held:
            return
        now = _now_ms()
        due = [tp for tp, at in self._held.items() if at <= now]
        for tp in due:
            del self._held[tp]
        if due and self.consumer is not None:
            self.consumer.resume([TopicPartition(*tp) for tp in due if tp not in self._bp_paused])

    def _back_pressure(self, consumer: confluent_kafka.Consumer) -> None:
        busy = self.ledger.in_flight
        if busy >= self.s.backlog and not self._bp_paused:
            # pause() drops librdkafka's prefetched records and resume() fetches them again,
            # once per backlog a fast listener's throughput lost (docs/design/measurements.md).
            # So wait for room first, and pause only for a slow listener.
            if self.ledger.wait_for_room(self.s.backlog, BACKLOG_WAIT_S):
                return
            self._bp_paused = {(tp.topic, tp.partition) for tp in consumer.assignment()}
            if self._bp_paused:
                consumer.pause([TopicPartition(*tp) for tp in self._bp_paused])
        elif busy < self.s.backlog // 2 and self._bp_paused:
            resume = [
                TopicPartition(*tp)
                for tp in self._bp_paused
                if tp not in self._held
                and tp not in self._unread
                and tp not in self._full
                and tp not in self._replay_waiting
            ]
            self._bp_paused = set()
            if resume:
                consumer.resume(resume)

    def _hold(self, consumer: confluent_kafka.Consumer, tp: TP, offset: int, due_ms: int) -> None:
        """Pause retry partition ``tp`` with its head at ``offset`` until ``due_ms``."""
        part = TopicPartition(tp[0], tp[1], offset)
        consumer.pause([part])
        consumer.seek(part)
        self._held[tp] = due_ms

    # -- records -----------------------------------------------------------------------------
    def _dispatch(self, consumer: confluent_kafka.Consumer, records: list) -> None:
        pending: dict[TP, Batch] = {}
        deadline = time.monotonic() + self.s.consume_timeout_ms / 1000
        now_ms = _now_ms()
        for record in records:
            if record.error() is not None:
                log.warning("push consumer %s: %s", self.name, record.error())
                continue
            tp = (record.topic(), record.partition())
            part = self.ledger.part(tp)
            if part is None or tp in self._held:
                continue  # revoked, or held: records after a held head come again later
            message, first_failure = self._message(record, part, now_ms)
            if message is None:
                self._hold(consumer, tp, record.offset(), first_failure or now_ms)
                continue
            if not part.level and not self.s.tags.matches(message.headers):
                if self.ledger.take(part, record.offset()):  # else done before a restart
                    self.ledger.skip(part, record.offset())
                continue
            if part.engine is not None and message_group_of(message.headers):
                self.ledger.offer(part, record.offset(), message, now_ms)
                continue  # FIFO: handed out by _deliver_fifo, its group's head only
            if not self.ledger.take(part, record.offset()):
                continue  # done before a restart (the restored commit says so)
            batch = pending.get(tp)
            if batch is None:
                batch = pending[tp] = Batch(part, [], [], [], deadline)
            batch.msgs.append(message)
            batch.offsets.append(record.offset())
            batch.first_failures.append(first_failure)
            if len(batch.msgs) >= self.s.batch_size:
                self.pool.submit(pending.pop(tp))
        for batch in pending.values():
            self.pool.submit(batch)

    def _deliver_fifo(self, consumer: confluent_kafka.Consumer) -> None:
        """Hand the FIFO records due now to the pool (one per call, as many as the backlog
        has room for); pause the partitions whose engines are full."""
        deadline = time.monotonic() + self.s.consume_timeout_ms / 1000
        room = self.s.backlog - self.ledger.in_flight
        invisible_ms = self.s.consume_timeout_ms + FIFO_LEASE_SLACK_MS
        for part, delivery in self.ledger.deliver(room, _now_ms(), invisible_ms):
            message = replace(delivery.record, reconsume_times=delivery.delivery_attempt - 1)
            offsets = [delivery.receipt.offset]
            self.pool.submit(
                Batch(part, [message], offsets, [None], deadline, receipt=delivery.receipt)
            )
        pause_full_engines(consumer, self.ledger, self._full, self._bp_paused | self._unread.tps)

    def _message(
        self, record: confluent_kafka.Message, part: Part, now_ms: int
    ) -> tuple[PushMessage | None, int | None]:
        """The listener's view of ``record`` and its first failure time; (None, due ms)
        for a retry record not due yet."""
        headers = tuple((k, v if v is not None else b"") for k, v in headers_of(record))
        born = record.timestamp()[1]
        where = (topic_of(record), partition_of(record), offset_of(record))
        if not part.level:
            return PushMessage(
                *where,
                record.key(),
                record.value(),
                headers,
                born,
                born,
            ), None
        info = read_retry(
            list(headers),
            where=where,
            level_delay_ms=int(self.s.delay_levels[part.level - 1] * 1000),
            now_ms=now_ms,
            max_reconsume_times=self.s.max_reconsume_times,
        )
        if info.due_ms > now_ms:
            return None, info.due_ms  # read again once due: counted then, once
        if info.problems:
            self.ledger.counts["malformed"] += 1
            log.warning(
                "%s[%d]@%d: retry record with %s; delivering it repaired",
                *where,
                "; ".join(info.problems),
                extra=event(
                    "malformed_retry",
                    topic=where[0],
                    partition=where[1],
                    offset=where[2],
                    reason="; ".join(info.problems),
                ),
            )
        return PushMessage(
            info.topic,
            info.partition,
            info.offset,
            record.key(),
            record.value(),
            headers,
            born,
            born_of(headers, born),
            info.reconsume_times,
            record.topic(),
        ), info.first_failure_ms

    # -- transactions ------------------------------------------------------------------------
    def _commit(self) -> None:
        """Write the owed copies and commit the offsets, in one Kafka transaction."""
        self._last_commit = time.monotonic()
        consumer, txn = self.consumer, self.txn
        if consumer is None or txn is None:
            return
        copies, offsets = self.ledger.take_commit()
        if not copies and not offsets:
            return
        records = [rec for _part, recs in copies for rec in recs]
        positions = [
            TopicPartition(p.tp[0], p.tp[1], off, metadata=meta)
            for p, (off, meta) in offsets.items()
        ]
        try:
            metadata = consumer.consumer_group_metadata() if offsets else None
            txn.commit(records, positions, metadata, WEDGED_AFTER_S)
        except Renewed as exc:
            self._replay(consumer, str(exc))
            return
        except KafkaException as exc:
            log.warning(
                "push consumer %s: transaction failed (%s); retrying", self.name, exc.args[0]
            )
            self.ledger.put_back(copies)
            return
        self.ledger.committed(offsets)
        for rec in records:
            log.info(
                "%s sent to %s",
                rec.source,
                rec.topic,
                extra=event("retry_write", source=rec.source, topic=rec.topic),
            )

    def _replay(self, consumer: confluent_kafka.Consumer, why: str) -> None:
        """The producer was re-created: whether the failed transaction committed is unknown
        (the new epoch aborts it unless it had). So every partition goes back to its
        committed offset, read again (KIP-447 waits out the old transaction), as if just
        assigned: records after it are processed again, at least once."""
        parts = self.ledger.parts()
        log.warning(
            "push consumer %s: transactional producer re-created (#%d: %s); "
            "replaying %d partitions from their committed offsets",
            self.name,
            self.ledger.count("producer_renewals"),
            why,
            len(parts),
            extra=event("push_producer_renewed", reason=why),
        )
        for part in parts:
            self.ledger.revoke(part.tp)  # its calls still running are ignored, redone
            self._held.pop(part.tp, None)
            if part.first is not None:
                self._replay_from.setdefault(part.tp, part.first)
        if tps := [TopicPartition(*part.tp) for part in parts]:
            consumer.pause(tps)
            # One with a FIFO call running is read again once that call ended (fifo_hold.py).
            self._unread.again(self._replay_waiting.hold(tps))
