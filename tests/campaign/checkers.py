"""The campaign's checkers over a recorded history; each returns a CheckResult and prints
its own line (``echo=False`` to keep quiet).

The transactional promise lives here; the consumers' (orderly, locks, push) in
consumer_checks.py, the push FIFO groups' in push_fifo_checks.py, re-exported. The harness
calls :func:`run_all` or the checkers one by one, then ``summary.render_summary``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tests.campaign.consumer_checks import check_locks, check_orderly, check_push
from tests.campaign.history import Event, History, Intent, Kind
from tests.campaign.horizon import CLUSTER_FAULTS, cluster_fault_intervals, up_deadline
from tests.campaign.push_fifo_checks import check_push_fifo
from tests.campaign.result import CheckResult, Violation
from tests.campaign.simple_checks import check_simple
from tests.campaign.timer_checks import check_timers, is_timer_record, timer_counts, timer_mids
from tests.campaign.txn_tools import (
    ToolOutputError,
    parse_discarded,
    parse_find_hanging,
    parse_pending,
    parse_txn_list,
)

__all__ = [
    "CLUSTER_FAULTS",
    "OBSERVATIONS",
    "OPEN_STATES",
    "check_coordinator_exits",
    "check_exactly_once",
    "check_faults_took_effect",
    "check_history",
    "check_kafka_transactions",
    "check_liveness",
    "check_locks",
    "check_orderly",
    "check_push",
    "check_push_fifo",
    "check_settled",
    "check_simple",
    "check_spark",
    "check_timers",
    "check_worker_exits",
    "read_topics",
    "run_all",
    "timer_counts",
]

#: Kafka transaction states that are still open: nothing may be in one once settled.
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})
#: The cluster observations the faults must produce (keys of ``minimums``).
OBSERVATIONS = (Kind.LEADER_CHANGE, Kind.LOCK_TAKEOVER, Kind.REBALANCE, Kind.FENCED_PRODUCER)
_ROLLBACK_INTENTS = {Intent.ROLLBACK.value, Intent.UNKNOW_THEN_ROLLBACK.value}
_UNKNOW_INTENTS = {Intent.UNKNOW_THEN_COMMIT.value, Intent.UNKNOW_THEN_ROLLBACK.value}


def _done(result: CheckResult, echo: bool) -> CheckResult:
    return result.print() if echo else result


def _wheres(events: Iterable[Event]) -> str:
    return ", ".join(e.where for e in events)


def check_history(history: History, *, echo: bool = True) -> CheckResult:
    """Every line of every history file was an event (a torn last line is only counted)."""
    violations = [
        Violation("bad_line", str(b), {"path": b.path, "line": b.line}) for b in history.bad
    ]
    return _done(
        CheckResult.of(
            "history",
            f"{len(history)} events from {len(history.paths)} files, "
            f"{len(history.torn)} torn last lines, {len(history.bad)} bad lines",
            violations,
        ),
        echo,
    )


def _visible(history: History, topics: Iterable[str] | None) -> dict[str, list[Event]]:
    """The transactional messages read at the end, by id: timer deliveries on the same
    topics are check_timers' (they have no transaction)."""
    wanted = None if topics is None else set(topics)
    timers = timer_mids(history)
    by_msg: dict[str, list[Event]] = defaultdict(list)
    for e in history.of(Kind.FINAL_READ):
        if is_timer_record(e, timers):
            continue
        if wanted is None or e["topic"] in wanted:
            by_msg[e.get("msg_id") or f"<no msg_id at {e.where}>"].append(e)
    return by_msg


def _not_committed(history: History, sends: dict[str, Event]) -> Any:
    """A function naming why a visible message without a committed row is there wrongly."""
    failed = {e.get("txn_id") for e in history.of(Kind.SEND_FAILED)} - {None}
    failed_msgs = {m for e in history.of(Kind.SEND_FAILED) for m in e.get("msg_ids", [])}
    rolled = {e["txn_id"] for e in history.of(Kind.LOCAL_ROLLED_BACK)}

    def why(msg_id: str, txn: str | None) -> str:
        if msg_id in failed_msgs or txn in failed:
            return "failed_send_visible"
        if txn in rolled or (txn in sends and sends[txn]["intent"] in _ROLLBACK_INTENTS):
            return "rolled_back_visible"
        return "uncommitted_visible"  # a local transaction that never ran or never ended

    return why


