from rmq_semantics import Consumer, Message, Producer
from rmq_semantics.topics import ensure_topics

conf = {"bootstrap.servers": "127.0.0.1:9092"}
ensure_topics(conf, {"orders": (3, {})})
with Producer(conf) as producer:
    producer.send(Message("orders", b"order-opened", key="customer-7"))  # Java murmur2 placement
    producer.send(Message("orders", b"order-closed"), sharding_key="customer-7")  # ordered send

consumer = Consumer({**conf, "group.id": "audit", "auto.offset.reset": "earliest"})
consumer.subscribe(["orders"])  # read_committed; a pattern ("^.*") never yields __rmq_* topics
seen = set()
while not {b"order-opened", b"order-closed"} <= seen:
    msg = consumer.poll(1.0)
    if msg is not None and msg.error() is None:
        print(msg.partition(), msg.offset(), msg.value())
        seen.add(msg.value())
consumer.close()
