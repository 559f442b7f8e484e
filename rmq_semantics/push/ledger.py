"""What the concurrent consumer owes: per assigned partition, the offsets in flight (an
:class:`~rmq_semantics.orderly.offsets.OffsetTracker`) and the retry copies and dead letters
not yet written.

Exactly-once of the retry path rests on one rule: a failed record is marked done in its
tracker in the same locked step that queues its copy, and the poll thread takes the queued
copies and the committable offsets in one locked step, writing both in one Kafka
transaction. So no commit ever covers a record whose copy is not in that transaction or an
earlier committed one, and a copy is never written without that commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.push.api import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus
from rmq_semantics.push.api import PushMessage as Msg
from rmq_semantics.push.retry import OutRecord, level_of, out_record

__all__ = ["Batch", "Ledger", "Part"]

log = logging.getLogger(__name__)
SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
TP = tuple[str, int]


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


@dataclass(eq=False)
class Batch:
    """One listener call: messages of one partition with their first failure times."""

    part: Part
    msgs: list[Msg]
    offsets: list[int]  # where each was read (a retry message shows its origin instead)
    first_failures: list[int | None]
    deadline: float  # monotonic; past it the call counts as RECONSUME_LATER
    settled: bool = False


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
    ) -> None:
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # a call settled: in_flight went down
        self._parts: dict[TP, Part] = {}
        self._batches: set[Batch] = set()
        self._retry_topic = retry_topic
        self.dlq_topic = dlq_topic
        self._levels = delay_levels
        self._max = max_reconsume_times
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
            for part in self._parts.values():
                now = part.tracker.committable()
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
