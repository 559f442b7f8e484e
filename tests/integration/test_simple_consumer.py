"""SimpleConsumer (RocketMQ 5's receive / ack / change_invisible_duration) on the real broker:
acked messages stay acked, an unacked one comes back after its invisible duration with its
attempt counted (to another instance once the first is gone), change_invisible_duration
extends the lease, and the DLQ after max_delivery_attempts. A plain confluent_kafka
producer and consumer are the adversary's tools."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import confluent_kafka
import pytest

from rmq_semantics import (
    AsyncProducer,
    ConfigError,
    FilterExpression,
    FilterType,
    LocalTransactionState,
    Message,
    Producer,
    ReceiptError,
    SimpleConsumer,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics.errors import IllegalStateError
from rmq_semantics.records.headers import H
from rmq_semantics.selector import java_partition
from rmq_semantics.topics import ensure_topics
from tests.group_protocol import GROUP_PROTOCOL, group_conf
from tests.integration.kafka_proxy import (
    OFFSET_COMMIT,
    OFFSET_METADATA_TOO_LARGE,
    proxied_kafka,
)
from tests.integration.txn_helpers import read_to_end, wait_for

ROOT = Path(__file__).resolve().parents[2]

# A receive's wait; receive_n tries again while the group's first join is under way.
AWAIT_S = 3.0
JOIN_S = 60.0


def produce(broker, topic: str, values: list[bytes], headers=None) -> None:
    producer = confluent_kafka.Producer(broker.conf())
    for value in values:
        producer.produce(topic, value=value, headers=headers or [])
    assert producer.flush(30) == 0


def simple(
    broker,
    group: str,
    topic: str,
    prefix: str,
    conf: dict | None = None,
    tags: str = "*",
    **settings,
) -> SimpleConsumer:
    settings.setdefault("await_duration", AWAIT_S)
    conf = group_conf(broker.conf(**{"auto.offset.reset": "earliest", **(conf or {})}))
    return SimpleConsumer(
        conf, group, {topic: FilterExpression(tags)}, topic_prefix=prefix, **settings
    )


def receive_n(consumer: SimpleConsumer, n: int, invisible_s: float) -> list:
    """``n`` messages (fewer if none come within JOIN_S)."""
    got: list = []
    deadline = time.monotonic() + JOIN_S
    while len(got) < n and time.monotonic() < deadline:
        got += consumer.receive(n - len(got), invisible_s)
    return got


def test_received_and_acked_messages_are_not_delivered_again(broker, make_topic, unique):
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"a", b"b", b"c"])
    with simple(broker, group, topic, prefix) as consumer:
        got = receive_n(consumer, 3, 30)
        assert sorted(m.body for m in got) == [b"a", b"b", b"c"]
        assert {m.delivery_attempt for m in got} == {1}
        for message in got:
            consumer.ack(message)
        with pytest.raises(ReceiptError):
            consumer.ack(got[0])  # acked already
    # A new instance of the group starts after the acks: only a newer message comes.
    produce(broker, topic, [b"d"])
    with simple(broker, group, topic, prefix) as again:
        got = receive_n(again, 1, 30) + again.receive(10, 30)
        assert [(m.body, m.delivery_attempt) for m in got] == [(b"d", 1)]


def test_an_unacked_message_comes_back_after_its_invisible_duration_with_attempt_2(
    broker, make_topic, unique
):
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"only"])
    with simple(broker, group, topic, prefix) as consumer:
        [first] = receive_n(consumer, 1, 1)
        [second] = receive_n(consumer, 1, 30)
        assert second.message_id == first.message_id
        assert (first.delivery_attempt, second.delivery_attempt) == (1, 2)
        with pytest.raises(ReceiptError, match="delivered again"):
            consumer.ack(first)
        consumer.ack(second)
        assert consumer.counts["redelivered"] == 1


def test_change_invisible_duration_extends_the_lease(broker, make_topic, unique):
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"slow"])
    with simple(broker, group, topic, prefix) as consumer:
        [message] = receive_n(consumer, 1, 1)
        extended = consumer.change_invisible_duration(message, 60)
        assert extended.invisible_until_ms > message.invisible_until_ms
        # Its first deadline (1 s) passes while this waits (AWAIT_S): it does not come back...
        assert consumer.receive(1, 30) == []
        # ...and the receipt is still the current delivery.
        consumer.ack(extended)


def test_the_async_forms_receive_extend_and_ack(broker, make_topic, unique):
    """receive_async, change_invisible_duration_async and ack_async: concurrent.futures
    Futures (RocketMQ's Python client), awaited here from asyncio with wrap_future."""
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"kept", b"dropped"])
    consumer = simple(broker, group, topic, prefix).startup()

    async def receive(n: int, invisible_s: float) -> list:
        got: list = []
        deadline = time.monotonic() + JOIN_S
        while len(got) < n and time.monotonic() < deadline:
            got += await asyncio.wrap_future(consumer.receive_async(n - len(got), invisible_s))
        return got

    async def scenario() -> None:
        first = {m.body: m for m in await receive(2, 1)}
        assert set(first) == {b"kept", b"dropped"}
        kept = await asyncio.wrap_future(
            consumer.change_invisible_duration_async(first[b"kept"], 60)
        )
        assert kept.invisible_until_ms > first[b"kept"].invisible_until_ms
        await asyncio.wrap_future(consumer.ack_async(kept))
        # "dropped" was not acked: back after its second, attempt 2; its old receipt refused.
        [again] = await receive(1, 30)
        assert (again.body, again.delivery_attempt) == (b"dropped", 2)
        with pytest.raises(ReceiptError):
            await asyncio.wrap_future(consumer.ack_async(first[b"dropped"]))
        await asyncio.wrap_future(consumer.ack_async(again))
        # Both acked: nothing comes back within await_duration.
        assert await asyncio.wrap_future(consumer.receive_async(10, 30)) == []

    try:
        with pytest.raises(ConfigError, match="max_message_num"):
            consumer.receive_async(0, 30)  # refused at the call, not in the Future
        asyncio.run(scenario())
        assert consumer.counts["acked"] == 2
    finally:
        consumer.shutdown()
    with pytest.raises(IllegalStateError, match="closed"):
        consumer.receive_async(1, 30)


