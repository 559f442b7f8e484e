"""The one builder of dead-letter and retry headers, shared by the orderly and the concurrent
consumer: a dead letter keeps the message's own headers (minus our retry bookkeeping) and
gains the ``rmq.dlq.*`` family (DESIGN.md, records/headers.py)."""

from __future__ import annotations

from collections.abc import Iterable

from rmq_semantics.records.headers import DLQ_HEADERS, RETRY_HEADERS, H

__all__ = ["dlq_headers", "retry_headers", "without"]

Headers = list[tuple[str, bytes]]
_REPLACED = frozenset((*DLQ_HEADERS, *RETRY_HEADERS))
# An exception message longer than this is cut: a header is no place for a traceback.
MAX_EXCEPTION_MESSAGE = 1000


def without(
    headers: Iterable[tuple[str, bytes | None]] | None, names: frozenset[str] = _REPLACED
) -> Headers:
    """``headers`` minus ``names`` (the bookkeeping a new copy writes afresh)."""
    return [(k, v if v is not None else b"") for k, v in headers or () if k not in names]


def dlq_headers(
    headers: Iterable[tuple[str, bytes | None]] | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    reconsume_times: int,
    error: BaseException | None = None,
    first_failure_ms: int | None = None,
    last_failure_ms: int | None = None,
    reason: str | None = None,
) -> Headers:
    """A dead letter's headers: the message's own, where it came from, how often it was
    reconsumed, the listener's last exception (if it raised), its failure times (ms) and
    why its last call failed (one of ``DLQ_REASONS``)."""
    out = without(headers)
    out += [
        (H.DLQ_ORIGINAL_TOPIC, topic.encode()),
        (H.DLQ_ORIGINAL_PARTITION, str(partition).encode()),
        (H.DLQ_ORIGINAL_OFFSET, str(offset).encode()),
        (H.DLQ_RECONSUME_TIMES, str(reconsume_times).encode()),
    ]
    if error is not None:
        out += [
            (H.DLQ_EXCEPTION, type(error).__qualname__.encode()),
            (
                H.DLQ_EXCEPTION_MESSAGE,
                str(error)[:MAX_EXCEPTION_MESSAGE].encode("utf-8", "replace"),
            ),
        ]
    if first_failure_ms is not None:
        out.append((H.DLQ_FIRST_FAILURE_TS, str(first_failure_ms).encode()))
    if last_failure_ms is not None:
        out.append((H.DLQ_LAST_FAILURE_TS, str(last_failure_ms).encode()))
    if reason is not None:
        out.append((H.DLQ_REASON, reason.encode()))
    return out


def retry_headers(
    headers: Iterable[tuple[str, bytes | None]] | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    reconsume_times: int,
    first_failure_ms: int,
    due_ms: int,
) -> Headers:
    """A retry copy's headers: the message's own plus :data:`RETRY_HEADERS`."""
    return [
        *without(headers),
        (H.RECONSUME_TIMES, str(reconsume_times).encode()),
        (H.ORIGINAL_TOPIC, topic.encode()),
        (H.ORIGINAL_PARTITION, str(partition).encode()),
        (H.ORIGINAL_OFFSET, str(offset).encode()),
        (H.FIRST_FAILURE_TS, str(first_failure_ms).encode()),
        (H.RETRY_DUE_TS, str(due_ms).encode()),
    ]
