"""The Spark job on a real broker: promoted records only, exactly once across restarts."""

from __future__ import annotations

import io
import json
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from confluent_kafka import Producer
from pyspark.sql import SparkSession

from rmq_semantics.errors import SystemTopicError
from spark.job import JobSettings, build_session, run_job

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
# A cold local Spark plus the Kafka source needs ~20 s on 2 cores; leave room for CI.
JOB_TIMEOUT_S = 240.0
# Producer flush and transaction calls against a local broker.
KAFKA_TIMEOUT_S = 30.0

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "sku", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": ["null", "double"], "default": None},
    ],
}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = build_session(
        "local[2]", "rmq-test-spark-job", conf={"spark.default.parallelism": "2"}
    )
    yield session
    session.stop()


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "order.avsc"
    path.write_text(json.dumps(ORDER_SCHEMA))
    return path


def source_options(conf: dict) -> dict[str, str]:
    """The broker's security settings as Spark Kafka source options (``kafka.*``)."""
    if "sasl.username" not in conf:
        return {}
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{conf["sasl.username"]}" password="{conf["sasl.password"]}";'
    )
    return {
        "kafka.security.protocol": conf["security.protocol"],
        "kafka.sasl.mechanism": conf["sasl.mechanisms"],
        "kafka.sasl.jaas.config": jaas,
    }


def encode(record: dict) -> bytes:
    import fastavro

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(ORDER_SCHEMA), record)
    return buf.getvalue()


def order(i: int) -> dict:
    return {"id": i, "sku": f"sku-{i}", "qty": i, "price": None if i % 2 else i + 0.5}


