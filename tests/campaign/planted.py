"""A small clean history with every event kind, for the checkers' tests and as an example
of what the workload and the nemesis record (times in seconds of ``mono_s``; wall ms in
lock and batch fields).

Two producer groups' worth of transactions on ``orders`` and ``audit``:
t1 COMMIT, t2 ROLLBACK, t3 UNKNOW_then_COMMIT, t4 UNKNOW_then_ROLLBACK, t5 a two-message
COMMIT over both topics, t6 a send that failed; a timer message for ``orders`` recalled at
once (never visible); the orderly group ``og`` (key mode) and
the push group ``pg`` read both topics; ``og``'s queue ``og/orders/0`` passes from c1
(epoch 1) to c2 (epoch 2) after c1's lease ran out; the Spark job wrote the four rows.
The SimpleConsumer group ``sg`` (instances s0 and s1, 3 attempts at most) reads ``orders``,
whose m1 and m3 are of message group g1 (as its events say): m1 acked; m5a (no group) never
acked, delivered 3 times, dead-lettered (twice: a copy); m3 acked by s0, which the nemesis
killed 50 ms later (the ack lost), then received again by s1 with attempt 2 and acked.

Kept apart (``push_fifo_events``): message group g1 of ``fifo[0]`` for the push group
``pg``: @0 fails once then succeeds, @1 fails three times and is dead-lettered, @2 then
succeeds; @3 (no group) fails and succeeds through the retry topic.
"""

from __future__ import annotations

from tests.campaign import events as ev
from tests.campaign.history import Draft, Event, History, Kind, at

__all__ = [
    "HORIZON_S",
    "MINIMUMS",
    "SIMPLE_SETTINGS",
    "clean_events",
    "history_of",
    "push_call",
    "push_fifo_events",
    "simple_dead_letter",
    "simple_event",
]

HORIZON_S = 10.0
MINIMUMS = {
    "leader_change": 1,
    "lock_takeover": 1,
    "rebalance": 1,
    "fenced_producer": 1,
    "fault:broker_sigkill": 1,
}
TXN_PENDING_EMPTY = """\
┏━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━┳━━━━━━┓
┃ txn id ┃ real topic ┃ producer group ┃ age (s) ┃ checks ┃ answered ┃ half ┃
┡━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━╇━━━━━━┩
└────────┴────────────┴────────────────┴─────────┴────────┴──────────┴──────┘
"""


def _producer() -> list[Event]:
    p = "producer-1"
    return [
        at(ev.run("start", seed=42, params={"horizon_s": HORIZON_S}), 0.0, proc="harness"),
        at(ev.send("t1", "grp", ["orders"], ["m1"], "COMMIT", keys=["k1"]), 1.0, proc=p),
        at(ev.local_committed("t1", "grp", db="p1.db", row=1), 1.1, proc=p),
        at(ev.send("t2", "grp", ["orders"], ["m2"], "ROLLBACK", keys=["k1"]), 1.2, proc=p),
        at(ev.local_rolled_back("t2", "grp", db="p1.db", row=2), 1.3, proc=p),
        at(
            ev.send("t3", "grp", ["orders"], ["m3"], "UNKNOW_then_COMMIT", keys=["k1"]), 1.4, proc=p
        ),
        at(ev.local_committed("t3", "grp", db="p1.db", row=3), 1.5, proc=p),
        at(ev.check_answered("t3", "grp", "UNKNOW", checks=1), 2.0, proc=p),
        at(ev.check_answered("t3", "grp", "COMMIT", checks=2), 3.0, proc=p),
        at(
            ev.send("t4", "grp", ["orders"], ["m4"], "UNKNOW_then_ROLLBACK", keys=["k2"]),
            1.6,
            proc=p,
        ),
        at(ev.check_answered("t4", "grp", "ROLLBACK", checks=1), 4.0, proc=p),
        at(
            ev.send("t5", "grp", ["orders", "audit"], ["m5a", "m5b"], "COMMIT", keys=["k2", "k2"]),
            1.7,
            proc=p,
        ),
        at(ev.local_committed("t5", "grp", db="p1.db", row=5), 1.8, proc=p),
        at(
            ev.send_failed("grp", "KafkaError{_MSG_TIMED_OUT}", txn_id="t6", msg_ids=["m6"]),
            1.9,
            proc=p,
        ),
        at(ev.group_state("grp", True), 0.5, proc="harness"),
        at(
            ev.timer_send(
                "m-t1", "grp", "orders", "after", 20_000, recall=True, wall_before_ms=2000
            ),
            2.0,
            proc=p,
        ),
        at(
            ev.timer_sent(
                "m-t1",
                True,
                message_id="id-t1",
                deliver_lo_ms=22_000,
                deliver_hi_ms=22_010,
                clock_jump=False,
            ),
            2.01,
            proc=p,
        ),
        at(ev.timer_recalled("m-t1", True, "id-t1"), 2.02, proc=p),
    ] + [
        at(ev.committed_row(t, m, topic, db="p1.db"), 30.0, proc="harness")
        for t, m, topic in (
            ("t1", "m1", "orders"),
            ("t3", "m3", "orders"),
            ("t5", "m5a", "orders"),
            ("t5", "m5b", "audit"),
        )
    ]


