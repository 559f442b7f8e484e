"""The timer messages' checker (issue 35): every timer message whose send was acknowledged is
visible exactly once on its topic, none before its time, none later than the horizon, none
lost; one recalled well before its time is never visible; a failed send at most once.

Clocks. A producer's wall clock may be skewed (the clock_skew fault, clock.py), nothing
else's. The delivered record carries the coordinator's ``rmq.delivered_at`` (its clock,
unskewed), not ``rmq.deliver_at`` (stripped at delivery, contract "Timer flow" 4), so "never
before its time" compares that stamp with the time the producer wrote: the worker bounds it
by its own clock's readings around the send (``deliver_lo_ms``..``deliver_hi_ms``), and the
coordinator compares that very number with its own clock, so a skewed producer moves the
time, not the comparison. A send during which the producer's clock stepped (a skew switched
on or off: wall and monotonic elapsed differ) has no trusted bounds and is not timed. A
consumer's ``consumed`` event (an unskewed process, the same host clock) is compared with
the bounds too. Deadlines are on the host's monotonic clock (``mono_s``, never skewed): a
coordinator time becomes a monotonic one through an unskewed process's events (the
runner's).

Recalls: ``recall_message`` acknowledged RECALL_MARGIN_S or more before the time, with no
cluster fault until then, must be honoured (docs/design/contract.md "Timer flow": a cancel
read before the delivery decision drops the message; one in the last moments may lose).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from tests.campaign.history import Event, History, Kind
from tests.campaign.horizon import cluster_fault_intervals, overlaps, up_deadline
from tests.campaign.result import CheckResult, Violation

__all__ = ["GRACE_S", "RECALL_MARGIN_S", "check_timers", "timer_counts", "timer_mids"]

TIMER_ID = "rmq.timer_id"
DELIVERED_AT = "rmq.delivered_at"
PROMOTED_FROM = "rmq.promoted_from"
#: A recall acknowledged this long before the time must win (the coordinator holds the
#: last second in memory, and reads the cancel topic with some lag).
RECALL_MARGIN_S = 5.0
#: A message due this long before the final read began must be in it.
GRACE_S = 15.0


def timer_mids(history: History) -> set[str]:
    """The workload ids of every timer message a producer began to send."""
    return {e["msg_id"] for e in history.of(Kind.TIMER_SEND)}


def is_timer_record(event: Event, mids: set[str]) -> bool:
    """A final-read record that a timer delivery wrote (its id, or its timer header)."""
    return event.get("msg_id") in mids or TIMER_ID in (event.get("headers") or {})


def timer_counts(history: History) -> Counter[str]:
    """Per topic, the timer messages acknowledged and not recalled: what it should show."""
    topic = {e["msg_id"]: e["topic"] for e in history.of(Kind.TIMER_SEND)}
    recalled = {e["msg_id"] for e in history.of(Kind.TIMER_RECALLED) if e["ok"]}
    return Counter(
        topic[e["msg_id"]]
        for e in history.of(Kind.TIMER_SENT)
        if e["ok"] and e["msg_id"] in topic and e["msg_id"] not in recalled
    )


def _int(value: object) -> int | None:
    try:
        return None if value is None else int(str(value))
    except ValueError:
        return None


def _wall_offset_s(history: History) -> float:
    """Epoch seconds minus monotonic seconds of an unskewed process (not a producer)."""
    for e in history.events:
        if not e.proc.startswith("producer"):
            return e.wall_ms / 1000 - e.mono_s
    return 0.0


def _cutoff(history: History) -> float:
    """When the final read began (the runner's phase note); no note: no cut."""
    for e in history.of(Kind.NOTE):
        if e["what"] == "final read":
            return e.mono_s
    return float("inf")


def _bounds(send: Event, ack: Event | None) -> tuple[int, int, bool]:
    """(lo, hi, timed): bounds of the time the producer wrote, on its clock, and whether
    they hold. An acknowledged send's come from its ack; a failed one's only when exact."""
    if ack is not None and ack["ok"] and ack.get("deliver_lo_ms") is not None:
        lo, hi = int(ack["deliver_lo_ms"]), int(ack["deliver_hi_ms"])
        return lo, hi, not ack.get("clock_jump")
    if send.get("deliver_at_ms") is not None:  # "at": the time asked, exactly
        return int(send["deliver_at_ms"]), int(send["deliver_at_ms"]), True
    lo = int(send.get("wall_before_ms", 0)) + int(send["delay_ms"])
    return lo, lo, False


def _p99(values: list[int]) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def check_timers(
    history: History,
    *,
    horizon_s: float,
    grace_s: float = GRACE_S,
    cutoff_mono: float | None = None,
    echo: bool = True,
) -> CheckResult:
    """The timer promises over the history (see the module doc). ``cutoff_mono``: when the
    final read began (default: the runner's ``final read`` note); a message due less than
    ``grace_s`` before it and not read is counted, not reported."""
    sends: dict[str, Event] = {}
    for e in history.of(Kind.TIMER_SEND):
        sends.setdefault(e["msg_id"], e)
    acks = {e["msg_id"]: e for e in history.of(Kind.TIMER_SENT)}
    recalls = {e["msg_id"]: e for e in history.of(Kind.TIMER_RECALLED) if e["ok"]}
    # A recall that raised may have written its cancel (one that landed, then could not be
    # checked against timer_cancels_max, says so): its message may be dropped, not lost.
    tried = {e["msg_id"] for e in history.of(Kind.TIMER_RECALLED) if not e["ok"]}
    mids = set(sends)
    seen: dict[str, list[Event]] = defaultdict(list)
    for e in history.of(Kind.FINAL_READ):
        if is_timer_record(e, mids):
            seen[e.get("msg_id") or f"<no msg_id at {e.where}>"].append(e)
    first_consumed: dict[str, Event] = {}
    for e in history.of(Kind.CONSUMED):
        if e["msg_id"] in mids and (
            e["msg_id"] not in first_consumed or e.wall_ms < first_consumed[e["msg_id"]].wall_ms
        ):
            first_consumed[e["msg_id"]] = e
    offset = _wall_offset_s(history)
    cutoff = _cutoff(history) if cutoff_mono is None else cutoff_mono
    down = cluster_fault_intervals(history)
    violations: list[Violation] = []
    lateness: list[int] = []
    counts: Counter[str] = Counter()

    def report(kind: str, mid: str, detail: str, records: Iterable[Event] = ()) -> None:
        where = {"msg_id": mid, "records": [r.where for r in records]}
        violations.append(Violation(kind, f"timer msg {mid} {detail}", where))

    for mid, send in sends.items():
        recs = seen.get(mid, [])
        ack = acks.get(mid)
        ok = ack is not None and ack["ok"]
        counts["sent" if ok else "failed"] += 1
        if len(recs) > 1:
            report("duplicate", mid, f"visible {len(recs)} times", recs)
        for r in recs:
            if r["topic"] != send["topic"]:
                report("wrong_topic", mid, f"for {send['topic']} is visible at {r.where}", [r])
        lo, hi, timed = _bounds(send, ack)
        delivered_at = None
        if recs:
            headers = recs[0].get("headers") or {}
            delivered_at = _int(headers.get(DELIVERED_AT))
            if delivered_at is None or not str(headers.get(PROMOTED_FROM, "")).startswith("timer:"):
                report("bad_headers", mid, f"at {recs[0].where} lacks its timer headers", recs)
                delivered_at = None
            elif ok and ack is not None and headers.get(TIMER_ID) != ack.get("message_id"):
                report(
                    "wrong_id",
                    mid,
                    f"at {recs[0].where} has rmq.timer_id {headers.get(TIMER_ID)}, its send "
                    f"returned {ack.get('message_id')}",
                    recs,
                )
        if delivered_at is not None and timed and delivered_at < lo:
            report(
                "early",
                mid,
                f"delivered at {delivered_at}, {lo - delivered_at} ms before its time {lo}",
                recs,
            )
        consumed = first_consumed.get(mid)
        if consumed is not None and timed and consumed.wall_ms < lo:
            report(
                "early_consumed",
                mid,
                f"consumed by {consumed.proc} {lo - consumed.wall_ms} ms before its time",
                recs,
            )
        recall = recalls.get(mid)
        if recall is not None:
            counts["recalled"] += 1
        if not ok or ack is None:
            continue  # a failed send may still land, once (the duplicate check above)
        if not timed:
            counts["not timed (clock stepped)"] += 1
        # Deliverable from its time (at the latest hi), or its send if that came later.
        due = max(hi / 1000 - offset, ack.mono_s)
        if delivered_at is not None and timed:
            lateness.append(max(0, delivered_at - hi))
            if delivered_at / 1000 - offset > up_deadline(due, horizon_s, down):
                report(
                    "late",
                    mid,
                    f"delivered {delivered_at / 1000 - offset - due:.1f} s after it was due, "
                    f"past the {horizon_s:g} s horizon",
                    recs,
                )
        if recall is not None:
            honoured = (
                timed
                and recall.mono_s <= due - RECALL_MARGIN_S
                and not overlaps(down, recall.mono_s, due)
            )
            if recs and honoured:
                report(
                    "recalled_delivered",
                    mid,
                    f"recalled {due - recall.mono_s:.1f} s before its time, yet visible",
                    recs,
                )
            elif recs:
                counts["recall lost the race"] += 1
        elif not recs:
            if mid in tried:
                counts["recall failed, not visible"] += 1
            elif due <= cutoff - grace_s:
                report("lost", mid, f"(for {send['topic']}, sent by {send.proc}) is not visible")
            else:
                counts["not due by the final read"] += 1
        else:
            counts["delivered"] += 1
    for mid, recs in seen.items():
        if mid not in sends:
            report("phantom", mid, f"was never sent, yet visible at {recs[0].where}", recs)
    p99 = _p99(lateness)
    summary = (
        f"{counts['sent']} sent ({counts['failed']} failed), {counts['recalled']} recalled, "
        f"{counts['delivered']} delivered once"
        + (f" (lateness p99 {p99} ms)" if p99 is not None else "")
        + "".join(
            f", {counts[k]} {k}"
            for k in (
                "recall lost the race",
                "not due by the final read",
                "not timed (clock stepped)",
            )
            if counts[k]
        )
    )
    result = CheckResult.of("timers", summary, violations)
    return result.print() if echo else result
