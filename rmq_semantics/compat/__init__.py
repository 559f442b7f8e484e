"""RocketMQ's own Python client APIs over this product, so code written for them runs on Kafka
with one import changed:

- :mod:`rmq_semantics.compat.rocketmq`: the RocketMQ 5 client (``import rocketmq``, PyPI
  ``rocketmq-python-client`` 5.1.2);
- :mod:`rmq_semantics.compat.rocketmq_client`: the 2.x client (``from rocketmq.client import
  ...``, PyPI ``rocketmq-client-python`` 2.0.0).

Both are thin: every call goes to the product's public classes (``Producer``,
``TransactionProducer``, ``PushConsumer``, ``OrderlyConsumer``, ``SimpleConsumer``). What
differs from the originals is listed on the docs' migration page (docs/guides/migrating.md).
"""
