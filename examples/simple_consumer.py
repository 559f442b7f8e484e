from rmq_semantics import FilterExpression, Message, Producer, SimpleConsumer
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {})})
with Producer(conf) as producer:
    for order in ("order-1", "order-2"):
        for step in ("created", "paid", "shipped"):  # one message group: one partition
            producer.send(Message("orders", step.encode(), tags="step", message_group=order))
    producer.send(Message("orders", b"audit", tags="audit"))

consumer = SimpleConsumer(
    {**conf, "auto.offset.reset": "earliest"},  # a new group starts at the topic's start
    consumer_group="order-steps",
    subscription={"orders": FilterExpression("step")},  # "audit" is skipped
    await_duration=5,  # seconds a receive waits when nothing is ready
)
with consumer:  # startup() ... shutdown()
    left = 6
    while left:
        # One message of a group at a time: an order's next step only after this one's ack.
        for msg in consumer.receive(max_message_num=16, invisible_duration=30):
            print(msg.message_group, msg.body.decode(), msg.delivery_attempt)
            consumer.ack(msg)  # not acked, it comes back in 30 s with delivery_attempt 2
            left -= 1
