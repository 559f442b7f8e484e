"""The coordinator image as a sidecar container (issue 14): the TransactionProducer in this
process reaches the Kafka container through its published loopback port, the coordinator
container reaches it as kafka:9092 on their shared network. Each test counts the
read_committed records by id, so a lost or a duplicated message fails it."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.topics import ensure_topics
from tests.containers.coordinator_container import CoordinatorContainer, OtlpReceiverContainer
from tests.integration.txn_helpers import FAST, ScriptedListener, TopicReader, read_to_end

pytestmark = pytest.mark.containers
GRACE_S = 30


def _names(stem: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"{stem}{tag}", f"{stem}-{tag}"


def _coordinator(
    stack, name: str, prefix: str, env: dict[str, str] | None = None, **settings: object
) -> CoordinatorContainer:
    return CoordinatorContainer(
        stack.network,
        stack.kafka_inside,
        name,
        env=env,
        topic_prefix=prefix,
        **{**FAST, **settings},
    )


def _topic(stack, stem: str, partitions: int) -> str:
    topic = f"{stem}-{uuid.uuid4().hex[:8]}"
    ensure_topics(stack.conf(), {topic: (partitions, {})})
    return topic


def _producer(stack, prefix: str, listener) -> TransactionProducer:
    return TransactionProducer(
        stack.conf(),
        producer_group=f"pg-{uuid.uuid4().hex[:8]}",
        listener=listener,
        topic_prefix=prefix,
        half_partitions=FAST["half_partitions"],
    )


def _send(producer, messages: list) -> threading.Thread:
    sender = threading.Thread(
        target=lambda: [producer.send_message_in_transaction(m) for m in messages], daemon=True
    )
    sender.start()
    return sender


def _exactly_once(records: list, expected: set[bytes]) -> None:
    counts = Counter(m.value() for m in records)
    duplicated = sorted(v for v, n in counts.items() if n > 1)[:5]
    assert not duplicated, f"duplicated: {duplicated}"
    assert set(counts) == expected, (
        f"lost {len(expected - set(counts))}, unexpected {len(set(counts) - expected)}"
    )


def _traceparent(i: int) -> str:
    # What the application's own instrumentation would have put on message i.
    return f"00-{i + 1:032x}-{i + 1:016x}-01"


def test_commit_rollback_and_back_check_through_the_coordinator_container(stack, announce):
    prefix, name = _names("cc")
    topic = _topic(stack, "matrix", 2)
    # m-0: COMMIT, m-1: ROLLBACK, m-2: UNKNOW then checked COMMIT, m-3: UNKNOW then ROLLBACK.
    inline = {0: S.COMMIT_MESSAGE, 1: S.ROLLBACK_MESSAGE, 2: S.UNKNOW, 3: S.UNKNOW}
    checked = {2: S.COMMIT_MESSAGE, 3: S.ROLLBACK_MESSAGE}
    listener = ScriptedListener(
        lambda v: inline[int(v.split(b"-")[1]) % 4],
        lambda v: checked.get(int(v.split(b"-")[1]) % 4, S.UNKNOW),
    )
    # The image's [otel] extra: OTEL_* variables alone send its promote spans to a receiver.
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{name}-otlp:4318",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_SERVICE_NAME": name,
    }
    with (
        OtlpReceiverContainer(stack.network, f"{name}-otlp") as receiver,
        _coordinator(stack, name, prefix, env=otel, instance_id=name) as coordinator,
    ):
        receiver.wait_log("receiver listening")
        coordinator.wait_healthy()
        log = coordinator.wait_log(rf"transaction service {name} running")
        announce(f"\ncoordinator: container {name} ({coordinator.container.image}), healthy")
        with _producer(stack, prefix, listener) as producer:
            for i in range(40):
                producer.send_message_in_transaction(
                    Message(
                        topic,
                        f"m-{i}".encode(),
                        key=f"k{i}",
                        headers={"traceparent": _traceparent(i)},
                    )
                )
            expected = {f"m-{i}".encode() for i in range(40) if i % 4 in (0, 2)}
            reader = TopicReader(stack.conf(), topic, 2)
            try:
                reader.read_until(
                    lambda r: len(r) >= len(expected), 90, "the commits and the checked commits"
                )
            finally:
                reader.close()
        # A commit's and a checked commit's promote spans, in the traces their headers name.
        spans = receiver.wait_log(rf"span promote {_traceparent(2).split('-')[1]}", 60)
        assert f"span promote {_traceparent(0).split('-')[1]}" in spans
        assert f"span promote {_traceparent(1).split('-')[1]}" not in spans  # rolled back
        assert "running" in log and "exporting spans over OTLP/HTTP" in log
    records = read_to_end(stack.conf(), topic, 2)
    _exactly_once(records, expected)
    assert {dict(m.headers())["traceparent"].decode() for m in records if m.value() == b"m-0"} == {
        _traceparent(0)
    }  # kept on the promoted record
    assert {int(v.split(b"-")[1]) % 4 for v in listener.checked} == {2, 3}


def test_docker_kill_mid_2000_commits_then_a_new_container_promotes_each_once(stack):
    prefix, name = _names("ck")
    topic = _topic(stack, "kill", 3)
    total = 2000
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    expected = {f"m{i}".encode() for i in range(total)}
    reader = TopicReader(stack.conf(), topic, 3)
    first = _coordinator(stack, name, prefix, instance_id=name)
    second = _coordinator(stack, f"{name}-2", prefix, instance_id=name)
    try:
        with first, _producer(stack, prefix, listener) as producer:
            first.wait_log(rf"transaction service {name} running")
            sender = _send(
                producer, [Message(topic, f"m{i}".encode(), key=f"k{i % 50}") for i in range(total)]
            )
            reader.read_until(lambda r: len(r) >= 400, 180, "the first promotions")
            first.kill()  # docker kill: SIGKILL, no chance to finish anything
            with second:
                second.wait_log(r"assigned half/op partitions")
                sender.join(300)
                assert not sender.is_alive(), "the producer did not finish sending"
                producer.flush(30)
                reader.read_until(lambda r: len(r) >= total, 240, "every promotion")
                assert second.stop(GRACE_S) == 0
    finally:
        reader.close()
        first.remove()
        second.remove()
    _exactly_once(read_to_end(stack.conf(), topic, 3), expected)


def _uncommitted_values(stack, topic: str, partitions: int) -> Counter:
    """Every data record of ``topic`` read_uncommitted: an aborted promotion shows here."""
    consumer = RawConsumer(
        {
            **stack.conf(),
            "group.id": "unused",
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
        }
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: Counter = Counter()
        done: set[int] = {p for p, end in ends.items() if end == 0}
        while len(done) < partitions:
            for msg in consumer.consume(1000, 1.0):
                if msg.error() is None:
                    values[msg.value()] += 1
            for tp in consumer.position([TopicPartition(topic, p) for p in range(partitions)]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
        return values
    finally:
        consumer.close()


def test_docker_stop_exits_0_in_the_grace_period_and_leaves_no_aborted_promotion(stack):
    prefix, name = _names("cs")
    topic = _topic(stack, "stop", 2)
    total = 600
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    reader = TopicReader(stack.conf(), topic, 2)
    try:
        with (
            _coordinator(stack, name, prefix, instance_id=name) as coordinator,
            _producer(stack, prefix, listener) as producer,
        ):
            coordinator.wait_log(rf"transaction service {name} running")
            sender = _send(
                producer, [Message(topic, f"m{i}".encode(), key=f"k{i % 20}") for i in range(total)]
            )
            reader.read_until(lambda r: len(r) >= 100, 120, "promotions in flight")
            # docker stop: SIGTERM, then SIGKILL after the grace (exit code 137, not 0).
            assert coordinator.stop(GRACE_S) == 0
            log = coordinator.logs()
            assert "finishing the current transaction, then stopping" in log
            assert f"transaction service {name} stopped" in log
            assert log.rstrip().endswith("coordinator stopped"), log[-2000:]
            sender.join(300)
            assert not sender.is_alive(), "the producer did not finish sending"
            producer.flush(30)
            promoted = len(read_to_end(stack.conf(), topic, 2))
            # Every record the stopped replica wrote was committed: none aborted.
            uncommitted = _uncommitted_values(stack, topic, 2)
            assert sum(uncommitted.values()) == promoted and max(uncommitted.values()) == 1
            # The rest is promoted by the next replica, each message once.
            with _coordinator(stack, f"{name}-2", prefix, instance_id=name) as successor:
                successor.wait_log(r"assigned half/op partitions")
                reader.read_until(lambda r: len(r) >= total, 180, "every promotion")
                assert successor.stop(GRACE_S) == 0
    finally:
        reader.close()
    _exactly_once(read_to_end(stack.conf(), topic, 2), {f"m{i}".encode() for i in range(total)})


def test_two_coordinator_containers_split_the_partitions_and_commits_flow(stack, announce):
    prefix, name = _names("c2")
    topic = _topic(stack, "split", 2)
    total = 500
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    everything = set(range(FAST["half_partitions"]))
    with (
        _coordinator(stack, f"{name}-a", prefix) as one,
        _coordinator(stack, f"{name}-b", prefix) as two,
    ):
        reader = TopicReader(stack.conf(), topic, 2)
        try:
            reader.read_until(
                lambda _r: (
                    one.owned_partitions()
                    and two.owned_partitions()
                    and one.owned_partitions() | two.owned_partitions() == everything
                ),
                120,
                "a split of the half/op partitions",
            )
            halves = one.owned_partitions(), two.owned_partitions()
            assert not halves[0] & halves[1] and halves[0] | halves[1] == everything
            announce(
                f"\ncoordinator containers: {one.name} owns {sorted(halves[0])}, "
                f"{two.name} owns {sorted(halves[1])}"
            )
            with _producer(stack, prefix, listener) as producer:
                for i in range(total):
                    producer.send_message_in_transaction(
                        Message(topic, f"m{i}".encode(), key=f"k{i % 50}")
                    )
            reader.read_until(lambda r: len(r) >= total, 120, "every promotion")
        finally:
            reader.close()
        assert (one.owned_partitions(), two.owned_partitions()) == halves, "a rebalance"
        assert one.stop(GRACE_S) == 0 and two.stop(GRACE_S) == 0
    _exactly_once(read_to_end(stack.conf(), topic, 2), {f"m{i}".encode() for i in range(total)})
