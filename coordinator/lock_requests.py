"""Answering one batch of lock requests: each record decoded and checked (malformed, invalid,
set aside as poison, unauthenticated under tenant isolation, stale), each queue decided
against its partition's lock table, and one reply per request. No Kafka I/O:
:class:`coordinator.lock_service.LockService` writes what :func:`answer` returns (state
changes, replies, offsets) in one transaction, and keeps the staged tables only once it
committed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka

from coordinator.lock import (
    LeaseCeiling,
    LockTable,
    RequestPoison,
    lock_request_problem,
    stale_lock_request,
)
from coordinator.lock_auth import UNAUTHENTICATED, LockGuard
from rmq_semantics.consumed import offset_of, partition_of
from rmq_semantics.errors import ConfigError, MalformedRecordError
from rmq_semantics.records.codec import decode_as
from rmq_semantics.records.locks import LockReply, LockRequest, QueueResult, RequestKind

__all__ = ["Answered", "Partitions", "answer"]

log = logging.getLogger(__name__)


@dataclass
class Answered:
    """What one batch changes: per request partition the staged table (an overlay of the
    committed one) and the last offset read, and the replies by reply partition."""

    staged: dict[int, LockTable] = field(default_factory=dict)
    replies: list[tuple[int, LockReply]] = field(default_factory=list)
    last_offsets: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Partitions:
    """The co-partitioned request topic's and the reply topic's partition counts."""

    requests: int
    replies: int


def answer(
    batch: Sequence[confluent_kafka.Message],
    tables: dict[int, LockTable],
    partitions: Partitions,
    lease: LeaseCeiling,
    poison: RequestPoison,
    now_ms: int,
    count: Callable[[str], None],
    guard: LockGuard | None = None,
) -> Answered:
    """Decide ``batch`` (records of the request topic) against ``tables``, which get an empty
    table for a partition seen first; ``count(event)`` counts each outcome. Under tenant
    isolation (``guard``) a request its consumer group did not sign changes nothing: each
    of its queues is refused as ``unauthenticated``."""
    out = Answered()
    for msg in batch:
        p = partition_of(msg)
        out.last_offsets[p] = offset_of(msg)
        table = out.staged.get(p)
        if table is None:
            table = out.staged[p] = tables.setdefault(p, LockTable()).overlay()
        if (p, msg.offset()) in poison:
            continue  # set aside: counted and logged when it was
        request = _request(msg, count)
        if request is None:
            continue
        count("requests")
        if guard is not None and _unauthenticated(msg, request, guard):
            count(UNAUTHENTICATED)
            results = tuple(QueueResult.refused(ref, UNAUTHENTICATED) for ref in request.queues)
        elif _stale(msg, request, lease(request), now_ms):
            count("stale")
            results = tuple(QueueResult.refused(ref, "stale") for ref in request.queues)
        else:
            results = tuple(
                _decide(table, p, partitions.requests, request, lease, now_ms, ref, count)
                for ref in request.queues
            )
        if 0 <= request.reply_partition < partitions.replies:
            reply = LockReply(request.request_id, request.client_id, request.kind, results)
            out.replies.append((request.reply_partition, reply))
        else:
            log.warning(
                "%s[%d]@%d: reply partition %d does not exist; not answered",
                msg.topic(),
                p,
                msg.offset(),
                request.reply_partition,
            )
    return out


def _request(msg: confluent_kafka.Message, count: Callable[[str], None]) -> LockRequest | None:
    """The record's request, or None when it is malformed or invalid (counted, logged)."""
    try:
        request = decode_as(LockRequest, msg.value())
    except MalformedRecordError as exc:
        count("malformed")
        log.warning("%s[%d]@%d skipped: %s", msg.topic(), msg.partition(), msg.offset(), exc)
        return None
    if (problem := lock_request_problem(request)) is not None:
        count("invalid_request")
        log.warning(
            "%s[%d]@%d lock request %.64s set aside, not answered: %s",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            request.request_id,
            problem,
        )
        return None
    return request


def _unauthenticated(msg: confluent_kafka.Message, request: LockRequest, guard: LockGuard) -> bool:
    """Whether ``request`` lacks its consumer group's valid MAC (logged if so)."""
    refused = guard.refusal(msg.topic() or "", partition_of(msg), request)
    if refused is None:
        return False
    log.warning(
        "%s[%d]@%d %s request %.64s of %s refused as unauthenticated: %s",
        msg.topic(),
        msg.partition(),
        msg.offset(),
        request.kind.value,
        request.request_id,
        request.client_id,
        refused,
    )
    return True


def _appended_ms(msg: confluent_kafka.Message) -> int | None:
    """The broker's append time of ``msg`` if its topic records one (else None)."""
    kind, ts = msg.timestamp()
    return ts if kind == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME else None


def _stale(msg: confluent_kafka.Message, request: LockRequest, lease_ms: int, now_ms: int) -> bool:
    """Whether to refuse ``request`` as older than its client waits (logged if so)."""
    age = stale_lock_request(request, lease_ms, now_ms, _appended_ms(msg))
    if age is None:
        return False
    log.info(
        "%s[%d]@%d: lock request %s of %s is %d ms old (its client waits %d ms); refused as stale",
        msg.topic(),
        msg.partition(),
        msg.offset(),
        request.request_id,
        request.client_id,
        age,
        request.wait_ms,
    )
    return True


def _decide(
    table: LockTable,
    partition: int,
    request_partitions: int,
    request: LockRequest,
    lease: LeaseCeiling,
    now: int,
    ref: Any,
    count: Callable[[str], None],
) -> QueueResult:
    key = ref.key(request.group)
    if key.request_partition(request_partitions) != partition:
        count("misrouted")
        return QueueResult.refused(ref, "misrouted")
    try:
        if request.kind is RequestKind.LOCK:
            decision = table.lock(key, request.client_id, lease(request), now)
        else:
            decision = table.unlock(key, request.client_id, now, ref.epoch)
    except ConfigError as exc:
        count("invalid")
        log.warning(
            "lock request %s from %s for %s refused: %s",
            request.request_id,
            request.client_id,
            key,
            exc,
        )
        return QueueResult.refused(ref, "invalid")
    count(decision.reason)
    if decision.reason == "taken_over":
        log.info(
            "%s: lapsed lease taken over by %s with epoch %d",
            key,
            request.client_id,
            decision.epoch,
        )
    return decision.result()