def _final() -> list[Event]:
    rows = (
        ("orders", 0, 0, "m1", "t1", "k1"),
        ("orders", 0, 1, "m5a", "t5", "k2"),
        ("orders", 0, 2, "m3", "t3", "k1"),
        ("audit", 0, 0, "m5b", "t5", "k2"),
    )
    return [
        at(
            ev.final_read(
                topic,
                p,
                o,
                msg_id=m,
                txn_id=t,
                key=k,
                headers={"rmq.txn_id": t, "campaign.msg_id": m},
            ),
            31.0,
            proc="final-reader",
            seq=i,
        )
        for i, (topic, p, o, m, t, k) in enumerate(rows)
    ]


def _orderly() -> list[Event]:
    q = "og/orders/0"
    out = [
        at(ev.subscribe("orderly", "og", "c1", ["orders", "audit"], mode="key"), 0.6, proc="c1"),
        at(ev.lock_grant(q, "c1", 1, 1000, 5000), 1.0, proc="coordinator-1"),
        at(ev.lock_grant(q, "c1", 1, 4000, 9000), 4.0, proc="coordinator-1"),
        # c1's lease ran out at 9000; c2 got the queue with a higher epoch afterwards.
        at(ev.lock_grant(q, "c2", 2, 9500, 20000), 9.5, proc="coordinator-2"),
        at(ev.lock_grant("og/audit/0", "c1", 1, 1000, 60000), 1.0, proc="coordinator-1"),
    ]
    consumed = (
        ("c1", "orders", 0, "m1", "k1", 5.0),
        ("c1", "orders", 1, "m5a", "k2", 5.1),
        ("c2", "orders", 2, "m3", "k1", 10.0),
        ("c2", "orders", 2, "m3", "k1", 10.5),
        ("c1", "audit", 0, "m5b", "k2", 5.2),
    )
    out += [
        at(ev.consumed("orderly", "og", who, topic, 0, off, m, key=k), t, proc=who)
        for who, topic, off, m, k, t in consumed
    ]
    out += [
        at(
            ev.batch(
                q,
                "c1",
                1,
                lease_granted_ms=1000,
                lease_valid_until_ms=9000,
                start_ms=5000,
                end_ms=5200,
                offsets=[0, 1],
                committed=True,
                commit_ms=5300,
            ),
            5.3,
            proc="c1",
        ),
        # Started under c1's valid lease; it may outlive it (no commit after 9000).
        at(
            ev.batch(
                q,
                "c1",
                1,
                lease_granted_ms=1000,
                lease_valid_until_ms=9000,
                start_ms=8900,
                end_ms=9800,
                offsets=[],
                committed=False,
            ),
            9.8,
            proc="c1",
        ),
        at(
            ev.batch(
                q,
                "c2",
                2,
                lease_granted_ms=9500,
                lease_valid_until_ms=20000,
                start_ms=10000,
                end_ms=10600,
                offsets=[2],
                committed=True,
                commit_ms=10700,
            ),
            10.7,
            proc="c2",
        ),
        at(
            ev.batch(
                "og/audit/0",
                "c1",
                1,
                lease_granted_ms=1000,
                lease_valid_until_ms=60000,
                start_ms=5200,
                end_ms=5250,
                offsets=[0],
                committed=True,
                commit_ms=5260,
            ),
            5.26,
            proc="c1",
        ),
    ]
    return out


def _push() -> list[Event]:
    w = "push-1"
    return [
        at(ev.subscribe("push", "pg", w, ["orders", "audit"]), 0.6, proc=w),
        at(ev.consumed("push", "pg", w, "orders", 0, 0, "m1"), 5.0, proc=w),
        at(
            ev.consumed("push", "pg", w, "orders", 0, 2, "m3", result="RECONSUME_LATER"),
            11.0,
            proc=w,
        ),
        at(
            ev.push_retry(
                "pg",
                "m3",
                topic="orders",
                partition=0,
                offset=2,
                reconsume_times=1,
                retry_topic="%RETRY%pg",
            ),
            11.1,
            proc=w,
        ),
        at(ev.consumed("push", "pg", w, "%RETRY%pg", 0, 0, "m3"), 13.0, proc=w),
        at(
            ev.consumed("push", "pg", w, "orders", 0, 1, "m5a", result="RECONSUME_LATER"),
            5.1,
            proc=w,
        ),
        at(
            ev.dlq(
                "push",
                "pg",
                "m5a",
                topic="orders",
                partition=0,
                offset=1,
                reason="max_reconsume_times",
            ),
            6.0,
            proc=w,
        ),
        at(ev.consumed("push", "pg", w, "audit", 0, 0, "m5b"), 5.2, proc=w),
    ]


