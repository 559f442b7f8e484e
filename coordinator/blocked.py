"""Why promotion is blocked: a Kafka transaction that aborted because its records timed out.

librdkafka reports a record the broker would not take in time as ``_MSG_TIMED_OUT`` whatever
the cause (fewer in-sync replicas than ``min.insync.replicas``, no leader, a slow broker), so
the cause is read from the cluster: each such partition's in-sync replicas and leader from
the metadata, its topic's ``min.insync.replicas`` from its config. The coordinator shows it
as ``rmq_promotion_blocked{reason}`` until a transaction commits again, and replays meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

__all__ = ["REASONS", "TIMED_OUT", "BlockProbe", "Blockage", "blocked_reason"]

log = logging.getLogger(__name__)

NOT_ENOUGH_REPLICAS = "not_enough_replicas"
NO_LEADER = "no_leader"
TIMED_OUT_REASON = "timed_out"
REASONS = (NOT_ENOUGH_REPLICAS, NO_LEADER, TIMED_OUT_REASON)
#: Delivery errors that mean "not taken in time" rather than "refused". A fence is one too:
#: when the records wait past transaction.timeout.ms the broker may abort the transaction
#: (bumping the epoch) before librdkafka times them out, and they fail as fenced.
TIMED_OUT = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)
PROBE_TIMEOUT_S = 10.0


def blocked_reason(in_sync: int, min_isr: int | None, leader: int) -> str:
    """The reason one partition did not take a record in time."""
    if leader < 0:
        return NO_LEADER
    if min_isr is not None and in_sync < min_isr:
        return NOT_ENOUGH_REPLICAS
    return TIMED_OUT_REASON


class BlockProbe:
    """Reads the cause of timed-out partitions from the cluster (``admin()`` is the
    coordinator's admin client); any failure to read it answers ``timed_out``."""

    def __init__(self, admin: Callable[[], AdminClient]) -> None:
        self.admin = admin

    def reason(self, partitions: Iterable[tuple[str, int | None]]) -> str:
        partitions = set(partitions)
        topics = {t for t, _ in partitions}
        try:
            metadata = self.admin().list_topics(timeout=PROBE_TIMEOUT_S).topics
            futures = self.admin().describe_configs(
                [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics],
                request_timeout=PROBE_TIMEOUT_S,
            )
            min_isr = {
                res.name: int(f.result(PROBE_TIMEOUT_S)["min.insync.replicas"].value)
                for res, f in futures.items()
            }
        except (KafkaException, KeyError, ValueError) as exc:
            log.debug("reading why promotion is blocked failed: %r", exc)
            return TIMED_OUT_REASON
        reasons = set()
        for topic, partition in partitions:
            meta = metadata.get(topic)
            # No partition: a record placed by its key, so any partition of the topic.
            parts = (
                []
                if meta is None
                else list(meta.partitions.values())
                if partition is None
                else [meta.partitions.get(partition)]
            )
            if not parts or None in parts:
                reasons.add(TIMED_OUT_REASON)
                continue
            reasons.update(blocked_reason(len(p.isrs), min_isr.get(topic), p.leader) for p in parts)
        # The most specific cause wins: it is the one an operator can act on.
        return next((r for r in REASONS if r in reasons), TIMED_OUT_REASON)


class Blockage:
    """Whether promotion is blocked now, shown in ``gauge`` (labelled by reason, every reason
    present: 1 for the current one) and in one log line when it starts and when it ends."""

    def __init__(self, probe: BlockProbe, gauge) -> None:
        self.probe = probe
        self.gauge = gauge
        self.reason: str | None = None
        self._since = 0.0
        self._set(None)

    def aborted(self, partitions: set[tuple[str, int | None]]) -> None:
        """A transaction aborted; ``partitions`` did not take its records in time (a None
        partition: some partition of that topic)."""
        if not partitions:
            return
        reason = self.probe.reason(partitions)
        if reason != self.reason:
            log.warning(
                "promotion blocked (%s) on %s; replaying until it clears",
                reason,
                ", ".join(sorted(f"{t}[{'*' if p is None else p}]" for t, p in partitions)),
            )
            if self.reason is None:
                self._since = time.monotonic()
        self._set(reason)

    def committed(self) -> None:
        if self.reason is not None:
            log.info(
                "promotion resumed after %.0f s blocked (%s)",
                time.monotonic() - self._since,
                self.reason,
            )
            self._set(None)

    def _set(self, reason: str | None) -> None:
        self.reason = reason
        for r in REASONS:
            self.gauge.labels(r).set(1 if r == reason else 0)
