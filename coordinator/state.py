"""Pending-transaction state of one half/op partition pair: pure, clock passed in.

This is RocketMQ's ``TransactionalMessageServiceImpl.check`` reshaped for Kafka: the
coordinator feeds half records and Op records in, and gets back :class:`Action` values to
write in one Kafka transaction. It also computes the offsets to commit with them:
``half_commit`` (RocketMQ's halfOffset, the lowest unresolved half offset) and
``op_commit`` (opOffset, the lowest Op record still needed to rebuild this state).


Over 500 physical lines only since ``ruff format`` (one argument a line; under 500 as the
layering test counts them), and kept whole: what is a step of its own already lives in the
mixins it is built from (``ReappendSteps``, ``WaitSteps``, ``RollbackByIdSteps``,
``CopySteps``); the rest is the transition table, read as one."""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from coordinator.actions import (
    Action,
    Discard,
    EndRequest,
    Finish,
    IssueCheck,
    LateCommit,
    Pending,
    Reappend,
    SaveCheckCounts,
    TxnState,
    transition,
)
from coordinator.copies import Copies, CopySteps
from coordinator.discards import Discards, Gone
from coordinator.horizon import Carried, Horizon, ReappendSteps, Recent
from coordinator.members import Assemblies
from coordinator.rollback_ids import RollbackByIdSteps, RollbackIds
from coordinator.waits import DEFER_GRACE_MS, MAX_DEFERRED_ENDS, WaitSteps
from rmq_semantics.records.codec import SystemRecord
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.records.txn import CheckMarker, DoneMarker, DoneMarkers

__all__ = [
    "Action",
    "Discard",
    "Finish",
    "IssueCheck",
    "LateCommit",
    "PartitionState",
    "Reappend",
    "SaveCheckCounts",
    "TxnState",
]

# How many decided offsets per partition are remembered for classifying late decisions.
RECENT_OUTCOMES = 10_000
FORGED_HALF = "the half record at that offset was set aside as forged: no group signed it"


_OUTCOMES = {state.value: state for state in TxnState}


