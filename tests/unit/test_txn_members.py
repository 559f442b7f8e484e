"""Multi-message transactions in the pure coordinator state: the parse of ``rmq.txn_size`` /
``rmq.txn_index``, the assembly of members, and decisions that act on all of them."""

from __future__ import annotations

import dataclasses

import pytest

from coordinator.horizon import Reappend
from coordinator.members import Assemblies
from coordinator.state import Discard, EndRequest, Finish, IssueCheck, PartitionState, TxnState
from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.records.half import MAX_TXN_SIZE, HalfMessage, parse_half
from rmq_semantics.records.reappend import reappended_headers
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.records.txn import DoneEntry, DoneMarkers, Outcome

T0 = 1_000_000
GRACE = 2000  # coordinator.state.DEFER_GRACE_MS


def member(
    offset: int,
    index: int,
    size: int = 3,
    txn: str = "tx",
    group: str = "pg",
    topic: str = "orders",
) -> HalfMessage:
    headers = [
        ("rmq.txn_id", txn.encode()),
        ("rmq.real_topic", topic.encode()),
        ("rmq.txn_size", str(size).encode()),
        ("rmq.txn_index", str(index).encode()),
    ]
    return HalfMessage(
        0,
        offset,
        T0,
        txn,
        group,
        topic,
        None,
        T0,
        None,
        f"k{index}".encode(),
        f"v{index}".encode(),
        headers,
        txn_size=size,
        txn_index=index,
    )


def end(
    op: int,
    offset: int,
    state: str,
    txn: str = "tx",
    *,
    from_check: bool = False,
    seq: int = 0,
    at: int = T0,
) -> EndRequest:
    return EndRequest(op, txn, "pg", offset, state, from_check, seq, at)


def live(**kw: int) -> PartitionState:
    st = PartitionState(
        0,
        kw.get("timeout", 6000),
        kw.get("interval", 60000),
        kw.get("check_max", 3),
        reappend_horizon_ms=kw.get("horizon"),
    )
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    return st


def feed(st: PartitionState, *members: HalfMessage) -> list:
    return [a for m in members for a in st.on_half(m.offset, m, T0)]


# -- parse -----------------------------------------------------------------------------------
BASE = [
    ("rmq.txn_id", b"t"),
    ("rmq.real_topic", b"orders"),
    ("rmq.producer_group", b"pg"),
    ("rmq.born_ts", b"1"),
]


def test_members_headers_parse_and_a_transaction_of_one_has_neither():
    one = parse_half(0, 5, 1, None, b"v", BASE)
    assert (one.txn_size, one.txn_index, one.is_member) == (1, 0, False)
    m = parse_half(0, 5, 1, None, b"v", [*BASE, ("rmq.txn_size", b"3"), ("rmq.txn_index", b"2")])
    assert (m.txn_size, m.txn_index, m.is_member) == (3, 2, True)


@pytest.mark.parametrize(
    "size, index",
    [
        (b"3", None),
        (None, b"0"),
        (b"x", b"0"),
        (b"3", b"-1"),
        (b"1", b"0"),
        (b"0", b"0"),
        (b"3", b"3"),
        (b"3", b"7"),
        (str(MAX_TXN_SIZE + 1).encode(), b"0"),
        (b"9" * 40, b"0"),
        (b"", b"0"),
        (b"3", b""),
        (b"\xff", b"0"),
        (b" 3", b"0"),
        (b"3.0", b"1"),
    ],
)
def test_bad_size_or_index_is_malformed(size, index):
    headers = [
        *BASE,
        *([("rmq.txn_size", size)] if size is not None else []),
        *([("rmq.txn_index", index)] if index is not None else []),
    ]
    with pytest.raises(MalformedRecordError, match="txn_"):
        parse_half(0, 5, 1, None, b"v", headers)


def test_member_headers_are_stripped_on_promotion():
    names = [k for k, _ in member(4, 1).promoted_headers()]
    assert "rmq.txn_size" not in names and "rmq.txn_index" not in names


