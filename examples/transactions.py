import sqlite3
from contextlib import closing

from rmq_semantics import LocalTransactionState, Message, TransactionListener, TransactionProducer
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {})})
DB = "orders.db"
with closing(sqlite3.connect(DB)) as db, db:
    db.execute("CREATE TABLE IF NOT EXISTS orders (order_id TEXT, txn_id TEXT)")


class OrderListener(TransactionListener):
    def execute_local_transaction(self, msg, order_id):
        with closing(sqlite3.connect(DB)) as db, db:  # your local (database) transaction
            db.execute("INSERT INTO orders VALUES (?, ?)", (order_id, msg.transaction_id))
        return LocalTransactionState.COMMIT_MESSAGE  # or ROLLBACK_MESSAGE / UNKNOW

    def check_local_transaction(self, msg):  # the coordinator's back-check (racy:
        # see the barrier guide)
        with closing(sqlite3.connect(DB)) as db:
            found = db.execute("SELECT 1 FROM orders WHERE txn_id=?", (msg.transaction_id,))
            return (
                LocalTransactionState.COMMIT_MESSAGE
                if found.fetchone()
                else LocalTransactionState.ROLLBACK_MESSAGE
            )


with TransactionProducer(conf, producer_group="order-service", listener=OrderListener()) as p:
    result = p.send_message_in_transaction(
        Message("orders", b"order-43", key="customer-7"), "order-43"
    )
print(result.transaction_id, result.local_transaction_state.name)
