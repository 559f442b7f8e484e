"""The PushConsumer's FIFO message groups (docs/guides/push-consumer.md, "FIFO message
groups"), over the push workers' ``consumed`` events, the final read (each record's
``rmq.message_group``) and the push DLQ read back (``dlq`` events).

Per push group, a message group's records in one partition (offset order) form a lane:

1. a record of a lane is called only when every earlier record of it was consumed with
   SUCCESS (a call that ended before this one started) or was dead-lettered after its last
   attempt; an earlier record whose last call before failed although it had succeeded once
   is excused by a disruption of the group since that success (an instance killed or
   paused, a transactional producer re-created: the ack not committed yet is replayed, the
   lease committed up to 10 s);
2. a FIFO record is retried in place, never on a retry topic;
3. within one instance's life (process and pid) a record's ``reconsume_times`` strictly
   increase after a failed call, unless the group was disrupted between the two calls or
   the second came over ``REPLAY_GAP_MS`` later (a replay restores the committed count);
   a call after a SUCCESS is a replay of an ack not committed yet (a transaction aborted
   under a rebalance: no event marks it), so any count may follow it; never over
   ``max_reconsume_times``;
4. no two calls of one lane run at once (each call's start, ``start_mono_s``, against the
   other's end, its event's ``mono_s``), unless the earlier call's instance was frozen or
   killed during it, or a fault that can end a live member's session (a network partition,
   every broker paused) overlapped it: then the next owner goes on once the 10 s lease
   lapsed, as RocketMQ's does once the broker's lock expired. A live slow call keeps its
   group across a rebalance and a producer renewal (issue 45).

Times are ``mono_s`` (one host), a disruption's wall ms against the worker's, as
simple_checks.py, whose ``Disruptions`` this reuses. A call logged without
``start_mono_s`` (histories before issue 45) started when it ended.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tests.campaign.history import Event, History, Kind
from tests.campaign.result import CheckResult, Violation
from tests.campaign.simple_checks import Disruptions, record_at, where

# A retry in place comes after the workers' FIFO retry interval (1 s). A count that did not
# grow this much later is a replay from the commit after a rebalance the worker logs no event
# for (a session timeout, an aborted transaction: seed 30's short run met one 11 s later).
REPLAY_GAP_MS = 3000

__all__ = ["check_push_fifo"]

Record = tuple[str, int, int]  # topic, partition, offset
MESSAGE_GROUP = "rmq.message_group"
# What makes a push group replay from its committed offsets (faultkit's process faults,
# the push consumer's counts).
DISRUPTING_FAULTS = ("consumer_kill", "consumer_pause")
DISRUPTING_COUNTS = ("producer_renewals",)
# What lets a lane's next call start while one still runs (rule 4): the calling process's
# faults (its target), and the cluster faults that can end a live member's session (any).
OVERLAP_PROCESS_FAULTS = ("consumer_kill", "consumer_pause")
OVERLAP_CLUSTER_FAULTS = ("partition", "all_brokers_paused")


def _start_s(call: Event) -> float:
    """When a call started (``mono_s``): its ``start_mono_s``, else its end."""
    start = call.get("start_mono_s")
    return call.mono_s if start is None else float(start)


def _start_ms(call: Event) -> int:
    """When a call started, in the worker's wall ms."""
    return call.wall_ms - round((call.mono_s - _start_s(call)) * 1000)


@dataclass
class _PushGroup:
    name: str
    who: set[str] = field(default_factory=set)  # its processes and client ids
    topics: set[str] = field(default_factory=set)
    calls: dict[Record, list[Event]] = field(default_factory=lambda: defaultdict(list))
    dead: set[Record] = field(default_factory=set)


