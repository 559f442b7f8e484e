"""The re-append horizon of one half partition: when each pending half record is due to be
written again, and where each re-appended transaction is now. Pure, clock passed in.

A pending half record older than the horizon is written again at the end of its partition
(:class:`Reappend`, one Kafka transaction with a REAPPENDED done marker for its old offset),
so the lowest pending offset, and with it ``half_commit``, ``op_commit`` and the decided
offsets kept in memory, is never older than about one horizon.

A transaction re-appended from offset o to o' is still addressed at o (or any offset it
had in between) by its producer's late end request and by answers to older checks. Those are
readdressed here by transaction id: its record says where it was first written
(``rmq.origin_offset``), so after a restart reading it back is all a new owner needs. Between
the re-append and reading the new record back, requests for it wait here, and their Op
offsets stay uncommitted (:meth:`Horizon.waiting_ops`) until they are applied.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.actions import Action, EndRequest, Pending, Reappend
from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.reappend import Carried, split_reappended

if TYPE_CHECKING:
    from coordinator.members import Assemblies

__all__ = ["Horizon", "Reappend", "ReappendSteps", "Recent"]

# A re-append not read back this long after it was written (the half partition at its end)
# never will be: its waiting requests are applied where they were addressed.
LOST_REAPPEND_MS = 60_000
# How many finished re-appended transactions are remembered, to classify late decisions.
RECENT_FINISHED = 10_000
# Re-appends per step at most, so a backlog (the first start after an upgrade) is spread
# over many Kafka transactions instead of one that outlives the transaction timeout.
MAX_REAPPENDS_PER_STEP = 1000


class Recent(OrderedDict):
    """An insertion-ordered dict that forgets its oldest entries beyond ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: object, value: object) -> None:
        super().__setitem__(key, value)
        if len(self) > self.limit:
            self.popitem(last=False)


@dataclass
class _Moved:
    """Where one re-appended transaction is."""

    origin: int  # the half offset it was first written at
    offset: int  # its current half offset; while in flight, the one it left
    in_flight_since: int | None = None  # ms; None once the new record has been read
    waiting: list[EndRequest] = field(default_factory=list)

    def covers(self, half_offset: int) -> bool:
        return self.origin <= half_offset <= self.offset


