"""The lease engine of one partition: invisibility, delivery attempts, FIFO message groups.

One engine serves the SimpleConsumer (``receive``/``ack``/``change_invisible_duration`` from
the user), the FIFO PushConsumer and the key-ordered OrderlyConsumer (the same calls from their
worker pools); see docs/design/simple-consumer.md. Records enter in offset order. A record
with an ordering key joins its key's FIFO queue and only the queue's head is deliverable, so a
group's next record waits for the previous one's ack (or dead letter) and a retry happens in
place; a record without a key is deliverable on its own.

A record is READY, INVISIBLE (handed out until a deadline), DYING (a dead letter is owed) or
DONE (:data:`TRANSITIONS`). At its deadline an invisible record is READY again, or DYING once it
was delivered ``max_delivery_attempts`` times. Offsets finish out of order, so an
:class:`~rmq_semantics.orderly.offsets.OffsetTracker` gives the committable offset (the lowest
record not DONE) and the done ones above it; the records delivered at least once and not done
travel beside them as leases (:mod:`.leases`: attempts and deadline), so the caller commits
before it hands a batch out and the partition's next owner restores both.

Pure: no Kafka, no threads (the caller locks), the wall clock passed in as epoch ms.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from rmq_semantics.errors import (
    ConfigError,
    IllegalStateError,
    IllegalTransitionError,
    ReceiptError,
)
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.orderly.offsets import compose_metadata as compose_done
from rmq_semantics.orderly.offsets import split_metadata as split_done
from rmq_semantics.records.headers import H
from rmq_semantics.simple.leases import (
    Lease,
    compose_metadata,
    decode_leases,
    encode_leases,
    split_metadata,
)
from rmq_semantics.simple.record_state import RecordState, transition

__all__ = [
    "DEFAULT_MAX_DELIVERY_ATTEMPTS",
    "DEFAULT_MAX_LEASED",
    "DONE_METADATA_BYTES",
    "MAX_LEASED",
    "MAX_OWNER_CHARS",
    "DeadLetter",
    "Delivery",
    "PartitionEngine",
    "Receipt",
    "message_group_of",
]

log = logging.getLogger(__name__)

#: RocketMQ 5's default maximum delivery attempts of a consumer group.
DEFAULT_MAX_DELIVERY_ATTEMPTS = 16
#: Records per partition delivered at least once and not done: at most 9 bytes each in the
#: lease field (1.2 KB base64), beside the done field and the owner within Kafka's 4096.
DEFAULT_MAX_LEASED = 100
#: The most ``max_leased`` may be: that many worst-case leases (12 characters each), the
#: done field and an owner of MAX_OWNER_CHARS fit Kafka's default offset.metadata.max.bytes
#: (4096); past it every commit would fail with OFFSET_METADATA_TOO_LARGE.
MAX_LEASED = 128
#: The done field's bound when a lease field sits beside it (the tracker's default is 3000).
DONE_METADATA_BYTES = 2000
#: The commit metadata's owner (the client id) is cut to this many characters.
MAX_OWNER_CHARS = 255

_sessions = itertools.count(1)  # tells the receipts of two engines of one partition apart


def message_group_of(headers: Any) -> bytes | None:
    """The ``rmq.message_group`` of a record's headers (the last one, as Kafka's
    ``lastHeader``), None without one; an empty group is no group."""
    group = None
    for name, value in headers or ():
        if name == H.MESSAGE_GROUP:
            group = value
    return bytes(group) if group else None


@dataclass(frozen=True)
class Receipt:
    """A delivery's handle (RocketMQ's receipt handle): valid while it is the record's current
    delivery in the engine that made it."""

    topic: str
    partition: int
    offset: int
    attempt: int
    session: int

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True)
class Delivery:
    """A record handed out: its receipt, its delivery attempt (1 first) and its deadline."""

    record: Any
    receipt: Receipt
    invisible_until_ms: int

    @property
    def delivery_attempt(self) -> int:
        return self.receipt.attempt


@dataclass(frozen=True)
class DeadLetter:
    """A record delivered ``attempts`` times without an ack: the caller writes it to the DLQ,
    then calls :meth:`PartitionEngine.dead_lettered`."""

    record: Any
    offset: int
    attempts: int


class _Entry:
    __slots__ = ("attempts", "key", "offset", "record", "state", "visible_at")

    def __init__(self, offset: int, record: Any, key: Hashable | None) -> None:
        self.offset = offset
        self.record = record
        self.key = key
        self.state = RecordState.READY
        self.attempts = 0
        self.visible_at = 0

    def move(self, target: RecordState) -> None:
        self.state = transition(self.state, target)


class PartitionEngine:
    """One partition's records, leases and queues (see the module docstring).

    ``key_of(record)`` is a record's ordering key (None: unordered); ``restored`` the leases a
    commit carried (use :meth:`restore`). Records whose offsets the tracker skips are not
    delivered again. ``max_delivery_attempts=None``: no limit, no dead letters.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        *,
        max_delivery_attempts: int | None = DEFAULT_MAX_DELIVERY_ATTEMPTS,
        max_leased: int = DEFAULT_MAX_LEASED,
        key_of: Callable[[Any], Hashable | None] = lambda record: None,
        tracker: OffsetTracker | None = None,
        restored: Mapping[int, Lease] | None = None,
    ) -> None:
        for name, value in (
            ("max_delivery_attempts", max_delivery_attempts),
            ("max_leased", max_leased),
        ):
            if value is None and name == "max_delivery_attempts":
                continue  # no limit: the orderly consumer's max_reconsume_times=-1
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if max_leased > MAX_LEASED:
            raise ConfigError(
                f"max_leased must be at most {MAX_LEASED} (the leases travel in the offset "
                f"commit's metadata, which Kafka caps at 4096 bytes), got {max_leased!r}"
            )
        self.topic = topic
        self.partition = partition
        self.where = f"{topic}[{partition}]"
        self.max_delivery_attempts = max_delivery_attempts
        self.max_leased = max_leased
        self.session = next(_sessions)
        self._key_of = key_of
        self.tracker = tracker or OffsetTracker(
            where=self.where, max_metadata_bytes=DONE_METADATA_BYTES
        )
        self._restored = dict(restored or {})
        self._entries: dict[int, _Entry] = {}  # offset -> record not done
        self._leased: dict[int, _Entry] = {}  # the entries with attempts >= 1
        self._queues: dict[Hashable, deque[int]] = {}  # key -> offsets, head first
        # Heaps of offsets maybe deliverable (checked when popped): never delivered, and
        # delivered before (these go out even while max_leased records hold leases).
        self._fresh: list[int] = []
        self._again: list[int] = []
        self._deadlines: list[tuple[int, int, int]] = []  # heap (visible_at, offset, attempts)
        self._owed: list[DeadLetter] = []
        self._invisible = 0

    @classmethod
    def restore(
        cls,
        topic: str,
        partition: int,
        committed_offset: int,
        metadata: str | None,
        **kwargs: Any,
    ) -> PartitionEngine:
        """The engine of a partition whose group committed ``committed_offset`` with
        ``metadata``: done records are skipped, leased ones keep their attempts and deadline.
        A damaged lease field is ignored with one warning line."""
        where = f"{topic}[{partition}]"
        done, lease_field, owner = split_metadata(metadata)
        tracker = OffsetTracker.restore(
            committed_offset,
            compose_done(done, owner),
            where=where,
            max_metadata_bytes=DONE_METADATA_BYTES,
        )
        restored: dict[int, Lease] = {}
        if lease_field:
            try:
                restored = decode_leases(lease_field, committed_offset)
            except ValueError as exc:
                log.warning(
                    "%s: ignoring the leases in the commit metadata (%s); the delivery "
                    "attempts of the records from offset %d start again",
                    where,
                    exc,
                    committed_offset,
                )
        return cls(topic, partition, tracker=tracker, restored=restored, **kwargs)

    # -- records in ----------------------------------------------------------------------------
    def offer(self, offset: int, record: Any, now_ms: int) -> bool:
        """A record read at ``offset`` (offset order): False when a restored commit says it
        is done (it is not delivered again)."""
        lease = self._restored.pop(offset, None)
        if not self.tracker.add(offset):
            return False
        entry = _Entry(offset, record, self._key_of(record))
        self._entries[offset] = entry
        if lease is not None:  # delivered by an earlier owner: its count and deadline hold
            entry.attempts = lease.attempts
            self._leased[offset] = entry
            if lease.visible_at_ms > now_ms:
                self._hide(entry, lease.visible_at_ms)
        if entry.key is None:
            if entry.state is RecordState.READY:
                self._push_ready(entry)
        else:
            queue = self._queues.setdefault(entry.key, deque())
            queue.append(offset)
            if len(queue) == 1 and entry.state is RecordState.READY:
                self._push_ready(entry)
        return True

    def skip(self, offset: int) -> None:
        """A record read at ``offset`` that is not for this consumer (tags): done at once."""
        self._restored.pop(offset, None)
        if self.tracker.add(offset):
            self.tracker.done(offset)

    # -- records out ---------------------------------------------------------------------------
    def receive(self, max_records: int, now_ms: int, invisible_ms: int) -> list[Delivery]:
        """Up to ``max_records`` deliverable records, lowest offset first, each invisible
        until ``now_ms + invisible_ms``. A record delivered ``max_delivery_attempts`` times
        becomes a dead letter instead (:meth:`take_dead_letters`). While ``max_leased``
        records hold leases, only records delivered before go out (back-pressure), and the
        records never delivered are not even looked at."""
        if invisible_ms < 1:
            raise ConfigError(f"invisible duration must be >= 1 ms, got {invisible_ms!r}")
        self._expire(now_ms)
        out: list[Delivery] = []
        while len(out) < max_records:
            offset = self._pop_ready(fresh=len(self._leased) < self.max_leased)
            if offset is None:
                break
            entry = self._deliverable(offset)
            if entry is None:
                continue
            if self._exhausted(entry):
                self._die(entry)
                continue
            entry.attempts += 1
            self._leased[offset] = entry
            entry.move(RecordState.INVISIBLE)
            self._hide(entry, now_ms + invisible_ms)
            receipt = Receipt(self.topic, self.partition, offset, entry.attempts, self.session)
            out.append(Delivery(entry.record, receipt, entry.visible_at))
        return out

    def withdraw(self, delivery: Delivery) -> None:
        """``delivery`` was never handed out (the commit carrying it failed): its attempt is
        not counted and its record is deliverable again at once. A delivery that is no
        longer current (the partition moved, the record was acked) is left alone."""
        entry = self._entries.get(delivery.receipt.offset)
        if (
            delivery.receipt.session != self.session
            or entry is None
            or entry.state is not RecordState.INVISIBLE
            or entry.attempts != delivery.receipt.attempt
        ):
            return
        entry.attempts -= 1
        if not entry.attempts:
            del self._leased[entry.offset]
        self._invisible -= 1
        entry.visible_at = 0  # its deadline in the heap is stale now
        entry.move(RecordState.READY)
        self._push_ready(entry)

    def _push_ready(self, entry: _Entry) -> None:
        heapq.heappush(self._again if entry.attempts else self._fresh, entry.offset)

    def _pop_ready(self, *, fresh: bool) -> int | None:
        """The lowest offset maybe deliverable, popped; first deliveries only if ``fresh``."""
        again, new = self._again, self._fresh if fresh else None
        if again and (not new or again[0] < new[0]):
            return heapq.heappop(again)
        return heapq.heappop(new) if new else None

    def _exhausted(self, entry: _Entry) -> bool:
        limit = self.max_delivery_attempts
        return limit is not None and entry.attempts >= limit

    def _deliverable(self, offset: int) -> _Entry | None:
        entry = self._entries.get(offset)
        if entry is None or entry.state is not RecordState.READY:
            return None
        if entry.key is not None and self._queues[entry.key][0] != offset:
            return None  # not its group's head: pushed again when it is
        return entry

    def _hide(self, entry: _Entry, until_ms: int) -> None:
        if entry.state is RecordState.READY:  # restored leases arrive READY
            entry.move(RecordState.INVISIBLE)
        self._invisible += 1
        entry.visible_at = until_ms
        heapq.heappush(self._deadlines, (until_ms, entry.offset, entry.attempts))

    def _expire(self, now_ms: int) -> None:
        """Invisible records whose deadline is at or before ``now_ms``: ready again, or
        dying after their last attempt."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            until, offset, attempts = heapq.heappop(deadlines)
            entry = self._entries.get(offset)
            if (
                entry is None
                or entry.state is not RecordState.INVISIBLE
                or entry.visible_at != until
                or entry.attempts != attempts
            ):
                continue  # acked, extended or redelivered since: a stale heap entry
            self._invisible -= 1
            if self._exhausted(entry) and self._is_head(entry):
                self._die(entry)
            else:
                entry.move(RecordState.READY)
                self._push_ready(entry)

    def _is_head(self, entry: _Entry) -> bool:
        """Unordered, or its group's head (a lease restored from a forged commit may name a
        record behind its head: it dies only once it is the head)."""
        return entry.key is None or self._queues[entry.key][0] == entry.offset

    def _die(self, entry: _Entry) -> None:
        entry.move(RecordState.DYING)
        self._owed.append(DeadLetter(entry.record, entry.offset, entry.attempts))

    # -- outcomes ------------------------------------------------------------------------------
    def _current(self, receipt: Receipt, now_ms: int, what: str) -> _Entry:
        """The entry ``receipt`` is the current delivery of, else ReceiptError."""
        self._expire(now_ms)
        entry = self._entries.get(receipt.offset)
        reason = None
        if (receipt.topic, receipt.partition, receipt.session) != (
            self.topic,
            self.partition,
            self.session,
        ):
            reason = "it was made by an earlier owner of the partition"
        elif entry is None:
            reason = "the message was acked or dead-lettered already"
        elif entry.attempts != receipt.attempt:
            reason = f"the message was delivered again (attempt {entry.attempts})"
        elif entry.state is not RecordState.INVISIBLE:
            reason = "its invisible duration passed"
        if reason is not None:
            raise ReceiptError(f"{what} {receipt.where} attempt {receipt.attempt}: {reason}")
        return entry  # type: ignore[return-value]  # not None: reason would be set

    def ack(self, receipt: Receipt, now_ms: int) -> None:
        """The delivery of ``receipt`` succeeded: its record is done and its group's next
        record is deliverable. ReceiptError when it is not the current delivery."""
        entry = self._current(receipt, now_ms, "ack")
        self._invisible -= 1
        self._finish(entry)

    def change_invisible_duration(self, receipt: Receipt, invisible_ms: int, now_ms: int) -> int:
        """Make ``receipt``'s record invisible until ``now_ms + invisible_ms`` instead (no
        attempt counted); the new deadline. ReceiptError when it is not the current delivery."""
        if invisible_ms < 0:
            raise ConfigError(f"invisible duration must be >= 0 ms, got {invisible_ms!r}")
        entry = self._current(receipt, now_ms, "change_invisible_duration of")
        entry.visible_at = now_ms + invisible_ms
        heapq.heappush(self._deadlines, (entry.visible_at, entry.offset, entry.attempts))
        return entry.visible_at

    def take_dead_letters(self, now_ms: int) -> list[DeadLetter]:
        """The dead letters owed since the last call (deadlines up to ``now_ms`` applied)."""
        self._expire(now_ms)
        owed, self._owed = self._owed, []
        return owed

    def dead_lettered(self, offset: int) -> None:
        """The DLQ has the record at ``offset``: it is done, its group goes on."""
        entry = self._entries.get(offset)
        if entry is None or entry.state is not RecordState.DYING:
            raise IllegalTransitionError(f"{self.where}@{offset}: no dead letter owed there")
        self._finish(entry)

    def _finish(self, entry: _Entry) -> None:
        entry.move(RecordState.DONE)
        del self._entries[entry.offset]
        self._leased.pop(entry.offset, None)
        self.tracker.done(entry.offset)
        if entry.key is None:
            return
        queue = self._queues[entry.key]
        if queue[0] != entry.offset:  # only heads are delivered or die, so only heads finish
            raise IllegalStateError(f"{self.where}@{entry.offset} finished behind its head")
        queue.popleft()
        if not queue:
            del self._queues[entry.key]
        elif (head := self._entries[queue[0]]).state is RecordState.READY:
            self._push_ready(head)

    # -- commits ---------------------------------------------------------------------------------
    def committable(
        self, now_ms: int, owner: str = "", visible_by: int | None = None
    ) -> tuple[int, str] | None:
        """(offset, metadata) to commit: the lowest record not done, the done ones above it
        and the leases (deadlines relative to ``now_ms``). None before any offset is known.
        ``visible_by`` caps the deadlines written (not this engine's own): a next owner then
        waits at most until then for a record handed out here."""
        done = self.tracker.committable("")
        if done is None:
            return None
        low, done_field = done[0], split_done(done[1])[0]
        leases = {o: Lease(e.attempts, _visible_at(e, visible_by)) for o, e in self._leased.items()}
        # Leases restored and not read yet travel on; those below the reading position named
        # offsets that never came (compacted, aborted): forgotten.
        read_to = self.tracker.next_offset or low
        for offset in [o for o in self._restored if o < read_to]:
            del self._restored[offset]
        for offset, lease in self._restored.items():
            leases.setdefault(offset, lease)
        return low, compose_metadata(done_field, encode_leases(low, now_ms, leases), owner)

    def next_deadline(self) -> int | None:
        """When the earliest invisible record may become visible (a stale entry may make
        this early, never late); None when none is invisible."""
        return self._deadlines[0][0] if self._deadlines else None

    # -- status ----------------------------------------------------------------------------------
    def accepting(self) -> bool:
        """Whether the caller may read more records of the partition (the tracker's bound)."""
        return self.tracker.accepting()

    @property
    def in_flight(self) -> int:
        """Records invisible now (handed out, or leased by an earlier owner)."""
        return self._invisible

    @property
    def leased(self) -> int:
        """Records delivered at least once and not done."""
        return len(self._leased)

    @property
    def buffered(self) -> int:
        """Records taken and not done."""
        return len(self._entries)

    @property
    def groups(self) -> int:
        """Ordering keys with records not done."""
        return len(self._queues)


def _visible_at(entry: _Entry, cap: int | None = None) -> int:
    if entry.state is not RecordState.INVISIBLE:
        return 0
    return entry.visible_at if cap is None else min(entry.visible_at, cap)
