"""The Kafka edge of the SimpleConsumer: engines per assigned partition, commits, dead letters.

One :class:`~.engine.PartitionEngine` per partition the group assigned, restored from the
committed offset and metadata (done records skipped, leases kept, so attempts and deadlines
outlive an instance); records read go into them; a batch is committed (offsets, done bitmap,
leases: one synchronous offset commit) before it is handed out; dead letters are sent to the
DLQ (idempotent, acks=all, waited for) before their record is done. ``ack_async``'s futures
wait in :attr:`Poller.acks` (:mod:`.acks`): each commit that lands resolves those it carried,
a revocation without one or a lost partition fails them. Used under the SimpleConsumer's lock;
the rebalance callbacks run inside its polls.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import Future
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition

from rmq_semantics.consumed import headers_of, offset_of, partition_of, topic_of
from rmq_semantics.errors import KafkaOperationError, RmqTimeoutError
from rmq_semantics.message import produce_headers
from rmq_semantics.records.dead_letter import dlq_headers
from rmq_semantics.records.headers import H
from rmq_semantics.settings import SimpleConsumerSettings
from rmq_semantics.simple.acks import AckWaiters, done_in_commit
from rmq_semantics.simple.engine import (
    MAX_OWNER_CHARS,
    DeadLetter,
    Delivery,
    PartitionEngine,
    message_group_of,
)
from rmq_semantics.tags import TagFilter
from rmq_semantics.topics import SystemPartitionFilter

__all__ = ["COUNTS", "FETCH_MAX", "Poller"]

log = logging.getLogger(__name__)

FETCH_MAX = 500
# How often a partition whose committed state could not be read is tried again.
UNREAD_RETRY_S = 1.0
#: The counters of ``SimpleConsumer.counts`` (docs/design/simple-consumer.md, Metrics).
COUNTS = (
    "received",
    "redelivered",
    "acked",
    "ack_refused",
    "invisible_changed",
    "dead",
    "skipped",
    "commit_failures",
    "malformed",
    "dlq_failures",
)

Part = tuple[str, int]


def group_text(group: bytes) -> str | None:
    """A message group's text, None when it is not UTF-8 (a malformed group)."""
    try:
        return group.decode("utf-8")
    except UnicodeDecodeError:
        return None


def now_ms() -> int:
    return int(time.time() * 1000)


