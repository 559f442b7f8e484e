"""``Producer``: a drop-in for ``confluent_kafka.Producer`` plus RocketMQ-style ``send``.

Over 500 lines since timer messages, and whole: the drop-in surface (``produce``, ``poll``,
``flush`` and the transactions' pass-throughs) is one class by design; writing a timer
record lives in :mod:`rmq_semantics.timer_writes`, its format in
:mod:`rmq_semantics.records.timer`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from rmq_semantics.clientconf import client_conf, new_client
from rmq_semantics.errors import (
    ConfigError,
    IllegalStateError,
    KafkaOperationError,
    RmqTimeoutError,
    TimerRecallRefused,
    UnknownPartitionError,
)
from rmq_semantics.message import Message, SendResult, produce_headers
from rmq_semantics.records.headers import PRODUCER_HEADERS, RESERVED_PREFIX
from rmq_semantics.selector import placement
from rmq_semantics.settings import ProducerSettings, load
from rmq_semantics.timer_writes import TimerWrite, TimerWrites
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemTopics,
    refuse_system_destination,
    system_prefixes,
    validate_prefix,
)

__all__ = [
    "BATCH_LINGER_MS",
    "CALL_LINGER_MS",
    "CallProducer",
    "DeliveryPoller",
    "PartitionCache",
    "Producer",
    "SignalledWaiter",
    "given_linger_ms",
]

log = logging.getLogger(__name__)

# Upper bound for one synchronous send: librdkafka's own message.timeout.ms (default 300 s)
# is longer; we fail sooner and say so. Override with send(..., timeout=...).
SEND_TIMEOUT_S = 30.0
# How long partition counts are trusted before metadata is asked again.
METADATA_TTL_S = 30.0
# How many topics' partition lists one producer remembers (the oldest read is dropped).
METADATA_MAX_TOPICS = 1024
POLL_SLICE_S = 0.05


#: ``linger.ms`` of the producers that batch (the user's ``Producer``, the batch path, DLQ and
#: redrive producers): librdkafka's default, written out because client defaults move (the
#: Java client's went from 0 to 5 ms in Kafka 4.0). A conf's own value wins.
BATCH_LINGER_MS = 5
#: ``linger.ms`` of a per-call path, whose caller waits for each write (a conf's value wins).
CALL_LINGER_MS = 0
#: The product's producer defaults (the caller's values win): idempotence, so retries never
#: reorder, and Java's partitioner, so Java and Python producers agree on where a key lives;
#: and :data:`BATCH_LINGER_MS`.
PRODUCER_DEFAULTS = {
    "enable.idempotence": True,
    "acks": "all",
    "partitioner": "murmur2_random",
    "linger.ms": BATCH_LINGER_MS,
}


def given_linger_ms(conf: Mapping[str, Any]) -> int | None:
    """The ``linger.ms`` (or its alias ``queue.buffering.max.ms``) a user's conf sets."""
    value = conf.get("linger.ms", conf.get("queue.buffering.max.ms"))
    return None if value is None else int(value)


def producer_defaults(conf: dict, *, internal: bool = False) -> dict:
    """Copy ``conf`` with the product's producer defaults (an internal producer keeps none of
    the user's tuning; a user's producer keeps a linger set under either name)."""
    defaults = PRODUCER_DEFAULTS
    if not internal and given_linger_ms(conf) is not None:
        defaults = {k: v for k, v in PRODUCER_DEFAULTS.items() if k != "linger.ms"}
    return client_conf(conf, who="producer", internal=internal, defaults=defaults)


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
        # Also of a failed one: where it may still land. The client says None for a record
        # never given a partition, and for no offset (acks=0); kept as it says.
        self.partition = msg.partition()  # type: ignore[assignment]  # None: see above
        if err is None:
            self.offset = msg.offset()  # type: ignore[assignment]  # None: see above
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


