"""ROLLBACKs by transaction id: an end request with ``half_offset`` -1 that names a
transaction by its id alone. A producer sends one when a half write was reported failed (the
caller was told, the local transaction never ran), so that record is never promoted should it
land anyway: an in-flight produce that timed out may still have been appended (issue 29).

Pure, like :mod:`coordinator.state`: a pending half record with that id is rolled back at
once; otherwise the request is remembered (bounded, ``ROLLBACK_IDS_KEEP_MS``) and the half
record is rolled back when it arrives, never checked. First decision wins as for any end
request: a transaction already decided is not touched.

Remembered per producer group (issue 44): a group's requests never drop or replace another
group's. Each group keeps its newest ``ROLLBACK_IDS_MAX`` per partition; past
``ROLLBACK_IDS_TOTAL`` in all, the oldest of the group holding the most is dropped, so a
group holding no more than that total divided among the groups remembered never loses one
to another's flood. Under tenant isolation a group is one of the tenants file (an end
request of another is rejected unsigned), so the memory is bounded by configuration too.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from coordinator.actions import Action, EndRequest, Finish, Pending, TxnState

if TYPE_CHECKING:  # the state this mixes into
    from collections import Counter

    from coordinator.members import Assemblies
    from rmq_semantics.records.half import HalfMessage

__all__ = [
    "ROLLBACK_IDS_KEEP_MS",
    "ROLLBACK_IDS_MAX",
    "ROLLBACK_IDS_TOTAL",
    "RollbackByIdSteps",
    "RollbackIds",
]

# A half record landing this long after its producer's ROLLBACK was read is checked as any
# other (librdkafka gave up on it before the ROLLBACK was sent: a later landing means a
# broker held an appended record that long). Kept while remembered: its op offset.
ROLLBACK_IDS_KEEP_MS = 15 * 60 * 1000
# Remembered per group and partition at most (its oldest is dropped, counted), as many as a
# producer keeps of its failed half writes (rmq_semantics/unsent.py).
ROLLBACK_IDS_MAX = 10_000
# Remembered per partition in all (about 0.5 KB each, 20 MB): four groups' floods at once.
ROLLBACK_IDS_TOTAL = 4 * ROLLBACK_IDS_MAX

_Key = tuple[str, str]  # (producer group, transaction id)


class _Sizes:
    """The groups by how many requests each holds, so the largest is found at once (sizes
    move by one at a time)."""

    def __init__(self) -> None:
        self._groups: dict[int, dict[str, None]] = {}
        self._max = 0

    def moved(self, group: str, old: int, new: int) -> None:
        if old:
            bucket = self._groups[old]
            del bucket[group]
            if not bucket:
                del self._groups[old]
        if new:
            self._groups.setdefault(new, {})[group] = None
            self._max = max(self._max, new)
        while self._max and self._max not in self._groups:
            self._max -= 1

    def largest(self) -> str:
        return next(iter(self._groups[self._max]))


class RollbackIds:
    """ROLLBACKs by id waiting for their half record, by producer group and transaction id,
    in the order read (so the first one holds the lowest op offset, which stays uncommitted
    while it waits)."""

    def __init__(self, per_group: int = ROLLBACK_IDS_MAX, total: int = ROLLBACK_IDS_TOTAL) -> None:
        self._per_group, self._total = per_group, total
        self._waiting: OrderedDict[_Key, EndRequest] = OrderedDict()
        self._groups: dict[str, OrderedDict[str, None]] = {}  # each group's ids, oldest first
        self._sizes = _Sizes()

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, key: _Key) -> bool:
        return key in self._waiting

    def sizes(self) -> dict[str, int]:
        """How many each group has remembered."""
        return {group: len(ids) for group, ids in self._groups.items()}

    def remember(self, request: EndRequest) -> int:
        """Wait for ``request``'s half record; returns how many older ones were dropped."""
        group = request.producer_group
        self._drop((group, request.txn_id))
        self._waiting[(group, request.txn_id)] = request
        ids = self._groups.setdefault(group, OrderedDict())
        ids[request.txn_id] = None
        self._sizes.moved(group, len(ids) - 1, len(ids))
        dropped = 0
        if len(ids) > self._per_group:
            self._drop((group, next(iter(ids))))
            dropped += 1
        while len(self._waiting) > self._total:
            largest = self._sizes.largest()
            self._drop((largest, next(iter(self._groups[largest]))))
            dropped += 1
        return dropped

    def take(self, group: str, txn_id: str) -> EndRequest | None:
        """``group``'s ROLLBACK of ``txn_id``, forgotten, if it was remembered."""
        return self._drop((group, txn_id))

    def expire(self, now_ms: int) -> int:
        """Forget those read ``ROLLBACK_IDS_KEEP_MS`` ago; returns how many."""
        expired = 0
        while self._waiting:
            key, oldest = next(iter(self._waiting.items()))
            if now_ms - oldest.received_ms < ROLLBACK_IDS_KEEP_MS:
                break
            self._drop(key)
            expired += 1
        return expired

    def oldest_op(self) -> int | None:
        """The op offset a restart must replay from to remember them all again."""
        # Read in op order: the first one holds the lowest op offset.
        return next(iter(self._waiting.values())).op_offset if self._waiting else None

    def _drop(self, key: _Key) -> EndRequest | None:
        request = self._waiting.pop(key, None)
        if request is not None:
            group, txn_id = key
            ids = self._groups[group]
            del ids[txn_id]
            self._sizes.moved(group, len(ids) + 1, len(ids))
            if not ids:
                del self._groups[group]
        return request


