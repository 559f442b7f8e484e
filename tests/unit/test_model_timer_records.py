"""Timer records as a state machine (Hypothesis, issue 35), against a model of what each
scheduled message is: producers send messages with a delivery time (signed or not), the
coordinator's moves re-append them through level topics, recalls write cancel records, and
an intruder rewrites a header of a record in flight.

Promises checked after every step: every record as read parses to the message the model
holds (id, due time, real topic and partition, birth, group, key, value, user headers),
wherever it has been moved; its MAC verifies under its group's key exactly when nothing
that decides delivery was changed; its delivered headers name its intake record; a cancel
decodes to its id and group; a tampered record is either malformed with a reason or still
the same message (a header the parse does not read).

Tenant isolation may be switched on once (issue 44, item 8), recording every timer topic's
end as its watermark: from then on a record naming its group is trusted exactly when it lies
below its topic's watermark (written before, unsigned, whatever an intruder did to it then)
or its MAC verifies, and the coordinator signs what it re-appends, so a record of before
stays trusted wherever it moves; a recall of before is trusted below the cancel topic's."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from coordinator.tenancy import Tenant, TenantGuard
from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.message import Message
from rmq_semantics.records.codec import decode_timer_cancel, encode
from rmq_semantics.records.group_auth import derive_group_key, sign_timer_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.records.timer import (
    TimerCancel,
    TimerRecord,
    parse_timer,
    timer_headers,
)
from rmq_semantics.topics import SystemTopics
from tests.model.broken import find_failure

T = 1_700_000_000_000
TENANT_KEY = b"model-tenant-key-0123456789abcdef"
KEY = derive_group_key(TENANT_KEY, "pg")
TENANTS = {"pg": Tenant("pg", "User:pg", frozenset({"orders"}))}
CANCEL = -1  # the cancel topic, among the levels' offsets
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
    named: bool = False  # it names its group (signed, or unsigned before isolation)
    # What its MAC covers (timer id, due, real topic, partition, birth): None if unsigned.
    sealed: tuple | None = None


class TimerRecordMachine(RuleBasedStateMachine):
    scheduled = Bundle("scheduled")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.live: list[Scheduled] = []
        self.cancels: list[tuple[bytes, bytes, str, str | None, int]] = []
        self.ends: dict[int, int] = defaultdict(int)  # level (CANCEL) -> next offset
        self.guard: TenantGuard | None = None  # isolation on

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
        named=st.booleans(),
    )
    def send(self, due_in, key, value, headers, partition, tags, signed, named) -> Scheduled:
        timer_id = f"{self.count:032x}"
        self.count += 1
        msg = Message("orders", value, key=key, headers=headers, partition=partition, tags=tags)
        named = signed or (named and self.guard is None)  # after the switch: signed
        written = timer_headers(msg, timer_id, T + due_in, T, "pg" if named else None)
        if signed:
            written = sign_timer_headers(KEY, written, msg.key, msg.value)
        at = self._append(0)
        s = Scheduled(timer_id, msg, T + due_in, signed, at, msg.user_headers(), 0, at, written)
        s.named = named
        s.sealed = (timer_id, T + due_in, "orders", partition, T) if signed else None
        self.live.append(s)
        return s

    def _append(self, level: int) -> int:
        self.ends[level] += 1
        return self.ends[level] - 1

    @rule(s=scheduled, level=st.integers(1, 18))
    def reappend(self, s: Scheduled, level: int) -> None:
        """The coordinator's move to a level topic (only of a record it could read and,
        under isolation, trusts; then signed for its group)."""
        record = self._read(s)
        if record is None:
            return
        headers = record.reappended_headers()
        if self.guard is not None:
            if self.guard.judge_timer(record) is not None:
                return  # set aside, not moved
            headers = self.guard.resign_timer(record, headers)
            s.signed, s.sealed = True, self._decides(record)
        s.headers, s.level, s.offset = headers, level, self._append(level)

    @precondition(lambda self: self.guard is None)
    @rule()
    def switch(self) -> None:
        """Tenant isolation on: every timer topic's end is its watermark."""
        marks = {
            "timer_cancel" if level == CANCEL else "timer" if level == 0 else f"timer_{level}": {
                2: end
            }
            for level, end in self.ends.items()
        }
        self.guard = TenantGuard(TENANTS, TENANT_KEY, SystemTopics("m"), marks)
        self.marks = dict(self.ends)

    @rule(s=scheduled, name=st.sampled_from([*COVERED, H.TAGS, "a"]), raw=st.binary(max_size=6))
    def tamper(self, s: Scheduled, name: str, raw: bytes) -> None:
        """An intruder rewrites one header of the record in flight."""
        assert s.headers is not None
        s.headers = [(k, raw if k == name else v) for k, v in s.headers]
        s.user_headers = [(k, raw if k == name else v) for k, v in s.user_headers]
        s.tampered = s.tampered or (name in COVERED and any(k == name for k, _ in s.headers))

    @rule(s=scheduled, ts=st.integers(0, 2**40))
    def recall(self, s: Scheduled, ts: int) -> None:
        group = "pg" if s.named else None
        value = encode(TimerCancel(s.timer_id, group, ts))
        self.cancels.append((s.timer_id.encode(), value, s.timer_id, group, self._append(CANCEL)))

    @staticmethod
    def _decides(record: TimerRecord) -> tuple:
        return (
            record.timer_id,
            record.deliver_at_ms,
            record.real_topic,
            record.real_partition,
            record.born_ts,
        )

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
            decides = self._decides(record)
            same = decides == (s.timer_id, s.deliver_at, "orders", s.msg.partition, T)
            assert same or s.tampered, (decides, s)
            assert (record.key, record.value) == (s.msg.key, s.msg.value)
            assert record.user_headers() == s.user_headers
            assert record.origin_offset == s.intake_offset
            delivered = dict(record.delivered_headers(T))
            assert delivered[H.PROMOTED_FROM] == f"timer:2:{s.intake_offset}".encode()
            if s.sealed is not None:
                verifies = KEY.verifies(record.canonical(), record.group_mac)
                assert verifies == (decides == s.sealed), (decides, s.sealed)
            else:
                assert record.group_mac is None
            if self.guard is not None:
                self._judged(s, record, decides)

    def _judged(self, s: Scheduled, record: TimerRecord, decides: tuple) -> None:
        """Under isolation: trusted exactly below its topic's watermark or signed."""
        legacy = s.offset < self.marks.get(s.level, 0)
        trusted = s.named and (legacy or decides == s.sealed)
        verdict = self.guard.judge_timer(record) if self.guard else None
        if not trusted:
            assert verdict is not None and verdict[0] is DiscardReason.FORGED, (verdict, s)
        elif record.real_topic != "orders":
            assert verdict is not None and verdict[0] is DiscardReason.NOT_ALLOWED, verdict
        else:
            assert verdict is None, (verdict, s)

    @invariant()
    def every_cancel_decodes_to_its_id(self) -> None:
        for key, value, timer_id, group, offset in self.cancels:
            cancel = decode_timer_cancel(key, value)
            assert (cancel.timer_id, cancel.producer_group) == (timer_id, group)
            if self.guard is not None:  # unsigned: trusted only from before the switch
                refused = self.guard.cancel_refusal(
                    "m_timer_cancel", 2, group or "", value, [], offset=offset
                )
                legacy = offset < self.marks.get(CANCEL, 0)
                assert (refused is None) == (group == "pg" and legacy), (refused, offset)


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


def test_ignoring_the_timer_watermarks_is_caught(monkeypatch: pytest.MonkeyPatch):
    """Planted defect (issue 44, item 8 before its fix): isolation trusts no unsigned timer
    record or recall of before. Hypothesis finds one scheduled before the switch refused."""
    monkeypatch.setattr(TenantGuard, "_timer_legacy", lambda self, name, p, offset: False)
    found = find_failure(TimerRecordMachine)
    assert isinstance(found.error, AssertionError), found.report
    assert any(step.startswith("state.switch") for step in found.steps), found.report


def test_a_re_append_left_unsigned_after_the_switch_is_caught(monkeypatch: pytest.MonkeyPatch):
    """Planted defect: the coordinator re-appends a record of before without signing it,
    so it is forged on its level."""
    monkeypatch.setattr(TenantGuard, "resign_timer", lambda self, record, headers: headers)
    found = find_failure(TimerRecordMachine)
    assert isinstance(found.error, AssertionError), found.report
    assert any(step.startswith("state.reappend") for step in found.steps), found.report
