"""What the orderly consumer's threads share: the assigned queues and the timing constants.

Threads: one poll thread owns the ``confluent_kafka.Consumer`` (every consumer call runs
there), one lock thread renews the queue locks, one worker per assigned partition.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Any

from rmq_semantics.orderly.api import kafka_views
from rmq_semantics.orderly.queue import QueueState

__all__ = [
    "COMMIT_TIMEOUT_S",
    "LOCK_TIMEOUT_S",
    "POLL_WAIT_S",
    "WAIT_SLICE_S",
    "LiveQueue",
    "QueueRegistry",
    "event",
]

# The poll thread runs the workers' consumer calls and sends their commits between polls:
# this bounds how late they run.
POLL_WAIT_S = 0.01
# Wait slice: how late a stop flag, a lease end or a suspension end is noticed.
WAIT_SLICE_S = 0.1
# One lock round trip (see lock_client); also bounded by the renew interval.
LOCK_TIMEOUT_S = 5.0
# Committed-offset look-ups and synchronous commits on a loaded broker.
COMMIT_TIMEOUT_S = 10.0
_KAFKA_OFFSET = operator.methodcaller("offset")


def event(name: str, **fields: Any) -> dict[str, Any]:
    """``extra=`` of a log line that marks a protocol event (for log-based monitoring)."""
    return {"rmq_event": name, "rmq_fields": fields}


class LiveQueue:
    """One assigned partition at run time: its :class:`QueueState`, guarded by ``cv``.

    ``consume_lock`` is held while a batch is in the listener (or being dead-lettered), and
    while revocation or shutdown commits it synchronously; the normal commit is sent by the
    poll thread without it. It is shared by every assignment of the partition, so a new
    assignment waits for the previous one's batch.
    """

    __slots__ = ("consume_lock", "cv", "state", "thread", "tp")

    def __init__(self, tp: tuple[str, int], consume_lock: threading.Lock) -> None:
        self.tp = tp
        # The poll thread buffers confluent_kafka.Messages; views are made per batch.
        # len of a confluent_kafka.Message is its value's (C: cheaper than a lambda).
        self.state = QueueState(tp, offset_of=_KAFKA_OFFSET, views=kafka_views, size_of=len)
        self.cv = threading.Condition()
        self.consume_lock = consume_lock
        self.thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return self.state.where


class QueueRegistry:
    """The queues assigned right now, their worker threads, and one consume lock per
    partition for the consumer's life."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._queues: dict[tuple[str, int], LiveQueue] = {}
        self._consume_locks: dict[tuple[str, int], threading.Lock] = {}
        self._workers: list[threading.Thread] = []

    def get(self, tp: tuple[str, int]) -> LiveQueue | None:
        with self._lock:
            return self._queues.get(tp)

    def all(self) -> list[LiveQueue]:
        with self._lock:
            return list(self._queues.values())

    def add(
        self, tps: list[tuple[str, int]], worker: Callable[[LiveQueue], None], *, idle: bool = False
    ) -> list[LiveQueue]:
        """Queues (and their worker threads, not started) for the partitions not here yet;
        ``idle`` ones start out revoking (assigned while shutting down)."""
        added = []
        with self._lock:
            for tp in tps:
                if tp in self._queues:
                    continue
                q = LiveQueue(tp, self._consume_locks.setdefault(tp, threading.Lock()))
                if idle:
                    q.state.revoke()
                q.thread = threading.Thread(
                    target=worker, args=(q,), daemon=True, name=f"rmq-orderly-{tp[0]}[{tp[1]}]"
                )
                self._queues[tp] = q
                added.append(q)
            self._workers = [t for t in self._workers if t.is_alive()]
            self._workers.extend(q.thread for q in added if q.thread is not None)
        return added

    def remove(self, q: LiveQueue) -> None:
        with self._lock:
            if self._queues.get(q.tp) is q:
                del self._queues[q.tp]

    def workers(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._workers)
