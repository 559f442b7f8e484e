"""A ROLLBACK that names a transaction id but no half offset (``half_offset`` -1): what a
producer sends once a half write was reported failed, so that record is never promoted
should it land anyway (issue 29). First decision wins, as for any end request."""

from __future__ import annotations

import dataclasses

from coordinator.rollback_ids import ROLLBACK_IDS_KEEP_MS, RollbackIds
from coordinator.state import Finish, PartitionState, TxnState
from tests.unit.test_txn_state import T0, end, half, live


def by_id(op: int, txn: str, *, group: str = "pg", state: str = "ROLLBACK"):
    return end(op, -1, state, txn=txn, group=group)


def test_a_half_landing_after_its_rollback_is_rolled_back_on_arrival_not_checked():
    st = live(timeout=1000)
    assert st.on_end_request(by_id(0, "t5"), T0) == []
    [action] = st.on_half(5, half(5), T0)
    assert isinstance(action, Finish) and action.outcome is TxnState.ROLLED_BACK
    assert not st.pending and st.due(T0 + 60_000) == []
    # A check's COMMIT read later is a conflicting decision: nothing is promoted.
    assert st.on_end_request(end(1, 5, "COMMIT", from_check=True, seq=1), T0) == []
    assert st.counters["conflicting_decisions"] == 1


def test_a_pending_half_is_rolled_back_by_its_transaction_id():
    st = live()
    st.on_half(3, half(3), T0)
    [action] = st.on_end_request(by_id(0, "t3"), T0)
    assert isinstance(action, Finish) and action.outcome is TxnState.ROLLED_BACK


def test_the_first_decision_wins_and_another_group_is_rejected():
    st = live()
    st.on_half(0, half(0), T0)
    [commit] = st.on_end_request(end(0, 0, "COMMIT"), T0)
    assert commit.outcome is TxnState.COMMITTED
    st.on_end_request(by_id(1, "t0"), T0)  # too late: remembered, never matches again
    st.on_half(1, half(1), T0)
    assert st.on_end_request(by_id(2, "t1", group="evil"), T0) == []
    assert st.counters["rejected_mismatch"] == 1 and 1 in st.pending
    assert st.on_end_request(by_id(3, "t1", state="COMMIT"), T0) == []
    assert 1 in st.pending  # only a ROLLBACK may name no offset


def test_a_rollback_read_during_recovery_applies_once_recovery_ends_and_survives_restarts():
    st = PartitionState(0, 1000, 60000, 3)
    assert st.on_end_request(by_id(7, "t2"), T0) == []
    st.on_half(2, half(2), T0)
    st.on_eof("half", T0)
    actions = st.on_eof("op", T0)
    assert [(a.half.offset, a.outcome) for a in actions] == [(2, TxnState.ROLLED_BACK)]
    # Waiting for a half that has not come: its op offset stays uncommitted until it does.
    st.on_end_request(by_id(8, "t9"), T0)
    assert st.op_commit == 8
    [late] = st.on_half(9, half(9), T0)
    assert late.outcome is TxnState.ROLLED_BACK and st.op_commit == 9


# -- remembered per producer group (issue 44) --------------------------------------------------
def _remembered(ids: RollbackIds, group: str, n: int, first_op: int = 0) -> int:
    return sum(ids.remember(by_id(first_op + i, f"{group}-{i}", group=group)) for i in range(n))


def test_a_flood_of_one_groups_rollbacks_drops_only_its_own_oldest():
    ids = RollbackIds(per_group=3, total=100)
    ids.remember(by_id(0, "a-0", group="ga"))
    assert _remembered(ids, "gb", 10, first_op=1) == 7
    assert ("ga", "a-0") in ids and len(ids) == 4
    assert [("gb", f"gb-{i}") in ids for i in (6, 7, 8, 9)] == [False, True, True, True]
    assert ids.oldest_op() == 0  # ga's still holds the op offset a restart replays from


def test_the_total_bound_drops_from_the_group_holding_the_most():
    """Over ``total``, the oldest of the largest group goes: a group holding no more than
    total / groups never loses one to another's requests."""
    ids = RollbackIds(per_group=10, total=12)
    _remembered(ids, "ga", 4)
    _remembered(ids, "gc", 2, first_op=10)
    assert _remembered(ids, "gb", 10, first_op=20) == 4
    assert len(ids) == 12 and ids.sizes() == {"ga": 4, "gb": 6, "gc": 2}
    assert _remembered(ids, "gd", 2, first_op=40) == 2  # gb, the largest, pays each time
    assert ids.sizes() == {"ga": 4, "gb": 4, "gc": 2, "gd": 2}
    assert ("gb", "gb-5") not in ids and ("gb", "gb-6") in ids
    # However long gd goes on, gc (under 12 / 4 groups) keeps both of its own.
    _remembered(ids, "gd", 10, first_op=50)
    assert ids.sizes()["gc"] == 2 and len(ids) == 12


def test_another_groups_rollback_naming_the_same_id_leaves_the_groups_own_in_place():
    st = live()
    st.on_end_request(by_id(0, "t4"), T0)
    st.on_end_request(by_id(1, "t4", group="evil"), T0)
    [action] = st.on_half(4, half(4), T0)
    assert isinstance(action, Finish) and action.outcome is TxnState.ROLLED_BACK
    assert ("evil", "t4") in st.rolled_back_ids  # never matches: it expires


def test_remembered_rollbacks_expire_in_op_order_across_groups():
    ids = RollbackIds()
    ids.remember(by_id(0, "x", group="ga"))
    ids.remember(dataclasses.replace(by_id(1, "y", group="gb"), received_ms=T0 + 10))
    assert ids.expire(T0 + ROLLBACK_IDS_KEEP_MS) == 1
    assert ids.oldest_op() == 1 and ("gb", "y") in ids
    assert ids.take("gb", "y") is not None and len(ids) == 0 and ids.oldest_op() is None