@dataclass
class Horizon:
    """Re-append schedule and readdressing of one partition."""

    _due: list[tuple[int, int]] = field(default_factory=list)  # (re-append at ms, offset)
    _moved: dict[str, _Moved] = field(default_factory=dict)  # txn id -> where it is
    _in_flight: set[str] = field(default_factory=set)  # txn ids written, not read back yet
    # txn id -> (origin, last offset) of re-appended transactions since decided, bounded.
    _finished: Recent = field(default_factory=lambda: Recent(RECENT_FINISHED))
    _swept_size: int = 0  # len(_moved) after the last sweep

    # -- schedule ----------------------------------------------------------------------------
    def schedule(self, offset: int, appended_ms: int, now_ms: int, horizon_ms: int | None) -> None:
        """A new pending half record, appended at ``appended_ms`` (its Kafka timestamp; a
        producer clock ahead of ours counts from when we read it)."""
        if horizon_ms is not None:
            start = min(appended_ms, now_ms) if appended_ms > 0 else now_ms  # <= 0: no time
            heapq.heappush(self._due, (start + horizon_ms, offset))

    def due(self, now_ms: int, pending: dict) -> list[int]:
        """Pending half offsets whose horizon has passed, at most
        ``MAX_REAPPENDS_PER_STEP``; the rest on the next call."""
        out: list[int] = []
        while self._due and self._due[0][0] <= now_ms and len(out) < MAX_REAPPENDS_PER_STEP:
            offset = heapq.heappop(self._due)[1]
            if offset in pending:  # else resolved meanwhile
                out.append(offset)
        return out

    def compact(self, pending: dict) -> None:
        """Drop schedule entries of resolved offsets once they are most of the schedule, and
        move decided transactions out of the map of where transactions are (amortised)."""
        if len(self._due) > 2 * len(pending) + 1024:
            self._due = [entry for entry in self._due if entry[1] in pending]
            heapq.heapify(self._due)
        if len(self._moved) > 2 * self._swept_size + 64:
            for txn_id, moved in list(self._moved.items()):
                if moved.offset not in pending and moved.in_flight_since is None:
                    del self._moved[txn_id]
                    self._finished[txn_id] = (moved.origin, moved.offset)
            self._swept_size = len(self._moved)

    # -- where a transaction is ---------------------------------------------------------------
    def origin(self, txn_id: str, offset: int) -> int:
        """Where the transaction pending at ``offset`` was first written."""
        moved = self._moved.get(txn_id)
        return moved.origin if moved is not None and moved.offset == offset else offset

    def _part(self, txn_id: str, pending: dict) -> _Moved | None:
        """Where ``txn_id`` is, if it moved and is not decided (not a finished life of a
        transaction id written again, as ``txn redrive`` does)."""
        moved = self._moved.get(txn_id)
        live = moved is not None and (moved.in_flight_since is not None or moved.offset in pending)
        return moved if live else None

    def leaving(self, txn_id: str, offset: int, now_ms: int, pending: dict) -> int:
        """The pending record at ``offset`` is being re-appended; returns its origin."""
        origin, waiting = self.origin(txn_id, offset), []
        if (before := self._part(txn_id, pending)) is not None and before.offset != offset:
            # Another part of it moved first (members unread then, read after it moved):
            # one origin, and the requests waiting for that part wait on.
            origin, waiting = min(origin, before.origin), before.waiting
        self._moved[txn_id] = _Moved(origin, offset, now_ms, waiting)
        self._in_flight.add(txn_id)
        return origin

    def arrived(self, txn_id: str, offset: int, origin: int, pending: dict) -> list[EndRequest]:
        """A re-appended record was read at ``offset``: the requests that waited for it,
        readdressed there."""
        before = self._moved.get(txn_id)
        if (part := self._part(txn_id, pending)) is not None:  # moved first (see leaving)
            origin = min(origin, part.origin)
        self._moved[txn_id] = _Moved(origin, offset)
        self._in_flight.discard(txn_id)
        waiting = before.waiting if before is not None else []
        return [dataclasses.replace(r, half_offset=offset) for r in waiting]

    def follow(self, request: EndRequest) -> EndRequest | None:
        """``request`` addressed where its transaction is now (or was last: once decided
        there, the request is classified as a late decision against that offset); None
        while its re-appended record is not read yet (the request waits here)."""
        moved = self._moved.get(request.txn_id)
        if moved is None or not moved.covers(request.half_offset):
            finished = self._finished.get(request.txn_id)
            if finished is not None and finished[0] <= request.half_offset < finished[1]:
                # Decided at its last offset: a late decision is classified against that.
                return dataclasses.replace(request, half_offset=finished[1])
            return request
        if moved.in_flight_since is not None:
            moved.waiting.append(request)
            return None
        if request.half_offset == moved.offset:
            return request
        return dataclasses.replace(request, half_offset=moved.offset)

    def lost(self, now_ms: int) -> list[EndRequest]:
        """Give up on re-appends not read back for ``LOST_REAPPEND_MS`` (call only when the
        half partition is at its end): their waiting requests, as addressed."""
        out: list[EndRequest] = []
        for txn_id in list(self._in_flight):
            moved = self._moved[txn_id]
            since = moved.in_flight_since
            if since is not None and now_ms - since >= LOST_REAPPEND_MS:
                self._in_flight.discard(txn_id)
                del self._moved[txn_id]
                out += moved.waiting
        return out

    def waiting_ops(self) -> list[int]:
        """Op offsets of requests waiting for a re-appended record (not to be committed)."""
        return [r.op_offset for txn_id in self._in_flight for r in self._moved[txn_id].waiting]

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