def check_exactly_once(
    history: History, *, topics: Iterable[str] | None = None, echo: bool = True
) -> CheckResult:
    """Every committed row's message is visible exactly once in the final read (on its
    topic, under its transaction id), nothing else is, and a multi-message transaction is
    visible whole or not at all. ``topics``: the promoted topics read (default: all)."""
    wanted = None if topics is None else set(topics)
    rows = {
        e["msg_id"]: e
        for e in history.of(Kind.COMMITTED_ROW)
        if wanted is None or e["topic"] in wanted
    }
    sends = {e["txn_id"]: e for e in history.of(Kind.SEND)}
    txn_of = {m: e["txn_id"] for e in sends.values() for m in e["msg_ids"]}
    txn_of.update({m: e["txn_id"] for m, e in rows.items()})
    visible = _visible(history, topics)
    why_not = _not_committed(history, sends)
    violations: list[Violation] = []
    for msg_id, row in rows.items():
        seen = visible.get(msg_id, [])
        where = {"msg_id": msg_id, "txn_id": row["txn_id"], "records": [e.where for e in seen]}
        if not seen:
            violations.append(
                Violation(
                    "lost",
                    f"committed msg {msg_id} (txn {row['txn_id']}, {row['topic']}) is not visible",
                    where,
                )
            )
        elif len(seen) > 1:
            violations.append(
                Violation(
                    "duplicate",
                    f"msg {msg_id} (txn {row['txn_id']}) "
                    f"visible {len(seen)} times: {_wheres(seen)}",
                    where,
                )
            )
        for e in seen:
            if e["topic"] != row["topic"]:
                violations.append(
                    Violation(
                        "wrong_topic",
                        f"msg {msg_id} committed for {row['topic']} is visible at {e.where}",
                        where,
                    )
                )
            if e.get("txn_id") and e["txn_id"] != row["txn_id"]:
                violations.append(
                    Violation(
                        "txn_mismatch",
                        f"msg {msg_id} of txn "
                        f"{row['txn_id']} is visible at {e.where} under "
                        f"txn {e['txn_id']}",
                        where,
                    )
                )
    for msg_id, seen in visible.items():
        if msg_id in rows:
            continue
        txn = txn_of.get(msg_id) or seen[0].get("txn_id")
        kind = why_not(msg_id, txn)
        violations.append(
            Violation(
                kind,
                f"msg {msg_id} (txn {txn}) has no committed row but is visible at {_wheres(seen)}",
                {"msg_id": msg_id, "txn_id": txn, "records": [e.where for e in seen]},
            )
        )
    members: dict[str, set[str]] = defaultdict(set)
    for msg_id, row in rows.items():
        members[row["txn_id"]].add(msg_id)
    for txn, msgs in members.items():
        if txn in sends:  # its members on the topics read
            send = sends[txn]
            msgs = msgs | {
                m
                for m, t in zip(send["msg_ids"], send["topics"], strict=False)
                if wanted is None or t in wanted
            }
        shown = sorted(m for m in msgs if visible.get(m))
        if 0 < len(shown) < len(msgs):
            violations.append(
                Violation(
                    "partial_txn",
                    f"txn {txn}: {len(shown)} of "
                    f"{len(msgs)} messages visible (missing "
                    f"{sorted(msgs - set(shown))})",
                    {"txn_id": txn, "visible": shown},
                )
            )
    n_txn = len(members)
    return _done(
        CheckResult.of(
            "exactly_once",
            f"{len(rows)} committed messages in {n_txn} txns, "
            f"{sum(map(len, visible.values()))} records read, {len(violations)} violations",
            violations,
        ),
        echo,
    )