# -- assembly --------------------------------------------------------------------------------
def test_assembly_keys_members_by_txn_and_refuses_contradictions():
    units = Assemblies()
    assert units.add(10, member(10, 0)) == (10, "")
    assert units.add(12, member(12, 2)) == (10, "")
    assert units.add(13, member(13, 2))[0] is None  # duplicate index
    assert "rmq.txn_size=4" in units.add(14, member(14, 1, size=4))[1]
    assert "producer group" in units.add(15, member(15, 1, group="other"))[1]
    assert units.add(16, member(16, 0, txn="other")) == (16, "")  # another transaction
    unit = units.unit(10)
    assert unit is not None and unit.count == "2/3" and not unit.complete
    assert units.anchor(12) == 10 and 13 not in units
    units.remove(10)
    assert units.anchor(12) is None and units.add(20, member(20, 1)) == (20, "")


# -- decisions -------------------------------------------------------------------------------
def test_commit_promotes_all_members_in_one_action_in_index_order():
    st = live()
    feed(st, member(10, 0), member(11, 1))
    assert st.half_commit == 10 and list(st.pending) == [10]
    [finish] = feed(st, member(12, 2)) + st.on_end_request(end(0, 10, "COMMIT"), T0)
    assert isinstance(finish, Finish) and finish.outcome is TxnState.COMMITTED
    assert [h.offset for h in finish.records] == [10, 11, 12]
    assert st.half_commit == 13 and not st.assemblies


def test_members_out_of_order_are_promoted_in_index_order_and_member_0_names_them():
    st = live()
    feed(st, member(10, 2), member(11, 0), member(12, 1))
    [finish] = st.on_end_request(end(0, 11, "COMMIT"), T0)  # member 0's offset
    assert [h.txn_index for h in finish.records] == [0, 1, 2]


def test_a_commit_waits_for_missing_members_and_the_half_commit_stays_below_them():
    st = live()
    feed(st, member(10, 0), member(11, 1))
    assert st.on_end_request(end(5, 10, "COMMIT"), T0) == []
    assert st.half_commit == 10 and st.op_commit == 5  # the COMMIT is kept
    [finish] = feed(st, member(12, 2))
    assert isinstance(finish, Finish) and len(finish.records) == 3
    assert st.half_commit == 13


def test_a_commit_with_members_that_never_come_is_discarded_incomplete():
    st = live()
    feed(st, member(10, 0), member(11, 1))
    st.on_end_request(end(5, 10, "COMMIT"), T0)
    st.on_eof("half", T0)
    assert st.due(T0 + GRACE - 1) == []  # read to the end, but too soon after the COMMIT
    [discard] = st.due(T0 + GRACE)
    assert isinstance(discard, Discard) and discard.reason is DiscardReason.INCOMPLETE
    assert [h.offset for h in discard.records] == [10, 11] and "2/3" in discard.detail
    assert st.half_commit == 12 and st.on_end_request(end(6, 10, "ROLLBACK"), T0) == []


def test_no_incomplete_discard_while_the_half_partition_is_not_at_its_end():
    st = live()
    feed(st, member(10, 0), member(11, 1))
    st.on_end_request(end(5, 10, "COMMIT"), T0)
    st.on_half(20, member(20, 0, txn="other"), T0)  # more records: not at the end
    assert [a for a in st.due(T0 + 10 * GRACE) if isinstance(a, Discard)] == []


def test_rollback_and_check_max_act_on_every_member_read():
    st = live(check_max=1, timeout=1000)
    feed(st, member(10, 0), member(11, 1), member(12, 2))
    [rolled] = st.on_end_request(end(0, 10, "ROLLBACK"), T0)
    assert rolled.outcome is TxnState.ROLLED_BACK and len(rolled.records) == 3
    feed(st, member(20, 0, txn="u"), member(21, 1, txn="u"))
    [check] = st.due(T0 + 1000)
    assert isinstance(check, IssueCheck) and check.half.offset == 20  # one check, member 0
    [discard] = st.on_end_request(end(1, 20, "UNKNOWN", "u", from_check=True, seq=1), T0)
    assert discard.reason is DiscardReason.CHECK_MAX and len(discard.records) == 2
    assert st.half_commit == 22


def test_a_contradicting_member_is_set_aside_alone_and_never_blocks():
    st = live()
    feed(st, member(10, 0), member(11, 1))
    assert feed(st, member(12, 1)) == []  # duplicate index: poison, discarded when due
    [poison] = st.due(T0)
    assert poison.reason is DiscardReason.MALFORMED and poison.records[0].offset == 12
    assert "rmq.txn_index=1" in poison.detail and st.counters["malformed_member"] == 1
    [finish] = feed(st, member(13, 2)) + st.on_end_request(end(0, 10, "COMMIT"), T0)
    assert [h.offset for h in finish.records] == [10, 11, 13]


