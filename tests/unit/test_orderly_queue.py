"""The orderly queue's lifecycle and fencing rules, without a broker: the clock is passed in."""

from __future__ import annotations

import itertools

import pytest

from rmq_semantics.errors import IllegalTransitionError
from rmq_semantics.orderly import OrderlyMessage
from rmq_semantics.orderly.queue import TRANSITIONS, QueuePhase, QueueState, transition

P = QueuePhase
TP = ("orders", 3)
LEASE_END = 100.0  # the monotonic instant our view of a granted lease ends


def msgs(*offsets: int) -> list[OrderlyMessage]:
    return [OrderlyMessage(TP[0], TP[1], o, None, f"v{o}".encode(), (), 0) for o in offsets]


def aligned(epoch: int = 7, committed: int = 10) -> QueueState:
    """A queue holding the lock of ``epoch`` until LEASE_END, aligned at ``committed``."""
    q = QueueState(TP)
    q.grant(epoch, LEASE_END)
    q.align(epoch, committed)
    return q


# -- the transition table ----------------------------------------------------------------
LEGAL = [(a, b) for a, targets in TRANSITIONS.items() for b in targets]
ILLEGAL = [(a, b) for a, b in itertools.product(P, P) if b not in TRANSITIONS[a]]


@pytest.mark.parametrize(("current", "target"), LEGAL, ids=lambda p: p.value)
def test_every_move_in_the_table_is_allowed(current, target):
    assert transition(current, target) is target


@pytest.mark.parametrize(("current", "target"), ILLEGAL, ids=lambda p: p.value)
def test_every_move_outside_the_table_raises(current, target):
    with pytest.raises(IllegalTransitionError, match=f"from {current.value} to {target.value}"):
        transition(current, target)


def test_dropped_and_lost_are_final_and_only_revoking_leads_there():
    assert TRANSITIONS[P.DROPPED] == TRANSITIONS[P.LOST] == frozenset()
    assert {a for a, b in LEGAL if b in (P.DROPPED, P.LOST)} == {P.REVOKING}


# -- lifecycle events ----------------------------------------------------------------------
def test_a_new_queue_is_assigned_without_a_lock():
    q = QueueState(TP)
    assert (q.phase, q.epoch, q.held) == (P.ASSIGNED, -1, False)
    assert not q.lease_ok(0.0)


def test_grant_locks_with_the_epoch_then_align_makes_it_aligned():
    q = QueueState(TP)
    assert q.grant(7, LEASE_END) is True  # a new grant: the caller reads the committed offset
    assert (q.phase, q.epoch, q.held, q.deadline) == (P.LOCKED, 7, True, LEASE_END)
    assert q.align(7, 10) is True
    assert (q.phase, q.aligned_epoch, q.committed, q.released) == (P.ALIGNED, 7, 10, 10)


def test_renewal_keeps_the_phase_and_extends_the_lease():
    q = aligned(epoch=7)
    assert q.grant(7, LEASE_END + 50) is False  # not a new grant
    assert (q.phase, q.deadline) == (P.ALIGNED, LEASE_END + 50)
    locked = QueueState(TP)
    locked.grant(7, LEASE_END)
    assert locked.grant(7, LEASE_END + 50) is False
    assert locked.phase is P.LOCKED


def test_grant_with_a_new_epoch_sends_an_aligned_queue_back_to_locked():
    q = aligned(epoch=7)
    assert q.grant(8, LEASE_END) is True
    assert (q.phase, q.epoch, q.aligned_epoch) == (P.LOCKED, 8, -1)


def test_denial_sends_a_locked_or_aligned_queue_back_to_assigned():
    for q in (aligned(), QueueState(TP)):
        if q.phase is P.ASSIGNED:
            q.grant(7, LEASE_END)
        assert q.deny() is True  # we held it: the caller warns "lock lost"
        assert (q.phase, q.held, q.deadline, q.epoch) == (P.ASSIGNED, False, 0.0, 7)
        assert q.deny() is False  # denied again: nothing was held


def test_held_again_under_the_epoch_it_aligned_with_needs_no_new_alignment():
    q = aligned(epoch=7)
    q.deny()
    assert q.grant(7, LEASE_END) is True  # new grant (held again) ...
    assert q.phase is P.ALIGNED  # ... but the buffers already start at its offset