def _push_groups(history: History) -> dict[str, _PushGroup]:
    groups: dict[str, _PushGroup] = {}
    for e in history.of(Kind.CONSUMED):
        if e["consumer"] == "push":
            g = groups.setdefault(e["group"], _PushGroup(e["group"]))
            g.who |= {e.proc, e["instance"]}
            g.topics.add(e["topic"])
            g.calls[record_at(e)].append(e)
    for e in history.of(Kind.DLQ):
        if e["consumer"] == "push" and e["group"] in groups and e.get("offset") is not None:
            groups[e["group"]].dead.add(record_at(e))
    for g in groups.values():
        for calls in g.calls.values():
            calls.sort(key=lambda e: e.mono_s)
    return groups


def _lanes(g: _PushGroup, final: dict[Record, Event]) -> dict[tuple[str, int, str], list[Record]]:
    lanes: dict[tuple[str, int, str], list[Record]] = defaultdict(list)
    for rec, e in sorted(final.items()):
        group = (e.get("headers") or {}).get(MESSAGE_GROUP)
        if group and rec[0] in g.topics:
            lanes[(rec[0], rec[1], group)].append(rec)
    return lanes


def _blocked(g: _PushGroup, d: Disruptions, rec: Record, call: Event) -> str | None:
    """Why ``rec`` (earlier in its lane) should have held ``call`` back, or None."""
    calls = g.calls.get(rec, [])
    before = [e for e in calls if e.mono_s <= _start_s(call)]  # ended before it started
    last_try = max((int(e.get("reconsume_times") or 0) for e in calls), default=0)
    if rec in g.dead and any(int(e.get("reconsume_times") or 0) >= last_try for e in before):
        return None  # its last attempt was made: dead-lettered before the group went on
    ok = [e for e in before if e.get("result", "SUCCESS") == "SUCCESS"]
    if not ok:
        return f"@{rec[2]} before it was neither consumed with SUCCESS nor dead-lettered"
    if before[-1].get("result", "SUCCESS") == "SUCCESS":
        return None
    if d.any(g.who, ok[0].wall_ms, call.wall_ms):
        return None
    return (
        f"@{rec[2]} before it failed again at {before[-1].wall_ms} after its SUCCESS at "
        f"{ok[0].wall_ms}, with no instance disrupted in between"
    )


def _order(g: _PushGroup, d: Disruptions, lanes: dict) -> list[Violation]:
    """1. No record of a lane called while an earlier one is not done."""
    out = []
    for (topic, partition, group), recs in lanes.items():
        for i, rec in enumerate(recs):
            for call in g.calls.get(rec, ()):
                why = next(filter(None, (_blocked(g, d, r, call) for r in recs[:i])), None)
                if why is not None:
                    out.append(
                        Violation(
                            "fifo",
                            f"group {g.name}: message group {group!r} of {topic}[{partition}]: "
                            f"@{rec[2]} called by {call['instance']} at {call.wall_ms} "
                            f"(reconsume_times {call.get('reconsume_times')}) while {why}",
                            {"group": g.name, "record": where(rec)},
                        )
                    )
                    break
    return out


def _in_place(g: _PushGroup, lanes: dict, retries: list[Event]) -> list[Violation]:
    """2. A FIFO record's calls and retries carry no retry topic."""
    fifo = {rec for recs in lanes.values() for rec in recs}
    mine = [r for r in retries if r["group"] == g.name and r.get("offset") is not None]
    return [
        Violation(
            "fifo_retry_topic",
            f"group {g.name}: FIFO record {where(record_at(e))} went through retry topic "
            f"{e['retry_topic']} ({e.kind.value}, reconsume_times {e.get('reconsume_times')})",
            {"group": g.name, "record": where(record_at(e))},
        )
        for e in [c for rec in fifo for c in g.calls.get(rec, ())] + mine
        if e.get("retry_topic") and record_at(e) in fifo
    ]


