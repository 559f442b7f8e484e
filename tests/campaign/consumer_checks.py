"""Checkers of the consumers: orderly processing and order, the queue locks, push delivery.

Lock times are the lock service's and the consumers' wall ms (neither runs under a skewed
clock); a lease is valid over the union of ``[granted_ms, valid_until_ms]`` of the grants
to one (queue, consumer, epoch), cut at its release.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from tests.campaign.history import Event, History, Kind
from tests.campaign.result import CheckResult, Violation

__all__ = ["check_locks", "check_orderly", "check_push"]

Record = tuple[str, int, int]  # topic, partition, offset
MESSAGE_GROUP = "rmq.message_group"


def _done(result: CheckResult, echo: bool) -> CheckResult:
    return result.print() if echo else result


def _groups(history: History, consumer: str) -> dict[str, tuple[set[str], str]]:
    """Per group of this consumer class: its topics and its mode (subscribe events, a
    pattern matching the final-read topics, else the topics it consumed from; mode
    'partition' unless subscribed in 'key' mode)."""
    out: dict[str, tuple[set[str], str]] = {}
    read_topics = {e["topic"] for e in history.of(Kind.FINAL_READ)}
    for e in history.of(Kind.SUBSCRIBE):
        if e["consumer"] == consumer:
            topics, mode = out.get(e["group"], (set(), "partition"))
            if e.get("pattern"):
                topics = topics | {t for t in read_topics if re.match(e["pattern"], t)}
            out[e["group"]] = (topics | set(e["topics"]), e.get("mode", mode))
    for e in history.of(Kind.CONSUMED):
        if e["consumer"] == consumer and e["group"] not in out:
            out[e["group"]] = ({e["topic"]}, "partition")
    return out


def _final(history: History) -> tuple[dict[Record, Event], set[str]]:
    records = {(e["topic"], e["partition"], e["offset"]): e for e in history.of(Kind.FINAL_READ)}
    return records, {r[0] for r in records}


def _order_violations(
    group: str, mode: str, first: dict[Record, Event], final: dict[Record, Event]
) -> list[Violation]:
    """Records of one partition (key mode: of one key in it) were first processed in offset
    order."""
    lanes: dict[tuple, list[tuple[int, Event]]] = defaultdict(list)
    for rec, e in first.items():
        # The ordering key: the message group header, else the record key (orderly/keys.py).
        seen = final.get(rec)
        key = (
            (seen.get("headers", {}).get(MESSAGE_GROUP) or seen.get("key")) if seen else None
        ) or e.get("key")
        lanes[(rec[0], rec[1], key) if mode == "key" else rec[:2]].append((rec[2], e))
    out = []
    for lane, items in lanes.items():
        items.sort(key=lambda item: item[0])
        latest: Event | None = None
        for _offset, e in items:
            if latest is not None and e.mono_s < latest.mono_s:
                what = f"key {lane[2]!r} of " if mode == "key" else ""
                out.append(
                    Violation(
                        "out_of_order",
                        f"group {group}: {what}{e.where} was "
                        f"first processed {latest.mono_s - e.mono_s:.3f} s "
                        f"before {latest.where} ({e['instance']} vs "
                        f"{latest['instance']})",
                        {"group": group, "record": e.where, "before": latest.where},
                    )
                )
            if latest is None or e.mono_s >= latest.mono_s:
                latest = e
    return out


def check_orderly(history: History, *, echo: bool = True) -> CheckResult:
    """Every record of an orderly group's topics in the final read was processed (or
    dead-lettered), nothing else was, and first processing kept offset order per partition
    (partition mode) or per key (key mode)."""
    final, read_topics = _final(history)
    violations: list[Violation] = []
    total = 0
    groups = _groups(history, "orderly")
    for group, (topics, mode) in groups.items():
        first: dict[Record, Event] = {}
        for e in history.of(Kind.CONSUMED):
            if e["consumer"] == "orderly" and e["group"] == group:
                rec = (e["topic"], e["partition"], e["offset"])
                first.setdefault(rec, e)
                if rec in final and final[rec].get("msg_id") not in (None, e["msg_id"]):
                    violations.append(
                        Violation(
                            "mismatch",
                            f"group {group}: {e.where} was "
                            f"processed as msg {e['msg_id']}, the final "
                            f"read has {final[rec]['msg_id']}",
                            {"record": e.where},
                        )
                    )
                elif rec not in final and e["topic"] in read_topics:
                    violations.append(
                        Violation(
                            "phantom",
                            f"group {group}: processed "
                            f"{e.where} (msg {e['msg_id']}), which is not "
                            "in the final read",
                            {"record": e.where},
                        )
                    )
        dead = {
            (e["topic"], e["partition"], e["offset"])
            for e in history.of(Kind.DLQ)
            if e["group"] == group
        }
        expected = [rec for rec in final if rec[0] in topics]
        total += len(expected)
        for rec in sorted(expected):
            if rec not in first and rec not in dead:
                violations.append(
                    Violation(
                        "unprocessed",
                        f"group {group}: "
                        f"{final[rec].where} (msg {final[rec].get('msg_id')})"
                        " was never processed",
                        {"record": final[rec].where},
                    )
                )
        violations += _order_violations(group, mode, first, final)
    return _done(
        CheckResult.of("orderly", f"{len(groups)} groups, {total} records expected", violations),
        echo,
    )


@dataclass
class _Lease:
    """The valid intervals of one (queue, consumer, epoch)."""

    intervals: list[tuple[int, int]]

    def merged(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for lo, hi in sorted(self.intervals):
            if out and lo <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], hi))
            else:
                out.append((lo, hi))
        return out

    def covering(self, t: int) -> tuple[int, int] | None:
        return next(((lo, hi) for lo, hi in self.merged() if lo <= t <= hi), None)


def _leases(history: History) -> dict[str, dict[tuple[str, int], _Lease]]:
    leases: dict[str, dict[tuple[str, int], _Lease]] = defaultdict(dict)
    released: dict[tuple[str, str, int], int] = {}
    for e in history.of(Kind.LOCK_RELEASE):
        key = (e["queue"], e["consumer"], e["epoch"])
        released[key] = min(released.get(key, e["released_ms"]), e["released_ms"])
    for e in history.of(Kind.LOCK_GRANT):
        end = e["valid_until_ms"]
        cut = released.get((e["queue"], e["consumer"], e["epoch"]))
        if cut is not None and e["granted_ms"] <= cut:
            end = min(end, cut)
        leases[e["queue"]].setdefault((e["consumer"], e["epoch"]), _Lease([])).intervals.append(
            (e["granted_ms"], end)
        )
    return leases


def _grant_violations(
    history: History, leases: dict[str, dict[tuple[str, int], _Lease]]
) -> list[Violation]:
    """A new holder has a higher epoch than every earlier grant, and gets the lock only
    after the previous holder's lease ended (or was released)."""
    out = []
    by_queue: dict[str, list[Event]] = defaultdict(list)
    for e in history.of(Kind.LOCK_GRANT):
        by_queue[e["queue"]].append(e)
    for queue, grants in by_queue.items():
        grants.sort(key=lambda g: (g["granted_ms"], g["epoch"]))
        prev: Event | None = None
        for g in grants:
            if prev is not None and g["consumer"] != prev["consumer"]:
                if g["epoch"] <= prev["epoch"]:
                    out.append(
                        Violation(
                            "epoch_not_increasing",
                            f"{queue}: {g['consumer']} "
                            f"got epoch {g['epoch']} after {prev['consumer']} held "
                            f"epoch {prev['epoch']}",
                            {"queue": queue},
                        )
                    )
                span = leases[queue][(prev["consumer"], prev["epoch"])].covering(g["granted_ms"])
                if span is not None and g["granted_ms"] < span[1]:
                    out.append(
                        Violation(
                            "overlapping_grant",
                            f"{queue}: granted to "
                            f"{g['consumer']} (epoch {g['epoch']}) at "
                            f"{g['granted_ms']} while {prev['consumer']}'s lease "
                            f"ran to {span[1]}",
                            {"queue": queue},
                        )
                    )
            elif prev is not None and g["epoch"] < prev["epoch"]:
                out.append(
                    Violation(
                        "epoch_not_increasing",
                        f"{queue}: {g['consumer']}'s "
                        f"epoch went from {prev['epoch']} to {g['epoch']}",
                        {"queue": queue},
                    )
                )
            prev = g
    return out


