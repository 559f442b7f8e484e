"""The foundation on a real broker: round trip, restart durability, system-topic isolation."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from rmq_semantics import Consumer, Message, Producer, SystemTopicError
from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.topics import ensure_topics
from tests.group_protocol import group_conf

pytestmark = pytest.mark.integration


def drain(consumer: Consumer, want: int, timeout_s: float = 30.0) -> list:
    """Poll until ``want`` records arrived or ``timeout_s`` passed; return what came."""
    import time

    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg)
    return got


def test_produce_consume_round_trip_keeps_key_value_headers(broker, make_topic, unique):
    topic = make_topic("roundtrip")
    with Producer(broker.conf()) as producer:
        result = producer.send(Message(topic, b"hello", key="k1", headers={"h": "v"}))
    assert result.topic == topic and result.offset == 0
    with Consumer(
        group_conf(broker.conf(**{"group.id": unique("g"), "auto.offset.reset": "earliest"}))
    ) as consumer:
        consumer.subscribe([topic])
        [msg] = drain(consumer, 1)
    assert (msg.key(), msg.value(), msg.headers()) == (b"k1", b"hello", [("h", b"v")])


def test_pattern_subscription_never_yields_system_topic_records(broker, make_topic, unique):
    prefix = unique("rmqt").replace("-", "")
    business = f"{prefix}biz"
    system = f"{prefix}_half"
    ensure_topics(broker.conf(), {business: (1, {}), system: (1, {})})
    with Producer(broker.conf()) as producer:
        for i in range(5):
            producer.produce(system, f"sys-{i}".encode())
        producer.produce(business, b"biz")
        producer.flush(10)
    with Consumer(
        group_conf(broker.conf(**{"group.id": unique("g"), "auto.offset.reset": "earliest"})),
        topic_prefix=prefix,
    ) as consumer:
        consumer.subscribe([f"^{prefix}.*"])
        got = drain(consumer, 1)
        # The system partition is left out at assignment: never fetched.
        assert consumer.skipped_system_partitions == 1
        assert consumer.poll(0.5) is None
        assert [m.value() for m in got] == [b"biz"]
        assert consumer.skipped_system_records == 0
        assert [tp.topic for tp in consumer.assignment()] == [business]
        with pytest.raises(SystemTopicError):
            consumer.subscribe([system])


def test_default_prefix_system_topic_is_refused_by_name(broker, unique):
    consumer = Consumer(group_conf(broker.conf(**{"group.id": unique("g")})))
    try:
        with pytest.raises(SystemTopicError, match="__rmq_op"):
            consumer.subscribe(["__rmq_op"])
    finally:
        consumer.close()
    consumer.close()  # idempotent


def test_broker_stop_start_keeps_committed_data(tmp_path, unique):
    broker = EmbeddedKafka(tmp_path / "kafka", port=free_port())
    topic = unique("durable")
    try:
        bootstrap = broker.start()
        conf = {"bootstrap.servers": bootstrap}
        ensure_topics(conf, {topic: (1, {})})
        with Producer(conf) as producer:
            for i in range(10):
                producer.send(Message(topic, f"v{i}"))
        assert broker.stop() is True
        assert broker.running_pid() is None
        assert broker.start() == bootstrap
        group = unique("g")
        with Consumer(
            group_conf({**conf, "group.id": group, "auto.offset.reset": "earliest"})
        ) as c:
            c.subscribe([topic])
            got = drain(c, 10)
        assert [m.value() for m in got] == [f"v{i}".encode() for i in range(10)]
    finally:
        broker.stop()
    assert broker.stop() is False  # idempotent


def test_kafka_start_on_used_port_prints_one_error_line(broker, tmp_path):
    used_port = int(broker.bootstrap.rsplit(":", 1)[1])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "kafka",
            "start",
            "--data-dir",
            str(tmp_path / f"k-{uuid.uuid4().hex[:6]}"),
            "--port",
            str(used_port),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors == [
        f"rmq-semantics: error: port {used_port} on 127.0.0.1 is already in use; "
        "stop whatever listens there or pass --port"
    ]


def test_kafka_start_on_corrupt_data_dir_is_one_clear_error(tmp_path):
    data_dir = tmp_path / "corrupt"
    (data_dir / "logs").mkdir(parents=True)
    (data_dir / "logs" / "garbage").write_text("not kafka")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "kafka",
            "start",
            "--data-dir",
            str(data_dir),
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "is not a usable Kafka data dir" in proc.stderr
