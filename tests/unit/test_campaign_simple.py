"""The SimpleConsumer checker (tests/campaign/simple_checks.py) passes the planted clean
history and fails each promise of docs/design/simple-consumer.md broken in it."""

from __future__ import annotations

from tests.campaign import events as ev
from tests.campaign.history import Event, Kind, at
from tests.campaign.planted import clean_events, history_of, simple_dead_letter, simple_event
from tests.campaign.result import CheckResult, Status
from tests.campaign.simple_checks import SESSION_LOST, check_simple, simple_unsettled
from tests.campaign.summary import outcome_counts
from tests.campaign.workload import (
    SIMPLE_ACK,
    SIMPLE_ONCE,
    SIMPLE_POISON,
    message_group_of,
    simple_fate,
)


def _check(*extra: Event, drop=lambda e: False) -> CheckResult:
    history = history_of([e for e in clean_events() if not drop(e)] + list(extra))
    return check_simple(history, echo=False)


def _fails_with(result: CheckResult, kind: str, *words: str) -> None:
    assert result.status is Status.FAIL, result.line()
    found = [str(v) for v in result.violations if v.kind == kind]
    assert found, f"no {kind} in {result.line()}: {[str(v) for v in result.violations]}"
    assert all(any(w in v for v in found) for w in words), found


def _is(event: str, offset: int, t: float):
    return lambda e: (
        e.kind is Kind.SIMPLE and e["event"] == event and e["offset"] == offset and e.mono_s == t
    )


def test_the_clean_history_keeps_every_promise():
    result = _check()
    assert result.status is Status.PASS, [str(v) for v in result.violations]
    assert "3 msgs, 6 received, 1+1 dead" in result.summary
    assert "1 lost acks" in result.summary


# 1. Every message delivered until acked or dead-lettered.
def test_a_message_neither_acked_nor_dead_lettered_fails():
    result = _check(drop=lambda e: e.kind is Kind.DLQ and e["consumer"] == "simple")
    _fails_with(result, "undelivered", "orders[0]@1", "3 deliveries seen")


def test_a_message_never_delivered_fails():
    result = _check(drop=lambda e: e.kind is Kind.SIMPLE and e["offset"] == 0)
    _fails_with(result, "undelivered", "orders[0]@0", "0 deliveries seen")


# 2. Nothing acked comes back, except within the commit interval before a kill.
def test_an_acked_message_received_again_without_a_kill_fails():
    result = _check(drop=lambda e: e.kind is Kind.FAULT and e["fault"] == "consumer_kill")
    _fails_with(result, "acked_came_back", "orders[0]@2", "acked by s0 at 5300")


def test_a_kill_later_than_the_commit_interval_does_not_excuse_a_lost_ack():
    late_kill = at(ev.fault("consumer_kill", "s0", 6500, seed=42), 6.5, proc="harness")
    result = _check(
        late_kill, drop=lambda e: e.kind is Kind.FAULT and e["fault"] == "consumer_kill"
    )
    _fails_with(result, "acked_came_back", "orders[0]@2")


def test_a_commit_failure_after_the_ack_excuses_its_loss():
    failed = [
        at(ev.status("s0", counts={"commit_failures": 0}), 5.2, proc="s0"),
        at(ev.status("s0", counts={"commit_failures": 2}), 6.2, proc="s0"),
    ]
    result = _check(*failed, drop=lambda e: e.kind is Kind.FAULT and e["fault"] == "consumer_kill")
    assert result.status is Status.PASS, [str(v) for v in result.violations]


def test_a_session_lost_after_the_ack_excuses_its_loss():
    lost = at(ev.note(SESSION_LOST), 9.0, proc="s0")
    result = _check(lost, drop=lambda e: e.kind is Kind.FAULT and e["fault"] == "consumer_kill")
    assert result.status is Status.PASS, [str(v) for v in result.violations]
    lost_before_the_ack = at(ev.note(SESSION_LOST), 5.29, proc="s0")
    result = _check(
        lost_before_the_ack,
        drop=lambda e: e.kind is Kind.FAULT and e["fault"] == "consumer_kill",
    )
    _fails_with(result, "acked_came_back", "orders[0]@2")


# 3. FIFO per message group.
def test_a_record_received_before_the_earlier_one_of_its_group_was_acked_fails():
    late_ack = simple_event("ack_ok", "s0", 0, 5.22)
    result = _check(late_ack, drop=_is("ack_ok", 0, 5.1))
    _fails_with(result, "fifo", "'g1'", "@2 received by s0", "@0 before it")


