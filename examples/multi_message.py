import sqlite3
from contextlib import closing

from rmq_semantics import LocalTransactionState, Message, TransactionListener, TransactionProducer
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {}), "inventory": (3, {}), "order-lines": (3, {})})
DB = "orders.db"
with closing(sqlite3.connect(DB)) as db, db:
    db.execute("CREATE TABLE IF NOT EXISTS orders (order_id TEXT, txn_id TEXT)")


class OrderListener(TransactionListener):
    def execute_local_transaction(self, txn, order_id):  # txn: a rmq_semantics.Transaction
        with closing(sqlite3.connect(DB)) as db, db:
            db.execute("INSERT INTO orders VALUES (?, ?)", (order_id, txn.transaction_id))
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, txn):  # txn.messages holds the first only
        with closing(sqlite3.connect(DB)) as db:
            found = db.execute("SELECT 1 FROM orders WHERE txn_id=?", (txn.transaction_id,))
            return (
                LocalTransactionState.COMMIT_MESSAGE
                if found.fetchone()
                else LocalTransactionState.ROLLBACK_MESSAGE
            )


lines = [b"line-1", b"line-2"]
with TransactionProducer(conf, producer_group="order-service", listener=OrderListener()) as p:
    result = p.send_transaction(
        [
            Message("orders", b"order-created", key="order-42"),
            Message("inventory", b"stock-reserved", key="sku-7"),
            *(Message("order-lines", line, key="order-42") for line in lines),
        ],
        "order-42",
    )
print(result.transaction_id, result.message_count, result.half_partition, result.half_offset)
