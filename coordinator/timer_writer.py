"""The timer service's one Kafka transaction per step: deliveries to real topics,
re-appends to level topics, discards, and the offsets of every lane, all or nothing.

A delivery keeps the user's key, value and headers, its placement (its real partition, or
by key with Java's partitioner, as promotion does) and its birth time as the record
timestamp, and adds ``rmq.timer_id``, ``rmq.delivered_at`` and ``rmq.promoted_from``
(``TimerRecord.delivered_headers``). A failure that is a record's fault (its topic is gone,
it is too large, we may not write there) is blamed on it in the poison ledger; the replay
then sets it aside in the discard topic instead (``coordinator/poison.py``), so no record
blocks its partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

import confluent_kafka
from confluent_kafka import KafkaError, TopicPartition

from coordinator.kafka_txn import CommitThread, KafkaTransactions
from coordinator.metrics import CoordinatorMetrics
from coordinator.poison import FailureKind, PoisonLedger, classify, on_system_topic
from coordinator.timer_wheel import INTAKE, Action, Step
from rmq_semantics.errors import TransactionAborted
from rmq_semantics.message import produce_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.timer import TimerRecord
from rmq_semantics.topics import SystemTopics

__all__ = ["TimerWriter", "lane_key", "timer_discard_headers"]

log = logging.getLogger(__name__)

# A discard copy that failed once is written again as a stub: its rmq.* headers, this long.
STUB_HEADER_BYTES = 1024
# Lanes of one partition in the poison ledger's (partition, offset) keys: 64 > any level.
_LANES = 64


def lane_key(partition: int, lane: int, offset: int) -> tuple[int, int]:
    """The poison ledger's key of the record at ``offset`` of ``lane`` in ``partition``."""
    return partition * _LANES + lane, offset


def _now_ms() -> int:
    return int(time.time() * 1000)


def timer_discard_headers(
    record: TimerRecord, topic: str, reason: str, discarded_ts: int
) -> list[tuple[str, bytes | None]]:
    """The headers of a timer record's copy in the discard topic: as read, plus where it
    was read (``rmq.original_*``), the reason and when."""
    return [
        *record.headers,
        (H.ORIGINAL_TOPIC, topic.encode()),
        (H.ORIGINAL_PARTITION, str(record.partition).encode()),
        (H.ORIGINAL_OFFSET, str(record.offset).encode()),
        (H.DISCARD_REASON, reason.encode()),
        (H.DISCARDED_TS, str(discarded_ts).encode()),
    ]


