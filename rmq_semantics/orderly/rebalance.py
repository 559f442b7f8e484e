"""Rebalances: partitions assigned, revoked or lost (callbacks on the poll thread).

Assignment uses ``cooperative-sticky``: only partitions that move are revoked, so the other
queues keep their locks and go on in order during a rebalance (an eager rebalance would
stop, commit and unlock every queue of every member). On revocation the in-flight batch
finishes, its offset is committed, then the lock is released (in ``finally``); a *lost*
partition (session expired) is dropped and never committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import confluent_kafka

from rmq_semantics.orderly.calls import ConsumerCalls
from rmq_semantics.orderly.commits import Commits
from rmq_semantics.orderly.leases import LeaseKeeper
from rmq_semantics.orderly.runtime import LiveQueue, QueueRegistry
from rmq_semantics.topics import SystemPartitionFilter

__all__ = ["Rebalance"]

log = logging.getLogger(__name__)

# Revocation waits for the in-flight batch at most this long (and never past the lease:
# after that the batch could not commit anyway).
REVOKE_WAIT_CAP_S = 30.0
# Revocation retries a refused commit (a rebalance starting again) this long.
COMMIT_RETRY_FOR_S = 2.0
# While revocation waits for a batch on the poll thread, the workers' consumer calls run
# this often (the batch may need one to finish).
AWAIT_SLICE_S = 0.005


class Rebalance:
    """The rebalance callbacks and the release of queues (also used by shutdown)."""

    def __init__(
        self,
        *,
        client_id: str,
        queues: QueueRegistry,
        calls: ConsumerCalls,
        commits: Commits,
        leases: LeaseKeeper,
        worker: Callable[[LiveQueue], None],
        stopping: threading.Event,
        system: SystemPartitionFilter,
        incremental: bool,
    ) -> None:
        self.client_id = client_id
        self.system = system
        self._incremental = incremental
        self._queues = queues
        self._calls = calls
        self._commits = commits
        self._leases = leases
        self._worker = worker
        self._stopping = stopping

    def on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        # System-topic partitions a pattern matched get no queue, no lock, no fetch.
        partitions = self.system.keep(partitions)
        try:
            added = self._queues.add(
                [(tp.topic, tp.partition) for tp in partitions],
                self._worker,
                idle=self._stopping.is_set(),
            )
            for q in added:
                if q.thread is not None:
                    q.thread.start()
            if added:
                log.info(
                    "orderly consumer %s assigned %s", self.client_id, [q.where for q in added]
                )
                self._leases.wake()
        finally:
            # Assigned here: left to itself the client would assign the system ones too.
            if self._incremental:
                consumer.incremental_assign(partitions)
            else:
                consumer.assign(partitions)

    def on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        self._revoked(consumer, partitions, lost=False)

    def on_lost(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        self._revoked(consumer, partitions, lost=True)

    def _revoked(self, consumer: confluent_kafka.Consumer, partitions: list, lost: bool) -> None:
        partitions = self.system.release(partitions)
        try:
            self.release(self._take(partitions), lost=lost)
        finally:
            # Only what was assigned (the client would unassign the left-out ones too).
            if self._incremental:
                consumer.incremental_unassign(partitions)
            else:
                consumer.unassign()

    def _take(self, partitions: list) -> list[LiveQueue]:
        return [
            q for tp in partitions if (q := self._queues.get((tp.topic, tp.partition))) is not None
        ]

    def release(self, queues: list[LiveQueue], lost: bool) -> None:
        """Revocation: finish the in-flight batch, commit, then unlock (finally). A lost
        partition is dropped at once and never committed (someone else may own it)."""
        if not queues:
            return
        for q in queues:
            with q.cv:
                if lost:
                    q.state.lose()
                else:
                    q.state.revoke()
                q.cv.notify_all()
        finished: list[LiveQueue] = []
        try:
            for q in queues:
                if lost:
                    self._drop(q)
                    continue
                with q.cv:
                    wait = min(REVOKE_WAIT_CAP_S, max(0.0, q.state.deadline - time.monotonic()))
                if self._await_batch(q, wait):
                    try:
                        self._commits.commit_pending(q, retry_for=COMMIT_RETRY_FOR_S)
                        finished.append(q)
                    finally:
                        self._drop(q)
                        q.consume_lock.release()
                else:
                    self._drop(q)
                    log.warning(
                        "%s: batch still in the listener at revocation; not "
                        "unlocking (the lease will lapse)",
                        q.where,
                    )
        finally:
            # Also queues whose first grant is still in flight: unlock is by client id.
            if finished:
                self._leases.unlock(finished)
            log.info(
                "orderly consumer %s %s %s",
                self.client_id,
                "lost" if lost else "released",
                [q.where for q in queues],
            )

    def _await_batch(self, q: LiveQueue, wait: float) -> bool:
        """Acquire ``q.consume_lock`` within ``wait`` s. On the poll thread, keep running the
        workers' consumer calls meanwhile: the in-flight batch needs them to commit."""
        deadline = time.monotonic() + wait
        on_poll_thread = threading.current_thread() is self._calls.thread
        consumer = self._calls.consumer
        while True:
            if q.consume_lock.acquire(timeout=AWAIT_SLICE_S if on_poll_thread else wait):
                return True
            if on_poll_thread and consumer is not None:
                self._calls.run_pending(consumer)
            if not on_poll_thread or time.monotonic() >= deadline:
                return False

    def _drop(self, q: LiveQueue) -> None:
        with q.cv:
            q.state.drop()
            q.cv.notify_all()
        self._queues.remove(q)
