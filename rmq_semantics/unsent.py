"""The transactions whose half write a producer has not seen land (issue 29): a check of one
is answered by the producer itself, never by the listener.

A check can reach the producer that wrote a half record before that producer's caller learned
the write's outcome: the record landed while its delivery report is still on its way (or
waits for a stalled event loop), or the write was reported failed although the record was
appended (an in-flight produce that timed out). The listener has never seen such a
transaction, and a listener that answers COMMIT for ids it does not know (the seeds' sample
does) would promote a message whose local transaction never ran. So, while the caller has
no delivery report, the answer is UNKNOW (checked again later); once the write was reported
failed, ROLLBACK (the caller was told, the local transaction is never run). Failed ids are
kept ``FAILED_KEEP_S`` and at most ``FAILED_MAX`` (the coordinator's bounds for the ROLLBACK by
id the producer also sends: coordinator/rollback_ids.py); one dropped early is counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.transaction_api import LocalTransactionState

__all__ = ["FAILED_KEEP_S", "FAILED_MAX", "UnsentHalves", "answer_check"]

log = logging.getLogger("rmq_semantics.transaction")

# How long a failed half write's id is answered ROLLBACK, and how many are kept at most
# (the oldest is dropped first, counted): as the coordinator keeps ROLLBACKs by id.
FAILED_KEEP_S = 15 * 60.0
FAILED_MAX = 10_000


class UnsentHalves:
    """Transaction ids whose half write is in flight (queued, its caller has no delivery
    report yet) or was reported failed. Thread-safe: senders add, check threads ask."""

    def __init__(
        self,
        *,
        keep_s: float = FAILED_KEEP_S,
        max_failed: int = FAILED_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keep_s, self._max_failed, self._clock = keep_s, max_failed, clock
        self._lock = threading.Lock()
        # Each entry lives while its caller waits for a report (the send timeout at most).
        self._in_flight: set[str] = set()
        self._failed: OrderedDict[str, float] = OrderedDict()  # txn id -> when reported
        #: Failed ids forgotten before ``keep_s`` because more than ``max_failed`` were kept
        #: (a check of one asks the listener again; the coordinator's ROLLBACK still holds).
        self.dropped = 0

    @contextmanager
    def sending(self, txn_ids: Iterable[str]) -> Iterator[None]:
        """``txn_ids`` are in flight for the block: queue their half records inside it and
        call :meth:`landed` or :meth:`failed` once the caller has each report. Whatever is
        neither when the block ends (a raise, a cancelled caller) stops being in flight."""
        ids = list(txn_ids)
        with self._lock:
            self._in_flight.update(ids)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight.difference_update(ids)

    def landed(self, txn_id: str) -> None:
        """The caller has ``txn_id``'s delivery report: its local transaction runs now, and
        its checks go to the listener."""
        with self._lock:
            self._in_flight.discard(txn_id)

    def failed(self, txn_id: str) -> None:
        """``txn_id``'s half write was reported failed to the caller: never COMMIT it."""
        with self._lock:
            self._in_flight.discard(txn_id)
            self._failed.pop(txn_id, None)
            self._failed[txn_id] = self._clock()
            self._expire()
            while len(self._failed) > self._max_failed:
                self._failed.popitem(last=False)
                self.dropped += 1

    def answer(self, txn_id: str) -> LocalTransactionState | None:
        """The producer's own answer to a check of ``txn_id``; None: ask the listener."""
        with self._lock:
            if txn_id in self._in_flight:
                return LocalTransactionState.UNKNOW
            self._expire()
            if txn_id in self._failed:
                return LocalTransactionState.ROLLBACK_MESSAGE
        return None

    def __len__(self) -> int:
        with self._lock:
            return len(self._in_flight) + len(self._failed)

    def _expire(self) -> None:
        cutoff = self._clock() - self._keep_s
        while self._failed and next(iter(self._failed.values())) <= cutoff:
            self._failed.popitem(last=False)


def answer_check(
    unsent: UnsentHalves,
    half_topic: str,
    ask: Callable[[CheckRequest], LocalTransactionState],
    check: CheckRequest,
) -> LocalTransactionState:
    """``check``'s answer: the producer's own for a half it has not seen land, else
    ``ask(check)`` (the listener's)."""
    state = unsent.answer(check.txn_id)
    if state is None:
        return ask(check)
    log.info(
        "%s[%d]@%d txn=%s: check #%d answered %s without asking the listener: its half write %s",
        half_topic,
        check.half_partition,
        check.half_offset,
        check.txn_id,
        check.check_seq,
        state.value,
        "is still in flight here"
        if state is LocalTransactionState.UNKNOW
        else "was reported failed to the caller (its local transaction never ran)",
    )
    return state
