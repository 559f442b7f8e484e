"""The push consumer's poll loop under faults only the broker can cause, injected through a
fake Kafka consumer and producer: a committed-offset read that fails in the rebalance
callback, the rewind after a failed round, transactional producers that die or wedge, and
librdkafka keeping a pause across a rebalance."""

from __future__ import annotations

import threading
import time

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.push import poller
from rmq_semantics.push.api import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    PushMessage,
)
from rmq_semantics.push.fifo_hold import FIFO_REVOKE_MARGIN_S, fifo_revoke_wait_s
from rmq_semantics.push.ledger import FIFO_COMMITTED_LEASE_MS, Batch, Ledger, Part
from rmq_semantics.push.poller import PollLoop, PollSettings
from rmq_semantics.push.positions import rewind
from rmq_semantics.push.retry import OutRecord
from rmq_semantics.records.headers import H
from rmq_semantics.simple.engine import PartitionEngine
from rmq_semantics.tags import TagFilter


class FakeConsumer:
    """Records the assignment calls; ``committed`` fails ``failures`` times, then answers."""

    def __init__(self, failures: int, committed_offset: int = 7) -> None:
        self.failures = failures
        self.committed_offset = committed_offset
        self.assigned: list[TopicPartition] = []
        self.paused: set[tuple[str, int]] = set()
        self.sought: list[TopicPartition] = []

    def committed(self, partitions: list, timeout: float) -> list:
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "committed timed out"))
        return [TopicPartition(tp.topic, tp.partition, self.committed_offset) for tp in partitions]

    def incremental_assign(self, partitions: list) -> None:
        self.assigned.extend(partitions)

    def incremental_unassign(self, partitions: list) -> None:
        keys = {(tp.topic, tp.partition) for tp in partitions}
        self.assigned = [tp for tp in self.assigned if (tp.topic, tp.partition) not in keys]

    def assignment(self) -> list:
        return list(self.assigned)

    def pause(self, partitions: list) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def seek(self, partition: TopicPartition) -> None:
        self.sought.append(partition)

    def consume(self, num: int, timeout: float) -> list:
        return []

    def subscribe(self, topics: list, **callbacks: object) -> None:
        self.topics = topics

    def consumer_group_metadata(self) -> object:
        return "group-metadata"

    def close(self) -> None:
        pass


def _loop() -> PollLoop:
    settings = PollSettings(
        consumer_conf={},
        producer_conf={},
        topics=["orders"],
        retry_levels={},
        delay_levels=(1.0,),
        tags=TagFilter(),
        batch_size=1,
        backlog=16,
        max_reconsume_times=3,
        consume_timeout_ms=1000,
        drain_timeout_s=1.0,
    )
    ledger = Ledger(
        retry_topic=lambda level: f"retry_{level}",
        dlq_topic="dlq",
        delay_levels=(1.0,),
        max_reconsume_times=3,
    )
    return PollLoop(
        settings,
        ledger,
        pool=None,
        stopping=threading.Event(),  # type: ignore[arg-type]
        name="test",
    )


def test_a_failed_committed_read_in_on_assign_is_retried_and_never_raises():
    loop = _loop()
    consumer = FakeConsumer(failures=2)
    tp = TopicPartition("orders", 0)
    loop._on_assign(consumer, [tp])  # type: ignore[arg-type]
    # Assigned (the group gave it to us) but paused: nothing is fetched before its offsets.
    assert [(t.topic, t.partition) for t in consumer.assigned] == [("orders", 0)]
    assert ("orders", 0) in consumer.paused
    assert loop.ledger.part(("orders", 0)) is None
    assert loop.ledger.counts["poll_errors"] == 1
    for _ in range(2):  # one more failure, then the read succeeds
        loop._read_unassigned(consumer, force=True)  # type: ignore[arg-type]
    part = loop.ledger.part(("orders", 0))
    assert part is not None and part.tracker.committable()[0] == 7
    assert ("orders", 0) not in consumer.paused
    assert [(s.topic, s.partition, s.offset) for s in consumer.sought] == [("orders", 0, 7)]
    assert loop.ledger.counts["poll_errors"] == 2


