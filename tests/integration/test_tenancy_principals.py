"""Every class a tenant or an operator runs, each under its own principal with exactly the ACLs
``rmq-semantics tenant acls`` generates for the tenants file (issue 44), on the session's
secured broker (Kafka's own default: ``allow.everyone.if.no.acl.found=false``, the admin the
only super user). One deployment: producer group ``ga`` (principal ``a``) with a real topic
per consumer below, consumer groups of each kind (``gco`` orderly, ``gcp`` push, ``gcs``
simple, ``gcc`` plain), the operators (``ops``) and the Spark job (``spark``); the
coordinator (``coord``) with its three services. The broker's authorizer log must show no
denial of any of them (only the adversary ``b`` of test_tenancy.py may be refused)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import confluent_kafka
import pytest

from coordinator.acls import Principals
from rmq_semantics import (
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    Consumer,
    FilterExpression,
    Message,
    OrderlyConsumer,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from tests.integration.tenancy_helpers import (
    ADVERSARIES,
    DECIDED_WITHIN_S,
    USERS,
    Deployment,
    consumer_key,
    denied_principals,
    deployment,
    discard_reasons,
    forged_half,
    group_key,
    promoted_values,
)
from tests.integration.txn_helpers import REPO, read_to_end, wait_for

pytestmark = pytest.mark.integration

# ga's real topics besides ta: one per consumer group that is not plain, and Spark's.
ORDERLY, PUSH, SIMPLE, SPARK = "to-{prefix}", "tp-{prefix}", "ts-{prefix}", "tk-{prefix}"
CONSUMERS = {
    "gco": {"principal": "User:c-orderly", "topics": [ORDERLY], "kind": "orderly"},
    "gcp": {"principal": "User:c-push", "topics": [PUSH], "kind": "push", "retry_levels": 2},
    "gcs": {"principal": "User:c-simple", "topics": [SIMPLE], "kind": "simple"},
    "gcc": {"principal": "User:c-plain", "topics": ["ta-{prefix}"], "orderly": False},
}
# The first timer message makes the timer service create its topics and join its group.
TIMER_DELIVERED_WITHIN_S = 60.0
CONSUMED_WITHIN_S = 60.0
CLI_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def full(secured_broker) -> Iterator[Deployment]:
    principals = Principals("User:coord", "User:ops", "User:spark", (SPARK,))
    with deployment(
        *secured_broker,
        a_topics=(ORDERLY, PUSH, SIMPLE, SPARK),
        consumers=CONSUMERS,
        principals=principals,
    ) as dep:
        yield dep


def topic(dep: Deployment, name: str) -> str:
    return name.format(prefix=dep.prefix)


def conf(dep: Deployment, user: str, **extra: object) -> dict:
    return {**dep.conf(user), **extra}


def producer_a(dep: Deployment) -> Producer:
    return Producer(
        dep.conf("a"), topic_prefix=dep.prefix, producer_group="ga", group_key=group_key("ga")
    )


def serving(dep: Deployment) -> bool:
    """The coordinator runs every service (a failed one stops the process)."""
    server = dep.coordinator.server
    assert dep.coordinator.thread.is_alive() and not server.stop_event.is_set(), (
        f"the coordinator stopped: {server.health()}"
    )
    return True


def cli(dep: Deployment, *args: str) -> subprocess.CompletedProcess:
    """``python -m rmq_semantics ARGS`` as the operators run it: SASL settings as
    ``--kafka-option``, the password in the environment."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            *args,
            "--bootstrap-servers",
            dep.broker.bootstrap,
            "--kafka-option",
            "security.protocol=SASL_PLAINTEXT",
            "--kafka-option",
            "sasl.mechanisms=PLAIN",
            "--kafka-option",
            "sasl.username=ops",
            "--topic-prefix",
            dep.prefix,
        ],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(REPO), "RMQ_KAFKA_SASL_PASSWORD": USERS["ops"]},
    )


