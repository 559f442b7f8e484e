"""The one Kafka transaction: promoted records, Op markers, check requests, discards and the
coordinator's consumer offsets, committed atomically (exactly-once promotion).

Over 500 physical lines only since ``ruff format`` (one argument a line; under 500 as the
layering test counts them), and kept whole: one class writes one Kafka transaction
(promotions, discards, done markers, re-appends) and accounts for its delivery reports,
which refer to each other; the pure helpers it uses sit at the end."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeGuard

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from coordinator.blocked import TIMED_OUT, Blockage
from coordinator.kafka_txn import WEDGED_AFTER_S, CommitThread, KafkaTransactions
from coordinator.marker_auth import MarkerKey
from coordinator.metrics import CoordinatorMetrics
from coordinator.poison import FailureKind, PoisonLedger, Verdict, classify, on_system_topic
from coordinator.state import (
    Action,
    Discard,
    Finish,
    IssueCheck,
    LateCommit,
    Reappend,
    SaveCheckCounts,
    TxnState,
)
from coordinator.tenancy import TenantGuard, check_topic, resign
from coordinator.written import action_where, count_written
from rmq_semantics.consumed import topic_of
from rmq_semantics.errors import IllegalStateError, TransactionAborted
from rmq_semantics.message import produce_headers
from rmq_semantics.records.codec import SystemRecord, encode
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.headers import H
from rmq_semantics.records.reappend import reappended_headers
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.records.txn import CheckMarker, CheckRequest, DoneEntry, DoneMarkers, Outcome
from rmq_semantics.topics import SystemTopics
from rmq_semantics.tracing import promote_span

__all__ = ["TransactionWriter"]

log = logging.getLogger(__name__)


# The decision a done marker records for each final state.
_OUTCOME = {
    TxnState.COMMITTED: Outcome.COMMITTED,
    TxnState.ROLLED_BACK: Outcome.ROLLED_BACK,
    TxnState.DISCARDED: Outcome.DISCARDED,
    TxnState.REAPPENDED: Outcome.REAPPENDED,
}


# A full local queue is retried in place this often, serving deliveries in between.
PRODUCE_ATTEMPTS = 3
QUEUE_FULL_WAIT_S = 0.5
# A discard copy that failed once is written again as a stub: these headers, this long.
STUB_HEADERS = (
    H.TXN_ID,
    H.REAL_TOPIC,
    H.REAL_PARTITION,
    H.PRODUCER_GROUP,
    H.BORN_TS,
    H.TXN_SIZE,
    H.TXN_INDEX,
)
STUB_HEADER_BYTES = 1024
# The second transactional producer's id: the first's plus this (a restart with the same
# instance id fences both).
SECOND_PRODUCER_SUFFIX = ".2"

#: ``unwritable(topics)``: which of these real topics the broker refuses us, and why.
TopicProbe = Callable[[set[str]], dict[str, DiscardReason]]
# A real topic or partition called unknown may be newer than that metadata: the producer reads
# it again and retries; the replay's vetting decides on a fresh read. No record's fault.
_UNKNOWN_DESTINATION = (DiscardReason.UNKNOWN_TOPIC, DiscardReason.UNKNOWN_PARTITION)
METADATA_TIMEOUT_S = 10.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _is_promotion(action: Action) -> TypeGuard[Finish]:
    return isinstance(action, Finish) and action.outcome is TxnState.COMMITTED


class TransactionWriter:
    """Writes the coordinator's decisions through its :class:`KafkaTransactions`."""

    def __init__(
        self,
        conf: dict,
        topics: SystemTopics,
        transactional_id: str,
        metrics: CoordinatorMetrics,
        ledger: PoisonLedger,
        *,
        marker_key: MarkerKey,
        unwritable: TopicProbe | None = None,
        blockage: Blockage | None = None,
        check_partitions: int = 0,
        stale: Callable[[str], None] | None = None,
        guard: TenantGuard | None = None,
    ) -> None:
        self.topics = topics
        self.guard = guard  # tenant isolation: checks to each group's topic, re-appends signed
        self.stale = stale  # told of a real topic a write found unknown
        self.check_partitions = check_partitions  # of the check topic (0: unknown)
        self.marker_key = marker_key  # signs every marker: readers trust no other
        self.metrics = metrics
        self.ledger = ledger
        self.unwritable = unwritable
        self.blockage = blockage  # why promotion is blocked, while it is
        # Partitions that timed out, this txn (None: a record not yet given one).
        self._timed_out: set[tuple[str, int | None]] = set()
        self._promoted_to: set[tuple[str, int | None]] = set()  # (topic, partition?), this txn
        # Two transactional producers take turns, one transaction open at a time (so offsets
        # stay ordered): a transaction begun on the producer whose commit just returned gets
        # CONCURRENT_TRANSACTIONS while the broker writes that commit's markers, and
        # librdkafka retries AddPartitionsToTxn only after a fixed 20 ms.
        self._txns = tuple(
            KafkaTransactions(conf, tid, who="transaction service")
            for tid in (transactional_id, f"{transactional_id}{SECOND_PRODUCER_SUFFIX}")
        )
        self._turn, self.txn = 0, self._txns[0]
        self.producer = self.txn.producer
        self._done_entries: dict[int, list[DoneEntry]] = {}  # per half partition, this txn
        self._failed: list[tuple[Action, KafkaError]] = []  # delivery errors, this txn
        # Records of the action being produced that are in the transaction already, so a
        # retry after a full queue never writes a member twice; and its discard timestamp.
        self._produced, self._stamp, self._blamed = 0, b"", False
        # One thread sends each transaction's offsets and commits it (see submit()).
        self._committer = CommitThread()
        self._in_flight: (
            tuple[Sequence[Action], concurrent.futures.Future, KafkaTransactions] | None
        ) = None

    def start(self, stop: threading.Event | None = None) -> None:
        """Initialise transactions (fences an older instance with the same id)."""
        for txn in self._txns:
            txn.init(stop)

    def prepare(self, stop: threading.Event | None = None) -> None:
        """Before a replay reads the committed offsets: initialise re-created producers."""
        for txn in self._txns:
            txn.ensure_initialised(stop)

    def write(
        self, actions: Sequence[Action], offsets: list[TopicPartition], group_metadata: object
    ) -> None:
        """Write ``actions`` and commit ``offsets`` in one transaction, and wait for it.

        Raises TransactionAborted when the transaction had to be aborted (the caller
        replays from committed offsets) and FatalKafkaError when it cannot go on.
        """
        self.submit(actions, offsets, group_metadata)
        self.settle()

    @property
    def producers(self) -> tuple:
        """The transactional producers taking turns (the first is the one named by the
        coordinator's transactional id)."""
        return tuple(txn.producer for txn in self._txns)

    @property
    def in_flight(self) -> bool:
        """Whether a transaction's commit is still running (see :meth:`submit`)."""
        return self._in_flight is not None

    @property
    def commit(self) -> concurrent.futures.Future | None:
        """The commit in flight (done once it has ended), None when none is."""
        return None if self._in_flight is None else self._in_flight[1]

    @property
    def commit_done(self) -> bool:
        """Whether :meth:`settle` would return without waiting: no commit in flight, its
        commit has ended, or one of its calls is wedged (``settle`` abandons it then)."""
        if self._in_flight is None:
            return True
        _, commit, txn = self._in_flight
        return commit.done() or txn.wedged()

    def submit(
        self, actions: Sequence[Action], offsets: list[TopicPartition], group_metadata: object
    ) -> None:
        """Begin a transaction, produce ``actions`` into it, and leave sending ``offsets``
        and the commit (round trips, not CPU) to the committer thread, so the caller reads
        and decides the next batch meanwhile. :meth:`settle` waits for the outcome; it must
        be called before the next ``submit``."""
        if self._in_flight is not None:
            raise IllegalStateError("the previous transaction is not settled")
        self._done_entries = {}
        self._failed = []
        self._timed_out = set()
        self._promoted_to = set()
        self._blamed = False
        self.txn = self._txns[self._turn]
        self.producer = self.txn.producer
        self._turn ^= 1
        try:
            with self.txn.body():
                for action in actions:
                    self._guarded(action)
                self._write_done_markers()
        except TransactionAborted as aborted:
            self._aborted(actions, aborted)
            raise
        self._in_flight = (
            actions,
            self._committer.submit(self.txn.finish, offsets, group_metadata, self._failing),
            self.txn,
        )

    def settle(self) -> None:
        """Wait for the transaction :meth:`submit` left committing (nothing if none): count
        it once committed; TransactionAborted or FatalKafkaError as :meth:`write`."""
        if self._in_flight is None:
            return
        actions, commit, txn = self._in_flight
        self._in_flight = None
        if not self._committer.wait(commit, txn):
            self._abandon(txn)
            self.metrics.aborted.inc()
            raise TransactionAborted(
                f"a commit stuck for {txn.stuck_for():.0f} s was abandoned; "
                f"the transactional producer was re-created"
            )
        try:
            commit.result()
        except TransactionAborted as aborted:
            self._aborted(actions, aborted)
            raise
        if self.blockage is not None:
            self.blockage.committed()
        count_written(self.metrics, self.topics, actions)
        self.ledger.settle(
            (a.half.partition, a.half.offset) for a in actions if not isinstance(a, LateCommit)
        )

    def _abandon(self, txn: KafkaTransactions) -> None:
        """Swap ``txn`` (stuck in a call) for its successor, and the commit thread it holds
        for a new one; the stuck thread ends by itself if the call ever returns."""
        successor = txn.abandon()
        for sibling in self._txns:
            if sibling is not txn:
                sibling.renew("its sibling's call wedged on a coordinator that likely left")
        self._txns = tuple(successor if t is txn else t for t in self._txns)
        self._committer.close(timeout=0)
        self._committer = CommitThread()

    def _failing(self, err: KafkaError) -> None:
        # On the committer thread, before the abort (which may wait minutes below min ISR).
        # A fatal or transaction-wide failure may come before any delivery report: then the
        # cause is looked for on every real topic this transaction promoted into.
        if self.blockage is not None:
            self.blockage.aborted(
                self._timed_out or (self._promoted_to if err.code() in TIMED_OUT else set())
            )

    def _aborted(self, actions: Sequence[Action], aborted: TransactionAborted) -> None:
        self.metrics.aborted.inc()
        self._blame_failures(actions, aborted.__cause__)

    # -- poison records ----------------------------------------------------------------------
    def _guarded(self, action: Action) -> None:
        """Produce one action. Whatever it raises is classified (:mod:`coordinator.poison`)
        and, unless transient or fatal, blamed on its half record; then the transaction is
        aborted, and the replay sets the record aside once the ledger says so."""
        self._produced, self._stamp = 0, str(_now_ms()).encode()
        for attempt in range(1, PRODUCE_ATTEMPTS + 1):
            try:
                self._produce(action)
                return
            except Exception as exc:
                verdict = classify(exc)
                if verdict.kind is FailureKind.FATAL:
                    raise
                if (
                    _is_promotion(action)
                    and verdict.reason in _UNKNOWN_DESTINATION
                    and attempt < PRODUCE_ATTEMPTS
                ):
                    read_metadata_again(self.producer, action.records[self._produced].real_topic)
                    continue
                if verdict.kind is FailureKind.RETRY and attempt < PRODUCE_ATTEMPTS:
                    self.producer.poll(QUEUE_FULL_WAIT_S)
                    continue
                self._blame(action, verdict)
                where = action_where(self.topics, action)
                raise TransactionAborted(f"{where}: {verdict.detail}") from exc

    def _on_delivery(
        self, action: Action, err: KafkaError | None, msg: confluent_kafka.Message | None
    ) -> None:
        # Called for failed deliveries only (delivery.report.only.error), during the commit.
        if err is not None:
            self._failed.append((action, err))
            if err.code() in TIMED_OUT and msg is not None:
                self._timed_out.add((topic_of(msg), msg.partition()))

    def _blame_failures(self, actions: Sequence[Action], cause: BaseException | None) -> None:
        """After an abort: charge the records whose delivery failed. A refusal that names
        no record (a topic ACL fails AddPartitionsToTxn) is traced to its real topics."""
        for action, err in self._failed:
            self._blame(action, classify(err))
        if self._blamed or self.unwritable is None or not isinstance(cause, KafkaException):
            return
        verdict = classify(cause)
        if verdict.kind is not FailureKind.DISCARD:
            return
        for action, reason in refused_promotions(actions, self.unwritable):
            self._blame(action, Verdict(FailureKind.DISCARD, reason, verdict.detail))

    def _blame(self, action: Action, verdict: Verdict) -> None:
        if isinstance(action, LateCommit):
            return
        if not _is_promotion(action):
            verdict = on_system_topic(verdict)
        elif verdict.reason in _UNKNOWN_DESTINATION:
            # Only a fresh metadata read lacking it may discard: the replay's vetting.
            if self.stale is not None:
                for member in action.records:
                    self.stale(member.real_topic)
            verdict = Verdict(FailureKind.RETRY, detail=verdict.detail)
        half = action.half
        blame = self.ledger.blame(
            (half.partition, half.offset), verdict, discard_copy=isinstance(action, Discard)
        )
        if blame is None:
            return
        self._blamed = True
        if blame.copy_failed:
            outcome = "its discard copy failed; a stub goes to the discard topic instead"
        elif blame.reason is not None:
            outcome = f"it will be set aside ({blame.reason})"
        else:
            outcome = f"replay {blame.replays} of at most {self.ledger.replay_max}"
        log.warning("%s: %s; %s", action_where(self.topics, action), verdict.detail, outcome)

    def _each(self, records: tuple[HalfMessage, ...]):
        """``records`` of the action being produced that no failed attempt produced."""
        for i, half in enumerate(records):
            if i >= self._produced:
                yield half
                self._produced = i + 1

    def _set_aside(self, action: Discard) -> None:
        """Every member of the transaction to the discard topic, each with the same
        ``rmq.discarded_ts`` (that and the transaction id is how ``txn discarded`` tells one
        discard from a later one), and done as DISCARDED."""
        stub = self.ledger.stub((action.half.partition, action.half.offset))
        for half in self._each(action.records):
            value, key, headers = discard_copy(action, half, stub, self._stamp)
            self.producer.produce(
                self.topics.discard,
                value,
                key=key,
                headers=headers,
                on_delivery=partial(self._on_delivery, action),
            )
            self._done(half, TxnState.DISCARDED, action.checks_answered)

    def _op(self, partition: int, record: SystemRecord) -> None:
        record = self.marker_key.sign(self.topics.op, partition, record)
        self.producer.produce(self.topics.op, encode(record), partition=partition)

    def _done(self, half, outcome: TxnState, checks_answered: int) -> None:
        self._done_entries.setdefault(half.partition, []).append(
            DoneEntry(half.offset, half.txn_id, _OUTCOME[outcome], checks_answered)
        )

    def _write_done_markers(self) -> None:
        """One Op record per partition for all of this transaction's decisions: a record
        per decision cost as much again as the promotion itself (encode, produce, read
        back, decode)."""
        now = _now_ms()
        for partition, entries in self._done_entries.items():
            self._op(partition, DoneMarkers(tuple(entries), now))

    def _produce(self, action: Action) -> None:
        if isinstance(action, LateCommit):
            # No value: `txn discarded` marks that discard as committed too late.
            self.producer.produce(
                self.topics.discard, None, headers=produce_headers(late_commit_headers(action))
            )
            return
        half = action.half
        if isinstance(action, Finish):
            # Every member of a transaction in this one Kafka transaction, in index order.
            for member in self._each(action.records):
                if action.outcome is TxnState.COMMITTED:
                    self._promote(action, member)
                self._done(member, action.outcome, action.checks_answered)
        elif isinstance(action, IssueCheck):
            self.producer.produce(
                check_topic(self.guard, self.topics, half),
                encode(CheckRequest.of_half(half, action.check_seq, _now_ms())),
                **_check_destination(half, self.check_partitions),
                on_delivery=partial(self._on_delivery, action),
            )
            self._marker(action)
        elif isinstance(action, SaveCheckCounts):
            self._marker(action)
        elif isinstance(action, Discard):
            self._set_aside(action)
        elif isinstance(action, Reappend):
            self._reappend(action)

    def _promote(self, action: Finish, half: HalfMessage) -> None:
        _promote(self.producer, half, partial(self._on_delivery, action))
        self._promoted_to.add((half.real_topic, half.real_partition))

    def _reappend(self, action: Reappend) -> None:
        """The half record again, at the end of its own half partition (same key, value and
        headers plus what it carries), and its old offset done: both or neither. Members of
        a transaction all go, in index order, each naming its own old offset."""
        for half in self._each(action.records):
            carried = dataclasses.replace(action.carried, previous_offset=half.offset)
            headers = resign(self.guard, half, reappended_headers(half, carried))
            self.producer.produce(
                self.topics.half,
                half.value,
                key=half.key,
                partition=half.partition,
                headers=headers,
                on_delivery=partial(self._on_delivery, action),
            )
            self._done(half, TxnState.REAPPENDED, action.carried.checks_answered)

    def _marker(self, action: IssueCheck | SaveCheckCounts) -> None:
        self._op(
            action.half.partition,
            CheckMarker(
                action.half.offset,
                action.half.txn_id,
                action.checks_issued,
                action.checks_answered,
                action.answered_seq,
                action.next_check_ts,
                _now_ms(),
            ),
        )

    def close(self) -> None:
        """Idempotent; call :meth:`settle` first, or a transaction in flight is waited for
        here and its outcome left to the next start's replay."""
        self._committer.close(timeout=WEDGED_AFTER_S)
        self._in_flight = None
        for txn in self._txns:
            txn.close()


