"""RocketMQ's concurrent push consumer (``MessageListenerConcurrently``) on Kafka, with
delay-level retry topics and a dead-letter topic. See :class:`PushConsumer`."""

from rmq_semantics.push.api import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
    PushMessage,
)
from rmq_semantics.push.consumer import PushConsumer
from rmq_semantics.push.retry import DEFAULT_DELAY_LEVELS

__all__ = [
    "DEFAULT_DELAY_LEVELS",
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "MessageListenerConcurrently",
    "PushConsumer",
    "PushMessage",
]
