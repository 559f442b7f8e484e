"""System-topic names, their configs, and creation on first use."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from rmq_semantics.errors import ConfigError, KafkaOperationError, SystemTopicError

__all__ = [
    "DEFAULT_TOPIC_PREFIX",
    "SystemTopics",
    "ensure_topics",
    "is_system_topic",
]

log = logging.getLogger(__name__)

DEFAULT_TOPIC_PREFIX = "__rmq"
# Bounds every admin round trip; topic creation on a cold single-node broker takes ~1 s.
ADMIN_TIMEOUT_S = 30.0
WEEK_MS = 7 * 24 * 3600 * 1000


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
        return f"{self.prefix}_half"

    @property
    def op(self) -> str:
        return f"{self.prefix}_op"

    @property
    def check(self) -> str:
        return f"{self.prefix}_check"

    @property
    def discard(self) -> str:
        return f"{self.prefix}_discard"

    @property
    def lock(self) -> str:
        return f"{self.prefix}_lock"

    @property
    def lock_request(self) -> str:
        return f"{self.prefix}_lock_request"

    @property
    def lock_reply(self) -> str:
        return f"{self.prefix}_lock_reply"

    def dlq(self, group: str) -> str:
        return f"{self.prefix}_dlq_{group}"

    @property
    def coordinator_group(self) -> str:
        return f"{self.prefix}_coordinator"

    def check_group(self, producer_group: str) -> str:
        return f"{self.prefix}_check_{producer_group}"


def is_system_topic(topic: str, prefix: str = DEFAULT_TOPIC_PREFIX) -> bool:
    """True for the product's own topics under ``prefix`` and under the default prefix."""
    return topic.startswith(f"{prefix}_") or topic.startswith(f"{DEFAULT_TOPIC_PREFIX}_")


def refuse_system_topics(topics: list[str], prefix: str) -> None:
    """Raise for an explicit subscription to a system topic (patterns are filtered later)."""
    for topic in topics:
        if not topic.startswith("^") and is_system_topic(topic, prefix):
            raise SystemTopicError(
                f"{topic!r} is a system topic of rmq_semantics; business consumers read "
                "only promoted topics"
            )


def admin_conf(conf: dict) -> dict:
    """The subset of a client conf an AdminClient accepts (bootstrap + security)."""
    keep = ("bootstrap.servers", "security.protocol", "client.id")
    out = {k: v for k, v in conf.items() if k in keep or k.startswith(("sasl.", "ssl."))}
    # librdkafka's own log lines go to Python logging, not straight to stderr.
    out["logger"] = logging.getLogger("rmq_semantics.librdkafka")
    return out


def ensure_topics(conf: dict, specs: dict[str, tuple[int, dict[str, str]]]) -> None:
    """Create the topics in ``specs`` (name -> (partitions, configs)) that do not exist."""
    admin = AdminClient(admin_conf(conf))
    try:
        existing = admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
    except KafkaException as exc:
        raise KafkaOperationError.wrap("listing topics", exc.args[0]) from exc
    missing = [
        NewTopic(name, num_partitions=parts, replication_factor=-1, config=configs)
        for name, (parts, configs) in specs.items()
        if name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, request_timeout=ADMIN_TIMEOUT_S).items():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
            log.info("created topic %s", name)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaOperationError.wrap(f"creating topic {name}", err) from exc


def topic_partition_count(conf: dict, topic: str) -> int | None:
    """Number of partitions of ``topic``, or None when it does not exist."""
    admin = AdminClient(admin_conf(conf))
    try:
        meta = admin.list_topics(topic=topic, timeout=ADMIN_TIMEOUT_S).topics.get(topic)
    except KafkaException as exc:
        raise KafkaOperationError.wrap(f"reading metadata of {topic}", exc.args[0]) from exc
    if meta is None or meta.error is not None:
        return None
    return len(meta.partitions)
