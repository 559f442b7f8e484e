"""The SimpleConsumer's Kafka edge against a fake client: a partition whose committed state
cannot be read at assignment is assigned paused (nothing fetched, nothing handed out) and
adopted by a later poll from its committed offset; ack_async's futures resolve with the commit
that carried their ack, and fail when the partition goes before one."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rmq_semantics.errors import KafkaOperationError, ReceiptError
from rmq_semantics.records.headers import H
from rmq_semantics.settings import SimpleConsumerSettings
from rmq_semantics.simple import poller as poller_module
from rmq_semantics.simple.poller import Poller
from rmq_semantics.tags import TagFilter
from rmq_semantics.topics import SystemPartitionFilter


class FakeConsumer:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[tuple[str, list]] = []

    def committed(self, partitions, timeout):
        assert timeout > 0
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return [TopicPartition(tp.topic, tp.partition, 42) for tp in partitions]

    def _record(self, name, partitions):
        self.calls.append((name, [(tp.topic, tp.partition, tp.offset) for tp in partitions]))

    def incremental_assign(self, partitions):
        self._record("assign", partitions)

    def pause(self, partitions):
        self._record("pause", partitions)

    def resume(self, partitions):
        self._record("resume", partitions)

    def seek(self, tp):
        self._record("seek", [tp])

    def consume(self, n, timeout):
        return []


def make_poller() -> Poller:
    return Poller(
        SimpleConsumerSettings(),
        group="g",
        client_id="c",
        dlq_topic="__rmq_dlq_g",
        system=SystemPartitionFilter("__rmq", "test"),
        filters={"t": TagFilter()},
    )


def test_a_partition_whose_commit_cannot_be_read_is_adopted_by_a_later_poll(monkeypatch):
    monkeypatch.setattr(poller_module, "UNREAD_RETRY_S", 0.0)
    poller, consumer = make_poller(), FakeConsumer(failures=2)
    poller.on_assign(consumer, [TopicPartition("t", 0)])
    assert consumer.calls == [("assign", [("t", 0, -1001)]), ("pause", [("t", 0, -1001)])]
    assert poller.engines == {}
    poller.poll(consumer, 0)  # fails again: still paused, no engine
    assert poller.engines == {}
    assert len(consumer.calls) == 2
    poller.poll(consumer, 0)
    assert list(poller.engines) == [("t", 0)]
    assert consumer.calls[2:] == [("seek", [("t", 0, 42)]), ("resume", [("t", 0, 42)])]


def test_system_topic_partitions_are_never_assigned():
    poller, consumer = make_poller(), FakeConsumer(failures=0)
    poller.on_assign(consumer, [TopicPartition("__rmq_half", 0), TopicPartition("t", 1)])
    # Resumed too: librdkafka keeps a pause from an earlier assignment of the partition.
    assert consumer.calls == [("assign", [("t", 1, 42)]), ("resume", [("t", 1, 42)])]
    assert list(poller.engines) == [("t", 1)]


def test_a_topic_gets_its_own_filter_else_the_first_subscribed_pattern_matching_it():
    own, orders, any_topic = TagFilter("a"), TagFilter("b"), TagFilter("c")
    filters = {"orders-eu": own, "^orders-.*": orders, "^.*": any_topic}
    poller = Poller(
        SimpleConsumerSettings(),
        group="g",
        client_id="c",
        dlq_topic="__rmq_dlq_g",
        system=SystemPartitionFilter("__rmq", "test"),
        filters=filters,
    )
    assert poller.tag_filter("orders-eu") is own
    assert poller.tag_filter("orders-us") is orders  # the first pattern given that matches
    assert poller.tag_filter("payments") is any_topic
    del filters["^.*"]  # an unsubscribe: the consumer tells the poller
    poller.filters_changed()
    assert poller.tag_filter("payments") is None


class FakeRecord:
    def __init__(self, offset: int, headers: list) -> None:
        self._offset, self._headers = offset, headers

    def error(self):
        return None

    def topic(self):
        return "t"

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def headers(self):
        return self._headers


def test_a_message_group_that_is_not_utf8_is_counted_and_delivered_without_order(caplog):
    poller, consumer = make_poller(), FakeConsumer(failures=0)
    poller.on_assign(consumer, [TopicPartition("t", 0)])
    records = [
        FakeRecord(42, [(H.MESSAGE_GROUP, b"\xff\xfe")]),
        FakeRecord(43, [(H.MESSAGE_GROUP, b"\xff\xfe")]),
    ]
    consumer.consume = lambda n, timeout: records
    poller.poll(consumer, 0)
    engine = poller.engines[("t", 0)]
    # Both out at once: no group holds the second back.
    assert [d.receipt.offset for d in engine.receive(10, 0, 1000)] == [42, 43]
    assert poller.counts["malformed"] == 2
    assert poller.status() == {
        "t[0]": {
            "commit_offset": 42,
            "in_flight": 2,
            "leased": 2,
            "buffered": 2,
            "groups": 0,
            "paused": False,
        }
    }
    assert "t[0]@42" in caplog.text


class FakeProducer:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.sent: list[bytes] = []
        self._pending: list = []

    def produce(self, topic, key, value, headers, on_delivery):
        self._pending.append((value, on_delivery))

    def flush(self, timeout):
        for value, on_delivery in self._pending:
            if self.failures:
                self.failures -= 1
                on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), None)
            else:
                self.sent.append(value)
                on_delivery(None, None)
        self._pending = []
        return 0


def test_a_dead_letter_the_dlq_refused_stays_owed_and_is_sent_again():
    settings = SimpleConsumerSettings(max_delivery_attempts=1)
    poller = Poller(
        settings,
        group="g",
        client_id="c",
        dlq_topic="__rmq_dlq_g",
        system=SystemPartitionFilter("__rmq", "test"),
        filters={"t": TagFilter()},
    )
    consumer, producer = FakeConsumer(failures=0), FakeProducer(failures=1)
    poller.producer = producer
    poller.on_assign(consumer, [TopicPartition("t", 0)])
    record = FakeRecord(42, [])
    record.key = lambda: None
    record.value = lambda: b"poison"
    consumer.consume = lambda n, timeout: [record]
    poller.poll(consumer, 0)
    consumer.consume = lambda n, timeout: []
    engine = poller.engines[("t", 0)]
    assert len(engine.receive(1, 0, 1000)) == 1  # its one attempt
    engine_now = 2000  # the deadline passed: a dead letter is owed
    poller._bury(engine, engine_now)
    assert (producer.sent, poller.counts["dlq_failures"], poller.counts["dead"]) == ([], 1, 0)
    poller._bury(engine, engine_now)
    assert (producer.sent, poller.counts["dead"]) == ([b"poison"], 1)
    assert engine.committable(engine_now)[0] == 43  # done: the commit moves past it


def test_a_partition_restored_from_the_poller_s_own_commit_logs_no_warning(caplog):
    poller, consumer = make_poller(), FakeConsumer(failures=0)
    poller.on_assign(consumer, [TopicPartition("t", 0)])
    consumer.consume = lambda n, timeout: [FakeRecord(42, [])]
    poller.poll(consumer, 0)
    engine = poller.engines[("t", 0)]
    engine.receive(1, 0, 1000)
    offset, metadata = engine.committable(0, poller._owner)
    committed = [TopicPartition("t", 0, offset, metadata=metadata)]
    consumer.committed = lambda partitions, timeout: committed
    caplog.clear()
    poller.on_assign(consumer, [TopicPartition("t", 0)])  # a new owner, from that commit
    assert "ignoring" not in caplog.text
    assert poller.engines[("t", 0)].offer(42, FakeRecord(42, []), 0)  # its lease restored
    assert poller.engines[("t", 0)].in_flight == 1


class CommittingConsumer(FakeConsumer):
    """Commits land, or fail with a KafkaException while ``commit_failures`` lasts."""

    def __init__(self) -> None:
        super().__init__(failures=0)
        self.commit_failures = 0
        self.commits: list[list[tuple[str, int, int]]] = []

    def commit(self, offsets, asynchronous):
        assert asynchronous is False
        if self.commit_failures:
            self.commit_failures -= 1
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT))
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])
        return offsets

    def incremental_unassign(self, partitions):
        self._record("unassign", partitions)


def acked_with_future(poller, consumer) -> Future:
    """Records 42 and 43 of t[0] received; 43 acked, its future waiting for a commit."""
    poller.on_assign(consumer, [TopicPartition("t", 0)])
    consumer.consume = lambda n, timeout: [FakeRecord(42, []), FakeRecord(43, [])]
    poller.poll(consumer, 0)
    engine = poller.engines[("t", 0)]
    receipts = [d.receipt for d in engine.receive(2, 0, 60_000)]
    engine.ack(receipts[1], 1)
    future: Future = Future()
    poller.wait_for_commit(("t", 0), 43, future)
    return future


def test_an_ack_future_resolves_with_the_commit_that_carried_it_not_before():
    poller, consumer = make_poller(), CommittingConsumer()
    future = acked_with_future(poller, consumer)
    assert not future.done()
    consumer.commit_failures = 1
    with pytest.raises(KafkaOperationError):
        poller.commit(consumer, [("t", 0)])
    assert not future.done()  # the failed commit did not carry it
    poller.commit(consumer, [("t", 0)])
    assert consumer.commits == [[("t", 0, 42)]]  # 42 not acked: 43 is in the done field
    assert future.result(0) is None


@pytest.mark.parametrize("how", ["revoked", "lost"])
def test_an_ack_future_fails_when_its_partition_goes_before_a_commit_carried_it(how):
    poller, consumer = make_poller(), CommittingConsumer()
    future = acked_with_future(poller, consumer)
    consumer.commit_failures = 1  # the revocation's commit fails; a lost partition has none
    getattr(poller, f"on_{'revoke' if how == 'revoked' else 'lost'}")(
        consumer, [TopicPartition("t", 0)]
    )
    with pytest.raises(ReceiptError, match=rf"t\[0\]@43: its partition was {how} .* again"):
        future.result(0)
    assert consumer.commits == []


def test_an_ack_future_resolves_with_the_commit_on_revocation():
    poller, consumer = make_poller(), CommittingConsumer()
    future = acked_with_future(poller, consumer)
    poller.on_revoke(consumer, [TopicPartition("t", 0)])
    assert future.result(0) is None
    assert consumer.commits == [[("t", 0, 42)]]
