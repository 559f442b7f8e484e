"""One assigned partition's state (RocketMQ's ``ProcessQueue``): pure, the clock passed in.

Lifecycle, changed only through :func:`transition`::

    ASSIGNED -> LOCKED(epoch) -> ALIGNED -> REVOKING -> DROPPED | LOST

A queue is ASSIGNED when the group gives it to this consumer, LOCKED once the lock service
grants its queue lock with an epoch, and ALIGNED once its buffers start at the offset the
group committed (a new holder resumes exactly where the previous one committed). Only an
ALIGNED queue whose lease is live hands batches to the listener. A denial (someone else
holds the lock) sends it back to ASSIGNED; a grant with a new epoch back to LOCKED.
Revocation stops new batches (REVOKING), then the queue is DROPPED; a queue whose partition
the group took back without a revocation is LOST and never commits again.

Fencing: a batch runs under the epoch it started with; its offset may be committed only
while that same lock is held and our view of its lease has not ended (:meth:`may_commit`).
No threads and no Kafka here: the caller holds the queue's lock around every call. The
buffers hold records as fetched: ``offset_of`` reads a record's offset, and ``views`` turns
a batch of records into the messages a listener gets, when the batch is taken (by default
the records are OrderlyMessages already). Late views keep one Python object per buffered
message instead of two: fewer objects for the garbage collector to traverse and promote.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any

from rmq_semantics.errors import IllegalTransitionError
from rmq_semantics.orderly.api import OrderlyMessage, PartitionStatus

__all__ = ["GONE", "LIVE", "TRANSITIONS", "QueuePhase", "QueueState", "transition"]


class QueuePhase(Enum):
    """Lifecycle of one assigned partition in this consumer."""

    ASSIGNED = "assigned"  # ours in the group; no queue lock (yet, or any more)
    LOCKED = "locked"  # lock granted with an epoch; the committed offset not read yet
    ALIGNED = "aligned"  # locked, and the buffers start at the committed offset
    REVOKING = "revoking"  # leaving: no new batch; the one in flight may still commit
    DROPPED = "dropped"  # revoked, gone
    LOST = "lost"  # gone without a commit: the group took it back (session lost)

    # Members are singletons: hash by identity in C, not Enum's Python-level __hash__ (the
    # ``phase in GONE`` tests run for every batch).
    __hash__ = object.__hash__


P = QueuePhase
#: The one transition table. LOCKED -> LOCKED and ALIGNED -> ALIGNED are renewals;
#: ALIGNED -> LOCKED is a grant with a new epoch (align again); -> ASSIGNED is a denial.
TRANSITIONS: dict[QueuePhase, frozenset[QueuePhase]] = {
    P.ASSIGNED: frozenset({P.LOCKED, P.REVOKING}),
    P.LOCKED: frozenset({P.LOCKED, P.ALIGNED, P.ASSIGNED, P.REVOKING}),
    P.ALIGNED: frozenset({P.ALIGNED, P.LOCKED, P.ASSIGNED, P.REVOKING}),
    P.REVOKING: frozenset({P.DROPPED, P.LOST}),
    P.DROPPED: frozenset(),
    P.LOST: frozenset(),
}
#: Phases in which lock answers still apply; and those of a queue that is gone.
LIVE = frozenset({P.ASSIGNED, P.LOCKED, P.ALIGNED})
GONE = frozenset({P.DROPPED, P.LOST})


def transition(current: QueuePhase, target: QueuePhase) -> QueuePhase:
    """Return ``target`` if the lifecycle allows ``current -> target``, else raise."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransitionError(
            f"orderly queue cannot go from {current.value} to {target.value}"
        )
    return target


def _value_size(msg: Any) -> int:
    return len(msg.value or b"")