def test_failed_alignment_gives_the_lock_up_so_the_next_round_asks_again():
    q = QueueState(TP)
    q.grant(7, LEASE_END)
    q.align_failed()
    assert (q.phase, q.held) == (P.ASSIGNED, False)
    assert q.grant(7, LEASE_END) is True  # asked again: a new grant, aligned again
    assert q.phase is P.LOCKED


@pytest.mark.parametrize("phase", [P.ASSIGNED, P.LOCKED, P.ALIGNED])
def test_revoke_from_every_live_phase_and_again(phase):
    q = QueueState(TP)
    if phase is not P.ASSIGNED:
        q.grant(7, LEASE_END)
    if phase is P.ALIGNED:
        q.align(7, 0)
    q.revoke()
    q.revoke()  # idempotent: shutdown's drain, then the release of every queue
    assert q.phase is P.REVOKING


def test_lock_answers_are_ignored_once_revoking():
    q = aligned(epoch=7)
    q.revoke()
    assert q.grant(8, LEASE_END + 50) is False
    assert q.deny() is False
    assert (q.phase, q.epoch, q.held, q.deadline) == (P.REVOKING, 7, True, LEASE_END)


def test_revoked_queue_is_dropped_and_its_buffer_forgotten():
    q = aligned()
    q.add(msgs(10, 11))
    q.revoke()
    q.drop()
    assert (q.phase, len(q.msgs), q.gone) == (P.DROPPED, 0, True)
    q.drop()  # a second drop changes nothing
    assert q.phase is P.DROPPED


def test_dropping_a_queue_that_was_not_revoked_is_illegal():
    q = aligned()
    with pytest.raises(IllegalTransitionError, match="from aligned to dropped"):
        q.drop()


@pytest.mark.parametrize("revoking_first", [False, True])
def test_lost_queue_is_gone_at_once_and_stays_lost(revoking_first):
    q = aligned()
    q.add(msgs(10, 11))
    if revoking_first:
        q.revoke()  # shutdown was draining when the session was lost
    q.lose()
    assert (q.phase, len(q.msgs)) == (P.LOST, 0)
    q.drop()
    q.lose()
    q.revoke()
    assert q.phase is P.LOST


def test_a_gone_queue_cannot_be_revived():
    q = aligned()
    q.revoke()
    q.drop()
    q.lose()
    assert q.phase is P.DROPPED
    assert q.grant(9, LEASE_END) is False
    assert q.align(7, 20) is False


# -- fencing rules, with an explicit clock ---------------------------------------------------
def test_lease_is_ok_only_while_held_and_before_its_end():
    q = aligned()
    assert q.lease_ok(LEASE_END - 0.001)
    assert not q.lease_ok(LEASE_END)
    q.deny()
    assert not q.lease_ok(0.0)


def test_lease_of_a_lost_queue_is_never_ok():
    q = aligned()
    q.lose()
    assert q.held and not q.lease_ok(0.0)


def test_runnable_needs_alignment_a_live_lease_and_something_to_do():
    q = QueueState(TP)
    q.grant(7, LEASE_END)
    q.add(msgs(10))
    assert not q.runnable(1.0)  # locked, not aligned yet
    q.align(7, 10)
    assert q.runnable(1.0)
    assert not q.runnable(LEASE_END)  # our view of the lease ended
    q.next_batch(1)
    assert q.runnable(1.0)  # the in-flight batch counts
    q.processed(11, 7)
    assert not q.runnable(1.0)  # nothing left


def test_suspended_queue_is_runnable_again_at_the_end_of_its_suspension():
    q = aligned()
    q.add(msgs(10))
    q.suspend(5.0, retried=True)
    assert not q.runnable(4.999)
    assert q.runnable(5.0)
    assert q.reconsume_times == 1


def test_revoking_or_rewinding_queue_starts_no_batch():
    q = aligned()
    q.add(msgs(10))
    q.reset_to = 3
    assert not q.runnable(1.0)
    q.reset_to = None
    q.revoke()
    assert not q.runnable(1.0)


def test_may_commit_only_under_the_batchs_epoch_while_the_lease_runs():
    q = aligned(epoch=7)
    assert q.may_commit(7, LEASE_END - 0.001) is None
    assert q.may_commit(7, LEASE_END) == "lease lapsed"
    assert q.may_commit(6, 1.0) == "lock lost"  # the batch started under an older lock
    q.grant(8, LEASE_END)
    assert q.may_commit(7, 1.0) == "lock lost"  # re-granted with a new epoch meanwhile
    q.deny()
    assert q.may_commit(8, 1.0) == "lock lost"


