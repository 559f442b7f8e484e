"""``BarrierTransactionListener``: a TransactionListener whose local transaction and
back-check go through a :class:`TransactionBarrier`, one new connection per call."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rmq_semantics.barrier.barrier import BarrierTransaction, TransactionBarrier
from rmq_semantics.errors import BarrierRollback, ConfigError
from rmq_semantics.message import Message
from rmq_semantics.transaction import LocalTransactionState, TransactionListener

__all__ = ["BarrierTransactionListener", "answered", "failed", "refused"]

log = logging.getLogger(__name__)

Business = Callable[[Any, Message, Any], LocalTransactionState | None]


# How a barrier listener's local transaction ends, for the synchronous and asyncio ones.
def refused(exc: BarrierRollback) -> LocalTransactionState:
    """A check decided ROLLBACK before the local transaction began: its body did not run."""
    log.info("%s", exc)
    return LocalTransactionState.ROLLBACK_MESSAGE


def failed(txn: BarrierTransaction | None, msg: Message) -> LocalTransactionState:
    """Called in the handler of what the local transaction raised (before the body, in it,
    or in the commit): the barrier row's outcome, which the check answers from too."""
    state = txn.state if txn is not None else LocalTransactionState.UNKNOW
    log.exception("txn=%s: local transaction failed (answering %s)", msg.transaction_id, state.name)
    return state


def answered(
    txn: BarrierTransaction,
    answer: LocalTransactionState | None,
) -> LocalTransactionState:
    """The business answered ``answer`` and the block ended: UNKNOW stays UNKNOW (committed,
    left to the check), else the outcome of the block."""
    return LocalTransactionState.UNKNOW if answer is LocalTransactionState.UNKNOW else txn.state


class BarrierTransactionListener(TransactionListener):
    """Runs ``business(cursor, msg, arg)`` inside the barrier's local transaction and answers
    back-checks from the barrier row.

    ``connect()`` returns a new sqlite3 or psycopg connection, closed after each call.
    ``business`` returns None or COMMIT_MESSAGE to commit, ROLLBACK_MESSAGE to roll back, or
    UNKNOW to commit and leave the answer to the back-check; if it raises, the local
    transaction rolls back and the answer is ROLLBACK_MESSAGE. A check that decided ROLLBACK
    first makes the answer ROLLBACK_MESSAGE without running ``business``.
    """

    def __init__(
        self, barrier: TransactionBarrier, *, connect: Callable[[], Any], business: Business
    ) -> None:
        if not isinstance(barrier, TransactionBarrier):
            raise ConfigError(f"barrier must be a TransactionBarrier, got {barrier!r}")
        if not callable(connect) or not callable(business):
            raise ConfigError("connect and business must be callables")
        self.barrier = barrier
        self._connect = connect
        self._business = business

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        conn = self._connect()
        txn: BarrierTransaction | None = None
        answer: LocalTransactionState | None = None
        try:
            with self.barrier.local_transaction(conn, msg) as txn:
                answer = self._business(txn.cursor, msg, arg)
                if answer is LocalTransactionState.ROLLBACK_MESSAGE:
                    txn.set_rollback_only()
        except BarrierRollback as exc:
            return refused(exc)
        except Exception:
            return failed(txn, msg)
        finally:
            conn.close()
        return answered(txn, answer)

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        conn = self._connect()
        try:
            return self.barrier.check(conn, msg)
        finally:
            conn.close()
