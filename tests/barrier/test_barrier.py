"""The barrier on each database, driven step by step from the test: a back-check during an
open local transaction waits for its outcome, one before it refuses it, one past the lock
timeout answers UNKNOW; purge, and the errors of bad input."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from rmq_semantics import ConfigError, LocalTransactionState, Message
from rmq_semantics.barrier import BarrierRollback, TransactionBarrier
from rmq_semantics.errors import IllegalStateError
from tests.barrier.conftest import txn_message

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
# Bounds every wait of a test for another thread; the barrier's own waits are far shorter.
WAIT_S = 30.0


class OpenLocalTransaction:
    """A local transaction in a thread of its own, held open in its body until released."""

    def __init__(self, db, barrier, msg, *, fail: bool = False) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.db, self.barrier, self.msg, self.fail = db, barrier, msg, fail

    def __call__(self) -> LocalTransactionState:
        with self.barrier.local_transaction(self.db.connect(), self.msg) as txn:
            self.db.insert_order(txn.cursor, self.msg)
            self.inside.set()
            if not self.release.wait(WAIT_S):
                raise TimeoutError("the test never released the local transaction")
            if self.fail:
                raise RuntimeError("the business failed")
        return txn.state


def test_a_check_during_an_open_local_transaction_waits_and_answers_its_commit(db):
    waited = threading.Event()
    barrier = db.barrier(lock_timeout_s=WAIT_S, on_wait=lambda gid: waited.set())
    msg = txn_message()
    local = OpenLocalTransaction(db, barrier, msg)
    with ThreadPoolExecutor(2) as pool:
        local_done = pool.submit(local)
        assert local.inside.wait(WAIT_S)
        check_done = pool.submit(barrier.check, db.connect(), msg)
        assert waited.wait(WAIT_S), "the check never met the open local transaction"
        local.release.set()
        assert (local_done.result(WAIT_S), check_done.result(WAIT_S)) == (COMMIT, COMMIT)
    assert db.committed() == {msg.transaction_id}
    assert barrier.waited_checks == 1


def test_a_check_during_a_local_transaction_that_fails_answers_rollback(db):
    waited = threading.Event()
    barrier = db.barrier(lock_timeout_s=WAIT_S, on_wait=lambda gid: waited.set())
    msg = txn_message()
    local = OpenLocalTransaction(db, barrier, msg, fail=True)
    with ThreadPoolExecutor(2) as pool:
        local_done = pool.submit(local)
        assert local.inside.wait(WAIT_S)
        check_done = pool.submit(barrier.check, db.connect(), msg)
        assert waited.wait(WAIT_S), "the check never met the open local transaction"
        local.release.set()
        with pytest.raises(RuntimeError, match="the business failed"):
            local_done.result(WAIT_S)
        assert check_done.result(WAIT_S) == ROLLBACK
    assert db.committed() == set()


def test_a_check_before_the_local_transaction_refuses_it_before_its_body(db):
    barrier = db.barrier()
    msg = txn_message()
    assert barrier.check(db.connect(), msg) == ROLLBACK
    body_ran = False
    refused = f"txn={msg.transaction_id}: a back-check decided ROLLBACK before the local"
    with (
        pytest.raises(BarrierRollback, match=refused),
        barrier.local_transaction(db.connect(), msg) as txn,
    ):
        body_ran = True
        db.insert_order(txn.cursor, msg)
    assert not body_ran
    assert db.committed() == set()
    assert barrier.check(db.connect(), msg) == ROLLBACK  # the decision stands


def test_a_check_past_the_lock_timeout_answers_unknow_then_the_outcome(db):
    barrier = db.barrier(lock_timeout_s=0.2)
    msg = txn_message()
    local = OpenLocalTransaction(db, barrier, msg)
    with ThreadPoolExecutor(1) as pool:
        local_done = pool.submit(local)
        assert local.inside.wait(WAIT_S)
        assert barrier.check(db.connect(), msg) == UNKNOW  # the coordinator asks again later
        local.release.set()
        assert local_done.result(WAIT_S) == COMMIT
    assert barrier.check(db.connect(), msg) == COMMIT


def test_committed_rolled_back_and_unknown_local_transactions(db):
    barrier = TransactionBarrier(table=db.barrier_table)
    barrier.create_table(db.connect())  # idempotent
    committed, rolled_back = txn_message(1), txn_message(2)
    with barrier.local_transaction(db.connect(), committed) as txn:
        db.insert_order(txn.cursor, committed)
    assert txn.state == COMMIT
    with barrier.local_transaction(db.connect(), rolled_back) as txn:
        db.insert_order(txn.cursor, rolled_back)
        txn.set_rollback_only()
    assert txn.state == ROLLBACK
    assert db.committed() == {committed.transaction_id}
    assert barrier.check(db.connect(), committed) == COMMIT
    assert barrier.check(db.connect(), rolled_back) == ROLLBACK
    with (
        pytest.raises(IllegalStateError, match="already ran and committed"),
        barrier.local_transaction(db.connect(), committed),
    ):
        pass


def test_purge_deletes_only_rows_older_than_the_horizon(db):
    barrier = TransactionBarrier(table=db.barrier_table)
    old, new = txn_message(1), txn_message(2)
    for msg in (old, new):
        assert barrier.check(db.connect(), msg) == ROLLBACK
    conn = db.connect()
    age = "created_at - 7200" if db.kind == "sqlite" else "created_at - interval '2 hours'"
    conn.execute(
        f"UPDATE {db.barrier_table} SET created_at = {age} WHERE gid = {db.param}",
        (old.transaction_id,),
    )
    conn.commit()
    assert barrier.purge(db.connect(), older_than=timedelta(hours=1)) == 1
    assert db.query(f"SELECT gid FROM {db.barrier_table}") == [(new.transaction_id,)]
    with pytest.raises(ConfigError, match="older_than must be a positive"):
        barrier.purge(db.connect(), older_than=0)


def test_a_connection_with_an_open_transaction_is_refused(db):
    conn = db.connect()
    conn.execute(f"INSERT INTO {db.orders} VALUES ({db.param}, {db.param})", ("x", "y"))
    barrier = TransactionBarrier(table=db.barrier_table)
    with (
        pytest.raises(IllegalStateError, match="no transaction open"),
        barrier.local_transaction(conn, txn_message()),
    ):
        pass


@pytest.mark.parametrize(
    "options, message",
    [
        ({"table": "orders; DROP TABLE x"}, "table must be an SQL identifier"),
        ({"table": ""}, "table must be an SQL identifier"),
        ({"lock_timeout_s": 0}, "lock_timeout_s must be a positive number, got 0"),
    ],
)
def test_bad_barrier_settings_name_the_field(options, message):
    with pytest.raises(ConfigError, match=message):
        TransactionBarrier(**options)


def test_a_message_without_transaction_id_or_an_unknown_connection_is_refused(tmp_path):
    barrier = TransactionBarrier()
    conn = sqlite3.connect(tmp_path / "x.db")
    barrier.create_table(conn)
    with pytest.raises(ConfigError, match=r"needs msg\.transaction_id"):
        barrier.check(conn, Message("orders", b"v"))
    with pytest.raises(ConfigError, match="needs a sqlite3 or psycopg"):
        barrier.check(object(), txn_message())
    conn.close()
