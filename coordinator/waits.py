"""What waits in a half partition's pending state, and its bounds (a mixin of
:class:`coordinator.state.PartitionState`): end requests deferred until their half record is
read, at most ``max_deferred_ends``; COMMITs waiting for members, declared incomplete only
after an end of the half partition read after them; a second, conflicting decision is
reported with both. Pure."""

from __future__ import annotations

import heapq
from collections import Counter
from typing import TYPE_CHECKING

from coordinator.actions import TxnState
from coordinator.members import Assemblies
from rmq_semantics.records.reasons import DiscardReason

if TYPE_CHECKING:  # the state machine imports this module
    from coordinator.actions import Discard, EndRequest, Finish
    from rmq_semantics.records.half import HalfMessage

__all__ = ["DEFER_GRACE_MS", "MAX_DEFERRED_ENDS", "WaitSteps"]

# A deferred end request whose half offset is still unseen after this long, while the half
# partition reports it is at its end, names an offset that does not exist.
DEFER_GRACE_MS = 2000
# End requests waiting for their half record, at most (CoordinatorSettings.max_deferred_ends).
MAX_DEFERRED_ENDS = 100_000


class WaitSteps:
    """The bounded waits of :class:`coordinator.state.PartitionState`, which owns every
    attribute used here."""

    deferred: dict[int, list[EndRequest]]
    max_deferred_ends: int
    counters: Counter
    rejections: list[tuple[EndRequest, str]]
    assemblies: Assemblies
    half_at_end: bool
    half_eofs: int
    half_eof_ms: int
    _deferred_count: int
    _deferred_far: list[int]
    _deferred_ops: list[tuple[int, int]]
    _commit_eofs: dict[int, int]
    _probed_ms: int

    if TYPE_CHECKING:

        def _discard(self, offset: int, reason: DiscardReason, detail: str = "") -> Discard: ...
        def _finish(self, offset: int, outcome: TxnState) -> Finish: ...

    def _complete(self, anchor: int) -> list[Finish]:
        """A member arrived: a COMMIT that waited for the last one promotes them all now."""
        unit = self.assemblies.unit(anchor)
        if unit is None or unit.commit is None or not unit.complete:
            return []
        return [self._finish(anchor, TxnState.COMMITTED)]

    def _second_decision(self, request: EndRequest, first: TxnState | None, same: bool) -> None:
        """A decision after the first one: a duplicate is counted; a conflict is counted and
        logged with both decisions (first decision wins, the second is ignored)."""
        if same:
            self.counters["duplicate_decisions"] += 1
            return
        self.counters["conflicting_decisions"] += 1
        self.rejections.append(
            (
                request,
                f"conflicting decision {request.state} after the "
                f"first one, {getattr(first, 'name', 'forgotten')}: "
                "ignored (the first decision wins)",
            )
        )

    def _mismatch(self, request: EndRequest, half: HalfMessage) -> list:
        """An end request whose transaction id or producer group is not the half's."""
        self.counters["rejected_mismatch"] += 1
        self.rejections.append(
            (
                request,
                f"does not match the half message (txn {half.txn_id}, group {half.producer_group})",
            )
        )
        return []

    def _defer(self, request: EndRequest) -> None:
        """Keep ``request`` until its half record is read (or drop one, when full)."""
        if (
            self._deferred_count >= self.max_deferred_ends
            and (request := self._make_room(request)) is None
        ):
            return
        if request.half_offset not in self.deferred:
            heapq.heappush(self._deferred_far, -request.half_offset)
        self.deferred.setdefault(request.half_offset, []).append(request)
        heapq.heappush(self._deferred_ops, (request.op_offset, request.half_offset))
        self._deferred_count += 1

    def _make_room(self, request: EndRequest) -> EndRequest | None:
        """The deferred set is full: drop the request addressed farthest ahead (forged ones
        name offsets far beyond the partition's end; a real one is just ahead of it), which
        may be ``request`` (then None). A real one dropped only costs its transaction a
        check."""
        while -self._deferred_far[0] not in self.deferred:
            heapq.heappop(self._deferred_far)
        far = -self._deferred_far[0]
        victim = request
        if request.half_offset < far:
            victim = self.deferred[far].pop()
            self._deferred_count -= 1
            if not self.deferred[far]:
                del self.deferred[far]
        self.counters["rejected_deferred_full"] += 1
        self.rejections.append(
            (
                victim,
                f"over max_deferred_ends={self.max_deferred_ends} end "
                "requests wait for their half record: the one "
                "addressed farthest ahead is dropped (a real one's "
                "transaction is checked instead)",
            )
        )
        return None if victim is request else request

    @property
    def deferred_count(self) -> int:
        """End requests waiting for their half record (at most ``max_deferred_ends``)."""
        return self._deferred_count

    def _incomplete(self, now_ms: int) -> list[Discard]:
        """Transactions committed with members missing, once the half partition was read to
        an end observed after the COMMIT, a while after it: those members never came (the
        producer died mid-send); never promoted in part, every member read is set aside."""
        if not self.half_at_end:
            return []
        return [
            self._discard(
                unit.anchor, DiscardReason.INCOMPLETE, f"committed with {unit.count} members read"
            )
            for unit in list(self.assemblies.waiting_commits())
            if now_ms - unit.waiting_since >= DEFER_GRACE_MS
            and self.half_eofs > self._commit_eofs.get(unit.anchor, self.half_eofs)
        ]

    def wants_half_end(self, now_ms: int) -> bool:
        """Whether the I/O layer should read the half partition to its end again (a seek to
        its position): a COMMIT waits for members, or end requests for their half record,
        with no end observed after them, which an idle partition never reports by itself
        (the record was written before its request, maybe after the last end read). At
        most once per grace period."""
        if now_ms - self._probed_ms < DEFER_GRACE_MS:
            return False
        stale_end = self.half_at_end and now_ms - self.half_eof_ms >= DEFER_GRACE_MS
        if not (self._deferred_count and stale_end) and not any(
            self._commit_eofs.get(unit.anchor, self.half_eofs) >= self.half_eofs
            and now_ms - unit.waiting_since >= DEFER_GRACE_MS
            for unit in self.assemblies.waiting_commits()
        ):
            return False
        self._probed_ms = now_ms
        return True