def test_reappend_moves_every_member_and_the_transaction_is_found_at_its_new_offsets():
    st = live(horizon=1000)
    feed(st, member(10, 0), member(11, 1))
    [move] = st.due(T0 + 1000)
    assert isinstance(move, Reappend) and [h.offset for h in move.records] == [10, 11]
    assert st.half_commit == 12
    assert st.on_end_request(end(3, 10, "COMMIT"), T0) == []  # waits for the re-append


def test_recovery_rebuilds_a_partial_assembly_and_skips_members_already_done():
    # Unit tx (10, 11, 13) committed with all members; unit ux (12, 14) still pending.
    st = PartitionState(0, 6000, 60000, 3)
    st.start_at(10, 0)
    done = DoneMarkers(tuple(DoneEntry(o, "tx", Outcome.COMMITTED, 0) for o in (10, 11, 13)), T0)
    feed(st, member(10, 0), member(11, 1))
    st.on_op_marker(7, done)  # read back between members
    feed(st, member(12, 0, size=2, txn="ux"), member(13, 2), member(14, 1, size=2, txn="ux"))
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    assert list(st.pending) == [12] and st.half_commit == 12
    [finish] = st.on_end_request(end(8, 12, "COMMIT", "ux"), T0)
    assert [h.offset for h in finish.records] == [12, 14]


def test_a_commit_read_in_recovery_waits_for_members_read_after_it():
    st = PartitionState(0, 6000, 60000, 3)
    feed(st, member(10, 0, size=2))
    st.on_end_request(end(0, 10, "COMMIT"), T0)
    st.on_eof("op", T0)
    assert feed(st, member(11, 1, size=2)) == []  # still recovering: half not at its end
    [finish] = st.on_eof("half", T0)
    assert [h.offset for h in finish.records] == [10, 11]


def test_a_refused_member_sets_the_whole_transaction_aside():
    st = live()
    feed(st, member(10, 0, size=2), member(11, 1, size=2, topic="missing"))
    [finish] = st.on_end_request(end(0, 10, "COMMIT"), T0)
    discard = st.set_aside(finish, DiscardReason.UNKNOWN_TOPIC, "member 1: no topic")
    assert [h.offset for h in discard.records] == [10, 11]
    assert st.decided[11][1] is TxnState.DISCARDED


def test_a_late_member_after_a_rollback_is_rolled_back_at_once_never_checked():
    st = live(timeout=1000)
    feed(st, member(10, 0, size=3))
    st.on_end_request(end(0, 10, "ROLLBACK"), T0)
    [late] = feed(st, member(11, 1, size=3))
    assert isinstance(late, Finish) and late.outcome is TxnState.ROLLED_BACK
    assert [h.offset for h in late.records] == [11]
    assert st.pending == {} and st.due(T0 + 1000) == [] and st.half_commit == 12
    [late] = feed(st, member(12, 2, size=3))
    assert late.outcome is TxnState.ROLLED_BACK


def test_a_late_member_after_a_discard_is_set_aside_with_the_same_reason():
    st = live(check_max=1, timeout=1000)
    feed(st, member(10, 0, size=2))
    st.due(T0 + 1000)
    [discard] = st.on_end_request(end(0, 10, "UNKNOWN", from_check=True, seq=1), T0)
    assert discard.reason is DiscardReason.CHECK_MAX
    [late] = feed(st, member(11, 1, size=2))
    assert isinstance(late, Discard) and late.reason is DiscardReason.CHECK_MAX
    assert "a member read after that" in late.detail and st.decided[11][1] is TxnState.DISCARDED


def test_after_a_restart_a_late_member_is_checked_on_its_own():
    # The closed transactions live in memory: a new state checks the member, and the
    # producer answers ROLLBACK as it did the first time.
    st = live(timeout=1000)
    feed(st, member(11, 1, size=2))
    [check] = st.due(T0 + 1000)
    assert isinstance(check, IssueCheck) and check.half.offset == 11


