"""Where promotions go: the real topics and partitions the cluster has, read from its
metadata and cached, and the vetting of each batch against them and against the poison
ledger, before anything is produced.

A promotion to a missing topic would wait ``transaction.timeout.ms`` for the topic and
then get the producer fenced, so it is discarded as ``unknown_topic`` before it is tried,
whatever order its end request was read in (deferred, replayed or not). Only a successful
metadata read taken after the batch was decided, lacking the topic or the partition, may
discard: a failed read or a topic-level error there is retried (the batch replayed, no
record blamed), and a cached "no such topic" is read again first. Nor is one such read proof:
a broker catching up with the controller (after a pause, a partition) answers without a
topic created a moment ago (fault campaign, seed 2), so the batch is replayed until reads
lacking it span :data:`MISSING_GRACE_S`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient

from coordinator.poison import PoisonLedger
from coordinator.state import Action, Finish, IssueCheck, PartitionState, TxnState
from rmq_semantics.errors import KafkaOperationError
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.topics import ADMIN_TIMEOUT_S

__all__ = ["Destinations"]

log = logging.getLogger(__name__)

# Reads of the cluster's metadata are at least this far apart (a stream of COMMITs into a
# missing topic costs at most this many reads a second): the next one waits, never skips.
MIN_REFRESH_S = 0.1
# A topic (or partition) is missing only once reads lacking it span this long: longer than
# a broker takes to catch up with the controller's metadata once it can reach it again.
MISSING_GRACE_S = 15.0
LIST_TIMEOUT_S = 10.0
_MAY_WRITE = {AclOperation.WRITE, AclOperation.ALL}
_REFUSED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: DiscardReason.UNAUTHORIZED,
    KafkaError.UNKNOWN_TOPIC_OR_PART: DiscardReason.UNKNOWN_TOPIC,
}


class _NotListedYet(KafkaOperationError):
    """A topic or partition the metadata lacks, within the grace: the batch is replayed."""


class Destinations:
    """The real topics' partition counts, cached; ``admin()`` gives the admin client."""

    def __init__(self, admin: Callable[[], AdminClient], ledger: PoisonLedger) -> None:
        self.admin = admin
        self.ledger = ledger
        self._partitions: dict[str, int] = {}
        self._unsettled: dict[str, KafkaError] = {}  # topics the last read had an error for
        self._stale: set[str] = set()  # a write found them missing: read before trusting
        self._read_at: float | None = None  # monotonic start of the last successful read
        self._tried_at = float("-inf")
        self._missing_since: dict[tuple[str, int | None], float] = {}  # first read lacking

    def stale(self, topic: str) -> None:
        """A write into ``topic`` was refused as unknown: its cached count is not trusted
        until a read after now."""
        self._stale.add(topic)

    def _refresh(self) -> None:
        """Read every topic's partitions now; KafkaOperationError (retriable: the caller's
        batch is replayed) if the read fails."""
        wait = MIN_REFRESH_S - (time.monotonic() - self._tried_at)
        if wait > 0:
            time.sleep(wait)
        started = self._tried_at = time.monotonic()
        try:
            metadata = self.admin().list_topics(timeout=LIST_TIMEOUT_S)
        except KafkaException as exc:
            raise KafkaOperationError.wrap(
                "reading the cluster's metadata before promoting (the batch is replayed)",
                exc.args[0],
            ) from exc
        partitions, unsettled = {}, {}
        for name, topic in metadata.topics.items():
            if topic.error is None:
                partitions[name] = len(topic.partitions)
            elif topic.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                unsettled[name] = topic.error
        self._partitions, self._unsettled, self._read_at = partitions, unsettled, started
        self._stale.clear()

    def partition_count(
        self, topic: str, partition: int | None = None, decided_at: float | None = None
    ) -> int | None:
        """Partitions of ``topic``, None if it does not exist: a cached count that has the
        topic and ``partition``, else a read taken after ``decided_at`` (monotonic; None:
        now). Raises KafkaOperationError when no such read can say (retry, blame no one)."""
        count = self._partitions.get(topic)
        lacking = count is None or (partition is not None and partition >= count)
        fresh = (
            self._read_at is not None
            and decided_at is not None
            and self._read_at >= decided_at
            and topic not in self._stale
        )
        if (lacking or topic in self._stale or topic in self._unsettled) and not fresh:
            self._refresh()
            count = self._partitions.get(topic)
        error = self._unsettled.get(topic)
        if error is not None:
            raise KafkaOperationError.wrap(
                f"the metadata of topic {topic!r} has an error (the batch is replayed)", error
            )
        key = (topic, partition)
        if count is not None and (partition is None or partition < count):
            self._missing_since.pop(key, None)
            return count
        assert self._read_at is not None  # a read just succeeded (or a fresh one did)
        since = self._missing_since.setdefault(key, self._read_at)
        if self._read_at - since < MISSING_GRACE_S:
            where = topic if partition is None else f"partition {partition} of {topic!r}"
            raise _NotListedYet(
                f"{where} is not in the cluster's metadata yet (a broker may "
                "lag the controller); the batch is replayed"
            )
        return count

    def refusal(
        self, action: Action, decided_at: float | None = None
    ) -> tuple[DiscardReason, str] | None:
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
            count = self.partition_count(member.real_topic, member.real_partition, decided_at)
            prefix = f"member {member.txn_index}: " if member.is_member else ""
            if count is None:
                return (
                    DiscardReason.UNKNOWN_TOPIC,
                    f"{prefix}topic {member.real_topic!r} does not exist",
                )
            if member.real_partition is not None and member.real_partition >= count:
                return (
                    DiscardReason.UNKNOWN_PARTITION,
                    f"{prefix}partition {member.real_partition} of {member.real_topic!r}, "
                    f"which has {count}",
                )
        return None

    def vet(self, actions: list[Action], states: dict[int, PartitionState]) -> list[Action]:
        """``actions`` with each promotion or check that must not be written replaced by
        the discard of its half record."""
        out: list[Action] = []
        decided_at = time.monotonic()  # a metadata read taken from now on is fresh
        not_yet: _NotListedYet | None = None
        for action in actions:
            try:
                refused = self.refusal(action, decided_at)
            except _NotListedYet as exc:  # the others still start their grace now
                not_yet = not_yet or exc
                continue
            if refused is None:
                out.append(action)
                continue
            half = action.half  # type: ignore[union-attr]  # refusal() saw a half
            state = states.get(half.partition)
            out.append(action if state is None else state.set_aside(action, *refused))  # type: ignore[arg-type]
        if not_yet is not None:
            raise not_yet
        return out

    def unwritable(self, topics: set[str]) -> dict[str, DiscardReason]:
        """Which of ``topics`` the broker will not let this coordinator write, and why
        (KIP-430's authorized operations): what an abort naming no record was about."""
        if not topics:
            return {}
        try:
            futures = self.admin().describe_topics(
                TopicCollection(sorted(topics)),
                include_authorized_operations=True,
                request_timeout=ADMIN_TIMEOUT_S,
            )
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
