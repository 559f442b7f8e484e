"""The pure pending-state machine: decisions, check counting, offsets to commit, recovery."""

from __future__ import annotations

import dataclasses

import pytest

from coordinator.state import (
    Discard,
    EndRequest,
    Finish,
    IssueCheck,
    PartitionState,
    SaveCheckCounts,
    TxnState,
    transition,
)
from rmq_semantics.errors import IllegalTransitionError, MalformedRecordError
from rmq_semantics.records.half import HalfMessage, parse_half

T0 = 1_000_000
GRACE = 2000  # coordinator.waits.DEFER_GRACE_MS


def half(offset: int, txn: str = "t", immunity: int | None = None) -> HalfMessage:
    return HalfMessage(
        0,
        offset,
        T0,
        f"{txn}{offset}",
        "pg",
        "orders",
        None,
        T0,
        immunity,
        b"k",
        b"v",
        [
            ("app", b"1"),
            ("rmq.txn_id", f"{txn}{offset}".encode()),
            ("rmq.real_topic", b"orders"),
            ("rmq.tags", b"A"),
        ],
    )


def end(
    op: int,
    offset: int,
    state: str,
    *,
    txn: str | None = None,
    group: str = "pg",
    from_check: bool = False,
    seq: int = 0,
) -> EndRequest:
    return EndRequest(op, txn or f"t{offset}", group, offset, state, from_check, seq, T0)


def live(**kw: int) -> PartitionState:
    st = PartitionState(
        0, kw.get("timeout", 6000), kw.get("interval", 60000), kw.get("check_max", 3)
    )
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    return st


def test_commit_promotes_once_and_later_decisions_are_ignored():
    st = live()
    st.on_half(0, half(0), T0)
    [action] = st.on_end_request(end(0, 0, "COMMIT"), T0)
    assert isinstance(action, Finish) and action.outcome is TxnState.COMMITTED
    assert st.on_end_request(end(1, 0, "COMMIT"), T0) == []
    assert st.on_end_request(end(2, 0, "ROLLBACK"), T0) == []
    assert st.counters["duplicate_decisions"] == 1
    assert st.counters["conflicting_decisions"] == 1


def test_a_late_duplicate_is_told_from_a_conflict_after_the_offset_is_committed():
    st = live()
    st.on_half(0, half(0), T0)
    st.on_end_request(end(0, 0, "COMMIT"), T0)
    assert st.op_commit == 1  # offset 0 left the removeMap
    st.on_end_request(end(1, 0, "COMMIT"), T0)
    st.on_end_request(end(2, 0, "ROLLBACK"), T0)
    assert (st.counters["duplicate_decisions"], st.counters["conflicting_decisions"]) == (1, 1)


def test_mismatched_group_or_txn_id_is_rejected_and_stays_pending():
    st = live()
    st.on_half(0, half(0), T0)
    assert st.on_end_request(end(0, 0, "COMMIT", group="evil"), T0) == []
    assert st.on_end_request(end(1, 0, "COMMIT", txn="forged"), T0) == []
    assert st.counters["rejected_mismatch"] == 2 and 0 in st.pending


def test_checks_start_after_immunity_and_only_answered_checks_count():
    st = live(timeout=6000, interval=1000, check_max=2)
    st.on_half(0, half(0, immunity=100), T0)  # shorter immunity is raised to the timeout
    assert st.due(T0 + 5999) == []
    [check] = st.due(T0 + 6000)
    assert isinstance(check, IssueCheck) and check.check_seq == 1
    [again] = st.due(T0 + 7000)  # nobody answered: re-sent, not counted
    assert again.check_seq == 2 and again.checks_answered == 0
    [saved] = st.on_end_request(end(1, 0, "UNKNOWN", from_check=True, seq=2), T0)
    assert isinstance(saved, SaveCheckCounts) and saved.checks_answered == 1
    # An answer older than one already counted does not count.
    assert st.on_end_request(end(0, 0, "UNKNOWN", from_check=True, seq=1), T0) == []
    [third] = st.due(T0 + 8000)
    [discard] = st.on_end_request(end(2, 0, "UNKNOWN", from_check=True, seq=third.check_seq), T0)
    assert isinstance(discard, Discard) and discard.checks_answered == 2
    assert st.due(T0 + 100000) == []