def push_call(
    offset: int,
    t: float,
    result: str,
    times: int,
    *,
    who: str = "push-1",
    retry_topic: str | None = None,
    start: float | None = None,
) -> Event:
    """One push call of group pg on fifo[0] (m10..m13 at offsets 0..3; only @3 has no
    message group), as consumer_worker.py records it: ending at ``t``, started at ``start``
    (default: 50 ms before)."""
    draft = ev.consumed("push", "pg", who, "fifo", 0, offset, f"m1{offset}", result=result)
    fields = {
        **draft.fields,
        "reconsume_times": times,
        "retry_topic": retry_topic,
        "start_mono_s": t - 0.05 if start is None else start,
    }
    return at(Draft(Kind.CONSUMED, fields), t, proc=who)


def push_fifo_events() -> list[Event]:
    """The FIFO lane of the module's docstring, its final read and dead letter."""
    ok, later = "SUCCESS", "RECONSUME_LATER"
    return [
        at(
            ev.final_read(
                "fifo",
                0,
                o,
                msg_id=f"m1{o}",
                headers={} if o == 3 else {"rmq.message_group": "g1"},
            ),
            31.0,
            proc="final-reader",
        )
        for o in range(4)
    ] + [
        push_call(0, 20.0, later, 0),
        push_call(3, 20.5, later, 0),
        push_call(0, 21.0, ok, 1),
        push_call(1, 21.1, later, 0),
        push_call(3, 22.0, ok, 1, retry_topic="%RETRY%pg"),
        push_call(1, 22.1, later, 1),
        push_call(1, 23.1, later, 2),
        push_call(2, 23.2, ok, 0),
        at(ev.dlq("push", "pg", "m11", topic="fifo", partition=0, offset=1), 31.5, proc="final"),
    ]


SIMPLE_SETTINGS = {"max_attempts": 3, "invisible_ms": 2000, "commit_interval_ms": 100}


def simple_event(event: str, who: str, offset: int, t: float, attempt: int | None = None) -> Event:
    """One ``simple`` event of group sg on orders[0] (m1, m5a, m3 at offsets 0, 1, 2)."""
    mid, group = {0: ("m1", "g1"), 1: ("m5a", None), 2: ("m3", "g1")}[offset]
    return at(
        ev.simple(event, "sg", who, "orders", 0, offset, mid, message_group=group, attempt=attempt),
        t,
        proc=who,
    )


def simple_dead_letter(offset: int, t: float, reason: str = "max_attempts") -> Event:
    mid = {0: "m1", 1: "m5a", 2: "m3"}[offset]
    return at(
        ev.dlq("simple", "sg", mid, topic="orders", partition=0, offset=offset, reason=reason),
        t,
        proc="harness",
    )


def _simple() -> list[Event]:
    return [
        at(
            ev.subscribe("simple", "sg", "s0", ["orders"], settings=SIMPLE_SETTINGS), 0.7, proc="s0"
        ),
        at(
            ev.subscribe("simple", "sg", "s1", ["orders"], settings=SIMPLE_SETTINGS), 0.7, proc="s1"
        ),
        simple_event("received", "s0", 0, 5.0, 1),
        simple_event("received", "s0", 1, 5.0, 1),
        simple_event("ack_ok", "s0", 0, 5.1),
        simple_event("received", "s0", 2, 5.2, 1),
        simple_event("changed", "s0", 2, 5.25),
        simple_event("ack_ok", "s0", 2, 5.3),
        at(ev.fault("consumer_kill", "s0", 5350, end_ms=7350, seed=42), 5.35, proc="harness"),
        simple_event("received", "s1", 1, 8.0, 2),
        simple_event("received", "s1", 2, 12.0, 2),
        simple_event("ack_ok", "s1", 2, 12.1),
        simple_event("received", "s1", 1, 12.0, 3),
        at(ev.status("s1", counts={"commit_failures": 0, "acked": 1}), 13.0, proc="s1"),
        simple_dead_letter(1, 31.5),
        simple_dead_letter(1, 31.6),
    ]


def _cluster() -> list[Event]:
    n = "harness"
    return [
        at(ev.fault("broker_sigkill", "broker-2", 7000, end_ms=8000, seed=42), 7.0, proc=n),
        at(ev.exit_("coordinator", "coordinator-1", -9, killed_by_nemesis=True), 7.5, proc=n),
        at(
            ev.exit_("coordinator", "coordinator-2", 0, killed_by_nemesis=False, stopped=True),
            29.0,
            proc=n,
        ),
        at(ev.observed("leader_change", count=2), 8.0, proc=n),
        at(ev.observed("lock_takeover"), 9.5, proc=n),
        at(ev.observed("rebalance", count=3), 8.0, proc=n),
        at(ev.observed("fenced_producer"), 8.5, proc=n),
    ] + [
        at(ev.spark_row(m, topic=t), 32.0, proc="spark", seq=i)
        for i, (m, t) in enumerate(
            (("m1", "orders"), ("m3", "orders"), ("m5a", "orders"), ("m5b", "audit"))
        )
    ]


def clean_events() -> list[Event]:
    """A fresh list each call: tests add or drop events to plant a violation."""
    return _producer() + _final() + _orderly() + _push() + _simple() + _cluster()


def history_of(events: list[Event]) -> History:
    return History(list(events))