class RollbackByIdSteps:
    """The steps of :class:`coordinator.state.PartitionState` for ROLLBACKs by id."""

    if TYPE_CHECKING:
        pending: dict[int, Pending]
        counters: Counter
        rejections: list[tuple[EndRequest, str]]
        assemblies: Assemblies
        recovering: bool
        rolled_back_ids: RollbackIds

        def _finish(self, offset: int, outcome: TxnState) -> Finish: ...
        def _mismatch(self, request: EndRequest, half: HalfMessage) -> list: ...
        def _second_decision(
            self, request: EndRequest, first: TxnState | None, same: bool
        ) -> None: ...

    def _end_by_id(self, request: EndRequest) -> list[Action]:
        """An end request without a half offset (recovery is over: it waited as deferred)."""
        if request.state != "ROLLBACK":
            self.counters["rejected_no_such_offset"] += 1
            self.rejections.append(
                (request, "an end request without a half offset may only ROLLBACK")
            )
            return []
        offset = next(
            (
                o
                for o, e in self.pending.items()
                if e.half.txn_id == request.txn_id and e.poison is None
            ),
            None,
        )
        if offset is None:  # not read yet (or decided already: then it never matches)
            self.counters["rollback_ids_dropped"] += self.rolled_back_ids.remember(request)
            return []
        return self._roll_back_by_id(offset, request)

    def _rolled_back_on_arrival(self, offset: int, half: HalfMessage) -> list[Action]:
        """A half record just made pending at ``offset`` whose ROLLBACK by id came first."""
        if self.recovering or not len(self.rolled_back_ids):
            return []
        request = self.rolled_back_ids.take(half.producer_group, half.txn_id)
        return [] if request is None else self._roll_back_by_id(offset, request)

    def _roll_back_by_id(self, offset: int, request: EndRequest) -> list[Action]:
        half = self.pending[offset].half
        if request.producer_group != half.producer_group:
            return self._mismatch(request, half)
        unit = self.assemblies.unit(offset)
        if unit is not None and unit.commit is not None:  # COMMIT was the first decision
            self._second_decision(request, TxnState.COMMITTED, same=False)
            return []
        return [self._finish(offset, TxnState.ROLLED_BACK)]

    def _expire_rollback_ids(self, now_ms: int) -> None:
        self.counters["rollback_ids_dropped"] += self.rolled_back_ids.expire(now_ms)
