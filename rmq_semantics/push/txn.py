"""The push consumer's transactional producer, its calls run behind a watchdog.

Two campaign faults ended consuming for good (seeds 1 and 2, issue 30):

- a transactional call that ignores its timeout (librdkafka #5456, #5511: it can wait
  forever for a coordinator that left) held the poll thread until shutdown;
- an abort that failed fatally (INVALID_TXN_STATE) left the dead producer in place, and the
  next ``begin_transaction`` on it never returned. confluent-kafka calls that one without
  releasing the GIL and librdkafka waits for its main thread without a timeout: the whole
  process froze.

A third (issue 35, all brokers frozen past a call's timeout): a commit timed out, and the
abort that followed was refused while that commit was pending (_CONFLICT), on every round
after; the consumer never committed again. A commit that timed out, or an abort that failed,
leaves the transaction's outcome unknown: the producer is re-created, as the coordinator's
``KafkaTransactions`` does.

So every transaction runs on a helper thread the poll thread waits on for a bounded time;
one past that bound is abandoned to its thread, and after a fatal error or an abandoned call
the producer is re-created before anything else is called on it. The caller replays from
the committed offsets (:class:`Renewed`): the new producer's init bumps the epoch, which
aborts the old open transaction, or it had committed and its offsets say so.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition

from rmq_semantics.message import produce_headers
from rmq_semantics.push.retry import OutRecord

__all__ = ["TXN_TIMEOUT_S", "PushProducer", "Renewed"]

log = logging.getLogger("rmq_semantics.push.poller")

TXN_TIMEOUT_S = 30.0  # each transactional call's own timeout


class Renewed(Exception):
    """The producer was re-created (a fatal error, a transaction whose outcome is unknown, or a
    call abandoned past its timeout): what the failed transaction held must be replayed from
    the committed offsets."""


class _Abandoned(Exception):
    """Raised on the helper thread once its transaction was given up: nothing more is sent."""


class _OutcomeUnknown(Exception):
    """Raised on the helper thread when a transaction may or may not have committed (a
    commit timed out, or its abort failed without a fatal error): the producer is re-created."""


class _CallThread:
    """One daemon thread running jobs in order. A job stuck in librdkafka keeps its thread
    (and its producer): a new producer gets a new thread, and the process can still exit."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn = job
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the waiting poll thread
                future.set_exception(exc)