def test_a_partition_revoked_while_its_offsets_are_unread_is_forgotten():
    loop = _loop()
    consumer = FakeConsumer(failures=5)
    tp = TopicPartition("orders", 0)
    loop._on_assign(consumer, [tp])  # type: ignore[arg-type]
    loop._on_lost(consumer, [tp])  # type: ignore[arg-type]
    assert consumer.assigned == []
    consumer.failures = 0
    loop._read_unassigned(consumer, force=True)  # type: ignore[arg-type]
    assert loop.ledger.part(("orders", 0)) is None


def test_a_retry_partition_without_a_commit_is_read_from_its_start_once_its_offsets_come():
    loop = _loop()
    loop.s = PollSettings(**{**loop.s.__dict__, "retry_levels": {"retry_1": 1}})
    consumer = FakeConsumer(failures=1, committed_offset=confluent_kafka.OFFSET_INVALID)
    loop._on_assign(consumer, [TopicPartition("retry_1", 0)])  # type: ignore[arg-type]
    loop._read_unassigned(consumer, force=True)  # type: ignore[arg-type]
    assert [(s.topic, s.offset) for s in consumer.sought] == [
        ("retry_1", confluent_kafka.OFFSET_BEGINNING)
    ]


def test_after_a_failed_round_each_partition_is_read_again_from_its_first_record_not_taken():
    """A consume() whose callback raised dropped what it fetched; the tracker reads a gap as
    no work, so without the rewind those records would be committed past unseen."""
    loop = _loop()
    consumer = FakeConsumer(failures=0)
    loop.consumer = consumer  # type: ignore[assignment]
    taken = Part(("orders", 0), OffsetTracker.restore(5, None))
    for offset in (5, 6):
        assert loop.ledger.take(taken, offset)
    loop.ledger.assign(taken)
    loop.ledger.assign(Part(("orders", 1), OffsetTracker.restore(9, None)))
    loop.ledger.assign(Part(("orders", 2), OffsetTracker()))  # no commit, nothing read
    rewind(consumer, loop.ledger, loop.s.consumer_conf, "test")  # type: ignore[arg-type]
    assert sorted((s.topic, s.partition, s.offset) for s in consumer.sought) == [
        ("orders", 0, 7),
        ("orders", 1, 9),
    ]


