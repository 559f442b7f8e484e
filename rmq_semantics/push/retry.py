"""Delay levels, retry copies and dead letters of the concurrent consumer.

A message the listener wants later is copied to ``<prefix>_retry_<group>_<level>`` with the
retry headers (how often it was reconsumed, where it came from, its first failure and when
it is due); past ``max_reconsume_times`` it goes to ``<prefix>_dlq_<group>`` instead. Every
retry record is untrusted input: :func:`read_retry` repairs what is forged or garbage, and
says why, so the consumer logs it and goes on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rmq_semantics.errors import ConfigError
from rmq_semantics.push.api import PushMessage
from rmq_semantics.records.dead_letter import dlq_headers, retry_headers
from rmq_semantics.records.headers import H

__all__ = [
    "DEFAULT_DELAY_LEVELS",
    "OutRecord",
    "RetryRead",
    "born_of",
    "check_delay_levels",
    "level_of",
    "out_record",
    "read_retry",
]

log = logging.getLogger(__name__)

#: RocketMQ's ``messageDelayLevel``: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
DEFAULT_DELAY_LEVELS: tuple[float, ...] = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
# A due time this far past what its level allows is forged: deliver it now.
DUE_SLACK_MS = 5000


def check_delay_levels(levels: Sequence[float]) -> tuple[float, ...]:
    """``levels`` as a tuple of seconds, or one ConfigError line."""
    try:
        out = tuple(float(s) for s in levels)
    except (TypeError, ValueError):
        out = ()
    if not out or any(not math.isfinite(s) or s < 0 for s in out):
        raise ConfigError(
            f"delay_levels must be a non-empty sequence of seconds >= 0 (level 1 "
            f"first), got {levels!r}"
        )
    return out


def level_of(reconsume_times: int, asked: int, levels: int) -> int:
    """The delay level of reconsume number ``reconsume_times`` (1 = first retry): the
    context's ``asked`` level if > 0, else ``reconsume_times``; capped at the last level."""
    return min(asked if asked > 0 else reconsume_times, levels)


@dataclass(frozen=True)
class OutRecord:
    """A retry copy or a dead letter, written in the transaction that commits its source."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int
    source: str  # topic[partition]@offset it was read at, for log lines

    @property
    def dead(self) -> bool:
        return H.DLQ_ORIGINAL_TOPIC in (k for k, _ in self.headers)


def out_record(
    msg: PushMessage,
    *,
    now_ms: int,
    topic: str,
    retry: bool,
    due_ms: int,
    error: BaseException | None,
    first_failure_ms: int | None,
    source: str,
) -> OutRecord:
    """The copy of failed ``msg`` for ``topic``: a retry copy due at ``due_ms``, or (not
    ``retry``) a dead letter; ``source`` is where it was read, for log lines."""
    first = first_failure_ms if first_failure_ms is not None else now_ms
    if retry:
        headers = retry_headers(
            msg.headers,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            reconsume_times=msg.reconsume_times + 1,
            first_failure_ms=first,
            due_ms=due_ms,
        )
        return OutRecord(topic, msg.key, msg.value, _with_born(headers, msg), now_ms, source)
    headers = dlq_headers(
        msg.headers,
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        reconsume_times=msg.reconsume_times,
        error=error,
        first_failure_ms=first,
        last_failure_ms=now_ms,
    )
    return OutRecord(topic, msg.key, msg.value, _with_born(headers, msg), now_ms, source)


def _with_born(headers: list[tuple[str, bytes]], msg: PushMessage) -> list[tuple[str, bytes]]:
    """A copy is written at now (retention counts from there, so a message born long ago is
    not deleted at once); its birth time travels in ``rmq.born_ts``."""
    return [
        *(h for h in headers if h[0] != H.BORN_TS),
        (H.BORN_TS, str(msg.born_timestamp).encode()),
    ]


def born_of(headers: list[tuple[str, bytes]] | tuple, record_ts: int) -> int:
    """The birth time a copy carries, else (absent or garbage) its record timestamp."""
    for name, value in headers:
        if name == H.BORN_TS:
            try:
                born = int(value.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                return record_ts
            return born if 0 <= born < 1 << 62 else record_ts
    return record_ts


@dataclass(frozen=True)
class RetryRead:
    """What a retry record says, repaired: ``problems`` lists what was forged or garbage."""

    reconsume_times: int
    topic: str
    partition: int
    offset: int
    first_failure_ms: int | None
    due_ms: int
    problems: tuple[str, ...]


def _int_header(
    values: dict[str, bytes], name: str, low: int, high: int, problems: list[str]
) -> int | None:
    raw = values.get(name)
    if raw is None:
        problems.append(f"{name} missing")
        return None
    try:
        value = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        problems.append(f"{name} not an integer")
        return None
    if not low <= value <= high:
        problems.append(f"{name}={value} out of range")
        return None
    return value


def read_retry(
    headers: list[tuple[str, bytes | None]] | None,
    *,
    where: tuple[str, int, int],
    level_delay_ms: int,
    now_ms: int,
    max_reconsume_times: int,
) -> RetryRead:
    """The retry headers of a record read at ``where`` (topic, partition, offset) of a retry
    topic whose level waits ``level_delay_ms``. Garbage is repaired so the message can
    neither loop forever nor hold its partition: a bad count counts as the last reconsume
    (a failure sends it to the DLQ), a bad or far-future due time as due now, a bad origin
    as the retry record itself."""
    values = {k: (v or b"") for k, v in headers or ()}
    problems: list[str] = []
    times = _int_header(values, H.RECONSUME_TIMES, 1, 1 << 31, problems)
    if times is None:
        times = max(max_reconsume_times, 1)
    due = _int_header(values, H.RETRY_DUE_TS, 0, 1 << 62, problems)
    if due is not None and due > now_ms + level_delay_ms + DUE_SLACK_MS:
        problems.append(f"{H.RETRY_DUE_TS}={due} beyond its level's delay")
        due = None
    first = _int_header(values, H.FIRST_FAILURE_TS, 0, 1 << 62, problems)
    partition = _int_header(values, H.ORIGINAL_PARTITION, 0, 1 << 31, problems)
    offset = _int_header(values, H.ORIGINAL_OFFSET, 0, 1 << 62, problems)
    try:
        topic = values[H.ORIGINAL_TOPIC].decode("utf-8") if H.ORIGINAL_TOPIC in values else ""
    except UnicodeDecodeError:
        topic = ""
    if not topic or partition is None or offset is None:
        if topic == "":
            problems.append(f"{H.ORIGINAL_TOPIC} missing or not UTF-8")
        topic, partition, offset = where
    return RetryRead(
        times, topic, partition, offset, first, now_ms if due is None else due, tuple(problems)
    )
