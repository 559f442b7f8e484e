"""Offset commits, each checked against the queue lock its batch ran under.

A worker does not wait for its batch's commit: it leaves the offset with its queue and goes
on, and the poll thread commits every queue's offset in one asynchronous request between
polls, at most every :data:`COMMIT_INTERVAL_S`, each checked against its lock right before
(like RocketMQ's offset store, with a shorter period). A crash between a batch and that
commit redelivers the batch to the next holder, in order. Revocation and shutdown commit
synchronously. Every commit carries ``client:epoch`` as metadata; in key mode the done
offsets above the committed one go in front of it (see :mod:`~rmq_semantics.orderly.offsets`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rmq_semantics.errors import CommitRefusedError, LockLostError, RmqError
from rmq_semantics.orderly.calls import ConsumerCalls
from rmq_semantics.orderly.offsets import compose_metadata, split_metadata
from rmq_semantics.orderly.runtime import WAIT_SLICE_S, LiveQueue, QueueRegistry, event
from rmq_semantics.retry import retrying

__all__ = ["COMMIT_INTERVAL_S", "REBALANCE_CODES", "Commits"]

log = logging.getLogger(__name__)

# At most one asynchronous commit round this often: at full speed the poll loop turns about
# a thousand times a second, and a commit per turn was a request the broker (and
# librdkafka's main thread) had to serve each time. A crash redelivers at most this much
# more; revocation and shutdown still commit at once.
COMMIT_INTERVAL_S = 0.05

#: A commit refused with these while the group rebalances is expected, and retried.
REBALANCE_CODES = frozenset({KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION})


def _epoch_of(metadata: str | None) -> int:
    """The lock epoch in a commit's metadata ("client:epoch"); -1 when there is none."""
    try:
        return int((metadata or "").rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


class Commits:
    """The commit side of every queue: record processed offsets, send, book the outcome."""

    def __init__(
        self,
        client_id: str,
        queues: QueueRegistry,
        calls: ConsumerCalls,
        user_on_commit: Callable[..., Any] | None = None,
    ) -> None:
        self.client_id = client_id
        self._queues = queues
        self._calls = calls
        self._user_on_commit = user_on_commit
        self._retry_at = 0.0  # poll thread: no commit round before this (refused)
        self._next_round = 0.0  # poll thread: no commit round before this (cadence)

    def may_commit(self, q: LiveQueue, epoch: int) -> str | None:
        """None when a batch that started under ``epoch`` may be committed now; else why not."""
        with q.cv:
            return q.state.may_commit(epoch, time.monotonic())

    def processed(self, q: LiveQueue, offset: int, epoch: int, done: str = "") -> None:
        """The batch up to ``offset`` is done (and ``done``, key mode's done offsets above it):
        the worker goes on with the next one while the poll thread commits (see flush).
        Checked here, and again before the commit."""
        with q.cv:
            reason = q.state.may_commit(epoch, time.monotonic())
            if reason is None:
                q.state.processed(offset, epoch, done)
                return
        self._skip(q, offset, epoch, reason)  # the batch stays in flight

    # -- the poll thread's asynchronous round ------------------------------------------------
    def flush(self, consumer: confluent_kafka.Consumer) -> None:
        """Send every queue's processed offset in one asynchronous commit, each checked
        against its lock right before (a lapsed or lost lock drops it: the holder redoes
        the batch). The outcome comes back in on_commit; a refused commit stays pending and
        is sent again on a later round."""
        now = time.monotonic()
        if now < self._retry_at or now < self._next_round:
            return
        batch: list[tuple[LiveQueue, int, int, str]] = []
        for q in self._queues.all():
            with q.cv:
                due = q.state.commit_due()
                if due is None:
                    continue
                offset, epoch = due
                done = q.state.pending_done
                reason = q.state.may_commit(epoch, time.monotonic())
            if reason is not None:
                self._skip(q, offset, epoch, reason)
            else:
                batch.append((q, offset, epoch, done))
        if not batch:
            return
        self._next_round = now + COMMIT_INTERVAL_S
        tps = [
            TopicPartition(q.tp[0], q.tp[1], offset, metadata=self._metadata(epoch, done))
            for q, offset, epoch, done in batch
        ]
        try:
            consumer.commit(offsets=tps, asynchronous=True)
        except KafkaException as exc:
            log.warning(
                "orderly consumer %s: commit not sent (%s); retrying",
                self.client_id,
                exc.args[0].str(),
            )
            self._retry_at = time.monotonic() + WAIT_SLICE_S
            return
        for q, offset, epoch, done in batch:
            with q.cv:
                q.state.commit_sent, q.state.sent_done = offset, done
            if log.isEnabledFor(logging.DEBUG):  # sent under a lease checked just above
                log.debug(
                    "commit sent %s@%d epoch=%d",
                    q.where,
                    offset,
                    epoch,
                    extra=event(
                        "commit_sent", topic=q.tp[0], partition=q.tp[1], offset=offset, epoch=epoch
                    ),
                )

    def on_commit(self, err: KafkaError | None, partitions: list) -> None:
        """librdkafka's commit outcome (poll thread, inside consume()); then the caller's own
        ``on_commit``, if its conf had one."""
        if self._user_on_commit is not None:
            try:
                self._user_on_commit(err, partitions)
            except Exception:  # the caller's bug must not stop our bookkeeping
                log.exception("orderly consumer %s: on_commit callback raised", self.client_id)
        for tp in partitions:
            q = self._queues.get((tp.topic, tp.partition))
            error = tp.error or err
            if q is None:
                continue
            if error is None:
                self._done(q, tp.offset, _epoch_of(tp.metadata), split_metadata(tp.metadata)[0])
                continue
            with q.cv:
                q.state.commit_failed(tp.offset)
            level = logging.INFO if error.code() in REBALANCE_CODES else logging.WARNING
            log.log(level, "commit %s@%d failed (%s); retrying", q.where, tp.offset, error.str())
            self._retry_at = time.monotonic() + WAIT_SLICE_S

    # -- synchronous commits (revocation, shutdown) -------------------------------------------
    def commit_pending(self, q: LiveQueue, retry_for: float = 0.0) -> None:
        """Commit a processed batch whose commit is still pending; retry for ``retry_for`` s
        (only while the lock holds: a lost lock clears the pending commit)."""
        # A refused commit is retried while the lock holds; a lost lock ends it at once (not
        # retriable): the batch stays uncommitted and the new holder redoes it.
        with contextlib.suppress(CommitRefusedError, LockLostError):
            for attempt in retrying(retry_for):
                with attempt:
                    with q.cv:
                        pending, epoch = q.state.pending_commit, q.state.pending_epoch
                        done = q.state.pending_done
                    if pending is not None and not self._commit(q, pending, epoch, done):
                        with q.cv:
                            if q.state.pending_commit is not None:
                                raise CommitRefusedError(f"commit of {q.where}@{pending} refused")

    def _metadata(self, epoch: int, done: str) -> str:
        return compose_metadata(done, f"{self.client_id}:{epoch}")

    def _commit(self, q: LiveQueue, offset: int, epoch: int, done: str = "") -> bool:
        """Commit ``offset`` now if the lock of ``epoch`` still holds (else LockLostError); a
        refused commit stays pending."""
        reason = self.may_commit(q, epoch)
        if reason is not None:
            self._skip(q, offset, epoch, reason)
            raise LockLostError(f"not committing {q.where}@{offset}: {reason} (epoch {epoch})")
        where = f"{q.where}@{offset}"
        tp = TopicPartition(q.tp[0], q.tp[1], offset, metadata=self._metadata(epoch, done))

        def commit(consumer: confluent_kafka.Consumer) -> None:
            result = consumer.commit(offsets=[tp], asynchronous=False)
            err = next((r.error for r in result or [] if r.error is not None), None)
            if err is not None:
                raise KafkaException(err)

        try:
            self._calls.submit(commit, f"committing {where}")
        except (RmqError, KafkaException, RuntimeError) as exc:
            detail = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            code = exc.args[0].code() if isinstance(exc, KafkaException) else None
            level = logging.INFO if code in REBALANCE_CODES else logging.WARNING
            log.log(level, "commit %s failed (%s); retrying", where, detail)
            return False
        self._done(q, offset, epoch, done)
        return True

    # -- bookkeeping ---------------------------------------------------------------------------
    def _skip(self, q: LiveQueue, offset: int, epoch: int, reason: str) -> None:
        log.warning(
            "not committing %s@%d: %s (epoch %d); the holder will redo the batch",
            q.where,
            offset,
            reason,
            epoch,
            extra=event(
                "commit_skipped",
                topic=q.tp[0],
                partition=q.tp[1],
                offset=offset,
                epoch=epoch,
                reason=reason,
            ),
        )
        with q.cv:
            q.state.commit_skipped(offset)

    def _done(self, q: LiveQueue, offset: int, epoch: int, done: str = "") -> None:
        with q.cv:
            q.state.commit_done(offset, done)
        log.debug(
            "committed %s@%d epoch=%d",
            q.where,
            offset,
            epoch,
            extra=event("committed", topic=q.tp[0], partition=q.tp[1], offset=offset, epoch=epoch),
        )
