"""The push FIFO checker (tests/campaign/push_fifo_checks.py) passes the planted FIFO lane,
and an excused replay, and fails each FIFO promise of the PushConsumer broken in it."""

from __future__ import annotations

from tests.campaign import events as ev
from tests.campaign.history import Event, Kind, at
from tests.campaign.planted import clean_events, history_of, push_call, push_fifo_events
from tests.campaign.push_fifo_checks import check_push_fifo
from tests.campaign.result import CheckResult, Status

OK, LATER = "SUCCESS", "RECONSUME_LATER"


def _check(*extra: Event, drop=lambda e: False) -> CheckResult:
    events = [e for e in clean_events() + push_fifo_events() if not drop(e)] + list(extra)
    return check_push_fifo(history_of(events), max_reconsume_times=2, echo=False)


def _fails_with(result: CheckResult, kind: str, *words: str) -> None:
    assert result.status is Status.FAIL, result.line()
    found = [str(v) for v in result.violations if v.kind == kind]
    assert found, f"no {kind} in {result.line()}: {[str(v) for v in result.violations]}"
    assert all(any(w in v for v in found) for w in words), found


def _call(offset: int, t: float):
    return lambda e: e.kind is Kind.CONSUMED and e["offset"] == offset and e.mono_s == t


def _renewal(t: float, n: int) -> Event:
    return at(ev.status("push-1", counts={"producer_renewals": n}), t, proc="push-1")


def test_the_planted_fifo_lane_keeps_every_promise():
    result = _check()
    assert result.status is Status.PASS, [str(v) for v in result.violations]
    assert "3 FIFO records in 1 lanes, 6 calls" in result.summary


def test_a_history_without_message_groups_passes():
    assert check_push_fifo(history_of(clean_events()), echo=False).passed


# 1. A message group's next record waits for the one before.
def test_a_record_called_while_the_one_before_is_retrying_fails():
    result = _check(push_call(2, 21.5, OK, 0), drop=_call(2, 23.2))
    _fails_with(result, "fifo", "'g1' of fifo[0]: @2", "@1 before it was neither")


def test_a_record_called_before_the_one_before_succeeded_fails():
    result = _check(drop=_call(0, 21.0))
    _fails_with(result, "fifo", "@1 called by push-1", "@0 before it")


def test_a_record_called_after_its_predecessor_failed_again_fails_without_a_disruption():
    result = _check(push_call(0, 23.15, LATER, 0))
    _fails_with(result, "fifo", "@2 called", "@0 before it failed again at 23150")


def test_a_replay_after_a_kill_may_call_an_acked_record_again():
    kill = at(ev.fault("consumer_kill", "push-1", 23_000, end_ms=23_100), 23.0, proc="harness")
    result = _check(kill, push_call(0, 23.15, LATER, 0))
    assert result.status is Status.PASS, [str(v) for v in result.violations]


def test_a_record_called_while_the_call_before_it_still_ran_fails():
    """Issue 45: the head's SUCCESS call ended (21.0) after its group's next call started
    (20.9); comparing the calls' ends alone (21.0 before 21.1) saw nothing."""
    result = _check(
        push_call(0, 21.0, OK, 1, start=20.6),
        push_call(1, 21.1, LATER, 0, start=20.9),
        drop=lambda e: _call(0, 21.0)(e) or _call(1, 21.1)(e),
    )
    _fails_with(result, "fifo", "@1 called by push-1", "@0 before it was neither")
    _fails_with(result, "fifo_overlap", "@1 called by push-1 at 20900", "@0 by push-1 ran")


# 4. No two calls of a lane at once.
def test_two_calls_of_one_record_at_once_fail():
    """Issue 45: a 30 s call of the head on one instance, and its redelivery on the next
    owner (the lease lapsed after 10 s) acked while the first still ran."""
    result = _check(push_call(0, 21.0, OK, 1, start=15.0, who="push-2"), drop=_call(0, 21.0))
    _fails_with(result, "fifo_overlap", "@0 called by push-1 at 19950", "@0 by push-2 ran")


def test_an_overlap_after_the_calling_instance_was_paused_is_excused():
    pause = at(ev.fault("consumer_pause", "push-2", 16_000, end_ms=19_000), 16.0, proc="harness")
    result = _check(pause, push_call(0, 21.0, OK, 1, start=15.0, who="push-2"), drop=_call(0, 21.0))
    assert result.status is Status.PASS, [str(v) for v in result.violations]


def test_an_overlap_while_another_instance_was_paused_fails():
    pause = at(ev.fault("consumer_pause", "push-1", 16_000, end_ms=19_000), 16.0, proc="harness")
    result = _check(pause, push_call(0, 21.0, OK, 1, start=15.0, who="push-2"), drop=_call(0, 21.0))
    _fails_with(result, "fifo_overlap", "@0 by push-2 ran")


# 2. Retried in place.
def test_a_fifo_record_on_a_retry_topic_fails():
    result = _check(push_call(1, 22.1, LATER, 1, retry_topic="%RETRY%pg"), drop=_call(1, 22.1))
    _fails_with(result, "fifo_retry_topic", "fifo[0]@1", "%RETRY%pg")


# 3. reconsume_times strictly increase within an instance's life, up to the maximum.
def test_a_reconsume_count_that_does_not_grow_after_a_failure_fails():
    result = _check(push_call(1, 23.1, LATER, 1), drop=_call(1, 23.1))
    _fails_with(result, "fifo_reconsume_times", "fifo[0]@1", "reconsume_times 1 after 1")


def test_a_count_that_did_not_grow_seconds_later_is_a_replay_from_the_commit():
    result = _check(push_call(1, 26.5, LATER, 1), drop=_call(1, 23.1))
    assert result.status is Status.PASS, [str(v) for v in result.violations]


def test_a_producer_renewal_excuses_a_count_restored_from_the_commit():
    result = _check(
        _renewal(22.5, 0), _renewal(23.0, 1), push_call(1, 23.1, LATER, 1), drop=_call(1, 23.1)
    )
    assert result.status is Status.PASS, [str(v) for v in result.violations]


def test_a_count_over_max_reconsume_times_fails():
    result = _check(push_call(1, 23.15, LATER, 3))
    _fails_with(result, "fifo_reconsume_times", "reconsume_times 3 over max_reconsume_times 2")
