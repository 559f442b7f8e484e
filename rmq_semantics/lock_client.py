"""Client side of the queue-lock protocol (RocketMQ's ``lockBatchMQ``/``unlockBatchMQ``).

A call groups the queues by request partition (:meth:`LockKey.request_partition`, the
partition of the coordinator instance that owns those locks), writes one request per
partition to ``<prefix>_lock_request`` and waits, bounded, for the replies. Replies come
on ``<prefix>_lock_reply``, partition ``murmur2(client_id) % R``: this client assigns that
one partition (no consumer group) from its end when it first connects, reads it
``read_committed`` (a reply is visible only if the coordinator's transaction that
persisted the decision committed) and keeps only replies to its own pending request ids.

Under tenant isolation the client signs every request with its consumer group's key
(``group_key``); the coordinators decide no request without it (docs/security.md).

The client never trusts a lease for longer than :data:`CLIENT_LEASE_FRACTION` of it,
counted from when the request was *sent*: the coordinator starts the lease later, when it
processes the request, so the client's view always ends first (RocketMQ: 30 s client
view of a 60 s broker lease).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.errors import (
    ConfigError,
    IllegalStateError,
    KafkaOperationError,
    MalformedRecordError,
)
from rmq_semantics.records.codec import decode_as, encode
from rmq_semantics.records.group_auth import GroupKey, sign_lock_request
from rmq_semantics.records.locks import (
    MAX_ID_CHARS,
    MAX_REPLY_BYTES,
    LockKey,
    LockReply,
    LockRequest,
    QueueRef,
    RequestKind,
    reply_bound,
)
from rmq_semantics.selector import java_partition
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, SystemTopics

__all__ = ["CLIENT_LEASE_FRACTION", "LINGER_MS", "LockClient", "LockGrant"]

log = logging.getLogger(__name__)
# A lock request's caller waits for it: nothing to gather (written out, as defaults move).
LINGER_MS = 0

#: Share of a granted lease the client acts on; the rest absorbs clock-rate drift, a
#: scheduling or GC stall, and the time to stop in-flight work.
CLIENT_LEASE_FRACTION = 2 / 3
# A lock round trip is two Kafka hops and one coordinator transaction (tens of ms);
# seconds mean the coordinator is down or taking partitions over.
DEFAULT_TIMEOUT_S = 5.0
# Metadata and watermark look-ups when connecting.
CONNECT_TIMEOUT_S = 10.0
POLL_SLICE_S = 0.05
# A request id: uuid4().hex.
REQUEST_ID_CHARS = 32
# An unsigned request is written as schema v2, which coordinators of before v3 read too.
UNSIGNED_VERSION = 2
# The reason of a queue the coordinators refused for want of the group's valid MAC.
UNAUTHENTICATED = "unauthenticated"

TP = tuple[str, int]


class LockGrant(NamedTuple):
    """Outcome for one queue. ``expires`` is a ``time.monotonic()`` instant: the caller may
    act as the holder until then (0.0 when not granted). For a denied lock ``epoch`` is
    the current holder's (-1 when unknown)."""

    granted: bool
    epoch: int
    expires: float


def _normalize(partitions: Iterable[Any]) -> list[TP]:
    out: list[TP] = []
    for item in partitions:
        if isinstance(item, TopicPartition):
            out.append((item.topic, item.partition))
            continue
        try:
            topic, partition = item
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"want (topic, partition) pairs, got {item!r}") from exc
        if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
            raise ConfigError(f"want (topic, partition) pairs, got {item!r}")
        out.append((topic, partition))
    return sorted(set(out))


def _id_problem(name: str, value: str) -> ConfigError | None:
    if 0 < len(value) <= MAX_ID_CHARS:
        return None
    return ConfigError(
        f"{name} of {len(value)} characters ({value[:32]!r}...): the "
        f"coordinator's lock service refuses ids over {MAX_ID_CHARS}"
    )


def split_requests(client_id: str, refs: list[QueueRef]) -> list[list[QueueRef]]:
    """``refs`` (of one request partition) in runs, in order, each as many queues as one
    request can carry while its reply stays within the service's :data:`MAX_REPLY_BYTES`
    (about 2,600 queues of 30-character topics, 1,600 of the longest)."""
    empty = reply_bound(client_id, "0" * REQUEST_ID_CHARS, ())
    runs: list[list[QueueRef]] = []
    size = MAX_REPLY_BYTES + 1  # the first queue starts a run
    for ref in refs:
        cost = reply_bound("", "", (ref.topic,))
        if size + cost > MAX_REPLY_BYTES:
            runs.append([])
            size = empty
        runs[-1].append(ref)
        size += cost
    return runs


