"""What the pending-state machine decides: a half message's lifecycle (one transition
table) and the actions the coordinator writes in one Kafka transaction. Pure values."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rmq_semantics.errors import IllegalTransitionError
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.reappend import Carried
from rmq_semantics.records.reasons import DiscardReason

__all__ = [
    "TRANSITIONS",
    "Action",
    "Discard",
    "EndRequest",
    "Finish",
    "IssueCheck",
    "LateCommit",
    "Pending",
    "Reappend",
    "SaveCheckCounts",
    "TxnState",
    "transition",
]


class TxnState(Enum):
    """Lifecycle of a half message."""

    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"
    # This offset is done, the transaction pending again at a new one (re-append horizon).
    REAPPENDED = "REAPPENDED"


TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.PENDING: frozenset(
        {TxnState.COMMITTED, TxnState.ROLLED_BACK, TxnState.DISCARDED, TxnState.REAPPENDED}
    ),
    TxnState.COMMITTED: frozenset(),
    TxnState.ROLLED_BACK: frozenset(),
    TxnState.DISCARDED: frozenset(),
    TxnState.REAPPENDED: frozenset(),
}


def transition(current: TxnState, target: TxnState) -> TxnState:
    if target not in TRANSITIONS[current]:
        raise IllegalTransitionError(
            f"half message cannot go from {current.value} to {target.value}"
        )
    return target


# -- actions -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Finish:
    """Write a done marker; for COMMITTED also promote the record to its real topic."""

    half: HalfMessage
    outcome: TxnState
    checks_answered: int = 0
    # Every member of a multi-message transaction, in index order (``half`` is one of
    # them); empty for a transaction of one. All are written in this one Kafka transaction.
    members: tuple[HalfMessage, ...] = ()

    @property
    def records(self) -> tuple[HalfMessage, ...]:
        return self.members or (self.half,)


@dataclass(frozen=True)
class IssueCheck:
    """Send a check request and persist the new counts in a check marker."""

    half: HalfMessage
    check_seq: int
    checks_issued: int
    checks_answered: int
    answered_seq: int
    next_check_ts: int


@dataclass(frozen=True)
class SaveCheckCounts:
    """Persist counts after an answered-UNKNOWN check (no request goes out)."""

    half: HalfMessage
    checks_issued: int
    checks_answered: int
    answered_seq: int
    next_check_ts: int


@dataclass(frozen=True)
class Discard:
    """Copy the half message to the discard topic and write a DISCARDED done marker."""

    half: HalfMessage
    reason: DiscardReason
    checks_answered: int
    detail: str = ""  # for the log line
    members: tuple[HalfMessage, ...] = ()  # as Finish.members: every one is set aside

    @property
    def records(self) -> tuple[HalfMessage, ...]:
        return self.members or (self.half,)


@dataclass(frozen=True)
class LateCommit:
    """A COMMIT for a transaction already discarded: noted in the discard topic, so
    ``txn discarded`` shows it, and logged with its transaction id."""

    partition: int
    half_offset: int
    txn_id: str
    producer_group: str
    op_offset: int


@dataclass(frozen=True)
class Reappend:
    """Write the half message again at the end of its half partition, carrying its origin
    and check counts, and a REAPPENDED done marker for this offset (RocketMQ's
    putBackHalfMsgQueue, in one Kafka transaction: both or neither)."""

    half: HalfMessage
    carried: Carried
    members: tuple[HalfMessage, ...] = ()  # as Finish.members: all written again, in order

    @property
    def records(self) -> tuple[HalfMessage, ...]:
        return self.members or (self.half,)


# Everything the state machine asks the coordinator to write.
Action = Finish | IssueCheck | SaveCheckCounts | Discard | LateCommit | Reappend


@dataclass
class Pending:
    half: HalfMessage
    next_check_ts: int
    checks_issued: int = 0
    checks_answered: int = 0
    answered_seq: int = 0
    marker_op_offset: int | None = None  # latest check marker read back from Op
    state: TxnState = TxnState.PENDING
    poison: DiscardReason | None = None  # never promotable: set aside when due
    detail: str = ""  # why it is poison, for the log line


@dataclass(frozen=True)
class EndRequest:
    op_offset: int
    txn_id: str
    producer_group: str
    half_offset: int
    state: str  # COMMIT | ROLLBACK | UNKNOWN
    from_check: bool
    check_seq: int
    received_ms: int
