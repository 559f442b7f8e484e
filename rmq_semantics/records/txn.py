"""Records of the transactional protocol, one frozen dataclass per Avro record type.

End requests go from producers to the Op topic; done and check markers are the
coordinator's own Op records; check requests go to the check topic. ``to_body()`` gives
the dict the Avro schema describes and ``from_body()`` takes one fastavro has already
checked against it, so neither validates again: these run per record (and per entry of
a batch) on the coordinator's hot path. Pure: no Kafka import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rmq_semantics.message import Headers
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.headers import RESERVED_PREFIX

__all__ = [
    "CheckMarker",
    "CheckRequest",
    "DoneEntry",
    "DoneMarker",
    "DoneMarkers",
    "EndEntry",
    "EndRequest",
    "EndRequests",
    "EndState",
    "Outcome",
]

Body = dict[str, Any]


class EndState(StrEnum):
    """What a producer asks for (the Avro enum ``EndState``)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class Outcome(StrEnum):
    """The coordinator's final decision for a half message (the Avro enum ``Outcome``)."""

    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"
    # Not final for the transaction: its half record was written again at a new offset
    # (re-append horizon), and this offset is done. Only in DoneMarkers v2.
    REAPPENDED = "REAPPENDED"


# Symbol -> member by dict lookup: a call of the Enum costs several times more, per entry.
_END_STATES = {s.value: s for s in EndState}
_OUTCOMES = {o.value: o for o in Outcome}


@dataclass(frozen=True, slots=True)
class EndRequest:
    """A producer's end-transaction request for one half message; ``from_check`` and
    ``check_seq`` say which back-check it answers."""

    txn_id: str
    producer_group: str
    half_partition: int
    half_offset: int
    state: EndState
    from_check: bool
    check_seq: int
    ts: int

    def to_body(self) -> Body:
        return {
            "txn_id": self.txn_id,
            "producer_group": self.producer_group,
            "half_partition": self.half_partition,
            "half_offset": self.half_offset,
            "state": self.state,
            "from_check": self.from_check,
            "check_seq": self.check_seq,
            "ts": self.ts,
        }

    @classmethod
    def from_body(cls, body: Body) -> EndRequest:
        return cls(
            body["txn_id"],
            body["producer_group"],
            body["half_partition"],
            body["half_offset"],
            _END_STATES[body["state"]],
            body["from_check"],
            body["check_seq"],
            body["ts"],
        )


@dataclass(frozen=True, slots=True)
class EndEntry:
    """One decision of an :class:`EndRequests` batch (an inline request, never a check's)."""

    txn_id: str
    half_offset: int
    state: EndState

    def to_body(self) -> Body:
        return {"txn_id": self.txn_id, "half_offset": self.half_offset, "state": self.state}

    @classmethod
    def from_body(cls, body: Body) -> EndEntry:
        return cls(body["txn_id"], body["half_offset"], _END_STATES[body["state"]])


@dataclass(frozen=True, slots=True)
class EndRequests:
    """Inline end requests of one producer for several half messages of one half partition
    (a batch of ``send_messages_in_transaction``)."""

    producer_group: str
    half_partition: int
    entries: tuple[EndEntry, ...]
    ts: int

    def to_body(self) -> Body:
        return {
            "producer_group": self.producer_group,
            "half_partition": self.half_partition,
            "entries": [e.to_body() for e in self.entries],
            "ts": self.ts,
        }

    @classmethod
    def from_body(cls, body: Body) -> EndRequests:
        entry = EndEntry.from_body
        return cls(
            body["producer_group"],
            body["half_partition"],
            tuple([entry(e) for e in body["entries"]]),
            body["ts"],
        )


@dataclass(frozen=True, slots=True)
class DoneMarker:
    """The final decision for one half message (RocketMQ's Op 'd' message). Coordinators
    now write :class:`DoneMarkers`; this one is still read from older Op records."""

    half_offset: int
    txn_id: str
    outcome: Outcome
    checks_answered: int
    ts: int

    def to_body(self) -> Body:
        return {
            "half_offset": self.half_offset,
            "txn_id": self.txn_id,
            "outcome": self.outcome,
            "checks_answered": self.checks_answered,
            "ts": self.ts,
        }

    @classmethod
    def from_body(cls, body: Body) -> DoneMarker:
        return cls(
            body["half_offset"],
            body["txn_id"],
            _OUTCOMES[body["outcome"]],
            body["checks_answered"],
            body["ts"],
        )


