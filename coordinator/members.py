"""Members of the multi-message transactions of one half partition: which half records
belong to which pending transaction, whether it has all its members, and which member is
inconsistent with the others (DESIGN.md, ``rmq.txn_size`` / ``rmq.txn_index``). Pure.

A transaction of N members is one pending unit, keyed by its *anchor*: the offset of the
first of its members read. Members are written in index order by one producer, so that is
member 0 in every transaction a producer of this library writes; the anchor only differs
when records were written out of order, and then end requests naming member 0's offset
still find the unit through :meth:`Assemblies.anchor`. Reading a half partition always
starts at or below the lowest unresolved member, so a replay finds the same anchors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from rmq_semantics.records.half import HalfMessage

__all__ = ["CLOSED_LIMIT", "Assemblies", "Assembly"]

# Closed transactions remembered per half partition (a restart forgets them: a late member
# is then checked on its own, and the producer answers as it did).
CLOSED_LIMIT = 10_000


@dataclass
class Assembly:
    """The members of one multi-message transaction read so far."""

    anchor: int
    size: int
    members: dict[int, HalfMessage] = field(default_factory=dict)  # by rmq.txn_index
    # A COMMIT read while members were missing: (when it was applied in ms, its Op offset).
    # Promoted once the rest arrives; discarded ``incomplete`` when the partition is at its
    # end and they did not.
    commit: tuple[int, int] | None = None

    @property
    def complete(self) -> bool:
        return len(self.members) == self.size

    def ordered(self) -> tuple[HalfMessage, ...]:
        """The members read, in index order (the order they are promoted in)."""
        return tuple(self.members[i] for i in sorted(self.members))

    @property
    def waiting_since(self) -> int:
        """When the COMMIT waiting for missing members was applied (ms)."""
        return self.commit[0] if self.commit is not None else 0

    @property
    def count(self) -> str:
        """``read/expected``, for logs and discard details."""
        return f"{len(self.members)}/{self.size}"


@dataclass
class Assemblies:
    """The pending multi-message transactions of one half partition."""

    _by_txn: dict[str, int] = field(default_factory=dict)  # txn id -> anchor
    _units: dict[int, Assembly] = field(default_factory=dict)  # anchor -> its members
    _anchor_of: dict[int, int] = field(default_factory=dict)  # member offset -> anchor
    _waiting: set[int] = field(default_factory=set)  # anchors with a COMMIT waiting
    # Transactions resolved while members were unread (rolled back, discarded), bounded:
    # their outcome for a member read later, which would else start a unit of its own and
    # be checked again, with itself as the message the listener sees.
    _closed: OrderedDict[str, tuple] = field(default_factory=OrderedDict)

    def close(self, txn_id: str, outcome: tuple) -> None:
        """``txn_id`` was resolved with members unread: what they get when read."""
        self._closed[txn_id] = outcome
        if len(self._closed) > CLOSED_LIMIT:
            self._closed.popitem(last=False)

    def closed(self, txn_id: str) -> tuple | None:
        return self._closed.get(txn_id)

    def add(self, offset: int, half: HalfMessage) -> tuple[int | None, str]:
        """Member ``half`` read at ``offset``: (its unit's anchor, ""), the anchor being
        ``offset`` when it starts a new unit; or (None, why) when it contradicts the
        members read before it (it is then malformed and joins nothing)."""
        anchor = self._by_txn.get(half.txn_id)
        if anchor is None:
            self._by_txn[half.txn_id] = offset
            self._units[offset] = Assembly(offset, half.txn_size, {half.txn_index: half})
            self._anchor_of[offset] = offset
            return offset, ""
        unit = self._units[anchor]
        first = unit.members[next(iter(unit.members))]
        if half.txn_size != unit.size:
            return None, (
                f"rmq.txn_size={half.txn_size} differs from the {unit.size} of the "
                f"member at offset {first.offset}"
            )
        if half.txn_index in unit.members:
            return None, (
                f"a second member with rmq.txn_index={half.txn_index} (the first "
                f"at offset {unit.members[half.txn_index].offset})"
            )
        if half.producer_group != first.producer_group:
            return None, (
                f"producer group {half.producer_group!r} differs from the "
                f"{first.producer_group!r} of the member at offset {first.offset}"
            )
        unit.members[half.txn_index] = half
        self._anchor_of[offset] = anchor
        return anchor, ""

    def replaced(self, half: HalfMessage, previous_offset: int) -> int | None:
        """The anchor of the unit holding the member that ``half``, a coordinator's
        re-append of it, replaces: the same transaction, group and index at
        ``previous_offset``; None when no unit holds it (its done marker was read)."""
        anchor = self._anchor_of.get(previous_offset)
        held = self._units[anchor].members.get(half.txn_index) if anchor is not None else None
        if (
            held is None
            or held.offset != previous_offset
            or (held.txn_id, held.producer_group) != (half.txn_id, half.producer_group)
        ):
            return None
        return anchor

    def anchor(self, offset: int) -> int | None:
        """The anchor of the pending unit the member at ``offset`` belongs to."""
        return self._anchor_of.get(offset)

    def unit(self, anchor: int) -> Assembly | None:
        return self._units.get(anchor)

    def remove(self, anchor: int) -> Assembly | None:
        """The unit at ``anchor`` is resolved: forget it and its members."""
        unit = self._units.pop(anchor, None)
        self._waiting.discard(anchor)
        if unit is None:
            return None
        for half in unit.members.values():
            self._anchor_of.pop(half.offset, None)
        if self._by_txn.get(unit.ordered()[0].txn_id) == anchor:
            del self._by_txn[unit.ordered()[0].txn_id]
        return unit

    def commit_waits(self, unit: Assembly, now_ms: int, op_offset: int) -> None:
        """A COMMIT for ``unit``, which lacks members: it waits for them."""
        unit.commit = (now_ms, op_offset)
        self._waiting.add(unit.anchor)

    def waiting_commits(self) -> Iterator[Assembly]:
        """Units with a COMMIT waiting for missing members."""
        return (self._units[a] for a in sorted(self._waiting))

    def waiting_ops(self) -> list[int]:
        """Op offsets of COMMITs waiting for members: not to be committed past."""
        commits = (self._units[a].commit for a in self._waiting)
        return [commit[1] for commit in commits if commit is not None]

    def __contains__(self, offset: object) -> bool:
        return offset in self._anchor_of

    def __len__(self) -> int:
        return len(self._units)
