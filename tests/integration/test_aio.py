"""The asyncio API on a real broker (issue 20): 1,000 concurrent transactions on one loop
with an async SQLite local transaction under the async barrier and async back-checks, every
committed one promoted exactly once; plain listeners, multi-message transactions and the sync errors
through the async producer; AsyncProducer's headers read back with ``async for``. Every
test runs under the loop guard: a blocking Kafka or sqlite3 call on the loop's thread fails
it (shown structurally, never by timing)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path

import aiosqlite
import pytest

from rmq_semantics import (
    AsyncConsumer,
    AsyncProducer,
    AsyncTransactionProducer,
    Message,
    SystemTopicError,
    TransactionListener,
    UnknownPartitionError,
)
from rmq_semantics import LocalTransactionState as S
from rmq_semantics.barrier import AsyncTransactionBarrier
from rmq_semantics.errors import BarrierRollback
from tests.integration.txn_helpers import (
    FAST,
    ThreadCoordinator,
    no_pending,
    read_to_end,
    wait_for,
)
from tests.loop_guard import LoopGuard, loop_guard

pytestmark = pytest.mark.integration

# 1,000 by default (well under a minute); RMQ_TEST_AIO_N=10000 for a longer run.
CONCURRENT = int(os.environ.get("RMQ_TEST_AIO_N", "1000"))
# What each transaction's local transaction does under the async barrier: the first two
# decide inline; "unknown" commits its row and answers UNKNOW, "crash" dies before its local
# transaction began (no row): the async back-check decides those two from the barrier row.
KINDS = ("commit", "rollback", "unknown", "crash")
INLINE = {
    "commit": S.COMMIT_MESSAGE,
    "rollback": S.ROLLBACK_MESSAGE,
    "unknown": S.UNKNOW,
    "crash": S.UNKNOW,
}
ROW_WRITTEN = ("commit", "unknown")


class SqliteOrders(TransactionListener):
    """The local transaction inserts an order row under the async barrier (aiosqlite); the
    back-check answers from the barrier row, on a connection of its own."""

    def __init__(self, db: aiosqlite.Connection, check_db: aiosqlite.Connection) -> None:
        self.barrier = AsyncTransactionBarrier(table="rmq_barrier")
        self.db, self.check_db = db, check_db
        # One connection holds one database transaction at a time.
        self.lock, self.check_lock = asyncio.Lock(), asyncio.Lock()
        self.checked: list[bytes] = []
        # Local transactions a back-check overtook (their half older than the transaction
        # timeout before they began, on a busy machine): the barrier refused to run them.
        self.overtaken: set[bytes] = set()
        self.committed: set[bytes] = set()  # the order rows, read at the end

    async def execute_local_transaction(self, msg, kind):
        if kind == "crash":
            return S.UNKNOW
        try:
            async with self.lock, self.barrier.local_transaction(self.db, msg) as txn:
                if kind == "rollback":
                    txn.set_rollback_only()
                else:
                    await txn.cursor.execute(
                        "INSERT INTO orders (txn_id, value) VALUES (?, ?)",
                        (msg.transaction_id, msg.value),
                    )
        except BarrierRollback:
            self.overtaken.add(msg.value)
            raise
        return S.UNKNOW if kind == "unknown" else txn.state

    async def committed_values(self) -> set[bytes]:
        async with self.lock, self.db.execute("SELECT value FROM orders") as cursor:
            return {bytes(row[0]) for row in await cursor.fetchall()}

    async def check_local_transaction(self, msg):
        self.checked.append(msg.value)
        async with self.check_lock:
            return await self.barrier.check(self.check_db, msg)


async def _open_orders(path: Path) -> tuple[aiosqlite.Connection, aiosqlite.Connection]:
    """The orders and barrier tables (WAL: the checks read while the local transactions
    write) and two connections, one for the local transactions and one for the checks."""
    db = await aiosqlite.connect(path, isolation_level=None, timeout=30)
    await db.executescript(
        "PRAGMA journal_mode=WAL; CREATE TABLE orders (txn_id TEXT PRIMARY KEY, value BLOB);"
    )
    await AsyncTransactionBarrier(table="rmq_barrier").create_table(db)
    return db, await aiosqlite.connect(path, isolation_level=None, timeout=30)


async def _send_concurrently(
    conf: dict,
    prefix: str,
    group: str,
    topic: str,
    coordinator: ThreadCoordinator,
    guard: LoopGuard,
    path: Path,
) -> tuple[list, SqliteOrders]:
    guard.arm()
    db, check_db = await _open_orders(path)
    try:
        listener = SqliteOrders(db, check_db)
        async with AsyncTransactionProducer(
            conf,
            producer_group=group,
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
            check_partitions=FAST["check_partitions"],
        ) as producer:
            results = await asyncio.gather(
                *(
                    producer.send_message_in_transaction(
                        Message(topic, f"order-{i}".encode(), key=f"k{i}"), KINDS[i % 4]
                    )
                    for i in range(CONCURRENT)
                )
            )
            # The loop stays free to run the async checks while a thread waits.
            await asyncio.to_thread(
                wait_for,
                lambda: no_pending(coordinator, FAST["half_partitions"]),
                120,
                "every transaction to be decided",
            )
        listener.committed = await listener.committed_values()
        return results, listener
    finally:
        await db.close()
        await check_db.close()
        guard.disarm()


def test_concurrent_async_transactions_with_async_sqlite_and_checks_promote_once(
    broker, make_topic, unique, tmp_path, monkeypatch
):
    prefix = unique("aio").replace("-", "")
    topic = make_topic("aio", partitions=3)
    conf = broker.conf()
    with (
        loop_guard(monkeypatch) as guard,
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
    ):
        results, listener = asyncio.run(
            _send_concurrently(
                conf, prefix, unique("pg"), topic, coordinator, guard, tmp_path / "orders.db"
            )
        )

    assert guard.offences == [], "\n".join(guard.offences[:3])
    # The guard did guard: these ran, off the loop.
    assert {
        "Producer.flush",
        "Consumer.consume",
        "sqlite3 Connection.execute",
        "sqlite3 Cursor.fetchone",
    } <= set(guard.calls_elsewhere)
    # A local transaction a back-check overtook (its half older than the 1.5 s transaction
    # timeout before it began: 1,000 at once on a busy machine) is refused by the barrier and
    # counts as UNKNOW; the others answer as their kind says.
    values = [f"order-{i}".encode() for i in range(CONCURRENT)]
    overtaken = listener.overtaken
    assert [r.local_transaction_state for r in results] == [
        S.UNKNOW if values[i] in overtaken else INLINE[KINDS[i % 4]] for i in range(CONCURRENT)
    ]
    assert len({r.transaction_id for r in results}) == CONCURRENT
    # Every transaction left undecided was asked about (one decided inline may be asked too
    # when its end reached the coordinator after the timeout, as RocketMQ asks then).
    undecided = {v for i, v in enumerate(values) if i % 4 >= 2} | overtaken
    assert set(listener.checked) >= undecided
    # The promise: visible exactly once iff the local transaction committed its row.
    assert listener.committed == {
        v for i, v in enumerate(values) if KINDS[i % 4] in ROW_WRITTEN and v not in overtaken
    }
    promoted = Counter(m.value() for m in read_to_end(conf, topic, 3))
    assert set(promoted) == listener.committed
    assert max(promoted.values()) == 1


class PlainListener(TransactionListener):
    """A synchronous listener, as written for TransactionProducer."""

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def execute_local_transaction(self, msg, arg):
        import threading

        self.threads.add(threading.current_thread().name)
        return arg

    def check_local_transaction(self, msg):
        return S.COMMIT_MESSAGE


def test_plain_listeners_multi_message_transactions_and_the_sync_errors(
    broker, make_topic, unique, monkeypatch
):
    prefix = unique("aiop").replace("-", "")
    topic, other = make_topic("aiop", partitions=2), make_topic("aiop2")
    conf = broker.conf()
    listener = PlainListener()

    async def main(guard: LoopGuard):
        guard.arm()
        try:
            async with AsyncTransactionProducer(
                conf,
                producer_group=unique("pg"),
                listener=listener,
                topic_prefix=prefix,
                half_partitions=FAST["half_partitions"],
                check_partitions=FAST["check_partitions"],
            ) as producer:
                with pytest.raises(SystemTopicError):
                    await producer.send_message_in_transaction(Message(f"{prefix}_half", b"x"))
                with pytest.raises(UnknownPartitionError):
                    await producer.send_message_in_transaction(
                        Message(topic, b"x", partition=7), S.COMMIT_MESSAGE
                    )
                one = await producer.send_message_in_transaction(
                    Message(topic, b"one", partition=1), S.COMMIT_MESSAGE
                )
                checked = await producer.send_message_in_transaction(
                    Message(topic, b"checked"), S.UNKNOW
                )
                multi = await producer.send_transaction(
                    [Message(topic, b"m0"), Message(other, b"m1"), Message(topic, b"m2")],
                    S.COMMIT_MESSAGE,
                )
                await asyncio.to_thread(
                    wait_for, lambda: producer.checks_answered >= 1, 60, "the plain back-check"
                )
            return one, checked, multi
        finally:
            guard.disarm()

    with loop_guard(monkeypatch) as guard, ThreadCoordinator(conf, topic_prefix=prefix):
        one, checked, multi = asyncio.run(main(guard))
        wait_for(lambda: len(read_to_end(conf, topic, 2)) >= 4, 60, "the promotions")

    assert guard.offences == [], "\n".join(guard.offences[:3])
    assert listener.threads and all(n.startswith("rmq-aio-") for n in listener.threads)
    assert (one.half_partition >= 0, checked.local_transaction_state) == (True, S.UNKNOW)
    assert multi.message_count == 3
    values = Counter(m.value() for m in read_to_end(conf, topic, 2))
    assert values == Counter([b"one", b"checked", b"m0", b"m2"])
    assert [m.value() for m in read_to_end(conf, other, 1)] == [b"m1"]
    assert [m.partition() for m in read_to_end(conf, topic, 2) if m.value() == b"one"] == [1]


def test_async_producer_keeps_each_messages_headers_read_back_with_async_for(
    broker, make_topic, unique, monkeypatch
):
    topic = make_topic("aioh", partitions=2)
    conf = broker.conf()
    count = 50

    async def main(guard: LoopGuard):
        guard.arm()
        try:
            async with AsyncProducer(conf) as producer:
                sent = await asyncio.gather(
                    *(
                        producer.send(
                            Message(
                                topic,
                                f"v{i}".encode(),
                                headers={"h": f"h{i}"},
                                tags="TagA" if i % 2 else "TagB",
                            ),
                            sharding_key=f"key-{i}" if i % 3 == 0 else None,
                        )
                        for i in range(count)
                    )
                )
            got = []
            async with AsyncConsumer(
                {**conf, "group.id": unique("g"), "auto.offset.reset": "earliest"}
            ) as consumer:
                await consumer.subscribe([topic], tags="TagA")
                async for msg in consumer:
                    got.append(msg)
                    if len(got) == count // 2:
                        break
            return sent, got
        finally:
            guard.disarm()

    with loop_guard(monkeypatch) as guard:
        sent, got = asyncio.run(asyncio.wait_for(main(guard), 120))

    assert guard.offences == [], "\n".join(guard.offences[:3])
    assert {"Consumer.consume", "Consumer.close", "Producer.flush"} <= set(guard.calls_elsewhere)
    assert all(r.offset >= 0 for r in sent)
    headers = {m.value(): dict(m.headers())["h"] for m in got}
    assert headers == {f"v{i}".encode(): f"h{i}".encode() for i in range(1, count, 2)}
