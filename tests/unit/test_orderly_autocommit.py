"""Orderly parity with RocketMQ's ConsumeMessageOrderlyService: COMMIT, ROLLBACK and
``context.auto_commit`` on the pure queue state, and the context's rules."""

from __future__ import annotations

import pytest

from rmq_semantics.errors import ConfigError
from rmq_semantics.orderly import ConsumeOrderlyContext, ConsumeOrderlyStatus, OrderlyMessage
from rmq_semantics.orderly.queue import QueueState

TP = ("orders", 0)
LEASE_END = 100.0


def aligned(*offsets: int) -> QueueState:
    q = QueueState(TP)
    q.grant(1, LEASE_END)
    q.align(1, offsets[0])
    q.add([OrderlyMessage(TP[0], TP[1], o, None, b"v", (), 0) for o in offsets])
    return q


def offsets(batch: list[OrderlyMessage]) -> list[int]:
    return [m.offset for m in batch]


def test_the_statuses_have_rocketmqs_names():
    assert {s.name for s in ConsumeOrderlyStatus} == {
        "SUCCESS",
        "SUSPEND_CURRENT_QUEUE_A_MOMENT",
        "COMMIT",
        "ROLLBACK",
    }


def test_success_held_then_rollback_redelivers_everything_since_the_last_commit():
    q = aligned(5, 6, 7, 8)
    assert offsets(q.next_batch(1)) == [5]
    q.hold()
    assert offsets(q.next_batch(1)) == [6]
    q.hold()
    assert offsets(q.next_batch(1)) == [7]
    assert q.pending_commit is None  # nothing committed with auto_commit off
    q.rollback()
    assert offsets(q.next_batch(2)) == [5, 6]
    assert offsets(list(q.msgs)) == [7, 8]


def test_commit_commits_up_to_the_batch_and_forgets_the_held_ones():
    q = aligned(5, 6, 7)
    q.next_batch(1)
    q.hold()
    assert offsets(q.next_batch(1)) == [6]
    q.processed(7, 1)  # what COMMIT does after the batch ending at 6
    assert (q.pending_commit, q.uncommitted) == (7, [])
    q.rollback()  # a later ROLLBACK goes back to the commit, not before it
    assert offsets(q.next_batch(5)) == [7]


def test_a_new_epoch_redoes_held_messages_from_the_groups_commit():
    q = aligned(5, 6, 7)
    q.next_batch(1)
    q.hold()
    q.grant(2, LEASE_END)
    q.align(2, 5)
    assert offsets(q.next_batch(3)) == [5, 6, 7]


def test_auto_commit_defaults_to_true_and_has_rocketmqs_setters():
    context = ConsumeOrderlyContext("orders", 0)
    assert context.auto_commit is True
    context.setAutoCommit(False)
    context.setSuspendCurrentQueueTimeMillis(3000)
    assert (context.auto_commit, context.suspend_ms) == (False, 3000)


def test_auto_commit_off_is_refused_in_key_mode():
    context = ConsumeOrderlyContext("orders", 0, key_mode=True)
    with pytest.raises(ConfigError, match="ordering='partition'"):
        context.setAutoCommit(False)
    context.auto_commit = True  # allowed: it is the only mode there
    with pytest.raises(ConfigError, match="must be a bool"):
        ConsumeOrderlyContext("orders", 0).auto_commit = 0