def promote(
    conf: dict, topic: str, ids: list[int], first_half_offset: int, commit: bool = True
) -> None:
    """Write records as the coordinator does: restored value, headers, one Kafka txn."""
    producer = Producer({**conf, "transactional.id": f"test-promote-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(KAFKA_TIMEOUT_S)
    producer.begin_transaction()
    for n, i in enumerate(ids):
        producer.produce(
            topic,
            key=f"k{i}",
            value=encode(order(i)),
            headers=[
                ("rmq.txn_id", f"txn-{i}"),
                ("app", b"x"),
                ("rmq.promoted_from", f"3:{first_half_offset + n}"),
            ],
        )
    if commit:
        producer.commit_transaction(KAFKA_TIMEOUT_S)
    else:
        producer.abort_transaction(KAFKA_TIMEOUT_S)


def write_plain(conf: dict, topic: str, values: list[bytes], headers: list | None = None) -> None:
    """Records written around the protocol: no ``rmq.promoted_from``."""
    producer = Producer(conf)
    for value in values:
        producer.produce(topic, value=value, headers=headers or [])
    assert producer.flush(KAFKA_TIMEOUT_S) == 0


def read_rows(spark: SparkSession, output: Path) -> list[dict]:
    return [r.asDict() for r in spark.read.parquet(str(output)).orderBy("id").collect()]


def test_available_now_writes_exactly_the_promoted_records_once_across_restarts(
    broker, make_topic, spark, schema_file, tmp_path
):
    topic = make_topic("orders", partitions=2)
    conf = broker.conf()
    promote(conf, topic, [1, 2, 3, 4, 5], first_half_offset=17)
    promote(conf, topic, [90, 91], first_half_offset=40, commit=False)  # never visible
    write_plain(
        conf, topic, [encode(order(100)), encode(order(101))], headers=[("rmq.txn_id", b"txn-100")]
    )  # a half-like record, not promoted
    write_plain(conf, topic, [encode(order(102))])
    output, checkpoint = tmp_path / "out", tmp_path / "out.ckpt"
    job = JobSettings(
        bootstrap_servers=broker.bootstrap,
        topics=topic,
        output=output,
        checkpoint=checkpoint,
        avro_schema=schema_file,
        available_now=True,
        kafka_options=source_options(conf),
    )
    run = {"spark": spark, "timeout_s": JOB_TIMEOUT_S}

    first = run_job(job, **run)

    assert (first.rows_written, first.dropped_unpromoted, first.decode_errors) == (5, 3, 0)
    rows = read_rows(spark, output)
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0] == {
        "id": 1,
        "sku": "sku-1",
        "qty": 1,
        "price": None,
        "_decode_error": None,
        "_topic": topic,
        "_partition": rows[0]["_partition"],
        "_offset": rows[0]["_offset"],
        "_key": "k1",
        "_timestamp": rows[0]["_timestamp"],
        "_txn_id": "txn-1",
        "_promoted_from": "3:17",
    }
    assert {r["_promoted_from"] for r in rows} == {f"3:{o}" for o in range(17, 22)}

    promote(conf, topic, [6, 7], first_half_offset=60)
    write_plain(conf, topic, [encode(order(103))])
    promote(conf, topic, [8], first_half_offset=70)
    producer = Producer({**conf, "transactional.id": f"test-garbage-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(KAFKA_TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(
        topic,
        key="bad",
        value=b"\xff\x00not avro",
        headers=[("rmq.promoted_from", "3:80"), ("rmq.txn_id", "txn-bad")],
    )
    producer.commit_transaction(KAFKA_TIMEOUT_S)

    second = run_job(job, **run)

    assert (second.rows_written, second.dropped_unpromoted, second.decode_errors) == (4, 1, 1)
    rows = read_rows(spark, output)
    good = [r for r in rows if r["_decode_error"] is None]
    assert [r["id"] for r in good] == [1, 2, 3, 4, 5, 6, 7, 8]
    [bad] = [r for r in rows if r["_decode_error"] is not None]
    assert (bad["id"], bad["_txn_id"], bad["_key"]) == (None, "txn-bad", "bad")
    assert len({(r["_partition"], r["_offset"]) for r in rows}) == len(rows) == 9

    third = run_job(job, **run)  # nothing new: nothing written, nothing repeated
    assert third.rows_written == 0
    assert len(read_rows(spark, output)) == 9


def test_system_topic_pattern_is_refused_before_spark_reads_anything(broker, tmp_path, monkeypatch):
    import spark.job as job

    def no_spark(*args: object, **kwargs: object) -> None:
        raise AssertionError("a Spark session was requested for a refused subscription")

    monkeypatch.setattr(job, "build_session", no_spark)
    for topics in ("^__rmq.*", "__rmq_half", ".*"):
        with pytest.raises(SystemTopicError):
            job.run_job(
                job.JobSettings(
                    bootstrap_servers=broker.bootstrap,
                    topics=topics,
                    output=tmp_path / "out",
                    available_now=True,
                ),
                timeout_s=JOB_TIMEOUT_S,
            )
    assert list(tmp_path.iterdir()) == []


def test_cli_available_now_writes_promoted_records_and_exits_zero(
    broker, make_topic, spark, schema_file, tmp_path
):
    topic = make_topic("cli-orders")
    conf = broker.conf()
    promote(conf, topic, [1, 2], first_half_offset=17)
    write_plain(conf, topic, [encode(order(3))])
    output = tmp_path / "cli-out"
    cmd = [
        sys.executable,
        "-m",
        "rmq_semantics",
        "spark",
        "--bootstrap-servers",
        broker.bootstrap,
        "--topics",
        f"^{topic}$",
        "--output",
        str(output),
        "--avro-schema",
        str(schema_file),
        "--available-now",
        "--master",
        "local[2]",
    ]
    for key, value in source_options(conf).items():
        cmd += ["--kafka-option", f"{key}={value}"]

    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)

    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (summary["rows_written"], summary["dropped_unpromoted"], summary["decode_errors"]) == (
        2,
        1,
        0,
    )
    assert [r["id"] for r in read_rows(spark, output)] == [1, 2]
    assert (tmp_path / "cli-out.checkpoint").is_dir()


def test_cli_streaming_job_stops_cleanly_on_sigterm_after_writing(
    broker, make_topic, spark, tmp_path
):
    topic = make_topic("cli-stream")
    conf = broker.conf()
    write_plain(conf, topic, [b"one", b"two"], headers=[("rmq.promoted_from", b"1:1")])
    output = tmp_path / "stream-out"
    cmd = [
        sys.executable,
        "-m",
        "rmq_semantics",
        "spark",
        "--bootstrap-servers",
        broker.bootstrap,
        "--topics",
        topic,
        "--output",
        str(output),
        "--master",
        "local[2]",
    ]
    for key, value in source_options(conf).items():
        cmd += ["--kafka-option", f"{key}={value}"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        seen: list[str] = []
        while not any("2 rows written" in line for line in seen[-1:]):
            try:
                seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                pytest.fail("the job logged no written batch:\n" + "".join(seen[-30:]))
        proc.send_signal(signal.SIGTERM)
        proc.wait(JOB_TIMEOUT_S)  # stderr is drained by the thread, stdout holds one line
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0
    assert json.loads(out.strip().splitlines()[-1])["rows_written"] == 2
    assert sorted(r.value for r in spark.read.parquet(str(output)).collect()) == ["one", "two"]


def test_cli_refuses_a_system_topic_pattern_with_one_error_line(broker, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "spark",
            "--bootstrap-servers",
            broker.bootstrap,
            "--topics",
            "^__rmq.*",
            "--output",
            str(tmp_path / "o"),
            "--available-now",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("rmq-semantics: error: topic pattern '^__rmq.*' is refused")


def test_tags_keep_exactly_the_records_whose_rmq_tags_match(
    broker, make_topic, spark, schema_file, tmp_path
):
    topic = make_topic("tagged")
    conf = broker.conf()
    producer = Producer({**conf, "transactional.id": f"test-tags-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(KAFKA_TIMEOUT_S)
    producer.begin_transaction()
    for i, tag in enumerate(["TagA", "TagC", "TagB", None, "TagA"], start=1):
        headers = [("rmq.promoted_from", f"3:{i}")] + ([("rmq.tags", tag)] if tag else [])
        producer.produce(topic, key=f"k{i}", value=encode(order(i)), headers=headers)
    producer.commit_transaction(KAFKA_TIMEOUT_S)
    output = tmp_path / "tags-out"
    job = JobSettings(
        bootstrap_servers=broker.bootstrap,
        topics=topic,
        output=output,
        avro_schema=schema_file,
        available_now=True,
        tags="TagA || TagB",
        kafka_options=source_options(conf),
    )

    result = run_job(job, spark=spark, timeout_s=JOB_TIMEOUT_S)

    assert result.rows_written == 3
    assert [r["id"] for r in read_rows(spark, output)] == [1, 3, 5]