def test_retention_discards_before_the_record_would_be_deleted():
    st = live(timeout=6000, interval=60000)
    st.retention_ms = 30000
    st.on_half(0, half(0), T0)
    [action] = st.due(T0 + 6000)
    assert isinstance(action, Discard) and "retention" in action.reason


def test_commit_offsets_are_lowest_unresolved_half_and_lowest_needed_op():
    st = live()
    for o in range(3):
        st.on_half(o, half(o), T0)
    st.on_end_request(end(0, 1, "COMMIT"), T0)
    assert st.half_commit == 0  # offset 0 still pending
    st.on_done_marker(5, 1, TxnState.COMMITTED)
    assert st.op_commit == 5  # the done marker of offset 1 is needed on replay
    st.on_end_request(end(6, 0, "ROLLBACK"), T0)
    st.on_end_request(end(7, 2, "COMMIT"), T0)
    assert st.half_commit == 3
    assert st.op_commit == 8


def test_recovery_defers_end_requests_until_done_markers_are_known():
    st = PartitionState(0, 6000, 60000, 3)
    st.on_half(0, half(0), T0)
    # A replayed end request, then the done marker it already produced before the crash.
    assert st.on_end_request(end(3, 0, "COMMIT"), T0) == []
    st.on_done_marker(4, 0, TxnState.COMMITTED)
    st.on_eof("half", T0)
    assert st.on_eof("op", T0) == []  # not promoted a second time
    assert st.counters["duplicate_decisions"] == 1


def test_recovery_restores_check_counts_even_when_markers_come_first():
    st = PartitionState(0, 6000, 1000, 3)
    st.on_check_marker(
        2, 0, checks_issued=2, checks_answered=2, answered_seq=2, next_check_ts=T0 + 9000
    )
    st.on_half(0, half(0), T0)
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    [check] = st.due(T0 + 9000)
    [discard] = st.on_end_request(end(3, 0, "UNKNOWN", from_check=True, seq=check.check_seq), T0)
    assert isinstance(discard, Discard) and discard.checks_answered == 3


def test_lifecycle_rejects_illegal_moves():
    assert transition(TxnState.PENDING, TxnState.COMMITTED) is TxnState.COMMITTED
    with pytest.raises(IllegalTransitionError):
        transition(TxnState.ROLLED_BACK, TxnState.COMMITTED)


def test_promoted_headers_keep_user_and_allowed_rmq_headers():
    h = half(7)
    assert h.promoted_headers() == [
        ("app", b"1"),
        ("rmq.txn_id", b"t7"),
        ("rmq.tags", b"A"),
        ("rmq.promoted_from", b"0:7"),
    ]
    assert h.promoted_headers(1234)[-2:] == [
        ("rmq.promoted_from", b"0:7"),
        ("rmq.promoted_at", b"1234"),
    ]


def test_half_without_rmq_headers_is_malformed():
    with pytest.raises(MalformedRecordError, match="missing headers"):
        parse_half(0, 1, T0, None, b"x", [("app", b"1")])


def _reference_commits(st: PartitionState) -> tuple[int, int]:
    """The offsets to commit computed the slow, obvious way (a scan of everything)."""
    low = min(st.pending) if st.pending else st.half_position
    needed = [st.op_position]
    needed += [op for h, (op, _) in st.decided.items() if h >= low and op is not None]
    needed += [e.marker_op_offset for e in st.pending.values() if e.marker_op_offset is not None]
    needed += [r.op_offset for requests in st.deferred.values() for r in requests]
    needed += [m[0] for m in st.early_markers.values()]
    return low, min(needed)


