"""RocketMQ parity on the real broker: tag expressions on every consumer (the drop-in
Consumer stores the skipped offsets, the orderly consumer commits past them), and a DLQ made
by the orderly consumer read back by naming it (never through a pattern)."""

from __future__ import annotations

import subprocess
import sys
import threading

import confluent_kafka
import pytest

from rmq_semantics import Consumer, Message, Producer
from rmq_semantics.orderly import ConsumeOrderlyStatus, OrderlyConsumer
from rmq_semantics.records.headers import H
from rmq_semantics.topics import SystemTopics
from tests.group_protocol import group_conf
from tests.integration.test_orderly import (
    LEASE_MS,
    RENEW_MS,
    committed,
    orderly_conf,
    read_all,
    start_consumer,
    wait_for,
)
from tests.integration.test_orderly_keys import lock_service_of

pytestmark = pytest.mark.integration

TAGS = ["TagA", "TagB", "TagC", None, "TagA", "TagD", "TagB", "TagC"]  # None: no rmq.tags
WANTED = [i for i, tag in enumerate(TAGS) if tag in ("TagA", "TagB")]


@pytest.fixture
def locks(broker, unique):
    with lock_service_of(broker, unique) as runner:
        yield runner


def send_tagged(broker, topic: str) -> None:
    with Producer(broker.conf()) as producer:
        for i, tag in enumerate(TAGS):
            producer.send(Message(topic, f"m{i}".encode(), key=f"k{i % 3}", tags=tag, partition=0))


def values(msgs: list[confluent_kafka.Message]) -> list[int]:
    return [int(m.value()[1:]) for m in msgs]


def test_consumer_with_tag_expression_sees_exactly_those_and_stores_skipped_offsets(
    broker, make_topic, unique
):
    topic, group = make_topic("tags"), unique("g")
    send_tagged(broker, topic)
    conf = group_conf(
        broker.conf(
            **{
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )
    )
    got = []
    with Consumer(conf) as consumer:
        consumer.subscribe([topic], tags="TagA || TagB")
        while consumer.skipped_tag_records + len(got) < len(TAGS):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg)
                consumer.store_offsets(message=msg)
        assert values(got) == WANTED
        assert [dict(m.headers())[H.TAGS] for m in got] == [b"TagA", b"TagB", b"TagA", b"TagB"]
        assert consumer.skipped_tag_records == len(TAGS) - len(WANTED)
        # The user's own commit covers the skipped tail (m7, TagC): nothing committed for them.
        consumer.commit(asynchronous=False)
    assert committed(broker, group, topic, 1) == {0: len(TAGS)}


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_orderly_consumer_with_tags_sees_exactly_those_and_commits_past_the_rest(
    broker, make_topic, unique, locks, ordering
):
    topic, group = make_topic("otags"), unique("g")
    send_tagged(broker, topic)
    seen, lock = [], threading.Lock()

    def listener(msgs, context):
        with lock:
            seen.extend(int(m.value[1:]) for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = OrderlyConsumer(
        orderly_conf(broker, group),
        listener=listener,
        ordering=ordering,
        lock_lease_ms=LEASE_MS,
        lock_renew_ms=RENEW_MS,
        topic_prefix=locks.prefix,
    )
    consumer.subscribe([topic], tags="TagA || TagB")
    consumer.start()
    try:
        wait_for(
            lambda: committed(broker, group, topic, 1) == {0: len(TAGS)},
            60,
            "the commit past the last (skipped) record",
        )
    finally:
        consumer.shutdown()
    assert sorted(seen) == WANTED and len(seen) == len(WANTED)


def test_a_dlq_made_by_the_orderly_consumer_is_read_by_name_never_through_a_pattern(
    broker, make_topic, unique, locks
):
    topic, group = make_topic("dlqsrc"), unique("g")
    with Producer(broker.conf()) as producer:
        producer.send(Message(topic, b"poison", key="k", headers={"user": "h"}, partition=0))
    consumer = start_consumer(
        broker,
        group,
        topic,
        locks.prefix,
        lambda msgs, ctx: ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT,
        "dlq",
        max_reconsume_times=0,
    )
    try:
        wait_for(
            lambda: committed(broker, group, topic, 1) == {0: 1},
            60,
            "the poison message dead-lettered",
        )
    finally:
        consumer.shutdown()
    dlq = SystemTopics(locks.prefix).dlq(group)
    conf = group_conf(broker.conf(**{"group.id": unique("r"), "auto.offset.reset": "earliest"}))
    with Consumer(conf, topic_prefix=locks.prefix) as reader:
        reader.subscribe([dlq])
        msg = wait_for(lambda: _one(reader), 60, "the DLQ record")
    headers = dict(msg.headers())
    assert (msg.value(), headers["user"], headers[H.DLQ_ORIGINAL_TOPIC]) == (
        b"poison",
        b"h",
        topic.encode(),
    )
    with Consumer(conf | {"group.id": unique("p")}, topic_prefix=locks.prefix) as pattern:
        pattern.subscribe([f"^{locks.prefix}.*"])
        while pattern.skipped_system_partitions == 0:  # left out at assignment
            extra = pattern.poll(0.5)
            assert extra is None or extra.error() is not None, extra.topic()
        assert pattern.skipped_system_records == 0

    # dlq list shows the reasons; dlq redrive sends it back to where it came from.
    listed = dlq_cli(broker, "list", group, locks.prefix)
    assert listed.returncode == 0, listed.stderr
    assert f"{topic}[0]@0" in listed.stdout and "0:0" in listed.stdout
    bad = dlq_cli(broker, "redrive", group, locks.prefix, "--offset", "7")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"rmq-semantics: error: no dead letter at 0:7 in {dlq}"
    ]
    redriven = dlq_cli(broker, "redrive", group, locks.prefix, "--offset", "0")
    assert redriven.returncode == 0, redriven.stderr
    records = read_all(broker, topic, 1)
    assert [m.value() for m in records] == [b"poison", b"poison"]
    again = dict(records[1].headers())
    assert again["user"] == b"h" and records[1].key() == b"k"
    assert again[H.REDRIVE_OF] == f"{dlq}[0]@0".encode()
    assert not [k for k in again if k.startswith("rmq.dlq.")]


def dlq_cli(
    broker, action: str, group: str, prefix: str, *extra: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "dlq",
            action,
            "--group",
            group,
            "--bootstrap-servers",
            broker.bootstrap,
            "--topic-prefix",
            prefix,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one(consumer: Consumer) -> confluent_kafka.Message | None:
    msg = consumer.poll(0.5)
    return msg if msg is not None and msg.error() is None else None
