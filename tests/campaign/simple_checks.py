"""The SimpleConsumer's checker (issue 36): the five promises of
docs/design/simple-consumer.md, "The campaign checker", over the ``simple`` events of its
workers, the final read (what is on its topics, with each record's ``rmq.message_group``),
its DLQ read back (``dlq`` events at their original coordinates) and the nemesis's kills.

A message is its record on the topic (``topic[partition]@offset``: the SimpleConsumer retries
in place). Times: ``mono_s`` orders events (one host); a kill is compared by wall ms with the
worker's events (neither runs under a skewed clock).

What may excuse a redelivery the promise would otherwise forbid is a *disruption* of an
instance: the nemesis killed it, its ``counts['commit_failures']`` rose (status events,
every second), or its group session timed out (a ``note`` "session lost": the partitions
go without a commit, so the acks not committed yet go with them). A delivery counts when
its commit succeeds; the worker writes it once ``receive`` returned, so a kill between the
two, or a commit that failed after it landed, leaves an attempt no event shows (the
design's counting rule: over-counting is the safe direction).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.campaign.history import Event, History, Kind
from tests.campaign.result import CheckResult, Violation

__all__ = ["SESSION_LOST", "Disruptions", "check_simple", "record_at", "simple_unsettled", "where"]

Record = tuple[str, int, int]  # topic, partition, offset
MESSAGE_GROUP = "rmq.message_group"
DLQ_REASON = "max_attempts"
# An ack is committed at most commit_interval_ms after it, plus the commit's round trip and
# the background thread's slice: an instance killed this long after an ack may lose it.
ACK_SLACK_MS = 1000
# An unseen delivery (a first attempt above 1) has its cause this long before at most: the
# lease's deadline, a rebalance after a kill, a group coordinator moving under a fault.
UNSEEN_WINDOW_MS = 60_000
SESSION_LOST = "session lost"  # the worker's note (simple_worker.py)


def record_at(e: Event) -> Record:
    return (e["topic"], int(e["partition"]), int(e["offset"]))


def where(rec: Record) -> str:
    return f"{rec[0]}[{rec[1]}]@{rec[2]}"


@dataclass
class _Group:
    """One SimpleConsumer group's inputs, gathered from the history."""

    name: str
    topics: set[str] = field(default_factory=set)
    instances: set[str] = field(default_factory=set)
    max_attempts: int = 16
    commit_interval_ms: int = 100
    events: dict[Record, list[Event]] = field(default_factory=lambda: defaultdict(list))
    dead: dict[Record, list[Event]] = field(default_factory=lambda: defaultdict(list))


def _groups(history: History) -> dict[str, _Group]:
    groups: dict[str, _Group] = {}
    for e in history.of(Kind.SUBSCRIBE):
        if e["consumer"] != "simple":
            continue
        g = groups.setdefault(e["group"], _Group(e["group"]))
        g.topics |= set(e["topics"])
        g.instances.add(e["instance"])
        settings = e.get("settings", {})
        g.max_attempts = int(settings.get("max_attempts", g.max_attempts))
        g.commit_interval_ms = int(settings.get("commit_interval_ms", g.commit_interval_ms))
    for e in history.of(Kind.SIMPLE):
        g = groups.setdefault(e["group"], _Group(e["group"]))
        g.instances.add(e["instance"])
        g.events[record_at(e)].append(e)
    for e in history.of(Kind.DLQ):
        if e["consumer"] == "simple" and e["group"] in groups and e.get("offset") is not None:
            groups[e["group"]].dead[record_at(e)].append(e)
    return groups


class Disruptions:
    """When each instance was killed (wall ms) and when its commits failed (the wall-ms
    span between the two status snapshots its ``commit_failures`` count rose between) or
    its session was lost. ``faults`` and ``counters``: the fault kinds and status counts
    that disrupt (the push checker adds pauses and producer re-creations)."""

    def __init__(
        self,
        history: History,
        *,
        faults: tuple[str, ...] = ("consumer_kill",),
        counters: tuple[str, ...] = ("commit_failures",),
    ) -> None:
        self.kills: dict[str, list[int]] = defaultdict(list)
        for e in history.of(Kind.FAULT):
            if e["fault"] in faults:
                self.kills[str(e["target"])].append(int(e["start_ms"]))
        self.failures: dict[str, list[tuple[int, int]]] = defaultdict(list)
        last: dict[str, tuple[int, int]] = {}
        for e in history.of(Kind.STATUS):
            counts = e.get("counts")
            if not isinstance(counts, dict) or not any(c in counts for c in counters):
                continue
            who, n = e["instance"], sum(int(counts.get(c, 0)) for c in counters)
            before = last.get(who)
            if before is not None and n > before[1]:
                self.failures[who].append((before[0], e.wall_ms))
            elif before is None and n > 0:  # a restarted incarnation's first snapshot
                self.failures[who].append((e.wall_ms - 2_000, e.wall_ms))
            last[who] = (e.wall_ms, n)
        for e in history.of(Kind.NOTE):
            if e["what"] == SESSION_LOST:
                self.failures[e.proc].append((e.wall_ms, e.wall_ms))

    def killed(self, who: Iterable[str], lo_ms: int, hi_ms: int) -> bool:
        return any(lo_ms <= k <= hi_ms for w in who for k in self.kills.get(w, ()))

    def commits_failed(self, who: Iterable[str], lo_ms: int, hi_ms: int) -> bool:
        return any(a <= hi_ms and b >= lo_ms for w in who for a, b in self.failures.get(w, ()))

    def any(self, who: Iterable[str], lo_ms: int, hi_ms: int) -> bool:
        who = list(who)
        return self.killed(who, lo_ms, hi_ms) or self.commits_failed(who, lo_ms, hi_ms)


