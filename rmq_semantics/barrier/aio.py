"""The barrier for asyncio services: :class:`AsyncTransactionBarrier` on aiosqlite or psycopg's
``AsyncConnection``, and :class:`AsyncBarrierTransactionListener` for the
``AsyncTransactionProducer``. The same rules, rows and answers as the synchronous barrier
(:mod:`rmq_semantics.barrier.barrier`); every statement is awaited, so a check waiting for an
open local transaction waits in aiosqlite's thread or in the server, never on the loop."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from typing import Any

from rmq_semantics.barrier.barrier import (
    NO_WAIT_S,
    REASON_COMMITTED,
    REASON_ROLLBACK,
    BarrierRules,
    BarrierTransaction,
    RollbackRequested,
    answer_of,
    purge_seconds,
    transaction_id,
)
from rmq_semantics.barrier.connections import async_dialect_of
from rmq_semantics.barrier.dialect import AsyncDialect
from rmq_semantics.barrier.listener import answered, failed, refused
from rmq_semantics.errors import BarrierRollback, ConfigError, RmqTimeoutError
from rmq_semantics.message import Message
from rmq_semantics.transaction_api import LocalTransactionState, Transaction

__all__ = ["AsyncBarrierTransactionListener", "AsyncTransactionBarrier"]


class AsyncTransactionBarrier(BarrierRules):
    """dtm's barrier for one table on aiosqlite or psycopg (3) ``AsyncConnection`` objects,
    with :class:`~rmq_semantics.barrier.TransactionBarrier`'s settings and methods, awaited."""

    async def create_table(self, conn: Any) -> None:
        """Create the barrier table and its purge index if missing (committed)."""
        dialect = async_dialect_of(conn)
        async with dialect.transaction(conn) as cursor:
            for sql in dialect.sql.create_table_sql(self.table):
                await cursor.execute(sql)

    @asynccontextmanager
    async def local_transaction(
        self, conn: Any, msg: Message | Transaction
    ) -> AsyncIterator[BarrierTransaction]:
        """``async with``: as :meth:`TransactionBarrier.local_transaction` (the barrier row
        first, :class:`BarrierRollback` before the body when a check decided ROLLBACK)."""
        dialect = async_dialect_of(conn)
        txn = BarrierTransaction(transaction_id(msg))
        try:
            async with dialect.transaction(conn) as cursor:
                if not await dialect.insert_ignore(cursor, self.table, txn.gid, REASON_COMMITTED):
                    self._refuse(await dialect.reason(cursor, self.table, txn.gid), txn.gid)
                txn.cursor = cursor
                txn.state = LocalTransactionState.ROLLBACK_MESSAGE  # until the body returns
                yield txn
                if txn.rollback_only:
                    raise RollbackRequested
                txn.state = LocalTransactionState.UNKNOW  # until the commit returns
            txn.state = LocalTransactionState.COMMIT_MESSAGE
        except RollbackRequested:
            txn.state = LocalTransactionState.ROLLBACK_MESSAGE

    async def check(self, conn: Any, msg: Message | Transaction) -> LocalTransactionState:
        """The back-check, as :meth:`TransactionBarrier.check`: UNKNOW after waiting
        ``lock_timeout_s`` for an open local transaction."""
        dialect = async_dialect_of(conn)
        gid = transaction_id(msg)
        try:
            reason = await self._decide(dialect, conn, gid, NO_WAIT_S)
        except RmqTimeoutError:
            self._met_open_transaction(gid)
            try:
                reason = await self._decide(dialect, conn, gid, self.lock_timeout_s)
            except RmqTimeoutError:
                return self._gave_up(gid)
        return answer_of(reason)

    async def _decide(
        self, dialect: AsyncDialect, conn: Any, gid: str, wait_s: float
    ) -> str | None:
        async with dialect.transaction(conn, wait_s=wait_s) as cursor:
            await dialect.insert_ignore(cursor, self.table, gid, REASON_ROLLBACK)
            return await dialect.reason(cursor, self.table, gid)

    async def purge(self, conn: Any, *, older_than: timedelta | float) -> int:
        """Delete barrier rows older than ``older_than``; returns how many went."""
        dialect = async_dialect_of(conn)
        seconds = purge_seconds(older_than)
        async with dialect.transaction(conn) as cursor:
            await cursor.execute(dialect.sql.purge_sql(self.table), (seconds,))
            return cursor.rowcount


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncBarrierTransactionListener:
    """:class:`~rmq_semantics.barrier.BarrierTransactionListener` for the
    ``AsyncTransactionProducer``: ``await business(cursor, msg, arg)`` runs inside the
    barrier's local transaction, and back-checks answer from the barrier row.

    ``connection()`` returns an async context manager that yields a connection for one call
    and takes it back: psycopg_pool's ``AsyncConnectionPool.connection``, or a lock around one
    aiosqlite connection (one connection holds one transaction at a time). ``business``
    answers as the synchronous listener's does.
    """

    def __init__(
        self,
        barrier: AsyncTransactionBarrier,
        *,
        connection: Callable[[], AbstractAsyncContextManager[Any]],
        business: Callable[..., Any],
    ) -> None:
        if not isinstance(barrier, AsyncTransactionBarrier):
            raise ConfigError(f"barrier must be an AsyncTransactionBarrier, got {barrier!r}")
        if not callable(connection) or not callable(business):
            raise ConfigError("connection and business must be callables")
        self.barrier = barrier
        self._connection = connection
        self._business = business

    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        txn: BarrierTransaction | None = None
        answer: LocalTransactionState | None = None
        try:
            async with self._connection() as conn, self.barrier.local_transaction(conn, msg) as txn:
                answer = await _awaited(self._business(txn.cursor, msg, arg))
                if answer is LocalTransactionState.ROLLBACK_MESSAGE:
                    txn.set_rollback_only()
        except BarrierRollback as exc:
            return refused(exc)
        except Exception:
            return failed(txn, msg)
        return answered(txn, answer)

    async def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        async with self._connection() as conn:
            return await self.barrier.check(conn, msg)
