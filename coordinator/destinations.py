"""Where promotions go: the real topics and partitions the cluster has, read from its
metadata and cached, and the vetting of each batch against them and against the poison
ledger, before anything is produced.

A promotion to a missing topic would wait ``transaction.timeout.ms`` for the topic and
then get the producer fenced, so it is discarded as ``unknown_topic`` before it is tried,
whatever order its end request was read in (deferred, replayed or not).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient

from coordinator.poison import PoisonLedger
from coordinator.state import Action, Finish, IssueCheck, PartitionState, TxnState
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.topics import ADMIN_TIMEOUT_S

__all__ = ["Destinations"]

log = logging.getLogger(__name__)

# Metadata is read again at most this often, when a promotion names what the cache lacks;
# sooner (not more than every MIN_REFRESH_S) when the cache is older than the half record:
# a topic created just before the transaction is then never taken for a missing one.
REFRESH_INTERVAL_S = 1.0
MIN_REFRESH_S = 0.1
LIST_TIMEOUT_S = 10.0
_MAY_WRITE = {AclOperation.WRITE, AclOperation.ALL}
_REFUSED = {KafkaError.TOPIC_AUTHORIZATION_FAILED: DiscardReason.UNAUTHORIZED,
            KafkaError.UNKNOWN_TOPIC_OR_PART: DiscardReason.UNKNOWN_TOPIC}


class Destinations:
    """The real topics' partition counts, cached; ``admin()`` gives the admin client."""

    def __init__(self, admin: Callable[[], AdminClient], ledger: PoisonLedger) -> None:
        self.admin = admin
        self.ledger = ledger
        self._partitions: dict[str, int] = {}
        self._read_at = 0.0
        self._read_at_ms = 0  # wall clock, to compare with record timestamps

    def _refresh(self, newer_than_ms: int = 0) -> None:
        age = time.monotonic() - self._read_at
        if age < MIN_REFRESH_S or (age < REFRESH_INTERVAL_S
                                   and self._read_at_ms >= newer_than_ms):
            return
        self._read_at = time.monotonic()
        self._read_at_ms = int(time.time() * 1000)
        try:
            metadata = self.admin().list_topics(timeout=LIST_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("listing topics failed: %s", exc.args[0].str())
            return
        self._partitions = {name: len(t.partitions) for name, t in metadata.topics.items()
                            if t.error is None}

    def partition_count(self, topic: str, partition: int | None = None,
                        newer_than_ms: int = 0) -> int | None:
        """Partitions of ``topic`` (None: it does not exist), read again when the cache
        lacks the topic or ``partition``, or is older than ``newer_than_ms``."""
        count = self._partitions.get(topic)
        if count is None or (partition is not None and partition >= count):
            self._refresh(newer_than_ms)
            count = self._partitions.get(topic)
        return count

    def refusal(self, action: Action) -> tuple[DiscardReason, str] | None:
        """Why ``action`` must not be written (its record is discarded instead), or None."""
        if isinstance(action, Finish) and action.outcome is TxnState.COMMITTED:
            half = action.half
        elif isinstance(action, IssueCheck):
            half = action.half  # a check request over the check topic's size
        else:
            return None
        blame = self.ledger.discarding((half.partition, half.offset))
        if blame is not None and blame.reason is not None:
            return blame.reason, blame.detail
        if isinstance(action, IssueCheck):
            return None
        # One member with nowhere to go sets the whole transaction aside: never in part.
        for member in action.records:  # type: ignore[union-attr]  # a Finish
            count = self.partition_count(member.real_topic, member.real_partition,
                                         member.timestamp_ms)
            prefix = f"member {member.txn_index}: " if member.is_member else ""
            if count is None:
                return (DiscardReason.UNKNOWN_TOPIC,
                        f"{prefix}topic {member.real_topic!r} does not exist")
            if member.real_partition is not None and member.real_partition >= count:
                return (DiscardReason.UNKNOWN_PARTITION,
                        f"{prefix}partition {member.real_partition} of {member.real_topic!r}, "
                        f"which has {count}")
        return None

    def vet(self, actions: list[Action], states: dict[int, PartitionState]) -> list[Action]:
        """``actions`` with each promotion or check that must not be written replaced by
        the discard of its half record."""
        out: list[Action] = []
        for action in actions:
            refused = self.refusal(action)
            if refused is None:
                out.append(action)
                continue
            half = action.half  # type: ignore[union-attr]  # refusal() saw a half
            state = states.get(half.partition)
            out.append(action if state is None else
                       state.set_aside(action, *refused))  # type: ignore[arg-type]
        return out

    def unwritable(self, topics: set[str]) -> dict[str, DiscardReason]:
        """Which of ``topics`` the broker will not let this coordinator write, and why
        (KIP-430's authorized operations): what an abort naming no record was about."""
        if not topics:
            return {}
        try:
            futures = self.admin().describe_topics(TopicCollection(sorted(topics)),
                                                   include_authorized_operations=True,
                                                   request_timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("describing topics %s failed: %s", sorted(topics), exc.args[0].str())
            return {}
        out: dict[str, DiscardReason] = {}
        for topic, future in futures.items():
            try:
                allowed = future.result(ADMIN_TIMEOUT_S).authorized_operations
            except KafkaException as exc:
                reason = _REFUSED.get(exc.args[0].code())
                if reason is not None:
                    out[topic] = reason
                continue
            except Exception as exc:  # a timeout: this abort stays unexplained, replayed
                log.warning("describing topic %s failed: %r", topic, exc)
                continue
            if allowed is not None and not _MAY_WRITE & set(allowed):
                out[topic] = DiscardReason.UNAUTHORIZED
        return out