def test_a_second_instance_takes_over_with_the_attempt_counted(broker, make_topic, unique):
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"x"])
    with simple(broker, group, topic, prefix) as first:
        [held] = receive_n(first, 1, 2)
    # Closed without an ack: the lease travelled in the commit, the next owner redelivers.
    with simple(broker, group, topic, prefix) as second:
        [again] = receive_n(second, 1, 30)
        assert again.message_id == held.message_id
        assert again.delivery_attempt == 2
        second.ack(again)


def test_the_dlq_after_max_delivery_attempts(broker, make_topic, unique):
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"poison"], headers=[("user", b"1")])
    with simple(broker, group, topic, prefix, max_delivery_attempts=2) as consumer:
        attempts = [m.delivery_attempt for m in receive_n(consumer, 1, 1)]
        attempts += [m.delivery_attempt for m in receive_n(consumer, 1, 1)]
        assert consumer.receive(1, 1) == []  # its third delivery is the DLQ's
        assert attempts == [1, 2]
        assert consumer.counts["dead"] == 1
        dlq = consumer.dlq_topic
    reader = confluent_kafka.Consumer(
        broker.conf(**{"group.id": unique("r"), "auto.offset.reset": "earliest"})
    )
    reader.subscribe([dlq])
    try:
        msg = None
        for _ in range(60):
            msg = reader.poll(0.5)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.value() == b"poison"
        headers = dict(msg.headers() or [])
        assert headers[H.DLQ_ORIGINAL_TOPIC] == topic.encode()
        assert headers[H.DLQ_REASON] == b"max_attempts"
        assert headers[H.DLQ_RECONSUME_TIMES] == b"1"
        assert headers["user"] == b"1"
    finally:
        reader.close()


