"""``TransactionBarrier``: dtm's two-phase message barrier on the local database.

The local transaction inserts its barrier row first, keyed by the transaction id; the
back-check inserts a ROLLBACK row under the same key unless one exists, then reads the row.
The unique key makes them serialize: a check during an open local transaction waits for it
(bounded by ``lock_timeout_s``, then UNKNOW: the coordinator asks again); a check before it
wins, and the local transaction is refused before its body runs. So the check's answer is
always the local transaction's outcome.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rmq_semantics.barrier.connections import dialect_of
from rmq_semantics.barrier.dialect import validate_table
from rmq_semantics.errors import BarrierRollback, ConfigError, IllegalStateError, RmqTimeoutError
from rmq_semantics.message import Message
from rmq_semantics.transaction import LocalTransactionState
from rmq_semantics.transaction_api import Transaction

__all__ = [
    "DEFAULT_TABLE",
    "LOCK_TIMEOUT_S",
    "BarrierRules",
    "BarrierTransaction",
    "RollbackRequested",
    "TransactionBarrier",
    "answer_of",
    "purge_seconds",
    "transaction_id",
]

log = logging.getLogger(__name__)

DEFAULT_TABLE = "rmq_barrier"
# A check waits this long for an open local transaction, then answers UNKNOW; short, as the
# producer's check worker answers nothing else meanwhile.
LOCK_TIMEOUT_S = 2.0
# The check's first try does not wait, so it can tell that it met an open local transaction.
NO_WAIT_S = 0.001
REASON_COMMITTED = "msg"  # dtm's reason of the local transaction's row (its op)
REASON_ROLLBACK = "rollback"


class RollbackRequested(Exception):
    """Ends a local transaction by rolling it back without an error for the caller."""


@dataclass
class BarrierTransaction:
    """One local transaction under the barrier: run business SQL on ``cursor``; ``state`` is
    its outcome once the ``with`` block ended (ROLLBACK_MESSAGE if the body raised or called
    :meth:`set_rollback_only`, UNKNOW if the commit itself failed)."""

    gid: str
    cursor: Any = None
    state: LocalTransactionState = LocalTransactionState.UNKNOW
    rollback_only: bool = field(default=False, repr=False)

    def set_rollback_only(self) -> None:
        """Roll back at the end of the block instead of committing, without raising."""
        self.rollback_only = True


def transaction_id(msg: Message | Transaction) -> str:
    """The barrier's gid: the transaction id the producer gives its listener's messages."""
    gid = getattr(msg, "transaction_id", None)
    if not isinstance(gid, str) or not gid:
        raise ConfigError(
            f"the barrier needs msg.transaction_id (set on the messages a "
            f"TransactionProducer hands its listener), got {gid!r}"
        )
    return gid


def purge_seconds(older_than: object) -> float:
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ConfigError(
            f"older_than must be a positive timedelta or number of seconds, got {older_than!r}"
        )
    return float(seconds)


class BarrierRules:
    """What the synchronous and the asyncio barrier share: the settings, the count of checks
    that waited, and what a row's reason means.

    ``table`` is the barrier table (create it with ``create_table``); ``lock_timeout_s``
    bounds how long ``check`` waits for an open local transaction; ``on_wait(gid)`` is
    called when a check finds one (the count is :attr:`waited_checks`).
    """

    def __init__(
        self,
        *,
        table: str = DEFAULT_TABLE,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.table = validate_table(table)
        if (
            isinstance(lock_timeout_s, bool)
            or not isinstance(lock_timeout_s, (int, float))
            or lock_timeout_s <= 0
        ):
            raise ConfigError(f"lock_timeout_s must be a positive number, got {lock_timeout_s!r}")
        self.lock_timeout_s = float(lock_timeout_s)
        self._on_wait = on_wait
        self._lock = threading.Lock()
        self._waited = 0

    @property
    def waited_checks(self) -> int:
        """Checks that found the transaction's local transaction still open and waited."""
        return self._waited

    def _met_open_transaction(self, gid: str) -> None:
        with self._lock:
            self._waited += 1
        if self._on_wait is not None:
            self._on_wait(gid)

    def _refuse(self, reason: str | None, gid: str) -> None:
        if reason == REASON_COMMITTED:
            raise IllegalStateError(
                f"txn={gid}: its local transaction already ran and "
                f"committed (barrier table {self.table})"
            )
        raise BarrierRollback(
            f"txn={gid}: a back-check decided ROLLBACK before the local "
            f"transaction began (barrier table {self.table}); its body "
            f"was not run"
        )

    def _gave_up(self, gid: str) -> LocalTransactionState:
        log.info(
            "txn=%s: its local transaction still holds the barrier after %.1f s; "
            "answering UNKNOW (the coordinator checks again)",
            gid,
            self.lock_timeout_s,
        )
        return LocalTransactionState.UNKNOW