@pytest.mark.parametrize("seed", range(20))
def test_offsets_to_commit_match_a_full_scan_under_random_traffic(seed):
    import random

    rng = random.Random(seed)
    st = live(check_max=100)
    st.max_deferred_ends = rng.choice([2, 100_000])  # bounded: the farthest ahead dropped
    op = 0
    next_half = 0
    open_offsets: list[int] = []
    written_markers: list[tuple[int, TxnState]] = []  # our decisions, read back later
    for _ in range(400):
        roll = rng.random()
        if roll < 0.35:
            actions = st.on_half(next_half, half(next_half), T0)  # may apply a deferred end
            written_markers += [(a.half.offset, a.outcome) for a in actions]
            if not actions:
                open_offsets.append(next_half)
            next_half += 1
        elif roll < 0.4:  # the end request overtakes its half record: deferred
            assert st.on_end_request(end(op, next_half, "COMMIT"), T0) == []
            op += 1
        elif roll < 0.65 and open_offsets:
            offset = open_offsets.pop(rng.randrange(len(open_offsets)))
            for action in st.on_end_request(
                end(op, offset, rng.choice(["COMMIT", "ROLLBACK"])), T0
            ):
                written_markers.append((action.half.offset, action.outcome))
            op += 1
        elif roll < 0.8 and written_markers:
            offset, outcome = written_markers.pop(0)
            st.on_done_marker(op, offset, outcome)
            op += 1
        elif open_offsets:
            offset = rng.choice(open_offsets)
            st.on_check_marker(op, offset, 1, 0, 0, T0 + 60000)
            op += 1
        assert (st.half_commit, st.op_commit) == _reference_commits(st)
        assert st.deferred_count == sum(map(len, st.deferred.values())) <= st.max_deferred_ends


def test_one_done_markers_record_settles_several_offsets_and_is_kept_until_all_are_done():
    from rmq_semantics.records import txn as wire
    from rmq_semantics.records.codec import decode, encode

    st = PartitionState(0, 6000, 60000, 3)  # recovering: what a new owner reads back
    for o in range(3):
        st.on_half(o, half(o), T0)
    body = {
        "entries": [
            {"half_offset": 0, "txn_id": "t0", "outcome": "COMMITTED", "checks_answered": 0},
            {"half_offset": 2, "txn_id": "t2", "outcome": "ROLLED_BACK", "checks_answered": 1},
        ],
        "ts": T0,
        "mac": None,
    }
    record = decode(encode(wire.DoneMarkers.from_body(body)))
    assert record.to_body() == body
    assert st.on_op_marker(7, record)
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    assert sorted(st.pending) == [1]
    assert (st.half_commit, st.op_commit) == (1, 7)  # offset 2's decision is still needed
    # A replayed COMMIT of offset 0 is a duplicate, never a second promotion.
    assert st.on_end_request(end(8, 0, "COMMIT"), T0) == []
    assert st.counters["duplicate_decisions"] == 1
    st.on_end_request(end(9, 1, "COMMIT"), T0)
    assert (st.half_commit, st.op_commit) == (3, 10)
    assert not st.on_op_marker(
        10, wire.EndRequest("t1", "pg", 0, 1, wire.EndState.COMMIT, False, 0, T0)
    )


def test_forged_end_requests_for_future_offsets_are_bounded_and_a_real_one_is_kept():
    st = PartitionState(0, 6000, 60000, 3, max_deferred_ends=3)
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    st.on_half(0, half(0), T0)
    st.on_half(1, half(1), T0)  # not at the end: deferred requests wait
    for op, offset in enumerate((1000, 1001, 1002, 1003)):  # forged: offsets far ahead
        assert st.on_end_request(end(op, offset, "COMMIT"), T0) == []
    assert st.on_end_request(end(9, 2, "COMMIT"), T0) == []  # the real one, just ahead
    assert sum(len(r) for r in st.deferred.values()) == 3
    assert st.counters["rejected_deferred_full"] == 2
    dropped = sorted(r.half_offset for r, _ in st.rejections)
    assert dropped == [1002, 1003] and "max_deferred_ends" in st.rejections[0][1]
    [finish] = st.on_half(2, half(2), T0)
    assert isinstance(finish, Finish) and finish.half.offset == 2


