from rmq_semantics import LocalTransactionState, Message, TransactionListener, TransactionProducer
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {})})  # the coordinator promotes into existing topics


class OrderListener(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        # your database transaction, recording msg.transaction_id with the order
        return LocalTransactionState.COMMIT_MESSAGE  # or ROLLBACK_MESSAGE / UNKNOW

    def check_local_transaction(self, msg):
        # the back-check, for a transaction whose answer never arrived: look it up
        return LocalTransactionState.COMMIT_MESSAGE


with TransactionProducer(
    conf, producer_group="order-service", listener=OrderListener()
) as producer:
    result = producer.send_message_in_transaction(Message("orders", b"order-42", key="customer-7"))
    print(result.transaction_id, result.local_transaction_state.name)
