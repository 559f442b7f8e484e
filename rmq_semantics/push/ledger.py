"""What the concurrent consumer owes: per assigned partition, the offsets in flight (an
:class:`~rmq_semantics.orderly.offsets.OffsetTracker`) and the retry copies and dead letters
not yet written.

Exactly-once of the retry path rests on one rule: a failed record is marked done in its
tracker in the same locked step that queues its copy, and the poll thread takes the queued
copies and the committable offsets in one locked step, writing both in one Kafka
transaction. So no commit ever covers a record whose copy is not in that transaction or an
earlier committed one, and a copy is never written without that commit.

A FIFO record (one with a message group, ``fifo`` on) is not copied: it joins its
partition's :class:`~rmq_semantics.simple.engine.PartitionEngine`, which shares the
partition's tracker, hands out only its group's head, and on a failure makes it visible again
after the FIFO retry interval, in place. Its dead letter follows the same rule as a copy: the
engine marks it done in the locked step that queues it in the outbox.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rmq_semantics.errors import ReceiptError
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.push.api import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus
from rmq_semantics.push.api import PushMessage as Msg
from rmq_semantics.push.retry import OutRecord, level_of, out_record
from rmq_semantics.simple.engine import Delivery, PartitionEngine, Receipt, message_group_of

__all__ = ["Batch", "Ledger", "Part"]

log = logging.getLogger(__name__)
SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
TP = tuple[str, int]
# The lease field's deadlines are relative to a reference time; kept while it is younger
# than this, so a commit's metadata changes only when a lease does (the field holds 74 h).
LEASE_REF_MAX_AGE_MS = 3600 * 1000
# The deadlines a commit writes for FIFO calls in flight are capped this far ahead, renewed
# at half while the instance lives, while the calls' own leases run to their consume timeout:
# a message held by an instance that died comes back this soon on the next owner, not after
# consume_timeout_ms (15 min by default), and the running calls never time out here for a
# slow poll round. A live instance keeps its calls' groups: renewed while they run, waited
# for at revocation (poller.py), never dispatched again across a producer renewal.
FIFO_COMMITTED_LEASE_MS = 10_000


@dataclass(eq=False)
class Part:
    """One assigned partition: its tracker, the copies its failures owe, what was committed."""

    tp: TP
    tracker: OffsetTracker
    level: int = 0  # the delay level of a retry partition, 0 for a subscribed topic
    outbox: list[OutRecord] = field(default_factory=list)
    committed: tuple[int, str] | None = None
    held_until_ms: int = 0  # a retry partition paused until its head is due
    first: int | None = None  # the first offset read: a replay without a commit starts there
    # FIFO (a subscribed topic, fifo on): the engine of its records with a message group; it
    # shares ``tracker``, so the committed offset never passes an unfinished record of either.
    engine: PartitionEngine | None = None
    lease_ref_ms: int = 0
    leases_visible_by: int = 0  # the cap of the deadlines its commits write (FIFO)
    # Revoked while FIFO calls still ran past the revocation's wait: its last commit writes
    # their leases to their own deadlines, so the next owner waits for this live instance.
    uncapped: bool = False
    first_failures: dict[int, int] = field(default_factory=dict)  # FIFO offset -> first ms


@dataclass(eq=False)
class Batch:
    """One listener call: messages of one partition with their first failure times."""

    part: Part
    msgs: list[Msg]
    offsets: list[int]  # where each was read (a retry message shows its origin instead)
    first_failures: list[int | None]
    deadline: float  # monotonic; past it the call counts as RECONSUME_LATER
    settled: bool = False
    receipt: Receipt | None = None  # a FIFO record's delivery (its batch has one message)


class Ledger:
    """Partitions, their trackers and owed copies, under one lock (workers settle, the
    poll thread adds records and takes commits)."""

    def __init__(
        self,
        *,
        retry_topic: Callable[[int], str],
        dlq_topic: str,
        delay_levels: tuple[float, ...],
        max_reconsume_times: int,
        fifo: bool = False,
        fifo_retry_interval_ms: int = 1000,
    ) -> None:
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # a call settled: in_flight went down
        self._parts: dict[TP, Part] = {}
        self._batches: set[Batch] = set()
        self._retry_topic = retry_topic
        self.dlq_topic = dlq_topic
        self._levels = delay_levels
        self._max = max_reconsume_times
        self.fifo = fifo
        self._fifo_retry_ms = fifo_retry_interval_ms
        self.counts = {
            "consumed": 0,
            "retried": 0,
            "dead": 0,
            "skipped": 0,
            "malformed": 0,
            "timed_out": 0,
            "poll_errors": 0,
            "producer_renewals": 0,
        }

    def count(self, name: str) -> int:
        """One more ``name`` (e.g. a poll-thread error); the new count."""
        with self._lock:
            self.counts[name] += 1
            return self.counts[name]

    # -- partitions (poll thread) ------------------------------------------------------------
    def assign(self, part: Part) -> None:
        with self._lock:
            self._parts[part.tp] = part

    def new_part(
        self, topic: str, partition: int, offset: int, metadata: str | None, level: int
    ) -> Part:
        """The state of a partition just assigned, restored from its commit: a subscribed
        partition with ``fifo`` on gets an engine (leases and all), others a tracker."""
        where = f"{topic}[{partition}]"
        if level or not self.fifo:
            tracker = OffsetTracker.restore(offset, metadata, where=where)
            return Part((topic, partition), tracker, level)
        engine = PartitionEngine.restore(
            topic,
            partition,
            offset,
            metadata,
            max_delivery_attempts=self._max + 1,
            key_of=lambda msg: message_group_of(msg.headers),
        )
        return Part((topic, partition), engine.tracker, level, engine=engine)

    def revoke(self, tp: TP) -> Part | None:
        """Forget ``tp``: its calls still running are ignored when they end (the new owner
        redoes them), so nothing of it is written from here on."""
        with self._lock:
            return self._parts.pop(tp, None)

    def part(self, tp: TP) -> Part | None:
        return self._parts.get(tp)

    def parts(self) -> list[Part]:
        with self._lock:
            return list(self._parts.values())

    def take(self, part: Part, offset: int) -> bool:
        """A record read at ``offset``: False when a restored commit says it is done."""
        with self._lock:
            if part.first is None:
                part.first = offset
            return part.tracker.add(offset)

    def skip(self, part: Part, offset: int) -> None:
        """A record taken but not for this consumer (tags): done at once."""
        with self._lock:
            part.tracker.done(offset)
            self.counts["skipped"] += 1

    # -- FIFO records (poll thread) ------------------------------------------------------------
    def offer(self, part: Part, offset: int, msg: Msg, now_ms: int) -> None:
        """A FIFO record read at ``offset`` joins its group's queue in the partition's engine
        (unless a restored commit says it is done)."""
        assert part.engine is not None
        with self._lock:
            if part.first is None:
                part.first = offset
            part.engine.offer(offset, msg, now_ms)

    def fifo_calls(self, tps: set[TP]) -> list[Batch]:
        """The FIFO calls of the partitions ``tps`` still running (of a partition revoked or
        replayed since too: their listener has not returned)."""
        with self._lock:
            return [b for b in self._batches if b.receipt and b.part.tp in tps]

    def wait_fifo_calls(self, tps: set[TP], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until no FIFO call of the partitions ``tps`` is running
        (revocation: finish, then commit); False on timeout."""
        with self._room:
            return self._room.wait_for(
                lambda: not any(b.receipt and b.part.tp in tps for b in self._batches), timeout_s
            )

    def uncap(self, tps: set[TP]) -> None:
        """The next commit of the partitions ``tps`` writes the leases of their calls in
        flight to those calls' own deadlines (a revocation that could not wait them out)."""
        with self._lock:
            for tp in tps:
                if (part := self._parts.get(tp)) is not None:
                    part.uncapped = True

    def accepting(self, part: Part) -> bool:
        """Whether ``part`` may take more records (its tracker's bound)."""
        with self._lock:
            return part.tracker.accepting()

    def deliver(self, room: int, now_ms: int, invisible_ms: int) -> list[tuple[Part, Delivery]]:
        """Up to ``room`` FIFO records due now (each its group's head), lowest offset first per
        partition; a record out of attempts is queued as a dead letter instead."""
        out: list[tuple[Part, Delivery]] = []
        with self._lock:
            for part in self._parts.values():
                if part.engine is None:
                    continue
                self._bury(part, now_ms, None)
                if room > len(out):
                    got = part.engine.receive(room - len(out), now_ms, invisible_ms)
                    out.extend((part, d) for d in got)
                self._bury(part, now_ms, None)  # out of attempts at this receive
        return out

    def _settle_fifo(
        self, batch: Batch, ok: bool, error: BaseException | None, now_ms: int
    ) -> None:
        """A FIFO call's outcome (lock held): acked, or visible again after the retry interval
        in place, or (its last attempt) a dead letter now. A receipt refused means the record
        is no longer this call's (redelivered after its lease): its outcome is ignored."""
        part, receipt = batch.part, batch.receipt
        assert part.engine is not None and receipt is not None
        try:
            if ok:
                part.engine.ack(receipt, now_ms)
                part.first_failures.pop(receipt.offset, None)
                self.counts["consumed"] += 1
                return
            part.first_failures.setdefault(receipt.offset, now_ms)
            last = receipt.attempt >= self._max + 1
            wait = 0 if last else self._fifo_retry_ms
            part.engine.change_invisible_duration(receipt, wait, now_ms)
        except ReceiptError as exc:
            log.warning("%s: outcome ignored (%s)", receipt.where, exc)
            return
        if last:
            self._bury(part, now_ms, error)
        else:
            self.counts["retried"] += 1

    def _bury(self, part: Part, now_ms: int, error: BaseException | None) -> None:
        """Queue the engine's owed dead letters and make them done, in one locked step."""
        assert part.engine is not None
        for dead in part.engine.take_dead_letters(now_ms):
            msg = replace(dead.record, reconsume_times=dead.attempts - 1)
            part.outbox.append(
                out_record(
                    msg,
                    now_ms=now_ms,
                    topic=self.dlq_topic,
                    retry=False,
                    due_ms=now_ms,
                    error=error,
                    first_failure_ms=part.first_failures.pop(dead.offset, None),
                    source=f"{part.tp[0]}[{part.tp[1]}]@{dead.offset}",
                )
            )
            part.engine.dead_lettered(dead.offset)
            self.counts["dead"] += 1

    def open(self, batch: Batch) -> None:
        with self._lock:
            self._batches.add(batch)

    @property
    def in_flight(self) -> int:
        return len(self._batches)

    def wait_for_room(self, limit: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until fewer than ``limit`` calls are in flight."""
        with self._room:
            return self._room.wait_for(lambda: len(self._batches) < limit, timeout_s)

    # -- outcomes (workers, and the poll thread for timeouts) --------------------------------
    def settle(
        self,
        batch: Batch,
        status: object,
        context: ConsumeConcurrentlyContext,
        error: BaseException | None,
    ) -> None:
        """Record a call's outcome once: successes done, failures queued as copies."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            if batch.settled:
                return
            batch.settled = True
            self._batches.discard(batch)
            self._room.notify_all()
            part = batch.part
            if self._parts.get(part.tp) is not part:
                return  # revoked meanwhile: the new owner redoes it
            ok = (context.ack_index + 1) if status is SUCCESS else 0
            if batch.receipt is not None:
                self._settle_fifo(batch, ok > 0, error, now_ms)
                return
            for index, msg in enumerate(batch.msgs):
                if index >= ok:
                    source = f"{part.tp[0]}[{part.tp[1]}]@{batch.offsets[index]}"
                    part.outbox.append(
                        self._copy(
                            msg,
                            batch.first_failures[index],
                            context.delay_level_when_next_consume,
                            error,
                            now_ms,
                            source,
                        )
                    )
                else:
                    self.counts["consumed"] += 1
                part.tracker.done(batch.offsets[index])

    def _copy(
        self,
        msg: Msg,
        first_failure: int | None,
        asked: int,
        error: BaseException | None,
        now_ms: int,
        source: str,
    ) -> OutRecord:
        times = msg.reconsume_times + 1
        if asked < 0 or times > self._max:
            self.counts["dead"] += 1
            return out_record(
                msg,
                now_ms=now_ms,
                topic=self.dlq_topic,
                retry=False,
                due_ms=now_ms,
                error=error,
                first_failure_ms=first_failure,
                source=source,
            )
        level = level_of(times, asked, len(self._levels))
        self.counts["retried"] += 1
        return out_record(
            msg,
            now_ms=now_ms,
            topic=self._retry_topic(level),
            retry=True,
            due_ms=now_ms + int(self._levels[level - 1] * 1000),
            error=error,
            first_failure_ms=first_failure,
            source=source,
        )

    def expired(self, now: float) -> list[Batch]:
        """Calls running past their deadline (the caller settles them as failed)."""
        with self._lock:
            return [b for b in self._batches if b.deadline <= now]

    # -- commits (poll thread) -----------------------------------------------------------------
    def take_commit(self) -> tuple[list[tuple[Part, list[OutRecord]]], dict[Part, tuple[int, str]]]:
        """The copies owed and the offsets to commit now, in one step (see the module)."""
        with self._lock:
            copies = [(p, p.outbox) for p in self._parts.values() if p.outbox]
            for part, _ in copies:
                part.outbox = []
            offsets = {}
            now_ms = int(time.time() * 1000)
            for part in self._parts.values():
                if part.engine is None:
                    now = part.tracker.committable()
                else:  # the tracker's fields plus the leases of the FIFO records
                    if now_ms - part.lease_ref_ms > LEASE_REF_MAX_AGE_MS:
                        part.lease_ref_ms = now_ms
                    if part.leases_visible_by - now_ms < FIFO_COMMITTED_LEASE_MS // 2:
                        part.leases_visible_by = now_ms + FIFO_COMMITTED_LEASE_MS
                    cap = None if part.uncapped else part.leases_visible_by
                    now = part.engine.committable(part.lease_ref_ms, visible_by=cap)
                if now is not None and now != part.committed:
                    offsets[part] = now
            return copies, offsets

    def committed(self, offsets: dict[Part, tuple[int, str]]) -> None:
        with self._lock:
            for part, now in offsets.items():
                part.committed = now

    def put_back(self, copies: list[tuple[Part, list[OutRecord]]]) -> None:
        """A transaction failed: its copies are owed again (ahead of newer ones)."""
        with self._lock:
            for part, records in copies:
                if self._parts.get(part.tp) is part:
                    part.outbox[:0] = records