@dataclass(frozen=True, slots=True)
class DoneEntry:
    """One decision of a :class:`DoneMarkers` record."""

    half_offset: int
    txn_id: str
    outcome: Outcome
    checks_answered: int

    def to_body(self) -> Body:
        return {
            "half_offset": self.half_offset,
            "txn_id": self.txn_id,
            "outcome": self.outcome,
            "checks_answered": self.checks_answered,
        }

    @classmethod
    def from_body(cls, body: Body) -> DoneEntry:
        return cls(
            body["half_offset"], body["txn_id"], _OUTCOMES[body["outcome"]], body["checks_answered"]
        )


@dataclass(frozen=True, slots=True)
class DoneMarkers:
    """The decisions for several half messages of one half partition, written in one
    Kafka transaction. ``mac``: see coordinator/marker_auth.py."""

    entries: tuple[DoneEntry, ...]
    ts: int
    mac: bytes | None = None  # the writing coordinator's HMAC (v2); None before v2

    def to_body(self) -> Body:
        return {"entries": [e.to_body() for e in self.entries], "ts": self.ts, "mac": self.mac}

    @classmethod
    def from_body(cls, body: Body) -> DoneMarkers:
        entry = DoneEntry.from_body
        return cls(tuple([entry(e) for e in body["entries"]]), body["ts"], body.get("mac"))


@dataclass(frozen=True, slots=True)
class CheckMarker:
    """Check bookkeeping of one pending half message, so a new owner resumes the counts.
    ``mac``: see coordinator/marker_auth.py."""

    half_offset: int
    txn_id: str
    checks_issued: int
    checks_answered: int
    answered_seq: int
    next_check_ts: int
    ts: int
    mac: bytes | None = None  # the writing coordinator's HMAC (v2); None before v2

    def to_body(self) -> Body:
        return {
            "half_offset": self.half_offset,
            "txn_id": self.txn_id,
            "checks_issued": self.checks_issued,
            "checks_answered": self.checks_answered,
            "answered_seq": self.answered_seq,
            "next_check_ts": self.next_check_ts,
            "ts": self.ts,
            "mac": self.mac,
        }

    @classmethod
    def from_body(cls, body: Body) -> CheckMarker:
        return cls(
            body["half_offset"],
            body["txn_id"],
            body["checks_issued"],
            body["checks_answered"],
            body["answered_seq"],
            body["next_check_ts"],
            body["ts"],
            body.get("mac"),
        )


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """A back-check of a pending transaction for one live producer of its group: the half
    message as it was sent (real topic and partition, key, value, all headers)."""

    txn_id: str
    producer_group: str
    half_partition: int
    half_offset: int
    check_seq: int
    born_ts: int
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: Headers
    ts: int

    @classmethod
    def of_half(cls, half: HalfMessage, check_seq: int, ts: int) -> CheckRequest:
        return cls(
            half.txn_id,
            half.producer_group,
            half.partition,
            half.offset,
            check_seq,
            half.born_ts,
            half.real_topic,
            half.real_partition,
            half.key,
            half.value,
            half.headers,
            ts,
        )

    def user_headers(self) -> Headers:
        return [(k, v) for k, v in self.headers if not k.startswith(RESERVED_PREFIX)]

    def header_text(self, name: str) -> str | None:
        """The value of header ``name`` as text, None when absent or null."""
        for key, value in self.headers:
            if key == name:
                return None if value is None else value.decode(errors="replace")
        return None

    def to_body(self) -> Body:
        return {
            "txn_id": self.txn_id,
            "producer_group": self.producer_group,
            "half_partition": self.half_partition,
            "half_offset": self.half_offset,
            "check_seq": self.check_seq,
            "born_ts": self.born_ts,
            "topic": self.topic,
            "partition": self.partition,
            "key": self.key,
            "value": self.value,
            "headers": [{"key": k, "value": v} for k, v in self.headers],
            "ts": self.ts,
        }

    @classmethod
    def from_body(cls, body: Body) -> CheckRequest:
        return cls(
            body["txn_id"],
            body["producer_group"],
            body["half_partition"],
            body["half_offset"],
            body["check_seq"],
            body["born_ts"],
            body["topic"],
            body["partition"],
            body["key"],
            body["value"],
            [(h["key"], h["value"]) for h in body["headers"]],
            body["ts"],
        )
