"""The one Kafka transaction: promoted records, Op markers, check requests, discards and the
coordinator's consumer offsets, committed atomically (exactly-once promotion)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from coordinator.metrics import CoordinatorMetrics
from coordinator.state import Action, Discard, Finish, IssueCheck, SaveCheckCounts, TxnState
from rmq_semantics.errors import FatalKafkaError, KafkaOperationError, TransactionAborted
from rmq_semantics.records.codec import SystemRecord, encode
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import CheckMarker, CheckRequest, DoneEntry, DoneMarkers, Outcome
from rmq_semantics.retry import retrying
from rmq_semantics.topics import SystemTopics

__all__ = ["RETRY_BACKOFF_MS", "TransactionWriter"]

log = logging.getLogger(__name__)

# Generous for a loaded 2-core broker; a commit normally takes a few ms.
TXN_CALL_TIMEOUT_S = 30.0
# A crashed coordinator's open transaction blocks read_committed readers until the broker
# aborts it; keep that window short. Must exceed the longest batch we write.
TRANSACTION_TIMEOUT_MS = 15000
# How long a retriable commit failure is retried before the batch is aborted and replayed.
COMMIT_DEADLINE_S = 60.0
# The next transaction's AddOffsetsToTxn gets CONCURRENT_TRANSACTIONS until the broker has
# written the previous commit's markers (a few ms), and librdkafka retries it after
# retry.backoff.ms: its default of 100 ms made every back-to-back transaction take 100 ms.
# Measured on the embedded broker: 100 ms -> 5.5 ms per send_offsets_to_transaction.
RETRY_BACKOFF_MS = 2


# The decision a done marker records for each final state.
_OUTCOME = {TxnState.COMMITTED: Outcome.COMMITTED, TxnState.ROLLED_BACK: Outcome.ROLLED_BACK,
            TxnState.DISCARDED: Outcome.DISCARDED}


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionWriter:
    """Owns the coordinator's transactional producer."""

    def __init__(self, conf: dict, topics: SystemTopics, transactional_id: str,
                 metrics: CoordinatorMetrics) -> None:
        self.topics = topics
        self.metrics = metrics
        producer_conf = {
            **conf,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",  # Java's placement for keyed records
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "linger.ms": 1,
            "retry.backoff.ms": RETRY_BACKOFF_MS,
            "logger": logging.getLogger("rmq_semantics.librdkafka"),
        }
        self.producer = confluent_kafka.Producer(producer_conf)
        self._done_entries: dict[int, list[DoneEntry]] = {}  # per half partition, this txn
        self._call(self.producer.init_transactions, "initialising transactions")

    def _call(self, fn, what: str, *args) -> None:
        try:
            fn(*args, TXN_CALL_TIMEOUT_S)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.fatal():
                raise FatalKafkaError(f"{what}: {err.str()} (fatal; another coordinator "
                                            "with the same instance id fenced this one?)") from exc
            raise KafkaOperationError.wrap(what, err) from exc

    def write(self, actions: Sequence[Action], offsets: list[TopicPartition],
              group_metadata: object) -> None:
        """Write ``actions`` and commit ``offsets`` in one transaction.

        Raises TransactionAborted when the transaction had to be aborted (the caller
        replays from committed offsets) and FatalKafkaError when it cannot go on.
        """
        self._done_entries: dict[int, list[DoneEntry]] = {}
        try:
            self.producer.begin_transaction()
            for action in actions:
                self._produce(action)
            self._write_done_markers()
            self.producer.send_offsets_to_transaction(offsets, group_metadata,
                                                      TXN_CALL_TIMEOUT_S)
            self._commit()
        except KafkaException as exc:
            self._triage(exc.args[0], exc)
        self._count(actions)

    def _commit(self) -> None:
        # librdkafka's triage: a retriable commit error means "call commit again".
        for attempt in retrying(COMMIT_DEADLINE_S):
            with attempt:
                self.producer.commit_transaction(TXN_CALL_TIMEOUT_S)

    def _triage(self, err: KafkaError, exc: Exception) -> None:
        if err.fatal():
            raise FatalKafkaError(f"transactional producer failed: {err.str()}") from exc
        log.warning("coordinator transaction failed (%s); aborting and replaying from "
                    "committed offsets", err.str())
        try:
            self.producer.abort_transaction(TXN_CALL_TIMEOUT_S)
        except KafkaException as abort_exc:
            abort_err: KafkaError = abort_exc.args[0]
            if abort_err.fatal() or not abort_err.retriable():
                raise FatalKafkaError(
                    f"could not abort the transaction: {abort_err.str()}") from abort_exc
        self.metrics.aborted.inc()
        raise TransactionAborted(err.str()) from exc

    def _op(self, partition: int, record: SystemRecord) -> None:
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
            elif isinstance(action, Discard):
                self.metrics.discarded.labels(
                    "retention" if "retention" in action.reason else "check_max").inc()
                log.warning("%s discarded: %s", where, action.reason)
        if promotions:
            self.metrics.promotions.inc(promotions)

    def close(self) -> None:
        self.producer.flush(TXN_CALL_TIMEOUT_S)