def check_locks(history: History, *, echo: bool = True) -> CheckResult:
    """Orderly queue locks: a later holder has a higher epoch; no two holders process a
    queue under valid leases at once (a batch started under a valid lease may outlive it);
    no batch starts without a valid lease; no holder sends a commit after its lease lapsed
    (one sent under it that lands after a takeover is counted in the summary)."""
    leases = _leases(history)
    violations = _grant_violations(history, leases)
    grants = history.of(Kind.LOCK_GRANT)
    grants_of: dict[str, list[Event]] = defaultdict(list)
    for g in grants:
        grants_of[g["queue"]].append(g)
    spans: dict[str, list[tuple[int, int, Event]]] = defaultdict(list)
    late_landings = 0
    for b in history.of(Kind.BATCH):
        queue, who, epoch = b["queue"], b["instance"], b["epoch"]
        lease = (
            leases[queue].get((who, epoch))
            if queue in leases
            else _Lease([(b.get("lease_granted_ms", b["start_ms"]), b["lease_valid_until_ms"])])
        )
        where = {"queue": queue, "instance": who, "epoch": epoch, "start_ms": b["start_ms"]}
        span = lease.covering(b["start_ms"]) if lease else None
        if span is None:
            violations.append(
                Violation(
                    "batch_without_lease",
                    f"{queue}: {who} (epoch "
                    f"{epoch}) started a batch at {b['start_ms']} without "
                    "a valid lease",
                    where,
                )
            )
            continue
        spans[queue].append((b["start_ms"], min(b["end_ms"], span[1]), b))
        if b["committed"]:
            # The lease is checked when the commit is sent: that is the holder's decision.
            # Kafka's offset commit has no fence a client can bind to its lease (librdkafka
            # defers a commit while the group coordinator is away and stamps it with the
            # generation current when it finally goes out), so one sent under the lease may
            # land after another holder took the queue. It states a prefix its holder
            # processed, so at worst the next holder redoes records; counted, not a violation.
            at, sent = b["commit_ms"], b.get("commit_sent_ms") or b["commit_ms"]
            taken = [
                g
                for g in grants_of[queue]
                if g["consumer"] != who and g["epoch"] > epoch and g["granted_ms"] <= at
            ]
            if lease is None or lease.covering(sent) is None:
                why = "its lease had lapsed" + (
                    f" ({taken[0]['consumer']} got epoch {taken[0]['epoch']} at "
                    f"{taken[0]['granted_ms']})"
                    if taken
                    else ""
                )
                violations.append(
                    Violation(
                        "commit_after_lease_lost",
                        f"{queue}: {who} "
                        f"(epoch {epoch}) committed offsets "
                        f"{b.get('offsets', [])} at {sent} after {why}",
                        where,
                    )
                )
            elif taken:
                late_landings += 1
    for queue, items in spans.items():
        items.sort(key=lambda s: s[0])
        for i, (_lo, hi, b) in enumerate(items):
            for lo2, _hi2, b2 in items[i + 1 :]:
                if lo2 >= hi:
                    break
                if b2["instance"] != b["instance"]:
                    violations.append(
                        Violation(
                            "overlapping_lock",
                            f"{queue}: {b2['instance']}"
                            f" (epoch {b2['epoch']}) processed from {lo2} "
                            f"while {b['instance']} (epoch {b['epoch']}) "
                            f"held a valid lease to {hi}",
                            {"queue": queue},
                        )
                    )
    return _done(
        CheckResult.of(
            "locks",
            f"{len(grants)} grants, {len(history.of(Kind.BATCH))} batches on "
            f"{len(spans)} queues, {late_landings} commits landed after a takeover",
            violations,
        ),
        echo,
    )