def _lost_ack_excused(g: _Group, d: Disruptions, ack: Event, later_ms: int) -> bool:
    """Rule 2's exception: the acking instance was killed within its last commit interval
    after the ack, or its commits failed or its session was lost between the ack and
    ``later_ms``."""
    who, at = [ack["instance"]], ack.wall_ms
    return d.killed(who, at, at + g.commit_interval_ms + ACK_SLACK_MS) or d.commits_failed(
        who, at, later_ms
    )


def _delivered(g: _Group, expected: dict[Record, Event]) -> list[Violation]:
    """1. Every message on the group's topics is acked or in the DLQ."""
    out = []
    for rec, final in sorted(expected.items()):
        acked = any(e["event"] == "ack_ok" for e in g.events.get(rec, ()))
        if not acked and rec not in g.dead:
            seen = [e for e in g.events.get(rec, ()) if e["event"] == "received"]
            out.append(
                Violation(
                    "undelivered",
                    f"group {g.name}: {where(rec)} (msg {final.get('msg_id')}) was neither "
                    f"acked nor dead-lettered ({len(seen)} deliveries seen)",
                    {"group": g.name, "record": where(rec)},
                )
            )
    return out


def _acked_came_back(g: _Group, d: Disruptions) -> tuple[list[Violation], int]:
    """2. Nothing acked is received again, except an ack its instance lost by dying within
    its commit interval (or whose commits failed)."""
    out, excused = [], 0
    for rec, events in g.events.items():
        acks: list[Event] = []
        for e in events:
            if e["event"] == "ack_ok":
                acks.append(e)
            elif e["event"] == "received" and acks:
                if all(_lost_ack_excused(g, d, a, e.wall_ms) for a in acks):
                    excused += 1
                    acks = []
                    continue
                a = acks[-1]
                out.append(
                    Violation(
                        "acked_came_back",
                        f"group {g.name}: {where(rec)} acked by {a['instance']} at "
                        f"{a.wall_ms} was received again by {e['instance']} at {e.wall_ms} "
                        f"(attempt {e.get('attempt')}); its instance was not killed within "
                        f"{g.commit_interval_ms} ms of the ack",
                        {"group": g.name, "record": where(rec)},
                    )
                )
                acks = []
    return out, excused


def _lanes(g: _Group, expected: dict[Record, Event]) -> dict[tuple[str, int, str], list[Record]]:
    """The records of each message group of each partition, in offset (send) order."""
    lanes: dict[tuple[str, int, str], set[Record]] = defaultdict(set)
    for rec, final in expected.items():
        group = (final.get("headers") or {}).get(MESSAGE_GROUP)
        if group:
            lanes[(rec[0], rec[1], group)].add(rec)
    for rec, events in g.events.items():
        for e in events:
            if e.get("message_group"):
                lanes[(rec[0], rec[1], e["message_group"])].add(rec)
    return {lane: sorted(recs, key=lambda r: r[2]) for lane, recs in lanes.items()}


def _cleared(g: _Group, rec: Record, t: float) -> bool:
    """At ``mono_s`` t, ``rec`` was done: its last event then was an ack, or it is in the
    DLQ and was never delivered after t."""
    events = g.events.get(rec, [])
    before = [e for e in events if e.mono_s <= t and e["event"] in ("received", "ack_ok")]
    if before and before[-1]["event"] == "ack_ok":
        return True
    if rec in g.dead:
        return bool(before) and not any(e["event"] == "received" and e.mono_s > t for e in events)
    return False


def _fifo(g: _Group, expected: dict[Record, Event]) -> tuple[list[Violation], int]:
    """3. A record of a message group is received only once every earlier record of its
    group (offset order in its partition) was acked or dead-lettered."""
    out = []
    lanes = _lanes(g, expected)
    for (topic, partition, group), recs in lanes.items():
        for i, rec in enumerate(recs):
            for e in g.events.get(rec, ()):
                if e["event"] != "received":
                    continue
                blocking = next((r for r in recs[:i] if not _cleared(g, r, e.mono_s)), None)
                if blocking is not None:
                    out.append(
                        Violation(
                            "fifo",
                            f"group {g.name}: message group {group!r} of {topic}[{partition}]: "
                            f"@{rec[2]} received by {e['instance']} (attempt "
                            f"{e.get('attempt')}) while @{blocking[2]} before it was "
                            "neither acked nor dead-lettered",
                            {"group": g.name, "record": where(rec), "before": where(blocking)},
                        )
                    )
                    break
    return out, len(lanes)