def read_metadata_again(producer: Any, topic: str) -> None:
    """The producer's metadata of ``topic``, read again (librdkafka only refreshes it
    every few minutes), so a partition added since is known to produce()."""
    log.info("topic %s: unknown to the producer; reading its metadata again", topic)
    try:
        producer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        log.warning("reading the metadata of topic %s failed: %s", topic, exc.args[0].str())


def refused_promotions(
    actions: Sequence[Action], unwritable: TopicProbe
) -> list[tuple[Action, DiscardReason]]:
    """(promotion, reason) for each promotion one of whose real topics ``unwritable``
    reports refused: one member's topic refused sets the whole transaction aside."""
    promotions = [a for a in actions if _is_promotion(a)]
    refused = (
        unwritable({h.real_topic for a in promotions for h in a.records}) if promotions else {}
    )
    found: list[tuple[Action, DiscardReason]] = []
    for action in promotions:
        reason = next(
            (refused[h.real_topic] for h in action.records if h.real_topic in refused), None
        )
        if reason is not None:
            found.append((action, reason))
    return found


def _promote(producer: Any, half: HalfMessage, on_delivery: Callable) -> None:
    """The promoted copy of ``half``; a ``promote`` span in the producer's trace, if its
    ``traceparent`` header (kept on the record) names one: from the birth to now."""
    where = {} if half.real_partition is None else {"partition": half.real_partition}
    now = _now_ms()
    # CreateTime = the producer's birth time, as RocketMQ's bornTimestamp.
    producer.produce(
        half.real_topic,
        half.value,
        key=half.key,
        headers=half.promoted_headers(now),
        timestamp=half.born_ts,
        on_delivery=on_delivery,
        **where,
    )
    promote_span(half.headers, half.real_topic, half.txn_id, half.born_ts, now)


