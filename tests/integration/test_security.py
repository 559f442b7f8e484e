"""Security settings on a real SASL_PLAINTEXT/PLAIN broker: the whole transactional flow with
credentials (coordinator process, TransactionProducer and its check consumer, Consumer,
admin CLI, Spark source), and wrong credentials as one clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from rmq_semantics import AuthenticationError, Consumer, Message, RmqError, TransactionProducer
from rmq_semantics import LocalTransactionState as S
from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.tools.admin import list_discarded
from rmq_semantics.topics import ensure_topics
from tests.integration.ops_helpers import START_TIMEOUT_S, CoordinatorProcess, health
from tests.integration.txn_helpers import (
    FAST,
    REPO,
    ScriptedListener,
    ThreadCoordinator,
    no_pending,
    wait_for,
)

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "alice-secret"
# With security on a coordinator needs the marker key (coordinator/marker_keys.py).
MARKER_KEY = "a-marker-key-for-the-sasl-tests-0123456789"
# librdkafka reports a refused login within ~0.3 s; leave room for a loaded CI machine.
AUTH_FAIL_WITHIN_S = 10.0
CLI_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[EmbeddedKafka]:
    """A second embedded broker whose only client listener is SASL_PLAINTEXT/PLAIN, with
    ACLs enforced as Kafka ships them (admin is the super user; a resource without ACLs is
    closed): ``alice`` runs everything, so she may do anything to every topic, group and
    transactional id (an explicit DENY still wins, see deny_write)."""
    data_dir = Path(tempfile.mkdtemp(prefix="rmq-test-sasl-kafka-"))
    broker = EmbeddedKafka(
        data_dir, port=free_port(), sasl_users={"admin": "admin-secret", USER: PASSWORD}, acls=True
    )
    try:
        broker.start()
        allow_all(broker, USER)
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def allow_all(broker: EmbeddedKafka, user: str) -> None:
    admin = AdminClient(broker.client_conf())
    futures = admin.create_acls(
        [
            AclBinding(
                kind,
                "*",
                ResourcePatternType.LITERAL,
                f"User:{user}",
                "*",
                AclOperation.ALL,
                AclPermissionType.ALLOW,
            )
            for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
        ]
    )
    for future in futures.values():
        future.result(CLI_TIMEOUT_S)


def sasl_conf(broker: EmbeddedKafka, password: str = PASSWORD) -> dict:
    return {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": USER,
        "sasl.password": password,
    }


# The CLI way: settings as --kafka-option, the secret in the environment.
CLI_OPTIONS = [
    "--kafka-option",
    "security.protocol=SASL_PLAINTEXT",
    "--kafka-option",
    "sasl.mechanisms=PLAIN",
    "--kafka-option",
    f"sasl.username={USER}",
]


def run_cli(*args: str, password: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rmq_semantics", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(REPO), "RMQ_KAFKA_SASL_PASSWORD": password},
    )


def read_promoted(conf: dict, topic: str, count: int, timeout_s: float = 60.0) -> list:
    consumer = Consumer({**conf, "group.id": f"reader-{topic}", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        records: list = []
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                records.append(msg)
        return records
    finally:
        consumer.close()


def test_transactional_flow_with_sasl_credentials(sasl_broker, unique, tmp_path):
    conf = sasl_conf(sasl_broker)
    prefix = unique("sec").replace("-", "")
    topic = unique("secure-orders")
    ensure_topics(conf, {topic: (1, {})})
    port = free_port()
    coordinator = CoordinatorProcess(
        sasl_broker.bootstrap,
        tmp_path / "coordinator.log",
        *CLI_OPTIONS,
        "--metrics-port",
        str(port),
        env={"RMQ_KAFKA_SASL_PASSWORD": PASSWORD, "RMQ_MARKER_KEY": MARKER_KEY},
        topic_prefix=prefix,
    )
    inline = {
        b"committed": S.COMMIT_MESSAGE,
        b"rolled-back": S.ROLLBACK_MESSAGE,
        b"checked": S.UNKNOW,
    }
    # The back-check travels coordinator -> __check topic -> the producer's check consumer.
    listener = ScriptedListener(lambda v: inline[v], lambda v: S.COMMIT_MESSAGE)
    try:
        wait_for(lambda: health(coordinator, port), START_TIMEOUT_S, "the coordinator")
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer:
            for value in inline:
                producer.send_message_in_transaction(Message(topic, value, key=value))
            records = read_promoted(conf, topic, 2)
        assert sorted(m.value() for m in records) == [b"checked", b"committed"]
        assert all(dict(m.headers())["rmq.promoted_from"] for m in records)
        assert listener.checked == [b"checked"]

        cli = run_cli(
            "txn",
            "pending",
            "--bootstrap-servers",
            sasl_broker.bootstrap,
            *CLI_OPTIONS,
            "--topic-prefix",
            prefix,
            password=PASSWORD,
        )
        assert cli.returncode == 0, cli.stderr
        assert "txn id" in cli.stdout
    finally:
        code = coordinator.stop()
    assert code == 0, coordinator.log
    assert "authentication" not in coordinator.log.lower()


def deny_write(broker: EmbeddedKafka, topic: str, user: str) -> None:
    """``user`` may do anything with ``topic`` but write to it."""
    admin = AdminClient(broker.client_conf())
    pattern = (ResourceType.TOPIC, topic, ResourcePatternType.LITERAL)
    futures = admin.create_acls(
        [
            AclBinding(*pattern, "User:*", "*", AclOperation.ALL, AclPermissionType.ALLOW),
            AclBinding(*pattern, f"User:{user}", "*", AclOperation.WRITE, AclPermissionType.DENY),
        ]
    )
    for future in futures.values():
        future.result(CLI_TIMEOUT_S)


def test_a_real_topic_the_coordinator_may_not_write_is_discarded_and_the_partition_moves_on(
    sasl_broker, unique
):
    conf = sasl_conf(sasl_broker)
    prefix = unique("acl").replace("-", "")
    allowed, forbidden = unique("allowed"), unique("forbidden")
    ensure_topics(conf, {allowed: (1, {}), forbidden: (1, {})})
    deny_write(sasl_broker, forbidden, USER)
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    # One half partition: the forbidden transaction sits in front of the allowed ones.
    with (
        ThreadCoordinator(
            conf, topic_prefix=prefix, half_partitions=1, marker_key=MARKER_KEY
        ) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=1,
        ) as producer,
    ):
        denied = producer.send_message_in_transaction(Message(forbidden, b"denied"))
        for i in range(3):
            producer.send_message_in_transaction(Message(allowed, f"ok-{i}".encode()))
        records = read_promoted(conf, allowed, 3)

        def settled() -> bool:
            assert coordinator.thread.is_alive(), "the coordinator stopped"
            return no_pending(coordinator, 1)

        wait_for(settled, 60, "every transaction to be promoted or discarded")
        discarded = {t.txn_id: t.reason for t in list_discarded(conf, prefix)}
        registry = coordinator.server.metrics.registry
        assert registry.get_sample_value("rmq_discarded_total", {"reason": "unauthorized"}) == 1
    assert sorted(m.value() for m in records) == [b"ok-0", b"ok-1", b"ok-2"]
    assert discarded == {denied.transaction_id: "unauthorized"}


def test_wrong_password_fails_start_at_once_with_an_authentication_error(sasl_broker, unique):
    producer = TransactionProducer(
        sasl_conf(sasl_broker, password="wrong"),
        producer_group=unique("pg"),
        listener=ScriptedListener(lambda v: None, lambda v: None),
        topic_prefix=unique("bad").replace("-", ""),
    )
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as raised:
        producer.start()
    assert time.monotonic() - started < AUTH_FAIL_WITHIN_S
    assert isinstance(raised.value, RmqError) and not raised.value.retriable
    assert "authentication failed" in str(raised.value).lower()
    assert "sasl.password" in str(raised.value)  # says what to change
    producer.shutdown()


def test_admin_cli_with_wrong_password_prints_one_error_line(sasl_broker):
    started = time.monotonic()
    cli = run_cli(
        "txn",
        "pending",
        "--bootstrap-servers",
        sasl_broker.bootstrap,
        *CLI_OPTIONS,
        password="wrong",
    )
    assert time.monotonic() - started < CLI_TIMEOUT_S
    assert cli.returncode != 0
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1, cli.stderr
    assert lines[0].startswith("rmq-semantics: error: ")
    assert "authentication" in lines[0].lower()
    assert cli.stdout == ""


def test_coordinator_with_wrong_password_exits_non_zero_naming_authentication(
    sasl_broker, unique, tmp_path
):
    coordinator = CoordinatorProcess(
        sasl_broker.bootstrap,
        tmp_path / "coordinator.log",
        *CLI_OPTIONS,
        env={"RMQ_KAFKA_SASL_PASSWORD": "wrong", "RMQ_MARKER_KEY": MARKER_KEY},
        topic_prefix=unique("bad").replace("-", ""),
    )
    try:
        code = coordinator.wait(START_TIMEOUT_S)
    finally:
        coordinator.stop()
    assert code == 1
    errors = [ln for ln in coordinator.log.splitlines() if "coordinator stopped" in ln]
    assert len(errors) == 1 and "authentication failed" in errors[0].lower(), coordinator.log
    assert "Traceback" not in coordinator.log


def test_coordinator_with_security_on_and_no_marker_key_refuses_to_start(
    sasl_broker, unique, tmp_path
):
    coordinator = CoordinatorProcess(
        sasl_broker.bootstrap,
        tmp_path / "coordinator.log",
        *CLI_OPTIONS,
        env={"RMQ_KAFKA_SASL_PASSWORD": PASSWORD},
        topic_prefix=unique("nokey").replace("-", ""),
    )
    try:
        code = coordinator.wait(START_TIMEOUT_S)
    finally:
        coordinator.stop()
    assert code != 0
    lines = coordinator.log.strip().splitlines()
    assert len(lines) == 1 and "no marker key is set" in lines[0], coordinator.log
    assert "RMQ_MARKER_KEY" in lines[0] and "--marker-key-file" in lines[0]


# The Spark job under SASL credentials: test_tenancy_principals.py runs it under its own
# principal with least-privilege ACLs, on promoted records.
