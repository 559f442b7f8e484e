"""Every ``rmq.*`` header name, once (DESIGN.md, "Headers on half and promoted records").

Plain ``str`` class attributes rather than an Enum: they are read per record on the hot
paths, and a member's ``.value`` would be a descriptor call each time.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DISCARD_HEADERS",
    "DLQ_HEADERS",
    "DLQ_REASONS",
    "PRODUCER_HEADERS",
    "PROMOTED_KEEPS",
    "REAPPEND_HEADERS",
    "RESERVED_PREFIX",
    "RETRY_HEADERS",
    "TIMER_KEEPS",
    "H",
    "header_text",
]

#: The header namespace the product owns; user headers may not start with it.
RESERVED_PREFIX: Final = "rmq."


class H:
    """Header names of half, promoted, check, discarded and dead-lettered records."""

    # Half records (and, where kept, promoted ones).
    TXN_ID: Final = "rmq.txn_id"
    REAL_TOPIC: Final = "rmq.real_topic"
    REAL_PARTITION: Final = "rmq.real_partition"
    PRODUCER_GROUP: Final = "rmq.producer_group"
    BORN_TS: Final = "rmq.born_ts"
    CHECK_IMMUNITY_MS: Final = "rmq.check_immunity_ms"
    TAGS: Final = "rmq.tags"
    KEYS: Final = "rmq.keys"
    # The ordering key of key-ordered consumption (RocketMQ 5's MessageGroup).
    MESSAGE_GROUP: Final = "rmq.message_group"
    # Members of a multi-message transaction: how many, and which one (0-based); absent on
    # a transaction of one.
    TXN_SIZE: Final = "rmq.txn_size"
    TXN_INDEX: Final = "rmq.txn_index"
    # The producer instance that should answer this transaction's back-checks first, and
    # the check partitions its check consumer held when it wrote the half record.
    CHECK_AFFINITY: Final = "rmq.check_affinity"
    CHECK_PARTITIONS: Final = "rmq.check_partitions"
    # Tenant isolation: an HMAC under the producer group's key, on its half records and end
    # requests (rmq_semantics/records/group_auth.py).
    GROUP_MAC: Final = "rmq.group_mac"
    # Promoted records.
    PROMOTED_FROM: Final = "rmq.promoted_from"
    # Records set aside in the discard topic.
    HALF_PARTITION: Final = "rmq.half_partition"
    HALF_OFFSET: Final = "rmq.half_offset"
    CHECK_COUNT: Final = "rmq.check_count"
    DISCARD_REASON: Final = "rmq.discard_reason"
    DISCARDED_TS: Final = "rmq.discarded_ts"
    # A half record written again by `txn redrive`.
    REDRIVE_OF: Final = "rmq.redrive_of"
    # A half record the coordinator wrote again past its re-append horizon: the offset it
    # replaces, where and when the transaction was first written, and its check counts.
    REAPPEND_OF: Final = "rmq.reappend_of"
    ORIGIN_OFFSET: Final = "rmq.origin_offset"
    ORIGIN_TS: Final = "rmq.origin_ts"
    CHECKS_ISSUED: Final = "rmq.checks_issued"
    CHECKS_ANSWERED: Final = "rmq.checks_answered"
    ANSWERED_SEQ: Final = "rmq.answered_seq"
    NEXT_CHECK_TS: Final = "rmq.next_check_ts"
    # A promoted record: when the coordinator promoted it (ms); its Kafka timestamp is the
    # producer's (CreateTime, the birth time).
    PROMOTED_AT: Final = "rmq.promoted_at"
    # A message re-sent to a retry topic by a concurrent consumer (RECONSUME_LATER): how
    # often it was consumed before, where it came from, its first failure and when it is due.
    RECONSUME_TIMES: Final = "rmq.reconsume_times"
    ORIGINAL_TOPIC: Final = "rmq.original_topic"
    ORIGINAL_PARTITION: Final = "rmq.original_partition"
    ORIGINAL_OFFSET: Final = "rmq.original_offset"
    FIRST_FAILURE_TS: Final = "rmq.first_failure_ts"
    RETRY_DUE_TS: Final = "rmq.retry_due_ts"
    # Dead letters of the orderly and the concurrent consumer: where the message came from,
    # how often it was consumed, the last listener exception (class, message) if it raised,
    # and its first and last failure (ms); the orderly consumer's also say why the last
    # call failed (DLQ_REASONS).
    DLQ_ORIGINAL_TOPIC: Final = "rmq.dlq.original_topic"
    DLQ_ORIGINAL_PARTITION: Final = "rmq.dlq.original_partition"
    DLQ_ORIGINAL_OFFSET: Final = "rmq.dlq.original_offset"
    DLQ_RECONSUME_TIMES: Final = "rmq.dlq.reconsume_times"
    DLQ_EXCEPTION: Final = "rmq.dlq.exception"
    DLQ_EXCEPTION_MESSAGE: Final = "rmq.dlq.exception_message"
    DLQ_FIRST_FAILURE_TS: Final = "rmq.dlq.first_failure_ts"
    DLQ_LAST_FAILURE_TS: Final = "rmq.dlq.last_failure_ts"
    DLQ_REASON: Final = "rmq.dlq.reason"
    # Timer messages (records/timer.py): the message id (the recall handle) and when it is
    # due (ms), on the timer record and kept on the delivered one; when the coordinator
    # delivered it (ms); on a record it re-appended to a level topic, the offset of the
    # intake record it came from (same partition: the timer topics are co-partitioned).
    TIMER_ID: Final = "rmq.timer_id"
    DELIVER_AT: Final = "rmq.deliver_at"
    DELIVERED_AT: Final = "rmq.delivered_at"
    TIMER_ORIGIN: Final = "rmq.timer_origin"


#: The only ``rmq.*`` headers a business producer writes (a ``Message``'s own fields); every
#: other one is written by the coordinator or a consumer, and trusted downstream.
PRODUCER_HEADERS: Final = frozenset((H.TAGS, H.KEYS, H.MESSAGE_GROUP))
#: ``rmq.*`` headers a promoted record keeps; every other ``rmq.*`` header is stripped.
PROMOTED_KEEPS: Final = (H.TXN_ID, H.TAGS, H.KEYS, H.MESSAGE_GROUP)
#: ``rmq.*`` headers a delivered timer record keeps from its timer record (it also gets
#: ``rmq.timer_id``, ``rmq.delivered_at`` and ``rmq.promoted_from``).
TIMER_KEEPS: Final = (H.TAGS, H.KEYS, H.MESSAGE_GROUP)
#: What the coordinator adds to a record it sets aside in the discard topic.
DISCARD_HEADERS: Final = (
    H.HALF_PARTITION,
    H.HALF_OFFSET,
    H.CHECK_COUNT,
    H.DISCARD_REASON,
    H.DISCARDED_TS,
)
#: What the coordinator adds to a half record it re-appends (all of them, always).
REAPPEND_HEADERS: Final = (
    H.REAPPEND_OF,
    H.ORIGIN_OFFSET,
    H.ORIGIN_TS,
    H.CHECKS_ISSUED,
    H.CHECKS_ANSWERED,
    H.ANSWERED_SEQ,
    H.NEXT_CHECK_TS,
)
#: What a consumer adds to a dead letter (the exception pair only if the listener raised).
DLQ_HEADERS: Final = (
    H.DLQ_ORIGINAL_TOPIC,
    H.DLQ_ORIGINAL_PARTITION,
    H.DLQ_ORIGINAL_OFFSET,
    H.DLQ_RECONSUME_TIMES,
    H.DLQ_EXCEPTION,
    H.DLQ_EXCEPTION_MESSAGE,
    H.DLQ_FIRST_FAILURE_TS,
    H.DLQ_LAST_FAILURE_TS,
    H.DLQ_REASON,
)
#: ``rmq.dlq.reason`` values: the listener raised, returned SUSPEND, returned something
#: that is not a status, or ran past ``consume_timeout_ms``; or a SimpleConsumer's message
#: was delivered ``max_delivery_attempts`` times without an ack.
DLQ_REASONS: Final = ("raised", "suspended", "bad_status", "timed_out", "max_attempts")
#: What a concurrent consumer adds to a message it sends to a retry topic.
RETRY_HEADERS: Final = (
    H.RECONSUME_TIMES,
    H.ORIGINAL_TOPIC,
    H.ORIGINAL_PARTITION,
    H.ORIGINAL_OFFSET,
    H.FIRST_FAILURE_TS,
    H.RETRY_DUE_TS,
)


def header_text(headers: list | None, name: str, limit: int) -> str:
    """Header ``name``'s first bytes value, at most ``limit`` bytes, as text (never raises):
    how a refused record is read as far as it can be, for its discard copy and log line."""
    raw = next((v for k, v in headers or [] if k == name and isinstance(v, bytes)), b"")
    return raw[:limit].decode(errors="replace")