class SignalledWaiter(DeliveryWaiter):
    """A :class:`DeliveryWaiter` for a producer a :class:`DeliveryPoller` serves: the caller
    sleeps on its own event. (Many threads polling one producer each slept on until their
    poll served something or timed out, after another thread had served their report.)"""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        super().__init__()
        self._done = threading.Event()

    def __call__(self, err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        super().__call__(err, msg)
        self._done.set()

    def wait(self, producer: confluent_kafka.Producer, what: str, timeout: float) -> None:
        if not self._done.wait(timeout):
            raise RmqTimeoutError(f"{what}: no delivery report within {timeout:.1f} s")
        if self.error is not None:
            raise KafkaOperationError.wrap(what, self.error)


class DeliveryPoller:
    """Serves one producer's delivery reports from a thread of its own, so callers wait on
    a :class:`SignalledWaiter` instead of polling. ``stop`` is idempotent and joins."""

    def __init__(self, producer: confluent_kafka.Producer, name: str) -> None:
        self._producer = producer
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> DeliveryPoller:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._producer.poll(POLL_SLICE_S)
            except Exception:  # a callback raised: the other reports must still be served
                log.exception("a delivery callback raised")

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


class CallProducer:
    """The producer of a per-call path, made on first use: ``linger_ms`` (the user's, or
    :data:`CALL_LINGER_MS`), as a caller waits for each write (a linger of 5 ms was most of
    a call); concurrent callers still share batches while a request is in flight. A
    :class:`DeliveryPoller` serves its reports. ``stop`` flushes and joins; idempotent."""

    def __init__(
        self,
        conf: dict,
        name: str,
        factory: Callable[[dict], confluent_kafka.Producer] = confluent_kafka.Producer,
        linger_ms: int | None = None,
    ) -> None:
        self._conf = {k: v for k, v in conf.items() if k != "queue.buffering.max.ms"}
        self._conf["linger.ms"] = CALL_LINGER_MS if linger_ms is None else linger_ms
        self._name = name
        self._factory = factory  # a signing producer's, under tenant isolation
        self._lock = threading.Lock()
        self._poller: DeliveryPoller | None = None
        self._stopped = False
        #: The producer once made (None before the first call).
        self.producer: confluent_kafka.Producer | None = None

    def get(self) -> confluent_kafka.Producer:
        with self._lock:
            if self._stopped:  # stop ran while this call waited for the lock
                raise IllegalStateError("the producer is shut down")
            if self.producer is None:
                self.producer = self._factory(dict(self._conf))
                self._poller = DeliveryPoller(self.producer, self._name).start()
            return self.producer

    def flush(self, timeout: float) -> int:
        """Wait for its queued records; returns how many are still queued."""
        with self._lock:
            producer = self.producer
        return producer.flush(timeout) if producer is not None else 0

    def stop(self, timeout: float) -> None:
        with self._lock:
            self._stopped = True
            if self.producer is not None:
                self.producer.flush(timeout)
            if self._poller is not None:
                self._poller.stop(timeout)


class PartitionCache:
    """Partition ids per topic from a client's metadata: trusted for ``METADATA_TTL_S``, at
    most ``METADATA_MAX_TOPICS`` topics, every metadata call bounded by a timeout."""

    def __init__(self, client: confluent_kafka.Producer) -> None:
        self._client = client
        self._entries: dict[str, tuple[float, list[int]]] = {}
        self._lock = threading.Lock()  # producers are shared between threads

    def partitions(self, topic: str, timeout: float, *, fresh: bool = False) -> list[int]:
        """Partition ids of ``topic``; ``fresh`` skips the cache."""
        with self._lock:
            cached = self._entries.get(topic)
        if cached and not fresh and time.monotonic() - cached[0] < METADATA_TTL_S:
            return cached[1]
        try:
            meta = self._client.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise KafkaOperationError.wrap(f"reading metadata of {topic}", exc.args[0]) from exc
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error.str() if meta is not None and meta.error else "no partitions"
            raise KafkaOperationError(
                f"topic {topic!r} is not available: {reason}",
                meta.error if meta is not None else None,
            )
        partitions = sorted(meta.partitions)
        with self._lock:
            self._entries.pop(topic, None)
            self._entries[topic] = (time.monotonic(), partitions)
            while len(self._entries) > METADATA_MAX_TOPICS:
                del self._entries[next(iter(self._entries))]
        return partitions

    def fresh(self, topic: str) -> bool:
        """Whether ``topic``'s partitions are cached and trusted (no metadata call)."""
        with self._lock:
            cached = self._entries.get(topic)
        return cached is not None and time.monotonic() - cached[0] < METADATA_TTL_S

    def require(self, topic: str, partition: int, timeout: float) -> None:
        """Raise :class:`UnknownPartitionError` unless ``topic`` has ``partition`` (RocketMQ
        checks the queue id before sending). A cached list is re-read once before refusing:
        the topic may have grown since."""
        partitions = self.partitions(topic, timeout)
        if partition not in partitions:
            partitions = self.partitions(topic, timeout, fresh=True)
        if partition not in partitions:
            raise UnknownPartitionError(
                f"{topic!r} has no partition {partition}: it has {len(partitions)} partitions "
                f"(0..{len(partitions) - 1})"
            )


class Producer:
    """Drop-in for ``confluent_kafka.Producer`` (same conf dict and methods).

    Differences: idempotence and ``acks=all`` are on unless the conf says otherwise, and
    records are partitioned with Java's murmur2 partitioner. ``send`` adds RocketMQ's
    ordered send: ``selector=`` (``(partitions, msg, arg) -> partition``, or an object with
    that ``select`` method such as ``SelectMessageQueueByHash()``) or
    ``sharding_key=``; it waits for the broker's acknowledgement. A message with a
    ``message_group`` and no other placement (selector, sharding key, ``partition``) is
    placed by its group, not by its key: RocketMQ 5's FIFO message group, one partition.

    A :class:`Message` with a delivery time (``deliver_at_ms``, ``deliver_after_ms`` or
    ``delay_time_level``) is a timer message: ``send`` writes it to the timer topic, the
    coordinator delivers it to its topic once due, and the :class:`SendResult`'s
    ``message_id`` is what :meth:`recall_message` cancels. The keyword options
    (``max_delay_ms``, ``delay_levels``, ``timer_partitions``, ``timer_cancels_max``;
    ``producer_group`` and ``group_key``/``group_key_file`` under tenant isolation) are
    :class:`ProducerSettings` (kwargs, else ``RMQ_*`` env).

    Neither ``send``, ``produce`` nor ``produce_batch`` writes to a system topic of
    ``topic_prefix`` (or of the default prefix): they raise :class:`SystemTopicError`, as
    ``Consumer.subscribe`` does for reading. Only the coordinator writes there, with its own
    clients. Nor do they write an ``rmq.*`` header the coordinator or a consumer owns
    (``rmq.promoted_from``, which the Spark job trusts, ``rmq.txn_id``, ``rmq.dlq.*``, ...):
    :class:`ConfigError`; ``rmq.tags``, ``rmq.keys`` and ``rmq.message_group`` (what ``send``
    writes for a ``Message``'s fields) are allowed.
    """

    #: ``cluster_id()``'s default wait (confluent-kafka's waits for ever).
    CLUSTER_ID_TIMEOUT_S = 30.0

    def __init__(
        self,
        conf: dict,
        *,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
        producer_group: str | None = None,
        max_delay_ms: int | None = None,
        delay_levels: str | None = None,
        timer_partitions: int | None = None,
        timer_cancels_max: int | None = None,
        group_key: str | None = None,
        group_key_file: str | None = None,
    ) -> None:
        self._conf = producer_defaults(conf)
        self.topic_prefix = validate_prefix(topic_prefix)
        self._system_prefixes = system_prefixes(self.topic_prefix)
        self.settings = load(
            ProducerSettings,
            {
                "max_delay_ms": max_delay_ms,
                "delay_levels": delay_levels,
                "timer_partitions": timer_partitions,
                "timer_cancels_max": timer_cancels_max,
                "group_key": group_key,
                "group_key_file": group_key_file,
            },
        )
        self._timers = TimerWrites(
            self._conf, SystemTopics(self.topic_prefix), self.settings, producer_group
        )
        self._producer = new_client(confluent_kafka.Producer, self._conf, "producer")
        self._partitions = PartitionCache(self._producer)
        self._closed = False

    # -- RocketMQ-style send ---------------------------------------------------------------
    def partitions_for(self, topic: str, timeout: float = SEND_TIMEOUT_S) -> list[int]:
        """Partition ids of ``topic`` (cached for a short while)."""
        return self._partitions.partitions(topic, timeout)

    def send(
        self,
        msg: Message,
        selector: Any = None,
        arg: Any = None,
        sharding_key: bytes | str | None = None,
        *,
        timeout: float = SEND_TIMEOUT_S,
    ) -> SendResult:
        """Send ``msg`` and wait for its acknowledgement; return where it landed.

        A timer message goes to the timer topic (its timer partition) and the result
        carries its ``message_id``; one due further ahead than ``max_delay_ms`` raises
        :class:`ConfigError` before anything is written."""
        if msg.scheduled:
            return self._write(
                self._timer_write(msg, selector, arg, sharding_key, timeout), timeout
            )
        waiter = DeliveryWaiter()
        self._producer.produce(
            msg.topic,
            msg.value,
            **self._record(msg, selector, arg, sharding_key, timeout),
            on_delivery=waiter,
        )
        waiter.wait(self._producer, f"sending to {msg.topic}", timeout)
        return SendResult(msg.topic, waiter.partition, waiter.offset)

    def recall_message(self, message_id: str, *, timeout: float = SEND_TIMEOUT_S) -> SendResult:
        """Cancel the timer message ``message_id`` (a send's ``SendResult.message_id``;
        RocketMQ 5's ``recallMessage``) and wait for the cancel record's acknowledgement;
        return where it landed. A message already delivered is not taken back (the
        coordinator counts the cancel as too late).

        Raises :class:`TimerRecallRefused` when the cancel landed past the coordinators'
        bound on its timer partition's cancels (``timer_cancels_max``, the same on both
        sides): they do not hold it and the message is delivered at its time."""
        deadline = time.monotonic() + timeout
        write = self._timers.cancel_record(message_id)
        result = self._write(write, timeout)
        refused = self._timers.cancel_refusal(
            write, result.offset, max(0.1, deadline - time.monotonic())
        )
        if refused is not None:
            raise TimerRecallRefused(refused)
        return result

    def _timer_write(
        self,
        msg: Message,
        selector: Any,
        arg: Any,
        sharding_key: bytes | str | None,
        timeout: float,
    ) -> TimerWrite:
        """``msg``'s timer record: its real partition as ``send`` would place it (a selector
        or sharding key reads the topic's partitions), the timer topics made on first use."""
        partition = self._record(msg, selector, arg, sharding_key, timeout).get("partition")
        return self._timers.timer_record(msg, partition)

    def _write(self, write: TimerWrite, timeout: float) -> SendResult:
        waiter = DeliveryWaiter()
        self._producer.produce(
            write.topic,
            write.value,
            key=write.key,
            partition=write.partition,
            headers=produce_headers(write.headers),
            timestamp=write.timestamp or 0,
            on_delivery=waiter,
        )
        waiter.wait(self._producer, f"writing to {write.topic} for {write.message_id}", timeout)
        return SendResult(write.topic, waiter.partition, waiter.offset, write.message_id)

    def _record(
        self,
        msg: Message,
        selector: Any,
        arg: Any,
        sharding_key: bytes | str | None,
        timeout: float,
    ) -> dict[str, Any]:
        """``produce``'s keywords for ``msg`` (key, headers, partition); a selector, a
        sharding key or a message group reads the topic's partitions (metadata, cached: may
        block).

        Placement: :func:`~rmq_semantics.selector.placement` (a selector, a
        ``sharding_key``, ``msg.partition``, ``msg.message_group``, else by record key)."""
        if selector is not None and sharding_key is not None:
            raise ConfigError("send: pass selector= or sharding_key=, not both")
        refuse_system_destination(msg.topic, self.topic_prefix)
        partition = placement(
            msg, selector, arg, sharding_key, lambda: self.partitions_for(msg.topic, timeout)
        )
        record: dict[str, Any] = {"key": msg.key, "headers": msg.user_headers() + msg.rmq_headers()}
        if partition is not None:
            record["partition"] = partition
        return record

    # -- confluent_kafka.Producer, delegated ------------------------------------------------
    def produce(self, *args: Any, **kwargs: Any) -> None:
        topic = args[0] if args else kwargs.get("topic")
        # The drop-in is where most records are written: one startswith keeps it off the
        # system topics too (a non-str topic is left to confluent_kafka to refuse).
        if isinstance(topic, str) and topic.startswith(self._system_prefixes):
            refuse_system_destination(topic, self.topic_prefix)
        # headers is produce's 8th positional (topic, value, key, partition, callback,
        # on_delivery, timestamp, headers).
        headers = args[7] if len(args) > 7 else kwargs.get("headers")
        if headers:
            self._refuse_reserved(headers)
        self._producer.produce(*args, **kwargs)

    def produce_batch(
        self,
        topic: str,
        messages: list,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
    ) -> int:
        """confluent_kafka's ``produce_batch``: each dict's ``value``, ``key``,
        ``partition``, ``timestamp``, ``headers`` and ``callback``; returns how many were
        queued, and a message that was not gets an ``_error`` (a ``KafkaError``). Unlike
        confluent-kafka's, each message keeps its ``headers`` (its C batch API drops them):
        the messages are queued one by one, and librdkafka batches them all the same. The
        whole batch is checked (types, system topic, reserved headers) before any is queued.
        """
        if isinstance(topic, str) and topic.startswith(self._system_prefixes):
            refuse_system_destination(topic, self.topic_prefix)
        if not isinstance(messages, list):
            raise TypeError("messages must be a list")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise TypeError(f"Message at index {i} must be a dict")
            for field in ("value", "key"):
                if not isinstance(m.get(field), (bytes, str, type(None))):
                    raise TypeError(f"Message {field} at index {i} must be bytes or str")
            if m.get("headers"):
                self._refuse_reserved(m["headers"])
        default_cb = callback if callback is not None else on_delivery
        queued = 0
        for m in messages:
            record: dict[str, Any] = {"key": m.get("key"), "headers": m.get("headers")}
            own_partition = m.get("partition")
            record["partition"] = partition if own_partition is None else own_partition
            if m.get("timestamp") is not None:
                record["timestamp"] = m["timestamp"]
            cb = m.get("callback") or default_cb
            if cb is not None:
                record["on_delivery"] = cb
            try:
                self._producer.produce(topic, m.get("value"), **record)
            except BufferError:
                m["_error"] = KafkaError(KafkaError._QUEUE_FULL)
                continue
            except KafkaException as exc:
                m["_error"] = exc.args[0]
                continue
            queued += 1
        return queued

    def _refuse_reserved(self, headers: Any) -> None:
        """Raise for an ``rmq.*`` header a business producer does not write: a record that
        carries one would be trusted as the coordinator's (a forged promotion)."""
        try:
            names = list(
                headers.keys() if isinstance(headers, dict) else (item[0] for item in headers)
            )
        except (TypeError, IndexError, KeyError):
            return  # malformed: confluent_kafka refuses it with its own error
        for name in names:
            if (
                isinstance(name, str)
                and name.startswith(RESERVED_PREFIX)
                and name not in PRODUCER_HEADERS
            ):
                raise ConfigError(
                    f"header {name!r}: the rmq.* header namespace is reserved (written by "
                    f"the coordinator and consumers, trusted downstream); business producers "
                    f"may set only {sorted(PRODUCER_HEADERS)}"
                )

    def cluster_id(self, timeout: float = CLUSTER_ID_TIMEOUT_S) -> str | None:
        """The cluster id from the broker metadata (None if none came within ``timeout``)."""
        return self._producer.cluster_id(timeout)

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

    def __bool__(self) -> bool:
        # With __len__ alone an idle producer would be falsy (`if producer:` skipped).
        return True

    # -- lifecycle -------------------------------------------------------------------------
    def close(self, timeout: float = SEND_TIMEOUT_S) -> bool:
        """confluent_kafka's ``close``: deliver what is queued, then shut the client down
        (any later call raises ``RuntimeError``, as confluent-kafka's does). Unlike it, the
        wait is bounded by ``timeout``: what is still undelivered then is purged, logged, and
        reported to its delivery callbacks as purged. Idempotent; returns True."""
        if self._closed:
            return True
        self._closed = True
        left = self._producer.flush(timeout)
        if left:
            log.warning(
                "closing the producer: %d records not delivered within %.1f s are "
                "purged (their delivery callbacks report it)",
                left,
                timeout,
            )
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer.flush(0)  # serves the purge reports
        return bool(self._producer.close())

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
