"""The timing wheel's decisions for one timer partition: pure, clock passed in.

A timer partition p is read from several *lanes*: the intake topic (level 0) and the level
topics ``<prefix>_timer_<L>`` (L = 1..max_level), each at partition p. A record on level L
is *released* at its append time (LogAppendTime, non-decreasing along a partition) plus
``2^(L-1)`` s; on the intake topic at once. At release, with ``R = deliver_at - now``:

- ``R <= 0``: deliver it to its real topic;
- ``R < 1.25 s``: hold it in the due-heap and deliver it at its time;
- else: append it again to level ``floor(log2((R - 0.25 s)_s)) + 1``, whose hold is at most
  R - 0.25 s, so no hop ever overshoots the time, even by its own delays (the lead), and
  each hop about halves what is left (the arithmetic is the wire contract's:
  :mod:`rmq_semantics.records.timer`).

A cancelled record (its id cancelled by its own group) is dropped instead of delivered; a
malformed or refused one is discarded with a reason; one whose id this service delivered
before, in a transaction that committed, is skipped once the service has read that delivery
back (see :class:`Delivered`: a broker can lose a committed transaction's offsets, and the
replay that follows reads the record again).
Each of these is an :class:`Action` the service writes in one Kafka transaction with the
lanes' offsets (:meth:`offsets`).

A lane whose next record is not released yet is *blocked*: the service pauses it, the wheel
forgets that record and re-reads it from its offset once the time has come, so only heads
and the due-heap are in memory, whatever the number of scheduled records.

Offsets: records finish out of order (a held one stays unfinished while later ones are
delivered), so each lane keeps an :class:`~rmq_semantics.orderly.offsets.OffsetTracker`: its
committed offset is the lowest unfinished record, and the finished ones above it travel in
the commit metadata, so a restart skips them and redoes only the unfinished ones. A lane
stops taking records while that span would outgrow the metadata (back-pressure), so the
field is never truncated: nothing finished is ever redone.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum

from rmq_semantics.errors import IllegalStateError
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.records.timer import hold_ms, level_for

__all__ = [
    "HOLD_BELOW_MS",
    "INTAKE",
    "Action",
    "Cancels",
    "Delivered",
    "Incoming",
    "PartitionWheel",
    "Step",
    "TimerEntry",
    "once_per_step",
]

#: The intake topic is lane 0; the level topics are lanes 1..max_level.
INTAKE = 0
#: Records due within this long are held in memory rather than appended to a level.
HOLD_BELOW_MS = 1000
#: A re-append aims this far before the time: the hop's own delays (its append, the lane's
#: resume and fetch) then end before the time, in the due-heap, not after it, where the
#: record would be late by them (docs/benchmarks.md, timer lateness).
HOP_LEAD_MS = 250
# Offsets a lane may span from its lowest unfinished record to its last one taken: a raw
# bitmap of that span (1.5 KB, 2 KB in base64) always fits OffsetTracker's 3000-byte field,
# so a commit never drops a done offset (which would deliver that record again).
MAX_LANE_SPAN = 12_000
# A time this far beyond the maximum delay from now is discarded as too far (the service
# also refuses one further than that from its birth); closer, it hops down from the top level.
TOO_FAR_GRACE_MS = 60_000


class Step(Enum):
    """What is done with one released record."""

    DELIVER = "deliver"
    REAPPEND = "reappend"
    DROP = "drop"  # cancelled by its own group
    SKIP = "skip"  # delivered before by this service (a replay read it again): verify, skip
    DISCARD = "discard"  # malformed or refused: to the discard topic, with a reason


@dataclass(frozen=True, slots=True)
class TimerEntry:
    """What the wheel needs of a timer record; ``payload`` is the service's (the decoded
    record to write), never read here."""

    timer_id: str
    group: str
    deliver_at: int
    payload: object = None


@dataclass(frozen=True, slots=True)
class Incoming:
    """One record read from lane ``level`` at ``offset``, appended at ``append_ts``: a
    decoded ``entry``, or ``problem`` (a discard reason) and the raw ``payload``."""

    level: int
    offset: int
    append_ts: int
    entry: TimerEntry | None = None
    problem: str | None = None
    payload: object = None


@dataclass(frozen=True, slots=True)
class Action:
    """One step to write: ``level`` is the target of a re-append; ``reason`` that of a
    discard; ``lane``/``offset`` name the record it finishes."""

    step: Step
    lane: int
    offset: int
    entry: TimerEntry | None
    level: int = 0
    reason: str = ""
    payload: object = None


class Cancels:
    """Cancelled ids, by (id, group): read from the cancel partition on assignment and
    after, each kept until the longest a message can wait has passed since it was written.
    Outlives replays (it is not written by the service's transactions)."""

    def __init__(self, keep_ms: int) -> None:
        self.keep_ms = keep_ms
        self._until: dict[tuple[str, str], int] = {}
        self._expiry: list[tuple[int, str, str]] = []

    def add(self, timer_id: str, group: str, written_ts: int) -> None:
        until = written_ts + self.keep_ms
        key = (timer_id, group)
        if self._until.get(key, -1) < until:
            self._until[key] = until
            heapq.heappush(self._expiry, (until, timer_id, group))

    def cancelled(self, entry: TimerEntry) -> bool:
        return (entry.timer_id, entry.group) in self._until

    def expire(self, now: int) -> int:
        """Forget cancels older than the longest wait; returns how many went."""
        gone = 0
        while self._expiry and self._expiry[0][0] <= now:
            until, timer_id, group = heapq.heappop(self._expiry)
            if self._until.get((timer_id, group)) == until:
                del self._until[(timer_id, group)]
                gone += 1
        return gone

    def __len__(self) -> int:
        return len(self._until)


#: Where a delivery landed: (topic, partition, offset); None when unknown.
Where = tuple[str, int, int] | None


class Delivered:
    """The last ``keep`` ids this service delivered from one timer partition, in
    transactions that committed, with where each delivery landed. Outlives replays, not a
    revocation.

    Kafka 4.4 was seen to acknowledge a transaction's commit during its controlled shutdown
    and then lose that commit's markers: on ``__consumer_offsets`` only (the delivery stays
    committed, its offsets are aborted with the next epoch's transaction, and the replay reads
    the record again: a duplicate unless skipped), or everywhere (the delivery is aborted too:
    a loss if skipped). So a record read again is a :attr:`Step.SKIP`, and the service
    delivers it after all unless it reads the earlier delivery back
    (docs/operations/failure-modes.md)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._ids: OrderedDict[tuple[str, str], Where] = OrderedDict()

    def add(self, timer_id: str, group: str, where: Where = None) -> None:
        self._ids[(timer_id, group)] = where
        self._ids.move_to_end((timer_id, group))
        while len(self._ids) > self.keep:
            self._ids.popitem(last=False)

    def forget(self, timer_id: str, group: str) -> None:
        self._ids.pop((timer_id, group), None)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def before(self, entry: TimerEntry) -> bool:
        return (entry.timer_id, entry.group) in self._ids

    def where(self, entry: TimerEntry) -> Where:
        return self._ids.get((entry.timer_id, entry.group))

    def __len__(self) -> int:
        return len(self._ids)


@dataclass
class _Lane:
    tracker: OffsetTracker
    # Where reading resumes once unblocked (None: the log's beginning); the record there
    # is the blocked head, forgotten meanwhile.
    resume_offset: int | None
    blocked: bool = True  # every lane starts paused, until the cancels are loaded
    until: int = 0  # blocked until this time (ms)
    paused: bool = False  # the service was told to pause it


@dataclass
class PartitionWheel:
    """Timer partition ``partition``: its lanes, their offsets and its due-heap.

    ``start(level, offset, metadata)`` each lane from its committed offset; records go in
    through :meth:`on_record`, time through :meth:`due`; :meth:`to_pause` and
    :meth:`to_resume` say which lanes the service pauses, seeks and resumes."""

    partition: int
    max_level: int
    max_delay_ms: int
    cancels: Cancels
    delivered: Delivered = field(default_factory=lambda: Delivered(0))
    ready: bool = False  # the cancel partition was read to its end
    _lanes: dict[int, _Lane] = field(default_factory=dict)
    _due: list[tuple[int, int, int, Incoming]] = field(default_factory=list)

    # -- lanes ---------------------------------------------------------------------------
    def start(self, level: int, committed: int, metadata: str | None = None) -> None:
        """Lane ``level`` starts at its committed offset (negative: none, the beginning);
        the done offsets in ``metadata`` are skipped."""
        if not 0 <= level <= self.max_level:
            raise IllegalStateError(f"timer lane {level} is not in 0..{self.max_level}")
        where = f"timer lane {level}[{self.partition}]"
        tracker = OffsetTracker.restore(committed, metadata, where=where, max_span=MAX_LANE_SPAN)
        self._lanes[level] = _Lane(tracker, committed if committed >= 0 else None)

    @property
    def lanes(self) -> list[int]:
        return sorted(self._lanes)

    def to_pause(self) -> list[int]:
        """Lanes newly blocked, for the service to pause (each named once)."""
        out = []
        for level, lane in self._lanes.items():
            if lane.blocked and not lane.paused:
                lane.paused = True
                out.append(level)
        return out

    def to_resume(self, now: int) -> list[tuple[int, int | None]]:
        """(lane, offset to seek: None for the beginning) of blocked lanes whose head is
        released by now and that may take records again; they count as reading from here."""
        if not self.ready:
            return []
        out = []
        for level, lane in self._lanes.items():
            if lane.blocked and lane.until <= now and lane.tracker.accepting():
                lane.blocked = lane.paused = False
                out.append((level, lane.resume_offset))
        return out

    def next_release(self) -> int | None:
        """The earliest time a blocked lane is released (None: none waits on time)."""
        times = [lane.until for lane in self._lanes.values() if lane.blocked and lane.until]
        return min(times) if times else None

    # -- records -------------------------------------------------------------------------
    def wants(self, level: int, offset: int) -> bool:
        """Whether the record at ``offset`` of lane ``level`` is read now: not while the lane
        is blocked (it is read again from the head on resume), nor one read before (a seek
        back to a blocked head re-reads nothing else). The service asks before it parses."""
        lane = self._lanes.get(level)
        if lane is None or lane.blocked:
            return False
        nxt = lane.tracker.next_offset
        return nxt is None or offset >= nxt

    def on_record(self, rec: Incoming, now: int) -> list[Action]:
        """One record read from its lane: the actions it causes now (none while it waits)."""
        if not self.wants(rec.level, rec.offset):
            return []
        lane = self._lanes[rec.level]
        tracker = lane.tracker
        if not tracker.accepting():
            return self._block(lane, rec.offset, 0)
        if rec.problem is None and rec.entry is not None and rec.level != INTAKE:
            release = rec.append_ts + hold_ms(rec.level)
            if release > now:
                return self._block(lane, rec.offset, release)
        lane.resume_offset = rec.offset + 1
        if not tracker.add(rec.offset):
            return []  # finished before a restart (the commit's done offsets)
        return self._release(rec, now)

    def _block(self, lane: _Lane, offset: int, until: int) -> list[Action]:
        lane.blocked, lane.until, lane.resume_offset = True, until, offset
        return []

    def _release(self, rec: Incoming, now: int) -> list[Action]:
        entry = rec.entry
        if rec.problem is not None or entry is None:
            return [self._finish(rec, Step.DISCARD, reason=rec.problem or "malformed")]
        remaining = entry.deliver_at - now
        if rec.level == INTAKE and remaining > self.max_delay_ms + TOO_FAR_GRACE_MS:
            return [self._finish(rec, Step.DISCARD, reason="too_far")]
        if self.delivered.before(entry):
            return [self._finish(rec, Step.SKIP)]
        if self.cancels.cancelled(entry):
            return [self._finish(rec, Step.DROP)]
        if remaining <= 0:
            return [self._finish(rec, Step.DELIVER)]
        if remaining < HOLD_BELOW_MS + HOP_LEAD_MS:
            heapq.heappush(self._due, (entry.deliver_at, rec.level, rec.offset, rec))
            return []
        level = min(level_for(remaining - HOP_LEAD_MS), self.max_level)
        return [self._finish(rec, Step.REAPPEND, level=level)]

    def _finish(self, rec: Incoming, step: Step, *, level: int = 0, reason: str = "") -> Action:
        lane = self._lanes[rec.level]
        if not lane.tracker.done(rec.offset):
            raise IllegalStateError(
                f"timer lane {rec.level}[{self.partition}]@{rec.offset} finished twice"
            )
        return Action(step, rec.level, rec.offset, rec.entry, level, reason, rec.payload)

    def due(self, now: int) -> list[Action]:
        """Held records whose time has come: delivered (or dropped, if cancelled since)."""
        out = []
        while self._due and self._due[0][0] <= now:
            _, _, _, rec = heapq.heappop(self._due)
            entry = rec.entry
            if entry is not None and self.delivered.before(entry):
                out.append(self._finish(rec, Step.SKIP))
                continue
            cancelled = entry is not None and self.cancels.cancelled(entry)
            out.append(self._finish(rec, Step.DROP if cancelled else Step.DELIVER))
        return out

    def next_due(self) -> int | None:
        """When the earliest held record is due (None: none held)."""
        return self._due[0][0] if self._due else None

    @property
    def held(self) -> int:
        return len(self._due)

    # -- offsets -------------------------------------------------------------------------
    def offsets(self) -> dict[int, tuple[int, str]]:
        """Per lane with a known position: (offset to commit, metadata naming the finished
        records above it)."""
        out = {}
        for level, lane in self._lanes.items():
            commit = lane.tracker.committable()
            if commit is not None:
                out[level] = commit
        return out

    def unfinished(self, level: int) -> int | None:
        """The lowest unfinished offset of lane ``level`` (None: unknown yet)."""
        return self._lanes[level].tracker.lowest_unfinished


def once_per_step(actions: list[Action]) -> list[Action]:
    """``actions`` with every delivery of an id after its first one in the step skipped:
    two copies of one record (re-appended twice after its transaction's offsets were lost)
    can fall due together, before :class:`Delivered` knows of either."""
    seen: set[tuple[str, str]] = set()
    out = []
    for action in actions:
        entry = action.entry
        if action.step is Step.DELIVER and entry is not None:
            key = (entry.timer_id, entry.group)
            if key in seen:
                action = Action(Step.SKIP, action.lane, action.offset, entry, 0, "", action.payload)
            seen.add(key)
        out.append(action)
    return out
