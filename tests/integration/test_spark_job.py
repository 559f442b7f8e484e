"""The Spark job on a real broker: promoted records only, exactly once across restarts into
Parquet, at least once into a Kafka topic (micro-batch and Real-time Mode)."""

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

from confluent_kafka import Consumer, Producer
from pyspark.sql import SparkSession

from rmq_semantics.errors import ConfigError, SystemTopicError
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


def spark_cli(broker, *args: str) -> list[str]:
    """``rmq-semantics spark`` against ``broker`` with ``args``, and its security settings."""
    cmd = [sys.executable, "-m", "rmq_semantics", "spark", "--bootstrap-servers", broker.bootstrap]
    for key, value in source_options(broker.conf()).items():
        cmd += ["--kafka-option", f"{key}={value}"]
    return [*cmd, *args]


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
    # The timer topics too (issue 35): a scheduled message waits there until it is due.
    for topics in (
        "^__rmq.*",
        "__rmq_half",
        ".*",
        "__rmq_timer",
        "__rmq_timer_1",
        "^__rmq_timer.*",
    ):
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
    cmd = spark_cli(
        broker,
        "--topics",
        f"^{topic}$",
        "--output",
        str(output),
        "--avro-schema",
        str(schema_file),
        "--available-now",
        "--master",
        "local[2]",
    )

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
    cmd = spark_cli(
        broker,
        "--topics",
        topic,
        "--output",
        str(output),
        "--master",
        "local[2]",
    )
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


