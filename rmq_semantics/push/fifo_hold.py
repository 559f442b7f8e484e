"""How a live instance keeps the message groups of its FIFO calls still running (issue 45):
RocketMQ's old owner keeps its queue lock until its current consumption ends, so no two calls
of one group run at once and the group's next message waits for the call.

While a call runs its committed lease is renewed 10 s ahead (ledger.py), so only a dead
instance's message comes back early. Here the two moments a live instance could let go of a
running call: a revocation waits for it (bounded by the group protocol), and a producer
re-creation's replay reads the partition again only once its calls ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import TopicPartition

from rmq_semantics.push.ledger import Batch, Ledger

__all__ = ["ReplayHold", "fifo_revoke_wait_s", "wait_at_revocation"]

log = logging.getLogger(__name__)
TP = tuple[str, int]

# A revocation waits for its partitions' FIFO calls at most what the group protocol allows it
# (max.poll.interval.ms: the rebalance timeout of the classic protocol and of KIP-848's), less
# this margin for the commit and the rejoin; a call past it keeps its group by a lease written
# to the call's own deadline.
FIFO_REVOKE_MARGIN_S = 15.0
MAX_POLL_INTERVAL_MS = 300_000  # librdkafka's default max.poll.interval.ms


def fifo_revoke_wait_s(consumer_conf: dict) -> float:
    """How long a revocation waits for its partitions' FIFO calls: max.poll.interval.ms less
    FIFO_REVOKE_MARGIN_S, at least half of it."""
    poll_s = int(consumer_conf.get("max.poll.interval.ms", MAX_POLL_INTERVAL_MS)) / 1000
    return max(poll_s / 2, poll_s - FIFO_REVOKE_MARGIN_S)


def wait_at_revocation(
    ledger: Ledger,
    expire: Callable[[Batch], None],
    revoked: set[TP],
    wait_s: float,
    name: str,
) -> None:
    """Wait up to ``wait_s`` for the FIFO calls of the partitions ``revoked`` (``expire``
    settles one past its consume timeout as timed out); the leases of the calls still
    running then are committed to their own deadlines (``Ledger.uncap``)."""
    end = time.monotonic() + wait_s
    while running := ledger.fifo_calls(revoked):
        now = time.monotonic()
        for batch in ledger.expired(now):
            expire(batch)
        if now >= end:
            ledger.uncap(revoked)
            log.warning(
                "push consumer %s: %d FIFO calls still running after %.0f s at revocation "
                "(max.poll.interval.ms bounds the wait); their messages stay invisible to the "
                "next owner until their consume timeout",
                name,
                len(running),
                wait_s,
            )
            return
        first_due = min(b.deadline for b in running)
        ledger.wait_fifo_calls(revoked, max(0.01, min(end, first_due) - now))


class ReplayHold:
    """Partitions a producer re-creation replays, held paused while FIFO calls of theirs run:
    their restored leases would hand the groups out again during the calls."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.tps: set[TP] = set()

    def __contains__(self, tp: TP) -> bool:
        return tp in self.tps

    def discard(self, tp: TP) -> None:
        self.tps.discard(tp)

    def hold(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """Of the replayed partitions ``tps``, those to read again now; the rest are held."""
        running = {b.part.tp for b in self.ledger.fifo_calls({(t.topic, t.partition) for t in tps})}
        self.tps |= running
        return [tp for tp in tps if (tp.topic, tp.partition) not in running]

    def released(self) -> list[TopicPartition]:
        """The held partitions whose FIFO calls ended (no longer held): read them again."""
        if not self.tps:
            return []
        running = {b.part.tp for b in self.ledger.fifo_calls(self.tps)}
        ended, self.tps = self.tps - running, running
        return [TopicPartition(*tp) for tp in ended]
