import asyncio

import aiosqlite

from rmq_semantics import AsyncTransactionProducer, LocalTransactionState, Message
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {})})


class OrderListener:
    def __init__(self, db, check_db):
        self.db, self.check_db = db, check_db
        self.db_lock = asyncio.Lock()  # a connection holds one transaction at a time

    async def execute_local_transaction(self, msg, order_id):
        async with self.db_lock:
            await self.db.execute(
                "INSERT INTO orders VALUES (?, ?)", (order_id, msg.transaction_id)
            )
            await self.db.commit()
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, msg):  # runs on the producer's loop
        async with self.check_db.execute(
            "SELECT 1 FROM orders WHERE txn_id = ?", (msg.transaction_id,)
        ) as cursor:
            found = await cursor.fetchone()
        return (
            LocalTransactionState.COMMIT_MESSAGE
            if found
            else LocalTransactionState.ROLLBACK_MESSAGE
        )


async def main():
    async with aiosqlite.connect("orders.db") as db, aiosqlite.connect("orders.db") as check_db:
        await db.execute("CREATE TABLE IF NOT EXISTS orders (order_id TEXT, txn_id TEXT)")
        await db.commit()
        async with AsyncTransactionProducer(
            conf, producer_group="order-service", listener=OrderListener(db, check_db)
        ) as producer:
            results = await asyncio.gather(
                *(
                    producer.send_message_in_transaction(
                        Message("orders", order_id.encode(), key="customer-7"), order_id
                    )
                    for order_id in ("order-50", "order-51", "order-52")
                )
            )
    for result in results:
        print(result.transaction_id, result.local_transaction_state.name)


asyncio.run(main())