def _attempts(g: _Group, d: Disruptions) -> list[Violation]:
    """4. Per message the attempts seen strictly increase, start at 1 unless an instance
    was disrupted just before, and never exceed max_attempts."""
    out = []
    for rec, events in g.events.items():
        seen = [e for e in events if e["event"] == "received"]
        last = 0
        for e in seen:
            n = int(e.get("attempt", 0))
            why = None
            if n <= last:
                why = f"attempt {n} after attempt {last}"
            elif n > g.max_attempts:
                why = f"attempt {n} over max_delivery_attempts {g.max_attempts}"
            elif (
                last == 0
                and n > 1
                and not d.any(g.instances, e.wall_ms - UNSEEN_WINDOW_MS, e.wall_ms)
            ):
                why = (
                    f"the first delivery seen has attempt {n}, and no instance was killed "
                    "nor failed a commit before it"
                )
            if why:
                out.append(
                    Violation(
                        "attempts",
                        f"group {g.name}: {where(rec)} received by {e['instance']}: {why}",
                        {"group": g.name, "record": where(rec)},
                    )
                )
            last = max(last, n)
    return out


def _dead_letters(
    g: _Group, d: Disruptions, expected: dict[Record, Event]
) -> tuple[list[Violation], int]:
    """5. Each dead letter (deduped by origin) is a message of the group's topics, with
    reason max_attempts, delivered max_attempts times, or whose last lease was lost with a
    disrupted instance after its last delivery seen; none whose ack was its last word."""
    out, copies = [], 0
    for rec, letters in sorted(g.dead.items()):
        copies += len(letters) - 1
        events = g.events.get(rec, [])
        seen = [e for e in events if e["event"] == "received"]
        top = max((int(e.get("attempt", 0)) for e in seen), default=0)
        why = None
        if rec[0] not in g.topics or rec not in expected:
            why = "its origin is no message of the group's topics in the final read"
        elif any(x.get("reason") != DLQ_REASON for x in letters):
            why = f"reason {[x.get('reason') for x in letters]}, not {DLQ_REASON!r}"
        elif top < g.max_attempts and not (
            seen and d.any(g.instances, seen[-1].wall_ms, seen[-1].wall_ms + UNSEEN_WINDOW_MS)
        ):
            why = f"dead-lettered after {top} of {g.max_attempts} deliveries"
        else:
            last = [e for e in events if e["event"] in ("received", "ack_ok")]
            if (
                last
                and last[-1]["event"] == "ack_ok"
                and not d.any(
                    [last[-1]["instance"]], last[-1].wall_ms, last[-1].wall_ms + UNSEEN_WINDOW_MS
                )
            ):
                why = f"acked by {last[-1]['instance']} at {last[-1].wall_ms}, then dead-lettered"
        if why:
            out.append(
                Violation(
                    "dead_letter",
                    f"group {g.name}: dead letter of {where(rec)}: {why}",
                    {"group": g.name, "record": where(rec)},
                )
            )
    return out, copies


def check_simple(history: History, *, echo: bool = True) -> CheckResult:
    """The SimpleConsumer's five promises for every group subscribed (``simple``)."""
    d = Disruptions(history)
    final = {record_at(e): e for e in history.of(Kind.FINAL_READ)}
    violations: list[Violation] = []
    parts = []
    for g in _groups(history).values():
        expected = {rec: e for rec, e in final.items() if rec[0] in g.topics}
        came_back, excused = _acked_came_back(g, d)
        fifo, lanes = _fifo(g, expected)
        dead, copies = _dead_letters(g, d, expected)
        violations += _delivered(g, expected) + came_back + fifo + _attempts(g, d) + dead
        received = sum(1 for evs in g.events.values() for e in evs if e["event"] == "received")
        parts.append(
            f"{len(expected)} msgs, {received} received, {len(g.dead)}+{copies} dead, "
            f"{lanes} groups, {excused} lost acks"
        )
    result = CheckResult.of("simple", "; ".join(parts) or "no SimpleConsumer group", violations)
    return result.print() if echo else result


def simple_unsettled(
    history: History, group: str, wanted: set[str], *, wait_dead_ms: int, now_ms: int
) -> set[str]:
    """The message ids of ``wanted`` the group has not settled yet: neither acked nor
    received at their last attempt ``wait_dead_ms`` ago (then the DLQ has them, or soon)."""
    g = _groups(history).get(group)
    if g is None:
        return set(wanted)
    settled = set()
    for events in g.events.values():
        for e in events:
            if e["event"] == "ack_ok" or (
                e["event"] == "received"
                and int(e.get("attempt", 0)) >= g.max_attempts
                and e.wall_ms + wait_dead_ms <= now_ms
            ):
                settled.add(e["msg_id"])
    return set(wanted) - settled
