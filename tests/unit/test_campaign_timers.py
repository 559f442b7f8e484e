"""The fault campaign's timer checker (tests/campaign/timer_checks.py) over planted
histories: a clean one passes; a duplicate, an early, a lost, a late, a wrongly named and a
recalled-yet-delivered message are each reported; a recall that raced the delivery, a
failed send landing once and a message not due by the final read are not. Timer deliveries
on the workload's topics leave the transactional and Spark checks alone."""

from __future__ import annotations

import itertools

from tests.campaign import events as ev
from tests.campaign.checkers import check_exactly_once, check_spark, check_timers, run_all
from tests.campaign.history import Event, History, Kind, at
from tests.campaign.planted import HORIZON_S, MINIMUMS, clean_events
from tests.campaign.result import CheckResult
from tests.campaign.workload import plan_ops

P = "producer-0"


def _send(mid: str, t: float, delay_s: float, *, recall: bool = False) -> list[Event]:
    """A timer message sent at ``t`` (s) with ``deliver_after_ms``, acknowledged 0.1 s later;
    wall ms = mono s * 1000 in planted histories."""
    wall = int(t * 1000)
    return [
        at(
            ev.timer_send(
                mid,
                "grp",
                "orders",
                "after",
                int(delay_s * 1000),
                recall=recall,
                wall_before_ms=wall,
            ),
            t,
            proc=P,
        ),
        at(
            ev.timer_sent(
                mid,
                True,
                message_id=f"id-{mid}",
                deliver_lo_ms=wall + int(delay_s * 1000),
                deliver_hi_ms=wall + 100 + int(delay_s * 1000),
                clock_jump=False,
            ),
            t + 0.1,
            proc=P,
        ),
    ]


def _read(mid: str, offset: int, delivered_at_ms: int, timer_id: str | None = None) -> Event:
    """A delivery as the final read shows it (the coordinator strips rmq.deliver_at)."""
    headers = {
        "rmq.timer_id": timer_id or f"id-{mid}",
        "rmq.delivered_at": str(delivered_at_ms),
        "rmq.promoted_from": f"timer:0:{offset}",
    }
    return at(
        ev.final_read("orders", 1, offset, msg_id=mid, key="k1", headers=headers),
        200.0,
        proc="final",
    )


def _clean() -> list[Event]:
    return [
        at(ev.run("start", seed=1), 0.0, proc="harness"),
        *_send("t-ok", 10.0, 5.0),
        _read("t-ok", 100, 15_020),
        *_send("t-past", 11.0, 0.0),
        _read("t-past", 101, 11_150),
        # Recalled at once, 20 s ahead: never visible.
        *_send("t-recalled", 12.0, 20.0, recall=True),
        at(ev.timer_recalled("t-recalled", True, "id-t-recalled"), 12.2, proc=P),
        # Recalled 1 s before its time: the recall may lose the race.
        *_send("t-race", 13.0, 6.0, recall=True),
        at(ev.timer_recalled("t-race", True, "id-t-race"), 18.0, proc=P),
        _read("t-race", 102, 19_010),
        # A send that failed (a timeout) may still have landed, once.
        at(
            ev.timer_send(
                "t-failed", "grp", "orders", "after", 0, recall=False, wall_before_ms=14_000
            ),
            14.0,
            proc=P,
        ),
        at(ev.timer_sent("t-failed", False, error="RmqTimeoutError: no ack"), 44.0, proc=P),
        _read("t-failed", 103, 14_500),
        at(ev.note("final read"), 150.0, proc="runner"),
    ]


def _history(*extra: Event, drop=lambda e: False) -> History:
    return History([e for e in _clean() if not drop(e)] + list(extra))


def _fails_with(result: CheckResult, kind: str, *words: str) -> None:
    assert not result.passed, result.line()
    found = [v for v in result.violations if v.kind == kind]
    assert found, f"no {kind} in {result.line()}"
    for word in words:
        assert any(word in v.detail for v in found), f"{word!r} not in {found}"


def test_a_clean_timer_history_passes():
    result = check_timers(_history(), horizon_s=HORIZON_S, echo=False)
    assert result.passed, result.line()
    assert result.summary.startswith("4 sent (1 failed), 2 recalled, 2 delivered once")
    assert "1 recall lost the race" in result.summary


def test_a_duplicate_delivery_is_reported():
    _fails_with(
        check_timers(_history(_read("t-ok", 107, 15_900)), horizon_s=60, echo=False),
        "duplicate",
        "t-ok",
    )


def test_a_failed_send_delivered_twice_is_reported():
    twice = _read("t-failed", 108, 14_600)
    _fails_with(check_timers(_history(twice), horizon_s=60, echo=False), "duplicate", "t-failed")


def test_an_early_delivery_is_reported():
    early = [*_send("t-early", 20.0, 10.0), _read("t-early", 104, 29_000)]
    _fails_with(check_timers(_history(*early), horizon_s=60, echo=False), "early", "t-early")


