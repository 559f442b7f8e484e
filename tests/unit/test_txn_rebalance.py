"""The transaction service's rebalance callback without a broker: a failed committed-offset
read is retried, and one that keeps failing becomes a replay of the loop, never an
exception out of ``poll()`` that ends the coordinator (issue 29)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from coordinator import takeover
from coordinator.settings import CoordinatorSettings
from coordinator.txn_service import TransactionService
from rmq_semantics.errors import KafkaOperationError, RmqError

SETTINGS = CoordinatorSettings(topic_prefix="rb", half_partitions=2)
CONF = {"bootstrap.servers": "127.0.0.1:1"}


class FlakyConsumer:
    """``committed()`` fails ``failures`` times (a broker timing out), then answers."""

    def __init__(self, failures: int, offsets: dict[tuple[str, int], int]) -> None:
        self.failures = failures
        self.offsets = offsets
        self.calls = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "OffsetFetch timed out"))
        return [
            TopicPartition(
                tp.topic, tp.partition, self.offsets.get((tp.topic, tp.partition), -1001)
            )
            for tp in partitions
        ]


def _service() -> TransactionService:
    return TransactionService(CONF, SETTINGS)


ASSIGNED = [TopicPartition("rb_half", 1), TopicPartition("rb_op", 1)]


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(takeover, "READ_DEADLINE_S", 0.5)
    monkeypatch.setattr(takeover, "READ_TIMEOUT_S", 0.1)


def test_a_committed_offset_read_that_fails_once_is_retried_in_the_callback(fast):
    service = _service()
    consumer = FlakyConsumer(1, {("rb_half", 1): 7, ("rb_op", 1): 3})
    service._on_assign(consumer, ASSIGNED)
    assert consumer.calls == 2
    assert service.committed_offsets(1) == (7, 3)
    service._raise_settle_error()  # nothing left for the loop


def test_a_committed_offset_read_that_keeps_failing_becomes_a_replay_not_an_exit(fast):
    service = _service()
    consumer = FlakyConsumer(10**6, {})
    service._on_assign(consumer, ASSIGNED)  # raising here would leave poll() and end the run
    assert consumer.calls >= 2 and 1 not in service.states
    with pytest.raises(KafkaOperationError, match="committed offsets") as raised:
        service._raise_settle_error()  # the loop's next step: a pause and a replay
    assert isinstance(raised.value, RmqError)


def test_the_recovery_of_a_partition_taken_over_ends_only_at_its_high_watermark(fast):
    """A read_committed end before the high watermark its first end came with stops at a
    transaction open at the takeover (a previous owner's decisions may be behind it): not the
    end; one at or past it is."""
    service = _service()
    service._on_assign(FlakyConsumer(0, {}), ASSIGNED)
    gauge = service.metrics.registry.get_sample_value
    assert not service.takeover.at_end("rb_op", 1, 5, 9)  # the first end sets the mark
    assert gauge("rmq_takeover_waiting_partitions") == 1
    assert not service.takeover.at_end("rb_op", 1, 7, 12)
    assert service.takeover.at_end("rb_op", 1, 9, 12)
    assert service.takeover.at_end("rb_op", 1, 2, 12)  # the wait is over for good
    assert service.takeover.at_end("rb_half", 1, 4, 4)  # nothing open: the end is the end
    assert gauge("rmq_takeover_waiting_partitions") == 0
