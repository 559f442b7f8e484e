"""``Producer``: a drop-in for ``confluent_kafka.Producer`` plus RocketMQ-style ``send``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from rmq_semantics.clientconf import client_conf, new_client
from rmq_semantics.errors import ConfigError, KafkaOperationError, RmqTimeoutError
from rmq_semantics.message import Message, SendResult
from rmq_semantics.records.headers import H
from rmq_semantics.selector import apply_selector, java_partition
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, validate_prefix

__all__ = ["Producer"]

# Upper bound for one synchronous send: librdkafka's own message.timeout.ms (default 300 s)
# is longer; we fail sooner and say so. Override with send(..., timeout=...).
SEND_TIMEOUT_S = 30.0
# How long partition counts are trusted before metadata is asked again.
METADATA_TTL_S = 30.0
POLL_SLICE_S = 0.05


#: The product's producer defaults (the caller's values win): idempotence, so retries never
#: reorder, and Java's partitioner, so Java and Python producers agree on where a key lives.
PRODUCER_DEFAULTS = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}


def producer_defaults(conf: dict, *, internal: bool = False) -> dict:
    """Copy ``conf`` with the product's producer defaults."""
    return client_conf(conf, who="producer", internal=internal, defaults=PRODUCER_DEFAULTS)


class DeliveryWaiter:
    """Delivery callback that records one outcome, for synchronous sends. Whoever waits
    polls the producer (which serves the callback), so a plain flag is enough: one per
    half message, an Event cost more than the rest of the callback."""

    __slots__ = ("delivered", "error", "offset", "partition")

    def __init__(self) -> None:
        self.delivered = False
        self.error: KafkaError | None = None
        self.partition = -1
        self.offset = -1

    def __call__(self, err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        self.error = err
        if err is None:
            self.partition, self.offset = msg.partition(), msg.offset()
        self.delivered = True

    def wait(self, producer: confluent_kafka.Producer, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.delivered:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RmqTimeoutError(f"{what}: no delivery report within {timeout:.1f} s")
            producer.poll(min(POLL_SLICE_S, remaining))
        if self.error is not None:
            raise KafkaOperationError.wrap(what, self.error)


class Producer:
    """Drop-in for ``confluent_kafka.Producer`` (same conf dict and methods).

    Differences: idempotence and ``acks=all`` are on unless the conf says otherwise, and
    records are partitioned with Java's murmur2 partitioner. ``send`` adds RocketMQ's
    ordered send: ``selector=`` (``(partitions, msg, arg) -> partition``) or
    ``sharding_key=``; it waits for the broker's acknowledgement.
    """

    def __init__(self, conf: dict, *, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> None:
        self._conf = producer_defaults(conf)
        self.topic_prefix = validate_prefix(topic_prefix)
        self._producer = new_client(confluent_kafka.Producer, self._conf, "producer")
        self._partitions: dict[str, tuple[float, list[int]]] = {}

    # -- RocketMQ-style send ---------------------------------------------------------------
    def partitions_for(self, topic: str, timeout: float = SEND_TIMEOUT_S) -> list[int]:
        """Partition ids of ``topic`` (cached for a short while)."""
        cached = self._partitions.get(topic)
        if cached and time.monotonic() - cached[0] < METADATA_TTL_S:
            return cached[1]
        try:
            meta = self._producer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise KafkaOperationError.wrap(f"reading metadata of {topic}", exc.args[0]) from exc
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error.str() if meta is not None and meta.error else "no partitions"
            raise KafkaOperationError(f"topic {topic!r} is not available: {reason}")
        partitions = sorted(meta.partitions)
        self._partitions[topic] = (time.monotonic(), partitions)
        return partitions

    def send(self, msg: Message, selector: Callable[..., Any] | None = None, arg: Any = None,
             sharding_key: bytes | str | None = None, *,
             timeout: float = SEND_TIMEOUT_S) -> SendResult:
        """Send ``msg`` and wait for its acknowledgement; return where it landed."""
        if selector is not None and sharding_key is not None:
            raise ConfigError("send: pass selector= or sharding_key=, not both")
        partition = msg.partition
        if selector is not None:
            partition = apply_selector(selector, self.partitions_for(msg.topic, timeout),
                                       msg, arg)
        elif sharding_key is not None:
            key = sharding_key.encode() if isinstance(sharding_key, str) else sharding_key
            partition = java_partition(key, len(self.partitions_for(msg.topic, timeout)))
        headers = msg.user_headers()
        if msg.tags is not None:
            headers.append((H.TAGS, msg.tags.encode()))
        if msg.keys is not None:
            headers.append((H.KEYS, msg.keys.encode()))
        waiter = DeliveryWaiter()
        kwargs: dict[str, Any] = {"key": msg.key, "headers": headers, "on_delivery": waiter}
        if partition is not None:
            kwargs["partition"] = partition
        self._producer.produce(msg.topic, msg.value, **kwargs)
        waiter.wait(self._producer, f"sending to {msg.topic}", timeout)
        return SendResult(msg.topic, waiter.partition, waiter.offset)

    # -- confluent_kafka.Producer, delegated ------------------------------------------------
    def produce(self, *args: Any, **kwargs: Any) -> None:
        self._producer.produce(*args, **kwargs)

    def poll(self, timeout: float = -1) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = -1) -> int:
        return self._producer.flush(timeout)

    def purge(self, *args: Any, **kwargs: Any) -> None:
        self._producer.purge(*args, **kwargs)

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return self._producer.list_topics(*args, **kwargs)

    def init_transactions(self, *args: Any) -> None:
        self._producer.init_transactions(*args)

    def begin_transaction(self) -> None:
        self._producer.begin_transaction()

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self._producer.send_offsets_to_transaction(*args)

    def commit_transaction(self, *args: Any) -> None:
        self._producer.commit_transaction(*args)

    def abort_transaction(self, *args: Any) -> None:
        self._producer.abort_transaction(*args)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        self._producer.set_sasl_credentials(username, password)

    def __len__(self) -> int:
        return len(self._producer)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self, timeout: float = SEND_TIMEOUT_S) -> None:
        """Flush what is queued (bounded by ``timeout``). Idempotent."""
        self._producer.flush(timeout)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
