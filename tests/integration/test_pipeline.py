"""Spark over promoted topics with a coordinator crash, and the demo end to end."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import fastavro
import pytest

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, SystemTopicError, TransactionProducer
from tests.integration.txn_helpers import (
    REPO,
    ScriptedListener,
    send_through_coordinator_crash,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = {
    "type": "record",
    "name": "Payment",
    "fields": [{"name": "id", "type": "int"}, {"name": "amount", "type": "double"}],
}


def _avro(record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), record)
    return out.getvalue()


def test_spark_output_equals_committed_set_across_coordinator_crash_and_job_restart(
    broker, make_topic, unique, tmp_path
):
    from spark.job import JobSettings, build_session, run_job

    prefix = unique("p").replace("-", "")
    topic = make_topic("payments", partitions=2)
    total = 600
    committed = {i for i in range(total) if i % 4 != 3}
    listener = ScriptedListener(
        lambda v: (
            S.ROLLBACK_MESSAGE
            if fastavro.schemaless_reader(io.BytesIO(v), fastavro.parse_schema(SCHEMA))["id"] % 4
            == 3
            else S.COMMIT_MESSAGE
        ),
        lambda v: S.UNKNOW,
    )
    conf = broker.conf()
    with TransactionProducer(
        conf, producer_group=unique("pg"), listener=listener, topic_prefix=prefix, half_partitions=4
    ) as producer:
        messages = [
            Message(topic, _avro({"id": i, "amount": i / 10}), key=str(i % 7)) for i in range(total)
        ]
        send_through_coordinator_crash(
            broker, prefix, topic, 2, producer, messages, kill_after=100, expect=len(committed)
        )

    schema_file = tmp_path / "payment.avsc"
    schema_file.write_text(json.dumps(SCHEMA))
    output, checkpoint = tmp_path / "out", tmp_path / "ckpt"
    # Built with the Kafka source jars: the first session of the JVM fixes its classpath.
    spark = build_session("local[2]")
    try:
        for _ in range(2):  # the second run of the same checkpoint must add nothing
            run_job(
                JobSettings(
                    bootstrap_servers=broker.bootstrap,
                    topics=topic,
                    output=output,
                    checkpoint=checkpoint,
                    avro_schema=schema_file,
                    available_now=True,
                    topic_prefix=prefix,
                ),
                spark=spark,
            )
            ids = [r["id"] for r in spark.read.parquet(str(output)).select("id").collect()]
            assert len(ids) == len(committed) and set(ids) == committed
        with pytest.raises(SystemTopicError):
            run_job(
                JobSettings(
                    bootstrap_servers=broker.bootstrap,
                    topics=f"^{prefix}_h.*",
                    output=tmp_path / "never",
                    available_now=True,
                    topic_prefix=prefix,
                ),
                spark=spark,
            )
        with pytest.raises(SystemTopicError):
            run_job(
                JobSettings(
                    bootstrap_servers=broker.bootstrap,
                    topics="^__rmq_half$",
                    output=tmp_path / "never",
                    available_now=True,
                ),
                spark=spark,
            )
    finally:
        spark.stop()


def test_demo_prints_pass_and_exits_zero():
    proc = subprocess.run(
        [sys.executable, "-m", "rmq_semantics", "demo", "--orders", "30"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS" in proc.stdout
    assert "orders committed (SQLite)" in proc.stdout
    # Spark's log4j lines name their logger's class: none of spark-avro's may warn.
    avro_warnings = re.findall(r"^.* (?:WARN|WARNING) Avro\w*:.*$", proc.stderr, re.MULTILINE)
    assert avro_warnings == [], avro_warnings[:5]
    # The slow order (one in 30) held its local transaction open until its check waited on it.
    waited = re.search(r"back-checks that found a local transaction running\D+(\d+)", proc.stdout)
    assert waited and int(waited.group(1)) >= 1, proc.stdout[-3000:]


def test_demo_interrupted_with_ctrl_c_stops_everything_it_started(tmp_path):
    work = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_semantics", "demo", "--work-dir", str(work), "--keep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    try:
        for line in proc.stdout:
            if "order service" in line:  # broker and coordinator are up
                break
        broker = json.loads((work / "kafka" / "broker.json").read_text())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not Path(f"/proc/{broker['pid']}").exists(), "the demo left its broker running"
    leftovers = subprocess.run(
        ["pgrep", "-f", f"coordinator --bootstrap-servers 127.0.0.1:{broker['port']}"],
        capture_output=True,
        text=True,
    )
    assert leftovers.stdout == "", "the demo left its coordinator running"
