"""Poison records: what one failed action of the coordinator's Kafka transaction means for
the half record behind it. No I/O: the transaction writer feeds failures in, the
transaction service asks which records to set aside when it replays.

Every failure of one action (a promotion, a check request, a discard copy) is sorted once,
by :func:`classify`:

- ``RETRY``: transient (local queue full, a broker timing out); not the record's fault,
  so the call is retried or the batch replayed without blaming it;
- ``REPLAY``: abort and replay; blamed on the record, at most ``replay_max`` times, then
  it counts as permanent (``replay_limit``);
- ``DISCARD``: permanent for this record (Kafka refused its topic, partition, size or our
  right to write it): never promote it, set it aside in the discard topic with a reason;
- ``FATAL``: the producer is unusable; the process stops (fencing, a broken client);
- ``IGNORE``: a message purged by an abort: a casualty, not a cause.

How librdkafka reports them for a transactional producer: a bad argument raises from
``produce()`` at once (unknown partition of a known topic, over ``message.max.bytes``); a
broker's refusal of one record comes back in that record's delivery report, served while
``commit_transaction`` flushes, and the commit fails with an abortable error; a refused
``AddPartitionsToTxn`` (an ACL) fails the commit and names no record, so the caller asks
the broker which topics it may not write.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from confluent_kafka import KafkaError, KafkaException

from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.retry import RETRIABLE_CODES

__all__ = [
    "Blame",
    "FailureKind",
    "PoisonLedger",
    "Verdict",
    "after_replays",
    "classify",
    "on_system_topic",
]

Key = tuple[int, int]  # (half partition, half offset)


class FailureKind(Enum):
    RETRY = "retry"
    REPLAY = "replay"
    DISCARD = "discard"
    FATAL = "fatal"
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: FailureKind
    reason: DiscardReason | None = None
    detail: str = ""


# Errors that can only be about this record: retrying it never helps.
_PERMANENT: dict[int, DiscardReason] = {
    KafkaError._UNKNOWN_PARTITION: DiscardReason.UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC: DiscardReason.UNKNOWN_TOPIC,
    KafkaError.UNKNOWN_TOPIC_OR_PART: DiscardReason.UNKNOWN_TOPIC,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: DiscardReason.UNAUTHORIZED,
    KafkaError.MSG_SIZE_TOO_LARGE: DiscardReason.TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE: DiscardReason.TOO_LARGE,
}
# The cluster, not the record: a delivery report carries no retriable flag, so by code.
_TRANSIENT = RETRIABLE_CODES | frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._QUEUE_FULL,
        KafkaError.CONCURRENT_TRANSACTIONS,
    }
)
_CASUALTIES = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


def classify(failure: BaseException | KafkaError) -> Verdict:
    """Sort one failure of one action (an exception it raised, or its delivery error)."""
    if (
        isinstance(failure, KafkaException)
        and failure.args
        and isinstance(failure.args[0], KafkaError)
    ):
        failure = failure.args[0]
    if isinstance(failure, KafkaError):
        return _classify_kafka(failure)
    if isinstance(failure, BufferError):
        return Verdict(FailureKind.RETRY, detail="the local produce queue is full")
    # Anything else (fastavro's TypeError, a ValueError...) came from this record's content.
    return Verdict(FailureKind.REPLAY, detail=f"{type(failure).__name__}: {failure}")


def _classify_kafka(err: KafkaError) -> Verdict:
    code, detail = err.code(), f"{err.name()}: {err.str()}"
    if err.fatal():
        return Verdict(FailureKind.FATAL, detail=detail)
    if code in _CASUALTIES:
        return Verdict(FailureKind.IGNORE, detail=detail)
    reason = _PERMANENT.get(code)
    if reason is not None:
        return Verdict(FailureKind.DISCARD, reason, detail)
    if code in _TRANSIENT or err.retriable():
        return Verdict(FailureKind.RETRY, detail=detail)
    return Verdict(FailureKind.REPLAY, detail=detail)


def on_system_topic(verdict: Verdict) -> Verdict:
    """A failed write to one of the coordinator's own topics (a check request, a discard
    copy) is the record's fault only for its size or an exception of ours; an ACL or a
    missing topic there is the cluster's, and must not discard every record."""
    if verdict.kind is FailureKind.DISCARD and verdict.reason is not DiscardReason.TOO_LARGE:
        return Verdict(FailureKind.RETRY, detail=verdict.detail)
    return verdict


def after_replays(verdict: Verdict, replays: int, replay_max: int) -> Verdict:
    """A ``REPLAY`` failure seen ``replays`` times for one record is permanent from
    ``replay_max`` on."""
    if verdict.kind is FailureKind.REPLAY and replays >= replay_max:
        return Verdict(
            FailureKind.DISCARD,
            DiscardReason.REPLAY_LIMIT,
            f"{replays} aborted transactions, the last: {verdict.detail}",
        )
    return verdict


@dataclass
class Blame:
    """What one half record's failures have cost so far."""

    replays: int = 0
    reason: DiscardReason | None = None  # set once the record must be discarded
    detail: str = ""
    copy_failed: bool = False  # its copy to the discard topic failed: write a stub instead


class PoisonLedger:
    """Failures blamed on half records, kept across aborted transactions and the replays
    that follow them (in-memory state is rebuilt from Kafka then; this is not)."""

    def __init__(self, replay_max: int) -> None:
        self.replay_max = replay_max
        self._blames: dict[Key, Blame] = {}

    def blame(self, key: Key, verdict: Verdict, *, discard_copy: bool = False) -> Blame | None:
        """Charge the record at ``key`` (half partition, offset) with one failure; returns
        its blame, or None when the failure was not the record's fault."""
        if verdict.kind not in (FailureKind.REPLAY, FailureKind.DISCARD):
            return None
        blame = self._blames.setdefault(key, Blame())
        blame.detail = verdict.detail
        if discard_copy:
            blame.copy_failed = True
            return blame
        blame.replays += 1
        final = after_replays(verdict, blame.replays, self.replay_max)
        if final.kind is FailureKind.DISCARD:
            blame.reason, blame.detail = final.reason, final.detail
        return blame

    def discarding(self, key: Key) -> Blame | None:
        """The blame of a record that must be set aside, None for any other."""
        blame = self._blames.get(key)
        return blame if blame is not None and blame.reason is not None else None

    def stub(self, key: Key) -> bool:
        blame = self._blames.get(key)
        return blame is not None and blame.copy_failed

    def settle(self, keys: Iterable[Key]) -> None:
        """These records were written (promoted, checked or discarded): forget them."""
        if self._blames:
            for key in keys:
                self._blames.pop(key, None)

    def forget_partition(self, partition: int) -> None:
        """Another coordinator owns this half partition now."""
        for key in [k for k in self._blames if k[0] == partition]:
            del self._blames[key]

    def __len__(self) -> int:
        return len(self._blames)
