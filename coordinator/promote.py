"""The one Kafka transaction: promoted records, Op markers, check requests, discards and the
coordinator's consumer offsets, committed atomically (exactly-once promotion)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from confluent_kafka import TopicPartition

from coordinator.kafka_txn import KafkaTransactions
from coordinator.marker_auth import MarkerKey
from coordinator.metrics import CoordinatorMetrics
from coordinator.state import (
    Action,
    Discard,
    Finish,
    IssueCheck,
    Reappend,
    SaveCheckCounts,
    TxnState,
)
from rmq_semantics.errors import TransactionAborted
from rmq_semantics.records.codec import SystemRecord, encode
from rmq_semantics.records.headers import H
from rmq_semantics.records.reappend import reappended_headers
from rmq_semantics.records.txn import CheckMarker, CheckRequest, DoneEntry, DoneMarkers, Outcome
from rmq_semantics.topics import SystemTopics

__all__ = ["TransactionWriter"]

log = logging.getLogger(__name__)


# The decision a done marker records for each final state.
_OUTCOME = {TxnState.COMMITTED: Outcome.COMMITTED, TxnState.ROLLED_BACK: Outcome.ROLLED_BACK,
            TxnState.DISCARDED: Outcome.DISCARDED, TxnState.REAPPENDED: Outcome.REAPPENDED}


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionWriter:
    """Writes the coordinator's decisions through its :class:`KafkaTransactions`."""

    def __init__(self, conf: dict, topics: SystemTopics, transactional_id: str,
                 metrics: CoordinatorMetrics, *, marker_key: MarkerKey) -> None:
        self.topics = topics
        self.marker_key = marker_key  # signs every marker: readers trust no other
        self.metrics = metrics
        self.txn = KafkaTransactions(conf, transactional_id, who="transaction service")
        self.producer = self.txn.producer
        self._done_entries: dict[int, list[DoneEntry]] = {}  # per half partition, this txn

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

    def _op(self, partition: int, record: SystemRecord) -> None:
        record = self.marker_key.sign(self.topics.op, partition, record)
        self.producer.produce(self.topics.op, encode(record), partition=partition)

    def _done(self, half, outcome: TxnState, checks_answered: int) -> None:
        self._done_entries.setdefault(half.partition, []).append(
            DoneEntry(half.offset, half.txn_id, _OUTCOME[outcome], checks_answered))

    def _write_done_markers(self) -> None:
        """One Op record per partition for all of this transaction's decisions: a record
        per decision cost as much again as the promotion itself (encode, produce, read
        back, decode)."""
        now = _now_ms()
        for partition, entries in self._done_entries.items():
            self._op(partition, DoneMarkers(tuple(entries), now))

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
            self.producer.produce(
                self.topics.check, encode(CheckRequest.of_half(half, action.check_seq, _now_ms())),
                key=half.producer_group.encode())
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
        elif isinstance(action, Reappend):
            self._reappend(action)

    def _reappend(self, action: Reappend) -> None:
        """The half record again, at the end of its own half partition (same key, value and
        headers plus what it carries), and its old offset done: both or neither."""
        half = action.half
        self.producer.produce(self.topics.half, half.value, key=half.key,
                              partition=half.partition,
                              headers=reappended_headers(half, action.carried))
        self._done(half, TxnState.REAPPENDED, action.carried.checks_answered)

    def _marker(self, action: IssueCheck | SaveCheckCounts) -> None:
        self._op(action.half.partition, CheckMarker(
            action.half.offset, action.half.txn_id, action.checks_issued,
            action.checks_answered, action.answered_seq, action.next_check_ts, _now_ms()))

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
            elif isinstance(action, Reappend):
                self.metrics.reappended.inc()
                log.info("%s re-appended to %s[%d] (pending since %.0f s, first written at "
                         "offset %d)", where, self.topics.half, half.partition,
                         max(0.0, now - half.timestamp_ms / 1000), action.carried.origin_offset)
            elif isinstance(action, Discard):
                self.metrics.discarded.labels(
                    "retention" if "retention" in action.reason else "check_max").inc()
                log.warning("%s discarded: %s", where, action.reason)
        if promotions:
            self.metrics.promotions.inc(promotions)

    def close(self) -> None:
        self.txn.close()