class FakeProducer:
    """A transactional producer: ``commit_error`` fails the commit, ``abort_error`` the abort,
    ``stuck`` holds send_offsets_to_transaction past its timeout until set (librdkafka #5456,
    #5511). After a fatal error any call but flush fails the test: on the real client the
    next begin_transaction waited forever, holding the GIL (campaign seed 1)."""

    def __init__(
        self,
        name: str,
        *,
        commit_error: KafkaError | None = None,
        abort_error: KafkaError | None = None,
        stuck: threading.Event | None = None,
    ) -> None:
        self.name, self.commit_error, self.abort_error, self.stuck = (
            name,
            commit_error,
            abort_error,
            stuck,
        )
        self.calls: list[str] = []
        self.fatal: KafkaError | None = None
        self.sent: list[TopicPartition] = []
        self.commits = 0

    def _call(self, what: str) -> None:
        assert self.fatal is None, (
            f"{what} called on producer {self.name} after its fatal error {self.fatal}"
        )
        self.calls.append(what)

    def init_transactions(self, timeout: float) -> None:
        self._call("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def produce(self, *args: object, **kwargs: object) -> None:
        self._call("produce")

    def send_offsets_to_transaction(self, offsets: list, metadata: object, timeout: float) -> None:
        self._call("send_offsets")
        if self.stuck is not None:
            self.stuck.wait()  # ignores its timeout
        self.sent = offsets

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit")
        if self.commit_error is not None:
            raise KafkaException(self.commit_error)
        self.commits += 1

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort")
        if self.abort_error is not None:
            if self.abort_error.fatal():
                self.fatal = self.abort_error
            raise KafkaException(self.abort_error)

    def flush(self, timeout: float) -> int:
        return 0

    def purge(self, *args: object, **kwargs: object) -> None:
        pass


def _open_with(
    monkeypatch: pytest.MonkeyPatch, producers: list[FakeProducer]
) -> tuple[PollLoop, FakeConsumer]:
    """A loop opened on fakes (``producers`` in the order it creates them), one partition
    assigned at committed offset 7 with 7 and 8 done since."""
    consumer = FakeConsumer(failures=0)
    made = iter(producers)

    def new_client(cls: type, conf: dict, who: str) -> object:
        return consumer if cls is confluent_kafka.Consumer else next(made)

    monkeypatch.setattr(poller, "new_client", new_client)
    loop = _loop()
    loop._open()
    loop._on_assign(consumer, [TopicPartition("orders", 0)])  # type: ignore[arg-type]
    part = loop.ledger.part(("orders", 0))
    assert part is not None
    for offset in (7, 8):
        assert loop.ledger.take(part, offset)
        loop.ledger.skip(part, offset)
    return loop, consumer


def test_a_producer_whose_abort_failed_fatally_is_replaced_and_the_batch_replayed(monkeypatch):
    """Campaign seeds 1 and 2: a commit failed (abortable), its abort failed fatally
    (INVALID_TXN_STATE); the next round called begin_transaction on the dead producer, which
    never returned, holding the GIL: the whole push consumer froze until SIGKILL."""
    dead = FakeProducer(
        "first",
        commit_error=KafkaError(
            KafkaError._TIMED_OUT, "add offsets timed out", txn_requires_abort=True
        ),
        abort_error=KafkaError(
            KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True
        ),
    )
    fresh = FakeProducer("second")
    loop, consumer = _open_with(monkeypatch, [dead, fresh])
    loop._commit()
    assert dead.calls[-1] == "abort" and dead.fatal is not None
    consumer.sought.clear()
    for _ in range(3):
        loop._round()
        loop._last_commit = 0.0  # a commit every round
    # Replayed from the committed offset (7): 7 and 8 are read and processed again.
    assert [(s.topic, s.partition, s.offset) for s in consumer.sought] == [("orders", 0, 7)]
    assert fresh.calls[0] == "init"
    assert loop.ledger.counts["producer_renewals"] == 1


# A retry copy owed in the failing transaction: its produce is part of it.
OUT = OutRecord("retry_g_1", b"k", b"v", [], 1, "orders[0]@7")


@pytest.mark.parametrize(
    ("commit_error", "abort_error", "calls"),
    [
        # Timed out: librdkafka goes on with it in the background and refuses an abort
        # until the same commit is called again, so none is tried.
        (
            KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True),
            None,
            ["init", "begin", "produce", "send_offsets", "commit"],
        ),
        # Abortable, but the abort itself failed without a fatal error.
        (
            KafkaError(KafkaError._MSG_TIMED_OUT, "record timed out", txn_requires_abort=True),
            KafkaError(KafkaError._CONFLICT, "commit_transaction in progress", retriable=True),
            ["init", "begin", "produce", "send_offsets", "commit", "abort"],
        ),
    ],
    ids=["commit-timed-out", "abort-conflict"],
)
def test_a_transaction_whose_outcome_is_unknown_renews_the_producer_and_replays(
    monkeypatch, commit_error, abort_error, calls
):
    """Campaign issue 35 (every broker frozen past a call's timeout): the commit timed out,
    the abort after it failed with _CONFLICT ("a conflicting commit_transaction call is in
    progress"), and so did every round after (4,291 times): 81 records never processed."""
    first = FakeProducer("first", commit_error=commit_error, abort_error=abort_error)
    fresh = FakeProducer("second")
    loop, consumer = _open_with(monkeypatch, [first, fresh])
    loop.ledger.put_back([(loop.ledger.parts()[0], [OUT])])
    consumer.sought.clear()
    loop._commit()
    assert first.calls == calls
    for _ in range(3):
        loop._round()
        loop._last_commit = 0.0
    # Replayed from the committed offset (7) on the new producer; the first is left alone.
    assert [(s.topic, s.partition, s.offset) for s in consumer.sought] == [("orders", 0, 7)]
    assert first.calls == calls
    assert fresh.calls[0] == "init"
    assert loop.ledger.counts["producer_renewals"] == 1


def test_a_transactional_call_that_never_returns_is_abandoned_and_the_batch_replayed(monkeypatch):
    """Campaign seed 2: a transactional call of the poll thread never returned (past its
    30 s timeout, librdkafka #5456, #5511); the poll thread stayed busy until shutdown and
    1,762 records were never processed."""
    monkeypatch.setattr(poller, "WEDGED_AFTER_S", 0.2, raising=False)
    stuck = threading.Event()
    wedged, fresh = FakeProducer("first", stuck=stuck), FakeProducer("second")
    loop, consumer = _open_with(monkeypatch, [wedged, fresh])
    consumer.sought.clear()
    commit = threading.Thread(target=loop._commit, daemon=True)
    try:
        commit.start()
        commit.join(20.0)
        assert not commit.is_alive(), "the poll thread is still inside the stuck call"
        loop._round()  # reads the committed offsets again
        loop._last_commit = 0.0
    finally:
        stuck.set()  # the abandoned call returns now: nothing more may be sent on it
    commit.join(20.0)
    assert wedged.calls == ["init", "begin", "send_offsets"]
    assert [(s.topic, s.partition, s.offset) for s in consumer.sought] == [("orders", 0, 7)]
    assert fresh.calls[0] == "init"
    assert loop.ledger.counts["producer_renewals"] == 1