def test_sql92_filters_system_topics_and_bad_patterns_are_refused(broker, unique):
    with pytest.raises(ConfigError, match="SQL92 filter expressions are not supported"):
        FilterExpression("a > 1", FilterType.SQL)
    prefix = unique("p")
    with pytest.raises(ConfigError):
        SimpleConsumer(broker.conf(), "g", {f"{prefix}_half": None}, topic_prefix=prefix)
    with pytest.raises(ConfigError, match=r"subscription pattern '\^\(orders'"):
        SimpleConsumer(broker.conf(), "g", {"^(orders": None}, topic_prefix=prefix)


def test_a_message_group_is_handed_out_one_at_a_time_in_order(broker, make_topic, unique):
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    producer = confluent_kafka.Producer(broker.conf())
    sent = [(g, i) for i in range(3) for g in ("order-1", "order-2")]
    for g, i in sent:
        value = f"{g}/{i}".encode()
        producer.produce(topic, value=value, headers=[(H.MESSAGE_GROUP, g.encode())])
    producer.produce(topic, value=b"free")  # no group: no order
    assert producer.flush(30) == 0
    seen: list[bytes] = []
    with simple(broker, group, topic, prefix) as consumer:
        batch = receive_n(consumer, 3, 30)
        # One head per group, and the message without a group.
        assert sorted(m.body for m in batch) == [b"free", b"order-1/0", b"order-2/0"]
        assert consumer.receive(10, 30) == []  # the heads are invisible, nothing behind them
        [status] = consumer.status().values()
        assert (status["in_flight"], status["groups"], status["commit_offset"]) == (3, 2, 0)
        while batch:
            for message in batch:
                seen.append(message.body)
                consumer.ack(message)
            batch = consumer.receive(10, 30) if len(seen) < len(sent) + 1 else []
    for g in ("order-1", "order-2"):
        assert [v for v in seen if v.startswith(g.encode())] == [
            f"{g}/{i}".encode() for i in range(3)
        ]


def test_after_a_sigkill_another_instance_gets_the_message_with_its_attempt_counted_in_order(
    broker, make_topic, unique, tmp_path
):
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"held", b"next"], headers=[(H.MESSAGE_GROUP, b"order-1")])
    result = tmp_path / "worker.jsonl"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.simple_worker",
            *("--bootstrap", broker.bootstrap, "--group", group, "--topic", topic),
            *("--prefix", prefix, "--result", str(result), "--invisible-s", "2"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: result.exists() and result.read_text().endswith("\n"),
            90,
            "the worker receiving the message",
            details=lambda: f"worker exit code {worker.poll()}",
        )
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
    held = json.loads(result.read_text())
    assert held["attempt"] == 1
    conf = {"session.timeout.ms": "6000"}
    with simple(broker, group, topic, prefix, conf=conf) as survivor:
        batch: list = []
        deadline = time.monotonic() + JOIN_S
        while not batch and time.monotonic() < deadline:
            batch = survivor.receive(10, 30)
        # The held message again, attempt 2, and nothing of its group behind it yet.
        assert [(m.message_id, m.delivery_attempt) for m in batch] == [(held["message_id"], 2)]
        survivor.ack(batch[0])
        [after] = receive_n(survivor, 1, 30)
        assert (after.body, after.delivery_attempt) == (b"next", 1)
        survivor.ack(after)


def test_an_ack_is_committed_without_another_receive(broker, make_topic, unique):
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"one"])
    # A plain client reading the group's committed offset, without joining the group.
    reader = confluent_kafka.Consumer(broker.conf(**{"group.id": group}))

    def committed() -> int:
        [tp] = reader.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=10)
        return tp.offset

    try:
        # The ack itself commits only commit_interval_ms after the receive's commit.
        with simple(broker, group, topic, prefix, commit_interval_ms=2000) as consumer:
            [message] = receive_n(consumer, 1, 60)
            assert committed() == 0  # committed before delivery: its lease, offset 0 not done
            consumer.ack(message)
            wait_for(lambda: committed() == 1, 30, "the ack's commit (the background one)")
    finally:
        reader.close()


