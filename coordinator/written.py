"""What a committed Kafka transaction of the coordinator did, told: its metrics and its log
lines, one per action (a promotion only at debug level: the hot path)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from coordinator.metrics import CoordinatorMetrics
from coordinator.state import Action, Discard, Finish, IssueCheck, LateCommit, Reappend, TxnState
from rmq_semantics.topics import SystemTopics

__all__ = ["action_where", "count_written"]

log = logging.getLogger("coordinator.promote")


def action_where(topics: SystemTopics, action: Action) -> str:
    if isinstance(action, LateCommit):
        return f"{topics.half}[{action.partition}]@{action.half_offset} txn={action.txn_id}"
    half = action.half
    return f"{topics.half}[{half.partition}]@{half.offset} txn={half.txn_id}"


def count_written(
    metrics: CoordinatorMetrics, topics: SystemTopics, actions: Sequence[Action]
) -> None:
    """Metrics and logs of a committed transaction's actions."""
    now = time.time()
    debug = log.isEnabledFor(logging.DEBUG)
    promotions = 0
    for action in actions:
        if isinstance(action, LateCommit):
            metrics.conflicting.labels("late_commit").inc()
            log.warning(
                "%s: COMMIT (op offset %d) after the transaction was discarded; "
                "noted as late_commit in %s",
                action_where(topics, action),
                action.op_offset,
                topics.discard,
            )
            continue
        half = action.half
        if isinstance(action, Finish) and action.outcome is TxnState.COMMITTED:
            # The hot path: no per-record string unless debug logging is on.
            promotions += len(action.records)
            metrics.promotion_latency.observe(max(0.0, now - half.born_ts / 1000))
            if debug:
                log.debug(
                    "%s[%d]@%d txn=%s promoted to %s",
                    topics.half,
                    half.partition,
                    half.offset,
                    half.txn_id,
                    half.real_topic,
                )
            continue
        where = f"{topics.half}[{half.partition}]@{half.offset} txn={half.txn_id}"
        if isinstance(action, Finish):
            metrics.rollbacks.inc()
            log.debug("%s rolled back", where)
        elif isinstance(action, IssueCheck):
            metrics.checks_issued.inc()
            log.info(
                "%s check #%d sent to producer group %s",
                where,
                action.check_seq,
                action.half.producer_group,
            )
        elif isinstance(action, Reappend):
            metrics.reappended.inc()
            log.info(
                "%s re-appended to %s[%d] (pending since %.0f s, first written at offset %d)",
                where,
                topics.half,
                half.partition,
                max(0.0, now - half.timestamp_ms / 1000),
                action.carried.origin_offset,
            )
        elif isinstance(action, Discard):
            metrics.discarded.labels(action.reason).inc()
            log.warning(
                "%s discarded (%s)%s%s",
                where,
                action.reason,
                f" with its {len(action.members)} members" if action.members else "",
                f": {action.detail}" if action.detail else "",
            )
    if promotions:
        metrics.promotions.inc(promotions)
