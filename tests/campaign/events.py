"""Typed constructors of history events (the format is documented in history.py).

Each returns a :class:`~tests.campaign.history.Draft`; ``Recorder.emit(draft)`` stamps and
writes it, ``history.at(draft, mono_s)`` plants it in a test history. Optional arguments
left ``None`` are not written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tests.campaign.history import Draft, Intent, Kind

SIMPLE_EVENTS = ("received", "ack_ok", "ack_refused", "changed", "change_refused")

__all__ = [
    "SIMPLE_EVENTS",
    "batch",
    "check_answered",
    "committed_row",
    "consumed",
    "dlq",
    "exit_",
    "fault",
    "final_read",
    "group_state",
    "local_committed",
    "local_rolled_back",
    "lock_grant",
    "lock_release",
    "note",
    "observed",
    "orderly_event",
    "push_retry",
    "run",
    "send",
    "send_failed",
    "sent",
    "simple",
    "spark_row",
    "status",
    "subscribe",
    "timer_recalled",
    "timer_send",
    "timer_sent",
    "topic_created",
    "worker",
]


def send(
    txn_id: str,
    group: str,
    topics: Sequence[str],
    msg_ids: Sequence[str],
    intent: Intent | str,
    *,
    keys: Sequence[str | None] | None = None,
    bodies: Sequence[str] | None = None,
    api: str | None = None,
) -> Draft:
    """A transactional send: one entry per message in ``topics``/``msg_ids``/``keys``."""
    if len(topics) != len(msg_ids) or (keys is not None and len(keys) != len(msg_ids)):
        raise ValueError("topics, msg_ids and keys need one entry per message")
    return Draft(
        Kind.SEND,
        {
            "txn_id": txn_id,
            "group": group,
            "topics": list(topics),
            "msg_ids": list(msg_ids),
            "intent": Intent(intent).value,
            "keys": None if keys is None else list(keys),
            "bodies": None if bodies is None else list(bodies),
            "api": api,
        },
    )


def send_failed(
    group: str, error: str, *, txn_id: str | None = None, msg_ids: Sequence[str] | None = None
) -> Draft:
    return Draft(
        Kind.SEND_FAILED,
        {
            "group": group,
            "error": error,
            "txn_id": txn_id,
            "msg_ids": None if msg_ids is None else list(msg_ids),
        },
    )


def timer_send(
    msg_id: str,
    group: str,
    topic: str,
    how: str,
    delay_ms: int,
    *,
    recall: bool,
    wall_before_ms: int,
    key: str | None = None,
    level: int | None = None,
    deliver_at_ms: int | None = None,
) -> Draft:
    """A timer message about to be sent: ``how`` is "at" (``deliver_at_ms`` given),
    "after" (``deliver_after_ms`` = ``delay_ms``) or "level" (``delay_time_level``)."""
    return Draft(
        Kind.TIMER_SEND,
        {
            "msg_id": msg_id,
            "group": group,
            "topic": topic,
            "key": key,
            "how": how,
            "delay_ms": delay_ms,
            "level": level,
            "deliver_at_ms": deliver_at_ms,
            "recall": recall,
            "wall_before_ms": wall_before_ms,
        },
    )


def timer_sent(
    msg_id: str,
    ok: bool,
    *,
    message_id: str | None = None,
    deliver_lo_ms: int | None = None,
    deliver_hi_ms: int | None = None,
    clock_jump: bool | None = None,
    error: str | None = None,
) -> Draft:
    return Draft(
        Kind.TIMER_SENT,
        {
            "msg_id": msg_id,
            "ok": ok,
            "message_id": message_id,
            "deliver_lo_ms": deliver_lo_ms,
            "deliver_hi_ms": deliver_hi_ms,
            "clock_jump": clock_jump,
            "error": error,
        },
    )


def timer_recalled(msg_id: str, ok: bool, message_id: str, *, error: str | None = None) -> Draft:
    return Draft(
        Kind.TIMER_RECALLED,
        {"msg_id": msg_id, "ok": ok, "message_id": message_id, "error": error},
    )


def local_committed(
    txn_id: str, group: str, *, db: str | None = None, row: str | int | None = None
) -> Draft:
    return Draft(Kind.LOCAL_COMMITTED, {"txn_id": txn_id, "group": group, "db": db, "row": row})


def local_rolled_back(
    txn_id: str, group: str, *, db: str | None = None, row: str | int | None = None
) -> Draft:
    return Draft(Kind.LOCAL_ROLLED_BACK, {"txn_id": txn_id, "group": group, "db": db, "row": row})


def check_answered(txn_id: str, group: str, answer: str, *, checks: int | None = None) -> Draft:
    """A back-check answered by the producer group (``COMMIT``, ``ROLLBACK`` or ``UNKNOW``)."""
    if answer not in ("COMMIT", "ROLLBACK", "UNKNOW"):
        raise ValueError(f"answer must be COMMIT, ROLLBACK or UNKNOW, got {answer!r}")
    return Draft(
        Kind.CHECK_ANSWERED, {"txn_id": txn_id, "group": group, "answer": answer, "checks": checks}
    )


def group_state(group: str, up: bool) -> Draft:
    return Draft(Kind.GROUP_STATE, {"group": group, "up": up})


def committed_row(
    txn_id: str, msg_id: str, topic: str, *, key: str | None = None, db: str | None = None
) -> Draft:
    """One message row found committed in a local database at the end (the ground truth)."""
    return Draft(
        Kind.COMMITTED_ROW,
        {"txn_id": txn_id, "msg_id": msg_id, "topic": topic, "key": key, "db": db},
    )


def subscribe(
    consumer: str,
    group: str,
    instance: str,
    topics: Sequence[str],
    *,
    mode: str | None = None,
    pattern: str | None = None,
    settings: Mapping[str, object] | None = None,
) -> Draft:
    """``pattern``: a regex subscription (librdkafka's ``^...``); the group's topics are
    then every final-read topic it matches, besides ``topics``. ``settings``: what a
    checker needs of the consumer's (the SimpleConsumer's attempts and intervals)."""
    if mode not in (None, "partition", "key"):
        raise ValueError(f"mode must be 'partition' or 'key', got {mode!r}")
    return Draft(
        Kind.SUBSCRIBE,
        {
            "consumer": consumer,
            "group": group,
            "instance": instance,
            "topics": list(topics),
            "mode": mode,
            "pattern": pattern,
            "settings": None if settings is None else dict(settings),
        },
    )


def consumed(
    consumer: str,
    group: str,
    instance: str,
    topic: str,
    partition: int,
    offset: int,
    msg_id: str,
    *,
    key: str | None = None,
    result: str | None = None,
) -> Draft:
    return Draft(
        Kind.CONSUMED,
        {
            "consumer": consumer,
            "group": group,
            "instance": instance,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "msg_id": msg_id,
            "key": key,
            "result": result,
        },
    )


def simple(
    event: str,
    group: str,
    instance: str,
    topic: str,
    partition: int,
    offset: int,
    msg_id: str,
    *,
    message_group: str | None = None,
    attempt: int | None = None,
) -> Draft:
    """One SimpleConsumer call on one message (history.py lists the events)."""
    if event not in SIMPLE_EVENTS:
        raise ValueError(f"a simple event is one of {SIMPLE_EVENTS}, got {event!r}")
    return Draft(
        Kind.SIMPLE,
        {
            "event": event,
            "group": group,
            "instance": instance,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "msg_id": msg_id,
            "message_group": message_group,
            "attempt": attempt,
        },
    )


def batch(
    queue: str,
    instance: str,
    epoch: int,
    *,
    lease_granted_ms: int | None,
    lease_valid_until_ms: int,
    start_ms: int,
    end_ms: int,
    offsets: Sequence[int],
    committed: bool,
    commit_ms: int | None = None,
    commit_sent_ms: int | None = None,
) -> Draft:
    """One orderly batch on ``queue`` (``group/topic/partition``) under lock ``epoch``;
    ``commit_sent_ms`` when the consumer sent its commit, ``commit_ms`` when it landed."""
    if committed and commit_ms is None:
        raise ValueError("a committed batch needs commit_ms")
    return Draft(
        Kind.BATCH,
        {
            "queue": queue,
            "instance": instance,
            "epoch": epoch,
            "lease_granted_ms": lease_granted_ms,
            "lease_valid_until_ms": lease_valid_until_ms,
            "start_ms": start_ms,
            "end_ms": end_ms,
            "offsets": list(offsets),
            "committed": committed,
            "commit_ms": commit_ms,
            "commit_sent_ms": commit_sent_ms,
        },
    )


def lock_grant(
    queue: str, consumer: str, epoch: int, granted_ms: int, valid_until_ms: int
) -> Draft:
    return Draft(
        Kind.LOCK_GRANT,
        {
            "queue": queue,
            "consumer": consumer,
            "epoch": epoch,
            "granted_ms": granted_ms,
            "valid_until_ms": valid_until_ms,
        },
    )


def lock_release(queue: str, consumer: str, epoch: int, released_ms: int) -> Draft:
    return Draft(
        Kind.LOCK_RELEASE,
        {"queue": queue, "consumer": consumer, "epoch": epoch, "released_ms": released_ms},
    )


def push_retry(
    group: str,
    msg_id: str,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    reconsume_times: int | None = None,
    retry_topic: str | None = None,
) -> Draft:
    return Draft(
        Kind.PUSH_RETRY,
        {
            "group": group,
            "msg_id": msg_id,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "reconsume_times": reconsume_times,
            "retry_topic": retry_topic,
        },
    )


def dlq(
    consumer: str,
    group: str,
    msg_id: str,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    reason: str | None = None,
) -> Draft:
    return Draft(
        Kind.DLQ,
        {
            "consumer": consumer,
            "group": group,
            "msg_id": msg_id,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "reason": reason,
        },
    )


def final_read(
    topic: str,
    partition: int,
    offset: int,
    *,
    msg_id: str | None = None,
    txn_id: str | None = None,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Draft:
    """One record of the final read_committed read by Apache Kafka's Java client."""
    return Draft(
        Kind.FINAL_READ,
        {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "msg_id": msg_id,
            "txn_id": txn_id,
            "key": key,
            "headers": dict(headers or {}),
        },
    )


