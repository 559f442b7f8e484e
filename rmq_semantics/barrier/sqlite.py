"""The barrier on SQLite (the standard library's sqlite3).

SQLite locks the whole database for writing, not a row: every barrier transaction begins
with ``BEGIN IMMEDIATE``, so a back-check that arrives while a local transaction is open
waits for the database's write lock (held by whichever local transaction writes now),
bounded by the busy timeout, which the check sets to the barrier's ``lock_timeout_s`` for
its own statements and restores afterwards.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from rmq_semantics.barrier.dialect import AsyncDialect, Dialect
from rmq_semantics.errors import IllegalStateError, RmqTimeoutError

__all__ = ["ASYNC_SQLITE", "SQLITE"]


def _busy(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED, extended codes included: another connection writes."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class SqliteDialect(Dialect):
    name = "sqlite"
    param = "?"
    # Unix seconds from SQLite's own clock, so purge needs no agreement on time zones.
    created_at_column = (
        "created_at INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER))"
    )

    def index_sql(self, schema: str, index: str, table: str) -> str:
        name = table.rpartition(".")[2]
        qualified = f"{schema}.{index}" if schema else index
        return f"CREATE INDEX IF NOT EXISTS {qualified} ON {name} (created_at)"

    def insert_ignore_sql(self, table: str) -> str:
        return (
            f"INSERT OR IGNORE INTO {table} (gid, branch_id, op, barrier_id, reason) "
            f"VALUES (?, ?, ?, ?, ?)"
        )

    def purge_sql(self, table: str) -> str:
        return f"DELETE FROM {table} WHERE created_at < CAST(strftime('%s', 'now') AS INTEGER) - ?"

    @contextmanager
    def transaction(
        self, conn: sqlite3.Connection, wait_s: float | None = None
    ) -> Iterator[sqlite3.Cursor]:
        if conn.in_transaction:
            raise IllegalStateError(
                "the barrier needs a connection with no transaction "
                "open (commit or roll back first)"
            )
        previous = None
        if wait_s is not None:
            previous = conn.execute("PRAGMA busy_timeout").fetchone()[0]
            conn.execute(f"PRAGMA busy_timeout = {max(0, round(wait_s * 1000))}")
        cursor = conn.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")  # the write lock first: see the module doc
            try:
                yield cursor
                conn.commit()
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
        except sqlite3.OperationalError as exc:
            if wait_s is not None and _busy(exc):
                raise RmqTimeoutError(f"the database stayed locked for {wait_s:.3f} s") from exc
            raise
        finally:
            cursor.close()
            if previous is not None:
                conn.execute(f"PRAGMA busy_timeout = {int(previous)}")


SQLITE = SqliteDialect()


class AsyncSqliteDialect(AsyncDialect):
    """The same on an aiosqlite connection: its thread waits for the lock, never the loop."""

    @asynccontextmanager
    async def transaction(self, conn: Any, wait_s: float | None = None) -> AsyncIterator[Any]:
        if conn.in_transaction:
            raise IllegalStateError(
                "the barrier needs a connection with no transaction "
                "open (commit or roll back first)"
            )
        previous = None
        if wait_s is not None:
            async with conn.execute("PRAGMA busy_timeout") as cursor:
                previous = (await cursor.fetchone())[0]
            await conn.execute(f"PRAGMA busy_timeout = {max(0, round(wait_s * 1000))}")
        cursor = await conn.cursor()
        try:
            await cursor.execute("BEGIN IMMEDIATE")
            try:
                yield cursor
                await conn.commit()
            except BaseException:
                if conn.in_transaction:
                    await conn.rollback()
                raise
        except sqlite3.OperationalError as exc:
            if wait_s is not None and _busy(exc):
                raise RmqTimeoutError(f"the database stayed locked for {wait_s:.3f} s") from exc
            raise
        finally:
            await cursor.close()
            if previous is not None:
                await conn.execute(f"PRAGMA busy_timeout = {int(previous)}")


ASYNC_SQLITE = AsyncSqliteDialect(SQLITE)
