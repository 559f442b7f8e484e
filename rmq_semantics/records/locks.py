"""Records of the queue-lock protocol: the lock key and its routing, requests, replies and
the persisted lock state with its lifecycle. Pure: no Kafka import.

- ``<prefix>_lock_request``: :class:`LockRequest`, one per (client call, request
  partition). :meth:`LockKey.request_partition` is the one routing rule: a request only
  carries keys of its own partition, and its record key is the first of them. Under tenant
  isolation it carries its consumer group's MAC over :meth:`LockRequest.canonical`.
- ``<prefix>_lock``: :class:`LockEntry`, compacted, record key :meth:`LockKey.record_key`,
  same partition as the requests for that key.
- ``<prefix>_lock_reply``: :class:`LockReply`, record key = client id, written to the reply
  partition the client named in its request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from typing import Any

from rmq_semantics.errors import ConfigError, IllegalTransitionError
from rmq_semantics.selector import java_partition

__all__ = [
    "LOCK_DOMAIN",
    "MAX_ID_CHARS",
    "MAX_REPLY_BYTES",
    "LockEntry",
    "LockKey",
    "LockReply",
    "LockRequest",
    "LockState",
    "QueueRef",
    "QueueResult",
    "RequestKind",
    "reply_bound",
    "transition",
]

Body = dict[str, Any]

# The lock service's limits, shared so a client never sends what the service refuses.
# A request's ids and group, at most (a reply repeats the client id in key and value,
# and a denied queue its holder's; an orderly consumer's is ``group@`` and 12 hex digits).
MAX_ID_CHARS = 255
# A reply, at most, as estimated before it is written: under the broker's default 1 MB
# (max.message.bytes), so one request can never make its reply unwritable.
MAX_REPLY_BYTES = 900 * 1024
# Per queue result: the fixed Avro fields (granted, reason, epoch, lease, expiry) at most.
RESULT_OVERHEAD = 64
#: Separates a lock request's MAC from any other use of a consumer group's key; bump it if
#: :meth:`LockRequest.canonical` changes.
LOCK_DOMAIN = "rmq.consumer-lock.v1"


def reply_bound(client_id: str, request_id: str, topics: Any) -> int:
    """The most bytes the reply to a request for queues of ``topics`` (one name per queue)
    can take: each result may name a holder of :data:`MAX_ID_CHARS`."""
    return (
        2 * len(client_id)
        + len(request_id)
        + sum(len(topic) + MAX_ID_CHARS + RESULT_OVERHEAD for topic in topics)
    )


@dataclass(frozen=True, order=True, slots=True)
class LockKey:
    """(consumer group, topic, partition); its text form ``group/topic/partition`` is the
    record key on the lock topics (topic names cannot contain ``/``, group ids can)."""

    group: str
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.group}/{self.topic}/{self.partition}"

    def record_key(self) -> bytes:
        return str(self).encode()

    def request_partition(self, request_partitions: int) -> int:
        """The request (and lock-state) partition of this key: Java's default partitioner
        on the record key, so the client and every service instance agree."""
        return java_partition(self.record_key(), request_partitions)

    @classmethod
    def parse(cls, text: str) -> LockKey:
        parts = text.rsplit("/", 2)
        if len(parts) == 3 and parts[0] and parts[1] and parts[2].isdigit():
            return cls(parts[0], parts[1], int(parts[2]))
        raise ConfigError(f"lock key {text!r}: want 'group/topic/partition'")


# -- lock state ------------------------------------------------------------------------------
class LockState(Enum):
    """Lifecycle of one queue lock (the Avro enum ``LockState``)."""

    FREE = "FREE"
    HELD = "HELD"
    RELEASED = "RELEASED"
    EXPIRED = "EXPIRED"


#: The one transition table. HELD -> HELD is a renewal by the holder (same epoch); every
#: other move into HELD is a new grant (epoch + 1). Nothing returns to FREE.
TRANSITIONS: dict[LockState, frozenset[LockState]] = {
    LockState.FREE: frozenset({LockState.HELD}),
    LockState.HELD: frozenset({LockState.HELD, LockState.RELEASED, LockState.EXPIRED}),
    LockState.RELEASED: frozenset({LockState.HELD}),
    LockState.EXPIRED: frozenset({LockState.HELD}),
}


def transition(current: LockState, target: LockState) -> LockState:
    """Return ``target`` if the lifecycle allows ``current -> target``, else raise."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransitionError(f"queue lock cannot go from {current.value} to {target.value}")
    return target