def test_a_consumer_seeing_it_before_its_time_is_reported():
    seen = at(
        ev.consumed("push", "pg", "c1", "orders", 1, 100, "t-ok", key="k1"), 14.0, proc="push-0"
    )
    _fails_with(check_timers(_history(seen), horizon_s=60, echo=False), "early_consumed", "t-ok")


def test_a_lost_message_is_reported():
    lost = _send("t-lost", 30.0, 5.0)
    _fails_with(check_timers(_history(*lost), horizon_s=60, echo=False), "lost", "t-lost")


def test_a_message_not_due_before_the_final_read_is_counted_not_lost():
    later = _send("t-later", 140.0, 5.0)  # due at 145 s, the read began at 150 s: grace 15 s
    result = check_timers(_history(*later), horizon_s=60, echo=False)
    assert result.passed, result.line()
    assert "1 not due by the final read" in result.summary


def test_a_late_delivery_is_reported_and_the_horizon_waits_out_a_cluster_fault():
    late = [*_send("t-late", 20.0, 5.0), _read("t-late", 105, 95_000)]
    _fails_with(check_timers(_history(*late), horizon_s=60, echo=False), "late", "t-late")
    # A 30 s broker outage after it was due: 60 s of up-time end at 115 s, not 85 s.
    outage = at(ev.fault("broker_kill", "node-1", 30_000, end_ms=60_000, seed=1), 60.0, proc="h")
    assert check_timers(_history(*late, outage), horizon_s=60, echo=False).passed


def test_a_delivery_under_another_timer_id_is_reported():
    other = _read("t-ok", 100, 15_020, timer_id="id-someone-else")
    history = _history(other, drop=lambda e: e.kind is Kind.FINAL_READ and e["msg_id"] == "t-ok")
    _fails_with(check_timers(history, horizon_s=60, echo=False), "wrong_id", "t-ok")


def test_a_send_during_a_clock_step_is_not_timed():
    early = [*_send("t-step", 20.0, 10.0), _read("t-step", 111, 29_000)]
    stepped = at(
        ev.timer_sent(
            "t-step",
            True,
            message_id="id-t-step",
            deliver_lo_ms=30_000,
            deliver_hi_ms=30_100,
            clock_jump=True,
        ),
        20.1,
        proc=P,
    )
    result = check_timers(_history(early[0], stepped, early[2]), horizon_s=60, echo=False)
    assert result.passed, result.line()
    assert "1 not timed (clock stepped)" in result.summary


def test_a_message_recalled_well_before_its_time_and_delivered_is_reported():
    seen = _read("t-recalled", 109, 32_010)
    _fails_with(
        check_timers(_history(seen), horizon_s=60, echo=False), "recalled_delivered", "t-recalled"
    )
    # Unless a cluster fault came between the recall and the time (the cancel read waits).
    outage = at(ev.fault("partition", "node-2", 20_000, end_ms=25_000, seed=1), 25.0, proc="h")
    assert check_timers(_history(seen, outage), horizon_s=60, echo=False).passed


def test_a_timer_record_nobody_sent_is_reported():
    _fails_with(
        check_timers(_history(_read("t-ghost", 110, 1_000)), horizon_s=60, echo=False),
        "phantom",
        "t-ghost",
    )


def test_timer_deliveries_leave_the_transactional_and_spark_checks_alone():
    history = History(clean_events() + _clean())
    assert check_exactly_once(history, echo=False).passed
    rows = [{"msg_id": m} for m in ("m1", "m3", "m5a", "m5b", "t-ok", "t-past", "t-race")]
    rows.append({"msg_id": "t-failed"})
    assert check_spark(history, rows, echo=False).passed
    missing = check_spark(history, rows[:-1], echo=False)
    assert missing.kinds() == {"missing"}
    results = run_all(history, horizon_s=HORIZON_S, minimums=MINIMUMS, echo=False)
    timers = next(r for r in results if r.name == "timers")
    assert timers.passed, timers.line()


def test_the_plan_schedules_a_share_of_timers_the_same_way_each_time():
    def plan(timer_max_s: float) -> list:
        return list(
            itertools.islice(
                plan_ops(7, P, ["t0", "t1"], 12, [(40, "n")], timer_max_s=timer_max_s), 400
            )
        )

    with_timers, without = plan(20), plan(0)
    assert with_timers == plan(20)
    # The transactions are the same with or without timers (their own random stream).
    assert [(o.kind, o.messages) for o in with_timers] == [(o.kind, o.messages) for o in without]
    timers = [o.timer for o in with_timers if o.timer is not None]
    assert 20 < len(timers) < 120
    assert {t.how for t in timers} == {"at", "after", "level"}
    assert any(t.delay_ms < 0 for t in timers) and any(t.recall for t in timers)
    assert all(t.delay_ms <= 20_000 for t in timers)
    assert all(t.delay_ms >= 5000 for t in timers if t.recall)
    assert not any(o.timer for o in without)
    assert Kind.TIMER_SEND.value == "timer_send"
