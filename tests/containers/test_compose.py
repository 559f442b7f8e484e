"""docker/compose.yaml for real (issue 14): ``up -d --wait`` with the project's Kafka image
(RMQ_KAFKA_IMAGE), two coordinator replicas and the Spark job. This process sends
transactional orders through the broker's host port with the TransactionProducer; the Spark
container's Parquet (a bind-mounted directory) must hold exactly the committed orders, once
each, also after one coordinator replica is killed mid-flow. ``make test-docker-full`` runs
it (marker ``compose``); the quick ``make test-docker`` leaves it out."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.embedded import free_port, port_free
from tests.containers.compose_project import ComposeProject, docker_inspect, docker_kill
from tests.integration.txn_helpers import ScriptedListener

pytestmark = [pytest.mark.containers, pytest.mark.compose, pytest.mark.timeout(1200)]
HOST_PORT = 19092
# What docker/compose.yaml gives the coordinators; the producer must agree.
TOPIC, PREFIX, HALF_PARTITIONS = "orders", "__rmq", 8
CONTAINER_OUTPUT = "/data/out"
# The survivor takes the killed replica's partitions after its group session times out,
# then Spark's next micro-batch writes them.
ROWS_TIMEOUT_S = 300.0
SENDER_TIMEOUT_S = 300.0


def _override(tmp: Path, data: Path) -> Path:
    # The Spark container runs as uid 10001: the bind-mounted directory must be writable
    # for it, whoever runs the test.
    data.mkdir()
    data.chmod(0o777)
    override = tmp / "compose.override.yaml"
    override.write_text(
        "services:\n  spark:\n    volumes:\n"
        f"      - type: bind\n        source: {data}\n        target: /data\n"
    )
    return override


@pytest.fixture
def project(
    compose_images, tmp_path, announce, request
) -> Iterator[tuple[ComposeProject, str, Path]]:
    # 19092 as the compose file has it, unless something (a shared broker) holds it.
    port = HOST_PORT if port_free(HOST_PORT) else free_port()
    data = tmp_path / "spark-data"
    env = {
        "RMQ_KAFKA_IMAGE": compose_images["kafka"],
        "RMQ_KAFKA_HOST_PORT": str(port),
        "RMQ_IMAGE_TAG": compose_images["coordinator"].rsplit(":", 1)[1],
        # Pinned: the caller's environment must not move the stack off what is asserted.
        "RMQ_TOPIC": TOPIC,
        "RMQ_SPARK_TOPICS": TOPIC,
        "RMQ_TOPIC_PREFIX": PREFIX,
    }
    name = f"rmqcompose{uuid.uuid4().hex[:8]}"
    with ComposeProject(name, _override(tmp_path, data), env) as compose:
        started = time.monotonic()
        try:
            compose.up()
        except AssertionError:
            announce(compose.logs())
            raise
        announce(
            f"\ncompose: project {name}, {compose_images['kafka']} on 127.0.0.1:{port}, "
            f"up --wait took {time.monotonic() - started:.0f} s"
        )
        failed_before = request.session.testsfailed
        yield compose, f"127.0.0.1:{port}", data
        if request.session.testsfailed > failed_before:  # what the services said, before down
            announce(compose.logs())


@pytest.fixture(scope="module")
def spark_reader():
    """A local Spark session of this process that reads the container's Parquet output."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[1]")
        .appName("rmq-test-compose")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _committed_files(output: Path) -> list[str]:
    """The Parquet files of committed micro-batches, from the sink's _spark_metadata log.

    The log names them by their path in the container (file:///data/...), so Spark on this
    side of the bind mount cannot follow it itself; it is read here and the paths mapped.
    """
    log_dir = output / "_spark_metadata"
    if not log_dir.is_dir():
        return []
    files = []
    for entry in log_dir.iterdir():
        if entry.name.startswith("."):  # .crc and a batch still being written (.tmp)
            continue
        for line in entry.read_text().splitlines()[1:]:  # line 1 is the log version
            record = json.loads(line)
            if record["action"] == "add":
                inside = record["path"].removeprefix("file://")
                files.append(str(output / Path(inside).relative_to(CONTAINER_OUTPUT)))
    return sorted(set(files))


def _rows(spark, output: Path) -> list[tuple[str, str, str]]:
    files = _committed_files(output)
    if not files:
        return []
    frame = spark.read.parquet(*files)
    return [
        (r.value, r._key, r._txn_id) for r in frame.select("value", "_key", "_txn_id").collect()
    ]