def test_ack_async_resolves_once_a_commit_carrying_the_ack_landed(broker, make_topic, unique):
    """ack_async's future resolves only once an offset commit carrying the ack landed: a plain
    client then sees the group's committed offset past the message, so no later owner
    delivers it again. One made just before close() resolves with close's commit."""
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    produce(broker, topic, [b"one", b"two"])
    reader = confluent_kafka.Consumer(broker.conf(**{"group.id": group}))

    def committed() -> int:
        [tp] = reader.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=10)
        return tp.offset

    try:
        # The acks commit only commit_interval_ms after the receive's commit.
        consumer = simple(broker, group, topic, prefix, commit_interval_ms=2000).startup()
        try:
            first, second = receive_n(consumer, 2, 60)
            assert (first.offset, second.offset) == (0, 1)
            assert consumer.ack_async(first).result(timeout=30) is None
            assert committed() == 1  # durable: the committed offset passed it
            last = consumer.ack_async(second)
            wait_for(lambda: consumer.counts["acked"] == 2, 30, "the second ack made")
        finally:
            consumer.close()
        assert last.result(timeout=30) is None
        assert committed() == 2
    finally:
        reader.close()


def test_two_instances_share_the_partitions_and_keep_each_group_in_order(
    broker, make_topic, unique
):
    topic, group, prefix = make_topic("simple", partitions=4), unique("g"), unique("p")
    groups, per_group = [f"order-{g}" for g in range(8)], 5
    total = len(groups) * per_group
    acked: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()

    def work(consumer: SimpleConsumer) -> None:
        while not stop.is_set():
            for message in consumer.receive(8, 2):
                with lock:  # the ack and its record in one step: the order acks happened in
                    try:
                        consumer.ack(message)
                    except ReceiptError:
                        continue  # its partition moved: the new owner delivers it again
                    acked.append(message.body)

    with (
        simple(broker, group, topic, prefix, await_duration=0.5) as first,
        simple(broker, group, topic, prefix, await_duration=0.5) as second,
    ):
        # Both members hold partitions (their background polls join) before anything is sent.
        wait_for(
            lambda: (
                first.status()
                and second.status()
                and len(first.status()) + len(second.status()) == 4
            ),
            60,
            "the two instances sharing the 4 partitions",
        )
        producer = confluent_kafka.Producer(broker.conf())
        for i in range(per_group):
            for g in groups:  # a group's messages in one partition, as placement by group will do
                producer.produce(
                    topic,
                    value=f"{g}/{i}".encode(),
                    partition=groups.index(g) % 4,
                    headers=[(H.MESSAGE_GROUP, g.encode())],
                )
        assert producer.flush(30) == 0
        threads = [threading.Thread(target=work, args=(c,)) for c in (first, second)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(set(acked)) >= total, 90, "every message acked")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert first.counts["acked"] > 0 and second.counts["acked"] > 0  # both worked
    for g in groups:
        assert [v for v in acked if v.startswith(f"{g}/".encode())] == [
            f"{g}/{i}".encode() for i in range(per_group)
        ]