def _counts(g: _PushGroup, d: Disruptions, lanes: dict, most: int | None) -> list[Violation]:
    """3. Per record and instance life, reconsume_times strictly increase (a disruption
    between two calls excused), never over ``most``."""
    out = []
    for rec in (r for recs in lanes.values() for r in recs):
        last: dict[tuple[str, int], Event] = {}
        for e in g.calls.get(rec, ()):
            n, life = int(e.get("reconsume_times") or 0), (e.proc, e.pid)
            prev = last.get(life)
            why = None
            if most is not None and n > most:
                why = f"reconsume_times {n} over max_reconsume_times {most}"
            elif (
                prev is not None
                and n <= int(prev.get("reconsume_times") or 0)
                and prev.get("result", "SUCCESS") != "SUCCESS"  # else a replay of its ack
                and e.wall_ms - prev.wall_ms < REPLAY_GAP_MS
                and not d.any(g.who, prev.wall_ms, e.wall_ms)
            ):
                why = f"reconsume_times {n} after {prev.get('reconsume_times')} at {prev.wall_ms}"
            if why:
                out.append(
                    Violation(
                        "fifo_reconsume_times",
                        f"group {g.name}: {where(rec)} called by {e['instance']} at "
                        f"{e.wall_ms}: {why}",
                        {"group": g.name, "record": where(rec)},
                    )
                )
            last[life] = e
    return out


def _overlap_excused(history: History, first: Event) -> bool:
    """Whether a fault while ``first`` ran let its lane go on without it (rule 4)."""
    lo, hi = _start_ms(first), first.wall_ms
    for f in history.of(Kind.FAULT):
        start, end = int(f["start_ms"]), int(f.get("end_ms") or f["start_ms"])
        if start > hi or end < lo:
            continue
        if f["fault"] in OVERLAP_CLUSTER_FAULTS:
            return True
        if f["fault"] in OVERLAP_PROCESS_FAULTS and f["target"] in (first.proc, first["instance"]):
            return True
    return False


def _overlaps(g: _PushGroup, history: History, lanes: dict) -> list[Violation]:
    """4. No call of a lane starts while another call of it still runs."""
    out = []
    for (topic, partition, group), recs in lanes.items():
        calls = sorted((c for r in recs for c in g.calls.get(r, ())), key=_start_s)
        for i, first in enumerate(calls):
            for later in calls[i + 1 :]:
                if _start_s(later) >= first.mono_s:
                    break  # sorted by start: none after it starts before ``first`` ended
                if _overlap_excused(history, first):
                    break
                out.append(
                    Violation(
                        "fifo_overlap",
                        f"group {g.name}: message group {group!r} of {topic}[{partition}]: "
                        f"@{later['offset']} called by {later['instance']} at "
                        f"{_start_ms(later)} while the call of @{first['offset']} by "
                        f"{first['instance']} ran ({_start_ms(first)} to {first.wall_ms})",
                        {"group": g.name, "record": where(record_at(later))},
                    )
                )
    return out


def check_push_fifo(
    history: History, *, max_reconsume_times: int | None = None, echo: bool = True
) -> CheckResult:
    """The push groups' FIFO promises (the module's docstring) on every message group."""
    d = Disruptions(history, faults=DISRUPTING_FAULTS, counters=DISRUPTING_COUNTS)
    final = {record_at(e): e for e in history.of(Kind.FINAL_READ)}
    retries = history.of(Kind.PUSH_RETRY)
    violations: list[Violation] = []
    parts = []
    for g in _push_groups(history).values():
        lanes = _lanes(g, final)
        violations += _order(g, d, lanes) + _in_place(g, lanes, retries)
        violations += _counts(g, d, lanes, max_reconsume_times) + _overlaps(g, history, lanes)
        n_fifo = sum(len(recs) for recs in lanes.values())
        calls = sum(len(g.calls.get(r, ())) for recs in lanes.values() for r in recs)
        parts.append(f"{n_fifo} FIFO records in {len(lanes)} lanes, {calls} calls")
    result = CheckResult.of("push_fifo", "; ".join(parts) or "no push group", violations)
    return result.print() if echo else result
