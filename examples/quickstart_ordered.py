import threading

from rmq_semantics import ConsumeOrderlyStatus, Message, OrderlyConsumer, Producer

conf = {"bootstrap.servers": "127.0.0.1:9092"}
with Producer(conf) as producer:  # idempotent: retries never reorder
    for step in ("created", "paid", "shipped"):
        producer.send(Message("orders", step.encode()), sharding_key="customer-7")

shipped = threading.Event()


def listener(msgs, context):  # one partition at a time, in offset order
    for m in msgs:
        print(m.partition, m.offset, m.value)
        if m.value == b"shipped":
            shipped.set()
    return ConsumeOrderlyStatus.SUCCESS  # SUSPEND_CURRENT_QUEUE_A_MOMENT retries


consumer = OrderlyConsumer(
    {**conf, "group.id": "billing", "auto.offset.reset": "earliest"}, listener=listener
)
consumer.subscribe(["orders"])
consumer.start()  # processes a partition only under its lock
shipped.wait(60)
consumer.shutdown()