class ReappendSteps:
    """The re-append steps of :class:`coordinator.state.PartitionState` (a mixin, so that
    class stays within its size): it owns every attribute used here."""

    pending: dict[int, Pending]
    horizon: Horizon
    assemblies: Assemblies
    reappend_horizon_ms: int | None
    half_at_end: bool
    counters: Counter
    _schedule: list[tuple[int, int]]
    decided: dict
    deferred: dict
    early_markers: dict
    _commit_eofs: dict

    if TYPE_CHECKING:

        def _leave(self, offset: int) -> tuple[Pending, tuple[HalfMessage, ...]]: ...
        def _apply_end(self, request: EndRequest, now_ms: int) -> list[Action]: ...
        def on_end_request(self, request: EndRequest, now_ms: int) -> list[Action]: ...

    @property
    def tracked(self) -> int:
        """Transactions held in memory: pending, decided at or above ``half_commit`` (as of
        the last ``op_commit``), end requests deferred, early check markers and re-appends
        not read back yet. With a horizon, bounded by the traffic of about one horizon."""
        return (
            len(self.pending)
            + len(self.decided)
            + len(self.deferred)
            + len(self.early_markers)
            + self.horizon.in_flight
        )

    def _split_reappended(
        self, half: HalfMessage | None
    ) -> tuple[HalfMessage | None, Carried | None]:
        """The producer's record and what a re-append carried; (None, None) when the
        re-append headers are not a coordinator's (malformed)."""
        if half is None:
            return None, None
        try:
            return split_reappended(half)
        except MalformedRecordError:
            self.counters["malformed_reappend"] += 1
            return None, None

    def _new_pending(
        self, offset: int, appended_ms: int, carried: Carried | None, now_ms: int
    ) -> list[Action]:
        """Schedule the re-append of a new pending record; one that is itself a re-append
        gets its check counts back and applies the end requests that waited for it."""
        self.horizon.schedule(offset, appended_ms, now_ms, self.reappend_horizon_ms)
        if carried is None:
            return []
        entry = self.pending[offset]
        entry.checks_issued = carried.checks_issued
        entry.checks_answered = carried.checks_answered
        entry.answered_seq = carried.answered_seq
        entry.next_check_ts = carried.next_check_ts
        heapq.heappush(self._schedule, (carried.next_check_ts, offset))
        actions: list[Action] = []
        for request in self.horizon.arrived(
            entry.half.txn_id, offset, carried.origin_offset, self.pending
        ):
            actions += self.on_end_request(request, now_ms)
        return actions

    def _rejoined(self, anchor: int, carried: Carried | None, now_ms: int) -> list[Action]:
        """A re-appended member joined the unit pending at ``anchor``, another member read
        first: a transaction re-appended with members unread gets those at their first
        offsets, before its re-appended ones. The unit takes the member's check counts
        and where the transaction came from, and the requests that waited for it."""
        if carried is None:
            return []
        entry = self.pending[anchor]
        if carried.checks_issued >= entry.checks_issued:  # as a check marker read back
            entry.checks_issued = carried.checks_issued
            entry.checks_answered = max(entry.checks_answered, carried.checks_answered)
            entry.answered_seq = max(entry.answered_seq, carried.answered_seq)
            if entry.next_check_ts != carried.next_check_ts:
                entry.next_check_ts = carried.next_check_ts
                heapq.heappush(self._schedule, (carried.next_check_ts, anchor))
        actions: list[Action] = []
        for request in self.horizon.arrived(
            entry.half.txn_id, anchor, carried.origin_offset, self.pending
        ):
            actions += self.on_end_request(request, now_ms)
        return actions

    def _drop_unit(self, anchor: int) -> None:
        """The unit pending at ``anchor`` is done (a done marker of one of its members was
        read: they are all written in one Kafka transaction): forget it and its members."""
        self.assemblies.remove(anchor)
        self._commit_eofs.pop(anchor, None)
        self.pending.pop(anchor, None)
        self.early_markers.pop(anchor, None)

    def _retire_replaced(self, half: HalfMessage, carried: Carried | None) -> None:
        """A re-appended member read while the unit of the copies it replaces is still
        assembled: their REAPPENDED done markers, written in the same Kafka transaction as
        it, are in Op but not read yet (a replay reads the half partition ahead of Op). The
        unit is done as those markers will say, so the newer copies assemble on their own
        instead of each being "a second member" of the older ones (campaign seed 2)."""
        if (
            carried is not None
            and (anchor := self.assemblies.replaced(half, carried.previous_offset)) is not None
        ):
            self._drop_unit(anchor)

    def _reappends_due(self, now_ms: int) -> list[Action]:
        actions: list[Action] = []
        for offset in self.horizon.due(now_ms, self.pending):
            if (unit := self.assemblies.unit(offset)) is not None and unit.commit is not None:
                continue  # decided: promoted or discarded incomplete, a grace period away
            entry, members = self._leave(offset)
            half = entry.half
            origin = self.horizon.leaving(half.txn_id, offset, now_ms, self.pending)
            actions.append(
                Reappend(
                    half,
                    Carried(
                        offset,
                        origin,
                        half.timestamp_ms,
                        entry.checks_issued,
                        entry.checks_answered,
                        entry.answered_seq,
                        entry.next_check_ts,
                    ),
                    members,
                )
            )
        if self.half_at_end:
            for request in self.horizon.lost(now_ms):
                actions += self._apply_end(request, now_ms)
        self.horizon.compact(self.pending)
        self._compact_schedule()
        return actions

    def _compact_schedule(self) -> None:
        """Checks of resolved records stay in the heap until due (a long check immunity
        would keep them for hours): rebuild it once they are most of it."""
        if len(self._schedule) > 2 * len(self.pending) + 1024:
            self._schedule = [(e.next_check_ts, o) for o, e in self.pending.items()]
            heapq.heapify(self._schedule)