def test_a_partition_lost_while_paused_for_a_replay_is_consumed_again_once_reassigned(monkeypatch):
    """Campaign seed 2, long run (issue 30): the producer was re-created, so every partition
    was paused to read its committed offsets again; that read timed out, and in the same
    round the group session timed out (the partitions were lost, forgotten with their unread
    offsets). The group assigned all 35 back within a minute and held them stable for six,
    but nothing resumed them: librdkafka keeps an application's pause across unassign and
    assign (librdkafka #1849; the fake consumer keeps it too), and 3,527 records were never
    processed."""
    fatal = KafkaError(KafkaError._FATAL, "fenced", fatal=True)
    loop, consumer = _open_with(
        monkeypatch, [FakeProducer("first", commit_error=fatal), FakeProducer("second")]
    )
    tp = TopicPartition("orders", 0)
    loop._commit()  # fails fatally: the producer is re-created, the partition replayed
    assert ("orders", 0) in consumer.paused
    consumer.failures = 1
    loop._round()  # reading its committed offsets again times out
    assert loop.ledger.counts["poll_errors"] == 1
    loop._on_lost(consumer, [tp])  # the session timed out in that round's consume()
    loop._on_assign(consumer, [tp])  # and the group gave it back
    for _ in range(3):
        loop._round()
    part = loop.ledger.part(("orders", 0))
    assert part is not None and part.tracker.committable()[0] == 7
    assert [(t.topic, t.partition) for t in consumer.assigned] == [("orders", 0)]
    assert ("orders", 0) not in consumer.paused, "assigned again, but never resumed"


def test_a_held_retry_partition_revoked_and_assigned_again_is_read_again(monkeypatch):
    """The same stale pause without a fault: a retry partition held until its head is due,
    revoked by a rebalance and assigned back, was never resumed (its hold was forgotten)."""
    loop, consumer = _open_with(monkeypatch, [FakeProducer("first")])
    loop.s = PollSettings(**{**loop.s.__dict__, "retry_levels": {"retry_1": 1}})
    retry = TopicPartition("retry_1", 0)
    loop._on_assign(consumer, [retry])  # type: ignore[arg-type]
    loop._hold(consumer, ("retry_1", 0), 3, due_ms=2**62)  # type: ignore[arg-type]
    loop._on_revoke(consumer, [retry])  # type: ignore[arg-type]
    loop._on_assign(consumer, [retry])  # type: ignore[arg-type]
    loop._round()
    assert ("retry_1", 0) not in consumer.paused, "assigned again, but never resumed"