def spark_row(
    msg_id: str,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> Draft:
    return Draft(
        Kind.SPARK_ROW, {"msg_id": msg_id, "topic": topic, "partition": partition, "offset": offset}
    )


def fault(
    fault_kind: str,
    target: str,
    start_ms: int,
    *,
    end_ms: int | None = None,
    seed: int | None = None,
    detail: str | None = None,
) -> Draft:
    return Draft(
        Kind.FAULT,
        {
            "fault": fault_kind,
            "target": target,
            "start_ms": start_ms,
            "end_ms": end_ms,
            "seed": seed,
            "detail": detail,
        },
    )


def exit_(
    role: str, process: str, code: int | None, *, killed_by_nemesis: bool, stopped: bool = False
) -> Draft:
    """A process ended (``code`` None: killed by a signal without a known code)."""
    return Draft(
        Kind.EXIT,
        {
            "role": role,
            "process": process,
            "code": -1 if code is None else code,
            "killed_by_nemesis": killed_by_nemesis,
            "stopped": stopped,
        },
    )


def observed(kind: Kind | str, *, count: int = 1, detail: str | None = None) -> Draft:
    """A cluster observation: leader_change, lock_takeover, rebalance or fenced_producer."""
    kind = Kind(kind)
    if kind not in (Kind.LEADER_CHANGE, Kind.LOCK_TAKEOVER, Kind.REBALANCE, Kind.FENCED_PRODUCER):
        raise ValueError(f"{kind.value} is not a cluster observation")
    return Draft(kind, {"count": count, "detail": detail})


def run(
    phase: str, *, seed: int | None = None, params: Mapping[str, object] | None = None
) -> Draft:
    return Draft(
        Kind.RUN, {"phase": phase, "seed": seed, "params": None if params is None else dict(params)}
    )


# -- what the workload records besides (diagnostics) ----------------------------------------
def worker(
    state: str, *, role: str | None = None, group: str | None = None, api: str | None = None
) -> Draft:
    """A worker process's life: ``start``, ``ready``, ``drained`` or ``stopped``."""
    if state not in ("start", "ready", "drained", "stopped"):
        raise ValueError(f"state must be start, ready, drained or stopped, got {state!r}")
    return Draft(Kind.WORKER, {"state": state, "role": role, "group": group, "api": api})


def topic_created(topic: str, *, partitions: int | None = None) -> Draft:
    return Draft(Kind.TOPIC_CREATED, {"topic": topic, "partitions": partitions})


def sent(txn_id: str, group: str, state: str, *, half: str | None = None) -> Draft:
    """What a transactional send returned: the local transaction's state."""
    return Draft(Kind.SENT, {"txn_id": txn_id, "group": group, "state": state, "half": half})


def orderly_event(event: str, instance: str, group: str, **fields: object) -> Draft:
    """One OrderlyConsumer protocol event (its log record's ``rmq_event`` and fields)."""
    clash = {"event", "instance", "group"} & set(fields)
    if clash:
        raise ValueError(f"orderly_event fields may not repeat {sorted(clash)}")
    return Draft(
        Kind.ORDERLY_EVENT, {"event": event, "instance": instance, "group": group, **fields}
    )


def status(
    instance: str,
    *,
    queues: Sequence[Mapping[str, object]] | None = None,
    counts: Mapping[str, object] | None = None,
) -> Draft:
    return Draft(
        Kind.STATUS,
        {
            "instance": instance,
            "queues": None if queues is None else [dict(q) for q in queues],
            "counts": None if counts is None else dict(counts),
        },
    )


def note(what: str, **detail: object) -> Draft:
    """A remark of the harness (a phase, a retry, what was still missing)."""
    return Draft(Kind.NOTE, {"what": what, **detail})