def test_a_conflicting_decision_is_reported_with_both_decisions():
    st = live()
    st.on_half(0, half(0), T0)
    st.on_end_request(end(0, 0, "COMMIT"), T0)
    st.on_end_request(end(1, 0, "ROLLBACK"), T0)
    [(request, reason)] = st.rejections
    assert (request.op_offset, request.txn_id) == (1, "t0")
    assert "ROLLBACK" in reason and "COMMITTED" in reason
    assert st.counters["conflicting_decisions"] == 1


def test_requests_deferred_in_recovery_are_applied_in_op_order_across_offsets():
    # Model example (campaign profile): t0's record at 0 and a copy at 1 (the producer was
    # told the copy's offset); ROLLBACK to 0, then COMMIT to the copy. An earlier request
    # for offset 1 (another transaction's) keyed offset 1 first among the deferred ones.
    st = PartitionState(0, 6000, 60000, 3)
    st.on_half(0, half(0), T0)
    st.on_half(1, dataclasses.replace(half(0), offset=1), T0)  # rolled back: a copy
    for request in (
        end(0, 1, "COMMIT", txn="nobody"),
        end(1, 0, "ROLLBACK", txn="t0"),
        end(2, 1, "COMMIT", txn="t0"),
    ):
        assert st.on_end_request(request, T0) == []  # recovering: deferred
    st.on_eof("half", T0)
    [rollback] = st.on_eof("op", T0)
    assert rollback.half.offset == 0 and rollback.outcome is TxnState.ROLLED_BACK
    assert st.counters["conflicting_decisions"] == 1


def test_a_commit_naming_a_copy_not_read_yet_is_the_first_decision():
    # Model example (campaign profile): the producer was told the copy's offset (1) and
    # sent COMMIT there before the coordinator read the copy; a later UNKNOWN answer to the
    # check of the first record (0) must not overtake it (check_max 1: a discard).
    st = live(timeout=1000, check_max=1)
    st.on_half(0, half(0), T0)
    [check] = st.due(T0 + 1000)
    actions = st.on_end_request(end(0, 1, "COMMIT", txn="t0"), T0 + 1000)
    actions += st.on_end_request(
        end(1, 0, "UNKNOWN", from_check=True, seq=check.check_seq), T0 + 1000
    )
    actions += st.on_half(1, dataclasses.replace(half(0), offset=1), T0 + 1000)  # the copy
    decided = [(a.half.offset, a.outcome) for a in actions if isinstance(a, Finish)]
    assert decided == [(0, TxnState.COMMITTED), (1, TxnState.ROLLED_BACK)]
    assert not [a for a in actions if isinstance(a, Discard)]


def test_an_end_of_partition_read_before_a_request_never_rejects_it():
    # Model example (campaign profile): the half partition's end was read while it was
    # empty; t0's record and its ROLLBACK were written after that; the ROLLBACK was read
    # first and rejected "no half message at that offset" once the grace period passed.
    st = live()  # the ends of both partitions read, before anything was written
    assert st.on_end_request(end(0, 0, "ROLLBACK"), T0) == []  # its half record: not read
    assert st.due(T0 + 10 * GRACE) == [] and st.rejections == []  # the fetch stalls
    assert st.wants_half_end(T0 + 10 * GRACE)  # asks for an end read after the request
    [rollback] = st.on_half(0, half(0), T0 + 10 * GRACE)
    assert isinstance(rollback, Finish) and rollback.outcome is TxnState.ROLLED_BACK