def test_a_record_of_no_group_may_overtake():
    early = simple_event("received", "s0", 1, 4.0, 1)  # m5a has no group: not ordered
    result = _check(early, drop=_is("received", 1, 5.0))
    assert result.status is Status.PASS, [str(v) for v in result.violations]


def test_an_earlier_record_redelivered_after_its_lost_ack_blocks_the_next_again():
    # m1's ack lost too (s0 killed): m1 back at 11.0, and m3 received at 12.0 before m1's
    # new ack.
    again = [simple_event("received", "s1", 0, 11.0, 2), simple_event("ack_ok", "s1", 0, 12.5)]
    result = _check(*again)
    _fails_with(result, "fifo", "@2 received by s1", "@0 before it")


# 4. Attempts strictly increasing, from 1, at most max_delivery_attempts.
def test_an_attempt_that_does_not_increase_fails():
    result = _check(simple_event("received", "s1", 1, 12.5, 2))
    _fails_with(result, "attempts", "attempt 2 after attempt 3")


def test_an_attempt_over_the_maximum_fails():
    result = _check(simple_event("received", "s1", 1, 12.5, 4))
    _fails_with(result, "attempts", "attempt 4 over max_delivery_attempts 3")


def test_a_first_attempt_above_one_needs_a_disrupted_instance():
    first = simple_event("received", "s0", 0, 5.0, 2)
    result = _check(first, drop=_is("received", 0, 5.0))
    _fails_with(result, "attempts", "first delivery seen has attempt 2")
    failed_before = [  # a commit of s1 failed just before: the first delivery may be unseen
        at(ev.status("s1", counts={"commit_failures": 0}), 3.0, proc="s1"),
        at(ev.status("s1", counts={"commit_failures": 1}), 4.0, proc="s1"),
    ]
    result = _check(first, *failed_before, drop=_is("received", 0, 5.0))
    assert result.status is Status.PASS, [str(v) for v in result.violations]


# 5. Dead letters accounted for, deduped by origin.
def test_a_dead_letter_of_a_message_delivered_fewer_times_than_the_maximum_fails():
    no_kill = lambda e: e.kind is Kind.FAULT and e["fault"] == "consumer_kill"  # noqa: E731
    result = _check(
        simple_dead_letter(1, 31.7), drop=lambda e: no_kill(e) or _is("received", 1, 12.0)(e)
    )
    _fails_with(result, "dead_letter", "orders[0]@1", "after 2 of 3 deliveries")


def test_a_dead_letter_with_another_reason_fails():
    result = _check(
        simple_dead_letter(1, 31.7, reason="max_reconsume_times"),
        drop=lambda e: e.kind is Kind.DLQ and e["consumer"] == "simple",
    )
    _fails_with(result, "dead_letter", "orders[0]@1", "max_reconsume_times")


def test_a_dead_letter_of_no_message_in_the_final_read_fails():
    phantom = at(
        ev.dlq("simple", "sg", "m9", topic="orders", partition=0, offset=9, reason="max_attempts"),
        31.7,
        proc="harness",
    )
    _fails_with(_check(phantom), "dead_letter", "orders[0]@9", "no message")


# The runner's catch-up and the workload's plan.
def test_unsettled_messages_are_those_neither_acked_nor_at_their_last_attempt_long_ago():
    history = history_of(clean_events())
    wanted = {"m1", "m5a", "m3", "m-other"}
    assert simple_unsettled(history, "sg", wanted, wait_dead_ms=3000, now_ms=20_000) == {"m-other"}
    # m5a's last attempt (received at 12.0 s) is not 3 s old at 13 s: not settled yet.
    assert simple_unsettled(history, "sg", wanted, wait_dead_ms=3000, now_ms=13_000) == {
        "m-other",
        "m5a",
    }


def test_the_workload_plan_mixes_groups_and_fates():
    mids = [f"producer-0-{n:06d}-0" for n in range(600)]
    groups = [message_group_of(m) for m in mids]
    assert 0.15 < groups.count(None) / len(mids) < 0.35
    assert len({g for g in groups if g}) == 5
    fates = [simple_fate(m, 1) for m in mids]
    assert {SIMPLE_POISON, SIMPLE_ONCE, SIMPLE_ACK} <= set(fates)
    assert all(simple_fate(m, 2) != SIMPLE_ONCE for m in mids)  # only the first delivery


def test_the_summary_counts_the_simple_events():
    counts = outcome_counts(history_of(clean_events()))
    assert counts["simple received"] == 6
    assert counts["simple ack_ok"] == 3
    assert counts["simple changed"] == 1
