"""The queue-lock table (RocketMQ's broker-side ``RebalanceLockManager``): pure, clock passed in.

One entry per (consumer group, topic, partition). Its lifecycle is
``FREE -> HELD(epoch) -> RELEASED | EXPIRED``, and a released or expired lock can be
``HELD`` again with the next epoch. Decisions follow ``tryLockBatch``: the holder renews
while its lease is live, any other client is denied, and a lapsed lease is taken over
with ``epoch + 1``. Epochs only grow, so a consumer can fence its work with the epoch it
was granted. Times are wall-clock milliseconds (``now_ms``) because the table outlives a
coordinator process: it is restored from the compacted lock topic by the next owner.
The entry, its key and lifecycle are the lock-state record of :mod:`rmq_semantics.records.locks`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.locks import (
    MAX_ID_CHARS,
    MAX_REPLY_BYTES,
    LockEntry,
    LockKey,
    LockRequest,
    LockState,
    QueueResult,
    RequestKind,
    reply_bound,
    transition,
)

__all__ = [
    "LeaseCeiling",
    "LockDecision",
    "LockEntry",
    "LockKey",
    "LockState",
    "LockTable",
    "RequestPoison",
    "lock_request_problem",
    "stale_lock_request",
    "transition",
]

log = logging.getLogger(__name__)

# Distinct asked leases the cap is logged for (renewals repeat the same one).
CAP_LOG_MAX = 64
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# Requests set aside, and suspects, remembered at most.
POISON_MEMORY = 10_000

Request = tuple[int, int]  # (request partition, offset)


class RequestPoison:
    """Lock requests whose Kafka transaction failed (coordinator/poison.py's idea for
    promotions): after an abort every request of the batch is a suspect and goes alone;
    one that fails alone ``replay_max`` times is set aside, so none wedges its partition."""

    def __init__(self, replay_max: int) -> None:
        self.replay_max = replay_max
        self._suspects: dict[Request, int] = {}  # -> failures alone
        self._poison: dict[Request, None] = {}  # insertion-ordered, bounded

    def suspect(self, requests: list[Request]) -> bool:
        """Whether any of ``requests`` is a suspect (then each goes in its own transaction)."""
        return bool(self._suspects) and any(r in self._suspects for r in requests)

    def __contains__(self, request: object) -> bool:
        """Set aside: skipped (its offset is committed, it is never answered)."""
        return request in self._poison

    def passed(self, requests: list[Request]) -> None:
        if len(requests) == 1:
            self._suspects.pop(requests[0], None)

    def failed(self, requests: list[Request]) -> Request | None:
        """The transaction of ``requests`` aborted: the request set aside now, if any."""
        if len(requests) != 1:
            if len(self._suspects) > POISON_MEMORY:
                self._suspects.clear()  # leftovers of lost partitions: one more replay at most
            self._suspects.update({r: self._suspects.get(r, 0) for r in requests})
            return None
        [request] = requests
        self._suspects[request] = self._suspects.get(request, 0) + 1
        if self._suspects[request] < self.replay_max:
            return None
        del self._suspects[request]
        self._poison[request] = None
        while len(self._poison) > POISON_MEMORY:
            del self._poison[next(iter(self._poison))]
        return request


def lock_request_problem(request: LockRequest) -> str | None:
    """Why ``request`` is refused before it is decided (None: it is not): ids too long,
    a topic that is no Kafka topic name, or a reply that would be too big to write."""
    for name in ("client_id", "request_id", "group"):
        value = getattr(request, name)
        if not 0 < len(value) <= MAX_ID_CHARS:
            return f"{name} of {len(value)} characters (1..{MAX_ID_CHARS})"
    if not request.queues:
        return "no queues"
    for ref in request.queues:
        if not _TOPIC.fullmatch(ref.topic) or ref.topic in (".", "..") or ref.partition < 0:
            return f"queue {ref.topic[:64]!r}[{ref.partition}] is not a Kafka partition"
    reply = reply_bound(
        request.client_id, request.request_id, (ref.topic for ref in request.queues)
    )
    if reply > MAX_REPLY_BYTES:
        return (
            f"{len(request.queues)} queues: its reply could reach {reply} bytes "
            f"(at most {MAX_REPLY_BYTES}); send fewer per request"
        )
    return None


def stale_lock_request(
    request: LockRequest, lease_ms: int, now_ms: int, appended_ms: int | None = None
) -> int | None:
    """The age of a lock request too old to grant, else None.

    RocketMQ's lock is a synchronous call; here a request can wait in the request topic
    while no service runs, and a grant its client no longer waits for is a phantom lease
    that keeps the queue from everyone. Its age counts from ``appended_ms`` (the broker's
    append time, when the topic records it: no client clock involved) or else from the
    client's ``sent_at_ms``. The limit is the wait the client named; a client that named
    none (schema v1) cannot use a grant older than the lease it asked for (``lease_ms``,
    as granted). Unlocks are never stale: releasing is always safe.
    """
    if request.kind is not RequestKind.LOCK:
        return None
    start = appended_ms if appended_ms is not None and appended_ms > 0 else request.sent_at_ms
    limit = request.wait_ms if request.wait_ms > 0 else lease_ms
    if start <= 0 or limit <= 0:
        return None  # not said: nothing to measure
    age = now_ms - start
    return age if age > limit else None


@dataclass(frozen=True)
class LockDecision:
    """What a lock or unlock request got, and the entry to persist (None: unchanged).

    ``granted`` is True when the requester holds the lock afterwards (lock) or released
    it (unlock). For a denied lock, ``client_id``/``epoch``/``expires_at_ms`` describe the
    current holder.
    """

    key: LockKey
    granted: bool
    reason: str
    client_id: str
    epoch: int
    lease_ms: int
    expires_at_ms: int
    entry: LockEntry | None = None

    def result(self) -> QueueResult:
        """This decision as the reply record carries it."""
        return QueueResult(
            self.key.topic,
            self.key.partition,
            self.granted,
            self.reason,
            self.epoch,
            self.lease_ms,
            self.expires_at_ms,
            self.client_id,
        )


def _answer(entry: LockEntry, granted: bool, reason: str, changed: bool) -> LockDecision:
    return LockDecision(
        entry.key,
        granted,
        reason,
        entry.client_id,
        entry.epoch,
        entry.lease_ms,
        entry.expires_at_ms,
        entry if changed else None,
    )


class LockTable:
    """Lock entries by key, with the lock/renew/unlock decisions.

    ``overlay()`` gives a child table that reads through to this one and records its own
    changes, so a coordinator can stage a batch and ``absorb`` it only once the Kafka
    transaction that persists it has committed.
    """

    def __init__(self, parent: LockTable | None = None) -> None:
        self._entries: dict[LockKey, LockEntry] = {}
        self._parent = parent

    # -- storage ---------------------------------------------------------------------------
    def get(self, key: LockKey) -> LockEntry:
        entry = self._entries.get(key)
        if entry is None and self._parent is not None:
            entry = self._parent._lookup(key)
        return entry if entry is not None else LockEntry(key)

    def _lookup(self, key: LockKey) -> LockEntry | None:
        entry = self._entries.get(key)
        if entry is None and self._parent is not None:
            return self._parent._lookup(key)
        return entry

    def _put(self, entry: LockEntry) -> None:
        self._entries[entry.key] = entry

    def __iter__(self) -> Iterator[LockEntry]:
        """This table's own entries (an overlay: only what it changed)."""
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def overlay(self) -> LockTable:
        return LockTable(parent=self)

    def absorb(self, child: LockTable) -> None:
        """Take over what an overlay changed (after its changes were persisted)."""
        for entry in child:
            self._put(entry)

    def drop(self, keep: Callable[[LockKey], bool]) -> int:
        """Forget entries whose key fails ``keep(key)`` (partitions this owner lost)."""
        gone = [k for k in self._entries if not keep(k)]
        for key in gone:
            del self._entries[key]
        return len(gone)

    def restore(self, entry: LockEntry, now_ms: int, grace_ms: int) -> LockEntry:
        """Load a persisted entry when taking over its partition.

        A held lease is extended to at least ``now_ms + grace_ms``: this owner's clock is
        not the previous owner's, so it never frees a lock earlier than a full lease after
        it took over. An entry older than the one known is ignored (epochs only grow).
        """
        known = self._lookup(entry.key)
        if known is not None and (known.epoch, known.updated_at_ms) > (
            entry.epoch,
            entry.updated_at_ms,
        ):
            return known
        if entry.state is LockState.HELD:
            entry = replace(entry, expires_at_ms=max(entry.expires_at_ms, now_ms + grace_ms))
        self._put(entry)
        return entry

    # -- decisions -------------------------------------------------------------------------
    def lock(self, key: LockKey, client_id: str, lease_ms: int, now_ms: int) -> LockDecision:
        """Grant, renew or deny ``key`` for ``client_id`` (RocketMQ's ``tryLockBatch``)."""
        if not client_id:
            raise ConfigError("lock: client_id must be non-empty")
        if lease_ms <= 0:
            raise ConfigError(f"lock: lease_ms must be > 0, got {lease_ms}")
        entry = self.get(key)
        expires = now_ms + lease_ms
        if entry.held_by(client_id, now_ms):
            renewed = entry.moved(
                LockState.HELD, lease_ms=lease_ms, expires_at_ms=expires, updated_at_ms=now_ms
            )
            self._put(renewed)
            return _answer(renewed, True, "renewed", True)
        if entry.live(now_ms):
            return _answer(entry, False, "held_by_other", False)
        reason = "granted"
        if entry.state is LockState.HELD:  # lapsed lease: it expires now, then is taken over
            entry = entry.moved(LockState.EXPIRED, updated_at_ms=now_ms)
            reason = "taken_over"
        granted = entry.moved(
            LockState.HELD,
            client_id=client_id,
            epoch=entry.epoch + 1,
            lease_ms=lease_ms,
            acquired_at_ms=now_ms,
            expires_at_ms=expires,
            updated_at_ms=now_ms,
        )
        self._put(granted)
        return _answer(granted, True, reason, True)

    def unlock(
        self, key: LockKey, client_id: str, now_ms: int, epoch: int | None = None
    ) -> LockDecision:
        """Release ``key`` if ``client_id`` holds it (and, if given, with ``epoch``)."""
        entry = self.get(key)
        if not entry.held_by(client_id, now_ms):
            return _answer(entry, False, "not_holder", False)
        if epoch is not None and epoch != entry.epoch:
            return _answer(entry, False, "stale_epoch", False)
        released = entry.moved(LockState.RELEASED, expires_at_ms=now_ms, updated_at_ms=now_ms)
        self._put(released)
        return _answer(released, True, "released", True)

    def expire(self, key: LockKey, now_ms: int) -> LockDecision:
        """Mark a lapsed lease EXPIRED (for housekeeping; ``lock`` does this on its own)."""
        entry = self.get(key)
        if entry.state is not LockState.HELD or entry.live(now_ms):
            return _answer(entry, False, "not_lapsed", False)
        expired = entry.moved(LockState.EXPIRED, updated_at_ms=now_ms)
        self._put(expired)
        return _answer(expired, True, "expired", True)


class LeaseCeiling:
    """The lease to grant: what the client asked, at most ``lock_lease_ms`` (its default).
    The client times its lease by the granted one, so a cap is safe, but it renews on its
    own schedule: the cap is logged, once per asked lease (renewals repeat it)."""

    def __init__(self, ceiling_ms: int) -> None:
        self.ceiling_ms = ceiling_ms
        self._logged: set[int] = set()

    def __call__(self, request: LockRequest) -> int:
        ceiling = self.ceiling_ms
        if request.lease_ms <= 0:
            return ceiling
        if request.lease_ms <= ceiling:
            return request.lease_ms
        if request.lease_ms not in self._logged and len(self._logged) < CAP_LOG_MAX:
            self._logged.add(request.lease_ms)
            log.warning(
                "lock requests of %s (group %s) ask a %d ms lease; this coordinator "
                "grants at most lock_lease_ms=%d ms, so the consumer's lock_renew_ms "
                "must stay below 2/3 of that",
                request.client_id,
                request.group,
                request.lease_ms,
                ceiling,
            )
        return ceiling