# -- a live slow FIFO call keeps its group (issue 45) ----------------------------------------
class ExpiringPool:
    """The pool's poll-thread side: a call past its deadline is settled as failed."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def expire(self, batch: Batch) -> None:
        context = ConsumeConcurrentlyContext(*batch.part.tp, 1)
        self.ledger.settle(batch, ConsumeConcurrentlyStatus.RECONSUME_LATER, context, None)


FIFO_MSG = PushMessage("orders", 0, 7, b"k", b"v", ((H.MESSAGE_GROUP, b"g"),), 0, 0)


def _fifo_call(
    monkeypatch: pytest.MonkeyPatch, producers: list[FakeProducer], deadline_s: float = 60.0
) -> tuple[PollLoop, FakeConsumer, Batch]:
    """A FIFO loop opened on fakes, orders[0] assigned at committed offset 7, and the call of
    its record at 7 (message group g) running, ``deadline_s`` from its consume timeout."""
    consumer = FakeConsumer(failures=0)
    made = iter(producers)

    def new_client(cls: type, conf: dict, who: str) -> object:
        return consumer if cls is confluent_kafka.Consumer else next(made)

    monkeypatch.setattr(poller, "new_client", new_client)
    loop = _loop()
    loop.ledger.fifo = True
    loop.pool = ExpiringPool(loop.ledger)  # type: ignore[assignment]
    loop._open()
    loop._on_assign(consumer, [TopicPartition("orders", 0)])  # type: ignore[arg-type]
    part = loop.ledger.part(("orders", 0))
    assert part is not None and part.engine is not None
    now_ms = int(time.time() * 1000)
    loop.ledger.offer(part, 7, FIFO_MSG, now_ms)
    ((_, delivery),) = loop.ledger.deliver(1, now_ms, 15 * 60 * 1000)
    batch = Batch(
        part, [FIFO_MSG], [7], [None], time.monotonic() + deadline_s, receipt=delivery.receipt
    )
    loop.ledger.open(batch)
    return loop, consumer, batch


def _ack_later(loop: PollLoop, batch: Batch, after_s: float) -> threading.Thread:
    def ack() -> None:
        time.sleep(after_s)  # the listener's work
        context = ConsumeConcurrentlyContext(*batch.part.tp, 1)
        loop.ledger.settle(batch, ConsumeConcurrentlyStatus.CONSUME_SUCCESS, context, None)

    thread = threading.Thread(target=ack, daemon=True)
    thread.start()
    return thread


def test_the_revocation_bound_is_max_poll_interval_less_its_margin():
    assert fifo_revoke_wait_s({}) == 300 - FIFO_REVOKE_MARGIN_S
    assert fifo_revoke_wait_s({"max.poll.interval.ms": "20000"}) == 10.0


def test_a_revocation_waits_for_a_running_fifo_call_and_commits_its_ack(monkeypatch):
    producer = FakeProducer("first")
    loop, consumer, batch = _fifo_call(monkeypatch, [producer])
    acker = _ack_later(loop, batch, 0.3)
    loop._on_revoke(consumer, [TopicPartition("orders", 0)])  # type: ignore[arg-type]
    acker.join(5)
    ((tp,),) = [producer.sent]
    assert (tp.topic, tp.partition, tp.offset) == ("orders", 0, 8)  # the ack went with it
    assert "rmqlease1." not in (tp.metadata or "")


def test_a_fifo_call_running_past_the_revocation_bound_keeps_its_group_to_its_deadline(
    monkeypatch,
):
    producer = FakeProducer("first")
    loop, consumer, _batch = _fifo_call(monkeypatch, [producer])
    loop._revoke_wait_s = 0.1
    loop._on_revoke(consumer, [TopicPartition("orders", 0)])  # type: ignore[arg-type]
    ((tp,),) = [producer.sent]
    now_ms = int(time.time() * 1000)
    engine = PartitionEngine.restore("orders", 0, tp.offset, tp.metadata)
    engine.offer(7, FIFO_MSG, now_ms)
    # The next owner waits for the call's own lease (15 min), not the 10 s cap.
    assert (engine.next_deadline() or 0) > now_ms + 10 * FIFO_COMMITTED_LEASE_MS


def test_a_revocation_stops_waiting_for_a_fifo_call_past_its_consume_timeout(monkeypatch):
    producer = FakeProducer("first")
    loop, consumer, batch = _fifo_call(monkeypatch, [producer], deadline_s=0.2)
    loop._on_revoke(consumer, [TopicPartition("orders", 0)])  # type: ignore[arg-type]
    assert batch.settled  # timed out: retried after the FIFO interval, committed so
    assert loop.ledger.counts["retried"] == 1


def test_a_producer_renewal_reads_a_partition_again_only_once_its_fifo_call_ended(monkeypatch):
    fatal = KafkaError(KafkaError._FATAL, "fenced", fatal=True)
    loop, consumer, batch = _fifo_call(
        monkeypatch, [FakeProducer("first", commit_error=fatal), FakeProducer("second")]
    )
    loop._commit()  # fails fatally: the producer is re-created, the partition replayed
    assert loop.ledger.counts["producer_renewals"] == 1
    for _ in range(3):
        loop._round()
    # Not adopted again while the call runs: its restored lease would hand it out again.
    assert loop.ledger.part(("orders", 0)) is None
    assert ("orders", 0) in consumer.paused
    _ack_later(loop, batch, 0).join(5)  # its outcome is ignored (the partition replays)
    loop._round()
    assert loop.ledger.part(("orders", 0)) is not None
    assert ("orders", 0) not in consumer.paused
