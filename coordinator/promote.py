"""The one Kafka transaction: promoted records, Op markers, check requests, discards and the
coordinator's consumer offsets, committed atomically (exactly-once promotion)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from confluent_kafka import TopicPartition

from coordinator.kafka_txn import KafkaTransactions
from coordinator.metrics import CoordinatorMetrics
from coordinator.state import Action, Discard, Finish, IssueCheck, SaveCheckCounts, TxnState
from rmq_semantics.errors import TransactionAborted
from rmq_semantics.records.codec import RecordType, encode
from rmq_semantics.records.headers import H
from rmq_semantics.topics import SystemTopics

__all__ = ["TransactionWriter"]

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionWriter:
    """Writes the coordinator's decisions through its :class:`KafkaTransactions`."""

    def __init__(self, conf: dict, topics: SystemTopics, transactional_id: str,
                 metrics: CoordinatorMetrics) -> None:
        self.topics = topics
        self.metrics = metrics
        self.txn = KafkaTransactions(conf, transactional_id, who="transaction service")
        self.producer = self.txn.producer
        self._done_entries: dict[int, list[dict]] = {}  # per half partition, this transaction

    def start(self, stop: threading.Event | None = None) -> None:
        """Initialise transactions (fences an older instance with the same id)."""
        self.txn.init(stop)

    def write(self, actions: Sequence[Action], offsets: list[TopicPartition],
              group_metadata: object) -> None:
        """Write ``actions`` and commit ``offsets`` in one transaction.

        Raises TransactionAborted when the transaction had to be aborted (the caller
        replays from committed offsets) and FatalKafkaError when it cannot go on.
        """
        self._done_entries = {}
        try:
            with self.txn.transaction(offsets, group_metadata):
                for action in actions:
                    self._produce(action)
                self._write_done_markers()
        except TransactionAborted:
            self.metrics.aborted.inc()
            raise
        self._count(actions)

    def _op(self, partition: int, record_type: RecordType, body: dict) -> None:
        self.producer.produce(self.topics.op, encode(record_type, body), partition=partition)

    def _done(self, half, outcome: TxnState, checks_answered: int) -> None:
        self._done_entries.setdefault(half.partition, []).append({
            "half_offset": half.offset, "txn_id": half.txn_id, "outcome": outcome.value,
            "checks_answered": checks_answered})

    def _write_done_markers(self) -> None:
        """One Op record per partition for all of this transaction's decisions: a record
        per decision cost as much again as the promotion itself (encode, produce, read
        back, decode)."""
        now = _now_ms()
        for partition, entries in self._done_entries.items():
            self._op(partition, RecordType.DONE_MARKERS, {"entries": entries, "ts": now})

    def _produce(self, action: Action) -> None:
        half = action.half
        if isinstance(action, Finish):
            if action.outcome is TxnState.COMMITTED:
                kwargs = {"key": half.key, "headers": half.promoted_headers()}
                if half.real_partition is not None:
                    kwargs["partition"] = half.real_partition
                self.producer.produce(half.real_topic, half.value, **kwargs)
            self._done(half, action.outcome, action.checks_answered)
        elif isinstance(action, IssueCheck):
            self.producer.produce(self.topics.check, encode(RecordType.CHECK_REQUEST, {
                "txn_id": half.txn_id, "producer_group": half.producer_group,
                "half_partition": half.partition, "half_offset": half.offset,
                "check_seq": action.check_seq, "born_ts": half.born_ts,
                "topic": half.real_topic, "partition": half.real_partition,
                "key": half.key, "value": half.value,
                "headers": [{"key": k, "value": v} for k, v in half.headers],
                "ts": _now_ms()}), key=half.producer_group.encode())
            self._marker(action)
        elif isinstance(action, SaveCheckCounts):
            self._marker(action)
        elif isinstance(action, Discard):
            headers = [*half.headers,
                       (H.HALF_PARTITION, str(half.partition).encode()),
                       (H.HALF_OFFSET, str(half.offset).encode()),
                       (H.CHECK_COUNT, str(action.checks_answered).encode()),
                       (H.DISCARD_REASON, action.reason.encode()),
                       (H.DISCARDED_TS, str(_now_ms()).encode())]
            self.producer.produce(self.topics.discard, half.value, key=half.key,
                                  headers=headers)
            self._done(half, TxnState.DISCARDED, action.checks_answered)

    def _marker(self, action: IssueCheck | SaveCheckCounts) -> None:
        self._op(action.half.partition, RecordType.CHECK_MARKER, {
            "half_offset": action.half.offset, "txn_id": action.half.txn_id,
            "checks_issued": action.checks_issued, "checks_answered": action.checks_answered,
            "answered_seq": action.answered_seq, "next_check_ts": action.next_check_ts,
            "ts": _now_ms()})

    def _count(self, actions: Sequence[Action]) -> None:
        now = time.time()
        debug = log.isEnabledFor(logging.DEBUG)
        promotions = 0
        for action in actions:
            half = action.half
            if isinstance(action, Finish) and action.outcome is TxnState.COMMITTED:
                # The hot path: no per-record string unless debug logging is on.
                promotions += 1
                self.metrics.promotion_latency.observe(max(0.0, now - half.born_ts / 1000))
                if debug:
                    log.debug("%s[%d]@%d txn=%s promoted to %s", self.topics.half,
                              half.partition, half.offset, half.txn_id, half.real_topic)
                continue
            where = f"{self.topics.half}[{half.partition}]@{half.offset} txn={half.txn_id}"
            if isinstance(action, Finish):
                self.metrics.rollbacks.inc()
                log.debug("%s rolled back", where)
            elif isinstance(action, IssueCheck):
                self.metrics.checks_issued.inc()
                log.info("%s check #%d sent to producer group %s", where, action.check_seq,
                         action.half.producer_group)
            elif isinstance(action, Discard):
                self.metrics.discarded.labels(
                    "retention" if "retention" in action.reason else "check_max").inc()
                log.warning("%s discarded: %s", where, action.reason)
        if promotions:
            self.metrics.promotions.inc(promotions)

    def close(self) -> None:
        self.txn.close()
