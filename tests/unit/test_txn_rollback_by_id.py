"""A ROLLBACK that names a transaction id but no half offset (``half_offset`` -1): what a
producer sends once a half write was reported failed, so that record is never promoted
should it land anyway (issue 29). First decision wins, as for any end request."""

from __future__ import annotations

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
