"""Fixtures of the barrier tests: ``db``, one database per test on SQLite (a temp file) and
on PostgreSQL (the session's own server, tests/barrier/postgres.py), with a fresh barrier
table and a business table; ``db.barrier()`` makes the barrier under test.

No PostgreSQL server can be had: the PostgreSQL cases skip with one reason, or fail when
``RMQ_REQUIRE`` names ``postgres``. ``RMQ_TEST_BARRIER_NAIVE=1`` swaps the barrier's check
for the plain SELECT of the business answer (no insert, no wait), to see the race tests fail
without the barrier.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rmq_semantics import LocalTransactionState, Message
from rmq_semantics.barrier import TransactionBarrier
from rmq_semantics.barrier.barrier import REASON_COMMITTED, transaction_id
from rmq_semantics.barrier.connections import dialect_of
from tests.barrier.postgres import PostgresServer, PostgresUnavailable
from tests.require import missing

NAIVE = os.environ.get("RMQ_TEST_BARRIER_NAIVE") == "1"


class NaiveBarrier(TransactionBarrier):
    """The check most listeners do: read the row, answer ROLLBACK when it is not there."""

    def check(self, conn: Any, msg: Message) -> LocalTransactionState:
        gid = transaction_id(msg)
        cursor = conn.cursor()
        try:
            reason = dialect_of(conn).reason(cursor, self.table, gid)
        finally:
            cursor.close()
            conn.rollback()
        if self._on_wait is not None:  # tests waiting for a check to meet their txn go on
            self._on_wait(gid)
        if reason == REASON_COMMITTED:
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE


class Db:
    """One database of one kind: fresh connections, a barrier table, the ``orders`` rows."""

    def __init__(self, kind: str, connect: Callable[[], Any]) -> None:
        self.kind = kind
        self._connect = connect
        self._opened: list[Any] = []
        suffix = uuid.uuid4().hex[:10]
        self.barrier_table = f"barrier_{suffix}"
        self.orders = f"orders_{suffix}"
        self.param = "?" if kind == "sqlite" else "%s"
        conn = self.connect()
        TransactionBarrier(table=self.barrier_table).create_table(conn)
        conn.execute(f"CREATE TABLE {self.orders} (txn_id TEXT PRIMARY KEY, value TEXT)")
        conn.commit()

    def connect(self) -> Any:
        conn = self._connect()
        self._opened.append(conn)
        return conn

    def barrier(self, **options: Any) -> TransactionBarrier:
        kind = NaiveBarrier if NAIVE else TransactionBarrier
        return kind(table=self.barrier_table, **options)

    def insert_order(self, cursor: Any, msg: Message) -> None:
        cursor.execute(
            f"INSERT INTO {self.orders} VALUES ({self.param}, {self.param})",
            (msg.transaction_id, (msg.value or b"").decode()),
        )

    def committed(self) -> set[str]:
        """Transaction ids of the committed business rows."""
        return {row[0] for row in self.query(f"SELECT txn_id FROM {self.orders}")}

    def query(self, sql: str, *args: Any) -> list[tuple]:
        conn = self.connect()
        try:
            rows = conn.execute(sql, args).fetchall()
        finally:
            conn.rollback()
        return [tuple(r) for r in rows]

    def close(self) -> None:
        for conn in self._opened:
            conn.close()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing(
            "postgres", "no PostgreSQL: psycopg is not installed (pip install -e '.[postgres]')"
        )
    server = PostgresServer()
    try:
        dsn = server.start()
    except PostgresUnavailable as exc:
        server.stop()
        missing("postgres", f"no PostgreSQL server: {exc}")
    try:
        yield dsn
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path) -> Iterator[Db]:
    if request.param == "sqlite":
        path = tmp_path / "barrier.db"
        # Local transactions of many threads queue for SQLite's one write lock.
        database = Db("sqlite", lambda: sqlite3.connect(path, timeout=30, check_same_thread=False))
    else:
        import psycopg

        dsn = request.getfixturevalue("postgres_dsn")
        database = Db("postgres", lambda: psycopg.connect(dsn, connect_timeout=10))
    try:
        yield database
    finally:
        database.close()


def txn_message(n: int = 0, topic: str = "orders") -> Message:
    """A message as a TransactionProducer hands it to its listener: with a transaction id."""
    return Message(topic, f"order-{n}".encode(), transaction_id=uuid.uuid4().hex)
