"""The push consumer's ledger as the poll thread's back-pressure sees it: a full backlog
waits for a settled call instead of pausing the partitions (a pause drops librdkafka's
prefetched records, and their refetch cost a fast listener most of its throughput)."""

from __future__ import annotations

import threading

from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.push.api import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus
from rmq_semantics.push.ledger import Batch, Ledger, Part


def _ledger_with_calls(n: int) -> tuple[Ledger, Part, list[Batch]]:
    ledger = Ledger(
        retry_topic=lambda level: f"retry_{level}",
        dlq_topic="dlq",
        delay_levels=(1.0,),
        max_reconsume_times=3,
    )
    part = Part(("t", 0), OffsetTracker())
    ledger.assign(part)
    batches = []
    for offset in range(n):
        assert ledger.take(part, offset)
        batch = Batch(part, [object()], [offset], [None], deadline=float("inf"))
        ledger.open(batch)
        batches.append(batch)
    return ledger, part, batches


def test_a_full_backlog_gets_room_when_a_call_settles():
    ledger, _, batches = _ledger_with_calls(4)
    assert ledger.wait_for_room(4, 0.0) is False  # full, and nothing settles
    context = ConsumeConcurrentlyContext("t", 0, 1)
    settler = threading.Timer(
        0.05, ledger.settle, (batches[0], ConsumeConcurrentlyStatus.CONSUME_SUCCESS, context, None)
    )
    settler.start()
    assert ledger.wait_for_room(4, 10.0) is True
    settler.join()
    assert ledger.in_flight == 3 and ledger.counts["consumed"] == 1


def test_room_below_the_limit_is_there_at_once():
    ledger, _, _ = _ledger_with_calls(2)
    assert ledger.wait_for_room(3, 0.0) is True
