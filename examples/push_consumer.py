import threading

from rmq_semantics import ConsumeConcurrentlyStatus, Message, Producer, PushConsumer
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {})})
with Producer(conf) as producer:
    producer.send(Message("orders", b"invoice-1", key="customer-7", tags="TagA"))
    producer.send(Message("orders", b"audit-1", key="customer-7", tags="TagC"))
    producer.send(Message("orders", b"invoice-2", key="customer-7", tags="TagB"))

invoices = {b"invoice-1", b"invoice-2"}
handled = threading.Event()
lock = threading.Lock()  # the listener runs on up to max_workers threads at once


def handle(value):
    with lock:  # two unlocked prints can interleave their lines
        print(value)
        invoices.discard(value)
        if not invoices:
            handled.set()


def listener(msgs, context):  # or a MessageListenerConcurrently, or async def
    for msg in msgs:
        handle(msg.value)  # a raise counts as RECONSUME_LATER
    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


consumer = PushConsumer(
    {**conf, "group.id": "invoices", "auto.offset.reset": "earliest"}, listener=listener
)  # max_workers=20, max_reconsume_times=16,
consumer.subscribe(["orders"], tags="TagA || TagB")  # consume_message_batch_max_size=1
consumer.start()
handled.wait(60)
consumer.shutdown()
