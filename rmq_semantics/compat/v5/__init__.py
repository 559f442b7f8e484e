"""The RocketMQ 5 client API's parts; :mod:`rmq_semantics.compat.rocketmq` is its face."""