def test_a_partition_paused_by_back_pressure_is_read_again_when_it_comes_back(
    broker, make_topic, unique
):
    # librdkafka keeps a Consumer.pause through a revocation and a later assignment of the
    # partition to the same member: an instance that does not resume it never reads it again.
    topic, group, prefix = make_topic("simple"), unique("g"), unique("p")
    where = f"{topic}[0]"
    # Records this group's filter skips (done at once) among the ones it keeps (in flight
    # until acked), at random: the done offsets' bitmap does not compress, and some 12,000
    # records fill the commit metadata (DONE_METADATA_BYTES): back-pressure pauses the
    # partition before its end.
    rng = random.Random(36)
    tags = [b"mine"] + [rng.choice((b"mine", b"other")) for _ in range(13_999)]
    producer = confluent_kafka.Producer(broker.conf(**{"linger.ms": 5}))
    for i, tag in enumerate(tags):
        producer.produce(topic, value=b"%d" % i, headers=[(H.TAGS, tag)])
    assert producer.flush(30) == 0
    with simple(broker, group, topic, prefix, tags="mine", await_duration=0.5) as consumer:
        # Each receive reads on; the messages received are not acked.
        held: list = []
        deadline = time.monotonic() + JOIN_S
        while not consumer.status().get(where, {}).get("paused"):
            assert time.monotonic() < deadline, f"{where} never paused: {consumer.status()}"
            held += consumer.receive(1, 60)
        # Taken away (the revocation commits the leases) and given back to this instance.
        consumer.unsubscribe(topic)
        wait_for(lambda: not consumer.status(), 30, f"{where} revoked")
        consumer.subscribe(topic, "mine")
        # Read again from the commit: the first kept message not received yet comes.
        got = receive_n(consumer, 1, 60)
        held_bodies = {m.body for m in held}
        expected = next(
            b"%d" % i
            for i, tag in enumerate(tags)
            if tag == b"mine" and b"%d" % i not in held_bodies
        )
        assert [(m.body, m.delivery_attempt) for m in got] == [(expected, 1)], (
            f"{where} given back: nothing read ({consumer.status()})"
        )


def test_a_message_group_is_placed_in_one_partition_unless_placed_explicitly(
    broker, make_topic, unique
):
    """FIFO placement through the public producers: one message group, one partition, whatever
    the record keys; an explicit sharding_key or partition still wins (read back with a
    plain consumer)."""
    partitions = 4
    topic = make_topic("placed", partitions=partitions)
    group = "order-7"
    sent = []
    with Producer(broker.conf()) as producer:
        for i in range(8):  # eight different keys, one group
            msg = Message(topic, f"step-{i}".encode(), key=f"line-{i}", message_group=group)
            sent.append(producer.send(msg))
        by_key = producer.send(
            Message(topic, b"sharded", key="x", message_group=group), sharding_key="customer-1"
        )
        pinned = producer.send(Message(topic, b"pinned", message_group=group, partition=0))

    async def send_async() -> list:
        async with AsyncProducer(broker.conf()) as aio:
            return [
                await aio.send(Message(topic, f"async-{i}".encode(), message_group=group))
                for i in range(3)
            ]

    sent += asyncio.run(send_async())
    records = read_to_end(broker.conf(), topic, partitions)
    where = {r.value(): r.partition() for r in records}
    group_partition = java_partition(group.encode(), partitions)
    grouped = [v for v in where if v.startswith((b"step-", b"async-"))]
    assert len(grouped) == 11
    assert {where[v] for v in grouped} == {group_partition}
    assert {s.partition for s in sent} == {group_partition}
    in_partition = [r.value() for r in records if r.partition() == group_partition]
    assert [v for v in in_partition if v in grouped] == [
        *(f"step-{i}".encode() for i in range(8)),
        *(f"async-{i}".encode() for i in range(3)),
    ]
    assert where[b"sharded"] == by_key.partition == java_partition(b"customer-1", partitions)
    assert where[b"pinned"] == pinned.partition == 0