def _check_destination(half: HalfMessage, check_partitions: int) -> dict:
    """Check affinity: one of the check partitions the producer instance held when it wrote
    the half record (``rmq.check_partitions``; chosen by transaction id), so the check
    reaches it while it still holds them and whoever took them over once it is gone. Else,
    or for a partition the check topic lacks, the transaction id as the key: spread over the
    group's live members."""
    held = [p for p in half.check_partitions if p < check_partitions]
    if not held:
        return {"key": half.txn_id.encode()}
    return {"partition": held[zlib.crc32(half.txn_id.encode()) % len(held)]}


def discard_copy(
    action: Discard, half: HalfMessage, stub: bool, discarded_ts: bytes
) -> tuple[bytes | None, bytes | None, list]:
    """(value, key, headers) of ``half``'s copy in the discard topic; a ``stub`` when the
    full copy failed once (over the discard topic's size...): only what names it."""
    if stub:
        value, key = None, None
        headers = [
            (k, v[:STUB_HEADER_BYTES] if v else v) for k, v in half.headers if k in STUB_HEADERS
        ]
    else:
        value, key, headers = half.value, half.key, list(half.headers)
    headers += [
        (H.HALF_PARTITION, str(half.partition).encode()),
        (H.HALF_OFFSET, str(half.offset).encode()),
        (H.CHECK_COUNT, str(action.checks_answered).encode()),
        (H.DISCARD_REASON, action.reason.encode()),
        (H.DISCARDED_TS, discarded_ts),
    ]
    return value, key, headers


def late_commit_headers(action: LateCommit) -> list[tuple[str, bytes]]:
    return [
        (H.TXN_ID, action.txn_id.encode()),
        (H.PRODUCER_GROUP, action.producer_group.encode()),
        (H.HALF_PARTITION, str(action.partition).encode()),
        (H.HALF_OFFSET, str(action.half_offset).encode()),
        (H.DISCARD_REASON, DiscardReason.LATE_COMMIT.encode()),
        (H.DISCARDED_TS, str(_now_ms()).encode()),
    ]
