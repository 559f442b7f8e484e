"""The PushConsumer's FIFO bookkeeping without a broker: the ledger hands out each message
group's head only, retries it in place, dead-letters it after max_reconsume_times, and commits
an offset that passes neither an unacked FIFO record nor an unfinished unordered one."""

from __future__ import annotations

import time

from rmq_semantics.push.api import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    PushMessage,
)
from rmq_semantics.push.ledger import Batch, Ledger, Part
from rmq_semantics.push.positions import pause_full_engines
from rmq_semantics.records.headers import H

SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
RETRY_MS = 1000


def _ledger(max_reconsume_times: int = 2) -> Ledger:
    return Ledger(
        retry_topic=lambda level: f"retry_{level}",
        dlq_topic="dlq",
        delay_levels=(1.0,),
        max_reconsume_times=max_reconsume_times,
        fifo=True,
        fifo_retry_interval_ms=RETRY_MS,
    )


def _msg(offset: int, group: str | None) -> PushMessage:
    headers = ((H.MESSAGE_GROUP, group.encode()),) if group else ()
    return PushMessage("t", 0, offset, None, str(offset).encode(), headers, 0, 0)


def _fill(ledger: Ledger, groups: list[str | None], metadata: str | None = None) -> Part:
    """A partition of ``t`` with one record per entry of ``groups`` from offset 0 (a group:
    offered to the engine; None: taken as an unordered record)."""
    part = ledger.new_part("t", 0, 0 if metadata else -1001, metadata, 0)
    ledger.assign(part)
    for offset, group in enumerate(groups):
        if group is None:
            assert ledger.take(part, offset)
        else:
            ledger.offer(part, offset, _msg(offset, group), _now())
    return part


def _now() -> int:
    return int(time.time() * 1000)


def _deliver(ledger: Ledger, now_ms: int | None = None) -> dict[int, Batch]:
    """The FIFO records due, each as the pool gets it (offset -> its one-message batch)."""
    out = {}
    for part, d in ledger.deliver(10, now_ms or _now(), 60_000):
        batch = Batch(part, [d.record], [d.receipt.offset], [None], float("inf"), receipt=d.receipt)
        ledger.open(batch)
        out[d.receipt.offset] = batch
    return out


def _settle(ledger: Ledger, batch: Batch, status, error: BaseException | None = None) -> None:
    ledger.settle(batch, status, ConsumeConcurrentlyContext("t", 0, 1), error)


def _committed(ledger: Ledger) -> int:
    _copies, offsets = ledger.take_commit()
    ((offset, _meta),) = offsets.values()
    ledger.committed(offsets)
    return offset


def test_only_each_groups_head_is_handed_out_and_the_next_after_its_ack():
    ledger = _ledger()
    _fill(ledger, ["a", "b", "a", "b"])
    first = _deliver(ledger)
    assert sorted(first) == [0, 1]
    assert _deliver(ledger) == {}  # a and b each have one in flight
    _settle(ledger, first[1], SUCCESS)
    assert sorted(_deliver(ledger)) == [3]
    assert ledger.counts["consumed"] == 1


def test_reconsume_later_keeps_the_head_until_the_retry_interval_then_counts_the_attempt():
    ledger = _ledger()
    part = _fill(ledger, ["a", "a"])
    (batch,) = _deliver(ledger).values()
    _settle(ledger, batch, LATER)
    assert _deliver(ledger) == {}  # invisible for the interval; 1 waits behind it
    again = _deliver(ledger, _now() + RETRY_MS + 100)
    assert list(again) == [0] and again[0].receipt.attempt == 2
    assert part.outbox == [] and ledger.counts["retried"] == 1  # no retry copy


def test_after_max_reconsume_times_the_dead_letter_is_queued_and_the_group_goes_on():
    ledger = _ledger(max_reconsume_times=1)
    part = _fill(ledger, ["a", "a"])
    (batch,) = _deliver(ledger).values()
    _settle(ledger, batch, LATER)
    (batch,) = _deliver(ledger, _now() + RETRY_MS + 100).values()
    _settle(ledger, batch, LATER, ValueError("no"))
    (dead,) = part.outbox
    headers = dict(dead.headers)
    assert dead.topic == "dlq" and dead.value == b"0"
    assert headers[H.DLQ_RECONSUME_TIMES] == b"1"
    assert headers[H.DLQ_EXCEPTION] == b"ValueError"
    assert list(_deliver(ledger)) == [1]  # the group goes on at once
    assert _committed(ledger) == 1  # the dead letter commits with its offset


def test_the_committed_offset_passes_neither_an_unacked_fifo_record_nor_an_unordered_one():
    ledger = _ledger()
    _fill(ledger, ["a", None, "b"])
    batches = _deliver(ledger)
    _settle(ledger, batches[2], SUCCESS)
    assert _committed(ledger) == 0  # a@0 in flight
    _settle(ledger, batches[0], SUCCESS)
    assert _committed(ledger) == 1  # the unordered record at 1 is not finished
    unordered = Batch(ledger.part(("t", 0)), [_msg(1, None)], [1], [None], float("inf"))
    ledger.open(unordered)
    _settle(ledger, unordered, SUCCESS)
    assert _committed(ledger) == 3


def test_a_new_owner_restores_the_attempts_and_keeps_the_record_invisible_until_its_deadline():
    ledger = _ledger()
    _fill(ledger, ["a", "a"])
    (batch,) = _deliver(ledger).values()
    _settle(ledger, batch, LATER)
    _copies, offsets = ledger.take_commit()
    ((offset, metadata),) = offsets.values()
    assert offset == 0
    successor = _ledger()
    _fill(successor, ["a", "a"], metadata)
    assert _deliver(successor) == {}  # still within the retry interval
    again = _deliver(successor, _now() + RETRY_MS + 100)
    assert list(again) == [0] and again[0].receipt.attempt == 2


class PausingConsumer:
    """The consumer calls pause_full_engines makes."""

    def __init__(self) -> None:
        self.paused: set[tuple[str, int]] = set()
        self.sought: list[tuple[str, int, int]] = []

    def pause(self, partitions: list) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def seek(self, tp) -> None:
        self.sought.append((tp.topic, tp.partition, tp.offset))


def test_a_partition_held_by_its_group_is_paused_at_the_trackers_bound_and_resumed_after():
    ledger = _ledger()
    part = _fill(ledger, ["a"] * 5)
    part.tracker.max_span = 4  # five records behind a head in flight: over the bound
    consumer, full = PausingConsumer(), set()
    (batch,) = _deliver(ledger).values()
    pause_full_engines(consumer, ledger, full, set())  # type: ignore[arg-type]
    assert consumer.paused == full == {("t", 0)}
    _settle(ledger, batch, SUCCESS)
    pause_full_engines(consumer, ledger, full, set())  # type: ignore[arg-type]
    assert consumer.paused == full == set()
    assert consumer.sought == [("t", 0, 5)]  # reading goes on after the last record offered


def test_revocation_waits_for_the_fifo_calls_of_its_partitions_only():
    ledger = _ledger()
    part = _fill(ledger, ["a", None])
    (batch,) = _deliver(ledger).values()
    unordered = Batch(part, [_msg(1, None)], [1], [None], float("inf"))
    ledger.open(unordered)
    assert not ledger.wait_fifo_calls({("t", 0)}, 0.01)  # a@0 runs
    assert ledger.wait_fifo_calls({("t", 1)}, 0.01)  # another partition: nothing to wait for
    _settle(ledger, batch, SUCCESS)
    assert ledger.wait_fifo_calls({("t", 0)}, 0.01)  # the unordered call is not waited for