def check_push(
    history: History,
    *,
    dead_letter_expected: Callable[[str], bool] | None = None,
    echo: bool = True,
) -> CheckResult:
    """Every record of a push group's topics in the final read was processed successfully
    at least once or dead-lettered; every retry was consumed again or dead-lettered; no
    record outside the final read was processed. ``dead_letter_expected(msg_id)``: the
    listener's plan; then exactly the planned messages are dead letters."""
    final, _ = _final(history)
    violations: list[Violation] = []
    n_records = n_retries = n_dead = 0
    for group, (topics, _mode) in _groups(history, "push").items():
        expected = {e.get("msg_id") or e.where: e for rec, e in final.items() if rec[0] in topics}
        consumed = [
            e for e in history.of(Kind.CONSUMED) if e["consumer"] == "push" and e["group"] == group
        ]
        ok = {e["msg_id"] for e in consumed if e.get("result", "SUCCESS") == "SUCCESS"}
        dead = {e["msg_id"]: e for e in history.of(Kind.DLQ) if e["group"] == group}
        n_records += len(expected)
        n_dead += len(dead)
        for msg_id, e in expected.items():
            if msg_id not in ok and msg_id not in dead:
                violations.append(
                    Violation(
                        "lost",
                        f"group {group}: msg {msg_id} at {e.where}"
                        " was never processed nor dead-lettered",
                        {"group": group, "msg_id": msg_id},
                    )
                )
        if dead_letter_expected is not None:
            violations += _dead_letter_violations(group, expected, dead, dead_letter_expected)
        for e in consumed:
            if e["msg_id"] not in expected:
                violations.append(
                    Violation(
                        "phantom",
                        f"group {group}: processed msg "
                        f"{e['msg_id']} at {e.where}, which is not in the "
                        "final read",
                        {"group": group, "record": e.where},
                    )
                )
        last_seen = {e["msg_id"]: e.mono_s for e in consumed}  # history order: the last wins
        for r in history.of(Kind.PUSH_RETRY):
            if r["group"] != group:
                continue
            n_retries += 1
            again = last_seen.get(r["msg_id"], -1.0) > r.mono_s
            if not again and r["msg_id"] not in dead:
                violations.append(
                    Violation(
                        "retry_lost",
                        f"group {group}: msg {r['msg_id']} "
                        f"sent to retry ({r.get('reconsume_times')} "
                        "times consumed) never came back nor reached the "
                        "DLQ",
                        {"group": group, "msg_id": r["msg_id"]},
                    )
                )
    return _done(
        CheckResult.of(
            "push", f"{n_records} records, {n_retries} retries, {n_dead} dead letters", violations
        ),
        echo,
    )


def _dead_letter_violations(
    group: str, expected: dict[str, Event], dead: dict[str, Event], planned: Callable[[str], bool]
) -> list[Violation]:
    """The dead letters are exactly the visible messages the listener always fails."""
    out = [
        Violation(
            "unexpected_dead_letter",
            f"group {group}: msg {m} is a dead letter but its listener succeeds on a retry",
            {"group": group, "msg_id": m},
        )
        for m in sorted(dead)
        if not planned(m)
    ]
    out += [
        Violation(
            "missing_dead_letter",
            f"group {group}: msg {m} at {e.where} always fails but is not on the DLQ",
            {"group": group, "msg_id": m},
        )
        for m, e in sorted(expected.items())
        if planned(m) and m not in dead
    ]
    return out
