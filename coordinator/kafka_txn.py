"""The one Kafka-transaction helper of the coordinator's services (promotion and locks).

Shaped like confluent-kafka's transactional examples (``examples/eos-transactions.py``):
``init()`` once, then per batch ``begin -> produce -> send offsets -> commit``, and on
failure ``abort`` and replay from the committed offsets. librdkafka's errors are sorted
once, by :func:`triage`:

- ``RETRY``: call the same method again (bounded by a deadline, the shared tenacity policy);
- ``ABORT``: abort the transaction; the caller replays from its committed offsets
  (raised as :class:`TransactionAborted`);
- ``FATAL``: the producer is unusable (fenced by a newer instance with the same
  transactional id, or broken); the process must stop (:class:`FatalKafkaError`).

:func:`transactional_loop` is the main loop both services share, so they handle errors
the same way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from typing import Any, NoReturn

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from tenacity import retry_if_exception

from rmq_semantics.clientconf import client_conf
from rmq_semantics.errors import (
    FatalKafkaError,
    KafkaOperationError,
    RmqError,
    TransactionAborted,
)
from rmq_semantics.retry import retrying

__all__ = [
    "RETRY_BACKOFF_MS",
    "KafkaTransactions",
    "TxnErrorKind",
    "transactional_loop",
    "triage",
]

log = logging.getLogger(__name__)

# Every transactional call's own timeout: generous for a loaded 2-core broker (ms normally).
TXN_CALL_TIMEOUT_S = 30.0
# A dead instance's open transaction blocks read_committed readers (promotions, lock replies,
# the next owner's rebuild) until the broker aborts it; a batch is written in milliseconds.
TRANSACTION_TIMEOUT_MS = 10000
# Retriable send-offsets/commit/abort errors are retried this long, then the batch is
# replayed; with one call timeout on top it stays within the server's shutdown join.
RETRY_DEADLINE_S = 30.0
# init_transactions waits this long for a broker that is still starting (or a stop).
INIT_DEADLINE_S = 60.0
# The next transaction's AddOffsetsToTxn gets CONCURRENT_TRANSACTIONS until the broker has
# written the previous commit's markers (a few ms), and librdkafka retries it after
# retry.backoff.ms: its default of 100 ms made every back-to-back transaction take 100 ms.
# Measured on the embedded broker: 100 ms -> 5.5 ms per send_offsets_to_transaction.
RETRY_BACKOFF_MS = 2
RETRY_BACKOFF_MAX_MS = 20
# After a failed step (not an abort): pause before replaying, so a broken broker is no spin.
RETRY_PAUSE_S = 0.5


class TxnErrorKind(Enum):
    """What a transactional call's error asks for (librdkafka's triage)."""

    RETRY = "retry"
    ABORT = "abort"
    FATAL = "fatal"


def triage(err: KafkaError) -> TxnErrorKind:
    """Sort one librdkafka error: fatal first, then abortable, then retriable; any other
    error of a transaction also ends in an abort and a replay."""
    if err.fatal():
        return TxnErrorKind.FATAL
    if err.txn_requires_abort():
        return TxnErrorKind.ABORT
    if err.retriable():
        return TxnErrorKind.RETRY
    return TxnErrorKind.ABORT


def _retry_in_place(exc: BaseException) -> bool:
    return (isinstance(exc, KafkaException) and bool(exc.args)
            and triage(exc.args[0]) is TxnErrorKind.RETRY)


def _retry_in_place_unless_timed_out(exc: BaseException) -> bool:
    return _retry_in_place(exc) and exc.args[0].code() != KafkaError._TIMED_OUT


class KafkaTransactions:
    """Owns one transactional producer: :meth:`init` once, then one :meth:`transaction`
    per batch. ``conf`` is the coordinator's librdkafka conf (bootstrap, security...)."""

    def __init__(self, conf: dict, transactional_id: str, *, who: str) -> None:
        self.transactional_id = transactional_id
        self.who = who
        self.renewals = 0  # producers re-created after an EndTxn timed out
        self._init_due = False  # a re-created producer whose init failed
        self._broken = False  # a fatal error met: the producer is unusable
        self._conf = client_conf(conf, who=who, forced={
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",  # Java's placement for keyed records
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "linger.ms": 1,
            "retry.backoff.ms": RETRY_BACKOFF_MS,
            # librdkafka's backoff grows exponentially up to this (default 1,000 ms).
            "retry.backoff.max.ms": RETRY_BACKOFF_MAX_MS,
            # Delivery callbacks (the transaction writer's, to find a poison record) run
            # only for failed messages: nothing per record on the hot path.
            "delivery.report.only.error": True,
        })
        self.producer = confluent_kafka.Producer(self._conf)

    def init(self, stop: threading.Event | None = None) -> None:
        """``init_transactions``: fences an older instance with the same transactional id
        and aborts its open transaction. Retried until ``INIT_DEADLINE_S`` or ``stop``."""
        what = "initialising transactions"
        try:
            self._call(what, self.producer.init_transactions, deadline_s=INIT_DEADLINE_S,
                       stop=stop)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if triage(err) is TxnErrorKind.FATAL:
                raise self._fatal(what, err) from exc
            raise KafkaOperationError.wrap(what, err) from exc
        self._init_due = False

    @contextlib.contextmanager
    def transaction(self, offsets: Sequence[TopicPartition],
                    group_metadata: object) -> Iterator[confluent_kafka.Producer]:
        """``with txn.transaction(offsets, metadata) as producer: producer.produce(...)``:
        begin, the body produces, then send ``offsets`` and commit, all or nothing.

        Raises TransactionAborted when the transaction was aborted (the caller replays from
        its committed offsets) and FatalKafkaError when the producer cannot go on.
        """
        with self.body() as producer:
            yield producer
        self.finish(offsets, group_metadata)

    @contextlib.contextmanager
    def body(self) -> Iterator[confluent_kafka.Producer]:
        """Begin a transaction; the ``with`` block produces into it. A failure aborts it
        (as :meth:`transaction`); the caller then calls :meth:`finish` to commit it."""
        if self._init_due:
            self.init()
        producer = self.producer
        try:
            producer.begin_transaction()
            yield producer
        except KafkaException as exc:
            self._abort(exc.args[0], exc)
        except BufferError as exc:  # local queue full: nothing is lost, replay the batch
            self._abort(KafkaError(KafkaError._QUEUE_FULL), exc)
        except Exception:
            # A bug in the body: do not leave the transaction open until its timeout.
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(TXN_CALL_TIMEOUT_S)
            raise

    def finish(self, offsets: Sequence[TopicPartition], group_metadata: object,
               failed: Callable[[], object] | None = None) -> None:
        """Send ``offsets`` and commit the transaction :meth:`body` began, or abort it
        (``failed()`` is called first: the abort can take long). Safe on another thread than
        the body's, once the body has returned."""
        try:
            self._call("sending offsets", self.producer.send_offsets_to_transaction,
                       list(offsets), group_metadata)
            self._end("committing", self.producer.commit_transaction)
        except KafkaException as exc:
            if failed is not None:
                failed()
            self._abort(exc.args[0], exc)

    def close(self) -> None:
        """Deliver what is queued; after a fatal error drop it (it never would be). Never
        raises: the error that ended the service stays the one reported."""
        try:
            if self._broken:
                self.producer.purge(in_queue=True, in_flight=True, blocking=False)
            else:
                self.producer.flush(TXN_CALL_TIMEOUT_S)
        except Exception as exc:
            log.warning("%s: closing producer %s: %r", self.who, self.transactional_id, exc)

    # -- internals -------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., Any], *args: Any,
              deadline_s: float | None = None, stop: threading.Event | None = None,
              retry: Callable[[BaseException], bool] = _retry_in_place) -> None:
        """``fn(*args, timeout)``; an error ``retry`` accepts (by default every RETRY one)
        calls it again until ``deadline_s`` (default ``RETRY_DEADLINE_S``) or ``stop``."""
        deadline_s = RETRY_DEADLINE_S if deadline_s is None else deadline_s
        try:
            fn(*args, TXN_CALL_TIMEOUT_S)
            return
        except KafkaException as exc:
            # Outside the policy first: the hot path pays no tenacity bookkeeping.
            if not retry(exc):
                raise
            log.warning("%s: %s %s (retriable); retrying for up to %.0f s", self.who, what,
                        exc.args[0].str(), deadline_s)
        policy = retrying(deadline_s, stop).copy(retry=retry_if_exception(retry))
        policy(fn, *args, TXN_CALL_TIMEOUT_S)

    def _end(self, what: str, end_txn: Callable[..., Any]) -> None:
        """Commit or abort (EndTxn). One that timed out may leave this transaction's requests
        in flight, and librdkafka lacks KIP-890's defence against them landing in the next
        transaction (librdkafka #5423): a new producer, whose init bumps the epoch, fences
        them. Raises TransactionAborted then: the caller replays."""
        try:
            self._call(what, end_txn, retry=_retry_in_place_unless_timed_out)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() != KafkaError._TIMED_OUT or err.fatal() or err.txn_requires_abort():
                raise  # an abortable timeout (a record's) was never an EndTxn sent
            self._renew(what, err)
            raise TransactionAborted(f"{what} timed out ({err.str()}); the transactional "
                                     f"producer was re-created") from exc

    def _renew(self, what: str, err: KafkaError) -> None:
        log.warning("%s: %s timed out (%s); re-creating transactional producer %s: its new "
                    "epoch fences the old one's late requests", self.who, what, err.str(),
                    self.transactional_id)
        with contextlib.suppress(KafkaException, RuntimeError):
            self.producer.purge(in_queue=True, in_flight=True, blocking=False)
        self.producer = confluent_kafka.Producer(self._conf)
        self.renewals += 1
        # Initialised by the next body(), on the caller's thread and its retry policy: an
        # init can wait minutes (CONCURRENT_TRANSACTIONS until the old abort's markers are
        # written, e.g. below min ISR), longer than a commit may take.
        self._init_due = True

    def _fatal(self, what: str, err: KafkaError) -> FatalKafkaError:
        self._broken = True
        return FatalKafkaError(
            f"{self.who}: {what}: {err.str()} (fatal: fenced by another instance with "
            f"transactional.id {self.transactional_id}, or the producer broke)", err)

    def _abort(self, err: KafkaError, exc: BaseException) -> NoReturn:
        if triage(err) is TxnErrorKind.FATAL:
            raise self._fatal("transaction", err) from exc
        log.warning("%s: transaction failed (%s); aborting and replaying from committed "
                    "offsets", self.who, err.str())
        try:
            self._end("aborting", self.producer.abort_transaction)
        except KafkaException as abort_exc:
            # The transaction's state is unknown: only a new producer (a restart) is safe.
            raise self._fatal("aborting", abort_exc.args[0]) from abort_exc
        raise TransactionAborted(err.str()) from exc


def transactional_loop(who: str, step: Callable[[], object], replay: Callable[[], object],
                       stop: threading.Event, *more_stops: threading.Event) -> None:
    """Run ``step()`` until ``stop`` (or one of ``more_stops``) is set, the same way in both
    services: a fatal error ends the loop; after an abort or any other product error,
    ``replay()`` goes back to the committed state (after a pause unless it was an abort)."""
    stops = (stop, *more_stops)
    replay_due = False
    while not any(event.is_set() for event in stops):
        try:
            if replay_due:
                replay()
                replay_due = False
            step()
        except FatalKafkaError:
            raise
        except TransactionAborted:
            replay_due = True
        except RmqError as exc:
            log.warning("%s: %s; replaying from committed offsets in %.1f s", who, exc,
                        RETRY_PAUSE_S)
            replay_due = True
            stop.wait(RETRY_PAUSE_S)
