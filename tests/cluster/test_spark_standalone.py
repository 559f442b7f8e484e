"""The Spark job on the 3-node Kafka cluster and a Spark standalone cluster (a master and two
workers from PySpark's own launcher): its output is the committed set, a worker SIGKILLed
mid-run included."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

pytest.importorskip("pyspark")

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from spark.job import JobSettings, build_session, run_job
from spark.standalone import StandaloneCluster
from tests.integration.txn_helpers import CoordinatorProcess, ScriptedListener, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

TOTAL = 1000
JOB_TIMEOUT_S = 600.0


def _answer(value: bytes) -> S:
    # Every fifth transaction rolls back: it must never reach the Parquet output.
    return S.ROLLBACK_MESSAGE if int(value[1:]) % 5 == 0 else S.COMMIT_MESSAGE


def _values(spark, output) -> list[bytes]:
    from pyspark.errors import AnalysisException

    try:
        rows = spark.read.parquet(str(output)).select("value").collect()
    except AnalysisException:  # no batch committed yet: no table to read
        return []
    # Without an Avro schema the job writes the value as a string.
    return [r.value.encode() if isinstance(r.value, str) else bytes(r.value) for r in rows]


def test_spark_standalone_writes_the_committed_set_through_a_worker_kill(
    broker, make_topic, unique, tmp_path
):
    prefix = unique("sp").replace("-", "")
    topic = make_topic("spark", partitions=4)
    committed = {f"m{i}".encode() for i in range(TOTAL) if i % 5}
    listener = ScriptedListener(_answer, _answer)
    output, stop = tmp_path / "out", threading.Event()
    errors: list[BaseException] = []
    coordinator = CoordinatorProcess(
        broker.bootstrap, tmp_path / "coordinator.log", topic_prefix=prefix
    )
    try:
        coordinator.wait_ready()
        with StandaloneCluster(tmp_path / "spark", workers=2) as spark_cluster:
            spark = build_session(
                spark_cluster.master_url,
                "rmq-test-standalone",
                conf={"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2"},
            )
            job = JobSettings(
                bootstrap_servers=broker.bootstrap,
                topics=topic,
                output=str(output),
                checkpoint=str(tmp_path / "checkpoint"),
                spark_master=spark_cluster.master_url,
            )

            def run() -> None:
                try:
                    run_job(job, spark=spark, timeout_s=JOB_TIMEOUT_S, stop_event=stop)
                except BaseException as exc:  # reported by the test, not lost in a thread
                    errors.append(exc)

            runner = threading.Thread(target=run, name="spark-job", daemon=True)
            runner.start()
            with TransactionProducer(
                broker.conf(),
                producer_group=unique("pg"),
                listener=listener,
                topic_prefix=prefix,
                half_partitions=4,
            ) as producer:
                for i in range(TOTAL // 2):
                    producer.send_message_in_transaction(Message(topic, f"m{i}".encode()))
                wait_for(lambda: _values(spark, output) or errors, 240, "a first batch")
                spark_cluster.kill_worker(0)  # its tasks go to the other worker
                for i in range(TOTAL // 2, TOTAL):
                    producer.send_message_in_transaction(Message(topic, f"m{i}".encode()))
            wait_for(
                lambda: len(_values(spark, output)) >= len(committed) or errors,
                300,
                "every committed message in the Parquet output",
            )
            stop.set()
            runner.join(JOB_TIMEOUT_S)
            values = _values(spark, output)
            spark.stop()
    finally:
        coordinator.stop()
    assert not errors, errors
    counts = Counter(values)
    assert set(counts) == committed and set(counts.values()) == {1}