class PushProducer:
    """The poll thread's transactional producer: :meth:`commit` writes copies and offsets in
    one transaction; ``renewals`` counts the producers re-created."""

    def __init__(self, factory: Callable[[], confluent_kafka.Producer], name: str) -> None:
        self._factory = factory
        self.name = name
        self.renewals = 0
        self._gen = 0
        self.producer = factory()
        self._init_due = True
        self._abandoned = threading.Event()  # set for the producer a stuck call keeps
        self._worker = _CallThread(f"rmq-push-txn-{name}-0")

    def init(self, wedged_after_s: float) -> None:
        """``init_transactions`` (fences an older instance); raises KafkaException, or
        :class:`Renewed` when it did not return in ``wedged_after_s``."""
        self._wait(
            self._worker.submit(self._init_job(self.producer, self._abandoned)),
            wedged_after_s,
            "initialising transactions",
        )

    def commit(
        self,
        copies: Sequence[OutRecord],
        offsets: list[TopicPartition],
        metadata: object,
        wedged_after_s: float,
    ) -> None:
        """Begin, produce ``copies``, send ``offsets``, commit. Raises KafkaException for a
        transaction failed and aborted (the caller owes its copies again) and
        :class:`Renewed` when the producer had to be re-created (the caller replays)."""
        producer, abandoned, init = self.producer, self._abandoned, self._init_job

        def job() -> None:
            if self._init_due:
                init(producer, abandoned)()
            self._transaction(producer, abandoned, copies, offsets, metadata)

        self._wait(self._worker.submit(job), wedged_after_s, "committing")

    def close(self, timeout: float) -> None:
        """Deliver what is queued, unless a call stuck in the producer still owns it."""
        self._worker.stop()
        if not self._abandoned.is_set():
            with contextlib.suppress(KafkaException, RuntimeError):
                self.producer.flush(timeout)

    # -- internals -------------------------------------------------------------------------
    def _init_job(
        self, producer: confluent_kafka.Producer, abandoned: threading.Event
    ) -> Callable[[], None]:
        def job() -> None:
            producer.init_transactions(TXN_TIMEOUT_S)
            if not abandoned.is_set():
                self._init_due = False

        return job

    def _transaction(
        self,
        producer: confluent_kafka.Producer,
        abandoned: threading.Event,
        copies: Sequence[OutRecord],
        offsets: list[TopicPartition],
        metadata: object,
    ) -> None:
        def step() -> None:
            if abandoned.is_set():  # its successor has taken over: commit nothing now
                raise _Abandoned

        committing = False
        try:
            step()
            producer.begin_transaction()
            for rec in copies:
                producer.produce(
                    rec.topic,
                    rec.value,
                    key=rec.key,
                    headers=produce_headers(rec.headers),
                    timestamp=rec.timestamp,
                )
            if offsets:
                step()
                producer.send_offsets_to_transaction(offsets, metadata, TXN_TIMEOUT_S)
            step()
            committing = True
            producer.commit_transaction(TXN_TIMEOUT_S)
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal():
                raise  # nothing more on this producer: it is re-created
            if committing and err.retriable() and not err.txn_requires_abort():
                # A timed-out commit goes on in the background and librdkafka refuses any
                # other call until the same commit is called again (_CONFLICT): its outcome
                # is unknown, and only a new epoch settles it.
                raise _OutcomeUnknown(f"committing: {err}") from exc
            step()
            try:
                producer.abort_transaction(TXN_TIMEOUT_S)
            except KafkaException as abort_exc:
                if abort_exc.args[0].fatal():
                    raise abort_exc from exc  # re-created: its next begin would never return
                # Timed out, or refused while an earlier call is pending (_CONFLICT, _STATE):
                # the transaction is still open on this producer, and stays so.
                raise _OutcomeUnknown(f"aborting after {err}: {abort_exc.args[0]}") from exc
            raise

    def _wait(self, future: concurrent.futures.Future, wedged_after_s: float, what: str) -> None:
        try:
            future.result(timeout=wedged_after_s)
        except concurrent.futures.TimeoutError:
            log.warning(
                "push consumer %s: %s has not returned in %.0f s, past its %.0f s "
                "timeout (librdkafka #5456, #5511); abandoning the producer to it "
                "and re-creating it: its new epoch aborts the stuck transaction",
                self.name,
                what,
                wedged_after_s,
                TXN_TIMEOUT_S,
            )
            self._renew(flush=False)
            raise Renewed(f"{what} did not return in {wedged_after_s:.0f} s") from None
        except _OutcomeUnknown as exc:
            log.warning(
                "push consumer %s: %s: the transaction's outcome is unknown; re-creating "
                "the transactional producer (its new epoch aborts it unless it committed)",
                self.name,
                exc,
            )
            self._renew(flush=True)
            raise Renewed(str(exc)) from exc
        except KafkaException as exc:
            if not exc.args[0].fatal():
                raise
            log.warning(
                "push consumer %s: %s failed fatally (%s); re-creating the transactional producer",
                self.name,
                what,
                exc.args[0],
            )
            self._renew(flush=True)
            raise Renewed(f"{what}: {exc.args[0]}") from exc

    def _renew(self, *, flush: bool) -> None:
        old = self.producer
        self._abandoned.set()  # the old job, stuck or done, commits nothing more
        if flush:
            # The dead producer's flush raises its fatal error; flushing serves its queued
            # log lines (librdkafka's TXNERR/FATAL) first.
            with contextlib.suppress(KafkaException, RuntimeError):
                old.flush(0)
        else:  # its thread is stuck in it: leave both, start anew
            self._worker.stop()
            self._gen += 1
            self._worker = _CallThread(f"rmq-push-txn-{self.name}-{self._gen}")
        self._abandoned = threading.Event()
        self.producer = self._factory()
        self._init_due = True
        self.renewals += 1
