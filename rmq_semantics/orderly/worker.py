"""The per-partition workers: one thread per assigned queue hands its messages to the
listener in offset order, one batch at a time, only while the queue is runnable (aligned
under a live lease, see :meth:`QueueState.runnable`); partitions run in parallel.

A suspended batch (or one whose listener raised or returned something else) is handed over
again after ``context.suspend_ms``; once retried ``max_reconsume_times`` times (-1: forever)
it is dead-lettered and the queue moves on. With ``context.auto_commit`` False (RocketMQ's
``ConsumeMessageOrderlyService``): SUCCESS keeps the batch uncommitted, COMMIT commits up to
it, ROLLBACK hands everything since the last commit over again after ``suspend_ms`` (not
counted as a reconsume, as in RocketMQ).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rmq_semantics.orderly.api import (
    DEFAULT_SUSPEND_MS,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    OrderlyMessage,
)
from rmq_semantics.orderly.commits import Commits
from rmq_semantics.orderly.dlq import DeadLetters, Failure
from rmq_semantics.orderly.runtime import WAIT_SLICE_S, LiveQueue
from rmq_semantics.tags import TagFilter

__all__ = ["Worker"]

log = logging.getLogger(__name__)

SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
SUCCESS = ConsumeOrderlyStatus.SUCCESS
ROLLBACK = ConsumeOrderlyStatus.ROLLBACK
ACKS = frozenset({SUCCESS, ConsumeOrderlyStatus.COMMIT, ROLLBACK})


class Worker:
    """What every worker thread runs (:meth:`run` is the thread's target)."""

    def __init__(
        self,
        listener: Callable[..., Any],
        *,
        batch_size: int,
        max_reconsume_times: int,
        commits: Commits,
        dead_letters: DeadLetters,
    ) -> None:
        self._listener = listener
        self.batch_size = batch_size
        self.max_reconsume_times = max_reconsume_times
        self._commits = commits
        self._dead_letters = dead_letters
        self.tag_filter = TagFilter()  # set by OrderlyConsumer.subscribe

    def run(self, q: LiveQueue) -> None:
        st = q.state
        while True:
            with q.cv:
                while True:
                    if st.gone:
                        return
                    now = time.monotonic()
                    if st.runnable(now):
                        break
                    wait = WAIT_SLICE_S
                    if now < st.suspended_until:
                        wait = min(wait, st.suspended_until - now)
                    q.cv.wait(wait)
            # Held by revocation, or by a previous assignment's batch still in the listener.
            if not q.consume_lock.acquire(timeout=WAIT_SLICE_S):
                continue
            try:
                self._consume(q)
            except Exception:  # a bug in one queue must not kill its thread silently
                log.exception("%s: orderly worker error", q.where)
                with q.cv:
                    st.suspend(time.monotonic() + DEFAULT_SUSPEND_MS / 1000, retried=False)
            finally:
                q.consume_lock.release()

    def run_inline(self, q: LiveQueue, until: float) -> bool:
        """The poll thread's fast path: batches of ``q`` on the calling thread, as its
        worker would run them, under the same consume lock, until ``until`` (a
        ``time.monotonic()`` instant, checked between batches). False, with nothing done,
        when the queue's worker holds the lock; then the worker goes on with it."""
        if not q.consume_lock.acquire(blocking=False):
            return False
        try:
            self._consume(q, until)
        except Exception:  # as in run(): suspend the queue, keep the poll thread alive
            log.exception("%s: orderly worker error", q.where)
            with q.cv:
                q.state.suspend(time.monotonic() + DEFAULT_SUSPEND_MS / 1000, retried=False)
        finally:
            q.consume_lock.release()
        return True

    def _consume(self, q: LiveQueue, until: float | None = None) -> None:
        """Batch after batch while the queue stays runnable, under one hold of its consume
        lock: revocation and shutdown make it unrunnable (under ``q.cv``) and then wait for
        that lock, so they wait for the batch in flight only, as with one batch per hold.
        ``until``: stop there (the poll thread's turn, see :meth:`run_inline`)."""
        st = q.state
        while True:
            with q.cv:
                now = time.monotonic()
                if st.gone or not st.runnable(now) or (until is not None and now >= until):
                    return
                epoch = st.epoch
                batch = st.next_batch(self.batch_size)
                if not self.tag_filter.keeps_all:
                    batch = self._matching(st, batch)
            if not batch:  # the tag filter left out the whole batch: commit past it
                continue
            context = ConsumeOrderlyContext(q.tp[0], q.tp[1], epoch)
            status, reason, error = self._call_listener(batch, context)
            if status in ACKS and not context.auto_commit:
                if status is ROLLBACK:
                    with q.cv:
                        st.rollback()
                        st.suspend(time.monotonic() + context.suspend_ms / 1000, retried=False)
                    return
                if status is SUCCESS:
                    with q.cv:
                        st.hold()
                    continue
            if status in ACKS:  # with auto_commit, COMMIT and ROLLBACK ack, as in RocketMQ
                self._commits.processed(q, batch[-1].offset + 1, epoch)
                continue
            with q.cv:  # what the batch's dead letter will say
                failure = st.failure = st.failure or Failure()
            failure.record(reason, error)
            retried = not 0 <= self.max_reconsume_times <= st.reconsume_times
            if not retried and self._dead_letter(q, batch, epoch, failure):
                self._commits.processed(q, batch[-1].offset + 1, epoch)
                continue
            with q.cv:
                st.suspend(time.monotonic() + context.suspend_ms / 1000, retried=retried)
            return

    def _matching(self, st: Any, batch: list[OrderlyMessage]) -> list[OrderlyMessage]:
        """The batch's messages the tag filter keeps (``q.cv`` held). A batch it leaves out
        whole is settled here: committed past, or held with the uncommitted ones."""
        kept = [m for m in batch if self.tag_filter.matches(m.headers)]
        if kept:
            return kept
        if st.uncommitted:  # auto_commit off: the next COMMIT covers it
            st.hold()
        else:
            st.processed(batch[-1].offset + 1, st.epoch)
        return []

    def _dead_letter(
        self, q: LiveQueue, batch: list[OrderlyMessage], epoch: int, failure: Failure
    ) -> bool:
        reason = self._commits.may_commit(q, epoch)  # a deposed holder must not move on
        if reason is not None:
            log.warning("%s: not dead-lettering: %s", batch[0].where, reason)
            return False
        return self._dead_letters.send(batch, epoch, failure)

    def _call_listener(
        self, batch: list[OrderlyMessage], context: ConsumeOrderlyContext
    ) -> tuple[ConsumeOrderlyStatus, str, Exception | None]:
        """The listener's status, and for a failed call why (a DLQ reason) and its error."""
        try:
            status = self._listener(batch, context)
        except Exception as exc:
            log.warning(
                "%s: listener raised %r; suspending the queue for %d ms",
                batch[0].where,
                exc,
                context.suspend_ms,
            )
            return SUSPEND, "raised", exc
        if not isinstance(status, ConsumeOrderlyStatus):
            log.warning(
                "%s: listener returned %r, not a ConsumeOrderlyStatus; suspending",
                batch[0].where,
                status,
            )
            return SUSPEND, "bad_status", None
        return status, "suspended", None
