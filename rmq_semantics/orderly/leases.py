"""Lease renewal: the lock thread.

A partition is processed only while this consumer holds the coordinator's queue lock for
(group, topic, partition). The lock thread takes and renews the locks of every assigned
partition in one batch request (RocketMQ's ``lockBatchMQ``) and keeps this consumer's own,
shorter view of each lease (see :mod:`rmq_semantics.lock_client`). A new epoch re-reads the
committed offset before anything is processed, so work resumes exactly where the previous
holder committed.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaException, TopicPartition

from rmq_semantics.errors import RmqError
from rmq_semantics.lock_client import LockClient, LockGrant
from rmq_semantics.orderly.calls import ConsumerCalls
from rmq_semantics.orderly.queue import LIVE
from rmq_semantics.orderly.runtime import (
    COMMIT_TIMEOUT_S,
    LOCK_TIMEOUT_S,
    LiveQueue,
    QueueRegistry,
    event,
)

__all__ = ["LeaseKeeper"]

log = logging.getLogger(__name__)

# A partition without a lock is asked for again this often (a lapsed lease elsewhere
# becomes ours within this); held locks are renewed every lock_renew_ms.
LOCK_RETRY_S = 0.5


class LeaseKeeper:
    """Takes, renews and releases the queue locks of this consumer's queues."""

    def __init__(
        self,
        lock_client: LockClient,
        *,
        group: str,
        client_id: str,
        lease_ms: int,
        renew_ms: int,
        queues: QueueRegistry,
        calls: ConsumerCalls,
    ) -> None:
        self.group = group
        self.client_id = client_id
        self._lock_client = lock_client
        self._lease_ms = lease_ms
        self._renew_ms = renew_ms
        self._queues = queues
        self._calls = calls
        # Held around every lock/unlock round trip, so an unlock is never overtaken by a
        # lock request for the same queue from the lock thread.
        self._round_trip = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()

    def wake(self) -> None:
        """Ask for locks now (new queues were assigned)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        next_renew = 0.0
        lease_s = self._lease_ms / 1000
        timeout = min(LOCK_TIMEOUT_S, self._renew_ms / 1000)
        while not self._stop.is_set():
            self._wake.clear()  # before the snapshot: a later assignment wakes us
            now = time.monotonic()
            renew_all = now >= next_renew
            due: list[LiveQueue] = []
            grants: dict[tuple[str, int], LockGrant] = {}
            # Held by an unlock on revocation for at most one round trip.
            if self._round_trip.acquire(timeout=LOCK_TIMEOUT_S + 1):
                try:
                    queues = [q for q in self._queues.all() if q.state.phase in LIVE]
                    due = [q for q in queues if renew_all or not q.state.lease_ok(now)]
                    if due:
                        grants = self._lock_client.lock(
                            self.group, [q.tp for q in due], self._lease_ms, timeout=timeout
                        )
                except RmqError as exc:
                    log.warning("orderly consumer %s: lock request failed: %s", self.client_id, exc)
                finally:
                    self._round_trip.release()
            if renew_all:
                # A round that went unanswered (coordinator down or taking over) is retried
                # soon, not a renew interval later: the lease keeps running meanwhile.
                answered = all(
                    (g := grants.get(q.tp)) is not None and (g.granted or g.epoch >= 0) for q in due
                )
                next_renew = now + (self._renew_ms / 1000 if answered else LOCK_RETRY_S)
            for q in due:
                self._apply(q, grants.get(q.tp))
            unheld = any(not q.state.lease_ok(time.monotonic()) for q in self._queues.all())
            wait = max(0.0, next_renew - time.monotonic())
            if unheld:
                wait = min(wait, LOCK_RETRY_S)
            self._wake.wait(min(wait, lease_s))

    def _apply(self, q: LiveQueue, grant: LockGrant | None) -> None:
        """One queue's answer: granted (maybe a new epoch: align), denied, or none."""
        if grant is None:
            return  # unanswered: the lease keeps running until asked again
        align = False
        with q.cv:
            st = q.state
            if grant.granted:
                fresh = st.grant(grant.epoch, grant.expires)
                align = fresh and st.aligned_epoch != grant.epoch
            elif grant.epoch >= 0:
                # Denied: someone else holds it (or our lease lapsed and it was taken over).
                fresh = False
                if st.deny():
                    log.warning(
                        "%s: lock lost (now held with epoch %d)",
                        q.where,
                        grant.epoch,
                        extra=event("lock_lost", topic=q.tp[0], partition=q.tp[1], epoch=st.epoch),
                    )
            else:
                fresh = False
            q.cv.notify_all()
        if fresh:
            log.info(
                "%s locked by %s with epoch %d",
                q.where,
                self.client_id,
                grant.epoch,
                extra=event("lock_granted", topic=q.tp[0], partition=q.tp[1], epoch=grant.epoch),
            )
        if align:
            self._align(q, grant.epoch)

    def _align(self, q: LiveQueue, epoch: int) -> None:
        """After a new grant: resume exactly at the committed offset (the previous holder
        may have committed past what we fetched, or we may hold work it redid)."""
        try:
            [tp] = self._calls.submit(
                lambda c: c.committed([TopicPartition(*q.tp)], timeout=COMMIT_TIMEOUT_S),
                f"reading the committed offset of {q.where}",
            )
        except (RmqError, KafkaException, RuntimeError, ValueError) as exc:
            log.warning("%s: reading the committed offset failed (%s); retrying", q.where, exc)
            with q.cv:
                q.state.align_failed()  # asked for again on the next lock round
            return
        with q.cv:
            if q.state.align(epoch, tp.offset, tp.metadata):
                q.cv.notify_all()

    def unlock(self, queues: list[LiveQueue]) -> None:
        """Release these queues' locks (revocation), with the epochs they were held under."""
        epochs = {q.tp: q.state.epoch for q in queues if q.state.held}
        # The lock thread holds this for at most one lock round trip.
        if not self._round_trip.acquire(timeout=LOCK_TIMEOUT_S + 1):
            log.warning(
                "orderly consumer %s: lock thread busy; not unlocking %s (the leases will lapse)",
                self.client_id,
                [q.where for q in queues],
            )
            return
        try:
            self._lock_client.unlock(
                self.group, [q.tp for q in queues], epochs=epochs, timeout=LOCK_TIMEOUT_S
            )
        except RmqError as exc:
            log.warning(
                "orderly consumer %s: unlock failed (%s); the leases will lapse",
                self.client_id,
                exc,
            )
        finally:
            self._round_trip.release()