class LockClient:
    """Lock and unlock queues at the coordinator's queue-lock service.

    ``conf`` holds ``bootstrap.servers`` and security settings (copied, never mutated);
    ``client_id`` identifies this consumer instance to the coordinator (a restart must use
    a new one: default random; at most :data:`MAX_ID_CHARS` characters). ``group_key``
    (under tenant isolation) is the key of the consumer group it locks for: every request
    is signed with it. Safe to call from several threads. No network in ``__init__``; the
    first call connects. A call for more queues than one request's reply may hold goes as
    several requests.
    """

    def __init__(
        self,
        conf: dict,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
        client_id: str | None = None,
        *,
        group_key: GroupKey | None = None,
    ) -> None:
        self.topics = SystemTopics(topic_prefix)
        self._group_key = group_key
        self.client_id = client_id or f"lockclient-{uuid.uuid4().hex[:12]}"
        if (problem := _id_problem("client_id", self.client_id)) is not None:
            raise problem
        self._conf = shared_conf(conf, who="LockClient")
        self._producer: confluent_kafka.Producer | None = None
        self._consumer: confluent_kafka.Consumer | None = None
        self._request_partitions = 0
        self.reply_partition = -1
        self._connect_lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._replies_cv = threading.Condition()
        self._pending: dict[str, LockReply | None] = {}
        self._closed = False
        self._warned: set[str] = set()  # warnings given once per client

    # -- connection ------------------------------------------------------------------------
    def _unusable(self, producer: confluent_kafka.Producer, topic: str) -> KafkaOperationError:
        """Why lock topic ``topic`` cannot be used. A listing of all topics leaves out those
        the principal may not describe, so only a request naming it tells "not authorized"
        from "not there"."""
        try:
            error = producer.list_topics(topic, timeout=CONNECT_TIMEOUT_S).topics[topic].error
        except (KafkaException, KeyError):
            error = None
        if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            return KafkaOperationError(
                f"not authorized to use {topic}: an orderly consumer's principal needs WRITE, "
                f"DESCRIBE on {self.topics.lock_request} and READ, DESCRIBE on "
                f"{self.topics.lock_reply} (`rmq-semantics tenant acls` prints them)",
                error,
            )
        return KafkaOperationError(
            f"{topic} does not exist yet: is the coordinator's lock service "
            f"running with topic_prefix={self.topics.prefix!r}?",
            KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART),
        )

    def _connect(self) -> None:
        with self._connect_lock:
            if self._closed:
                raise IllegalStateError("LockClient is closed")
            if self._consumer is not None:
                return
            producer = confluent_kafka.Producer(
                {
                    **self._conf,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": LINGER_MS,
                    # Its metadata requests name the lock topics: never create them.
                    "allow.auto.create.topics": False,
                }
            )
            counts = {}
            try:
                meta = producer.list_topics(timeout=CONNECT_TIMEOUT_S)
            except KafkaException as exc:
                raise KafkaOperationError.wrap("reading lock-topic metadata", exc.args[0]) from exc
            for topic in (self.topics.lock_request, self.topics.lock_reply):
                tmeta = meta.topics.get(topic)
                if tmeta is None or tmeta.error is not None or not tmeta.partitions:
                    raise self._unusable(producer, topic)
                counts[topic] = len(tmeta.partitions)
            reply_partition = java_partition(
                self.client_id.encode(), counts[self.topics.lock_reply]
            )
            consumer = confluent_kafka.Consumer(
                {
                    **self._conf,
                    # Required by the client library; never joined nor committed (assign only).
                    "group.id": f"{self.topics.prefix}_lock_client",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 10,
                }
            )
            tp = TopicPartition(self.topics.lock_reply, reply_partition)
            try:
                _, high = consumer.get_watermark_offsets(
                    tp, timeout=CONNECT_TIMEOUT_S, cached=False
                )
            except KafkaException as exc:
                consumer.close()
                raise KafkaOperationError.wrap(
                    "reading the reply partition's end", exc.args[0]
                ) from exc
            consumer.assign([TopicPartition(tp.topic, tp.partition, high)])
            self._producer, self._consumer = producer, consumer
            self._request_partitions = counts[self.topics.lock_request]
            self.reply_partition = reply_partition
            log.debug(
                "lock client %s reads replies from %s[%d]@%d",
                self.client_id,
                tp.topic,
                reply_partition,
                high,
            )

    # -- protocol --------------------------------------------------------------------------
    def lock(
        self,
        group: str,
        partitions: Iterable[Any],
        lease_ms: int,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> dict[TP, LockGrant]:
        """Lock (or renew) ``partitions`` of consumer group ``group`` for ``lease_ms``.

        Returns ``{(topic, partition): LockGrant(granted, epoch, expires)}`` for every
        requested queue; queues whose reply did not arrive within ``timeout`` are reported
        not granted. Raises :class:`KafkaOperationError` when the lock topics are missing.
        """
        if not isinstance(lease_ms, int) or lease_ms <= 0:
            raise ConfigError(f"lease_ms must be a positive int, got {lease_ms!r}")
        tps = _normalize(partitions)
        sent_at = time.monotonic()
        replies = self._call(RequestKind.LOCK, group, {tp: None for tp in tps}, lease_ms, timeout)
        out = {tp: LockGrant(False, -1, 0.0) for tp in tps}
        for reply in replies:
            for r in reply.results:
                tp = (r.topic, r.partition)
                if tp not in out:
                    continue
                if r.granted:
                    expires = sent_at + r.lease_ms / 1000 * CLIENT_LEASE_FRACTION
                    out[tp] = LockGrant(True, r.epoch, expires)
                    if r.lease_ms < lease_ms:
                        self._warn_once(
                            "capped",
                            "lock %s granted for %d ms, not the %d ms "
                            "asked (the coordinator's lock_lease_ms); renew more "
                            "often than every %d ms",
                            LockKey(group, *tp),
                            r.lease_ms,
                            lease_ms,
                            int(r.lease_ms * CLIENT_LEASE_FRACTION),
                        )
                elif r.reason == UNAUTHENTICATED:
                    out[tp] = LockGrant(False, -1, 0.0)
                    self._warn_once(
                        UNAUTHENTICATED,
                        "lock %s refused as unauthenticated: the coordinators run tenant "
                        "isolation and this client %s; give it consumer group %r's key "
                        "(consumer_group_key, docs/security.md)",
                        LockKey(group, *tp),
                        "has no key" if self._group_key is None else "has another group's key",
                        group,
                    )
                elif r.reason == "stale":
                    # Answered within our wait, so the request was not old: the clock it
                    # was timed by (this host's, or the broker's) is behind the coordinator's.
                    out[tp] = LockGrant(False, r.epoch, 0.0)
                    self._warn_once(
                        "stale",
                        "lock %s refused as stale although answered "
                        "within the wait: this host's (or the broker's) clock is "
                        "behind the coordinator's",
                        LockKey(group, *tp),
                    )
                else:
                    out[tp] = LockGrant(False, r.epoch, 0.0)
                    log.debug(
                        "lock %s denied (%s): held by %s with epoch %d",
                        LockKey(group, *tp),
                        r.reason,
                        r.holder or "-",
                        r.epoch,
                    )
        return out

    def _warn_once(self, kind: str, fmt: str, *args: object) -> None:
        if kind in self._warned:
            log.debug(fmt, *args)
            return
        self._warned.add(kind)
        log.warning("lock client %s: " + fmt, self.client_id, *args)

    def unlock(
        self,
        group: str,
        partitions: Iterable[Any],
        *,
        epochs: dict[TP, int] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> dict[TP, bool]:
        """Release ``partitions`` if this client holds them (with ``epochs[tp]`` if given).

        Returns ``{(topic, partition): released}``; False also when no reply came in time.
        """
        tps = _normalize(partitions)
        epochs = epochs or {}
        replies = self._call(
            RequestKind.UNLOCK, group, {tp: epochs.get(tp) for tp in tps}, 0, timeout
        )
        out = dict.fromkeys(tps, False)
        for reply in replies:
            for r in reply.results:
                if (r.topic, r.partition) in out:
                    out[(r.topic, r.partition)] = r.granted
        return out

    def _call(
        self,
        kind: RequestKind,
        group: str,
        queues: dict[TP, int | None],
        lease_ms: int,
        timeout: float,
    ) -> list[LockReply]:
        if not isinstance(group, str) or not group:
            raise ConfigError(f"group must be a non-empty str, got {group!r}")
        if (problem := _id_problem("group", group)) is not None:
            raise problem
        if not queues:
            return []
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0, got {timeout!r}")
        self._connect()
        producer = self._producer
        if producer is None:
            raise IllegalStateError("LockClient is closed")
        deadline = time.monotonic() + timeout
        by_partition: dict[int, list[QueueRef]] = {}
        for (topic, partition), epoch in queues.items():
            p = LockKey(group, topic, partition).request_partition(self._request_partitions)
            by_partition.setdefault(p, []).append(QueueRef(topic, partition, epoch))
        batches = [
            (uuid.uuid4().hex, p, run)
            for p, refs in sorted(by_partition.items())
            for run in split_requests(self.client_id, refs)
        ]
        request_ids = [request_id for request_id, _, _ in batches]
        with self._replies_cv:
            self._pending.update(dict.fromkeys(request_ids))
        try:
            for request_id, p, refs in batches:
                request = LockRequest(
                    kind,
                    request_id,
                    self.client_id,
                    group,
                    self.reply_partition,
                    tuple(refs),
                    lease_ms,
                    int(time.time() * 1000),
                    int(timeout * 1000),
                )
                if self._group_key is not None:
                    request = sign_lock_request(
                        self._group_key, self.topics.lock_request, p, request
                    )
                producer.produce(
                    self.topics.lock_request,
                    encode(request, None if request.mac else UNSIGNED_VERSION),
                    key=refs[0].key(group).record_key(),
                    partition=p,
                )
            producer.flush(max(0.0, deadline - time.monotonic()))
            return self._await(request_ids, deadline, kind)
        finally:
            with self._replies_cv:
                for request_id in request_ids:
                    self._pending.pop(request_id, None)

    def _await(self, request_ids: list[str], deadline: float, kind: RequestKind) -> list[LockReply]:
        """Wait for the replies; whichever waiting thread holds the poll lock reads."""
        while True:
            with self._replies_cv:
                got = [self._pending.get(r) for r in request_ids]
                if all(g is not None for g in got):
                    return [g for g in got if g is not None]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sum(g is None for g in got)
                log.warning(
                    "lock client %s: %d of %d %s replies missing after the timeout",
                    self.client_id,
                    missing,
                    len(request_ids),
                    kind.value,
                )
                return [g for g in got if g is not None]
            if self._poll_lock.acquire(timeout=min(POLL_SLICE_S, remaining)):
                try:
                    self._read_replies(min(POLL_SLICE_S, remaining))
                finally:
                    self._poll_lock.release()
            else:
                with self._replies_cv:
                    self._replies_cv.wait(min(POLL_SLICE_S, remaining))

    def _read_replies(self, timeout: float) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        try:
            msgs = consumer.consume(100, timeout)
        except (KafkaException, RuntimeError) as exc:
            log.warning("lock client %s reading replies: %s", self.client_id, exc)
            return
        with self._replies_cv:
            for msg in msgs:
                if (err := msg.error()) is not None:
                    log.debug("lock reply consumer: %s", err.str())
                    continue
                if msg.key() != self.client_id.encode():
                    continue
                try:
                    reply = decode_as(LockReply, msg.value())
                except MalformedRecordError as exc:
                    log.warning(
                        "%s[%d]@%d skipped: %s", msg.topic(), msg.partition(), msg.offset(), exc
                    )
                    continue
                if reply.request_id in self._pending:
                    self._pending[reply.request_id] = reply
            self._replies_cv.notify_all()

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Release the Kafka clients. Idempotent."""
        with self._connect_lock:
            if self._closed:
                return
            self._closed = True
            producer, consumer = self._producer, self._consumer
            self._producer = self._consumer = None
        if consumer is not None:
            # A reader holds the poll lock for one poll slice at most.
            got = self._poll_lock.acquire(timeout=CONNECT_TIMEOUT_S)
            try:
                consumer.close()
            finally:
                if got:
                    self._poll_lock.release()
        if producer is not None:
            producer.flush(CONNECT_TIMEOUT_S)

    def __enter__(self) -> LockClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
