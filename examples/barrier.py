import sqlite3
from contextlib import closing

from rmq_semantics import Message, TransactionProducer
from rmq_semantics.barrier import BarrierTransactionListener, TransactionBarrier
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {})})


def connect():  # PostgreSQL: psycopg.connect(DSN), and %s instead of ? below
    return sqlite3.connect("orders.db", timeout=10)


barrier = TransactionBarrier(table="rmq_barrier", lock_timeout_s=2.0)
with closing(connect()) as conn:
    barrier.create_table(conn)  # once; CREATE TABLE IF NOT EXISTS
    conn.execute("CREATE TABLE IF NOT EXISTS orders (order_id TEXT, txn_id TEXT)")
    conn.commit()


def business(cursor, msg, arg):  # runs inside the local transaction
    cursor.execute("INSERT INTO orders VALUES (?, ?)", (arg["order_id"], msg.transaction_id))
    # None/COMMIT_MESSAGE commits, ROLLBACK_MESSAGE rolls back, a raise rolls back too


listener = BarrierTransactionListener(barrier, connect=connect, business=business)
# or by hand, in your own listener:
#   with barrier.local_transaction(conn, msg) as txn:   # BarrierRollback: a check came first
#       txn.cursor.execute(...)
#   return txn.state
#   check_local_transaction: return barrier.check(conn, msg)

with TransactionProducer(conf, producer_group="order-service", listener=listener) as p:
    result = p.send_message_in_transaction(
        Message("orders", b"order-44", key="customer-7"), {"order_id": "order-44"}
    )
print(result.transaction_id, result.local_transaction_state.name)
