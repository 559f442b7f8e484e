"""Key-ordered consumption (``OrderlyConsumer(ordering="key")``) on a real broker: per-key
offset order with keys in parallel, never one key in two calls at once, a suspended key
that does not hold up the others, the DLQ keeping a key's later order, a restart that
neither redoes done records (carried in the commit metadata) nor skips unfinished ones,
consumers joining and leaving, and an ``async def`` listener on one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition

from coordinator.settings import CoordinatorSettings
from rmq_semantics import Producer
from rmq_semantics.orderly import (
    DLQ_ORIGINAL_OFFSET,
    DLQ_RECONSUME_TIMES,
    ConsumeOrderlyStatus,
    OrderlyConsumer,
)
from rmq_semantics.records.headers import H
from rmq_semantics.topics import SystemTopics
from tests.integration.test_orderly import (
    LEASE_MS,
    RENEW_MS,
    LockServiceRunner,
    committed,
    end_offsets,
    read_all,
    start_consumer,
    wait_for,
)

pytestmark = pytest.mark.integration

SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
# A listener blocked on purpose gives up after this long (and the test then fails).
BLOCK_TIMEOUT_S = 30.0


@contextlib.contextmanager
def lock_service_of(broker, unique) -> Iterator[LockServiceRunner]:
    """A lock service of its own prefix, in a background thread."""
    runner = LockServiceRunner(
        broker.conf(),
        CoordinatorSettings(
            topic_prefix=unique("rmqk").replace("-", ""),
            lock_lease_ms=LEASE_MS,
            lock_renew_ms=RENEW_MS,
            half_partitions=2,
        ),
    )
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()


@pytest.fixture
def locks(broker, unique):
    with lock_service_of(broker, unique) as runner:
        yield runner


def ordering_key_of(m) -> tuple:
    """The test's own reading of the contract: the message group, else the key, else the
    partition (each scoped to its partition)."""
    group = dict(m.headers).get(H.MESSAGE_GROUP)
    if group:
        return m.partition, "g", group
    if m.key is not None:
        return m.partition, "k", m.key
    return m.partition, "p", None


@dataclass(frozen=True)
class Call:
    consumer: str
    key: tuple
    partition: int
    offsets: tuple[int, ...]
    values: tuple[str, ...]
    epoch: int
    reconsume: int
    thread: int


class KeyJournal:
    """Every listener call (at its start), and any key seen in two calls at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[Call] = []
        self.active: set[tuple] = set()
        self.overlaps: list[tuple] = []
        self.mixed: list[list[int]] = []  # calls whose messages had more than one key
        self.most_active = 0

    def enter(self, name: str, msgs, context) -> tuple:
        keys = {ordering_key_of(m) for m in msgs}
        key = ordering_key_of(msgs[0])
        call = Call(
            name,
            key,
            msgs[0].partition,
            tuple(m.offset for m in msgs),
            tuple((m.value or b"").decode() for m in msgs),
            context.lock_epoch,
            msgs[0].reconsume_times,
            threading.get_ident(),
        )
        with self._lock:
            if len(keys) > 1:
                self.mixed.append(list(call.offsets))
            if key in self.active:
                self.overlaps.append((name, key, call.offsets))
            self.active.add(key)
            self.most_active = max(self.most_active, len(self.active))
            self.calls.append(call)
        return key

    def leave(self, key: tuple) -> None:
        with self._lock:
            self.active.discard(key)

    def listener(self, name: str, decide=None):
        """A sync listener; ``decide(msgs, context)`` (optional) returns the status."""

        def listen(msgs, context):
            key = self.enter(name, msgs, context)
            try:
                return decide(msgs, context) if decide else SUCCESS
            finally:
                self.leave(key)

        return listen

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def done_values(self) -> set[str]:
        return {v for c in self.snapshot() for v in c.values}

    def per_key(self) -> dict[tuple, list[Call]]:
        out: dict[tuple, list[Call]] = defaultdict(list)
        for call in self.snapshot():
            out[call.key].append(call)
        return out


def produce_records(broker, topic: str, records: list[tuple]) -> None:
    """(partition, key, value, message group or None) in order."""
    with Producer(broker.conf()) as producer:
        for partition, key, value, group in records:
            headers = [(H.MESSAGE_GROUP, group.encode())] if group else None
            producer.produce(
                topic,
                value.encode(),
                key=key.encode() if key else None,
                partition=partition,
                headers=headers,
            )
        assert producer.flush(30) == 0


def expected_offsets(broker, topic: str, partitions: int) -> dict[tuple, list[int]]:
    """Per ordering key, its offsets as written (read back from the topic)."""
    out: dict[tuple, list[int]] = defaultdict(list)
    for m in read_all(broker, topic, partitions):
        headers = dict(m.headers() or [])
        view = type(
            "M", (), {"headers": headers.items(), "key": m.key(), "partition": m.partition()}
        )
        out[ordering_key_of(view)].append(m.offset())
    return out


