"""Ordered consumption with queue locks: RocketMQ's ``MessageListenerOrderly`` on Kafka.

Per assigned partition there is one thread of control that hands the listener the
partition's messages in offset order (RocketMQ's ``ProcessQueue`` + per-queue lock);
partitions run in parallel. A partition is processed only while this consumer holds the
coordinator's queue lock for (group, topic, partition).

Fencing: the lease is checked with a monotonic clock before every batch and again before
every commit, together with the epoch the batch started under; a consumer that was
paused (SIGSTOP, GC, swap) past its lease neither processes nor commits for partitions it
lost. A new epoch re-reads the committed offset before anything is processed, so work
resumes exactly where the previous holder committed.

The parts, each in its module:

- :mod:`~rmq_semantics.orderly.api`: the public types (listener, context, status, message);
- :mod:`~rmq_semantics.orderly.queue`: one partition's lifecycle and fencing rules (pure);
- :mod:`~rmq_semantics.orderly.poller`: the poll thread, which owns the Kafka consumer;
- :mod:`~rmq_semantics.orderly.commits`: lock-checked asynchronous commits;
- :mod:`~rmq_semantics.orderly.rebalance`: assignment, revocation, lost partitions;
- :mod:`~rmq_semantics.orderly.leases`: the lock thread (lease renewal);
- :mod:`~rmq_semantics.orderly.worker`: one worker thread per partition;
- :mod:`~rmq_semantics.orderly.dlq`: dead letters;
- :mod:`~rmq_semantics.orderly.consumer`: the facade, :class:`OrderlyConsumer`.

Key mode (``ordering="key"``: order per message group or key, keys in parallel) replaces
the per-partition workers with:

- :mod:`~rmq_semantics.orderly.keys`: the key scheduler, per-key FIFO chains (pure);
- :mod:`~rmq_semantics.orderly.offsets`: the offset tracker, done offsets in the commit
  metadata (pure);
- :mod:`~rmq_semantics.orderly.keyfeed`: one feeder thread per partition (tracker, sessions);
- :mod:`~rmq_semantics.orderly.keyed`: the worker pool (threads, or one event loop).
"""

from rmq_semantics.orderly.api import (
    DLQ_ORIGINAL_OFFSET,
    DLQ_ORIGINAL_PARTITION,
    DLQ_ORIGINAL_TOPIC,
    DLQ_RECONSUME_TIMES,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
    OrderlyMessage,
    PartitionStatus,
)
from rmq_semantics.orderly.consumer import OrderlyConsumer

__all__ = [
    "DLQ_ORIGINAL_OFFSET",
    "DLQ_ORIGINAL_PARTITION",
    "DLQ_ORIGINAL_TOPIC",
    "DLQ_RECONSUME_TIMES",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "MessageListenerOrderly",
    "OrderlyConsumer",
    "OrderlyMessage",
    "PartitionStatus",
]
