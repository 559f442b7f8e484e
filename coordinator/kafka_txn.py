"""The one Kafka-transaction helper of the coordinator's services (promotion and locks).

Shaped like confluent-kafka's transactional examples (``examples/eos-transactions.py``):
``init()`` once, then per batch ``begin -> produce -> send offsets -> commit``, and on
failure ``abort`` and replay from the committed offsets. librdkafka's errors are sorted
once, by :func:`triage`:

- ``RETRY``: call the same method again (bounded by a deadline, the shared tenacity policy);
- ``ABORT``: abort the transaction; the caller replays from its committed offsets
  (raised as :class:`TransactionAborted`);
- ``FATAL``: the producer is unusable. Fenced by a newer instance with the same
  transactional id (a twin: :data:`TWIN_CODES`), the process must stop
  (:class:`FatalKafkaError`); broken otherwise (an idempotence sequence lost after a broker
  was cut off, say), it is re-created, its new epoch fencing its own late requests, and the
  batch replayed.

:func:`transactional_loop` is the main loop both services share, so they handle errors
the same way.


Over 500 physical lines only since ``ruff format`` (one argument a line; under 500 as the
layering test counts them), and kept whole: the producer wrapper, its commit thread and the
loop are one protocol (a call's triage decides the loop's replay, a wedged call the thread's
successor), used as one by both services.

Over 500 lines because one transactional producer's whole life (init, the transaction,
its abort and timeouts, abandoning a wedged call and renewing the producer) and the loop
both services run share that producer's state; the error triage is one function here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
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
    "LINGER_MS",
    "RETRY_BACKOFF_MS",
    "CommitThread",
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
# retry.backoff.ms: its default of 100 ms made every back-to-back transaction wait that long
# (docs/design/measurements.md).
RETRY_BACKOFF_MS = 2
# Written out, as client defaults move: 1 ms gathers a batch's promotions into requests
# without holding a transaction open for long.
LINGER_MS = 1
RETRY_BACKOFF_MAX_MS = 20
# After a failed step (not an abort): pause before replaying, so a broken broker is no spin.
RETRY_PAUSE_S = 0.5
# A call still running this long has ignored its own timeout: librdkafka can wait forever for
# a group coordinator that left the cluster (librdkafka #5456, #5511).
WEDGED_AFTER_S = TXN_CALL_TIMEOUT_S + 15.0
# Inside a transaction a stuck call is given up sooner: once the transaction is this much
# older than transaction.timeout.ms the broker aborts it whatever the call returns, so waiting
# for WEDGED_AFTER_S only adds to a failover (docs/design/measurements.md).
DOOMED_MARGIN_S = 5.0
# ... but only a call that has itself run this long (not one that just started late).
DOOMED_CALL_MIN_S = 5.0


#: Fatal errors that mean another instance with this transactional id took over (or may
#: not use it at all): only these stop the process; a producer broken otherwise is renewed.
TWIN_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


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
    return (
        isinstance(exc, KafkaException)
        and bool(exc.args)
        and triage(exc.args[0]) is TxnErrorKind.RETRY
    )


def _retry_in_place_unless_timed_out(exc: BaseException) -> bool:
    return _retry_in_place(exc) and exc.args[0].code() != KafkaError._TIMED_OUT


class KafkaTransactions:
    """Owns one transactional producer: :meth:`init` once, then one :meth:`transaction`
    per batch. ``conf`` is the coordinator's librdkafka conf (bootstrap, security...)."""

    def __init__(
        self, conf: dict, transactional_id: str, *, who: str, every_delivery: bool = False
    ) -> None:
        self.transactional_id = transactional_id
        self.who = who
        self.every_delivery = every_delivery
        self.renewals = 0  # producers re-created (an EndTxn timed out, a fence, a wedge)
        self.abandoned = False  # left to a call that never returned (see abandon())
        self._init_due = False  # a re-created producer whose init failed
        self._broken = False  # a fatal error met: the producer is unusable
        self._begun_at: float | None = None  # monotonic start of the open transaction
        self._busy_since: float | None = None  # monotonic start of the call in progress
        self._source_conf = conf
        self._conf = client_conf(
            conf,
            who=who,
            forced={
                "transactional.id": transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",  # Java's placement for keyed records
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "linger.ms": LINGER_MS,
                "retry.backoff.ms": RETRY_BACKOFF_MS,
                # librdkafka's backoff grows exponentially up to this (default 1,000 ms).
                "retry.backoff.max.ms": RETRY_BACKOFF_MAX_MS,
                # Delivery callbacks (the transaction writer's, to find a poison record) run
                # only for failed messages unless asked: nothing per record on the hot path.
                "delivery.report.only.error": not every_delivery,
            },
        )
        self.producer = confluent_kafka.Producer(self._conf)

    def init(self, stop: threading.Event | None = None) -> None:
        """``init_transactions``: fences an older instance with the same transactional id
        and aborts its open transaction. Retried until ``INIT_DEADLINE_S`` or ``stop``."""
        what = "initialising transactions"
        try:
            self._call(what, self.producer.init_transactions, deadline_s=INIT_DEADLINE_S, stop=stop)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if triage(err) is TxnErrorKind.FATAL:
                raise self._fatal(what, err) from exc
            raise KafkaOperationError.wrap(what, err) from exc
        self._init_due = False

    def ensure_initialised(self, stop: threading.Event | None = None) -> None:
        """Initialise a re-created producer (see :meth:`_renew`, :meth:`abandon`). A replay
        calls this before it reads the committed offsets: once the new epoch is in place the
        old producer's transaction is either committed (its offsets are read) or aborted,
        never committed after the read."""
        if self._init_due:
            self.init(stop)

    @contextlib.contextmanager
    def transaction(
        self, offsets: Sequence[TopicPartition], group_metadata: object
    ) -> Iterator[confluent_kafka.Producer]:
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
        self.ensure_initialised()
        producer = self.producer
        try:
            producer.begin_transaction()
            self._begun_at = time.monotonic()
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

    def finish(
        self,
        offsets: Sequence[TopicPartition],
        group_metadata: object,
        failed: Callable[[KafkaError], object] | None = None,
    ) -> None:
        """Send ``offsets`` and commit the transaction :meth:`body` began, or abort it
        (``failed(error)`` is called first: the abort can take long). Safe on another thread than
        the body's, once the body has returned."""
        try:
            # A timed-out call is not retried in place: the abort, and its EndTxn's own
            # timeout, decide sooner whether the transaction coordinator is gone.
            self._call(
                "sending offsets",
                self.producer.send_offsets_to_transaction,
                list(offsets),
                group_metadata,
                retry=_retry_in_place_unless_timed_out,
            )
            if self.abandoned:  # its caller was told it aborted: it must not commit now
                raise KafkaException(KafkaError(KafkaError._FENCED))
            self._end("committing", self.producer.commit_transaction)
            self._begun_at = None  # no transaction open: wedged() only counts a call's time
        except KafkaException as exc:
            if self.abandoned:  # its successor has taken over: nothing here is ours to do
                raise TransactionAborted(f"abandoned producer: {exc.args[0].str()}") from exc
            if failed is not None:
                failed(exc.args[0])
            self._abort(exc.args[0], exc)

    def stuck_for(self) -> float:
        """Seconds the call in progress has run (0 when none is running)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def wedged(self) -> bool:
        """Whether the call in progress should be abandoned (see :meth:`abandon`): it ran past
        :data:`WEDGED_AFTER_S`, or it ran :data:`DOOMED_CALL_MIN_S` in a transaction the
        broker has certainly aborted by now (its timeout plus :data:`DOOMED_MARGIN_S`)."""
        stuck, begun = self.stuck_for(), self._begun_at
        if stuck > WEDGED_AFTER_S:
            return True
        return (
            stuck > DOOMED_CALL_MIN_S
            and begun is not None
            and time.monotonic() - begun > TRANSACTION_TIMEOUT_MS / 1000 + DOOMED_MARGIN_S
        )

    def abandon(self) -> KafkaTransactions:
        """Leave this producer to the thread stuck in one of its calls, and return a
        successor with the same transactional id: its init (in its first body) bumps the
        epoch, which aborts the stuck transaction and fences its late requests."""
        self.abandoned = True
        begun = self._begun_at
        age = "" if begun is None else f" in a transaction {time.monotonic() - begun:.0f} s old"
        log.warning(
            "%s: a transactional call on %s has not returned in %.0f s%s, past its "
            "%.0f s timeout or the transaction's %d ms (librdkafka #5456, #5511); "
            "re-creating the producer: its new epoch aborts the stuck transaction",
            self.who,
            self.transactional_id,
            self.stuck_for(),
            age,
            TXN_CALL_TIMEOUT_S,
            TRANSACTION_TIMEOUT_MS,
        )
        successor = KafkaTransactions(
            self._source_conf,
            self.transactional_id,
            who=self.who,
            every_delivery=self.every_delivery,
        )
        successor.renewals = self.renewals + 1
        successor._init_due = True
        return successor

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
    def _call(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        deadline_s: float | None = None,
        stop: threading.Event | None = None,
        retry: Callable[[BaseException], bool] = _retry_in_place,
    ) -> None:
        """``fn(*args, timeout)``; an error ``retry`` accepts (by default every RETRY one)
        calls it again until ``deadline_s`` (default ``RETRY_DEADLINE_S``) or ``stop``."""
        deadline_s = RETRY_DEADLINE_S if deadline_s is None else deadline_s
        try:
            self._timed(fn, *args, TXN_CALL_TIMEOUT_S)
            return
        except KafkaException as exc:
            # Outside the policy first: the hot path pays no tenacity bookkeeping.
            if not retry(exc):
                raise
            log.warning(
                "%s: %s %s (retriable); retrying for up to %.0f s",
                self.who,
                what,
                exc.args[0].str(),
                deadline_s,
            )
        policy = retrying(deadline_s, stop).copy(retry=retry_if_exception(retry))
        policy(self._timed, fn, *args, TXN_CALL_TIMEOUT_S)

    def _timed(self, fn: Callable[..., Any], *args: Any) -> None:
        # What stuck_for() reads from another thread: one float, written here only.
        self._busy_since = time.monotonic()
        try:
            fn(*args)
        finally:
            self._busy_since = None

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
            self._renew(f"{what} timed out", err)
            raise TransactionAborted(
                f"{what} timed out ({err.str()}); the transactional producer was re-created"
            ) from exc

    def renew(self, why: str) -> None:
        """Re-create this producer while no call of it runs: after its sibling's call wedged
        (see :meth:`abandon`), this one's librdkafka likely holds the same stale coordinator,
        and its next transaction would wedge in turn."""
        self._renew(why, None)

    def _renew(self, what: str, err: KafkaError | None) -> None:
        if self.abandoned:
            return  # its successor's epoch already fences this producer
        log.warning(
            "%s: %s%s; re-creating transactional producer %s: its new epoch "
            "fences the old one's late requests",
            self.who,
            what,
            "" if err is None else f" ({err.str()})",
            self.transactional_id,
        )
        with contextlib.suppress(KafkaException, RuntimeError):
            self.producer.purge(in_queue=True, in_flight=True, blocking=False)
        self.producer = confluent_kafka.Producer(self._conf)
        self.renewals += 1
        # Initialised by the replay or the next body(), on the caller's thread and its retry
        # policy: an init can wait minutes (CONCURRENT_TRANSACTIONS until the old abort's
        # markers are written, e.g. below min ISR), longer than a commit may take.
        self._init_due = True

    def _fatal(self, what: str, err: KafkaError) -> FatalKafkaError:
        self._broken = True
        return FatalKafkaError(
            f"{self.who}: {what}: {err.str()} (fatal: fenced by another instance with "
            f"transactional.id {self.transactional_id}, or the producer broke)",
            err,
        )

    def _outlived_its_timeout(self) -> bool:
        """Whether the open transaction is older than transaction.timeout.ms: the broker has
        aborted it and bumped the epoch (a frozen or dying broker), and librdkafka reports
        what follows as fatal (fenced, invalid state). No twin is implied: a twin fences a
        fresh transaction."""
        return (
            self._begun_at is not None
            and time.monotonic() - self._begun_at > TRANSACTION_TIMEOUT_MS / 1000
        )

    def _fenced_or_fatal(self, what: str, err: KafkaError) -> RmqError:
        """The error to raise for a fatal ``err``: a replay on a new producer when the
        transaction outlived its timeout or the producer broke without a twin fencing it,
        else FatalKafkaError."""
        if self._outlived_its_timeout():
            why = (
                f"{what} failed after the transaction outlived its "
                f"{TRANSACTION_TIMEOUT_MS} ms timeout"
            )
        elif err.code() not in TWIN_CODES:
            why = f"{what} failed: the producer broke (no newer instance fenced it)"
        else:
            return self._fatal(what, err)
        self._renew(why, err)
        return TransactionAborted(f"{what}: {err.str()}; the transactional producer was re-created")

    def _abort(self, err: KafkaError, exc: BaseException) -> NoReturn:
        if triage(err) is TxnErrorKind.FATAL:
            raise self._fenced_or_fatal("transaction", err) from exc
        log.warning(
            "%s: transaction failed (%s); aborting and replaying from committed offsets",
            self.who,
            err.str(),
        )
        try:
            self._end("aborting", self.producer.abort_transaction)
        except KafkaException as abort_exc:
            # The transaction's state is unknown: only a new epoch (a new producer, or a
            # restart) is safe.
            raise self._fenced_or_fatal("aborting", abort_exc.args[0]) from abort_exc
        raise TransactionAborted(err.str()) from exc


class CommitThread:
    """Runs commits one at a time on a daemon thread. A call stuck inside librdkafka must
    block neither the next transaction (which runs on a new CommitThread, see
    :meth:`KafkaTransactions.abandon`) nor the process's exit, as an executor's thread would."""

    _STOP = object()

    def __init__(self, name: str = "rmq-commit") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future

    def wait(self, future: concurrent.futures.Future, txn: KafkaTransactions) -> bool:
        """Wait for ``future`` (a commit on ``txn``): True once it is done, False when one of
        ``txn``'s calls is wedged (:meth:`KafkaTransactions.wedged`; the caller abandons it)."""
        while True:
            try:
                future.exception(timeout=1.0)
                return True
            except concurrent.futures.TimeoutError:
                if txn.wedged():
                    return False

    def close(self, timeout: float) -> None:
        """Idempotent; the job running finishes first, for up to ``timeout`` seconds."""
        self._jobs.put(self._STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not self._STOP:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the waiter, as an executor does
                future.set_exception(exc)


def transactional_loop(
    who: str,
    step: Callable[[], object],
    replay: Callable[[], object],
    stop: threading.Event,
    *more_stops: threading.Event,
) -> None:
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
            log.warning(
                "%s: %s; replaying from committed offsets in %.1f s", who, exc, RETRY_PAUSE_S
            )
            replay_due = True
            stop.wait(RETRY_PAUSE_S)