def test_a_pattern_subscription_leaves_system_topics_out_and_keeps_its_tag_filter(broker, unique):
    """``^<prefix>.*`` matches the business topic and the system ones (the half topic with an
    undecided transaction's half message, the group's DLQ): only the business topic's
    records that pass the pattern's tag filter are handed out."""
    prefix = unique("sp").replace("-", "")
    topic = f"{prefix}biz"
    ensure_topics(broker.conf(), {topic: (1, {})})

    class Undecided(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, msg):
            return LocalTransactionState.UNKNOW

    with TransactionProducer(
        broker.conf(), producer_group=unique("pg"), listener=Undecided(), topic_prefix=prefix
    ) as txn:
        result = txn.send_message_in_transaction(Message(topic, b"half", tags="keep"))
        assert result.local_transaction_state is LocalTransactionState.UNKNOW
    with Producer(broker.conf()) as producer:
        producer.send(Message(topic, b"kept", tags="keep"))
        producer.send(Message(topic, b"dropped", tags="other"))
    pattern = f"^{prefix}.*"
    conf = group_conf(broker.conf(**{"auto.offset.reset": "earliest"}))
    consumer = SimpleConsumer(
        conf,
        unique("g"),
        {pattern: FilterExpression("keep")},
        topic_prefix=prefix,
        await_duration=AWAIT_S,
    )
    with consumer.startup():
        got = receive_n(consumer, 1, 30)
        wait_for(lambda: consumer.skipped_system_partitions, 30, "the system partitions left out")
        got += consumer.receive(10, 30)  # anything else there is comes within AWAIT_S
        assert [(m.topic, m.body) for m in got] == [(topic, b"kept")]
        assert [where for where in consumer.status() if not where.startswith(f"{topic}[")] == []
        assert consumer.counts["skipped"] == 1
        consumer.ack(got[0])


def _worker(broker, group: str, topic: str, prefix: str, log: Path, *extra: str):
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "tests.integration.simple_worker", "--work", "--result", str(log)),
            *("--bootstrap", broker.bootstrap, "--group", group, "--topic", topic),
            *("--prefix", prefix, "--invisible-s", "5", *extra),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )


def _events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _groups_per_partition(partitions: int, per_partition: int) -> list[str]:
    """Message group names that Producer.send places ``per_partition`` to a partition."""
    placed: dict[int, list[str]] = {p: [] for p in range(partitions)}
    n = 0
    while any(len(names) < per_partition for names in placed.values()):
        name = f"order-{n}"
        names = placed[java_partition(name.encode(), partitions)]
        if len(names) < per_partition:
            names.append(name)
        n += 1
    return [name for p in range(partitions) for name in placed[p]]