def test_an_end_of_partition_read_before_the_commit_never_makes_it_incomplete():
    st = live()
    feed(st, member(10, 0, size=2))
    st.on_eof("half", T0)  # the end as of member 0: member 1 not written yet
    assert st.on_end_request(end(5, 10, "COMMIT"), T0 + 1) == []
    # The half partition's fetch stalls: no record and no fresh end of partition for long.
    assert [a for a in st.due(T0 + 10 * GRACE) if isinstance(a, Discard)] == []
    [finish] = feed(st, member(11, 1, size=2))
    assert isinstance(finish, Finish) and [h.offset for h in finish.records] == [10, 11]


def test_an_end_of_partition_read_after_the_commit_makes_it_incomplete():
    st = live()
    feed(st, member(10, 0, size=2))
    st.on_eof("half", T0)
    st.on_end_request(end(5, 10, "COMMIT"), T0 + 1)
    # An idle partition reports no end by itself: the I/O layer is asked to read to it again.
    assert not st.wants_half_end(T0 + GRACE)
    assert st.wants_half_end(T0 + GRACE + 1) and not st.wants_half_end(T0 + GRACE + 2)
    st.on_eof("half", T0 + GRACE + 5)  # a fresh end: member 1 never came
    assert not st.wants_half_end(T0 + 3 * GRACE)
    [discard] = st.due(T0 + GRACE + 6)
    assert isinstance(discard, Discard) and discard.reason is DiscardReason.INCOMPLETE


def test_a_commit_follows_a_transaction_re_appended_with_members_unread():
    # Model example (campaign profile): member 0 was re-appended past the horizon before
    # member 1 was read; member 1 is read at its first offset, then member 0's new record.
    # The producer's COMMIT (to member 0's first offset) was read in between.
    st = live(horizon=1000)
    feed(st, member(10, 0, size=2))
    [move] = st.due(T0 + 1000)
    assert isinstance(move, Reappend) and [h.offset for h in move.records] == [10]
    assert st.on_end_request(end(3, 10, "COMMIT"), T0 + 1000) == []  # waits for the record
    assert feed(st, member(11, 1, size=2)) == []
    again = member(12, 0, size=2)
    again = dataclasses.replace(again, headers=reappended_headers(again, move.carried))
    [finish] = st.on_half(12, again, T0 + 1000)
    assert isinstance(finish, Finish) and finish.outcome is TxnState.COMMITTED
    assert sorted(h.offset for h in finish.records) == [11, 12] and st.half_commit == 13


def test_a_commit_follows_a_transaction_re_appended_in_two_parts():
    # Model example (campaign profile): member 1 landed after the end of the partition was
    # read, when member 0 had been re-appended alone; member 1 is re-appended in turn. The
    # producer's COMMIT names member 0's first offset.
    st = live(horizon=1000)
    feed(st, member(10, 0, size=2))
    st.on_eof("half", T0)
    [first] = st.due(T0 + 1000)
    feed(st, member(11, 1, size=2))
    st.on_eof("half", T0)
    [second] = st.due(T0 + 1000)
    assert [h.offset for m in (first, second) for h in m.records] == [10, 11]
    assert st.on_end_request(end(3, 10, "COMMIT"), T0 + 1000) == []  # waits for the records
    actions = []
    for offset, (move, index) in enumerate([(first, 0), (second, 1)], start=12):
        again = member(offset, index, size=2)
        again = dataclasses.replace(again, headers=reappended_headers(again, move.carried))
        actions += st.on_half(offset, again, T0 + 1000)
    [finish] = actions
    assert isinstance(finish, Finish) and finish.outcome is TxnState.COMMITTED
    assert [h.offset for h in finish.records] == [12, 13] and st.half_commit == 14


def test_a_commit_waiting_for_members_is_not_re_appended_away():
    # Model example (campaign profile): a member checked on its own after a restart,
    # answered COMMIT, waited for member 0 (never to come) and was re-appended past the
    # horizon with the COMMIT forgotten, checked again, and so on for ever.
    st = live(horizon=1000)
    feed(st, member(10, 0, size=2))
    assert st.on_end_request(end(0, 10, "COMMIT"), T0) == []  # waits for member 1
    st.due(T0 + 1000)  # past the re-append horizon
    [finish] = feed(st, member(11, 1, size=2))
    assert isinstance(finish, Finish) and finish.outcome is TxnState.COMMITTED
    assert [h.offset for h in finish.records] == [10, 11]