class QueueState:
    """The lock, buffers and offsets of one assigned partition.

    Lock: ``epoch`` of the latest grant, ``held`` while it is ours (kept through revocation,
    which still commits under it), ``deadline`` where our view of its lease ends (a
    ``time.monotonic()`` instant), ``aligned_epoch`` the epoch whose committed offset the
    buffers start at. Offsets: ``released`` = everything below was processed;
    ``pending_commit`` = processed, commit not confirmed (under ``pending_epoch``);
    ``commit_sent`` = the commit request in flight; ``committed`` = confirmed.
    Key mode (:mod:`~rmq_semantics.orderly.keyed`) also commits ``pending_done``, the done
    offsets above ``pending_commit`` (``sent_done`` with ``commit_sent``), and restores
    them from ``committed_metadata``, read at alignment; partition mode leaves them "".
    """

    def __init__(
        self,
        tp: tuple[str, int],
        *,
        offset_of: Callable[[Any], int] = operator.attrgetter("offset"),
        views: Callable[[list[Any]], list[OrderlyMessage]] | None = None,
        size_of: Callable[[Any], int] = _value_size,
    ) -> None:
        self.tp = tp
        self._offset_of = offset_of
        self._views = views
        #: A record's size in bytes (its value's), for the byte bound.
        self.size_of = size_of
        self.phase = QueuePhase.ASSIGNED
        self.epoch = -1
        self.held = False
        self.deadline = 0.0
        self.aligned_epoch = -1
        self.msgs: deque[Any] = deque()  # records, see offset_of and views
        self.queued_bytes = 0  # of the records in msgs (size_of)
        self.inflight: list[Any] = []
        # Delivered with auto_commit off and not committed yet (RocketMQ's
        # consumingMsgOrderlyTreeMap): ROLLBACK hands them over again.
        self.uncommitted: list[Any] = []
        self.min_offset = -1  # fetched messages below this are stale (before alignment)
        self.reset_to: int | None = None  # backward seek for the poll thread
        self.released = -1
        self.pending_commit: int | None = None
        self.pending_epoch = -1
        self.commit_sent = -1
        self.committed = -1
        self.committed_metadata = ""  # of the commit read at alignment (key mode reads it)
        self.pending_done = ""
        self.sent_done = ""
        self.reconsume_times = 0
        # The in-flight batch's last failure (the worker's, for its dead letter; opaque here).
        self.failure: Any = None
        self.suspended_until = 0.0
        self.paused = False  # fetching paused by flow control (poll thread)
        self.high = -1  # partition end as last seen by the fetcher (for lag)

    @property
    def where(self) -> str:
        return f"{self.tp[0]}[{self.tp[1]}]"

    @property
    def gone(self) -> bool:
        return self.phase in GONE

    def _move(self, target: QueuePhase) -> None:
        self.phase = transition(self.phase, target)

    # -- fencing rules -----------------------------------------------------------------------
    def lease_ok(self, now: float) -> bool:
        """The lock is ours and our view of its lease has not ended at ``now``."""
        return self.held and now < self.deadline and self.phase is not QueuePhase.LOST

    def runnable(self, now: float) -> bool:
        """A batch may start at ``now``: aligned under a live lease, not rewinding, not
        suspended, and something to hand over."""
        return (
            self.phase is QueuePhase.ALIGNED
            and now < self.deadline
            and self.reset_to is None
            and bool(self.inflight or self.msgs)
            and now >= self.suspended_until
        )

    def may_commit(self, epoch: int, now: float) -> str | None:
        """None when a batch that started under ``epoch`` may be committed (or dead-lettered)
        at ``now``; else why not."""
        if self.phase is QueuePhase.LOST:
            return "partition lost"
        if self.epoch != epoch or not self.held:
            return "lock lost"
        if now >= self.deadline:
            return "lease lapsed"
        return None

    # -- lock answers (the lock thread) ------------------------------------------------------
    def grant(self, epoch: int, expires: float) -> bool:
        """The lock service granted or renewed the lock until ``expires``. True for a new
        grant (a new epoch, or held again after a denial); the queue is then LOCKED, or
        ALIGNED if it already aligned with that epoch. Ignored once revoking."""
        if self.phase not in LIVE:
            return False
        fresh = epoch != self.epoch or not self.held
        if epoch != self.epoch:
            self.aligned_epoch = -1
        self.epoch, self.held, self.deadline = epoch, True, expires
        if self.phase is QueuePhase.ALIGNED and self.aligned_epoch == epoch:
            self._move(QueuePhase.ALIGNED)
            return fresh
        self._move(QueuePhase.LOCKED)
        if self.aligned_epoch == epoch:
            self._move(QueuePhase.ALIGNED)
        return fresh

    def deny(self) -> bool:
        """Someone else holds the lock (or ours lapsed and was taken over). Returns whether
        we held it until now. Ignored once revoking."""
        if self.phase not in LIVE:
            return False
        was_held = self.held
        self.held, self.deadline = False, 0.0
        if self.phase is not QueuePhase.ASSIGNED:
            self._move(QueuePhase.ASSIGNED)
        return was_held

    def align_failed(self) -> None:
        """The committed offset could not be read: give the lock up in our view, so the next
        lock round asks again and aligns again."""
        self.held = False
        if self.phase in (QueuePhase.LOCKED, QueuePhase.ALIGNED):
            self._move(QueuePhase.ASSIGNED)

    def align(self, epoch: int, committed: int, metadata: str | None = None) -> bool:
        """Start at ``committed``, the group's offset read after the grant of ``epoch``: the
        previous holder may have committed past what we fetched, or we may hold work it
        redid. False (nothing changed) when the queue is gone or the epoch moved on."""
        if self.phase in GONE or epoch != self.epoch:
            return False
        if self.uncommitted:  # a new epoch starts from the group's commit: redo them
            self.rollback()
        if committed >= 0:
            offset_of = self._offset_of
            self.inflight = [m for m in self.inflight if offset_of(m) >= committed]
            while self.msgs and offset_of(self.msgs[0]) < committed:
                self.queued_bytes -= self.size_of(self.msgs.popleft())
            if committed < max(self.committed, self.released):
                # Moved back behind what this queue already let go of: re-read from it.
                self.reset_to = committed
                self.clear_buffer()
                self.inflight = []
            if self.pending_commit is not None and self.pending_commit <= committed:
                self.pending_commit = None
            self.min_offset = committed
        self.committed = self.released = committed
        self.committed_metadata = metadata or ""
        self.aligned_epoch = epoch
        if self.phase is QueuePhase.LOCKED:
            self._move(QueuePhase.ALIGNED)
        return True

    # -- leaving -------------------------------------------------------------------------------
    def revoke(self) -> None:
        """Start no new batch: the queue is leaving (revocation, shutdown). Idempotent."""
        if self.phase in LIVE:
            self._move(QueuePhase.REVOKING)

    def lose(self) -> None:
        """The group took the partition back: gone at once, never committed again."""
        if self.phase in GONE:
            return
        self.revoke()
        self._move(QueuePhase.LOST)
        self.clear_buffer()
        self.uncommitted = []

    def drop(self) -> None:
        """Revocation is over: forget the buffered messages (a lost queue stays LOST).
        Only a revoking queue can be dropped."""
        if self.phase not in GONE:
            self._move(QueuePhase.DROPPED)
        self.clear_buffer()
        self.uncommitted = []

    # -- messages and batches ----------------------------------------------------------------
    def clear_buffer(self) -> None:
        """Forget the buffered records (not the in-flight batch)."""
        self.msgs.clear()
        self.queued_bytes = 0

    def take_first(self) -> Any:
        """The first buffered record, out of the buffer (key mode's feeder)."""
        record = self.msgs.popleft()
        self.queued_bytes -= self.size_of(record)
        return record

    def add(self, msgs: list[Any]) -> bool:
        """Buffer fetched records (offset order); False when they were not wanted."""
        if self.phase in GONE or self.reset_to is not None:
            return False
        low, offset_of = self.min_offset, self._offset_of
        if not (msgs and offset_of(msgs[0]) >= low):  # offset order: no per-message test
            msgs = [m for m in msgs if offset_of(m) >= low]
        self.msgs.extend(msgs)
        self.queued_bytes += sum(map(self.size_of, msgs))
        return True

    def next_batch(self, size: int) -> list[OrderlyMessage]:
        """The batch to hand the listener: the suspended one again, else the next ``size``
        messages; a redelivered batch carries its ``reconsume_times``."""
        inflight = self.inflight
        if not inflight:
            msgs = self.msgs
            if size >= len(msgs):  # the whole buffer (a fetch's tail): no per-record step
                inflight = list(msgs)
                msgs.clear()
            else:
                popleft = msgs.popleft
                inflight = [popleft() for _ in range(size)]
            self.inflight = inflight
            self.queued_bytes -= sum(map(self.size_of, inflight))
        batch = list(inflight) if self._views is None else self._views(inflight)
        if not self.reconsume_times:  # built with 0: copy only for a redelivery
            return batch
        return [dataclasses.replace(m, reconsume_times=self.reconsume_times) for m in batch]

    def processed(self, offset: int, epoch: int, done: str = "") -> None:
        """The in-flight batch is done up to ``offset`` under ``epoch``: the next one may
        start while its commit is pending. ``done``: key mode's done offsets above it."""
        self.inflight = []
        self.uncommitted = []
        self.reconsume_times = 0
        self.failure = None
        self.pending_commit = offset
        self.pending_done = done
        self.pending_epoch = epoch
        self.released = offset

    def hold(self) -> None:
        """The in-flight batch succeeded with auto_commit off: keep it for a later COMMIT
        or ROLLBACK, go on with the next batch (nothing to commit yet)."""
        self.uncommitted.extend(self.inflight)
        self.inflight = []
        self.reconsume_times = 0
        self.failure = None

    def rollback(self) -> None:
        """ROLLBACK: everything delivered since the last commit goes back in front of the
        buffer, in offset order (RocketMQ's ``ProcessQueue.rollback``)."""
        back = self.uncommitted + self.inflight
        self.msgs.extendleft(reversed(back))
        self.queued_bytes += sum(map(self.size_of, back))
        self.uncommitted = []
        self.inflight = []
        self.reconsume_times = 0
        self.failure = None

    def suspend(self, until: float, *, retried: bool) -> None:
        """Hand the in-flight batch over again at ``until``; ``retried`` counts a redelivery."""
        if retried:
            self.reconsume_times += 1
        self.suspended_until = until

    def take_reset(self) -> int | None:
        """The offset to seek back to, if alignment asked for one (the buffers are emptied)."""
        reset_to, self.reset_to = self.reset_to, None
        if reset_to is not None:
            self.clear_buffer()
            self.inflight = []
            self.uncommitted = []
        return reset_to

    # -- commits -------------------------------------------------------------------------------
    def commit_due(self) -> tuple[int, int] | None:
        """(offset, epoch) of a processed batch whose commit is not sent yet."""
        if self.phase in GONE or self.pending_commit is None:
            return None
        if self.pending_commit == self.commit_sent and self.pending_done == self.sent_done:
            return None
        return self.pending_commit, self.pending_epoch

    def commit_skipped(self, offset: int) -> None:
        """The commit of ``offset`` was refused by the fencing rules: the holder redoes it."""
        if self.pending_commit == offset:
            self.pending_commit = None

    def commit_failed(self, offset: int) -> None:
        """The group refused the commit of ``offset``: send it again later."""
        if self.commit_sent == offset:
            self.commit_sent = -1

    def commit_done(self, offset: int, done: str = "") -> None:
        if self.pending_commit == offset and self.pending_done == done:
            self.pending_commit = None
        self.committed = max(self.committed, offset)

    # -- status --------------------------------------------------------------------------------
    def status(self, now: float) -> PartitionStatus | None:
        """What ``OrderlyConsumer.status`` shows for this queue at ``now`` (None: gone)."""
        if self.phase in GONE:
            return None
        locked = self.lease_ok(now)
        state = "held" if locked else "lapsed" if self.held else "unlocked"
        committed = self.committed
        lag = max(0, self.high - committed) if self.high >= 0 and committed >= 0 else -1
        return PartitionStatus(
            self.tp[0],
            self.tp[1],
            state,
            self.epoch,
            int(max(0.0, self.deadline - now) * 1000) if locked else 0,
            committed,
            lag,
            len(self.msgs),
            len(self.inflight),
            self.reconsume_times,
            now < self.suspended_until,
            queued_bytes=self.queued_bytes,
        )