def test_fifo_per_group_holds_across_two_processes_and_a_sigkill(
    broker, make_topic, unique, tmp_path
):
    """Two SimpleConsumer processes share 4 partitions of 16 message groups x 25 messages;
    one is SIGKILLed holding messages (and with acks it has not committed yet: its
    commit_interval_ms is a minute, so its last batch's acks travel with no commit); the
    other finishes. Per group: messages are first acked in send order, none is received
    before every earlier one was acked, and the killed instance's last batch comes again with
    its attempt counted."""
    topic, group, prefix = make_topic("simple", partitions=4), unique("g"), unique("p")
    groups, per_group = _groups_per_partition(4, 4), 25
    victim_log, survivor_log = tmp_path / "victim.jsonl", tmp_path / "survivor.jsonl"
    # The victim's acks go with its receives' commits only (commit_interval_ms: a minute).
    slow_commits = ("--hold-after", "30", "--commit-interval-ms", "60000")
    victim = _worker(broker, group, topic, prefix, victim_log, *slow_commits)
    survivor = _worker(broker, group, topic, prefix, survivor_log)

    def parts(log: Path) -> list[str]:
        return next((e["parts"] for e in reversed(_events(log)) if e["e"] == "parts"), [])

    def acked() -> set[str]:
        logs = (victim_log, survivor_log)
        return {e["body"] for log in logs for e in _events(log) if e["e"] == "ack"}

    try:
        # Both hold partitions before anything is sent: no rebalance until the kill.
        wait_for(
            lambda: (
                parts(victim_log)
                and parts(survivor_log)
                and len(parts(victim_log) + parts(survivor_log)) == 4
            ),
            JOIN_S,
            "the two instances sharing the 4 partitions",
            details=lambda: f"exit codes {victim.poll()}, {survivor.poll()}",
        )
        with Producer(broker.conf(**{"linger.ms": 0})) as producer:
            for i in range(per_group):
                for g in groups:
                    producer.send(Message(topic, f"{g}/{i}".encode(), message_group=g))
        wait_for(
            lambda: any(e["e"] == "holding" for e in _events(victim_log)),
            JOIN_S,
            "the victim holding its last batch",
            details=lambda: f"victim exit code {victim.poll()}",
        )
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        wait_for(
            lambda: len(acked()) == len(groups) * per_group,
            JOIN_S,
            "every message acked",
            details=lambda: f"{len(acked())} acked; survivor exit code {survivor.poll()}",
        )
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(30) == 0
    finally:
        for process in (victim, survivor):
            if process.poll() is None:
                process.kill()
                process.wait(30)

    victim_events, survivor_events = _events(victim_log), _events(survivor_log)
    # The victim's last batch: received after its last commit (the receive's), so neither the
    # held messages nor the ones it acked after that receive are committed as done.
    last = max(i for i, e in enumerate(victim_events) if e["e"] == "batch")
    last_batch = {e["body"] for e in victim_events[last:] if e["e"] == "recv"}
    acked_late = {e["body"] for e in victim_events[last:] if e["e"] == "ack"}
    held = last_batch - acked_late
    assert held and acked_late
    events = sorted(
        [("victim", e) for e in victim_events] + [("survivor", e) for e in survivor_events],
        key=lambda pair: pair[1]["t"],
    )
    for g in groups:
        sent = [f"{g}/{i}" for i in range(per_group)]
        mine = [(who, e) for who, e in events if e.get("body", "").startswith(f"{g}/")]
        order = [e["body"] for _, e in mine if e["e"] == "ack"]
        assert list(dict.fromkeys(order)) == sent, f"{g}: first acked out of send order"
        acked_by: dict[str, str] = {}  # message -> the instance that acked it first
        attempts: dict[str, int] = {}
        for who, e in mine:
            body = e["body"]
            if e["e"] == "ack":
                acked_by.setdefault(body, who)
                continue
            if e["e"] != "recv":
                continue
            assert e["attempt"] > attempts.get(body, 0), f"{g}: {body} attempts {e}"
            attempts[body] = e["attempt"]
            earlier = sent[: sent.index(body)]
            missing = [m for m in earlier if m not in acked_by]
            assert not missing, f"{g}: {body} received by {who} before {missing} were acked"
            if body in acked_by:  # acked once already: only the victim's uncommitted acks
                assert (who, acked_by[body]) == ("survivor", "victim") and body in acked_late, (
                    f"{g}: {body} received again by {who} after {acked_by[body]} acked it"
                )
        # What the survivor got of the group (the victim's late acks again among it) came
        # in send order.
        taken = [e["body"] for who, e in mine if who == "survivor" and e["e"] == "recv"]
        assert list(dict.fromkeys(taken)) == sorted(set(taken), key=sent.index), g
    again: dict[str, int] = {}
    for e in survivor_events:
        if e["e"] == "recv" and e["body"] in last_batch:
            again.setdefault(e["body"], e["attempt"])
    # Every message of the victim's last batch comes again, attempt 2: the lease travelled.
    assert again == dict.fromkeys(last_batch, 2)


