"""Timer records as a state machine (Hypothesis, issue 35), against a model of what each
scheduled message is: producers send messages with a delivery time (signed or not), the
coordinator's moves re-append them through level topics, recalls write cancel records, and
an intruder rewrites a header of a record in flight.

Promises checked after every step: every record as read parses to the message the model
holds (id, due time, real topic and partition, birth, group, key, value, user headers),
wherever it has been moved; its MAC verifies under its group's key exactly when nothing
that decides delivery was changed; its delivered headers name its intake record; a cancel
decodes to its id and group; a tampered record is either malformed with a reason or still
the same message (a header the parse does not read)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.message import Message
from rmq_semantics.records.codec import decode_timer_cancel, encode
from rmq_semantics.records.group_auth import derive_group_key, sign_timer_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.timer import (
    TimerCancel,
    TimerRecord,
    parse_timer,
    timer_headers,
)
from tests.model.broken import find_failure

T = 1_700_000_000_000
KEY = derive_group_key(b"model-tenant-key-0123456789abcdef", "pg")
# Headers whose change alters where, when or what is delivered: the MAC covers them.
COVERED = (H.TIMER_ID, H.DELIVER_AT, H.REAL_TOPIC, H.REAL_PARTITION, H.BORN_TS)


@dataclass
class Scheduled:
    """The model of one message: what was sent, and where its record is now."""

    timer_id: str
    msg: Message
    deliver_at: int
    signed: bool
    intake_offset: int
    user_headers: list
    level: int = 0
    offset: int = 0
    headers: list | None = None
    tampered: bool = False  # an intruder rewrote a header the parse reads


class TimerRecordMachine(RuleBasedStateMachine):
    scheduled = Bundle("scheduled")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.live: list[Scheduled] = []
        self.cancels: list[tuple[bytes, bytes, str, str | None]] = []

    @rule(
        target=scheduled,
        due_in=st.integers(-(10**6), 3 * 86_400_000),
        key=st.sampled_from([None, b"k", b""]),
        value=st.binary(max_size=8),
        headers=st.lists(
            st.tuples(st.sampled_from(["a", "b", "traceparent"]), st.binary(max_size=4)),
            max_size=3,
        ),
        partition=st.sampled_from([None, 0, 5]),
        tags=st.sampled_from([None, "TagA"]),
        signed=st.booleans(),
    )
    def send(self, due_in, key, value, headers, partition, tags, signed) -> Scheduled:
        timer_id = f"{self.count:032x}"
        self.count += 1
        msg = Message("orders", value, key=key, headers=headers, partition=partition, tags=tags)
        written = timer_headers(msg, timer_id, T + due_in, T, "pg" if signed else None)
        if signed:
            written = sign_timer_headers(KEY, written, msg.key, msg.value)
        at = self.count * 3
        s = Scheduled(timer_id, msg, T + due_in, signed, at, msg.user_headers(), 0, at, written)
        self.live.append(s)
        return s

    @rule(s=scheduled, level=st.integers(1, 18))
    def reappend(self, s: Scheduled, level: int) -> None:
        """The coordinator's move to a level topic (only of a record it could read)."""
        record = self._read(s)
        if record is not None:
            s.headers, s.level, s.offset = record.reappended_headers(), level, s.offset + 7

    @rule(s=scheduled, name=st.sampled_from([*COVERED, H.TAGS, "a"]), raw=st.binary(max_size=6))
    def tamper(self, s: Scheduled, name: str, raw: bytes) -> None:
        """An intruder rewrites one header of the record in flight."""
        assert s.headers is not None
        s.headers = [(k, raw if k == name else v) for k, v in s.headers]
        s.user_headers = [(k, raw if k == name else v) for k, v in s.user_headers]
        s.tampered = s.tampered or (name in COVERED and any(k == name for k, _ in s.headers))

    @rule(s=scheduled, ts=st.integers(0, 2**40))
    def recall(self, s: Scheduled, ts: int) -> None:
        group = "pg" if s.signed else None
        value = encode(TimerCancel(s.timer_id, group, ts))
        self.cancels.append((s.timer_id.encode(), value, s.timer_id, group))

    def _read(self, s: Scheduled) -> TimerRecord | None:
        try:
            return parse_timer(s.level, 2, s.offset, T, s.msg.key, s.msg.value, s.headers)
        except MalformedRecordError as exc:
            where = "timer" if s.level == 0 else f"timer_{s.level}"
            assert str(exc).startswith(f"{where}[2]@{s.offset}: "), exc
            return None

    @invariant()
    def every_record_is_its_message(self) -> None:
        for s in self.live:
            record = self._read(s)
            if record is None:
                assert s.tampered, f"{s.timer_id}: an untouched record is malformed"
                continue
            decides = (
                record.timer_id,
                record.deliver_at_ms,
                record.real_topic,
                record.real_partition,
                record.born_ts,
            )
            same = decides == (s.timer_id, s.deliver_at, "orders", s.msg.partition, T)
            assert same or s.tampered, (decides, s)
            assert (record.key, record.value) == (s.msg.key, s.msg.value)
            assert record.user_headers() == s.user_headers
            assert record.origin_offset == s.intake_offset
            delivered = dict(record.delivered_headers(T))
            assert delivered[H.PROMOTED_FROM] == f"timer:2:{s.intake_offset}".encode()
            if s.signed:
                assert KEY.verifies(record.canonical(), record.group_mac) == same, decides
            else:
                assert record.group_mac is None

    @invariant()
    def every_cancel_decodes_to_its_id(self) -> None:
        for key, value, timer_id, group in self.cancels:
            cancel = decode_timer_cancel(key, value)
            assert (cancel.timer_id, cancel.producer_group) == (timer_id, group)


TestTimerRecordMachine = TimerRecordMachine.TestCase


def test_a_re_append_that_forgets_the_origin_is_caught(monkeypatch: pytest.MonkeyPatch):
    """Planted defect: a re-append writes the level record's own offset as its origin.
    Hypothesis finds a delivered record naming the wrong intake record."""

    def wrong(self: TimerRecord) -> list:
        kept = [h for h in self.headers if h[0] != H.TIMER_ORIGIN]
        return [*kept, (H.TIMER_ORIGIN, str(self.offset).encode())]

    monkeypatch.setattr(TimerRecord, "reappended_headers", wrong)
    found = find_failure(TimerRecordMachine)
    assert isinstance(found.error, AssertionError), found.report
    assert any(step.startswith("state.reappend") for step in found.steps), found.report
