"""Key-ordered scheduling: one FIFO chain per ordering key, chains in parallel.

RocketMQ 5's FIFO message groups (and Parallel Consumer's KEY mode) on the partitions a
consumer holds: records of one key are handed out one at a time in the order offered
(offset order), different keys run in parallel, at most ``max_in_flight`` in all.

The ordering key of a record is its ``rmq.message_group`` header, else its key, else its
partition alone; keys are scoped per (topic, partition), so one key on two partitions is
two chains. Every key holds at most one slot. Picks alternate between the ready key with the
longest backlog and the ready keys in turn (round-robin: a key that finishes goes behind
every key that was waiting). The first keeps the hottest key's serial chain, which bounds
when a skewed partition is done, from waiting behind hundreds of cold keys; the second means
no key waits more than two picks per key ahead of it. A suspended key waits alone and its
record is redelivered first, after ``until``.

Pure: no Kafka, no threads; the clock is passed in and the caller locks around each call.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from rmq_semantics.errors import ConfigError, IllegalStateError
from rmq_semantics.records.headers import H

__all__ = ["KeyScheduler", "KeysStatus", "ordering_key"]

TopicPartition = tuple[str, int]
#: (topic, partition, kind, value): kind "g" a message group, "k" a record key, "p" none.
OrderingKey = tuple[str, int, str, Hashable]


def ordering_key(record: Any) -> OrderingKey:
    """The ordering key of an :class:`~rmq_semantics.orderly.OrderlyMessage`-like record
    (``topic``, ``partition``, ``key``, ``headers`` attributes): its ``rmq.message_group``
    header (the last one, as Kafka's ``lastHeader``), else its key, else its partition."""
    group = None
    for name, value in record.headers or ():
        if name == H.MESSAGE_GROUP:
            group = value
    if group:  # an empty group is no group
        return record.topic, record.partition, "g", bytes(group)
    if record.key is not None:
        return record.topic, record.partition, "k", record.key
    return record.topic, record.partition, "p", None


@dataclass(frozen=True)
class KeysStatus:
    """One partition in the scheduler: keys with a record in flight, records waiting (in
    flight not counted), and keys suspended."""

    in_flight_keys: int
    queued: int
    suspended_keys: int


class _Chain:
    """One key's records: ``queue`` waits (its head is a suspended record, if any),
    ``in_flight`` is handed out. ``orphan``: the partition was dropped while in flight."""

    __slots__ = (
        "in_flight",
        "key",
        "orphan",
        "queue",
        "ready",
        "ready_seq",
        "reconsume_times",
        "suspended_until",
    )

    def __init__(self, key: OrderingKey) -> None:
        self.key = key
        self.queue: deque[Any] = deque()
        self.in_flight: Any = None
        self.suspended_until: float | None = None
        self.reconsume_times = 0  # suspensions of the record at the head / in flight
        self.ready = False  # may be picked (its entries in the ring and the heap)
        self.ready_seq = 0  # which of its ring / heap entries are current: the newest
        self.orphan = False


class KeyScheduler:
    """Per-key FIFO chains over the partitions one consumer owns (see module docstring).

    ``key_of`` gives a record's ordering key, a tuple starting with (topic, partition);
    ``offset_of`` its offset.
    """

    def __init__(
        self,
        max_in_flight: int,
        *,
        key_of: Callable[[Any], OrderingKey] = ordering_key,
        offset_of: Callable[[Any], int] = operator.attrgetter("offset"),
    ) -> None:
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or max_in_flight < 1
        ):
            raise ConfigError(
                f"max_in_flight must be an int >= 1 (records handed out at "
                f"once), got {max_in_flight!r}"
            )
        self.max_in_flight = max_in_flight
        self._key_of = key_of
        self._offset_of = offset_of
        self._chains: dict[Hashable, _Chain] = {}
        self._keys_of_tp: dict[TopicPartition, set[Hashable]] = {}
        # Ready keys, twice: a round-robin ring and a heap by backlog (longest first).
        # Entries are (ready_seq, chain) behind: stale ones are skipped when met, and both are
        # compacted when stale entries outnumber the chains.
        self._ring: deque[tuple[int, _Chain]] = deque()
        self._longest: list[tuple[int, int, int, _Chain]] = []  # (-backlog, tie, seq, chain)
        self._longest_turn = False  # picks alternate: longest backlog, then the ring
        self._sleeping: list[tuple[float, int, _Chain]] = []  # heap of suspended keys
        self._tie = itertools.count()
        self._in_flight = 0
        self._in_flight_keys: Counter[TopicPartition] = Counter()
        self._queued: Counter[TopicPartition] = Counter()
        self._suspended: Counter[TopicPartition] = Counter()

    # -- records in ----------------------------------------------------------------------------
    def offer(self, record: Any) -> None:
        """Queue ``record`` behind the earlier records of its key (offer in offset order)."""
        key = self._key_of(record)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = _Chain(key)
            self._keys_of_tp.setdefault(_tp(key), set()).add(key)
        chain.queue.append(record)
        self._queued[_tp(key)] += 1
        if chain.ready:  # its backlog grew: a newer heap entry with the larger one
            self._push_longest(chain)
        else:
            self._make_ready(chain)

    def _make_ready(self, chain: _Chain) -> None:
        if (
            not chain.ready
            and chain.in_flight is None
            and chain.suspended_until is None
            and chain.queue
        ):
            chain.ready = True
            chain.ready_seq += 1
            self._ring.append((chain.ready_seq, chain))
            self._push_longest(chain)
            if len(self._ring) > 2 * len(self._chains) + 64:
                self._compact()

    def _push_longest(self, chain: _Chain) -> None:
        heapq.heappush(self._longest, (-len(chain.queue), next(self._tie), chain.ready_seq, chain))
        if len(self._longest) > 2 * len(self._chains) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the stale entries of the ring and the heap. Each ready chain has exactly one
        current ring entry (one per time it was made ready), from which the heap is rebuilt."""
        self._ring = deque((seq, c) for seq, c in self._ring if self._current(c, seq))
        self._longest = [(-len(c.queue), next(self._tie), seq, c) for seq, c in self._ring]
        heapq.heapify(self._longest)

    def _current(self, chain: _Chain, seq: int) -> bool:
        return chain.ready and chain.ready_seq == seq and self._chains.get(chain.key) is chain

    # -- records out ---------------------------------------------------------------------------
    def next_ready(self, now: float) -> Any | None:
        """A record whose key has nothing in flight and is not suspended at ``now`` (the
        longest backlog and round-robin in turn, see the module docstring); None when there is
        none or ``max_in_flight`` are out."""
        if self._in_flight >= self.max_in_flight:
            return None
        self._wake(now)
        chain = self._take_ready()
        if chain is not None:
            chain.ready = False
            record = chain.in_flight = chain.queue.popleft()
            tp = _tp(chain.key)
            self._queued[tp] -= 1
            self._in_flight_keys[tp] += 1
            self._in_flight += 1
            return record
        return None

    def _take_ready(self) -> _Chain | None:
        longest, ring = self._longest, self._ring
        self._longest_turn = not self._longest_turn
        if self._longest_turn:
            while longest:
                _, _, seq, chain = heapq.heappop(longest)
                if self._current(chain, seq):
                    return chain
        while ring:
            seq, chain = ring.popleft()
            if self._current(chain, seq):
                return chain
        while longest:  # only stale ring entries were left
            _, _, seq, chain = heapq.heappop(longest)
            if self._current(chain, seq):
                return chain
        return None

    def _wake(self, now: float) -> None:
        """Suspended keys whose time has come join the ring."""
        sleeping = self._sleeping
        while sleeping and sleeping[0][0] <= now:
            _, _, chain = heapq.heappop(sleeping)
            if self._chains.get(chain.key) is not chain or chain.suspended_until is None:
                continue  # dropped while asleep
            chain.suspended_until = None
            self._suspended[_tp(chain.key)] -= 1
            self._make_ready(chain)

    def next_wakeup(self) -> float | None:
        """When the earliest suspended key may go again (None: none is suspended)."""
        sleeping = self._sleeping
        while sleeping and self._chains.get(sleeping[0][2].key) is not sleeping[0][2]:
            heapq.heappop(sleeping)
        return sleeping[0][0] if sleeping else None

    # -- outcomes ------------------------------------------------------------------------------
    def _settle(self, record: Any) -> _Chain | None:
        """Take ``record`` out of flight; its chain, or None if its partition was dropped
        meanwhile (then the chain is forgotten unless newer records came)."""
        key = self._key_of(record)
        chain = self._chains.get(key)
        if chain is None or chain.in_flight is None:
            raise IllegalStateError(f"{_where(key, self._offset_of(record))} is not in flight")
        if self._offset_of(chain.in_flight) != self._offset_of(record):
            raise IllegalStateError(
                f"{_where(key, self._offset_of(record))} is not in flight (offset "
                f"{self._offset_of(chain.in_flight)} of its key is)"
            )
        chain.in_flight = None
        self._in_flight -= 1
        self._in_flight_keys[_tp(key)] -= 1
        if not chain.orphan:
            return chain
        chain.orphan = False
        if not chain.queue:
            self._forget(chain)
        else:
            self._make_ready(chain)
        return None

    def finished(self, record: Any) -> bool:
        """``record`` (in flight) is done: its key's next record may go. False when its
        partition was dropped while it ran (the caller must not commit it)."""
        chain = self._settle(record)
        if chain is None:
            return False
        chain.reconsume_times = 0
        if chain.queue:
            self._make_ready(chain)
        else:
            self._forget(chain)
        return True

    def suspend(self, record: Any, until: float) -> bool:
        """``record`` (in flight) is not done: only its key waits, and ``record`` goes
        first again at ``until``. False when its partition was dropped (nothing queued)."""
        chain = self._settle(record)
        if chain is None:
            return False
        chain.queue.appendleft(record)
        chain.reconsume_times += 1
        chain.suspended_until = until
        tp = _tp(chain.key)
        self._queued[tp] += 1
        self._suspended[tp] += 1
        heapq.heappush(self._sleeping, (until, next(self._tie), chain))
        return True

    def reconsume_times(self, record: Any) -> int:
        """How often the record now at the head of (or in flight for) ``record``'s key was
        suspended."""
        chain = self._chains.get(self._key_of(record))
        return chain.reconsume_times if chain is not None else 0

    # -- revocation ------------------------------------------------------------------------------
    def drop_partition(self, tp: TopicPartition) -> list[Any]:
        """Forget ``tp``'s waiting records and return them (offset order). Its records in
        flight stay counted until finished or suspended, which then return False, and their
        keys take no new record of ``tp`` before that (never two in flight per key)."""
        dropped: list[Any] = []
        for key in self._keys_of_tp.get(tp, set()).copy():
            chain = self._chains[key]
            dropped.extend(chain.queue)
            chain.queue.clear()
            if chain.suspended_until is not None:
                chain.suspended_until = None
                self._suspended[tp] -= 1
            chain.reconsume_times = 0
            if chain.in_flight is None:
                self._forget(chain)
            else:
                chain.orphan = True
        self._queued[tp] = 0
        dropped.sort(key=self._offset_of)
        return dropped

    def _forget(self, chain: _Chain) -> None:
        tp = _tp(chain.key)
        del self._chains[chain.key]
        keys = self._keys_of_tp[tp]
        keys.discard(chain.key)
        if not keys:
            del self._keys_of_tp[tp]
            for counts in (self._in_flight_keys, self._queued, self._suspended):
                counts.pop(tp, None)

    # -- status ----------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Records handed out and not finished or suspended yet."""
        return self._in_flight

    @property
    def queued(self) -> int:
        """Records waiting (suspended ones included, in flight ones not)."""
        return sum(self._queued.values())

    def status(self) -> dict[TopicPartition, KeysStatus]:
        """Per partition with records: keys in flight, records queued, keys suspended."""
        return {
            tp: KeysStatus(self._in_flight_keys[tp], self._queued[tp], self._suspended[tp])
            for tp in self._keys_of_tp
        }


def _tp(key: OrderingKey) -> TopicPartition:
    return key[0], key[1]


def _where(key: OrderingKey, offset: int) -> str:
    return f"{key[0]}[{key[1]}]@{offset}"
