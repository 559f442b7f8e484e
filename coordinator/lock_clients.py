"""The lock service's Kafka side: the group its instances form, its three topics, and the
clients each instance opens (see :mod:`coordinator.lock_service`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import confluent_kafka

from coordinator.kafka_txn import KafkaTransactions
from coordinator.settings import CoordinatorSettings
from rmq_semantics.clientconf import client_conf
from rmq_semantics.topics import SystemTopics

__all__ = [
    "SESSION_TIMEOUT_MS",
    "LockClients",
    "lock_coordinator_group",
    "lock_topic_specs",
    "open_clients",
]

# A dead service instance's partitions move to the others within this; well under a lease.
SESSION_TIMEOUT_MS = 10000
# Requests and replies are only useful for seconds; an hour leaves room for debugging.
SHORT_RETENTION_MS = 3600 * 1000


def lock_coordinator_group(prefix: str) -> str:
    """The consumer group the lock-service instances form."""
    return f"{prefix}_lock_coordinator"


def lock_topic_specs(settings: CoordinatorSettings) -> dict[str, tuple[int, dict[str, str]]]:
    """Request, state and reply topics: ``half_partitions`` partitions each."""
    topics = SystemTopics(settings.topic_prefix)
    n = settings.half_partitions
    short = {"cleanup.policy": "delete", "retention.ms": str(SHORT_RETENTION_MS)}
    return {
        # The broker stamps each request as it arrives, so its age needs no client clock.
        topics.lock_request: (n, {**short, "message.timestamp.type": "LogAppendTime"}),
        # Never deleted by time: a released lock's epoch must survive (epochs only grow).
        topics.lock: (n, {"cleanup.policy": "compact"}),
        topics.lock_reply: (n, short),
    }


@dataclass(frozen=True)
class LockClients:
    """The request consumer (in the group), the transactional producer and the lock
    topic's reader (assign only)."""

    consumer: confluent_kafka.Consumer
    txn: KafkaTransactions
    reader: confluent_kafka.Consumer


def open_clients(
    conf: dict, group: str, transactional_id: str, stop: threading.Event
) -> LockClients:
    """The service's transactional producer, its request consumer (in the group) and the
    reader of the lock topic (assign only)."""
    txn = KafkaTransactions(conf, transactional_id, who="lock service")
    txn.init(stop)
    consumer = confluent_kafka.Consumer(
        client_conf(
            conf,
            who="lock service",
            forced={
                "group.id": group,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "group.protocol": "classic",  # whatever --kafka-option says: range needs it
                "partition.assignment.strategy": "range",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "fetch.wait.max.ms": 20,
            },
        )
    )
    reader = confluent_kafka.Consumer(
        client_conf(
            conf,
            who="lock service",
            forced={
                "group.id": f"{group}-reader",  # never joined nor committed: assign() only
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 10,  # the end of a partition is an empty fetch: answer fast
            },
        )
    )
    return LockClients(consumer, txn, reader)