class Poller:
    """The engines of one SimpleConsumer instance and their Kafka I/O (module docstring).
    ``filters`` is the consumer's topic -> tag filter map (shared: a subscribe changes it,
    then calls :meth:`filters_changed`); a key starting with ``^`` is a pattern."""

    def __init__(
        self,
        settings: SimpleConsumerSettings,
        *,
        group: str,
        client_id: str,
        dlq_topic: str,
        system: SystemPartitionFilter,
        filters: dict[str, TagFilter],
    ) -> None:
        self.s = settings
        self.group = group
        self.client_id = client_id
        self.dlq_topic = dlq_topic
        self._system = system
        self._filters = filters
        self._filter_of: dict[str, TagFilter | None] = {}  # per topic read, patterns resolved
        self.producer: confluent_kafka.Producer | None = None
        self.engines: dict[Part, PartitionEngine] = {}
        self._read_to: dict[Part, int] = {}  # the next offset each engine expects
        self._paused: set[Part] = set()
        self._unread: set[Part] = set()  # assigned, paused: committed state not read yet
        self._unread_retry_at = 0.0
        self._owed: dict[Part, list[DeadLetter]] = {}  # dead letters the DLQ has not taken yet
        self._last_commit = 0.0
        self.dirty = False  # acks since the last commit
        self.acks = AckWaiters()  # ack_async's futures, until a commit carries their ack
        self.counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
        # The commit metadata's owner in the tracker's "client:epoch" form (else a restore
        # warns that another library wrote it); no lock epochs here.
        self._owner = f"{client_id[:MAX_OWNER_CHARS]}:0"

    # -- rebalance (inside a poll, under the lock) ---------------------------------------------
    def on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        partitions = self._system.keep(partitions)
        if not partitions:
            consumer.incremental_assign([])  # else the client assigns the left-out ones
            return
        try:
            committed = consumer.committed(partitions, timeout=self.s.operation_timeout_s)
        except KafkaException as exc:
            # Ours now, but without their committed state: assigned paused (nothing fetched,
            # nothing handed out), adopted by a later poll. Raising would leave the group
            # half assigned.
            log.warning(
                "simple consumer %s: reading the committed offsets of %d partitions: %s "
                "(tried again at the next poll)",
                self.client_id,
                len(partitions),
                exc,
            )
            consumer.incremental_assign(partitions)
            consumer.pause(partitions)
            self._unread.update((tp.topic, tp.partition) for tp in partitions)
            return
        self._adopt(committed)
        consumer.incremental_assign(committed)
        # librdkafka keeps a partition's pause through its revocation and a later assignment
        # to this member: one paused when it was taken away would never be read again.
        consumer.resume(committed)

    def _adopt(self, committed: list) -> None:
        """Engines for the partitions of ``committed``, restored from their commits."""
        for tp in committed:
            part = (tp.topic, tp.partition)
            self.engines[part] = PartitionEngine.restore(
                tp.topic,
                tp.partition,
                tp.offset,
                tp.metadata,
                max_delivery_attempts=self.s.max_delivery_attempts,
                max_leased=self.s.max_leased,
                key_of=self._key_of,
            )
            self._read_to.pop(part, None)
            self._unread.discard(part)
            self._owed.pop(part, None)

    def _read_unadopted(self, consumer: confluent_kafka.Consumer) -> None:
        """Adopt the partitions assigned while their committed state could not be read:
        read it, seek there (else ``auto.offset.reset`` stands) and resume."""
        if not self._unread or time.monotonic() < self._unread_retry_at:
            return
        self._unread_retry_at = time.monotonic() + UNREAD_RETRY_S
        partitions = [TopicPartition(*part) for part in sorted(self._unread)]
        try:
            committed = consumer.committed(partitions, timeout=self.s.operation_timeout_s)
        except KafkaException as exc:
            log.warning("simple consumer %s: committed offsets again: %s", self.client_id, exc)
            return
        self._adopt(committed)
        for tp in committed:
            if tp.offset >= 0:
                consumer.seek(tp)
        consumer.resume(committed)

    def filters_changed(self) -> None:
        self._filter_of.clear()

    def tag_filter(self, topic: str) -> TagFilter | None:
        """``topic``'s filter: its own entry, else the first pattern (in subscription order)
        that matches it, as librdkafka matched it; None for a topic no entry names."""
        if topic not in self._filter_of:
            found = self._filters.get(topic)
            if found is None:
                found = next(
                    (
                        self._filters[p]
                        for p in self._filters
                        if p.startswith("^") and re.search(p, topic)
                    ),
                    None,
                )
            self._filter_of[topic] = found
        return self._filter_of[topic]

    def _key_of(self, msg: confluent_kafka.Message) -> bytes | None:
        """The record's message group (its ordering key), None: unordered. A group that is
        not UTF-8 is malformed: counted, logged, and the record delivered unordered."""
        if not self.s.fifo:
            return None
        group = message_group_of(headers_of(msg))
        if group is not None and group_text(group) is None:
            self.counts["malformed"] += 1
            log.warning(
                "simple consumer %s: %s[%s]@%s: its %s is not UTF-8; delivered without order",
                self.client_id,
                msg.topic(),
                msg.partition(),
                msg.offset(),
                H.MESSAGE_GROUP,
            )
            return None
        return group

    def on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        partitions = self._system.release(partitions)
        try:  # what is acked of them is committed before another owner starts
            self.commit(consumer, [(tp.topic, tp.partition) for tp in partitions])
        except KafkaOperationError as exc:
            log.warning("simple consumer %s: commit on revocation: %s", self.client_id, exc)
        self._forget(consumer, partitions, "its partition was revoked")

    def on_lost(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        # Not ours: no commit.
        self._forget(consumer, self._system.release(partitions), "its partition was lost")

    def _forget(self, consumer: confluent_kafka.Consumer, partitions: list, why: str) -> None:
        for tp in partitions:
            part = (tp.topic, tp.partition)
            self.acks.lost(part, why)  # those a commit carried were resolved by it
            self.engines.pop(part, None)
            self._read_to.pop(part, None)
            self._paused.discard(part)
            self._unread.discard(part)
            self._owed.pop(part, None)
        consumer.incremental_unassign(partitions)

    # -- reading -------------------------------------------------------------------------------
    def poll(self, consumer: confluent_kafka.Consumer, timeout_s: float) -> None:
        """Read what is there (waiting up to ``timeout_s``) into the engines."""
        self._read_unadopted(consumer)
        now = now_ms()
        for msg in consumer.consume(FETCH_MAX, timeout_s):
            if msg.error() is not None:
                log.warning("simple consumer %s: %s", self.client_id, msg.error())
                continue
            part = (topic_of(msg), partition_of(msg))
            engine = self.engines.get(part)
            offset = offset_of(msg)
            if engine is None or offset < self._read_to.get(part, 0):
                continue  # revoked meanwhile, or read again after a pause: had it
            self._read_to[part] = offset + 1
            tags = self.tag_filter(part[0])
            if tags is not None and not tags.matches(headers_of(msg)):
                engine.skip(offset)
                self.counts["skipped"] += 1
                self.dirty = True  # its offset goes with the next periodic commit
            else:
                engine.offer(offset, msg, now)
        self._back_pressure(consumer)

    def _back_pressure(self, consumer: confluent_kafka.Consumer) -> None:
        """Pause a partition whose engine holds as many records as its tracker allows; resume
        it (from where the engine stopped) once it accepts again."""
        for part, engine in self.engines.items():
            accepting = engine.accepting()
            if not accepting and part not in self._paused:
                consumer.pause([TopicPartition(*part)])
                self._paused.add(part)
            elif accepting and part in self._paused:
                self._paused.discard(part)
                if part in self._read_to:  # pause drops the prefetched records
                    consumer.seek(TopicPartition(*part, self._read_to[part]))
                consumer.resume([TopicPartition(*part)])

    def status(self) -> dict[str, dict[str, Any]]:
        """Per assigned partition (``topic[partition]``): where a commit now would put the
        offset, the records invisible, leased, buffered, the message groups with records, and
        whether back-pressure paused it."""
        return {
            engine.where: {
                "commit_offset": engine.tracker.lowest_unfinished,
                "in_flight": engine.in_flight,
                "leased": engine.leased,
                "buffered": engine.buffered,
                "groups": engine.groups,
                "paused": part in self._paused,
            }
            for part, engine in sorted(self.engines.items())
        }

    # -- commits -------------------------------------------------------------------------------
    def commit(self, consumer: confluent_kafka.Consumer, parts: list[Part]) -> None:
        """Commit ``parts``' committable offsets and metadata, synchronously."""
        now = now_ms()
        offsets = []
        for part in parts:
            engine = self.engines.get(part)
            state = engine.committable(now, self._owner) if engine else None
            if state is not None:
                offsets.append(TopicPartition(*part, state[0], metadata=state[1]))
        if not offsets:
            return
        try:
            results = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self.counts["commit_failures"] += 1
            raise KafkaOperationError(f"offset commit of group {self.group}: {exc}") from exc
        failed = [tp for tp in results or [] if tp.error is not None]
        self._resolve_acks(offsets, {(tp.topic, tp.partition) for tp in failed})
        if failed:
            self.counts["commit_failures"] += 1
            raise KafkaOperationError(
                f"offset commit of group {self.group}: "
                + ", ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in failed)
            )
        self._last_commit = time.monotonic()
        self.dirty = False

    def _resolve_acks(self, offsets: list[TopicPartition], failed: set[Part]) -> None:
        """Resolve the ack futures that the commit of ``offsets`` (but ``failed``) carried."""
        for tp in offsets:
            part = (tp.topic, tp.partition)
            if part not in failed and self.acks.waiting(part):
                self.acks.committed(part, done_in_commit(tp.offset, tp.metadata))

    def wait_for_commit(self, part: Part, offset: int, future: Future[None]) -> None:
        """Resolve ``future`` once a commit carrying the ack of ``part``@``offset`` lands; fail
        it when the partition goes first, or after the commit path's bounds."""
        deadline = self.s.commit_interval_ms / 1000 + self.s.operation_timeout_s
        self.acks.add(part, offset, future, time.monotonic() + deadline)

    def commit_if_due(self, consumer: confluent_kafka.Consumer) -> None:
        if self.dirty and (
            time.monotonic() - self._last_commit >= self.s.commit_interval_ms / 1000
        ):
            try:
                self.commit(consumer, list(self.engines))
            except KafkaOperationError as exc:
                log.warning("simple consumer %s: %s (acks go with the next)", self.client_id, exc)
        if len(self.acks):
            self.acks.expire(
                time.monotonic(),
                f"commit_interval_ms + operation_timeout_s ({self.s.commit_interval_ms} ms + "
                f"{self.s.operation_timeout_s:g} s)",
            )

    # -- dead letters --------------------------------------------------------------------------
    def _bury(self, engine: PartitionEngine, now_ms: int) -> None:
        """Write the engine's owed dead letters to the DLQ, then make them done. One the DLQ
        did not take stays owed (its group blocked, the commit below it) and is sent again
        at the next receive: the engine hands each out once, so it must not be dropped."""
        owed = self._owed.setdefault((engine.topic, engine.partition), [])
        owed += engine.take_dead_letters(now_ms)
        while owed:
            dead = owed[0]
            try:
                self._send_dead(engine, dead)
            except (KafkaOperationError, RmqTimeoutError, KafkaException, BufferError) as exc:
                self.counts["dlq_failures"] += 1
                log.warning(
                    "simple consumer %s: %s (sent again at the next receive)", self.client_id, exc
                )
                return
            owed.pop(0)
            engine.dead_lettered(dead.offset)
            self.counts["dead"] += 1
            self.dirty = True

    def _send_dead(self, engine: PartitionEngine, dead: DeadLetter) -> None:
        producer = self.producer
        assert producer is not None
        msg = dead.record
        errors: list[Any] = []
        producer.produce(
            self.dlq_topic,
            key=msg.key(),
            value=msg.value(),
            headers=produce_headers(
                dlq_headers(
                    headers_of(msg),
                    topic=engine.topic,
                    partition=engine.partition,
                    offset=dead.offset,
                    reconsume_times=dead.attempts - 1,
                    reason="max_attempts",
                )
            ),
            on_delivery=lambda err, _m: errors.append(err),
        )
        if producer.flush(self.s.operation_timeout_s) or not errors:
            raise RmqTimeoutError(
                f"dead letter of {engine.where}@{dead.offset} not acknowledged within "
                f"{self.s.operation_timeout_s} s"
            )
        if errors[0] is not None:
            raise KafkaOperationError(f"dead letter of {engine.where}@{dead.offset}: {errors[0]}")

    # -- handing out ---------------------------------------------------------------------------
    def take(self, consumer: confluent_kafka.Consumer, n: int, invisible_ms: int) -> list[Delivery]:
        """Up to ``n`` deliveries from the engines, committed (with their leases) before
        they are returned; [] when the commit failed (nothing is handed out without it)."""
        now = now_ms()
        batch: list[Delivery] = []
        for engine in list(self.engines.values()):
            self._bury(engine, now)
            if len(batch) < n:
                batch += engine.receive(n - len(batch), now, invisible_ms)
            self._bury(engine, now)  # the ones that receive found at their last attempt
        if not batch:
            return []
        try:
            self.commit(consumer, list(self.engines))
        except KafkaOperationError as exc:
            # Nothing handed out, so no attempt spent: a message must not reach the DLQ on
            # commits that failed (its partition may have been lost meanwhile: then no engine).
            for delivery in batch:
                owner = self.engines.get((delivery.receipt.topic, delivery.receipt.partition))
                if owner is not None:
                    owner.withdraw(delivery)
            log.warning(
                "simple consumer %s: %s; %d messages held back", self.client_id, exc, len(batch)
            )
            return []
        self.counts["received"] += len(batch)
        self.counts["redelivered"] += sum(1 for d in batch if d.delivery_attempt > 1)
        return batch
