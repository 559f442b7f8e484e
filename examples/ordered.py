import threading

from rmq_semantics import ConsumeOrderlyStatus, Message, OrderlyConsumer, Producer
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {})})
order_id = 42
with Producer(conf) as producer:  # idempotent: retries never reorder
    producer.send(Message("orders", b"packed"), sharding_key="customer-7")
    producer.send(
        Message("orders", b"labelled"),
        selector=lambda parts, msg, arg: parts[arg % len(parts)],
        arg=order_id,
    )  # a partition the topic lacks raises SelectorError

waiting = {b"packed", b"labelled"}
handled = threading.Event()
lock = threading.Lock()  # partitions are consumed on several threads at once


def handle(m):
    with lock:  # two unlocked prints can interleave their lines
        print(m.topic, m.partition, m.offset, m.value)
        waiting.discard(m.value)
        if not waiting:
            handled.set()


def listener(msgs, context):  # or a MessageListenerOrderly
    for m in msgs:  # topic, partition, offset, key, value, headers, ...
        handle(m)
    return ConsumeOrderlyStatus.SUCCESS  # SUSPEND_CURRENT_QUEUE_A_MOMENT retries the same
    # messages after context.suspend_ms (default 1000)


consumer = OrderlyConsumer(
    {**conf, "group.id": "shipping", "auto.offset.reset": "earliest"},
    listener=listener,
    max_reconsume_times=16,
    lock_lease_ms=60000,
    lock_renew_ms=20000,
)
consumer.subscribe(["orders"])
consumer.start()
handled.wait(60)
consumer.shutdown()
