"""Key mode's partition feeders: one thread per assigned partition (``ordering="key"``).

While the partition is aligned under a live lease, its feeder moves the records the poll
thread buffered into the shared :class:`~rmq_semantics.orderly.keyed.KeyPool`, as units of
consecutive same-key records, and keeps the partition's
:class:`~rmq_semantics.orderly.offsets.OffsetTracker` for the lock epoch it aligned to (a
:class:`~rmq_semantics.orderly.keyunits.Session`). The tracker starts from the committed
offset and its metadata, so records a previous holder finished are skipped and everything
else is processed.

Back-pressure: while the tracker is not accepting (its done offsets would not fit the
commit metadata), or ``KEY_BACKLOG`` records or ``max_taken_bytes`` of values are taken and
unfinished, the feeder takes nothing; the poll thread's buffer fills and it pauses the
partition (its ``MAX_QUEUED`` and ``max_queued_bytes``).

A session ends on revocation (its waiting units are dropped, the calls in flight finish
while the lease lasts, then the feeder lets go of the consume lock: revocation commits and
unlocks, as in partition mode) or on a grant with a new epoch (the same, then the partition
is read again from the committed offset with a fresh tracker). A lost lease commits nothing:
every commit is checked against the epoch its call ran under.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from rmq_semantics.orderly.api import PartitionStatus, kafka_view
from rmq_semantics.orderly.keyed import KeyPool
from rmq_semantics.orderly.keys import ordering_key
from rmq_semantics.orderly.keyunits import Session, Unit
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.orderly.poller import DEFAULT_MAX_QUEUED_BYTES
from rmq_semantics.orderly.queue import QueuePhase, QueueState
from rmq_semantics.orderly.runtime import WAIT_SLICE_S, LiveQueue
from rmq_semantics.tags import TagFilter

__all__ = ["KEY_BACKLOG", "KeyFeeder", "Session"]

log = logging.getLogger(__name__)

#: Records of one partition taken and not finished at most (the poll thread's MAX_QUEUED).
KEY_BACKLOG = 10_000
# Records moved into the pool per round; the tracker's bound is checked between rounds.
FEED_CHUNK = 500
# Revocation waits for the calls in flight at most this long (and never past the lease).
REVOKE_WAIT_CAP_S = 30.0


def _startable(st: QueueState, now: float) -> bool:
    return st.phase is QueuePhase.ALIGNED and st.lease_ok(now) and st.reset_to is None


class KeyFeeder:
    """What every partition thread runs in key mode (:meth:`run` is the thread's target)."""

    def __init__(
        self, pool: KeyPool, *, batch_size: int, max_taken_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    ) -> None:
        self._pool = pool
        self.batch_size = batch_size
        self.max_taken_bytes = max_taken_bytes
        self.tag_filter = TagFilter()  # set by OrderlyConsumer.subscribe
        self._sessions: dict[tuple[str, int], Session] = {}

    def run(self, q: LiveQueue) -> None:
        st = q.state
        previous: Session | None = None
        try:
            while True:
                with q.cv:
                    while not _startable(st, time.monotonic()):
                        if st.gone:
                            return
                        q.cv.wait(WAIT_SLICE_S)
                # Held by revocation, or by a previous assignment's session still ending.
                if not q.consume_lock.acquire(timeout=WAIT_SLICE_S):
                    continue
                try:
                    previous = self._serve(q, previous)
                except Exception:  # a bug in one partition must not kill its thread silently
                    log.exception("%s: key feeder error", q.where)
                    with q.cv:
                        q.cv.wait(1.0)
                finally:
                    q.consume_lock.release()
        finally:
            session = self._sessions.get(q.tp)
            if session is not None and session.q is q:  # not a newer assignment's
                self._sessions.pop(q.tp, None)

    def _serve(self, q: LiveQueue, previous: Session | None) -> Session | None:
        """One session, from its start to its end; returns it (None: start afresh)."""
        st = q.state
        with q.cv:
            if not _startable(st, time.monotonic()):
                return previous
            if previous is not None and previous.first_offset is not None:
                # Its records left the buffer: read again from the committed offset.
                target = st.committed if st.committed >= 0 else previous.first_offset
                st.reset_to = target
                st.clear_buffer()
                log.info(
                    "%s: new lock epoch %d; reading again from offset %d",
                    q.where,
                    st.aligned_epoch,
                    target,
                )
                return None
            tracker = OffsetTracker.restore(st.committed, st.committed_metadata, where=q.where)
            session = Session(q, st.aligned_epoch, tracker)
        self._sessions[q.tp] = session
        try:
            self._pump(q, session)
        finally:
            self._end(q, session)
        return session

    def _pump(self, q: LiveQueue, session: Session) -> None:
        """Feed the pool while the session lasts (until revocation or a new epoch)."""
        st = q.state
        while True:
            with q.cv:
                if (
                    st.gone
                    or st.phase is QueuePhase.REVOKING
                    or st.reset_to is not None
                    or st.aligned_epoch != session.epoch
                ):
                    return
                units: list[Unit] = []
                skipped: list[int] = []
                if st.phase is QueuePhase.ALIGNED and st.lease_ok(time.monotonic()):
                    units = self._take(st, session, skipped)
                if skipped:  # records the tag filter left out are done: commit past them
                    self._pool.done_offsets(session, skipped)
                if not units:
                    q.cv.wait(WAIT_SLICE_S)
                    continue
            self._pool.offer(units)

    def _take(
        self, st: QueueState, session: Session, skipped: list[int] | None = None
    ) -> list[Unit]:
        """Up to FEED_CHUNK buffered records as units (``q.cv`` held); records the tracker
        says are done (restored from the commit) are skipped, and the offsets of those the
        tag filter leaves out are added to ``skipped``."""
        tracker = session.tracker
        tags = None if self.tag_filter.keeps_all else self.tag_filter
        skipped = [] if skipped is None else skipped
        room = min(KEY_BACKLOG - tracker.in_flight, FEED_CHUNK)
        if room <= 0 or not tracker.accepting() or session.taken_bytes >= self.max_taken_bytes:
            return []
        msgs, batch_size, size_of = st.msgs, self.batch_size, st.size_of
        units: list[Unit] = []
        last: Unit | None = None
        # The byte bound stops a round at the record that reaches it (one record over the
        # bound still goes: it could never fit otherwise).
        while msgs and room > 0 and session.taken_bytes < self.max_taken_bytes:
            record: Any = st.take_first()
            offset = record.offset()
            if offset <= session.last_offset:
                continue  # fetched again before a seek took effect
            session.last_offset = offset
            if session.first_offset is None:
                session.first_offset = offset
            if not tracker.add(offset):
                continue  # finished before the takeover or restart
            room -= 1
            if tags is not None and not tags.matches(record.headers()):
                skipped.append(offset)
                continue
            session.taken_bytes += size_of(record)
            key = ordering_key(kafka_view(record))
            if last is not None and last.key == key and len(last.records) < batch_size:
                last.records.append(record)
                continue
            last = Unit(key, record, session)
            units.append(last)
        return units

    def _end(self, q: LiveQueue, session: Session) -> None:
        """Drop the waiting units; let the calls in flight finish while the lease lasts
        (their completions commit); then nothing of this session counts any more."""
        self._pool.drop(q.tp)
        deadline = time.monotonic() + REVOKE_WAIT_CAP_S

        def give_up() -> bool:
            now = time.monotonic()
            with q.cv:  # a lost or lapsed lock: the calls' outcomes cannot commit anyway
                return (
                    now >= deadline
                    or session.epoch != q.state.epoch
                    or not (q.state.held and now < q.state.deadline)
                    or q.state.phase is QueuePhase.LOST
                )

        if not self._pool.wait_idle(session, give_up):
            log.warning(
                "%s: %d listener calls still running at the end of lock epoch %d; "
                "their outcome will not be committed",
                q.where,
                session.in_flight,
                session.epoch,
            )
        with q.cv:
            session.closed = True

    # -- status ---------------------------------------------------------------------------------
    def status(self, q: LiveQueue, base: PartitionStatus) -> PartitionStatus:
        """``base`` (the queue's lock and commit view) with the key mode's fields."""
        session = self._sessions.get(q.tp)
        keys = self._pool.keys_status().get(q.tp)
        if session is None:
            return base
        with q.cv:
            tracker = session.tracker.status()
        return dataclasses.replace(
            base,
            queued=base.queued + (keys.queued if keys else 0),
            in_flight=session.in_flight,
            in_flight_keys=keys.in_flight_keys if keys else 0,
            offset_gap=tracker.gap,
            back_pressure=tracker.back_pressure or (session.taken_bytes >= self.max_taken_bytes),
            suspended=bool(keys and keys.suspended_keys),
        )
