"""Key mode's work (``ordering="key"``), as the partition feeders (:mod:`.keyfeed`) hand it
to the worker pool (:mod:`.keyed`): a :class:`Session` is one partition under one aligned lock
epoch, a :class:`Unit` consecutive records of one key in a session, one listener call.

Both sides hold these and neither owns the other: the feeder makes sessions and units, the
pool runs units and counts each session's calls in flight.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rmq_semantics.consumed import offset_of
from rmq_semantics.orderly.api import OrderlyMessage, kafka_views

if TYPE_CHECKING:
    import confluent_kafka

    from rmq_semantics.orderly.dlq import Failure
    from rmq_semantics.orderly.keys import OrderingKey
    from rmq_semantics.orderly.offsets import OffsetTracker
    from rmq_semantics.orderly.runtime import LiveQueue

__all__ = ["Session", "Unit"]


class Session:
    """One partition under one aligned lock epoch: its tracker and its units in calls
    (``in_flight``, guarded by the pool's lock; the rest by ``q.cv``)."""

    __slots__ = (
        "closed",
        "epoch",
        "first_offset",
        "in_flight",
        "last_offset",
        "q",
        "taken_bytes",
        "tracker",
    )

    def __init__(self, q: LiveQueue, epoch: int, tracker: OffsetTracker) -> None:
        self.q = q
        self.epoch = epoch
        self.tracker = tracker
        self.in_flight = 0
        self.closed = False
        self.first_offset: int | None = None  # the first record taken out of the buffer
        self.last_offset = -1
        self.taken_bytes = 0  # values of the records taken and not finished (q.cv)


class Unit:
    """Consecutive records of one ordering key in one partition session: one listener call.
    ``reconsume_times`` counts its suspensions (not the uncounted lease-lapse returns)."""

    __slots__ = (
        "error",
        "failure",
        "key",
        "offset",
        "reason",
        "reconsume_times",
        "records",
        "session",
    )

    def __init__(self, key: OrderingKey, record: confluent_kafka.Message, session: Session) -> None:
        self.key = key
        self.offset = offset_of(record)
        self.records = [record]
        self.session = session
        self.reconsume_times = 0
        # Why the current call failed, if it did (set by the outcome handlers), and the
        # unit's failures so far (what its dead letter says).
        self.reason: str | None = None
        self.error: BaseException | None = None
        self.failure: Failure | None = None

    @property
    def where(self) -> str:
        return f"{self.session.q.where}@{self.offset}"

    def messages(self) -> list[OrderlyMessage]:
        msgs = kafka_views(self.records)
        if not self.reconsume_times:
            return msgs
        return [dataclasses.replace(m, reconsume_times=self.reconsume_times) for m in msgs]
