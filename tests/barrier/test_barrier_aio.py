"""The asyncio barrier (issue 20) on aiosqlite and on psycopg's AsyncConnection, driven step
by step on one loop: a check during an open local transaction waits for its outcome, one
before it refuses it, one past the lock timeout answers UNKNOW; the listener's outcomes.
Under the loop guard: no sqlite3 call runs on the loop's thread."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator

import pytest

from rmq_semantics import ConfigError, LocalTransactionState
from rmq_semantics.barrier import (
    AsyncBarrierTransactionListener,
    AsyncTransactionBarrier,
    BarrierRollback,
    TransactionBarrier,
)
from tests.barrier.conftest import Db, txn_message
from tests.loop_guard import LoopGuard, loop_guard

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
WAIT_S = 30.0  # bounds every wait of a test for another task


@pytest.fixture
def guard(monkeypatch) -> Iterator[LoopGuard]:
    with loop_guard(monkeypatch) as guard:
        yield guard
    assert guard.offences == [], "\n".join(guard.offences[:3])


class AsyncDb:
    """The async connections of one test database (``db``: its tables and checks)."""

    def __init__(self, db: Db, dsn_or_path: object) -> None:
        self.db = db
        self._where = dsn_or_path
        self._opened: list = []

    async def connect(self):
        if self.db.kind == "sqlite":
            import aiosqlite

            conn = await aiosqlite.connect(self._where, timeout=30)
        else:
            import psycopg

            conn = await psycopg.AsyncConnection.connect(self._where, connect_timeout=10)
        self._opened.append(conn)
        return conn

    async def insert_order(self, cursor, msg) -> None:
        p = self.db.param
        await cursor.execute(
            f"INSERT INTO {self.db.orders} VALUES ({p}, {p})",
            (msg.transaction_id, msg.value.decode()),
        )

    async def close(self) -> None:
        for conn in self._opened:
            await conn.close()


@pytest.fixture
def adb(db, request, tmp_path) -> AsyncDb:
    where = (
        tmp_path / "barrier.db" if db.kind == "sqlite" else request.getfixturevalue("postgres_dsn")
    )
    return AsyncDb(db, where)


async def _run(adb: AsyncDb, guard: LoopGuard, body) -> object:
    guard.arm()
    try:
        return await asyncio.wait_for(body(), WAIT_S)
    finally:
        guard.disarm()
        await adb.close()


def test_a_check_during_an_open_local_transaction_waits_and_answers_its_commit(adb, guard):
    waited = asyncio.Event()
    barrier = AsyncTransactionBarrier(
        table=adb.db.barrier_table, lock_timeout_s=WAIT_S, on_wait=lambda gid: waited.set()
    )
    msg = txn_message()

    async def body():
        inside, release = asyncio.Event(), asyncio.Event()

        async def local():
            async with barrier.local_transaction(await adb.connect(), msg) as txn:
                await adb.insert_order(txn.cursor, msg)
                inside.set()
                await release.wait()
            return txn.state

        local_done = asyncio.create_task(local())
        await inside.wait()
        check_done = asyncio.create_task(barrier.check(await adb.connect(), msg))
        await waited.wait()  # the check met the open local transaction, off the loop
        release.set()
        return await local_done, await check_done

    assert asyncio.run(_run(adb, guard, body)) == (COMMIT, COMMIT)
    assert adb.db.committed() == {msg.transaction_id}
    assert barrier.waited_checks == 1


def test_a_check_first_refuses_the_local_transaction_and_one_past_the_timeout_is_unknow(adb, guard):
    barrier = AsyncTransactionBarrier(table=adb.db.barrier_table, lock_timeout_s=0.2)
    first, held = txn_message(1), txn_message(2)

    async def body():
        assert await barrier.check(await adb.connect(), first) == ROLLBACK
        with pytest.raises(BarrierRollback, match="decided ROLLBACK before the local"):
            async with barrier.local_transaction(await adb.connect(), first) as txn:
                await adb.insert_order(txn.cursor, first)  # never runs
        async with barrier.local_transaction(await adb.connect(), held) as txn:
            await adb.insert_order(txn.cursor, held)
            timed_out = await barrier.check(await adb.connect(), held)
        return timed_out, await barrier.check(await adb.connect(), held)

    assert asyncio.run(_run(adb, guard, body)) == (UNKNOW, COMMIT)
    assert adb.db.committed() == {held.transaction_id}


def test_the_async_listener_answers_each_outcome_and_its_checks_from_the_rows(adb, guard):
    barrier = AsyncTransactionBarrier(table=adb.db.barrier_table)
    msgs = [txn_message(n) for n in range(4)]
    plans = {
        msgs[0].transaction_id: None,
        msgs[1].transaction_id: ROLLBACK,
        msgs[2].transaction_id: UNKNOW,
        msgs[3].transaction_id: "raise",
    }

    async def business(cursor, msg, arg):
        await adb.insert_order(cursor, msg)
        if plans[msg.transaction_id] == "raise":
            raise RuntimeError("the business failed")
        return plans[msg.transaction_id]

    async def body():
        lock = asyncio.Lock()  # one connection holds one transaction at a time
        conn = await adb.connect()

        @contextlib.asynccontextmanager
        async def connection() -> AsyncIterator:
            async with lock:
                yield conn

        listener = AsyncBarrierTransactionListener(
            barrier, connection=connection, business=business
        )
        answers = [await listener.execute_local_transaction(m, None) for m in msgs]
        checks = [await listener.check_local_transaction(m) for m in msgs]
        return answers, checks

    answers, checks = asyncio.run(_run(adb, guard, body))
    assert answers == [COMMIT, ROLLBACK, UNKNOW, ROLLBACK]
    assert checks == [COMMIT, ROLLBACK, COMMIT, ROLLBACK]
    assert adb.db.committed() == {msgs[0].transaction_id, msgs[2].transaction_id}
    if adb.db.kind == "sqlite":  # the guard did guard: aiosqlite's thread ran sqlite3
        assert guard.calls_elsewhere["sqlite3 Cursor.execute"] > 0


def test_a_sync_connection_for_the_async_barrier_and_the_reverse_are_refused(tmp_path):
    import aiosqlite

    async def body():
        conn = await aiosqlite.connect(tmp_path / "x.db")
        try:
            with pytest.raises(ConfigError, match="goes to AsyncTransactionBarrier"):
                TransactionBarrier().create_table(conn)
        finally:
            await conn.close()
        with pytest.raises(ConfigError, match="needs an aiosqlite or psycopg"):
            await AsyncTransactionBarrier().create_table(sqlite3.connect(tmp_path / "y.db"))
        with pytest.raises(ConfigError, match="must be an AsyncTransactionBarrier"):
            AsyncBarrierTransactionListener(
                TransactionBarrier(), connection=object, business=object
            )

    asyncio.run(body())
