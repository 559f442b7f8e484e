"""Why the coordinator set a half message (or a timer message) aside in the discard topic:
the value of its ``rmq.discard_reason`` header and the ``reason`` label of
``rmq_discarded_total`` (DESIGN.md, "Topics"). Pure: no Kafka import."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["NOT_REDRIVABLE", "DiscardReason"]


class DiscardReason(StrEnum):
    """One word per cause; the words are part of the wire contract."""

    # The half record itself can never be promoted.
    MALFORMED = "malformed"  # rmq.* headers missing or unreadable
    SYSTEM_TOPIC = "system_topic"  # its real topic is one of the product's own topics
    # Tenant isolation: no valid rmq.group_mac for the group it names (or a group the
    # coordinators do not know); a real topic outside its group's allow-list.
    FORGED = "forged"
    NOT_ALLOWED = "not_allowed"
    # Kafka refused the promotion of this record (its cause may be fixed, then re-driven).
    UNKNOWN_TOPIC = "unknown_topic"
    UNKNOWN_PARTITION = "unknown_partition"
    UNAUTHORIZED = "unauthorized"  # the coordinator may not write the real topic
    TOO_LARGE = "too_large"  # over the real (or check) topic's max.message.bytes
    REPLAY_LIMIT = "replay_limit"  # made its Kafka transaction abort replay_max times
    # Nobody decided in time.
    CHECK_MAX = "check_max"
    RETENTION = "retention"
    # A multi-message transaction committed with members that never arrived: never promoted
    # in part, every member read set aside.
    INCOMPLETE = "incomplete"
    # A timer message scheduled further ahead than the coordinator's max_delay_ms.
    TOO_FAR = "too_far"
    # Not a discard: a COMMIT that arrived after the transaction was discarded.
    LATE_COMMIT = "late_commit"


#: Discards with no transaction id or real topic worth checking again: `txn redrive` refuses.
NOT_REDRIVABLE: Final = frozenset({DiscardReason.MALFORMED, DiscardReason.SYSTEM_TOPIC})
