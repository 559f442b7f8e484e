"""System-topic names, their configs, and creation on first use.

Over 500 lines since the timer topics, and whole: every system topic's name and configs are
here so that whichever process creates a topic first creates it as the others would."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic, OffsetSpec

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ConfigError,
    KafkaOperationError,
    SystemTopicError,
)
from rmq_semantics.records.group_auth import MAX_TOPIC_LENGTH, encode_group
from rmq_semantics.records.timer import max_level
from rmq_semantics.retry import retriable_kafka_error

__all__ = [
    "DEFAULT_TOPIC_PREFIX",
    "SystemPartitionFilter",
    "SystemTopics",
    "admin_client",
    "ensure_topics",
    "is_readable_system_topic",
    "is_system_topic",
    "list_topics",
    "offset_for_time",
    "refuse_system_destination",
    "replication_for",
    "require_copartitioned",
    "timer_topic_specs",
    "txn_topic_specs",
]

log = logging.getLogger(__name__)

DEFAULT_TOPIC_PREFIX = "__rmq"
# Bounds every admin round trip; topic creation on a cold single-node broker takes ~1 s.
ADMIN_TIMEOUT_S = 30.0
WEEK_MS = 7 * 24 * 3600 * 1000
# Check requests are only useful until answered; a day leaves room for debugging.
CHECK_RETENTION_MS = 24 * 3600 * 1000
# Metadata is asked in slices this long so a refused login (librdkafka reports it within
# ~0.3 s, then retries forever) ends the call at once instead of after ADMIN_TIMEOUT_S.
METADATA_SLICE_S = 1.0
_AUTH_CODES = (KafkaError._AUTHENTICATION, KafkaError._SSL)
# What list_topics reports when no broker answered at all.
_NO_BROKER_CODES = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN)
# Pause between metadata reads while a new topic becomes visible.
METADATA_POLL_S = 0.05


def validate_prefix(prefix: str) -> str:
    if not prefix or not all(c.isalnum() or c in "._-" for c in prefix):
        raise ConfigError(f"topic_prefix={prefix!r}: use letters, digits, '.', '_' or '-'")
    return prefix


@dataclass(frozen=True)
class SystemTopics:
    """All topic names derived from one prefix (DESIGN.md, "Topics")."""

    prefix: str = DEFAULT_TOPIC_PREFIX

    def __post_init__(self) -> None:
        validate_prefix(self.prefix)

    @property
    def half(self) -> str:
        """Half messages: the original key, value and user headers plus ``rmq.*`` headers
        (RocketMQ's ``RMQ_SYS_TRANS_HALF_TOPIC``)."""
        return f"{self.prefix}_half"

    @property
    def op(self) -> str:
        """Op records, co-partitioned with the half topic: end requests, done markers, check
        markers (RocketMQ's ``RMQ_SYS_TRANS_OP_HALF_TOPIC``)."""
        return f"{self.prefix}_op"

    @property
    def check(self) -> str:
        """Back-check requests to producer groups, keyed by transaction id over its partitions
        (the shared check topic; one per group under tenant isolation)."""
        return f"{self.prefix}_check"

    @property
    def discard(self) -> str:
        """Half messages set aside, each with ``rmq.discard_reason`` (RocketMQ's
        ``TRANS_CHECK_MAX_TIME_TOPIC``); kept forever."""
        return f"{self.prefix}_discard"

    @property
    def lock(self) -> str:
        """The queue-lock table, compacted, keyed by group/topic/partition (RocketMQ's broker
        ``RebalanceLockManager``)."""
        return f"{self.prefix}_lock"

    @property
    def lock_request(self) -> str:
        """Lock and unlock requests of orderly consumers (``LogAppendTime``, so a stale request
        is timed by the broker)."""
        return f"{self.prefix}_lock_request"

    @property
    def lock_reply(self) -> str:
        """The lock service's replies."""
        return f"{self.prefix}_lock_reply"

    @property
    def keys(self) -> str:
        """The coordinators' own: the marker key (when generated) and upgrade watermarks."""
        return f"{self.prefix}_keys"

    def dlq(self, group: str) -> str:
        """The dead-letter topic of consumer ``group`` (RocketMQ's ``%DLQ%<group>``), readable
        when named."""
        return f"{self.prefix}_dlq_{group}"

    def retry(self, group: str, level: int) -> str:
        """The retry topic of ``group``'s delay ``level`` (the concurrent consumer's)."""
        return f"{self.prefix}_retry_{group}_{level}"

    @property
    def timer(self) -> str:
        """Timer messages as producers write them (the intake of the timing wheel): the
        user's record plus ``rmq.timer_id``, ``rmq.deliver_at`` and where to deliver it
        (RocketMQ's ``rmq_sys_wheel_timer``)."""
        return f"{self.prefix}_timer"

    def timer_level(self, level: int) -> str:
        """Level ``level`` (1..Lmax) of the timing wheel: holds a timer record ``2^(L-1)``
        s from its append time (``LogAppendTime``) before the coordinator looks at it again."""
        return f"{self.prefix}_timer_{level}"

    @property
    def timer_cancel(self) -> str:
        """Cancels of timer messages (``recall_message``), co-partitioned with the timer
        topics: a message's cancel is in its timer partition."""
        return f"{self.prefix}_timer_cancel"

    @property
    def timer_group(self) -> str:
        """The coordinators' consumer group over the timer topics."""
        return f"{self.prefix}_timer"

    @property
    def coordinator_group(self) -> str:
        """The coordinators' consumer group over the half and Op topics (its offsets are
        RocketMQ's halfOffset and opOffset)."""
        return f"{self.prefix}_coordinator"

    def check_group(self, producer_group: str) -> str:
        """The consumer group of ``producer_group``'s check consumers on the shared check topic."""
        return f"{self.prefix}_check_{producer_group}"

    def group_check(self, producer_group: str) -> str:
        """The check topic of one producer group under tenant isolation, also the name of
        its check consumers' group: a literal Kafka ACL on it reaches that group alone."""
        name = f"{self.prefix}_check_{encode_group(producer_group)}"
        if len(name) > MAX_TOPIC_LENGTH:
            raise ConfigError(
                f"producer group {producer_group[:40]!r}...: its check topic "
                f"name would be {len(name)} characters, over Kafka's "
                f"{MAX_TOPIC_LENGTH}; use a shorter group name"
            )
        return name


def system_prefixes(prefix: str = DEFAULT_TOPIC_PREFIX) -> tuple[str, ...]:
    """Name prefixes of the product's own topics: under ``prefix`` and the default one
    (for ``str.startswith``, so a hot path pays one call)."""
    return (f"{prefix}_", f"{DEFAULT_TOPIC_PREFIX}_")


def is_system_topic(topic: str, prefix: str = DEFAULT_TOPIC_PREFIX) -> bool:
    """True for the product's own topics under ``prefix`` and under the default prefix."""
    return topic.startswith(system_prefixes(prefix))


def refuse_system_destination(topic: str, prefix: str) -> None:
    """Raise for a system topic as the destination of a business record: only the
    coordinator writes there, and a record it did not write is forged input to it."""
    if is_system_topic(topic, prefix):
        raise SystemTopicError(
            f"{topic!r} is a system topic of rmq_semantics (prefix {prefix!r}); business "
            "producers may not write to it"
        )


TopicSpecs = dict[str, tuple[int, dict[str, str]]]


def txn_topic_specs(
    topics: SystemTopics, half_partitions: int, check_partitions: int, *, horizon_ms: int = 0
) -> TopicSpecs:
    """Partitions and configs of the transactional system topics, the same whichever
    process creates them first (a coordinator or ``TransactionProducer.start()``).

    Half and Op records live a week, or twice ``horizon_ms`` (the longest a transaction
    stays pending: the coordinator's timeout plus ``check_max`` check intervals) if longer.
    A producer does not know the horizon and passes 0: the same week unless a coordinator
    is configured for a horizon over 3.5 days (start that coordinator first).
    """
    retention = str(max(WEEK_MS, 2 * horizon_ms))
    return {
        topics.half: (half_partitions, {"retention.ms": retention}),
        topics.op: (half_partitions, {"retention.ms": retention}),
        topics.check: (check_partitions, {"retention.ms": str(CHECK_RETENTION_MS)}),
        topics.discard: (1, {"retention.ms": "-1"}),
    }


def timer_topic_specs(
    topics: SystemTopics, partitions: int, max_delay_ms: int, *, levels: bool = True
) -> TopicSpecs:
    """Partitions and configs of the timer topics, the same whichever process creates them
    first (a producer creates the intake and cancel topics on its first scheduled send or
    recall, without ``levels``; the coordinator all of them).

    All have ``partitions`` partitions (co-partitioned). Records live a week, or twice
    ``max_delay_ms`` if longer: a record is read again long before, even after an outage
    of days. The level topics time their records by the broker (``LogAppendTime``), so the
    append time a hold counts from never decreases along a partition.
    """
    retention = {"retention.ms": str(max(WEEK_MS, 2 * max_delay_ms))}
    specs: TopicSpecs = {
        topics.timer: (partitions, dict(retention)),
        topics.timer_cancel: (partitions, dict(retention)),
    }
    if levels:
        for level in range(1, max_level(max_delay_ms) + 1):
            specs[topics.timer_level(level)] = (
                partitions,
                {**retention, "message.timestamp.type": "LogAppendTime"},
            )
    return specs


def is_readable_system_topic(topic: str, prefix: str = DEFAULT_TOPIC_PREFIX) -> bool:
    """A DLQ or retry topic (``<prefix>_dlq_<group>``, ``<prefix>_retry_<group>_<level>``):
    a consumer may read one it names explicitly, as RocketMQ users re-consume ``%DLQ%``."""
    return topic.startswith(
        tuple(f"{p}{kind}" for p in system_prefixes(prefix) for kind in ("dlq_", "retry_"))
    )


def refuse_system_topics(topics: list[str], prefix: str) -> None:
    """Raise for an explicit subscription to a system topic (patterns are filtered later);
    a DLQ or retry topic named explicitly is allowed."""
    for topic in topics:
        if (
            not topic.startswith("^")
            and is_system_topic(topic, prefix)
            and not is_readable_system_topic(topic, prefix)
        ):
            raise SystemTopicError(
                f"{topic!r} is a system topic of rmq_semantics; business consumers read "
                "only promoted topics (and DLQ or retry topics named explicitly)"
            )


def incremental_assignment(conf: dict) -> bool:
    """Whether a consumer of ``conf`` assigns incrementally (librdkafka's COOPERATIVE
    protocol): the KIP-848 protocol, or a cooperative classic strategy."""
    if str(conf.get("group.protocol", "classic")).lower() == "consumer":
        return True
    return "cooperative" in str(conf.get("partition.assignment.strategy", "")).lower()


class SystemPartitionFilter:
    """The one system-topic filter of every consumer class, applied at assignment.

    A pattern subscription may match the product's own topics (``<prefix>_*`` and
    ``__rmq_*``: half messages, Op records, locks, keys). Each rebalance callback passes its
    partitions through :meth:`keep` before assigning them, so such a partition is never
    fetched, delivered, locked, retried or committed; revocations pass through
    :meth:`release`, so only what was assigned is unassigned. A DLQ or retry topic the
    consumer names explicitly (``named``) is kept. ``skipped_partitions`` counts the
    partitions left out (each assignment of one counts once); one log line per assignment.
    Used by one thread at a time: the consumer's poll thread, which runs the callbacks.
    """

    def __init__(self, prefix: str, who: str) -> None:
        self.prefix = prefix
        self.who = who
        self.named: frozenset[str] = frozenset()
        self.skipped_partitions = 0
        self._left_out: set[tuple[str, int]] = set()

    def name(self, topics: Iterable[str]) -> None:
        """The readable system topics (DLQ, retry) among ``topics``, named explicitly."""
        self.named = frozenset(t for t in topics if is_readable_system_topic(t, self.prefix))

    def keeps(self, topic: str) -> bool:
        return topic in self.named or not is_system_topic(topic, self.prefix)

    def keep(self, partitions: list) -> list:
        """``partitions`` (TopicPartition) without the system ones, counted and logged."""
        kept = [tp for tp in partitions if self.keeps(tp.topic)]
        if len(kept) < len(partitions):
            left = [tp for tp in partitions if not self.keeps(tp.topic)]
            self.skipped_partitions += len(left)
            self._left_out.update((tp.topic, tp.partition) for tp in left)
            log.info(
                "%s: not reading %d system-topic partitions its subscription pattern matched (%s)",
                self.who,
                len(left),
                ", ".join(sorted({tp.topic for tp in left})),
            )
        return kept

    def release(self, partitions: list) -> list:
        """Revoked or lost ``partitions`` without the ones :meth:`keep` left out."""
        kept = []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in self._left_out:
                self._left_out.discard(key)
            else:
                kept.append(tp)
        return kept


class _AuthWatch:
    """``error_cb`` that keeps the first authentication or TLS failure librdkafka reports
    (it only logs those and retries forever), then calls the caller's own ``error_cb``."""

    def __init__(self, chained: Callable[[KafkaError], Any] | None) -> None:
        self.error: KafkaError | None = None
        self._chained = chained

    def __call__(self, err: KafkaError) -> None:
        if self.error is None and err.code() in _AUTH_CODES:
            self.error = err
        if self._chained is not None:
            self._chained(err)

    def raise_if_failed(self, conf: dict) -> None:
        err = self.error
        if err is None:
            return
        where = conf.get("bootstrap.servers", "?")
        if err.code() == KafkaError._SSL:
            hint = "check security.protocol and the ssl.* settings"
        else:
            hint = (
                "check security.protocol, sasl.mechanisms, sasl.username and sasl.password "
                "(--kafka-option KEY=VALUE or env RMQ_KAFKA_SASL_PASSWORD)"
            )
        raise AuthenticationError(
            f"Kafka authentication failed at {where}: {err.str()}; {hint}", err
        )


def _admin(conf: dict) -> tuple[AdminClient, _AuthWatch]:
    watch = _AuthWatch(conf.get("error_cb"))
    # librdkafka's admin client is a producer underneath, for which this defaults to true: a
    # metadata request naming a missing topic would create it on a broker that auto-creates
    # (Kafka's default), with one partition and the broker's defaults.
    admin_conf: dict[str, Any] = {
        **shared_conf(conf),
        "error_cb": watch,
        "allow.auto.create.topics": False,
    }
    return AdminClient(admin_conf), watch


def _metadata(
    admin: AdminClient,
    watch: _AuthWatch,
    conf: dict,
    what: str,
    topic: str | None = None,
    timeout_s: float = ADMIN_TIMEOUT_S,
) -> ClusterMetadata:
    """``list_topics`` in short slices; raises AuthenticationError as soon as the broker
    refuses the credentials, BrokerUnavailableError when nothing answered by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        slice_s = max(0.05, min(METADATA_SLICE_S, deadline - time.monotonic()))
        try:
            return admin.list_topics(topic=topic, timeout=slice_s)
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb
            watch.raise_if_failed(conf)
            if time.monotonic() >= deadline:
                err = exc.args[0]
                if err.code() in _NO_BROKER_CODES:
                    raise BrokerUnavailableError(
                        f"{what}: no broker answered at {conf.get('bootstrap.servers')!r} "
                        f"within {timeout_s:.0f} s ({err.str()}); check bootstrap.servers",
                        err,
                    ) from exc
                raise KafkaOperationError.wrap(what, err) from exc


def list_topics(conf: dict, timeout_s: float = ADMIN_TIMEOUT_S) -> ClusterMetadata:
    """Cluster metadata via a short-lived AdminClient built from ``conf``'s bootstrap and
    security settings. Wrong credentials raise :class:`AuthenticationError` within about a
    second; no answer within ``timeout_s`` raises :class:`BrokerUnavailableError`."""
    admin, watch = _admin(conf)
    return _metadata(admin, watch, conf, "listing topics", timeout_s=timeout_s)


def replication_for(brokers: int, factor: int | None = None) -> tuple[int, int]:
    """Replication factor and min ISR of a system topic on ``brokers`` brokers: ``factor``
    copies (default three, or as many as there are brokers), of which two must take a write
    (one when there is a single copy)."""
    copies = factor if factor is not None else min(3, brokers)
    return copies, min(2, copies)


def ensure_topics(
    conf: dict,
    specs: dict[str, tuple[int, dict[str, str]]],
    *,
    replicated: bool = False,
    replication_factor: int | None = None,
) -> None:
    """Create the topics in ``specs`` (name -> (partitions, configs)) that do not exist, and
    return once the broker's metadata shows every one of them with all its partitions.

    Without ``replicated`` the broker's defaults apply (a user's topic). With it (the system
    topics) they get :func:`replication_for` the cluster's broker count and
    ``replication_factor``, and ``min.insync.replicas`` unless their configs set it."""
    admin, watch = _admin(conf)
    meta = _metadata(admin, watch, conf, "listing topics")
    factor, min_isr = -1, None
    if replicated:
        factor, min_isr = replication_for(len(meta.brokers), replication_factor)
    missing = [
        NewTopic(
            name,
            num_partitions=parts,
            replication_factor=factor,
            config={**({"min.insync.replicas": str(min_isr)} if min_isr else {}), **configs},
        )
        for name, (parts, configs) in specs.items()
        if name not in meta.topics
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, request_timeout=ADMIN_TIMEOUT_S).items():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
            log.info(
                "created topic %s (replication factor %s)",
                name,
                factor if replicated else "broker default",
            )
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaOperationError.wrap(f"creating topic {name}", err) from exc
            _require_describable(admin, name)
    created = {t.topic: specs[t.topic][0] for t in missing}
    _await_visible(admin, watch, conf, created)
    # Each KRaft broker applies a new topic on its own: until all have, a client asking
    # another broker (the next process's first metadata request) is told it does not exist.
    for node in meta.brokers.values() if len(meta.brokers) > 1 else ():
        one_broker = {**conf, "bootstrap.servers": f"{node.host}:{node.port}"}
        _await_visible(*_admin(one_broker), one_broker, created, fresh_client=True)


def _require_describable(admin: AdminClient, topic: str) -> None:
    """A topic that exists though this principal's metadata did not show it: raise at once
    if the principal may not describe it (ACLs), rather than wait for it to appear."""
    try:
        admin.describe_topics(TopicCollection([topic]), request_timeout=ADMIN_TIMEOUT_S)[
            topic
        ].result(ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        err = exc.args[0]
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise KafkaOperationError.wrap(
                f"topic {topic} exists, but this principal may not describe it (check its "
                "ACLs: a producer group reads only its own check topic)",
                err,
            ) from exc


def _await_visible(
    admin: AdminClient,
    watch: _AuthWatch,
    conf: dict,
    topics: dict[str, int],
    fresh_client: bool = False,
) -> None:
    """A created topic is in the controller's log before the broker's metadata cache has it
    (KRaft applies it asynchronously); wait until every partition has a leader.
    ``fresh_client``: ask through a new client each time, so the one broker ``conf``
    bootstraps from answers (a client that knows the cluster asks any broker)."""
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        if fresh_client:
            admin, watch = _admin(conf)
        meta = _metadata(admin, watch, conf, "reading metadata of new topics").topics
        waiting = [
            name
            for name, parts in topics.items()
            if name not in meta
            or meta[name].error is not None
            or len(meta[name].partitions) < parts
            or any(p.leader < 0 for p in meta[name].partitions.values())
        ]
        if not waiting:
            return
        if time.monotonic() >= deadline:
            raise KafkaOperationError(
                f"topics {sorted(waiting)} were created but have no "
                f"leader after {ADMIN_TIMEOUT_S:.0f} s"
            )
        time.sleep(METADATA_POLL_S)


def require_copartitioned(conf: dict, first: str, second: str) -> int:
    """Both topics' partition count, which must be the same (partition p of one pairs with
    partition p of the other); else one ConfigError naming both counts."""
    meta = list_topics(conf).topics
    counts = [len(meta[t].partitions) if t in meta else 0 for t in (first, second)]
    if counts[0] != counts[1] or not counts[0]:
        raise ConfigError(
            f"{first} has {counts[0]} partitions and {second} has {counts[1]}; they must have "
            f"the same count (partition p of one pairs with partition p of the other): add "
            f"partitions to the smaller one (kafka-topics --alter --partitions "
            f"{max(counts)}) before starting"
        )
    return counts[0]


def admin_client(conf: dict) -> AdminClient:
    """An admin client of ``conf`` that never creates a topic by asking for it."""
    return _admin(conf)[0]


def offset_for_time(admin: AdminClient, topic: str, partition: int, ts_ms: int) -> int:
    """The first offset of ``topic[partition]`` whose record timestamp is at or after
    ``ts_ms`` (Kafka's ListOffsets by time; its log end if none is)."""
    tp = TopicPartition(topic, partition)
    try:
        futures = admin.list_offsets(
            {tp: OffsetSpec.for_timestamp(ts_ms)}, request_timeout=ADMIN_TIMEOUT_S
        )
        offset = futures[tp].result(timeout=ADMIN_TIMEOUT_S).offset
        if offset < 0:  # nothing written at or after it
            futures = admin.list_offsets({tp: OffsetSpec.latest()}, request_timeout=ADMIN_TIMEOUT_S)
            offset = futures[tp].result(timeout=ADMIN_TIMEOUT_S).offset
    except KafkaException as exc:
        raise KafkaOperationError.wrap(
            f"looking up {topic}[{partition}] by time", exc.args[0]
        ) from exc
    except TimeoutError as exc:
        raise KafkaOperationError(f"looking up {topic}[{partition}] by time: timed out") from exc
    return int(offset)


def topic_partition_count(conf: dict, topic: str) -> int | None:
    """Number of partitions of ``topic``, or None when it does not exist."""
    admin, watch = _admin(conf)
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        meta = _metadata(
            admin, watch, conf, f"reading metadata of {topic}", topic=topic
        ).topics.get(topic)
        if meta is None or (
            meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            return None
        if meta.error is None or meta.partitions:
            return len(meta.partitions)
        # e.g. LEADER_NOT_AVAILABLE: the topic exists, its partitions are being set up.
        if not retriable_kafka_error(meta.error) or time.monotonic() >= deadline:
            return None
        time.sleep(METADATA_POLL_S)
