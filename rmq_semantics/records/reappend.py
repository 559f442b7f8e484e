"""Half records the coordinator writes again past its re-append horizon (RocketMQ's
``putBackHalfMsgQueue``): the ``rmq.*`` headers that carry a pending transaction's origin and
check counts to its new offset, and their parse. Pure: no Kafka import.

The re-appended record is the producer's record (key, value, every header, so the same
transaction id and birth time) plus :data:`~.headers.REAPPEND_HEADERS`. Reading it back gives
the producer's record again, with the Kafka timestamp of its first append, so the retention
discard still counts from there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.message import Headers
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.headers import REAPPEND_HEADERS

__all__ = ["Carried", "reappended_headers", "split_reappended"]

_NAMES = frozenset(REAPPEND_HEADERS)  # read per half record: a set lookup per header


@dataclass(frozen=True, slots=True)
class Carried:
    """What a re-appended half record carries from the offset it replaces."""

    previous_offset: int  # the half offset this record replaces (same partition)
    origin_offset: int  # where the transaction was first written: what its producer knows
    origin_ts: int  # the Kafka timestamp of that first record
    checks_issued: int
    checks_answered: int
    answered_seq: int
    next_check_ts: int

    def headers(self) -> Headers:
        values = (
            self.previous_offset,
            self.origin_offset,
            self.origin_ts,
            self.checks_issued,
            self.checks_answered,
            self.answered_seq,
            self.next_check_ts,
        )
        return [(name, str(v).encode()) for name, v in zip(REAPPEND_HEADERS, values, strict=True)]


def reappended_headers(half: HalfMessage, carried: Carried) -> Headers:
    """The headers of ``half`` written again: its own without any earlier re-append's, plus
    ``carried``'s."""
    return [*[(k, v) for k, v in half.headers if k not in _NAMES], *carried.headers()]


def split_reappended(half: HalfMessage) -> tuple[HalfMessage, Carried | None]:
    """``half`` as its producer wrote it, and what the coordinator carried over when it
    re-appended it (None for a record a producer wrote).

    Re-append headers that are incomplete, not numbers or not consistent with the record's
    offset were not written by a coordinator: MalformedRecordError.
    """
    found = {k: v for k, v in half.headers if k in _NAMES}
    if not found:
        return half, None
    if len(found) != len(REAPPEND_HEADERS):
        raise MalformedRecordError(f"{half.where}: re-append headers incomplete: {sorted(found)}")
    try:
        carried = Carried(*(int(found[name] or b"") for name in REAPPEND_HEADERS))
    except ValueError as exc:
        raise MalformedRecordError(f"{half.where}: bad re-append header: {exc}") from exc
    if (
        not 0 <= carried.origin_offset <= carried.previous_offset < half.offset
        or min(carried.checks_issued, carried.checks_answered, carried.answered_seq) < 0
    ):
        raise MalformedRecordError(
            f"{half.where}: re-append headers do not fit offset {half.offset}: {carried}"
        )
    original = [(k, v) for k, v in half.headers if k not in _NAMES]
    return dataclasses.replace(half, timestamp_ms=carried.origin_ts, headers=original), carried