def answer_of(reason: str | None) -> LocalTransactionState:
    """A check's answer from the barrier row's reason."""
    if reason == REASON_COMMITTED:
        return LocalTransactionState.COMMIT_MESSAGE
    return LocalTransactionState.ROLLBACK_MESSAGE


class TransactionBarrier(BarrierRules):
    """dtm's barrier for one table on SQLite (``sqlite3``) or PostgreSQL (psycopg 3)
    connections; the settings are :class:`BarrierRules`'."""

    def create_table(self, conn: Any) -> None:
        """Create the barrier table and its purge index if missing (committed)."""
        dialect = dialect_of(conn)
        with dialect.transaction(conn) as cursor:
            for sql in dialect.create_table_sql(self.table):
                cursor.execute(sql)

    @contextmanager
    def local_transaction(
        self, conn: Any, msg: Message | Transaction
    ) -> Iterator[BarrierTransaction]:
        """Begin a transaction on ``conn`` and insert the barrier row before the body.

        Raises :class:`BarrierRollback` before the body when a check already decided
        ROLLBACK. The body's exception rolls back and propagates; otherwise the block commits.
        """
        dialect = dialect_of(conn)
        txn = BarrierTransaction(transaction_id(msg))
        try:
            with dialect.transaction(conn) as cursor:
                if not dialect.insert_ignore(cursor, self.table, txn.gid, REASON_COMMITTED):
                    self._refuse(dialect.reason(cursor, self.table, txn.gid), txn.gid)
                txn.cursor = cursor
                txn.state = LocalTransactionState.ROLLBACK_MESSAGE  # until the body returns
                yield txn
                if txn.rollback_only:
                    raise RollbackRequested
                txn.state = LocalTransactionState.UNKNOW  # until the commit returns
            txn.state = LocalTransactionState.COMMIT_MESSAGE
        except RollbackRequested:
            txn.state = LocalTransactionState.ROLLBACK_MESSAGE

    def check(self, conn: Any, msg: Message | Transaction) -> LocalTransactionState:
        """The back-check: insert a ROLLBACK row unless one exists, then answer from the row.

        Waits for an open local transaction of the same id up to ``lock_timeout_s``, then
        answers UNKNOW (the coordinator checks again later).
        """
        dialect = dialect_of(conn)
        gid = transaction_id(msg)
        try:
            reason = self._decide(dialect, conn, gid, NO_WAIT_S)
        except RmqTimeoutError:
            self._met_open_transaction(gid)
            try:
                reason = self._decide(dialect, conn, gid, self.lock_timeout_s)
            except RmqTimeoutError:
                return self._gave_up(gid)
        return answer_of(reason)

    def _decide(self, dialect, conn: Any, gid: str, wait_s: float) -> str | None:
        with dialect.transaction(conn, wait_s=wait_s) as cursor:
            dialect.insert_ignore(cursor, self.table, gid, REASON_ROLLBACK)
            return dialect.reason(cursor, self.table, gid)

    def purge(self, conn: Any, *, older_than: timedelta | float) -> int:
        """Delete barrier rows older than ``older_than``; returns how many went. Keep rows at
        least as long as a transaction can still be checked (README, "The barrier")."""
        dialect = dialect_of(conn)
        seconds = purge_seconds(older_than)
        with dialect.transaction(conn) as cursor:
            cursor.execute(dialect.purge_sql(self.table), (seconds,))
            return cursor.rowcount
