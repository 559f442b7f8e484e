"""The timing wheel's decisions, one case at a time (the state machine is test_model_timer.py)."""

from __future__ import annotations

from coordinator.timer_wheel import (
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
from rmq_semantics.records.timer import max_level

T0 = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000


def _wheel(max_delay_ms: int = 3 * DAY_MS, ready: bool = True) -> PartitionWheel:
    wheel = PartitionWheel(0, max_level(max_delay_ms), max_delay_ms, Cancels(max_delay_ms))
    for lane in range(wheel.max_level + 1):
        wheel.start(lane, 0)
    wheel.ready = ready
    wheel.to_pause()
    wheel.to_resume(T0)
    return wheel


def _rec(
    offset: int, deliver_at: int, lane: int = INTAKE, append_ts: int = T0, timer_id: str = ""
) -> Incoming:
    entry = TimerEntry(timer_id or f"m{lane}.{offset}", "g", deliver_at)
    return Incoming(lane, offset, append_ts, entry)


def test_an_intake_record_due_now_is_delivered_at_once_and_its_offset_moves_past_it():
    wheel = _wheel()
    [action] = wheel.on_record(_rec(0, T0 - 5), T0)
    assert action.step is Step.DELIVER and action.offset == 0
    assert wheel.offsets()[INTAKE][0] == 1


def test_a_record_due_within_a_second_is_held_and_delivered_at_its_time_not_before():
    wheel = _wheel()
    assert wheel.on_record(_rec(0, T0 + 400), T0) == []
    assert wheel.held == 1 and wheel.next_due() == T0 + 400
    assert wheel.due(T0 + 399) == []
    [later] = wheel.on_record(_rec(1, T0), T0)  # delivered while the held one waits
    assert later.step is Step.DELIVER
    # The held record keeps the offset; the delivered one above it is in the metadata.
    offset, metadata = wheel.offsets()[INTAKE]
    assert offset == 0 and metadata
    [action] = wheel.due(T0 + 400)
    assert action.step is Step.DELIVER and action.offset == 0
    assert wheel.offsets()[INTAKE] == (2, "")


def test_a_record_seconds_away_is_appended_to_its_level_and_released_after_its_hold():
    wheel = _wheel()
    [action] = wheel.on_record(_rec(0, T0 + 4500), T0)
    assert (action.step, action.level) == (Step.REAPPEND, 3)
    # On level 3 (4 s hold) from T0: blocked, paused, forgotten until T0 + 4 s.
    assert wheel.on_record(_rec(0, T0 + 4500, lane=3), T0 + 10) == []
    assert wheel.to_pause() == [3]
    assert wheel.to_resume(T0 + 3999) == []
    assert wheel.to_resume(T0 + 4000) == [(3, 0)]
    assert wheel.on_record(_rec(0, T0 + 4500, lane=3), T0 + 4000) == []  # 0.5 s left: held
    assert wheel.due(T0 + 4499) == []
    [delivered] = wheel.due(T0 + 4500)
    assert (delivered.step, delivered.lane) == (Step.DELIVER, 3)


def test_nothing_is_released_before_the_cancels_are_read():
    wheel = _wheel(ready=False)
    assert wheel.on_record(_rec(0, T0), T0) == []
    assert wheel.to_resume(T0) == []
    wheel.ready = True
    assert (INTAKE, 0) in wheel.to_resume(T0)


def test_a_message_cancelled_by_its_own_group_is_dropped_and_by_another_delivered():
    wheel = _wheel()
    wheel.cancels.add("mine", "g", T0)
    wheel.cancels.add("theirs", "intruder", T0)
    [dropped] = wheel.on_record(_rec(0, T0, timer_id="mine"), T0)
    [delivered] = wheel.on_record(_rec(1, T0, timer_id="theirs"), T0)
    assert (dropped.step, delivered.step) == (Step.DROP, Step.DELIVER)


def test_a_record_just_past_a_hold_hops_short_of_it_and_is_held_not_late():
    """Due 2.1 s ahead: level 2 (a 2 s hold) would release it after the time once the hop's
    own delays are added; level 1 leaves it in the due-heap with time to spare."""
    wheel = _wheel()
    [action] = wheel.on_record(_rec(0, T0 + 2100), T0)
    assert (action.step, action.level) == (Step.REAPPEND, 1)
    appended, read = T0 + 40, T0 + 1000 + 40 + HOP_LEAD_MS - 10  # the hop's delays
    assert wheel.on_record(_rec(0, T0 + 2100, lane=1, append_ts=appended), read) == []
    assert wheel.held == 1 and wheel.due(T0 + 2099) == []
    [delivered] = wheel.due(T0 + 2100)
    assert delivered.step is Step.DELIVER


def test_a_held_record_cancelled_before_its_time_is_dropped():
    wheel = _wheel()
    wheel.on_record(_rec(0, T0 + 500, timer_id="held"), T0)
    wheel.cancels.add("held", "g", T0 + 100)
    [action] = wheel.due(T0 + 500)
    assert action.step is Step.DROP


def test_a_bad_record_is_discarded_with_its_reason_at_once_even_on_a_level():
    wheel = _wheel()
    [action] = wheel.on_record(Incoming(5, 0, T0, problem="forged"), T0)
    assert (action.step, action.reason) == (Step.DISCARD, "forged")


def test_a_restart_from_the_committed_offset_skips_what_was_finished_above_it():
    wheel = _wheel()
    wheel.on_record(_rec(0, T0 + 500), T0)  # held
    wheel.on_record(_rec(1, T0), T0)  # delivered
    offset, metadata = wheel.offsets()[INTAKE]
    again = PartitionWheel(0, wheel.max_level, wheel.max_delay_ms, Cancels(1))
    again.start(INTAKE, offset, metadata)
    again.ready = True
    assert again.to_resume(T0) == [(INTAKE, 0)]
    assert again.on_record(_rec(0, T0 + 500), T0) == []  # held again
    assert again.on_record(_rec(1, T0), T0) == []  # finished before: skipped
    assert [a.offset for a in again.due(T0 + 500)] == [0]


def test_cancels_are_forgotten_once_the_longest_delay_has_passed():
    cancels = Cancels(keep_ms=1000)
    cancels.add("m", "g", T0)
    assert cancels.expire(T0 + 999) == 0 and len(cancels) == 1
    assert cancels.expire(T0 + 1000) == 1 and len(cancels) == 0


def test_a_record_read_again_after_its_delivery_committed_is_skipped_not_delivered():
    memory = Delivered(10)
    wheel = _wheel()
    wheel.delivered = memory
    [first] = wheel.on_record(_rec(0, T0 - 5, timer_id="x"), T0)
    assert first.step is Step.DELIVER
    memory.add("x", "g")  # its transaction committed; the broker lost the offsets
    again = _wheel()
    again.delivered = memory
    [skipped] = again.on_record(_rec(0, T0 - 5, timer_id="x"), T0 + 10)
    assert (skipped.step, skipped.offset) == (Step.SKIP, 0)
    assert again.offsets()[INTAKE][0] == 1  # its offset is finished all the same
    # One held in the due-heap while another copy's delivery committed: skipped at its time.
    assert again.on_record(_rec(1, T0 + 400, timer_id="y"), T0 + 10) == []
    memory.add("y", "g")
    [held] = again.due(T0 + 400)
    assert (held.step, held.offset) == (Step.SKIP, 1)


def test_two_copies_of_one_record_due_in_one_step_are_delivered_once():
    a, b = _rec(0, T0, lane=1, timer_id="x"), _rec(0, T0, lane=2, timer_id="x")
    actions = [Action(Step.DELIVER, r.level, r.offset, r.entry) for r in (a, b)]
    assert [x.step for x in once_per_step(actions)] == [Step.DELIVER, Step.SKIP]
