"""Acks waiting for their commit: the futures of ``SimpleConsumer.ack_async``.

An ack is in memory until an offset commit carries it (docs/design/simple-consumer.md, Acks).
``ack_async``'s future waits here with the acked record's partition and offset. A commit that
landed resolves the futures of its partition whose record it covers (the committed offset
passed it, or its done field marks it: :func:`done_in_commit`); a partition revoked or lost
first fails them with ReceiptError (the message will be delivered again); one no commit
carried by its deadline fails with RmqTimeoutError (the ack stays in memory).

Pure: no Kafka, no threads (the caller locks), the monotonic clock passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from rmq_semantics.errors import ReceiptError, RmqTimeoutError
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.orderly.offsets import compose_metadata as compose_done
from rmq_semantics.simple.engine import DONE_METADATA_BYTES
from rmq_semantics.simple.leases import split_metadata

__all__ = ["AckWaiters", "done_in_commit"]

Part = tuple[str, int]


def done_in_commit(committed_offset: int, metadata: str | None) -> Callable[[int], bool]:
    """Whether a commit of ``committed_offset`` with ``metadata`` (a partition engine's) marks
    an offset done: below the committed offset, or set in its done field (a field cut to fit
    Kafka's metadata bound marks fewer)."""
    done, _leases, owner = split_metadata(metadata)
    tracker = OffsetTracker.restore(
        committed_offset, compose_done(done, owner), max_metadata_bytes=DONE_METADATA_BYTES
    )
    return lambda offset: offset < committed_offset or tracker.is_done(offset)


@dataclass(frozen=True)
class _Waiter:
    offset: int
    future: Future[None]
    deadline: float


class AckWaiters:
    """The futures of acks not committed yet, per partition (see the module docstring).
    A future is running once added (its holder cannot cancel it): only this class ends it."""

    def __init__(self) -> None:
        self._pending: dict[Part, list[_Waiter]] = {}

    def add(self, part: Part, offset: int, future: Future[None], deadline: float) -> None:
        """Wait for a commit of ``part`` covering ``offset`` until ``deadline`` (monotonic).
        A future its holder cancelled before is left out."""
        if not future.running() and not future.set_running_or_notify_cancel():
            return
        self._pending.setdefault(part, []).append(_Waiter(offset, future, deadline))

    def waiting(self, part: Part) -> bool:
        return bool(self._pending.get(part))

    def __len__(self) -> int:
        return sum(len(waiters) for waiters in self._pending.values())

    def committed(self, part: Part, is_done: Callable[[int], bool]) -> None:
        """A commit of ``part`` landed: resolve the futures whose record it marks done."""
        kept = []
        for waiter in self._pending.pop(part, []):
            if is_done(waiter.offset):
                waiter.future.set_result(None)
            else:
                kept.append(waiter)
        if kept:
            self._pending[part] = kept

    def lost(self, part: Part, why: str) -> None:
        """``part`` is no longer ours (``why``: revoked, lost, closed) and no commit carried
        these acks: their messages will be delivered again."""
        topic, partition = part
        for waiter in self._pending.pop(part, []):
            waiter.future.set_exception(
                ReceiptError(
                    f"ack of {topic}[{partition}]@{waiter.offset}: {why} before an offset "
                    "commit carrying the ack landed; the message will be delivered again"
                )
            )

    def lose_all(self, why: str) -> None:
        for part in list(self._pending):
            self.lost(part, why)

    def expire(self, now: float, bound: str) -> None:
        """Fail the futures past their deadline (``bound`` names it in the error text)."""
        for part in list(self._pending):
            topic, partition = part
            kept = []
            for waiter in self._pending.pop(part):
                if waiter.deadline > now:
                    kept.append(waiter)
                    continue
                waiter.future.set_exception(
                    RmqTimeoutError(
                        f"ack of {topic}[{partition}]@{waiter.offset}: no offset commit "
                        f"carrying it landed within {bound}; the ack stays in memory and "
                        "goes with a later commit, but until one lands the message may be "
                        "delivered again"
                    )
                )
            if kept:
                self._pending[part] = kept
