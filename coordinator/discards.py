"""Discarded half records, remembered (bounded) to judge an end request read after the
discard: a COMMIT of the transaction that was discarded is a late commit, noted in the
discard topic so ``txn discarded`` shows it; one of another transaction or group is not
(issue 44: a COMMIT for a record set aside as ``forged`` was noted, though no group signed
that record, so no end request for it is authenticated).

Pure, like :mod:`coordinator.state`, which holds one :class:`Discards` per partition.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.actions import EndRequest
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.reasons import DiscardReason

__all__ = ["DISCARDS_KEPT", "Discards", "Gone"]

# Discarded offsets remembered per partition (the oldest forgotten first), as many as the
# outcomes of decided offsets (coordinator/state.py RECENT_OUTCOMES).
DISCARDS_KEPT = 10_000


@dataclass(slots=True)
class Gone:
    """A discarded half record: the last Op offset read before its discard (its done
    marker's when read back: a COMMIT after it is late, one before it caused the discard or
    was read again by a replay), and its transaction when the record itself was read (not
    only its done marker, as after a restart)."""

    op_boundary: int
    txn_id: str | None = None
    producer_group: str | None = None
    forged: bool = False

    def mismatch(self, request: EndRequest) -> str | None:
        """Why ``request`` is not an end request of this transaction, or None."""
        if (request.txn_id, request.producer_group) == (self.txn_id, self.producer_group):
            return None
        return (
            f"does not match the discarded half message (txn {self.txn_id}, "
            f"group {self.producer_group})"
        )


class Discards:
    """Half offsets discarded, oldest first, at most ``kept``."""

    def __init__(self, kept: int = DISCARDS_KEPT) -> None:
        self._kept = kept
        self._gone: dict[int, Gone] = {}

    def __len__(self) -> int:
        return len(self._gone)

    def note(
        self,
        offset: int,
        op_boundary: int,
        half: HalfMessage | None = None,
        reason: DiscardReason | None = None,
    ) -> None:
        """``offset`` discarded by the time Op offset ``op_boundary`` was read (the earliest
        boundary noted counts), its record ``half`` if known, set aside for ``reason``."""
        gone = self._gone.get(offset)
        if gone is None:
            gone = self._gone[offset] = Gone(op_boundary)
            while len(self._gone) > self._kept:
                del self._gone[next(iter(self._gone))]
        gone.op_boundary = min(gone.op_boundary, op_boundary)
        self.learn(offset, half, reason)

    def learn(self, offset: int, half: HalfMessage | None, reason: DiscardReason | None) -> None:
        """The record of a discarded ``offset`` read (again), and why it was set aside."""
        gone = self._gone.get(offset)
        if gone is None:
            return
        if half is not None and gone.txn_id is None:
            gone.txn_id, gone.producer_group = half.txn_id, half.producer_group
        if reason is DiscardReason.FORGED:
            gone.forged = True

    def forged(self, offset: int) -> bool:
        """Whether ``offset`` was set aside as ``forged``: no group signed its record."""
        gone = self._gone.get(offset)
        return gone is not None and gone.forged

    def after(self, offset: int, request: EndRequest) -> Gone | None:
        """The discard of ``offset`` if ``request`` was read after it, else None."""
        gone = self._gone.get(offset)
        return gone if gone is not None and request.op_offset > gone.op_boundary else None
