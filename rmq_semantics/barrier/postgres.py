"""The barrier on PostgreSQL (psycopg 3).

The barrier row's unique key is the lock: a back-check's ``INSERT ... ON CONFLICT DO
NOTHING`` waits for an open local transaction that inserted the same key, until it commits
(the check then reads its row: COMMIT) or rolls back (the check's row goes in: ROLLBACK).
The wait is bounded by ``lock_timeout`` set for the check's own transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from rmq_semantics.barrier.dialect import AsyncDialect, Dialect
from rmq_semantics.errors import IllegalStateError, RmqTimeoutError

__all__ = ["ASYNC_POSTGRES", "POSTGRES"]


class PostgresDialect(Dialect):
    name = "postgres"
    param = "%s"
    created_at_column = "created_at TIMESTAMPTZ NOT NULL DEFAULT now()"

    def index_sql(self, schema: str, index: str, table: str) -> str:
        return f"CREATE INDEX IF NOT EXISTS {index} ON {table} (created_at)"

    def insert_ignore_sql(self, table: str) -> str:
        return (
            f"INSERT INTO {table} (gid, branch_id, op, barrier_id, reason) "
            f"VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
        )

    def purge_sql(self, table: str) -> str:
        return f"DELETE FROM {table} WHERE created_at < now() - make_interval(secs => %s)"

    @contextmanager
    def transaction(self, conn: psycopg.Connection, wait_s: float | None = None) -> Iterator[Any]:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise IllegalStateError(
                "the barrier needs a connection with no transaction "
                "open (commit or roll back first)"
            )
        try:
            # transaction() begins and commits whether or not the connection autocommits.
            with conn.transaction(), conn.cursor() as cursor:
                if wait_s is not None:
                    # A check reads what committed since its insert waited: a fresh snapshot
                    # per statement, whatever the connection's default isolation.
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    cursor.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        (f"{max(1, round(wait_s * 1000))}ms",),
                    )
                yield cursor
        except pg_errors.LockNotAvailable as exc:
            if wait_s is None:
                raise
            raise RmqTimeoutError(f"the barrier row stayed locked for {wait_s:.3f} s") from exc


POSTGRES = PostgresDialect()


class AsyncPostgresDialect(AsyncDialect):
    """The same on psycopg's AsyncConnection: the server waits for the lock, the loop runs."""

    @asynccontextmanager
    async def transaction(
        self, conn: psycopg.AsyncConnection, wait_s: float | None = None
    ) -> AsyncIterator[Any]:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise IllegalStateError(
                "the barrier needs a connection with no transaction "
                "open (commit or roll back first)"
            )
        try:
            async with conn.transaction(), conn.cursor() as cursor:
                if wait_s is not None:  # as the synchronous dialect's check
                    await cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    await cursor.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        (f"{max(1, round(wait_s * 1000))}ms",),
                    )
                yield cursor
        except pg_errors.LockNotAvailable as exc:
            if wait_s is None:
                raise
            raise RmqTimeoutError(f"the barrier row stayed locked for {wait_s:.3f} s") from exc


ASYNC_POSTGRES = AsyncPostgresDialect(POSTGRES)