# -- the coordinator's three services ----------------------------------------------------------
def test_a_tenants_timer_message_is_delivered_by_the_coordinator_under_its_acls(full):
    with producer_a(full) as producer:
        producer.send(Message(full.ta, b"timer-due", deliver_after_ms=1000))
    wait_for(
        lambda: serving(full) and b"timer-due" in promoted_values(full, full.ta),
        TIMER_DELIVERED_WITHIN_S,
        "the timer message to be delivered",
    )
    # Still serving: a transaction after it is promoted too.
    full.a.send_message_in_transaction(Message(full.ta, b"a-commits"))
    wait_for(
        lambda: serving(full) and b"a-commits" in promoted_values(full, full.ta),
        DECIDED_WITHIN_S,
        "the transaction after the timer message to be promoted",
    )
    assert full.coordinator.server.health()["status"] == "ok"


def test_a_plain_consumer_reads_its_topic(full):
    """``gcc`` (kind plain) reads ta and commits its offsets."""
    with producer_a(full) as producer:
        producer.send(Message(full.ta, b"plain-1"))
    consumer = Consumer(
        conf(full, "c-plain", **{"group.id": "gcc", "auto.offset.reset": "earliest"}),
        topic_prefix=full.prefix,
    )
    try:
        consumer.subscribe([full.ta])

        def read() -> bool:
            msg = consumer.poll(0.5)
            return msg is not None and msg.error() is None and msg.value() == b"plain-1"

        wait_for(read, CONSUMED_WITHIN_S, "the plain consumer to read plain-1")
        committed = consumer.commit(asynchronous=False)
        assert committed and all(tp.error is None for tp in committed)
    finally:
        consumer.close()


def test_an_orderly_consumer_holds_its_locks_consumes_in_order_and_dead_letters(full):
    values = [b"o-1", b"o-2", b"o-poison", b"o-3"]
    with producer_a(full) as producer:
        for value in values:
            producer.send(Message(topic(full, ORDERLY), value, key="k"))
    handled: list[bytes] = []
    done = threading.Event()

    def listener(msgs, context):
        for m in msgs:
            if m.value == b"o-poison":
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            handled.append(m.value)
        if b"o-3" in handled:
            done.set()
        return ConsumeOrderlyStatus.SUCCESS

    consumer = OrderlyConsumer(
        conf(full, "c-orderly", **{"group.id": "gco", "auto.offset.reset": "earliest"}),
        listener=listener,
        max_reconsume_times=0,
        topic_prefix=full.prefix,
        consumer_group_key=consumer_key("gco"),  # its lock requests are signed (item 5)
    )
    consumer.subscribe([topic(full, ORDERLY)])
    consumer.start()
    try:
        wait_for(done.is_set, CONSUMED_WITHIN_S, "the orderly consumer to reach o-3")
    finally:
        consumer.shutdown()
    assert handled == [b"o-1", b"o-2", b"o-3"]
    dead = read_to_end(full.conf("admin"), full.topics.dlq("gco"), 1)
    assert [m.value() for m in dead] == [b"o-poison"]


def test_a_push_consumer_retries_dead_letters_and_the_operators_redrive(full):
    values = [b"p-ok", b"p-retry", b"p-poison"]
    with producer_a(full) as producer:
        for value in values:
            producer.send(Message(topic(full, PUSH), value))
    succeeded: list[tuple[bytes, int]] = []
    poison_fails = threading.Event()
    poison_fails.set()

    def listener(msgs, context):
        for m in msgs:
            if m.value == b"p-retry" and m.reconsume_times == 0:
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            if m.value == b"p-poison" and poison_fails.is_set():
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            succeeded.append((m.value, m.reconsume_times))
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        conf(full, "c-push", **{"group.id": "gcp", "auto.offset.reset": "earliest"}),
        listener=listener,
        delay_levels=(1, 1),  # the tenants file's retry_levels: 2
        max_reconsume_times=1,
        topic_prefix=full.prefix,
    )
    consumer.subscribe([topic(full, PUSH)])
    consumer.start()
    try:
        wait_for(
            lambda: consumer.counts["dead"] == 1 and len(succeeded) == 2,
            CONSUMED_WITHIN_S,
            "p-ok, p-retry (from its retry topic) and p-poison's dead letter",
            details=lambda: f"{consumer.counts} {succeeded}",
        )
        assert sorted(succeeded) == [(b"p-ok", 0), (b"p-retry", 1)]
        listed = cli(full, "dlq", "list", "--group", "gcp")
        assert listed.returncode == 0, listed.stderr
        assert topic(full, PUSH) in listed.stdout
        poison_fails.clear()
        redriven = cli(full, "dlq", "redrive", "--group", "gcp", "--all")
        assert redriven.returncode == 0, redriven.stderr
        assert "re-driven 0:0" in redriven.stdout
        wait_for(
            lambda: (b"p-poison", 0) in succeeded,
            CONSUMED_WITHIN_S,
            "the re-driven dead letter to be consumed",
        )
    finally:
        consumer.shutdown()
    assert consumer.poll_error is None