def committed_metadata(broker, group: str, topic: str, partition: int) -> TopicPartition:
    consumer = confluent_kafka.Consumer(broker.conf(**{"group.id": group}))
    try:
        [tp] = consumer.committed([TopicPartition(topic, partition)], timeout=10)
        return tp
    finally:
        consumer.close()


def offsets_in_call_order(calls: list[Call]) -> list[int]:
    return [o for c in calls for o in c.offsets]


def key_consumer(broker, group, topic, service, listener, name, **kwargs) -> OrderlyConsumer:
    return start_consumer(
        broker, group, topic, service.prefix, listener, name, ordering="key", **kwargs
    )


# -- order per key, exclusivity per key, batches of one key --------------------------------
def test_each_key_is_processed_in_offset_order_one_call_at_a_time_with_keys_in_parallel(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("keys", partitions=2), unique("g")
    records = []
    for i in range(300):
        partition, n = i % 2, i // 2
        if n % 7 == 3:  # a message group overrides the record key
            records.append((partition, f"k{n % 5}", f"v{i}", f"grp{n % 3}"))
        elif n % 11 == 5:  # neither: ordered by the partition alone
            records.append((partition, None, f"v{i}", None))
        else:
            records.append((partition, f"k{n // 2 % 12}", f"v{i}", None))  # runs of two
    produce_records(broker, topic, records)
    journal = KeyJournal()

    def work(msgs, context):
        time.sleep(0.002 * (msgs[0].offset % 3))  # simulated work of varying length
        return SUCCESS

    consumer = key_consumer(
        broker, group, topic, service, journal.listener("c", work), "c", max_workers=8, batch_size=3
    )
    try:
        wait_for(lambda: len(journal.done_values()) == 300, 90, "all 300 records")
        ends = end_offsets(broker, topic, 2)
        wait_for(lambda: committed(broker, group, topic, 2) == ends, 60, "the last commits")
        status = consumer.status()
    finally:
        consumer.shutdown()

    assert journal.overlaps == []
    assert journal.mixed == []
    expected = expected_offsets(broker, topic, 2)
    got = {key: offsets_in_call_order(calls) for key, calls in journal.per_key().items()}
    assert got == expected  # each key: every offset once, in offset order
    assert journal.most_active > 1  # keys did run side by side
    assert any(len(c.offsets) > 1 for c in journal.snapshot())  # batches of one key
    assert {tp[1]: (s.offset_gap, s.in_flight, s.back_pressure) for tp, s in status.items()} == {
        0: (0, 0, False),
        1: (0, 0, False),
    }


# -- a blocked key does not hold up another; the gap travels in the commit metadata --------
def test_a_blocked_key_lets_later_keys_finish_and_commits_their_offsets_as_metadata(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("parallel"), unique("g")
    produce_records(
        broker,
        topic,
        [(0, "A", "A0", None), (0, "A", "A1", None), (0, "B", "B0", None), (0, "B", "B1", None)],
    )
    journal = KeyJournal()
    b_done, release = threading.Event(), threading.Event()
    waited: list[bool] = []

    def decide(msgs, context):
        value = msgs[0].value
        if value == b"A0":
            # In partition order this would wait forever: B comes after A.
            waited.append(b_done.wait(BLOCK_TIMEOUT_S) and release.wait(BLOCK_TIMEOUT_S))
        if value == b"B1":
            b_done.set()
        return SUCCESS

    consumer = key_consumer(
        broker, group, topic, service, journal.listener("c", decide), "c", max_workers=4
    )
    try:
        wait_for(b_done.is_set, 60, "key B to finish while key A is blocked")
        tp = wait_for(
            lambda: (lambda t: t if t.metadata and t.offset == 0 else None)(
                committed_metadata(broker, group, topic, 0)
            ),
            30,
            "a commit at A0's offset with B's offsets done in its metadata",
        )
        status = consumer.status()[(topic, 0)]
        release.set()
        wait_for(lambda: committed(broker, group, topic, 1) == {0: 4}, 60, "everything done")
    finally:
        release.set()
        consumer.shutdown()

    assert waited == [True]
    assert tp.metadata.startswith("rmqdone1.0.") and tp.metadata.endswith(
        f"|{consumer.client_id}:{status.epoch}"
    )
    assert (status.in_flight_keys, status.in_flight, status.offset_gap) == (1, 1, 4)
    assert [c.values for c in journal.snapshot()] == [("A0",), ("B0",), ("B1",), ("A1",)]


# -- SUSPEND delays one key only; a restart skips done records, redoes the rest ------------
def test_a_suspending_key_never_stops_the_others_and_a_restart_redoes_only_what_was_not_done(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("suspend-keys"), unique("g")
    records = [(0, "stuck", "stuck-0", None)]
    for i in range(120):
        records.append((0, f"k{i % 6}", f"v{i}", None))
        if i % 40 == 39:
            records.append((0, "stuck", f"stuck-{i // 40 + 1}", None))
    produce_records(broker, topic, records)
    others = {v for _, k, v, _ in records if k != "stuck"}
    journal = KeyJournal()

    def stuck(msgs, context):
        context.suspend_ms = 20
        return SUSPEND if msgs[0].key == b"stuck" else SUCCESS

    first = key_consumer(
        broker,
        group,
        topic,
        service,
        journal.listener("first", stuck),
        "first",
        max_workers=4,
        max_reconsume_times=-1,
    )
    try:
        wait_for(
            lambda: others <= journal.done_values(),
            60,
            "every other key to finish while 'stuck' keeps suspending",
        )
        wait_for(
            lambda: sum(c.values == ("stuck-0",) for c in journal.snapshot()) >= 5,
            30,
            "'stuck' to be retried",
        )
        status = consumer_status = first.status()[(topic, 0)]
    finally:
        first.shutdown()
    tp = committed_metadata(broker, group, topic, 0)

    # The stuck key never went past its first record; the others each ran once, in order.
    stuck_calls = [c for c in journal.snapshot() if c.key[2] == b"stuck"]
    assert {c.values for c in stuck_calls} == {("stuck-0",)}
    assert [c.reconsume for c in stuck_calls] == list(range(len(stuck_calls)))
    assert consumer_status.suspended and status.offset_gap == len(records) - 1
    assert tp.offset == 0 and tp.metadata.startswith("rmqdone1.0.")

    # A new consumer of the group: only the stuck key's records, in order, nothing else.
    second_journal = KeyJournal()
    second = key_consumer(
        broker, group, topic, service, second_journal.listener("second"), "second"
    )
    try:
        wait_for(
            lambda: committed(broker, group, topic, 1) == {0: len(records)},
            60,
            "the second consumer to finish the stuck key",
        )
    finally:
        second.shutdown()
    assert [c.values for c in second_journal.snapshot()] == [(f"stuck-{i}",) for i in range(4)]
    assert journal.overlaps == second_journal.overlaps == []


# -- the DLQ after max_reconsume_times; the key's later records keep their order -----------
def test_a_poison_record_goes_to_the_dlq_and_its_key_goes_on_in_order(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("dlq-keys"), unique("g")
    produce_records(
        broker,
        topic,
        [
            (0, "P", "P0", None),
            (0, "Q", "Q0", None),
            (0, "P", "poison", None),
            (0, "Q", "Q1", None),
            (0, "P", "P2", None),
            (0, "P", "P3", None),
            (0, "Q", "Q2", None),
        ],
    )
    journal = KeyJournal()

    def decide(msgs, context):
        context.suspend_ms = 20
        return SUSPEND if msgs[0].value == b"poison" else SUCCESS

    consumer = key_consumer(
        broker, group, topic, service, journal.listener("c", decide), "c", max_reconsume_times=2
    )
    try:
        wait_for(
            lambda: committed(broker, group, topic, 1) == {0: 7},
            60,
            "every record consumed or dead-lettered",
        )
    finally:
        consumer.shutdown()

    per_key = journal.per_key()
    assert [(c.values[0], c.reconsume) for c in per_key[(0, "k", b"P")]] == [
        ("P0", 0),
        ("poison", 0),
        ("poison", 1),
        ("poison", 2),
        ("P2", 0),
        ("P3", 0),
    ]
    assert [c.values[0] for c in per_key[(0, "k", b"Q")]] == ["Q0", "Q1", "Q2"]
    [dead] = read_all(broker, SystemTopics(service.prefix).dlq(group), 1)
    headers = dict(dead.headers())
    assert (
        dead.key(),
        dead.value(),
        headers[DLQ_ORIGINAL_OFFSET],
        headers[DLQ_RECONSUME_TIMES],
    ) == (b"P", b"poison", b"2", b"2")


# -- consumers join and leave: per-key order, never two consumers on one key ---------------
def test_consumers_joining_and_leaving_keep_each_keys_order_and_never_share_a_key(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("keys-rebalance", partitions=4), unique("g")
    journal = KeyJournal()
    sent = 0

    def send(n: int) -> None:
        nonlocal sent
        produce_records(
            broker, topic, [(i % 4, f"k{i % 17}", f"v{i}", None) for i in range(sent, sent + n)]
        )
        sent += n

    def work(msgs, context):
        time.sleep(0.003)  # simulated work
        return SUCCESS

    consumers: dict[str, OrderlyConsumer] = {}

    def join(name: str) -> None:
        consumers[name] = key_consumer(
            broker, group, topic, service, journal.listener(name, work), name, max_workers=6
        )

    try:
        join("c1")
        send(200)
        wait_for(lambda: len(journal.done_values()) >= 60, 60, "c1 to get going")
        join("c2")
        send(200)
        wait_for(lambda: len(journal.done_values()) >= 250, 60, "progress after c2 joined")
        consumers.pop("c1").shutdown()  # its partitions move; in-flight work commits
        send(200)
        wait_for(lambda: len(journal.done_values()) == 600, 90, "all 600 records")
        ends = end_offsets(broker, topic, 4)
        wait_for(lambda: committed(broker, group, topic, 4) == ends, 60, "the last commits")
    finally:
        for consumer in consumers.values():
            consumer.shutdown()

    assert journal.overlaps == []
    expected = expected_offsets(broker, topic, 4)
    for key, calls in journal.per_key().items():
        seen = [(o, c.epoch) for c in calls for o in c.offsets]
        # Offset order; a step back only when a new lock epoch replays from the commit.
        for (before, epoch_before), (after, epoch) in itertools.pairwise(seen):
            assert after > before or epoch > epoch_before, (key, seen)
        assert sorted({o for o, _ in seen}) == expected[key]
    assert {c.consumer for c in journal.snapshot()} == {"c1", "c2"}


# -- async def listeners: one event loop, keys in flight together ---------------------------
def test_an_async_listener_runs_keys_concurrently_on_one_event_loop(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("async-keys"), unique("g")
    records = [(0, "A", "A0", None)] + [(0, f"k{i % 4}", f"v{i}", None) for i in range(40)]
    records += [(0, "A", "A1", None), (0, None, "last", "B")]
    produce_records(broker, topic, records)
    journal = KeyJournal()
    waited: list[bool] = []
    b_seen: dict[str, asyncio.Event] = {}

    async def listener(msgs, context):
        key = journal.enter("async", msgs, context)
        try:
            event = b_seen.setdefault("B", asyncio.Event())  # on the consumer's loop
            if msgs[0].value == b"A0":
                try:
                    await asyncio.wait_for(event.wait(), BLOCK_TIMEOUT_S)
                    waited.append(True)
                except TimeoutError:
                    waited.append(False)
            elif msgs[0].value == b"last":
                event.set()
            await asyncio.sleep(0.001)
            return SUCCESS
        finally:
            journal.leave(key)

    consumer = key_consumer(broker, group, topic, service, listener, "async", max_workers=4)
    try:
        wait_for(
            lambda: committed(broker, group, topic, 1) == {0: len(records)},
            60,
            "every record through the async listener",
        )
    finally:
        consumer.shutdown()

    assert waited == [True]
    assert journal.overlaps == []
    assert len({c.thread for c in journal.snapshot()}) == 1  # one event loop thread
    expected = expected_offsets(broker, topic, 1)
    assert {k: offsets_in_call_order(c) for k, c in journal.per_key().items()} == expected


# -- consume_timeout_ms: a hanging key is cancelled, retried, parked; the others go on ------
def test_a_hanging_async_key_times_out_into_the_dlq_while_the_other_keys_finish(
    broker, make_topic, unique, locks
):
    service = locks
    topic, group = make_topic("hang-keys"), unique("g")
    records = [(0, "H", "hang", None)] + [(0, f"k{i % 4}", f"v{i}", None) for i in range(40)]
    records += [(0, "H", "H1", None)]
    produce_records(broker, topic, records)
    journal = KeyJournal()
    cancelled: list[str] = []

    async def listener(msgs, context):
        key = journal.enter("async", msgs, context)
        context.suspend_ms = 20
        try:
            if msgs[0].value == b"hang":
                await asyncio.Event().wait()  # never set: only the timeout ends this call
            return SUCCESS
        except asyncio.CancelledError:
            cancelled.append(msgs[0].value.decode())
            raise
        finally:
            journal.leave(key)

    consumer = key_consumer(
        broker,
        group,
        topic,
        service,
        listener,
        "async",
        max_workers=4,
        consume_timeout_ms=300,
        max_reconsume_times=1,
    )
    try:
        wait_for(
            lambda: committed(broker, group, topic, 1) == {0: len(records)},
            60,
            "every record consumed or dead-lettered",
        )
    finally:
        consumer.shutdown()

    assert cancelled == ["hang", "hang"]
    per_key = journal.per_key()
    assert [(c.values[0], c.reconsume) for c in per_key[(0, "k", b"H")]] == [
        ("hang", 0),
        ("hang", 1),
        ("H1", 0),
    ]
    assert {v for c in journal.snapshot() for v in c.values} == {v for *_, v, _ in records}
    [dead] = read_all(broker, SystemTopics(service.prefix).dlq(group), 1)
    assert (dead.value(), dict(dead.headers())[DLQ_RECONSUME_TIMES]) == (b"hang", b"1")