def _one_error_line(bootstrap: str, *args: str) -> str:
    """``rmq-semantics spark`` with ``args`` exits 2 with one error line and no traceback;
    that line."""
    proc = subprocess.run(
        [sys.executable, "-m", "rmq_semantics", "spark", "--bootstrap-servers", bootstrap, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    return lines[0]


def test_cli_refuses_a_system_topic_pattern_with_one_error_line(broker, tmp_path):
    line = _one_error_line(
        broker.bootstrap, "--topics", "^__rmq.*", "--output", str(tmp_path / "o"), "--available-now"
    )
    assert line.startswith("rmq-semantics: error: topic pattern '^__rmq.*' is refused")


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


# --------------------------------------------------------------------------- Kafka sink


def read_topic(conf: dict, topic: str, done, timeout_s: float = JOB_TIMEOUT_S) -> list[dict]:
    """Read ``topic`` from the start until ``done(records)``; each record as key, value
    (JSON), headers (last value per name)."""
    consumer = Consumer(
        {
            **conf,
            "group.id": f"test-read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    records: list[dict] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not done(records):
            if time.monotonic() >= deadline:
                pytest.fail(f"{topic}: {len(records)} records after {timeout_s} s: {records}")
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            headers = {k: v.decode() for k, v in msg.headers() or []}
            records.append({"key": msg.key(), "value": json.loads(msg.value()), "headers": headers})
    finally:
        consumer.close()
    return records


def read_all(conf: dict, topic: str) -> list[dict]:
    """Every record on ``topic`` (one partition, written without transactions: its end
    offset is its record count)."""
    from confluent_kafka import TopicPartition

    probe = Consumer({**conf, "group.id": f"test-probe-{uuid.uuid4().hex[:8]}"})
    try:
        _, end = probe.get_watermark_offsets(TopicPartition(topic, 0), KAFKA_TIMEOUT_S)
    finally:
        probe.close()
    return read_topic(conf, topic, lambda rs: len(rs) >= end)


def by_txn(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The consumer-side dedupe the docs describe: group by (rmq.txn_id, rmq.promoted_from)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        key = (r["headers"]["rmq.txn_id"], r["headers"]["rmq.promoted_from"])
        groups.setdefault(key, []).append(r)
    return groups


def ids_of(records: list[dict]) -> set[int]:
    return {r["value"]["id"] for r in records}


def test_kafka_sink_micro_batch_writes_committed_promoted_records_with_their_txn_id(
    broker, make_topic, spark, schema_file, tmp_path
):
    topic, out = make_topic("kafka-in", partitions=2), make_topic("kafka-out")
    conf = broker.conf()
    promote(conf, topic, [1, 2, 3], first_half_offset=10)
    promote(conf, topic, [90], first_half_offset=20, commit=False)
    write_plain(conf, topic, [encode(order(100))], headers=[("rmq.txn_id", b"txn-100")])
    job = JobSettings(
        bootstrap_servers=broker.bootstrap,
        topics=topic,
        sink="kafka",
        output_topic=out,
        checkpoint=tmp_path / "ck",
        avro_schema=schema_file,
        available_now=True,
        kafka_options=source_options(conf),
    )

    result = run_job(job, spark=spark, timeout_s=JOB_TIMEOUT_S)

    assert (result.rows_written, result.dropped_unpromoted, result.decode_errors) == (3, 1, 0)
    records = read_all(conf, out)
    assert sorted(r["value"]["id"] for r in records) == [1, 2, 3]
    one = next(r for r in records if r["value"]["id"] == 1)
    assert one["key"] == b"k1"
    assert one["headers"] == {"rmq.txn_id": "txn-1", "app": "x", "rmq.promoted_from": "3:10"}
    value = one["value"]
    assert (value["sku"], value["_txn_id"], value["_promoted_from"]) == ("sku-1", "txn-1", "3:10")
    assert (value["_topic"], value["_key"]) == (topic, "k1")
    assert all(r["headers"]["rmq.txn_id"] == r["value"]["_txn_id"] for r in records)

    again = run_job(job, spark=spark, timeout_s=JOB_TIMEOUT_S)  # the checkpoint: nothing new
    assert again.rows_written == 0


def test_kafka_sink_realtime_delivers_committed_records_at_least_once_identified_by_txn_id(
    broker, make_topic, spark, schema_file, tmp_path
):
    topic, out = make_topic("rtm-in", partitions=2), make_topic("rtm-out")
    conf = broker.conf()
    promote(conf, topic, [1, 2, 3, 4], first_half_offset=10)
    promote(conf, topic, [90, 91], first_half_offset=20, commit=False)  # rolled back
    write_plain(conf, topic, [encode(order(100))])  # not promoted
    pending = Producer({**conf, "transactional.id": f"test-pending-{uuid.uuid4().hex[:8]}"})
    pending.init_transactions(KAFKA_TIMEOUT_S)
    pending.begin_transaction()
    for n, i in enumerate([50, 51]):
        pending.produce(
            topic,
            key=f"k{i}",
            value=encode(order(i)),
            headers=[("rmq.txn_id", f"txn-{i}"), ("rmq.promoted_from", f"3:{30 + n}")],
        )
    assert pending.flush(KAFKA_TIMEOUT_S) == 0  # on the topic, its transaction still open
    checkpoint = tmp_path / "rtm-ck"
    job = dict(
        bootstrap_servers=broker.bootstrap,
        topics=topic,
        sink="kafka",
        output_topic=out,
        checkpoint=checkpoint,
        avro_schema=schema_file,
        trigger="realtime",
        kafka_options=source_options(conf),
    )

    def run(settings: JobSettings, stop: threading.Event) -> dict:
        outcome: dict = {}

        def target() -> None:
            try:
                outcome["result"] = run_job(
                    settings, spark=spark, timeout_s=JOB_TIMEOUT_S, stop_event=stop
                )
            except BaseException as exc:  # re-raised in the test's thread by finish()
                outcome["error"] = exc

        outcome["thread"] = threading.Thread(target=target, name="rtm-job")
        outcome["thread"].start()
        return outcome

    def finish(outcome: dict, stop: threading.Event) -> object:
        stop.set()
        outcome["thread"].join(JOB_TIMEOUT_S)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    # Run 1: a 30 s batch, stopped once the records are out, i.e. inside its first batch,
    # which is never checkpointed: the restart re-emits it.
    stop = threading.Event()
    first = run(JobSettings(**job, realtime_batch_s=30), stop)
    read_topic(conf, out, lambda rs: ids_of(rs) >= {1, 2, 3, 4})
    finish(first, stop)
    assert ids_of(read_all(conf, out)) == {1, 2, 3, 4}

    # Run 2 on the same checkpoint: more records commit while it runs.
    stop = threading.Event()
    second = run(JobSettings(**job, realtime_batch_s=5), stop)
    pending.abort_transaction(KAFKA_TIMEOUT_S)
    promote(conf, topic, [5, 6], first_half_offset=40)
    read_topic(conf, out, lambda rs: ids_of(rs) >= {1, 2, 3, 4, 5, 6})
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (checkpoint / "commits" / "0").exists():  # a batch ended: its metrics are in
        assert time.monotonic() < deadline, "no Real-time batch was checkpointed"
        time.sleep(0.2)
    result = finish(second, stop)
    records = read_all(conf, out)

    assert ids_of(records) == {1, 2, 3, 4, 5, 6}  # none rolled back, pending or unpromoted
    groups = by_txn(records)
    assert sorted(groups) == sorted(
        (f"txn-{i}", f"3:{o}") for i, o in [(1, 10), (2, 11), (3, 12), (4, 13), (5, 40), (6, 41)]
    )
    for copies in groups.values():  # a duplicate is the same record again: drop it by key
        assert all(c["value"] == copies[0]["value"] for c in copies)
        assert all(c["value"]["_txn_id"] == c["headers"]["rmq.txn_id"] for c in copies)
    assert result.dropped_unpromoted == 1 and result.decode_errors == 0


def test_cli_realtime_kafka_sink_delivers_committed_records_and_stops_on_sigterm(
    broker, make_topic, schema_file, tmp_path
):
    topic, out = make_topic("cli-rtm-in", partitions=2), make_topic("cli-rtm-out")
    conf = broker.conf()
    promote(conf, topic, [7, 8], first_half_offset=10)
    promote(conf, topic, [99], first_half_offset=20, commit=False)  # rolled back
    write_plain(conf, topic, [encode(order(100))])  # not promoted
    cmd = spark_cli(
        broker,
        "--topics",
        topic,
        "--sink",
        "kafka",
        "--output-topic",
        out,
        "--checkpoint",
        str(tmp_path / "ck"),
        "--avro-schema",
        str(schema_file),
        "--trigger",
        "realtime",
        "--master",
        "local[2]",
    )
    with open(tmp_path / "stderr.log", "w") as stderr:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            read_topic(conf, out, lambda rs: ids_of(rs) >= {7, 8})
            proc.send_signal(signal.SIGTERM)
            out_text, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    log = (tmp_path / "stderr.log").read_text()

    assert proc.returncode == 0, log[-3000:]
    assert "Traceback" not in log
    records = read_all(conf, out)
    assert ids_of(records) == {7, 8}  # nothing rolled back or unpromoted
    assert sorted(by_txn(records)) == [("txn-7", "3:10"), ("txn-8", "3:11")]
    assert "rows_written" in json.loads(out_text.strip().splitlines()[-1])


def test_realtime_refuses_a_master_with_fewer_cores_than_partitions(
    broker, make_topic, spark, tmp_path
):
    topic = make_topic("rtm-wide", partitions=3)  # the module's session is local[2]
    job = JobSettings(
        bootstrap_servers=broker.bootstrap,
        topics=topic,
        sink="kafka",
        output_topic=f"{topic}-out",
        checkpoint=tmp_path / "ck",
        trigger="realtime",
        kafka_options=source_options(broker.conf()),
    )
    with pytest.raises(ConfigError, match=r"the subscription has 3 partitions, master local\[2\]"):
        run_job(job, spark=spark, timeout_s=JOB_TIMEOUT_S)
    assert not (tmp_path / "ck").exists()


def test_cli_refuses_parquet_with_the_realtime_trigger_in_one_line(tmp_path):
    line = _one_error_line(
        "127.0.0.1:9",
        "--topics",
        "orders",
        "--output",
        str(tmp_path / "o"),
        "--trigger",
        "realtime",
    )
    assert "Parquet stays micro-batch" in line
    assert list(tmp_path.iterdir()) == []
