"""The timing wheel of one timer partition as a state machine (Hypothesis), against a model
of its topics: the intake and level partitions (read_committed: an aborted transaction's
records take offsets but are never read), the cancels, the group's committed offsets with
their metadata, and a service around :class:`PartitionWheel` that reads the lanes it has not
paused, seeks and resumes the ones the wheel releases, and writes each step's actions and
offsets in one transaction (committed, or aborted and replayed).

Rules: schedule a message (due in the past, within a second, seconds away, beyond the
maximum delay), write a malformed record, cancel a message by its own group or another;
the clock; steps (committed or aborted); a step whose commit the broker acknowledges but
whose markers it loses (seen on Kafka 4.4 at a controlled shutdown), on the offsets only or
everywhere, replayed by the same service, which remembers what it delivered and reads a
remembered delivery back before it skips a record; a crash (a new wheel from the committed
offsets, nothing remembered; not while lost offsets are outstanding, a case no service can
recover from); and ``drain``: time runs past every delivery time and the service steps until
nothing moves.

Promises checked after every step: no message delivered before its time, none twice, none
cancelled by its own group before its delivery; every record below a lane's committed
offset, or marked done in its metadata, was finished by a committed transaction. After
``drain``: every message neither cancelled nor refused was delivered (none lost).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator.timer_wheel import (
    HOLD_BELOW_MS,
    HOP_LEAD_MS,
    INTAKE,
    Action,
    Cancels,
    Delivered,
    Incoming,
    PartitionWheel,
    Step,
    TimerEntry,
    once_per_step,
)
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.records.timer import max_level
from tests.model.broken import find_failure

T0 = 1_700_000_000_000
MAX_DELAY_MS = 32_000  # 6 levels: long enough for several hops, short enough to drain
LEVELS = max_level(MAX_DELAY_MS)
GROUP, OTHER = "g", "intruder"
DELAYS = (-500, 0, 1, 300, 999, 1000, 1500, 4000, 9000, 31_000, 10_000_000)
READ_MOST = (1, 3, 50)
DRAIN_STEPS = 400


@dataclass
class Rec:
    offset: int
    append_ts: int
    entry: TimerEntry | None  # None: malformed
    visible: bool = True  # False: written by an aborted transaction


@dataclass
class Service:
    """The Kafka side of the wheel: lane positions and pauses."""

    wheel: PartitionWheel
    position: dict[int, int] = field(default_factory=dict)
    paused: set[int] = field(default_factory=set)


class TimerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.logs: dict[int, list[Rec]] = {lane: [] for lane in range(LEVELS + 1)}
        self.committed: dict[int, tuple[int, str]] = {}
        self.cancel_log: list[tuple[str, str, int]] = []  # (id, group, written)
        self.scheduled: dict[str, int] = {}  # id -> deliver_at
        self.too_far: set[str] = set()
        self.malformed = 0
        self.delivered: dict[str, int] = {}  # id -> when (committed deliveries)
        self.dropped: set[str] = set()
        self.cancelled_at: dict[str, int] = {}  # by its own group, first time
        self.finished: set[tuple[int, int]] = set()  # (lane, offset) by committed txns
        self.refinishable: set[tuple[int, int]] = set()  # finished by a txn whose offsets were lost
        self.lost_pending = False  # a txn's offsets lost, no commit since
        self.memory = Delivered(10_000)  # the service's: outlives replays, not a crash
        self.service = self._restart()

    # -- the service ---------------------------------------------------------------------
    def _restart(self) -> Service:
        """A new owner: lanes from the committed offsets, cancels from the cancel log."""
        cancels = Cancels(2 * MAX_DELAY_MS)
        for timer_id, group, written in self.cancel_log:
            cancels.add(timer_id, group, written)
        wheel = PartitionWheel(0, LEVELS, MAX_DELAY_MS, cancels, self.memory)
        for lane in range(LEVELS + 1):
            offset, metadata = self.committed.get(lane, (-1, ""))
            wheel.start(lane, offset, metadata)
        service = Service(wheel)
        self._moves(service)
        wheel.ready = True  # the cancel partition was read to its end
        self._moves(service)
        return service

    def _moves(self, service: Service) -> None:
        service.paused.update(service.wheel.to_pause())
        for lane, offset in service.wheel.to_resume(self.now):
            service.paused.discard(lane)
            service.position[lane] = 0 if offset is None else offset

    def _read(self, most: int) -> list[Action]:
        service, actions = self.service, []
        self._moves(service)
        for lane in range(LEVELS + 1):
            if lane in service.paused:
                continue
            start = service.position.get(lane, 0)
            taken = 0
            for rec in self.logs[lane][start:]:
                service.position[lane] = rec.offset + 1
                if not rec.visible:
                    continue
                incoming = Incoming(
                    lane,
                    rec.offset,
                    rec.append_ts,
                    rec.entry,
                    None if rec.entry is not None else "malformed",
                )
                actions += service.wheel.on_record(incoming, self.now)
                taken += 1
                if taken >= most:
                    break
        self._moves(service)
        return actions

    def _step(
        self, most: int, commit: bool, lose_offsets: bool = False, lose_all: bool = False
    ) -> None:
        """One step; ``lose_offsets``: the broker acknowledges its commit but loses the
        markers on the offsets (its records stay committed); ``lose_all``: everywhere (its
        records are aborted too). Either way the same service replays, remembering."""
        actions = once_per_step(self._read(most) + self.service.wheel.due(self.now))
        # The service's read-back: a skip of a remembered delivery that is not visible
        # delivers after all (a second copy in one step stays skipped).
        actions = [self._read_back(a) for a in actions]
        self._moves(self.service)
        offsets = self.service.wheel.offsets()
        lose_offsets = lose_offsets or lose_all
        if not commit:
            for action in actions:
                if action.step is Step.REAPPEND:
                    self._append(action.level, action.entry, visible=False)
            self.service = self._restart()  # the replay: from the committed offsets
            return
        for action in actions:
            key = (action.lane, action.offset)
            assert key not in self.finished or key in self.refinishable, (
                f"lane {key[0]}@{key[1]} finished twice"
            )
            self.finished.add(key)
            if lose_offsets:
                self.refinishable.add(key)
            entry = action.entry
            if action.step is Step.DELIVER:
                assert entry is not None
                if not lose_all:
                    self._deliver(entry)
            elif action.step is Step.REAPPEND:
                assert 1 <= action.level <= LEVELS
                self._append(action.level, entry, visible=not lose_all)
            elif action.step is Step.DROP:
                assert entry is not None and entry.timer_id in self.cancelled_at
                if not lose_all:
                    self.dropped.add(entry.timer_id)
            elif action.step is Step.SKIP:
                assert entry is not None
                never = f"{entry.timer_id} skipped, never delivered"
                assert entry.timer_id in self.delivered, never
            elif entry is None:
                assert action.reason == "malformed"
            else:
                assert action.reason == "too_far" and entry.timer_id in self.too_far
        for action in actions:  # after the commit, as the service notes them
            if action.step is Step.DELIVER and action.entry is not None:
                self.memory.add(action.entry.timer_id, action.entry.group)
        if lose_offsets:  # the records are committed, the offsets are not: a replay
            self.lost_pending = True
            self.service = self._restart()
            return
        self.lost_pending = False
        self.committed.update(offsets)
        self._check_offsets()

    def _read_back(self, action: Action) -> Action:
        entry = action.entry
        if (
            action.step is Step.SKIP
            and entry is not None
            and self.memory.before(entry)
            and entry.timer_id not in self.delivered
        ):
            self.memory.forget(entry.timer_id, entry.group)
            return Action(Step.DELIVER, action.lane, action.offset, entry)
        return action

    def _deliver(self, entry: TimerEntry) -> None:
        timer_id = entry.timer_id
        assert timer_id not in self.delivered, f"{timer_id} delivered twice"
        assert self.now >= entry.deliver_at, (
            f"{timer_id} delivered at {self.now - T0}, before its time {entry.deliver_at - T0}"
        )
        cancelled = self.cancelled_at.get(timer_id)
        assert cancelled is None, f"{timer_id} delivered though cancelled at {cancelled - T0}"
        assert timer_id not in self.too_far
        self.delivered[timer_id] = self.now

    def _append(self, lane: int, entry: TimerEntry | None, visible: bool = True) -> None:
        log = self.logs[lane]
        log.append(Rec(len(log), self.now, entry, visible))

    def _check_offsets(self) -> None:
        """Nothing below a committed offset, nor marked done above it, is unfinished."""
        for lane, (offset, metadata) in self.committed.items():
            done = OffsetTracker.restore(offset, metadata)
            for rec in self.logs[lane]:
                if rec.visible and (rec.offset < offset or done.is_done(rec.offset)):
                    assert (lane, rec.offset) in self.finished, (
                        f"lane {lane}: committed offset {offset} passes unfinished "
                        f"record {rec.offset}"
                    )

    # -- rules ---------------------------------------------------------------------------
    @rule(delay=st.sampled_from(DELAYS))
    def schedule(self, delay: int) -> None:
        timer_id = f"m{len(self.scheduled)}"
        deliver_at = self.now + delay
        self.scheduled[timer_id] = deliver_at
        if delay > MAX_DELAY_MS + 60_000:
            self.too_far.add(timer_id)
        self._append(INTAKE, TimerEntry(timer_id, GROUP, deliver_at))

    @rule()
    def write_malformed(self) -> None:
        self.malformed += 1
        self._append(INTAKE, None)

    @precondition(lambda self: bool(self.scheduled))
    @rule(data=st.data(), own=st.booleans())
    def cancel(self, data: st.DataObject, own: bool) -> None:
        timer_id = data.draw(st.sampled_from(sorted(self.scheduled)))
        group = GROUP if own else OTHER
        self.cancel_log.append((timer_id, group, self.now))
        self.service.wheel.cancels.add(timer_id, group, self.now)  # read at once
        if own and timer_id not in self.delivered:
            self.cancelled_at.setdefault(timer_id, self.now)

    @rule(ms=st.sampled_from([1, 200, 999, 1000, 2500, 8000]))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(most=st.sampled_from(READ_MOST), commit=st.booleans())
    def step(self, most: int, commit: bool) -> None:
        self._step(most, commit)

    @rule(most=st.sampled_from(READ_MOST))
    def step_whose_offsets_the_broker_loses(self, most: int) -> None:
        self._step(most, commit=True, lose_offsets=True)

    @rule(most=st.sampled_from(READ_MOST))
    def step_whose_commit_the_broker_loses(self, most: int) -> None:
        self._step(most, commit=True, lose_all=True)

    @precondition(lambda self: not self.lost_pending)
    @rule()
    def crash(self) -> None:
        self.memory = Delivered(10_000)
        self.service = self._restart()

    @rule()
    def drain(self) -> None:
        """Time runs past every delivery; the service steps until nothing is left."""
        for _ in range(DRAIN_STEPS):
            self._step(max(READ_MOST), commit=True)
            if self._settled():
                break
            self.now += 500
        refused = self.too_far | set(self.cancelled_at)
        lost = sorted(set(self.scheduled) - refused - set(self.delivered))
        assert not lost, f"lost: {lost}"
        assert set(self.delivered) | self.dropped | self.too_far >= set(self.scheduled)

    def _settled(self) -> bool:
        wheel = self.service.wheel
        due = [at for timer_id, at in self.scheduled.items() if timer_id not in self.too_far]
        if wheel.held or self.now < max(due, default=T0):
            return False
        for lane in range(LEVELS + 1):
            offset = self.committed.get(lane, (-1, ""))[0]
            visible = [r.offset for r in self.logs[lane] if r.visible]
            if visible and offset <= max(visible):
                return False
        return True

    # -- promises ------------------------------------------------------------------------
    @invariant()
    def only_heads_and_the_due_heap_are_in_memory(self) -> None:
        """Flat memory: what the wheel holds is due within a second and the hop's lead."""
        due = self.service.wheel.next_due()
        assert self.service.wheel.held <= len(self.scheduled)
        window = HOLD_BELOW_MS + HOP_LEAD_MS
        assert due is None or due < self.now + window or self.service.wheel.held == 0