def test_revocation_still_commits_under_the_held_lock_but_a_lost_queue_never():
    q = aligned(epoch=7)
    q.revoke()
    assert q.may_commit(7, 1.0) is None  # finish, commit, then unlock
    q.lose()
    assert q.may_commit(7, 1.0) == "partition lost"


# -- alignment with the committed offset -------------------------------------------------------
def test_align_drops_what_the_previous_holder_already_committed():
    q = QueueState(TP)
    q.grant(7, LEASE_END)
    q.add(msgs(3, 4, 5, 6))
    q.align(7, 5)
    assert [m.offset for m in q.msgs] == [5, 6]
    assert q.min_offset == 5
    q.add(msgs(4, 5, 7))  # a stale fetch below the committed offset is ignored
    assert [m.offset for m in q.msgs] == [5, 6, 5, 7]


def test_align_behind_what_was_released_rewinds_and_forgets_the_buffers():
    q = aligned(epoch=7, committed=10)
    q.add(msgs(10, 11, 12))
    q.next_batch(2)
    q.processed(12, 7)
    q.grant(8, LEASE_END)  # our lease lapsed; the next holder committed only up to 11
    q.align(8, 11)
    assert (q.reset_to, list(q.msgs), q.inflight) == (11, [], [])
    assert q.may_commit(q.pending_epoch, 1.0) == "lock lost"  # epoch 7's offset never commits
    assert not q.add(msgs(11))  # nothing is buffered until the poll thread has seeked
    assert q.take_reset() == 11 and q.reset_to is None


def test_align_clears_a_pending_commit_the_group_already_has():
    q = aligned(epoch=7, committed=10)
    q.add(msgs(10, 11))
    q.next_batch(2)
    q.processed(12, 7)
    q.grant(8, LEASE_END)
    q.align(8, 12)
    assert (q.pending_commit, q.committed, q.reset_to) == (None, 12, None)


def test_align_for_an_epoch_that_moved_on_changes_nothing():
    q = QueueState(TP)
    q.grant(7, LEASE_END)
    q.grant(8, LEASE_END)
    assert q.align(7, 10) is False
    assert (q.phase, q.committed) == (P.LOCKED, -1)


# -- batches and commits ---------------------------------------------------------------------
def test_batches_follow_offset_order_and_a_redelivery_carries_its_count():
    q = aligned()
    q.add(msgs(10, 11, 12))
    assert [m.offset for m in q.next_batch(2)] == [10, 11]
    q.suspend(0.0, retried=True)
    again = q.next_batch(2)
    assert [(m.offset, m.reconsume_times) for m in again] == [(10, 1), (11, 1)]
    q.processed(12, 7)
    assert (q.reconsume_times, q.released, q.pending_commit, q.pending_epoch) == (0, 12, 12, 7)
    assert [m.offset for m in q.next_batch(2)] == [12]


def test_commit_bookkeeping_sends_once_resends_after_a_refusal_and_books_success():
    q = aligned(epoch=7)
    q.add(msgs(10))
    q.next_batch(1)
    q.processed(11, 7)
    assert q.commit_due() == (11, 7)
    q.commit_sent = 11
    assert q.commit_due() is None  # in flight
    q.commit_failed(11)
    assert q.commit_due() == (11, 7)  # refused: send again
    q.commit_done(11)
    assert (q.commit_due(), q.committed) == (None, 11)


def test_skipped_commit_is_dropped_and_a_gone_queue_sends_none():
    q = aligned(epoch=7)
    q.processed(11, 7)
    q.commit_skipped(11)
    assert q.commit_due() is None
    q.processed(12, 7)
    q.revoke()
    q.drop()
    assert q.commit_due() is None


# -- status ------------------------------------------------------------------------------------
def test_status_shows_held_then_lapsed_then_unlocked():
    q = aligned(epoch=7, committed=10)
    q.high = 15
    held = q.status(LEASE_END - 2.5)
    assert (held.lock_state, held.locked, held.epoch, held.lease_remaining_ms) == (
        "held",
        True,
        7,
        2500,
    )
    assert (held.committed_offset, held.lag) == (10, 5)
    assert q.status(LEASE_END).lock_state == "lapsed"
    q.deny()
    assert q.status(0.0).lock_state == "unlocked"
    q.revoke()
    q.drop()
    assert q.status(0.0) is None