@dataclass(frozen=True, slots=True)
class LockEntry:
    """The state of one queue lock, as persisted. ``expires_at_ms`` is meaningful while
    ``HELD``; times are wall-clock milliseconds."""

    key: LockKey
    state: LockState = LockState.FREE
    client_id: str = ""
    epoch: int = 0
    lease_ms: int = 0
    acquired_at_ms: int = 0
    expires_at_ms: int = 0
    updated_at_ms: int = 0

    def live(self, now_ms: int) -> bool:
        """Held and the lease has not lapsed at ``now_ms``."""
        return self.state is LockState.HELD and now_ms < self.expires_at_ms

    def held_by(self, client_id: str, now_ms: int) -> bool:
        return self.live(now_ms) and self.client_id == client_id

    def remaining_ms(self, now_ms: int) -> int:
        return max(0, self.expires_at_ms - now_ms) if self.live(now_ms) else 0

    def moved(self, target: LockState, **changes: Any) -> LockEntry:
        """A copy in state ``target``; the one place an entry changes state."""
        return replace(self, state=transition(self.state, target), **changes)

    def to_body(self) -> Body:
        return {
            "group": self.key.group,
            "topic": self.key.topic,
            "partition": self.key.partition,
            "state": self.state.value,
            "client_id": self.client_id,
            "epoch": self.epoch,
            "lease_ms": self.lease_ms,
            "acquired_at_ms": self.acquired_at_ms,
            "expires_at_ms": self.expires_at_ms,
            "updated_at_ms": self.updated_at_ms,
        }

    @classmethod
    def from_body(cls, body: Body) -> LockEntry:
        return cls(
            LockKey(body["group"], body["topic"], body["partition"]),
            LockState(body["state"]),
            body["client_id"],
            body["epoch"],
            body["lease_ms"],
            body["acquired_at_ms"],
            body["expires_at_ms"],
            body["updated_at_ms"],
        )


# -- requests and replies --------------------------------------------------------------------
class RequestKind(StrEnum):
    LOCK = "lock"
    UNLOCK = "unlock"


@dataclass(frozen=True, slots=True)
class QueueRef:
    """One queue in a request; ``epoch`` (unlock only) releases only that grant."""

    topic: str
    partition: int
    epoch: int | None = None

    def key(self, group: str) -> LockKey:
        return LockKey(group, self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class LockRequest:
    """A batch lock or unlock (RocketMQ's ``LockBatchRequestBody``). ``wait_ms`` is how long
    the client waits for the reply (0: not said, as in schema v1); a lock request older
    than that is refused, since its client no longer listens for the grant. ``mac``
    (schema v3; None: unsigned) is the consumer group's HMAC over :meth:`canonical`."""

    kind: RequestKind
    request_id: str
    client_id: str
    group: str
    reply_partition: int
    queues: tuple[QueueRef, ...]
    lease_ms: int = 0
    sent_at_ms: int = 0
    wait_ms: int = 0
    mac: bytes | None = None

    def canonical(self, topic: str, partition: int) -> bytes:
        """The bytes its MAC covers: every field but the MAC, and the request topic and
        partition it is written to (ASCII JSON: any group name encodes)."""
        fields = [
            LOCK_DOMAIN,
            topic,
            partition,
            self.kind.value,
            self.request_id,
            self.client_id,
            self.group,
            self.reply_partition,
            [[q.topic, q.partition, q.epoch] for q in self.queues],
            self.lease_ms,
            self.sent_at_ms,
            self.wait_ms,
        ]
        return json.dumps(fields, separators=(",", ":")).encode()

    def to_body(self) -> Body:
        return {
            "kind": self.kind.value,
            "request_id": self.request_id,
            "client_id": self.client_id,
            "group": self.group,
            "reply_partition": self.reply_partition,
            "queues": [
                {"topic": q.topic, "partition": q.partition, "epoch": q.epoch} for q in self.queues
            ],
            "lease_ms": self.lease_ms,
            "sent_at_ms": self.sent_at_ms,
            "wait_ms": self.wait_ms,
            "mac": self.mac,
        }

    @classmethod
    def from_body(cls, body: Body) -> LockRequest:
        return cls(
            RequestKind(body["kind"]),
            body["request_id"],
            body["client_id"],
            body["group"],
            body["reply_partition"],
            tuple(QueueRef(q["topic"], q["partition"], q["epoch"]) for q in body["queues"]),
            body["lease_ms"],
            body["sent_at_ms"],
            body.get("wait_ms", 0),
            body.get("mac"),
        )


@dataclass(frozen=True, slots=True)
class QueueResult:
    """The outcome for one queue. For a denied lock ``holder``/``epoch``/``expires_at_ms``
    describe the current holder."""

    topic: str
    partition: int
    granted: bool
    reason: str
    epoch: int
    lease_ms: int
    expires_at_ms: int
    holder: str

    @classmethod
    def refused(cls, ref: QueueRef, reason: str) -> QueueResult:
        return cls(ref.topic, ref.partition, False, reason, -1, 0, 0, "")


@dataclass(frozen=True, slots=True)
class LockReply:
    """The answer to one :class:`LockRequest` (``LockBatchResponseBody``)."""

    request_id: str
    client_id: str
    kind: RequestKind
    results: tuple[QueueResult, ...]

    def to_body(self) -> Body:
        return {
            "request_id": self.request_id,
            "client_id": self.client_id,
            "kind": self.kind.value,
            "results": [
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "granted": r.granted,
                    "reason": r.reason,
                    "epoch": r.epoch,
                    "lease_ms": r.lease_ms,
                    "expires_at_ms": r.expires_at_ms,
                    "holder": r.holder,
                }
                for r in self.results
            ],
        }

    @classmethod
    def from_body(cls, body: Body) -> LockReply:
        return cls(
            body["request_id"],
            body["client_id"],
            RequestKind(body["kind"]),
            tuple(
                QueueResult(
                    r["topic"],
                    r["partition"],
                    r["granted"],
                    r["reason"],
                    r["epoch"],
                    r["lease_ms"],
                    r["expires_at_ms"],
                    r["holder"],
                )
                for r in body["results"]
            ),
        )
