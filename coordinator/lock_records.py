"""Wire format of the queue-lock protocol: requests, replies and persisted lock state.

Records are compact UTF-8 JSON objects with a ``"v"`` (schema version) field, so a newer
reader can accept older records and a human can read the topics with any console
consumer. Readers accept versions up to :data:`RECORD_VERSION` and ignore unknown fields;
anything else raises :class:`MalformedRecordError`. Pure: no Kafka import.

- ``<prefix>_lock_request`` — :class:`LockRequest`, one per (client call, request
  partition). The partition is ``murmur2(key) % N`` of the lock keys it carries
  (``group/topic/partition``); a request only carries keys of its own partition, and its
  record key is the first of them.
- ``<prefix>_lock`` — the lock state, compacted, key ``group/topic/partition``, same
  partition as the requests for that key (:func:`encode_state` / :func:`decode_state`).
- ``<prefix>_lock_reply`` — :class:`LockReply`, key = client id, written to the reply
  partition the client named in its request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from coordinator.lock import LockDecision, LockEntry, LockKey, LockState
from rmq_semantics.errors import MalformedRecordError

__all__ = [
    "RECORD_VERSION",
    "LockReply",
    "LockRequest",
    "QueueRef",
    "QueueResult",
    "RequestKind",
    "decode_state",
    "encode_state",
]

RECORD_VERSION = 1


class RequestKind(StrEnum):
    LOCK = "lock"
    UNLOCK = "unlock"


def _dump(body: dict[str, Any]) -> bytes:
    return json.dumps({"v": RECORD_VERSION, **body}, separators=(",", ":")).encode()


def _load(data: bytes | None, what: str) -> dict[str, Any]:
    if not data:
        raise MalformedRecordError(f"{what}: empty record")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRecordError(f"{what}: not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise MalformedRecordError(f"{what}: not a JSON object")
    version = body.get("v")
    if not isinstance(version, int) or not 1 <= version <= RECORD_VERSION:
        raise MalformedRecordError(f"{what}: unsupported version {version!r}")
    return body


def _kind(body: dict, what: str) -> RequestKind:
    try:
        return RequestKind(body.get("kind"))
    except ValueError as exc:
        raise MalformedRecordError(f"{what}: unknown kind {body.get('kind')!r}") from exc


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedRecordError(f"{what}: field {name!r} is {value!r}")
    return value


def _opt_int(body: dict[str, Any], name: str, what: str) -> int:
    return 0 if body.get(name) is None else _field(body, name, int, what)


@dataclass(frozen=True)
class QueueRef:
    """One queue in a request; ``epoch`` (unlock only) releases only that grant."""

    topic: str
    partition: int
    epoch: int | None = None

    def key(self, group: str) -> LockKey:
        return LockKey(group, self.topic, self.partition)


@dataclass(frozen=True)
class LockRequest:
    """A batch lock or unlock (RocketMQ's ``LockBatchRequestBody``)."""

    kind: RequestKind
    request_id: str
    client_id: str
    group: str
    reply_partition: int
    queues: tuple[QueueRef, ...]
    lease_ms: int = 0
    sent_at_ms: int = 0

    def encode(self) -> bytes:
        return _dump({
            "kind": self.kind.value, "request_id": self.request_id,
            "client_id": self.client_id, "group": self.group,
            "reply_partition": self.reply_partition, "lease_ms": self.lease_ms,
            "sent_at_ms": self.sent_at_ms,
            "queues": [{"topic": q.topic, "partition": q.partition, "epoch": q.epoch}
                       for q in self.queues]})

    @classmethod
    def decode(cls, data: bytes | None) -> LockRequest:
        what = "lock request"
        body = _load(data, what)
        kind = _kind(body, what)
        queues = []
        for q in _field(body, "queues", list, what):
            if not isinstance(q, dict):
                raise MalformedRecordError(f"{what}: queue {q!r} is not an object")
            epoch = q.get("epoch")
            if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
                raise MalformedRecordError(f"{what}: epoch {epoch!r}")
            queues.append(QueueRef(_field(q, "topic", str, what),
                                   _field(q, "partition", int, what), epoch))
        return cls(kind, _field(body, "request_id", str, what),
                   _field(body, "client_id", str, what), _field(body, "group", str, what),
                   _field(body, "reply_partition", int, what), tuple(queues),
                   _opt_int(body, "lease_ms", what), _opt_int(body, "sent_at_ms", what))


@dataclass(frozen=True)
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
    def from_decision(cls, decision: LockDecision) -> QueueResult:
        return cls(decision.key.topic, decision.key.partition, decision.granted,
                   decision.reason, decision.epoch, decision.lease_ms,
                   decision.expires_at_ms, decision.client_id)

    @classmethod
    def refused(cls, ref: QueueRef, reason: str) -> QueueResult:
        return cls(ref.topic, ref.partition, False, reason, -1, 0, 0, "")


@dataclass(frozen=True)
class LockReply:
    """The answer to one :class:`LockRequest` (``LockBatchResponseBody``)."""

    request_id: str
    client_id: str
    kind: RequestKind
    results: tuple[QueueResult, ...]

    def encode(self) -> bytes:
        return _dump({
            "request_id": self.request_id, "client_id": self.client_id,
            "kind": self.kind.value,
            "results": [{"topic": r.topic, "partition": r.partition, "granted": r.granted,
                         "reason": r.reason, "epoch": r.epoch, "lease_ms": r.lease_ms,
                         "expires_at_ms": r.expires_at_ms, "holder": r.holder}
                        for r in self.results]})

    @classmethod
    def decode(cls, data: bytes | None) -> LockReply:
        what = "lock reply"
        body = _load(data, what)
        kind = _kind(body, what)
        results = []
        for r in _field(body, "results", list, what):
            if not isinstance(r, dict):
                raise MalformedRecordError(f"{what}: result {r!r} is not an object")
            results.append(QueueResult(
                _field(r, "topic", str, what), _field(r, "partition", int, what),
                _field(r, "granted", bool, what), str(r.get("reason", "")),
                _field(r, "epoch", int, what), _opt_int(r, "lease_ms", what),
                _field(r, "expires_at_ms", int, what), str(r.get("holder") or "")))
        return cls(_field(body, "request_id", str, what), _field(body, "client_id", str, what),
                   kind, tuple(results))


def encode_state(entry: LockEntry) -> tuple[bytes, bytes]:
    """(key, value) of the compacted lock-state record for ``entry``."""
    return str(entry.key).encode(), _dump({
        "group": entry.key.group, "topic": entry.key.topic, "partition": entry.key.partition,
        "state": entry.state.value, "client_id": entry.client_id, "epoch": entry.epoch,
        "lease_ms": entry.lease_ms, "acquired_at_ms": entry.acquired_at_ms,
        "expires_at_ms": entry.expires_at_ms, "updated_at_ms": entry.updated_at_ms})


def decode_state(key: bytes | None, value: bytes | None) -> LockEntry:
    """A lock-state record back to a :class:`LockEntry` (the key must match the body)."""
    what = "lock state"
    body = _load(value, what)
    entry_key = LockKey(_field(body, "group", str, what), _field(body, "topic", str, what),
                        _field(body, "partition", int, what))
    if key is not None and key != str(entry_key).encode():
        raise MalformedRecordError(f"{what}: record key {key!r} does not match {entry_key}")
    try:
        state = LockState(body.get("state"))
    except ValueError as exc:
        raise MalformedRecordError(f"{what}: unknown state {body.get('state')!r}") from exc
    return LockEntry(entry_key, state, str(body.get("client_id") or ""),
                     _field(body, "epoch", int, what), _opt_int(body, "lease_ms", what),
                     _opt_int(body, "acquired_at_ms", what),
                     _field(body, "expires_at_ms", int, what),
                     _opt_int(body, "updated_at_ms", what))