# -- commits that fail (issue 45) ---------------------------------------------------------------
def test_a_message_whose_delivering_commits_failed_is_never_dead_lettered_undelivered(
    tmp_path, unique
):
    """A receive commits before it hands out: while the group coordinator refuses every offset
    commit, nothing is delivered, and no attempt is spent, so more failed rounds than
    ``max_delivery_attempts`` leave the message for its first real delivery, not the DLQ."""
    with proxied_kafka(tmp_path / "kafka", OFFSET_COMMIT, error_code=OFFSET_METADATA_TOO_LARGE) as (
        kafka,
        hold,
    ):
        conf = {**kafka.client_conf(), "auto.offset.reset": "earliest"}
        topic, group, prefix = unique("simple"), unique("g"), unique("p")
        ensure_topics(conf, {topic: (1, {})})
        consumer = SimpleConsumer(
            group_conf(conf),
            group,
            {topic: FilterExpression("*")},
            topic_prefix=prefix,
            await_duration=AWAIT_S,
            max_delivery_attempts=2,
        )
        with consumer:
            consumer.receive(1, 1)
            wait_for(consumer.status, JOIN_S, "the partition to be assigned")
            producer = confluent_kafka.Producer(kafka.client_conf())
            producer.produce(topic, value=b"never-delivered-yet")
            assert producer.flush(30) == 0
            hold.arm()
            # Each receive tries again for AWAIT_S: past the 1 s invisible duration and
            # max_delivery_attempts of refused commits.
            for _ in range(3):
                assert consumer.receive(1, 1) == [], "handed out without its commit"
            assert hold.held > 2, f"{hold.held} commits refused"
            assert consumer.counts["dead"] == 0, "dead-lettered, never delivered"
            hold.disarm()
            got = receive_n(consumer, 1, 30)
            assert [(m.body, m.delivery_attempt) for m in got] == [(b"never-delivered-yet", 1)]


# -- a dead instance (issue 45) -----------------------------------------------------------------
#: With the classic protocol, a SIGKILLed instance's partitions reach a live instance of the
#: group within this long by default (docs/guides/simple-consumer.md, "A dead instance").
DEAD_INSTANCE_BOUND_S = 15.0


@pytest.mark.skipif(GROUP_PROTOCOL != "classic", reason="the broker's session timeout bounds it")
def test_a_sigkilled_instance_s_partitions_are_served_again_within_the_bound_by_default(
    broker, make_topic, unique, tmp_path
):
    """Both instances with the SimpleConsumer's defaults (no session.timeout.ms given): a
    survivor that joined before the kill gets the dead instance's partition, and a message
    sent after the kill, within the bound, not after the group's 45 s session timeout."""
    topic, group, prefix = make_topic("simple", partitions=2), unique("g"), unique("p")
    result = tmp_path / "worker.jsonl"
    worker = subprocess.Popen(
        [
            sys.executable,
            *("-m", "tests.integration.simple_worker", "--session-timeout-ms", ""),
            *("--bootstrap", broker.bootstrap, "--group", group, "--topic", topic),
            *("--prefix", prefix, "--result", str(result), "--invisible-s", "1"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        with simple(broker, group, topic, prefix) as survivor:
            # The survivor joins; the worker holds one partition, then gets its message.
            wait_for(
                lambda: survivor.receive(1, 1) == [] and len(survivor.status()) == 1,
                JOIN_S,
                "the two instances to share the partitions",
            )
            [mine] = survivor.status()  # "topic[p]": the worker holds the other one
            held_partition = 1 - int(mine.rsplit("[", 1)[1].rstrip("]"))
            producer = confluent_kafka.Producer(broker.conf())
            producer.produce(topic, value=b"held", partition=held_partition)
            assert producer.flush(30) == 0
            wait_for(
                lambda: result.exists() and result.read_text().endswith("\n"),
                JOIN_S,
                "the worker receiving the message",
                details=lambda: f"worker exit code {worker.poll()}",
            )
            worker.send_signal(signal.SIGKILL)
            worker.wait(30)
            killed = time.monotonic()
            got: list = []
            while not got and time.monotonic() - killed < DEAD_INSTANCE_BOUND_S:
                got = survivor.receive(1, 30)
            assert [(m.body, m.delivery_attempt) for m in got] == [(b"held", 2)], (
                f"nothing of the dead instance's partition within {DEAD_INSTANCE_BOUND_S} s"
            )
            survivor.ack(got[0])
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.wait(30)