def _down_intervals(history: History) -> dict[str, list[tuple[float, float]]]:
    """Per producer group, the [down, up) periods of its group_state events."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    down_since: dict[str, float] = {}
    for e in history.of(Kind.GROUP_STATE):
        group = e["group"]
        if not e["up"]:
            down_since.setdefault(group, e.mono_s)
        elif group in down_since:
            out[group].append((down_since.pop(group), e.mono_s))
    for group, since in down_since.items():
        out[group].append((since, math.inf))
    return out


def check_liveness(history: History, *, horizon_s: float, echo: bool = True) -> CheckResult:
    """Every UNKNOW transaction is decided (a back-check answered COMMIT or ROLLBACK) within
    ``horizon_s`` of up-time after its send, or after its local transaction ended if that
    came later. Up-time: its producer group is up and no cluster fault is on (with a broker
    paused, cut off or out of disk, Kafka's own transactions and group rebalances wait for
    it to be fenced or back; the horizon measures the product, not the outage)."""
    failed = {e.get("txn_id") for e in history.of(Kind.SEND_FAILED)}
    local_end: dict[str, float] = {}
    for e in history.of(Kind.LOCAL_COMMITTED, Kind.LOCAL_ROLLED_BACK):
        local_end.setdefault(e["txn_id"], e.mono_s)
    decided: dict[str, Event] = {}
    for e in history.of(Kind.CHECK_ANSWERED):
        if e["answer"] in ("COMMIT", "ROLLBACK"):
            decided.setdefault(e["txn_id"], e)
    down = _down_intervals(history)
    cluster_down = cluster_fault_intervals(history)
    violations: list[Violation] = []
    unknow = [
        e
        for e in history.of(Kind.SEND)
        if e["intent"] in _UNKNOW_INTENTS and e["txn_id"] not in failed
    ]
    for send in unknow:
        txn = send["txn_id"]
        start = max(send.mono_s, local_end.get(txn, send.mono_s))
        deadline = up_deadline(start, horizon_s, down.get(send["group"], []) + cluster_down)
        where = {"txn_id": txn, "group": send["group"], "proc": send.proc}
        answer = decided.get(txn)
        if answer is None:
            violations.append(
                Violation(
                    "undecided",
                    f"txn {txn} ({send['intent']}, group "
                    f"{send['group']}) was never answered COMMIT or "
                    "ROLLBACK by a back-check",
                    where,
                )
            )
        elif answer.mono_s > deadline:
            violations.append(
                Violation(
                    "late_decision",
                    f"txn {txn} (group {send['group']}) "
                    f"decided {answer.mono_s - start:.1f} s after it could "
                    f"be, {answer.mono_s - deadline:.1f} s past the "
                    f"{horizon_s:g} s horizon",
                    where,
                )
            )
    return _done(
        CheckResult.of(
            "liveness",
            f"{len(unknow)} UNKNOW txns, {len(unknow) - len(violations)} decided "
            f"within {horizon_s:g} s",
            violations,
        ),
        echo,
    )


def _rows(value: str | Iterable[Any] | None, parse: Any) -> list[dict[str, Any]]:
    """CLI text, or objects (PendingTxn, DiscardedTxn, dicts) as dicts with a 'txn id'."""
    if value is None:
        return []
    if isinstance(value, str):
        return parse(value)
    out = []
    for item in value:
        d = dict(item) if isinstance(item, Mapping) else dict(vars(item))
        for name in ("txn_id", "real_topic", "producer_group"):  # as the CLI's headers
            d.setdefault(name.replace("_", " "), d.get(name))
        out.append(d)
    return out


def check_settled(
    pending: str | Iterable[Any] | None, discarded: str | Iterable[Any] | None, *, echo: bool = True
) -> CheckResult:
    """Nothing is pending or discarded once the run settles: ``pending``/``discarded`` are
    the output of ``rmq-semantics txn pending|discarded`` or what list_pending/
    list_discarded returned."""
    violations: list[Violation] = []
    try:
        pend = _rows(pending, parse_pending)
        disc = _rows(discarded, parse_discarded)
    except ToolOutputError as exc:
        return _done(
            CheckResult.of(
                "settled",
                "unreadable txn pending/discarded output",
                [Violation("unparseable", str(exc))],
            ),
            echo,
        )
    for row in pend:
        violations.append(
            Violation(
                "pending",
                f"txn {row['txn id']} still pending "
                f"({row.get('real topic')}, group "
                f"{row.get('producer group')})",
                {"txn_id": row["txn id"]},
            )
        )
    for row in disc:
        violations.append(
            Violation(
                "discarded",
                f"txn {row['txn id']} discarded ({row.get('reason')})",
                {"txn_id": row["txn id"]},
            )
        )
    return _done(
        CheckResult.of("settled", f"{len(pend)} pending, {len(disc)} discarded", violations), echo
    )


def check_kafka_transactions(
    find_hanging: Mapping[Any, str],
    txn_list: str,
    *,
    txn_id_prefix: str | None = None,
    topic_prefixes: Sequence[str] | None = None,
    echo: bool = True,
) -> CheckResult:
    """Kafka's TransactionsCommand: ``find-hanging`` (text per broker) finds nothing, and
    ``list`` shows no transaction in an open state (OPEN_STATES) once the coordinators
    stopped; ``txn_id_prefix`` limits ``list`` to those transactional ids, ``topic_prefixes``
    ``find-hanging`` to the topics named so (a cluster other runs share)."""
    violations: list[Violation] = []
    hanging = listed = 0
    try:
        for broker, text in find_hanging.items():
            for h in parse_find_hanging(text):
                if topic_prefixes is not None and not h.topic.startswith(tuple(topic_prefixes)):
                    continue
                hanging += 1
                violations.append(
                    Violation(
                        "hanging",
                        f"broker {broker}: producer "
                        f"{h.producer_id} epoch {h.producer_epoch} hangs "
                        f"at {h.where} for {h.duration_min} min",
                        {"broker": broker, "where": h.where},
                    )
                )
        for t in parse_txn_list(txn_list):
            if txn_id_prefix is not None and not t.transactional_id.startswith(txn_id_prefix):
                continue
            listed += 1
            if t.state in OPEN_STATES:
                violations.append(
                    Violation(
                        "open_txn",
                        f"transactional id "
                        f"{t.transactional_id} is {t.state} (coordinator "
                        f"{t.coordinator}, producer {t.producer_id})",
                        {"transactional_id": t.transactional_id},
                    )
                )
    except ToolOutputError as exc:
        violations.append(Violation("unparseable", str(exc)))
    return _done(
        CheckResult.of(
            "kafka_transactions",
            f"find-hanging on {len(find_hanging)} brokers: {hanging} hanging;"
            f" list: {listed} transactional ids",
            violations,
        ),
        echo,
    )


def check_coordinator_exits(
    history: History, *, role: str = "coordinator", echo: bool = True
) -> CheckResult:
    """No coordinator exited unless the nemesis killed it or the harness stopped it (and
    then with code 0)."""
    exits = [e for e in history.of(Kind.EXIT) if e["role"] == role]
    violations = []
    for e in exits:
        if e["killed_by_nemesis"]:
            continue
        if e.get("stopped") and e["code"] == 0:
            continue
        why = "stopped with" if e.get("stopped") else "exited on its own with"
        violations.append(
            Violation(
                "unexpected_exit",
                f"{role} {e['process']} {why} code {e['code']} at {e.wall_ms} ms",
                {"process": e["process"], "code": e["code"]},
            )
        )
    killed = sum(1 for e in exits if e["killed_by_nemesis"])
    return _done(
        CheckResult.of(
            "coordinator_exits", f"{len(exits)} {role} exits, {killed} by the nemesis", violations
        ),
        echo,
    )


def check_worker_exits(history: History) -> CheckResult:
    """No producer or consumer process exited on its own (as for coordinators)."""
    parts = [check_coordinator_exits(history, role=r, echo=False) for r in ("producer", "consumer")]
    exits = [e for e in history.of(Kind.EXIT) if e["role"] in ("producer", "consumer")]
    killed = sum(1 for e in exits if e["killed_by_nemesis"])
    return CheckResult.of(
        "worker_exits",
        f"{len(exits)} worker exits, {killed} by the nemesis",
        [v for p in parts for v in p.violations],
    ).print()


def read_topics(history: History) -> list[str]:
    """The promoted topics of a run: those read at the end or holding committed rows."""
    return sorted(
        {e["topic"] for e in history.of(Kind.FINAL_READ)}
        | {e["topic"] for e in history.of(Kind.COMMITTED_ROW)}
    )


def check_spark(
    history: History,
    rows: Iterable[Mapping[str, Any]] | None = None,
    *,
    topics: Iterable[str] | None = None,
    echo: bool = True,
) -> CheckResult:
    """The Spark job's output (``rows`` with a ``msg_id``, else the spark_row events) is the
    committed set of ``topics`` (default: all) and the timer messages delivered there (the
    final read's), each row once."""
    wanted = None if topics is None else set(topics)
    expected = {
        e["msg_id"]
        for e in history.of(Kind.COMMITTED_ROW)
        if wanted is None or e["topic"] in wanted
    }
    timers = timer_mids(history)
    expected |= {
        e["msg_id"]
        for e in history.of(Kind.FINAL_READ)
        if e.get("msg_id") in timers and (wanted is None or e["topic"] in wanted)
    }
    got = Counter(
        r["msg_id"]
        for r in (rows if rows is not None else (e.data for e in history.of(Kind.SPARK_ROW)))
    )
    violations = [
        Violation("duplicate", f"msg {m} is {n} rows of the Spark output", {"msg_id": m})
        for m, n in got.items()
        if n > 1
    ]
    violations += [
        Violation("missing", f"committed msg {m} is not in the Spark output", {"msg_id": m})
        for m in sorted(expected - got.keys())
    ]
    violations += [
        Violation(
            "extra",
            f"msg {m} in the Spark output has no committed row (nor a timer delivery)",
            {"msg_id": m},
        )
        for m in sorted(got.keys() - expected)
    ]
    return _done(
        CheckResult.of(
            "spark", f"{sum(got.values())} rows for {len(expected)} committed messages", violations
        ),
        echo,
    )


def _observed(history: History) -> Counter[str]:
    counts: Counter[str] = Counter()
    for kind in OBSERVATIONS:
        counts[kind.value] = sum(int(e.get("count", 1)) for e in history.of(kind))
    for e in history.of(Kind.FAULT):
        counts[f"fault:{e['fault']}"] += 1
    return counts


def check_faults_took_effect(
    history: History, minimums: Mapping[str, int], *, echo: bool = True
) -> CheckResult:
    """Each count is at or above its minimum: keys are the observations (leader_change,
    lock_takeover, rebalance, fenced_producer) or ``fault:<kind>`` for injected faults."""
    counts = _observed(history)
    violations = [
        Violation(
            "too_few",
            f"{name}: {counts[name]} < minimum {least}",
            {"name": name, "count": counts[name], "minimum": least},
        )
        for name, least in minimums.items()
        if counts[name] < least
    ]
    shown = ", ".join(f"{k.value}={counts[k.value]}" for k in OBSERVATIONS)
    return _done(CheckResult.of("faults_took_effect", shown, violations), echo)


def run_all(
    history: History,
    *,
    horizon_s: float,
    minimums: Mapping[str, int],
    pending: str | Iterable[Any] | None = None,
    discarded: str | Iterable[Any] | None = None,
    find_hanging: Mapping[Any, str] | None = None,
    txn_list: str | None = None,
    txn_id_prefix: str | None = None,
    topic_prefixes: Sequence[str] | None = None,
    spark_rows: Iterable[Mapping[str, Any]] | None = None,
    topics: Iterable[str] | None = None,
    dead_letter_expected: Callable[[str], bool] | None = None,
    push_max_reconsume_times: int | None = None,
    echo: bool = True,
) -> list[CheckResult]:
    """Every checker whose input is there: the history ones always (``timers`` when timer
    messages were sent, ``simple`` when a SimpleConsumer group subscribed); ``settled`` with
    pending/discarded; ``kafka_transactions`` with find_hanging and txn_list; ``spark``
    with spark_rows or spark_row events. ``topic_prefixes`` and ``dead_letter_expected``
    go to check_kafka_transactions and check_push, ``push_max_reconsume_times`` to
    check_push_fifo."""
    topics = None if topics is None else list(topics)
    results = [
        check_history(history, echo=echo),
        check_exactly_once(history, topics=topics, echo=echo),
        check_liveness(history, horizon_s=horizon_s, echo=echo),
    ]
    if pending is not None or discarded is not None:
        results.append(check_settled(pending, discarded, echo=echo))
    if find_hanging is not None and txn_list is not None:
        results.append(
            check_kafka_transactions(
                find_hanging,
                txn_list,
                txn_id_prefix=txn_id_prefix,
                topic_prefixes=topic_prefixes,
                echo=echo,
            )
        )
    if history.of(Kind.TIMER_SEND):
        results.append(check_timers(history, horizon_s=horizon_s, echo=echo))
    results.append(check_coordinator_exits(history, echo=echo))
    results.append(check_orderly(history, echo=echo))
    results.append(check_locks(history, echo=echo))
    results.append(check_push(history, dead_letter_expected=dead_letter_expected, echo=echo))
    results.append(
        check_push_fifo(history, max_reconsume_times=push_max_reconsume_times, echo=echo)
    )
    if any(e["consumer"] == "simple" for e in history.of(Kind.SUBSCRIBE)):
        results.append(check_simple(history, echo=echo))
    if spark_rows is not None or history.of(Kind.SPARK_ROW):
        results.append(check_spark(history, spark_rows, topics=topics, echo=echo))
    results.append(check_faults_took_effect(history, minimums, echo=echo))
    return results