TestTimerMachine = TimerMachine.TestCase


def test_a_wheel_that_commits_where_it_read_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: each lane commits the offset after the last record read (with no
    done offsets), not its lowest unfinished one, so a held record is passed. Hypothesis
    finds it and shrinks it to a short history."""

    def read_position(self: PartitionWheel) -> dict[int, tuple[int, str]]:
        out = {}
        for level in self.lanes:
            nxt = self._lanes[level].tracker.next_offset
            if nxt is not None:
                out[level] = (nxt, "")
        return out

    monkeypatch.setattr(PartitionWheel, "offsets", read_position)
    found = find_failure(TimerMachine)
    assert isinstance(found.error, AssertionError)
    assert "passes unfinished" in str(found.error), found.report
    assert any(s.startswith("state.schedule(") for s in found.steps), found.report
    assert len(found.steps) <= 6, found.report


def test_a_wheel_that_forgets_what_it_delivered_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: the wheel never asks what it delivered before, so a record read again
    after its transaction's offsets were lost is delivered twice."""
    monkeypatch.setattr(Delivered, "before", lambda self, entry: False)
    found = find_failure(TimerMachine)
    assert isinstance(found.error, AssertionError)
    assert "delivered twice" in str(found.error), found.report
    assert any(s.startswith("state.step_whose_offsets_the_broker_loses(") for s in found.steps)


def test_a_service_that_trusts_its_memory_loses_what_the_broker_aborted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted defect: a remembered delivery is skipped without reading it back, so a
    message whose commit the broker lost everywhere is never delivered."""
    monkeypatch.setattr(TimerMachine, "_read_back", lambda self, action: action)
    found = find_failure(TimerMachine)
    assert isinstance(found.error, AssertionError)
    assert "never delivered" in str(found.error) or "lost" in str(found.error), found.report
    assert any(s.startswith("state.step_whose_commit_the_broker_loses(") for s in found.steps)