def test_a_simple_consumer_acks_and_dead_letters(full):
    with producer_a(full) as producer:
        for value in (b"s-ok", b"s-poison"):
            producer.send(Message(topic(full, SIMPLE), value))
    consumer = SimpleConsumer(
        conf(full, "c-simple", **{"auto.offset.reset": "earliest"}),
        consumer_group="gcs",
        subscription={topic(full, SIMPLE): FilterExpression("*")},
        topic_prefix=full.prefix,
        max_delivery_attempts=1,
        await_duration=1,
    )
    acked: list[bytes] = []
    with consumer:

        def settled() -> bool:
            for msg in consumer.receive(max_message_num=4, invisible_duration=1):
                if msg.body == b"s-ok":
                    consumer.ack(msg)
                    acked.append(msg.body)
            return acked == [b"s-ok"] and consumer.counts["dead"] == 1

        wait_for(settled, CONSUMED_WITHIN_S, "s-ok acked and s-poison dead-lettered")
    listed = cli(full, "dlq", "list", "--group", "gcs")
    assert listed.returncode == 0, listed.stderr
    assert topic(full, SIMPLE) in listed.stdout


# -- the operators' txn commands -----------------------------------------------------------
def test_the_operators_txn_commands(full):
    b = confluent_kafka.Producer(full.conf("b"))
    forged, _, _ = forged_half(full, b, "ga", full.ta, b"b-as-ga")
    wait_for(
        lambda: discard_reasons(full).get(forged) == "forged",
        DECIDED_WITHIN_S,
        "B's forged half to be set aside",
    )
    pending = cli(full, "txn", "pending")
    assert pending.returncode == 0, pending.stderr
    assert "txn id" in pending.stdout
    discarded = cli(full, "txn", "discarded")
    assert discarded.returncode == 0, discarded.stderr
    assert forged in discarded.stdout
    redriven = cli(full, "txn", "redrive", forged)
    assert redriven.returncode == 0, redriven.stderr
    assert f"re-driven {forged} as half" in redriven.stdout


# -- Spark -------------------------------------------------------------------------------------
@pytest.mark.spark
def test_the_spark_job_reads_promoted_records_under_its_principal(full, tmp_path):
    pytest.importorskip("pyspark")
    from spark.job import JobSettings, run_job, spark_kafka_options

    for value in (b"k-1", b"k-2"):
        full.a.send_message_in_transaction(Message(topic(full, SPARK), b"a-commits-" + value))
    wait_for(
        lambda: len(promoted_values(full, topic(full, SPARK))) == 2,
        DECIDED_WITHIN_S,
        "both to be promoted",
    )
    result = run_job(
        JobSettings(
            bootstrap_servers=full.broker.bootstrap,
            topics=topic(full, SPARK),
            output=tmp_path / "out",
            available_now=True,
            kafka_options=spark_kafka_options(full.conf("spark")),
            spark_master="local[1]",
            topic_prefix=full.prefix,
        ),
        timeout_s=240,
    )
    assert result.rows_written == 2


# -- last: the broker's own account ------------------------------------------------------------
def test_the_broker_denied_nothing_to_a_legitimate_principal(full):
    denied = denied_principals(full.broker)
    legitimate = {p: lines[:3] for p, lines in denied.items() if p not in ADVERSARIES}
    assert legitimate == {}, legitimate
