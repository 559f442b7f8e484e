"""The Spark job's I/O shell: Kafka source → :mod:`spark.transforms` → checkpointed sink.

Reads only promoted (business) topics, ``read_committed``, with headers; drops and counts
records without ``rmq.promoted_from``; writes Parquet (or the console) with a checkpoint,
so a restart neither loses nor repeats rows, or a Kafka topic (:mod:`spark.sinks`: at least
once, micro-batch or Spark's Real-time Mode; each record keeps its ``rmq.txn_id``).
What to read and where to write is a :class:`~spark.settings.JobSettings`, checked before
any JVM starts. PySpark is imported inside functions only: ``rmq-semantics`` imports this
module to register its subcommand.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rmq_semantics.errors import ConfigError, RmqError, RmqTimeoutError, SparkJobError
from rmq_semantics.settings import env_name
from spark import sinks
from spark.kafka_options import spark_kafka_options
from spark.settings import SINKS, TRIGGERS, JobSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "JobResult",
    "JobSettings",
    "SparkJobError",
    "build_session",
    "register_cli",
    "run_job",
    "spark_kafka_options",
]

log = logging.getLogger(__name__)

DEFAULT_APP_NAME = "rmq-semantics-spark"
DEFAULT_MASTER = "local[*]"
# How often the driver wakes to collect batch metrics and check for a stop request.
POLL_S = 1.0
# Stopping a query interrupts its batch; the file sink then discards the uncommitted files.
STOP_TIMEOUT_S = 60.0
_SINK_METRICS = "rmq_sink"
# spark-avro's serializer warns, per task and per field, that a nullable value "will throw"
# under a non-nullable Avro schema: decode_avro re-encodes what from_avro decoded, which
# Spark's PERMISSIVE mode makes nullable throughout, yet only rows with every required field
# set reach to_avro (transforms._decode_error checks that first). The exception it warns of
# would still raise; only this logger's warning goes.
_QUIET_LOGGERS = {"org.apache.spark.sql.avro.AvroSerializer": "ERROR"}
_KAFKA_MISSING = "Failed to find data source: kafka"


@dataclass(frozen=True)
class JobResult:
    """What one run of the job did, summed over its micro-batches.

    ``dropped_unpromoted`` counts records read without ``rmq.promoted_from`` (dropped when
    promoted records are required); ``decode_errors`` counts written rows whose value did
    not decode (their ``_decode_error`` column says why).
    """

    rows_written: int
    dropped_unpromoted: int
    decode_errors: int
    batches: int


def build_session(
    master: str = DEFAULT_MASTER,
    app_name: str = DEFAULT_APP_NAME,
    *,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession with Spark's Kafka source and spark-avro on its classpath.

    Hands Spark the resolved jars via ``spark.jars``; with ``RMQ_SPARK_USE_PACKAGES=1``
    it sets ``spark.jars.packages`` to the Maven coordinates instead (for clusters that
    resolve their own). Local masters get 2 shuffle partitions and 1g of driver memory;
    the UI is off. ``conf`` entries win over these defaults.

    The first session of a Python process fixes the driver classpath: a session created
    earlier without these jars is returned as is and cannot read Kafka or decode Avro.
    spark-avro's warning about nullable values (see ``_QUIET_LOGGERS``) is turned off in
    the driver's JVM, which holds the executors of a local master.
    """
    from pyspark.sql import SparkSession

    from spark.jars import spark_jars, spark_packages

    # Python UDF workers must run this interpreter, not PATH's python3.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings: dict[str, str] = {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"}
    if os.environ.get("RMQ_SPARK_USE_PACKAGES") == "1":
        settings["spark.jars.packages"] = spark_packages()
    else:
        settings["spark.jars"] = ",".join(spark_jars())
    if master.startswith("local"):
        settings.update({"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"})
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    _quiet_loggers(session)
    return session