class TimerWriter:
    """Writes one step's actions and offsets through a :class:`KafkaTransactions`."""

    def __init__(
        self,
        txn: KafkaTransactions,
        topics: SystemTopics,
        lane_topic: Callable[[int], str],
        metrics: CoordinatorMetrics,
        ledger: PoisonLedger,
        *,
        resign: Callable[[TimerRecord, list], list] | None = None,
    ) -> None:
        self.txn = txn
        # Under tenant isolation: a re-append is signed for its group (TenantGuard).
        self.resign = resign
        self.topics = topics
        self.lane_topic = lane_topic
        self.metrics = metrics
        self.ledger = ledger
        self._failed: list[tuple[Action, KafkaError]] = []
        # (timer id, group) of a delivered record -> where its delivery landed (topic,
        # partition, offset), for the last write (read by the service once it returned).
        self.landed: dict[tuple[str, str], tuple[str, int, int]] = {}
        # The commit runs on its own thread: librdkafka's send_offsets_to_transaction can
        # wait for ever for a group coordinator that left (#5456, #5511; seen here after a
        # broker restart), and a wedged call is abandoned for a new producer instead.
        self._committer = CommitThread(name="rmq-timer-commit")

    def write(
        self, actions: Sequence[Action], offsets: list[TopicPartition], group_metadata: object
    ) -> None:
        """Produce ``actions`` and commit ``offsets`` in one transaction; TransactionAborted
        (replay from the committed offsets) or FatalKafkaError otherwise."""
        self._failed = []
        self.landed = {}
        now = _now_ms()
        txn = self.txn
        try:
            with txn.body() as producer:
                for action in actions:
                    self._guarded(producer, action, now)
            commit = self._committer.submit(txn.finish, offsets, group_metadata)
            if not self._committer.wait(commit, txn):
                self._abandon(txn)
                raise TransactionAborted(
                    f"a commit stuck for {txn.stuck_for():.0f} s was abandoned; "
                    "the transactional producer was re-created"
                )
            commit.result()
        except TransactionAborted:
            self.metrics.aborted.inc()
            for action, err in self._failed:
                self._blame(action, err)
            raise
        self._count(actions, _now_ms())  # lateness: due -> committed (visible)

    def _abandon(self, txn: KafkaTransactions) -> None:
        """Swap ``txn`` (stuck in a call) for its successor, whose init (before the replay
        reads the committed offsets) fences it, and the commit thread for a new one."""
        self.txn = txn.abandon()
        self._committer.close(timeout=0)
        self._committer = CommitThread(name="rmq-timer-commit")

    def close(self) -> None:
        """Idempotent: the commit thread (idle: every write waits for its commit) and the
        producer."""
        self._committer.close(timeout=0)
        self.txn.close()

    # -- one action --------------------------------------------------------------------------
    def _guarded(self, producer: confluent_kafka.Producer, action: Action, now: int) -> None:
        try:
            self._produce(producer, action, now)
        except (BufferError, TransactionAborted):
            raise  # the transaction is replayed; no record's fault
        except Exception as exc:
            verdict = classify(exc)
            if verdict.kind is FailureKind.FATAL:
                raise
            self._blame(action, exc)
            raise TransactionAborted(f"{self._where(action)}: {verdict.detail}") from exc

    def _produce(self, producer: confluent_kafka.Producer, action: Action, now: int) -> None:
        record = action.payload
        if not isinstance(record, TimerRecord):
            return
        report = partial(self._on_delivery, action)
        if action.step is Step.DELIVER:
            # CreateTime = the producer's birth time, as a promoted record's; no partition:
            # by key with the Java partitioner (KafkaTransactions' murmur2_random).
            producer.produce(
                record.real_topic,
                record.value,
                key=record.key,
                headers=produce_headers(record.delivered_headers(now)),
                timestamp=record.born_ts,
                on_delivery=report,
                partition=-1 if record.real_partition is None else record.real_partition,
            )
        elif action.step is Step.REAPPEND:
            again = record.reappended_headers()
            if self.resign is not None:
                again = self.resign(record, again)
            producer.produce(
                self.topics.timer_level(action.level),
                record.value,
                key=record.key,
                partition=record.partition,
                headers=produce_headers(again),
                on_delivery=report,
            )
        elif action.step is Step.DISCARD:
            headers = timer_discard_headers(
                record, self.lane_topic(action.lane), action.reason, now
            )
            value, key = record.value, record.key
            if self.ledger.discarding(lane_key(record.partition, action.lane, action.offset)):
                # Its full copy failed (too large): a stub naming it, so it blocks nothing.
                value, key = None, None
                headers = [
                    (k, v[:STUB_HEADER_BYTES] if v else v)
                    for k, v in headers
                    if k.startswith("rmq.")
                ]
            producer.produce(
                self.topics.discard,
                value,
                key=key,
                headers=produce_headers(headers),
                on_delivery=report,
            )

    def _on_delivery(
        self, action: Action, err: KafkaError | None, msg: confluent_kafka.Message | None
    ) -> None:
        # Served during the commit: failed records, and where each delivery landed.
        if err is not None:
            self._failed.append((action, err))
        elif action.step is Step.DELIVER and msg is not None:
            record, topic = action.payload, msg.topic()
            partition, offset = msg.partition(), msg.offset()
            if (
                isinstance(record, TimerRecord)
                and topic
                and partition is not None
                and offset is not None
            ):
                self.landed[(record.timer_id, record.producer_group or "")] = (
                    topic,
                    partition,
                    offset,
                )

    def _blame(self, action: Action, failure: BaseException | KafkaError) -> None:
        verdict = classify(failure)
        if action.step is not Step.DELIVER:
            verdict = on_system_topic(verdict)  # our own topics: the cluster's fault
        record = action.payload
        if not isinstance(record, TimerRecord):
            return
        blame = self.ledger.blame(lane_key(record.partition, action.lane, action.offset), verdict)
        if blame is None:
            return
        outcome = (
            f"it will be set aside ({blame.reason})"
            if blame.reason is not None
            else f"replay {blame.replays} of at most {self.ledger.replay_max}"
        )
        log.warning("%s: %s; %s", self._where(action), verdict.detail, outcome)

    def _where(self, action: Action) -> str:
        record = action.payload
        partition = record.partition if isinstance(record, TimerRecord) else "?"
        timer_id = record.timer_id if isinstance(record, TimerRecord) else "?"
        return f"{self.lane_topic(action.lane)}[{partition}]@{action.offset} id={timer_id}"

    # -- metrics -----------------------------------------------------------------------------
    def _count(self, actions: Sequence[Action], now: int) -> None:
        m = self.metrics
        for action in actions:
            record = action.payload
            if action.step is Step.DELIVER and isinstance(record, TimerRecord):
                m.timer_delivered.inc()
                m.timer_lateness.observe(max(0, now - record.deliver_at_ms) / 1000)
            elif action.step is Step.REAPPEND:
                m.timer_reappended.inc()
            elif action.step is Step.DROP:
                m.timer_cancelled.inc()
            elif action.step is Step.SKIP:
                m.timer_skipped.inc()
            elif action.step is Step.DISCARD:
                m.timer_discarded.labels(action.reason).inc()
            if action.lane == INTAKE and action.step not in (Step.DISCARD, Step.SKIP):
                m.timer_scheduled.inc()
            if isinstance(record, TimerRecord):
                self.ledger.settle([lane_key(record.partition, action.lane, action.offset)])