def _await_rows(spark, output: Path, expected: set[str], what: str) -> list:
    deadline = time.monotonic() + ROWS_TIMEOUT_S
    rows: list = []
    while time.monotonic() < deadline:
        rows = _rows(spark, output)
        if expected <= {value for value, _, _ in rows}:
            return rows
        time.sleep(1.0)  # a Spark read per poll; micro-batches come every few seconds
    missing = sorted(expected - {value for value, _, _ in rows})
    raise AssertionError(
        f"{what}: {len(missing)} committed orders never reached the Parquet "
        f"output within {ROWS_TIMEOUT_S:.0f} s, e.g. {missing[:5]}"
    )


class Orders:
    """Orders order-<run>-<i>: every third one rolls back, the rest commit."""

    def __init__(self, bootstrap: str) -> None:
        self.run = uuid.uuid4().hex[:6]
        listener = ScriptedListener(
            lambda v: (
                S.ROLLBACK_MESSAGE if int(v.rsplit(b"-", 1)[1]) % 3 == 1 else S.COMMIT_MESSAGE
            ),
            lambda v: S.UNKNOW,
        )
        self.producer = TransactionProducer(
            {"bootstrap.servers": bootstrap},
            producer_group=f"pg-{self.run}",
            listener=listener,
            topic_prefix=PREFIX,
            half_partitions=HALF_PARTITIONS,
        )
        self.committed: dict[str, tuple[str, str]] = {}  # value -> (key, transaction id)
        self.rolled_back: set[str] = set()
        self.error: BaseException | None = None

    def send_in_background(self, numbers: range, halfway: threading.Event) -> threading.Thread:
        def send() -> None:
            try:
                self.send(numbers, halfway)
            except BaseException as exc:  # the test thread re-raises it
                self.error = exc
            finally:
                halfway.set()

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        return sender

    def send(self, numbers: range, halfway: threading.Event | None = None) -> None:
        for i in numbers:
            value, key = f"order-{self.run}-{i}", f"customer-{i % 7}"
            result = self.producer.send_message_in_transaction(
                Message(TOPIC, value.encode(), key=key)
            )
            if result.local_transaction_state == S.COMMIT_MESSAGE:
                self.committed[value] = (key, result.transaction_id)
            else:
                self.rolled_back.add(value)
            if halfway is not None and i == numbers[len(numbers) // 4]:
                halfway.set()


def _assert_exactly_committed(rows: list, orders: Orders) -> None:
    counts = Counter(value for value, _, _ in rows)
    duplicated = sorted(v for v, n in counts.items() if n > 1)
    assert not duplicated, f"{len(duplicated)} orders written twice, e.g. {duplicated[:5]}"
    assert set(counts) == set(orders.committed), (
        f"rolled back yet written: {sorted(set(counts) & orders.rolled_back)[:5]}, "
        f"unknown: {sorted(set(counts) - set(orders.committed) - orders.rolled_back)[:5]}"
    )
    assert {value: (key, txn) for value, key, txn in rows} == orders.committed


def test_compose_stack_writes_exactly_the_committed_orders_through_a_replica_kill(
    project, spark_reader, announce
):
    compose, bootstrap, data = project
    coordinators = compose.containers("coordinator")
    assert len(coordinators) == 2, coordinators
    health = [docker_inspect(c, "{{.State.Health.Status}}") for c in coordinators]
    assert health == ["healthy", "healthy"]
    assert len(compose.containers("spark")) == 1
    output = data / "out"
    orders = Orders(bootstrap)
    with orders.producer:
        orders.send(range(60))
        rows = _await_rows(spark_reader, output, set(orders.committed), "before the kill")
        _assert_exactly_committed(rows, orders)
        announce(
            f"compose: {len(orders.committed)} committed orders written once, "
            f"{len(orders.rolled_back)} rolled back absent"
        )

        # Kill one replica while the next orders are in flight; the survivor (or the
        # replica docker restarts) promotes what the killed one had not.
        victim, halfway = coordinators[0], threading.Event()
        sender = orders.send_in_background(range(60, 180), halfway)
        assert halfway.wait(SENDER_TIMEOUT_S), "the second orders were never sent"
        docker_kill(victim)
        sender.join(SENDER_TIMEOUT_S)
        assert not sender.is_alive(), "sending orders hung after the replica kill"
        if orders.error is not None:
            raise orders.error
    rows = _await_rows(spark_reader, output, set(orders.committed), "after the kill")
    _assert_exactly_committed(rows, orders)
    announce(
        f"compose: killed coordinator {victim[:12]} mid-flow; {len(orders.committed)} "
        f"committed orders written once, {len(orders.rolled_back)} rolled back absent"
    )
