"""Copies of a half record: one transaction's record appended again at another offset.

An idempotent producer's retry is a copy the broker did not recognise: the fault campaign
(seed 1) saw a half record land twice, at consecutive offsets, when a controller kill moved
the partition's leader under an in-flight produce. Each copy would be checked, answered
COMMIT (the local transaction did commit) and promoted: the message visible twice.

Pure, like :mod:`coordinator.state`: the first record of a single-message transaction read
in a partition is its transaction; a later first arrival with the same id (not a
coordinator's re-append, not a member of a multi-message transaction: those have their own
bookkeeping; a record ``txn redrive`` wrote is its own) is rolled back at once, counted and
never promoted, and an end request naming the copy's offset decides the first record
instead. Remembered per partition for the last :data:`FIRST_OFFSETS_KEEP` transactions,
from where a coordinator took the partition over: a copy read right after a takeover whose
first record lies below the committed offset is checked as a transaction of its own (a copy
lands within the producer's in-flight window of its first, so the takeover must fall in
between).
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import TYPE_CHECKING

from coordinator.actions import Action, EndRequest, Pending, TxnState
from coordinator.horizon import Recent
from rmq_semantics.records.headers import H

if TYPE_CHECKING:  # the state this mixes into
    from collections import Counter

    from coordinator.actions import Finish
    from rmq_semantics.records.half import HalfMessage

__all__ = ["FIRST_OFFSETS_KEEP", "Copies", "CopySteps"]

# Transactions per partition whose first half offset is remembered (about 100 bytes each).
FIRST_OFFSETS_KEEP = 50_000


def _identity(half: HalfMessage) -> tuple[str, bytes]:
    """What makes a half record a transaction's: its id, and for a record ``txn redrive``
    wrote (an operator asking for a discarded transaction to be checked again) the record it
    re-drives."""
    return half.txn_id, next((v or b"" for k, v in half.headers if k == H.REDRIVE_OF), b"")


@dataclasses.dataclass
class Copies:
    """First offsets by transaction (see _identity), copies by offset, and the copies read
    since the I/O layer last logged them (copy offset, first offset, transaction id)."""

    first: Recent = dataclasses.field(default_factory=lambda: Recent(FIRST_OFFSETS_KEEP))
    of: Recent = dataclasses.field(default_factory=lambda: Recent(FIRST_OFFSETS_KEEP))
    read: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)


class CopySteps:
    """The steps of :class:`coordinator.state.PartitionState` for copies of half records."""

    if TYPE_CHECKING:
        pending: dict[int, Pending]
        decided: dict[int, tuple[int | None, TxnState]]
        counters: Counter
        copies: Copies
        half_position: int
        _pending_heap: list[int]

        def _finish(self, offset: int, outcome: TxnState) -> Finish: ...
        def _drain_deferred(self, now_ms: int, only: int | None = None) -> list[Action]: ...

    def _copy_read(
        self, offset: int, half: HalfMessage | None, carried: object, now_ms: int
    ) -> list[Action] | None:
        """None when the half record at ``offset`` is to be read as usual: its transaction's
        first (or known here already), a re-append (``carried``), a member, malformed; else
        what its rollback as a copy does."""
        if half is None or carried is not None or half.is_member:
            return None
        first = self.copies.first.get(key := _identity(half))
        if first is None:
            self.copies.first[key] = offset
            return None
        if first == offset:
            return None
        self.copies.of[offset] = first
        if offset in self.decided or offset in self.pending:  # read again after a restart
            return None
        return self._roll_back_copy(offset, half, first, now_ms)

    def _roll_back_copy(
        self, offset: int, half: HalfMessage, first: int, now_ms: int
    ) -> list[Action] | None:
        """The copy at ``offset`` of the record at ``first``: rolled back, counted."""
        self.counters["duplicate_half"] += 1
        self.copies.read.append((offset, first, half.txn_id))
        self.pending[offset] = Pending(half, 0)
        heapq.heappush(self._pending_heap, offset)
        return [
            self._finish(offset, TxnState.ROLLED_BACK),
            *self._drain_deferred(now_ms, only=offset),
        ]

    def _to_first_unread(self, request: EndRequest) -> EndRequest:
        """A request naming a half offset not read yet, for a transaction of one whose first
        record was read: a record there with its id can only be a copy, so the request
        decides the first record now. Waiting for the copy, later requests for the first
        record (check answers) would overtake it: the first decision must win."""
        first = self.copies.first.get((request.txn_id, b""))
        if first is None or request.half_offset < max(self.half_position, first + 1):
            return request
        return dataclasses.replace(request, half_offset=first)

    def _to_first(self, request: EndRequest) -> EndRequest:
        """An end request naming a copy decides its transaction's first record."""
        first = self.copies.of.get(request.half_offset)
        return request if first is None else dataclasses.replace(request, half_offset=first)