@dataclass
class PartitionState(ReappendSteps, WaitSteps, RollbackByIdSteps, CopySteps):
    """All the coordinator knows about half partition ``p`` and Op partition ``p``.

    Over 300 lines because every input (half records, poison ones, markers, end requests)
    moves the same heaps and offsets to commit: split, each part would reach into them. The
    re-append steps live in :class:`coordinator.horizon.ReappendSteps`, the bounds of what
    waits in :class:`coordinator.waits.WaitSteps`.
    """

    partition: int
    transaction_timeout_ms: int
    check_interval_ms: int
    check_max: int
    retention_ms: int | None = None
    reappend_horizon_ms: int | None = None  # re-append pending records this old (None: never)
    recovering: bool = True
    half_position: int = 0  # next half offset to read
    op_position: int = 0  # next op offset to read
    pending: dict[int, Pending] = field(default_factory=dict)
    # removeMap: half offset -> (op offset of its done marker or None if not read back yet,
    # outcome), for half offsets at or above half_commit.
    decided: dict[int, tuple[int | None, TxnState]] = field(default_factory=dict)
    malformed_half: set[int] = field(default_factory=set)
    # End requests waiting for their half record (or for recovery to end), by half offset,
    # each list in the order read.
    deferred: dict[int, list[EndRequest]] = field(default_factory=dict)
    half_at_end: bool = False
    op_at_end: bool = False
    # Ends of the half partition observed: a COMMIT waiting for members is declared
    # incomplete only after an end observed after it (one read before it is stale: the
    # members were written before the COMMIT, maybe after that end).
    half_eofs: int = 0
    half_eof_ms: int = -1  # when the last one was (a deferred request waits for a later one)
    max_deferred_ends: int = MAX_DEFERRED_ENDS
    counters: Counter = field(default_factory=Counter)
    # Outcomes of recently decided offsets (bounded), to tell a duplicate decision from a
    # conflicting one after the offset left ``decided``.
    outcomes: OrderedDict[int, TxnState] = field(  # bounded on every insert (recovery too)
        default_factory=lambda: Recent(RECENT_OUTCOMES)
    )
    # Discarded half offsets: what an end request read after the discard is (bounded like
    # ``outcomes``).
    discards: Discards = field(default_factory=Discards)
    # Rejected end requests with the reason, for the I/O layer to log and then clear.
    rejections: list[tuple[EndRequest, str]] = field(default_factory=list)
    # Check markers read before their half record (op and half are consumed side by side).
    early_markers: dict[int, tuple[int, int, int, int, int, int]] = field(default_factory=dict)
    _schedule: list[tuple[int, int]] = field(default_factory=list)  # (due ts, half offset)
    # Min-heaps with lazy deletion, so the offsets to commit cost O(log n) per record and not
    # a scan of every pending and decided offset per batch (the scan dominated under load).
    _pending_heap: list[int] = field(default_factory=list)  # half offsets ever pending
    _decided_heap: list[int] = field(default_factory=list)  # half offsets ever decided
    _done_ops: list[tuple[int, int]] = field(default_factory=list)  # (done op, half offset)
    _marker_ops: list[tuple[int, int]] = field(default_factory=list)  # (marker op, half)
    _deferred_ops: list[tuple[int, int]] = field(default_factory=list)  # (end op, half)
    _commit_eofs: dict[int, int] = field(default_factory=dict)  # anchor -> half_eofs then
    _probed_ms: int = -DEFER_GRACE_MS  # when the I/O layer was last asked for a fresh end
    _deferred_count: int = 0  # end requests in ``deferred``
    _deferred_far: list[int] = field(default_factory=list)  # max-heap (negated) of its keys
    horizon: Horizon = field(default_factory=Horizon)  # re-appends, and where txns moved
    # Multi-message transactions: one pending entry at the anchor (its first member read),
    # every member offset unresolved until the whole transaction is.
    assemblies: Assemblies = field(default_factory=Assemblies)
    rolled_back_ids: RollbackIds = field(default_factory=RollbackIds)  # ROLLBACKs by txn id
    copies: Copies = field(default_factory=Copies)  # a half record appended twice

    # -- inputs --------------------------------------------------------------------------
    def start_at(self, half_offset: int, op_offset: int) -> None:
        self.half_position = max(self.half_position, half_offset)
        self.op_position = max(self.op_position, op_offset)

    def on_half(self, offset: int, half: HalfMessage | None, now_ms: int) -> list[Action]:
        """A half record (None: malformed, counted and never promoted)."""
        self.half_position = max(self.half_position, offset + 1)
        self.half_at_end = False
        appended_ms, arrived = (now_ms if half is None else half.timestamp_ms), []
        half, carried = self._split_reappended(half)
        if (copy := self._copy_read(offset, half, carried, now_ms)) is not None:
            return copy
        if half is None:
            self.malformed_half.add(offset)
            self.counters["malformed_half"] += 1
        elif (
            offset not in self.decided
            and offset not in self.pending
            and (offset not in self.assemblies)
        ):
            if half.is_member and (joined := self._join(offset, half, carried, now_ms)) is not None:
                return joined
            self.pending[offset] = Pending(
                half, half.first_check_ts(self.transaction_timeout_ms, now_ms)
            )
            heapq.heappush(self._schedule, (self.pending[offset].next_check_ts, offset))
            heapq.heappush(self._pending_heap, offset)
            arrived = self._new_pending(offset, appended_ms, carried, now_ms)
            if offset in self.early_markers:
                self.on_check_marker(*self.early_markers.pop(offset))
            if carried is None:  # a first arrival whose producer reported it failed
                arrived += self._rolled_back_on_arrival(offset, half)
        elif offset in self.decided:  # read again after its done marker (a restart)
            self.discards.learn(offset, half, None)
        # Only requests for this offset can have become applicable (a scan of every
        # deferred request per half record was quadratic when ends overtake halves).
        return [*self._drain_deferred(now_ms, only=offset), *arrived]

    def _join(
        self, offset: int, half: HalfMessage, carried: Carried | None, now_ms: int
    ) -> list[Action] | None:
        """Member ``half`` joins its transaction: None when it is the first member read
        (the caller makes it pending, as the anchor), else what became applicable."""
        if (closed := self.assemblies.closed(half.txn_id)) is not None:
            return [self._late_member(offset, half, *closed)]
        self._retire_replaced(half, carried)
        anchor, problem = self.assemblies.add(offset, half)
        if anchor == offset:
            return None
        if anchor is None:  # contradicts the members read before it: set aside alone
            self.counters["malformed_member"] += 1
            return self.on_poison_half(offset, half, DiscardReason.MALFORMED, now_ms, problem)
        heapq.heappush(self._pending_heap, offset)
        return [
            *self._drain_deferred(now_ms, only=offset),
            *self._rejoined(anchor, carried, now_ms),
            *self._complete(anchor),
        ]

    def on_poison_half(
        self, offset: int, half: HalfMessage, reason: DiscardReason, now_ms: int, detail: str = ""
    ) -> list[Action]:
        """A half record that must never be promoted (malformed, a system topic as its
        destination). It waits as pending until recovery is over, so a done marker read
        back first keeps it from being set aside twice; then ``due()`` discards it."""
        self.half_position = max(self.half_position, offset + 1)
        self.half_at_end = False
        self.malformed_half.add(offset)  # end requests for it are rejected
        if offset not in self.decided and offset not in self.pending:
            self.pending[offset] = Pending(half, now_ms, poison=reason, detail=detail)
            heapq.heappush(self._schedule, (now_ms, offset))
            heapq.heappush(self._pending_heap, offset)
        else:  # read again after its done marker (a restart): who wrote it, why set aside
            self.discards.learn(offset, half, reason)
        return self._drain_deferred(now_ms, only=offset)

    def set_aside(self, action: Finish | IssueCheck, reason: DiscardReason, detail: str) -> Discard:
        """``action``, a promotion or a check of the batch being written, can never be
        written: discard its half message instead (its done marker says DISCARDED)."""
        if action.half.offset in self.pending:
            return self._discard(action.half.offset, reason, detail)
        members = getattr(action, "members", ())
        for half in members or (action.half,):
            offset = half.offset
            self.decided[offset] = (self.decided.get(offset, (None,))[0], TxnState.DISCARDED)
            self.outcomes[offset] = TxnState.DISCARDED
            self.discards.note(offset, self.op_position - 1, half, reason)
        return Discard(action.half, reason, getattr(action, "checks_answered", 0), detail, members)

    def on_done_marker(self, op_offset: int, half_offset: int, outcome: TxnState) -> None:
        self.op_position = max(self.op_position, op_offset + 1)
        low = self.half_commit
        anchor = self.assemblies.anchor(half_offset)
        if anchor is not None:  # every member is done in the same Kafka transaction
            self._drop_unit(anchor)
        entry = self.pending.pop(half_offset, None)
        self.early_markers.pop(half_offset, None)
        if half_offset >= low:
            self._decide(half_offset, op_offset, outcome)
        self.outcomes[half_offset] = outcome
        if outcome is TxnState.DISCARDED:
            self.discards.note(
                half_offset, op_offset, *((entry.half, entry.poison) if entry else (None, None))
            )

    def on_op_marker(self, op_offset: int, record: SystemRecord) -> bool:
        """A done or check marker read back from Op (the coordinator's own records);
        False when the record is neither."""
        if isinstance(record, DoneMarkers):
            for entry in record.entries:
                self.on_done_marker(op_offset, entry.half_offset, _OUTCOMES[entry.outcome])
        elif isinstance(record, DoneMarker):
            self.on_done_marker(op_offset, record.half_offset, _OUTCOMES[record.outcome])
        elif isinstance(record, CheckMarker):
            self.on_check_marker(
                op_offset,
                record.half_offset,
                record.checks_issued,
                record.checks_answered,
                record.answered_seq,
                record.next_check_ts,
            )
        else:
            return False
        return True

    def on_check_marker(
        self,
        op_offset: int,
        half_offset: int,
        checks_issued: int,
        checks_answered: int,
        answered_seq: int,
        next_check_ts: int,
    ) -> None:
        self.op_position = max(self.op_position, op_offset + 1)
        entry = self.pending.get(half_offset)
        if entry is None:
            if half_offset >= self.half_position and half_offset not in self.decided:
                self.early_markers[half_offset] = (
                    op_offset,
                    half_offset,
                    checks_issued,
                    checks_answered,
                    answered_seq,
                    next_check_ts,
                )
            return
        entry.marker_op_offset = op_offset
        heapq.heappush(self._marker_ops, (op_offset, half_offset))
        if checks_issued >= entry.checks_issued:
            entry.checks_issued = checks_issued
            entry.checks_answered = max(entry.checks_answered, checks_answered)
            entry.answered_seq = max(entry.answered_seq, answered_seq)
            entry.next_check_ts = next_check_ts
            heapq.heappush(self._schedule, (next_check_ts, half_offset))

    def on_malformed_op(self, op_offset: int) -> None:
        self.op_position = max(self.op_position, op_offset + 1)
        self.counters["malformed_op"] += 1

    def on_end_request(self, request: EndRequest, now_ms: int) -> list[Action]:
        self.op_position = max(self.op_position, request.op_offset + 1)
        request = self._to_first_unread(request)
        if self.recovering or request.half_offset >= self.half_position:
            # Wait until every done marker before it (recovery) and the half record are read.
            self._defer(request)
            return []
        return self._apply_end(request, now_ms)

    def on_eof(self, which: str, now_ms: int) -> list[Action]:
        """The consumer reached the end of the half or op partition."""
        if which == "half":
            self.half_at_end = True
            self.half_eofs, self.half_eof_ms = self.half_eofs + 1, now_ms
        else:
            self.op_at_end = True
        if self.recovering and self.half_at_end and self.op_at_end:
            self.recovering = False
        return self._drain_deferred(now_ms)

    # -- decisions -----------------------------------------------------------------------
    def _drain_deferred(self, now_ms: int, only: int | None = None) -> list[Action]:
        """Apply deferred end requests whose half record has been read (all of them, or
        those for half offset ``only``); reject those naming an offset that never came."""
        if self.recovering or not self.deferred:
            return []
        if only is not None:
            offsets = [only] if only in self.deferred else []
        else:
            offsets = list(self.deferred)
        ready: list[EndRequest] = []
        for offset in offsets:
            if offset < self.half_position:
                requests = self.deferred.pop(offset)
                self._deferred_count -= len(requests)
                ready += requests
                continue
            if not self.half_at_end:
                continue
            still = []
            for request in self.deferred[offset]:
                if now_ms - request.received_ms >= DEFER_GRACE_MS and (
                    self.half_eof_ms > request.received_ms
                ):  # an end read after it
                    self.counters["rejected_no_such_offset"] += 1
                    self.rejections.append((request, "no half message at that offset"))
                else:
                    still.append(request)
            self._deferred_count -= len(self.deferred[offset]) - len(still)
            if still:
                self.deferred[offset] = still
            else:
                del self.deferred[offset]
        # In Op order across offsets: one transaction's requests may name several (a copy's,
        # a member's, one it had before a re-append), and the first decision must win.
        return [
            a for r in sorted(ready, key=lambda r: r.op_offset) for a in self._apply_end(r, now_ms)
        ]

    def _apply_end(self, request: EndRequest, now_ms: int) -> list[Action]:
        if request.half_offset < 0:
            return self._end_by_id(request)
        if request.from_check:
            self.counters[f"checks_answered_{request.state.lower()}"] += 1
        request = self._to_first(request)
        # A member's offset (member 0's, when another was read first) names its transaction.
        anchor = self.assemblies.anchor(request.half_offset)
        if anchor is not None and anchor != request.half_offset:
            request = dataclasses.replace(request, half_offset=anchor)
        # Re-appended: readdressed where the transaction is now, or it waits for the record.
        if request.half_offset not in self.pending:
            followed = self.horizon.follow(request)
            if followed is None:
                return []
            request = followed
        offset = request.half_offset
        entry = self.pending.get(offset)
        poison = entry.poison if entry is not None else None
        if poison is not None:
            entry = None  # waiting to be set aside: as good as malformed
        if entry is None:
            if poison is DiscardReason.FORGED or self.discards.forged(offset):
                self.counters["rejected_unauthenticated"] += 1
                self.rejections.append((request, FORGED_HALF))
            elif offset in self.malformed_half:
                self.counters["rejected_not_half"] += 1
                self.rejections.append((request, "the half record at that offset is malformed"))
            elif request.state == "UNKNOWN":
                self.counters["late_unknown"] += 1
            else:
                outcome = self.decided.get(offset, (None, None))[1] or self.outcomes.get(offset)
                gone = self.discards.after(offset, request) or Gone(-1)
                # Late only for the transaction discarded, its record read (not only its
                # done marker, after a restart): else a conflicting decision below.
                if (
                    outcome is TxnState.DISCARDED
                    and request.state == "COMMIT"
                    and gone.txn_id is not None
                ):
                    return self._late_commit(offset, request, gone)
                same = (outcome is TxnState.COMMITTED and request.state == "COMMIT") or (
                    outcome is TxnState.ROLLED_BACK and request.state == "ROLLBACK"
                )
                self._second_decision(request, outcome, same)
            return []
        half = entry.half
        if request.txn_id != half.txn_id or request.producer_group != half.producer_group:
            return self._mismatch(request, half)
        unit = self.assemblies.unit(offset)
        if unit is not None and unit.commit is not None:  # COMMIT was the first decision
            self._second_decision(request, TxnState.COMMITTED, request.state == "COMMIT")
            return []
        if request.state == "COMMIT" and unit is not None and not unit.complete:
            self.assemblies.commit_waits(unit, now_ms, request.op_offset)
            self._commit_eofs[unit.anchor] = self.half_eofs
            return []
        if request.state == "COMMIT":
            return [self._finish(offset, TxnState.COMMITTED)]
        if request.state == "ROLLBACK":
            return [self._finish(offset, TxnState.ROLLED_BACK)]
        # UNKNOWN: an answer counts once, and answers older than a counted one do not
        # (a producer answering a late check and its re-sent successor counts both).
        if (
            not request.from_check
            or request.check_seq > entry.checks_issued
            or (request.check_seq <= entry.answered_seq)
        ):
            self.counters["unknown_ignored"] += 1
            return []
        entry.checks_answered += 1
        entry.answered_seq = request.check_seq
        if entry.checks_answered >= self.check_max:
            return [
                self._discard(
                    offset,
                    DiscardReason.CHECK_MAX,
                    f"{entry.checks_answered} checks answered UNKNOWN",
                )
            ]
        return [
            SaveCheckCounts(
                half,
                entry.checks_issued,
                entry.checks_answered,
                entry.answered_seq,
                entry.next_check_ts,
            )
        ]

    def _late_commit(self, offset: int, request: EndRequest, gone: Gone) -> list[Action]:
        """A COMMIT read after the discard of ``gone``: noted if it is its transaction's."""
        why = gone.mismatch(request)
        if why is not None:
            self.counters["rejected_mismatch"] += 1
            self.rejections.append((request, why))
            return []
        return [
            LateCommit(
                self.partition, offset, request.txn_id, request.producer_group, request.op_offset
            )
        ]

    def _decide(self, offset: int, op_offset: int | None, outcome: TxnState) -> None:
        self.decided[offset] = (op_offset, outcome)
        heapq.heappush(self._decided_heap, offset)
        if op_offset is not None:
            heapq.heappush(self._done_ops, (op_offset, offset))

    def _remember(self, offset: int, outcome: TxnState) -> None:
        self._decide(offset, None, outcome)
        self.outcomes[offset] = outcome  # a Recent: bounded on insert

    def _resolve(self, offset: int, outcome: TxnState) -> tuple[Pending, tuple[HalfMessage, ...]]:
        """Take the transaction pending at ``offset`` out: it and every member it has (all
        their offsets get ``outcome``; no member is ever resolved alone)."""
        entry = self.pending.pop(offset)
        transition(entry.state, outcome)
        self._commit_eofs.pop(offset, None)
        unit = self.assemblies.remove(offset)
        members = unit.ordered() if unit is not None else ()
        for half in members or (entry.half,):
            self._remember(half.offset, outcome)
        return entry, members

    def _finish(self, offset: int, outcome: TxnState) -> Finish:
        entry, members = self._resolve(offset, outcome)
        self._close_unread(members, (outcome, None, ""))
        return Finish(entry.half, outcome, entry.checks_answered, members)

    def _close_unread(self, members: tuple[HalfMessage, ...], outcome: tuple) -> None:
        if members and len(members) < members[0].txn_size:
            self.assemblies.close(members[0].txn_id, outcome)

    def _late_member(
        self,
        offset: int,
        half: HalfMessage,
        outcome: TxnState,
        reason: DiscardReason | None,
        detail: str,
    ) -> Action:
        """A member read after its transaction was rolled back or discarded: the same."""
        self.pending[offset] = Pending(half, 0)
        heapq.heappush(self._pending_heap, offset)
        if reason is not None:
            return self._discard(offset, reason, f"{detail} (a member read after that)")
        return self._finish(offset, outcome)

    def _leave(self, offset: int) -> tuple[Pending, tuple[HalfMessage, ...]]:
        return self._resolve(offset, TxnState.REAPPENDED)  # this offset is done, not the txn

    def _discard(self, offset: int, reason: DiscardReason, detail: str = "") -> Discard:
        entry, members = self._resolve(offset, TxnState.DISCARDED)
        self._close_unread(members, (TxnState.DISCARDED, reason, detail))
        for half in members or (entry.half,):
            self.discards.note(half.offset, self.op_position - 1, half, reason)
        return Discard(entry.half, reason, entry.checks_answered, detail, members)

    def due(self, now_ms: int) -> list[Action]:
        """Checks (and retention discards) whose time has come. None while recovering."""
        if self.recovering:
            return []
        actions: list[Action] = self._drain_deferred(now_ms)
        self._expire_rollback_ids(now_ms)
        actions += self._reappends_due(now_ms)  # before checks: they go to the new offset
        actions += self._incomplete(now_ms)
        while self._schedule and self._schedule[0][0] <= now_ms:
            due_ts, offset = heapq.heappop(self._schedule)
            entry = self.pending.get(offset)
            if entry is None or entry.next_check_ts != due_ts:
                continue  # resolved, or rescheduled (a stale heap entry)
            if entry.poison is not None:
                actions.append(self._discard(offset, entry.poison, entry.detail))
                continue
            unit = self.assemblies.unit(offset)
            if unit is not None and unit.commit is not None:
                continue  # decided: promoted or discarded as its members come or don't
            next_ts = now_ms + self.check_interval_ms
            if self.retention_ms is not None and (
                next_ts >= entry.half.timestamp_ms + self.retention_ms
            ):
                actions.append(
                    self._discard(
                        offset, DiscardReason.RETENTION, "would outlive the half topic's retention"
                    )
                )
                continue
            entry.checks_issued += 1
            entry.next_check_ts = next_ts
            heapq.heappush(self._schedule, (next_ts, offset))
            actions.append(
                IssueCheck(
                    entry.half,
                    entry.checks_issued,
                    entry.checks_issued,
                    entry.checks_answered,
                    entry.answered_seq,
                    next_ts,
                )
            )
        return actions

    def next_due_ms(self) -> int | None:
        return self._schedule[0][0] if self._schedule else None

    # -- offsets to commit ---------------------------------------------------------------
    @property
    def half_commit(self) -> int:
        heap = self._pending_heap
        while heap and heap[0] not in self.pending and heap[0] not in self.assemblies:
            heapq.heappop(heap)
        return heap[0] if heap else self.half_position

    @property
    def op_commit(self) -> int:
        low = self.half_commit
        while self._decided_heap and self._decided_heap[0] < low:
            self.decided.pop(heapq.heappop(self._decided_heap), None)
        if self.malformed_half:
            self.malformed_half = {o for o in self.malformed_half if o >= low}
        needed = [self.op_position]
        done_ops = self._done_ops
        while done_ops and self.decided.get(done_ops[0][1], (None,))[0] != done_ops[0][0]:
            heapq.heappop(done_ops)
        if done_ops:
            needed.append(done_ops[0][0])
        marker_ops = self._marker_ops
        while (
            marker_ops
            and getattr(self.pending.get(marker_ops[0][1]), "marker_op_offset", None)
            != marker_ops[0][0]
        ):
            heapq.heappop(marker_ops)
        if marker_ops:
            needed.append(marker_ops[0][0])
        deferred_ops = self._deferred_ops
        while deferred_ops and not any(
            r.op_offset == deferred_ops[0][0] for r in self.deferred.get(deferred_ops[0][1], ())
        ):
            heapq.heappop(deferred_ops)
        if deferred_ops:
            needed.append(deferred_ops[0][0])
        needed += [m[0] for m in self.early_markers.values()]
        needed += self.assemblies.waiting_ops()
        if (waiting_rollback := self.rolled_back_ids.oldest_op()) is not None:
            needed.append(waiting_rollback)
        needed += self.horizon.waiting_ops()
        return min(needed)
