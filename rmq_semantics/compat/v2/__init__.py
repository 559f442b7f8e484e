"""The RocketMQ 2.x client API's parts; :mod:`rmq_semantics.compat.rocketmq_client` is its
face."""