def _quiet_loggers(spark: SparkSession) -> None:
    """Set the log4j levels of ``_QUIET_LOGGERS`` in the driver's JVM."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 (PySpark's only way into the JVM's log4j)
    if jvm is None:
        return
    log4j = jvm.org.apache.logging.log4j
    for name, level in _QUIET_LOGGERS.items():
        log4j.core.config.Configurator.setLevel(name, log4j.Level.toLevel(level))


def run_job(
    settings: JobSettings,
    *,
    spark: SparkSession | None = None,
    timeout_s: float | None = None,
    stop_event: threading.Event | None = None,
) -> JobResult:
    """Stream the promoted records ``settings`` names into its sink; return what was done.

    With ``settings.available_now`` the job processes what is there and returns;
    otherwise it runs until ``stop_event`` is set (or ``timeout_s`` passes, which raises
    :class:`RmqTimeoutError`). ``spark``: a session to use (left running); without it one
    is built on ``settings.spark_master`` (else ``$RMQ_SPARK_MASTER``, else ``local[*]``)
    and stopped at the end. A subscription pattern is checked once more by Java's regex
    engine before the query starts.
    """
    if not isinstance(settings, JobSettings):
        raise ConfigError(
            f"run_job takes a JobSettings, got {type(settings).__name__}: "
            "run_job(JobSettings(bootstrap_servers=..., topics=..., output=...))"
        )
    own_session = False
    if spark is None:
        from pyspark import SparkContext

        # A session the caller already runs (in any thread) is used and left running.
        own_session = SparkContext._active_spark_context is None  # noqa: SLF001 (no public probe)
        spark = build_session(_master(settings))
    try:
        from spark.subscription import confirm_with_java

        confirm_with_java(spark, settings.subscription, settings.topic_prefix)
        sinks.check_realtime_cores(spark, settings)
        query = sinks.start(_build_frame(spark, settings), settings)
        return _await(query, settings.require_promoted, timeout_s, stop_event)
    finally:
        if own_session:
            spark.stop()


def _master(settings: JobSettings) -> str:
    return settings.spark_master or os.environ.get("RMQ_SPARK_MASTER") or DEFAULT_MASTER


def _build_frame(spark: SparkSession, settings: JobSettings) -> DataFrame:
    from pyspark.sql import functions as F

    from spark import transforms

    # One observe, at the sink: the filter is the only step that drops rows, so the records
    # it dropped are the batch's input rows minus the rows written (see _Metrics). A second
    # observe before the filter would cut the query into two generated stages and copy
    # every row between them.
    raw = _load_source(spark, settings)
    kept = transforms.drop_unpromoted(raw) if settings.require_promoted else raw
    if settings.tag_values is not None:
        kept = transforms.keep_tags(kept, settings.tag_values)
    carry = transforms.KAFKA_CARRY if settings.sink == "kafka" else ()
    if settings.schema is None:
        out = transforms.decode_string(kept, carry)
        errors = F.count(F.when(F.lit(False), 1))  # observe() takes aggregates only
    else:
        out = transforms.decode_avro(kept, settings.schema.json, carry)
        errors = F.count(F.col(transforms.DECODE_ERROR_COLUMN))
    # Real-time Mode allows observe() (CollectMetricsExec is on its allowlist): the metrics
    # arrive once per batch, at its end.
    observed = out.observe(
        _SINK_METRICS, F.count(F.lit(1)).alias("rows"), errors.alias("decode_errors")
    )
    return transforms.kafka_records(observed) if carry else observed


def _load_source(spark: SparkSession, settings: JobSettings) -> DataFrame:
    sub = settings.subscription
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option(sub.option, sub.value)
    )
    for key, val in settings.source_options.items():
        reader = reader.option(key, val)
    try:
        return reader.load()
    except Exception as exc:
        if _KAFKA_MISSING not in str(exc):
            raise
    _add_jars(spark)
    try:
        return reader.load()
    except Exception as again:
        if _KAFKA_MISSING not in str(again):
            raise
        from spark.jars import spark_packages

        raise ConfigError(
            "Spark's Kafka source is not on this session's classpath: create the first "
            "SparkSession of the process with spark.job.build_session(), or start Spark "
            f"with --packages {spark_packages()}"
        ) from again


def _add_jars(spark: SparkSession) -> None:
    """Add the job's jars to a running session that was built without them (``ADD JAR``).

    The driver's classpath is fixed when the first session of a process starts; ``ADD
    JAR`` extends the session's class loader, which the streaming query thread inherits.
    """
    from spark.jars import spark_jars

    try:
        jars = spark_jars()
    except RmqError as exc:
        log.warning("cannot add Spark's Kafka source to the running session: %s", exc)
        return
    log.info("adding Spark's Kafka source to the running session (%d jars)", len(jars))
    for jar in jars:
        spark.sql(f"ADD JAR '{jar}'")  # paths of our own jar cache, no quotes in them


class _Metrics:
    """Per-batch observed metrics, keyed by batch id so a re-run batch counts once."""

    def __init__(self, require_promoted: bool) -> None:
        self.require_promoted = require_promoted
        self.batches: dict[int, tuple[int, int, int]] = {}

    def collect(self, query: StreamingQuery) -> None:
        for progress in query.recentProgress:
            batch_id = progress.batchId
            metrics = progress.observedMetrics or {}
            if batch_id in self.batches or _SINK_METRICS not in metrics:
                continue
            out = metrics[_SINK_METRICS]
            rows, errors = int(out["rows"]), int(out["decode_errors"])
            # Every record read is written unless the promoted filter drops it.
            dropped = progress.numInputRows - rows if self.require_promoted else 0
            self.batches[batch_id] = (rows, dropped, errors)
            level = logging.WARNING if dropped or errors else logging.INFO
            log.log(
                level,
                "batch %d of %s: %d rows written, %d unpromoted records dropped, %d decode errors",
                batch_id,
                query.name or query.id,
                rows,
                dropped,
                errors,
            )

    def result(self) -> JobResult:
        done = self.batches.values()
        return JobResult(
            rows_written=sum(b[0] for b in done),
            dropped_unpromoted=sum(b[1] for b in done),
            decode_errors=sum(b[2] for b in done),
            batches=len(done),
        )


def _await(
    query: StreamingQuery,
    require_promoted: bool,
    timeout_s: float | None,
    stop_event: threading.Event | None,
) -> JobResult:
    from pyspark.errors import StreamingQueryException

    metrics = _Metrics(require_promoted)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not query.awaitTermination(POLL_S):  # type: ignore[arg-type]  # seconds, a float too
            metrics.collect(query)
            if stop_event is not None and stop_event.is_set():
                log.info("stop requested: stopping the streaming query")
                _stop(query)
                break
            if deadline is not None and time.monotonic() >= deadline:
                _stop(query)
                raise RmqTimeoutError(f"the Spark job did not finish within {timeout_s} s")
    except StreamingQueryException as exc:
        raise SparkJobError(f"the streaming query failed: {_first_line(exc)}") from exc
    except BaseException:
        _stop(query)
        raise
    metrics.collect(query)
    result = metrics.result()
    log.info(
        "spark job done: %d rows written, %d unpromoted records dropped, %d decode "
        "errors in %d batches",
        result.rows_written,
        result.dropped_unpromoted,
        result.decode_errors,
        result.batches,
    )
    return result


def _stop(query: StreamingQuery) -> None:
    if not query.isActive:
        return
    stopper = threading.Thread(target=query.stop, name="rmq-spark-stop", daemon=True)
    stopper.start()
    stopper.join(STOP_TIMEOUT_S)
    if stopper.is_alive():
        log.warning("the streaming query did not stop within %.0f s", STOP_TIMEOUT_S)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "desc", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------------------- CLI


def _kafka_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: use KEY=VALUE")
    return key.strip(), value


def register_cli(sub: Any) -> None:
    """Add the ``spark`` subcommand to the ``rmq-semantics`` argparse subparsers.

    Each flag's ``dest`` is a :class:`JobSettings` field; unset flags fall back to the
    field's ``RMQ_*`` env var, then its default.
    """
    cmd = sub.add_parser(
        "spark",
        help="stream promoted topics into Parquet (or a Kafka topic) with Spark",
        description="Read only promoted (business) topics, read_committed, "
        "drop and count records without rmq.promoted_from, "
        "decode Avro, write a checkpointed sink: Parquet (exactly once, micro-batch only) "
        "or a Kafka topic (at least once; each record keeps its rmq.txn_id header to "
        "drop duplicates by), micro-batch or --trigger realtime.",
    )
    h = JobSettings.help
    cmd.add_argument(
        "--bootstrap-servers",
        required=True,
        metavar="B",
        help="Kafka bootstrap servers, host:port[,host:port]",
    )
    cmd.add_argument(
        "--topics",
        required=True,
        metavar="T",
        help="topic names (comma-separated) or one regex anchored with ^",
    )
    cmd.add_argument("--output", metavar="DIR", help=h("output"))
    cmd.add_argument("--output-topic", metavar="T", help=h("output_topic"))
    cmd.add_argument("--checkpoint", metavar="DIR", help=h("checkpoint"))
    cmd.add_argument("--avro-schema", metavar="F", help=h("avro_schema"))
    cmd.add_argument("--available-now", action="store_true", default=None, help=h("available_now"))
    cmd.add_argument("--master", dest="spark_master", metavar="MASTER", help=h("spark_master"))
    cmd.add_argument("--sink", choices=SINKS, help=h("sink"))
    cmd.add_argument("--trigger", choices=TRIGGERS, help=h("trigger"))
    cmd.add_argument("--realtime-batch-s", metavar="S", type=int, help=h("realtime_batch_s"))
    cmd.add_argument("--topic-prefix", help=h("topic_prefix"))
    cmd.add_argument("--tags", metavar="EXPR", help=h("tags"))
    cmd.add_argument(
        "--allow-unpromoted",
        action="store_false",
        dest="require_promoted",
        default=None,
        help="keep records without rmq.promoted_from (plain, "
        f"non-RMQ topics; env {env_name('require_promoted')}=0)",
    )
    cmd.add_argument(
        "--kafka-option",
        action="append",
        type=_kafka_option,
        default=[],
        metavar="KEY=VALUE",
        help="option for Spark's Kafka source, e.g. maxOffsetsPerTrigger=1000 "
        "or kafka.security.protocol=SASL_SSL; librdkafka security settings "
        "as the coordinator takes them (security.protocol, sasl.*, ssl.*, "
        "also env RMQ_KAFKA_*) are translated (repeatable)",
    )
    cmd.set_defaults(func=_cmd_spark)


def _cmd_spark(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise ConfigError("PySpark is not installed: pip install 'rmq-semantics[spark]'") from exc
    settings = JobSettings.from_cli(args)  # refuses bad input before starting a JVM
    session = build_session(_master(settings))
    stop = threading.Event()
    previous = _install_stop_handlers(stop)
    try:
        result = run_job(settings, spark=session, stop_event=stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        session.stop()
    print(
        json.dumps(
            {
                "rows_written": result.rows_written,
                "dropped_unpromoted": result.dropped_unpromoted,
                "decode_errors": result.decode_errors,
                "batches": result.batches,
            }
        )
    )
    return 0


def _install_stop_handlers(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM/SIGINT stop the query (a micro-batch is finished or discarded, a Real-time
    batch interrupted: the restart re-emits it); a second SIGINT interrupts."""

    def handle(signum: int, frame: object) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("received %s: stopping the streaming query", signal.Signals(signum).name)
        stop.set()

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, handle)
    return previous
