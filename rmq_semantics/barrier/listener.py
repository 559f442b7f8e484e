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

__all__ = ["BarrierTransactionListener"]

log = logging.getLogger(__name__)

Business = Callable[[Any, Message, Any], LocalTransactionState | None]


class BarrierTransactionListener(TransactionListener):
    """Runs ``business(cursor, msg, arg)`` inside the barrier's local transaction and answers
    back-checks from the barrier row.

    ``connect()`` returns a new sqlite3 or psycopg connection, closed after each call.
    ``business`` returns None or COMMIT_MESSAGE to commit, ROLLBACK_MESSAGE to roll back, or
    UNKNOW to commit and leave the answer to the back-check; if it raises, the local
    transaction rolls back and the answer is ROLLBACK_MESSAGE. A check that decided ROLLBACK
    first makes the answer ROLLBACK_MESSAGE without running ``business``.
    """

    def __init__(self, barrier: TransactionBarrier, *, connect: Callable[[], Any],
                 business: Business) -> None:
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
            log.info("%s", exc)
            return LocalTransactionState.ROLLBACK_MESSAGE
        except Exception:
            # Failed before the body or in the commit: the check answers from the barrier row.
            state = txn.state if txn is not None else LocalTransactionState.UNKNOW
            log.exception("txn=%s: local transaction failed (answering %s)",
                          msg.transaction_id, state.name)
            return state
        finally:
            conn.close()
        if answer is LocalTransactionState.UNKNOW:
            return LocalTransactionState.UNKNOW
        return txn.state

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        conn = self._connect()
        try:
            return self.barrier.check(conn, msg)
        finally:
            conn.close()
