"""The Spark job's I/O shell: Kafka source → :mod:`spark.transforms` → checkpointed sink.

Reads only promoted (business) topics, ``read_committed``, with headers; drops and counts
records without ``rmq.promoted_from``; writes Parquet (or the console) with a checkpoint,
so a restart neither loses nor repeats rows. PySpark is imported inside functions only:
``rmq-semantics`` imports this module to register its subcommand.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmq_semantics.errors import ConfigError, RmqError, RmqTimeoutError, SparkJobError
from rmq_semantics.settings import kafka_env_conf
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark.transforms import Subscription

__all__ = ["JobResult", "SparkJobError", "build_session", "register_cli", "run_job",
           "spark_kafka_options"]

log = logging.getLogger(__name__)

DEFAULT_APP_NAME = "rmq-semantics-spark"
SINKS = ("parquet", "console")
# How often the driver wakes to collect batch metrics and check for a stop request.
POLL_S = 1.0
# Stopping a query interrupts its batch; the file sink then discards the uncommitted files.
STOP_TIMEOUT_S = 60.0
# Source options that carry the job's guarantees; callers may not change them.
_FIXED_OPTIONS = {"subscribe", "subscribepattern", "assign", "kafka.bootstrap.servers",
                  "includeheaders", "kafka.isolation.level"}
_SOURCE_METRICS = "rmq_source"
_SINK_METRICS = "rmq_sink"


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


def build_session(master: str = "local[*]", app_name: str = DEFAULT_APP_NAME, *,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession with Spark's Kafka source on its classpath.

    Hands Spark the resolved jars via ``spark.jars``; with ``RMQ_SPARK_USE_PACKAGES=1``
    it sets ``spark.jars.packages`` to the Maven coordinates instead (for clusters that
    resolve their own). Local masters get 2 shuffle partitions and 1g of driver memory;
    the UI is off. ``conf`` entries win over these defaults.

    The first session of a Python process fixes the driver classpath: a session created
    earlier without the Kafka source is returned as is and cannot read Kafka.
    """
    from pyspark.sql import SparkSession

    from spark.jars import spark_kafka_jars, spark_kafka_package

    # Python UDF workers must run this interpreter (it has fastavro), not PATH's python3.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings: dict[str, str] = {"spark.ui.enabled": "false",
                                "spark.sql.session.timeZone": "UTC"}
    if os.environ.get("RMQ_SPARK_USE_PACKAGES") == "1":
        settings["spark.jars.packages"] = spark_kafka_package()
    else:
        settings["spark.jars"] = ",".join(spark_kafka_jars())
    if master.startswith("local"):
        settings.update({"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"})
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def run_job(bootstrap_servers: str, topics: str | list[str], output: str | Path | None,
            checkpoint: str | Path | None = None, avro_schema: str | Path | None = None,
            available_now: bool = False, sink: str = "parquet", require_promoted: bool = True,
            topic_prefix: str = DEFAULT_TOPIC_PREFIX,
            kafka_options: Mapping[str, str] | None = None, master: str | None = None, *,
            spark: SparkSession | None = None, timeout_s: float | None = None,
            stop_event: threading.Event | None = None) -> JobResult:
    """Stream promoted records of ``topics`` into ``output``; return what was done.

    ``topics``: names (list or comma-separated) or one regex, checked by
    :func:`spark.transforms.guard_subscription` before Spark starts. ``avro_schema``: the
    writer schema as JSON text or a path to an ``.avsc`` file (without it ``value`` is
    written as a string). ``checkpoint`` defaults to ``<output>.checkpoint`` and must not
    lie inside ``output``. ``kafka_options`` go to the Kafka source untouched (e.g.
    ``kafka.security.protocol``, ``kafka.sasl.jaas.config``, ``maxOffsetsPerTrigger``),
    except the ones that carry the job's guarantees. With ``available_now`` the job
    processes what is there and returns; otherwise it runs until ``stop_event`` is set
    (or ``timeout_s`` passes, which raises :class:`RmqTimeoutError`). ``spark``: a session
    to use (left running); without it one is built on ``master`` and stopped at the end.
    """
    plan = _plan(topics, output, checkpoint, avro_schema, sink, topic_prefix, kafka_options)
    own_session = False
    if spark is None:
        from pyspark import SparkContext

        # A session the caller already runs (in any thread) is used and left running.
        own_session = SparkContext._active_spark_context is None
        spark = build_session(master or os.environ.get("RMQ_SPARK_MASTER", "local[*]"))
    try:
        frame = _build_frame(spark, bootstrap_servers, plan, require_promoted)
        writer = frame.writeStream.outputMode("append")
        if sink == "parquet":
            writer = writer.format("parquet").option("path", plan.output)
        else:
            writer = writer.format("console").option("truncate", "false")
        if plan.checkpoint is not None:
            writer = writer.option("checkpointLocation", plan.checkpoint)
        if available_now:
            writer = writer.trigger(availableNow=True)
        log.info("spark job: %s=%s -> %s %s (checkpoint %s)", plan.subscription.option,
                 plan.subscription.value, sink, plan.output or "", plan.checkpoint)
        query = writer.start()
        return _await(query, require_promoted, timeout_s, stop_event)
    finally:
        if own_session:
            spark.stop()


@dataclass(frozen=True)
class _Plan:
    """A run's validated inputs, checked before any Spark session starts."""

    subscription: Subscription
    options: dict[str, str]
    schema_json: str | None
    output: str | None
    checkpoint: str | None


def _plan(topics: str | list[str], output: str | Path | None, checkpoint: str | Path | None,
          avro_schema: str | Path | None, sink: str, topic_prefix: str,
          kafka_options: Mapping[str, str] | None) -> _Plan:
    from spark.transforms import avro_spark_schema, guard_subscription

    subscription = guard_subscription(topics, topic_prefix)
    if sink not in SINKS:
        raise ConfigError(f"sink={sink!r}: use one of {', '.join(SINKS)}")
    schema_json = _load_schema(avro_schema) if avro_schema is not None else None
    if schema_json is not None:
        avro_spark_schema(schema_json)  # an unmapped schema fails here, not in a batch
    out, ckpt = _sink_paths(output, checkpoint, sink)
    return _Plan(subscription, _source_options(kafka_options), schema_json, out, ckpt)


def _source_options(kafka_options: Mapping[str, str] | None) -> dict[str, str]:
    options = {"kafka.isolation.level": "read_committed", "includeHeaders": "true",
               "startingOffsets": "earliest", "failOnDataLoss": "false"}
    fixed = {k.lower(): v for k, v in options.items()}
    for key, value in (kafka_options or {}).items():
        value = str(value)
        if key.lower() in _FIXED_OPTIONS and fixed.get(key.lower()) != value:
            raise ConfigError(f"kafka option {key}={value!r} is set by the job and cannot be "
                              "changed (read_committed, headers and the guarded subscription "
                              "are what make it read promoted records only)")
        options[key] = value
    return options


_JAAS_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
# librdkafka security settings with a same-named Java client setting.
_SAME_NAME = ("ssl.endpoint.identification.algorithm", "ssl.key.password")


def _is_security_key(key: str) -> bool:
    return key == "security.protocol" or key.startswith(("sasl.", "ssl."))


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_kafka_options(conf: Mapping[str, Any]) -> dict[str, str]:
    """Spark Kafka source options (``kafka.*``) for the security settings of a librdkafka
    conf, so the job reads with the same settings as the coordinator and the clients.

    ``security.protocol`` -> ``kafka.security.protocol``; ``sasl.mechanisms`` (or
    ``sasl.mechanism``) -> ``kafka.sasl.mechanism``; ``sasl.username`` + ``sasl.password`` ->
    ``kafka.sasl.jaas.config`` (``PlainLoginModule`` for PLAIN, ``ScramLoginModule`` for
    SCRAM-SHA-*); ``ssl.ca.location`` / ``ssl.ca.pem`` -> a PEM truststore. Settings that are
    not about security (``bootstrap.servers``, tuning) are ignored; a security setting with no
    Java equivalent here raises :class:`ConfigError` naming it (pass ``kafka.*`` instead).
    """
    out: dict[str, str] = {}
    sec = {k: str(v) for k, v in conf.items() if _is_security_key(k)}
    if "security.protocol" in sec:
        out["kafka.security.protocol"] = sec.pop("security.protocol").upper()
    mechanism = (sec.pop("sasl.mechanisms", None) or sec.pop("sasl.mechanism", None)
                 or ("PLAIN" if "sasl.username" in sec else None))
    sec.pop("sasl.mechanism", None)
    if mechanism is not None:
        out["kafka.sasl.mechanism"] = mechanism.upper()
    user, password = sec.pop("sasl.username", None), sec.pop("sasl.password", None)
    if (user is None) != (password is None):
        raise ConfigError("sasl.username and sasl.password go together; got only "
                          f"{'sasl.username' if user is not None else 'sasl.password'}")
    if user is not None and password is not None:
        module = _JAAS_MODULES.get((mechanism or "").upper())
        if module is None:
            raise ConfigError(f"sasl.mechanisms={mechanism!r}: only "
                              f"{', '.join(_JAAS_MODULES)} map to a Spark JAAS config; pass "
                              "kafka.sasl.jaas.config yourself")
        out["kafka.sasl.jaas.config"] = (f"{module} required username={_jaas_quote(user)} "
                                         f"password={_jaas_quote(password)};")
    if "ssl.ca.location" in sec:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.location"] = sec.pop("ssl.ca.location")
    elif "ssl.ca.pem" in sec:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.certificates"] = sec.pop("ssl.ca.pem")
    for key in _SAME_NAME:
        if key in sec:
            value = sec.pop(key)
            # librdkafka says "none" where Java wants an empty string.
            out[f"kafka.{key}"] = "" if value == "none" else value
    if sec:
        raise ConfigError(f"Kafka setting(s) {sorted(sec)} have no Spark Kafka source "
                          "equivalent here; pass the Java client's kafka.* option instead "
                          "(e.g. --kafka-option kafka.ssl.keystore.location=...)")
    return out


def _load_schema(avro_schema: str | Path) -> str:
    text = str(avro_schema)
    if isinstance(avro_schema, str) and text.lstrip().startswith(("{", "[", '"')):
        return text
    path = Path(text)
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"avro_schema={text!r}: cannot read the schema file ({exc})") from exc


def _sink_paths(output: str | Path | None, checkpoint: str | Path | None,
                sink: str) -> tuple[str | None, str | None]:
    if sink == "console":
        return None, (str(checkpoint) if checkpoint is not None else None)
    if output is None or not str(output).strip():
        raise ConfigError("output is required for the parquet sink: pass --output DIR")
    out = str(output).rstrip("/")
    ckpt = str(checkpoint).rstrip("/") if checkpoint is not None else f"{out}.checkpoint"
    if "://" not in out and "://" not in ckpt:
        out_abs, ckpt_abs = Path(out).resolve(), Path(ckpt).resolve()
        if ckpt_abs == out_abs or out_abs in ckpt_abs.parents:
            raise ConfigError(f"checkpoint={ckpt!r} lies inside output={out!r}; Spark would "
                              "read it as data: put it next to it (default <output>.checkpoint)")
    elif ckpt == out or ckpt.startswith(out + "/"):
        raise ConfigError(f"checkpoint={ckpt!r} lies inside output={out!r}")
    return out, ckpt


def _build_frame(spark: SparkSession, bootstrap: str, plan: _Plan,
                 require_promoted: bool) -> DataFrame:
    from pyspark.sql import functions as F

    from spark import transforms

    schema_json = plan.schema_json
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option(plan.subscription.option, plan.subscription.value))
    for key, val in plan.options.items():
        reader = reader.option(key, val)
    try:
        raw = reader.load()
    except Exception as exc:
        if _KAFKA_MISSING not in str(exc):
            raise
        _add_kafka_jars(spark)
        try:
            raw = reader.load()
        except Exception as again:
            if _KAFKA_MISSING not in str(again):
                raise
            raise ConfigError(
                "Spark's Kafka source is not on this session's classpath: create the first "
                "SparkSession of the process with spark.job.build_session(), or start Spark "
                f"with --packages {_package()}") from again
    promoted = transforms.is_promoted("headers")
    raw = raw.observe(_SOURCE_METRICS, F.count(F.lit(1)).alias("records"),
                      F.count(F.when(~promoted, 1)).alias("unpromoted"))
    kept = transforms.drop_unpromoted(raw) if require_promoted else raw
    if schema_json is None:
        out = transforms.decode_string(kept)
        errors = F.count(F.when(F.lit(False), 1))  # observe() takes aggregates only
    else:
        out = transforms.decode_avro(kept, schema_json)
        errors = F.count(F.col(transforms.DECODE_ERROR_COLUMN))
    return out.observe(_SINK_METRICS, F.count(F.lit(1)).alias("rows"),
                       errors.alias("decode_errors"))


_KAFKA_MISSING = "Failed to find data source: kafka"


def _package() -> str:
    from spark.jars import spark_kafka_package

    return spark_kafka_package()


def _add_kafka_jars(spark: SparkSession) -> None:
    """Add the Kafka source to a running session that was built without it (``ADD JAR``).

    The driver's classpath is fixed when the first session of a process starts; ``ADD
    JAR`` extends the session's class loader, which the streaming query thread inherits.
    """
    from spark.jars import spark_kafka_jars

    try:
        jars = spark_kafka_jars()
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
            source, out = metrics.get(_SOURCE_METRICS), metrics[_SINK_METRICS]
            unpromoted = int(source["unpromoted"]) if source is not None else 0
            rows, errors = int(out["rows"]), int(out["decode_errors"])
            dropped = unpromoted if self.require_promoted else 0
            self.batches[batch_id] = (rows, dropped, errors)
            level = logging.WARNING if dropped or errors else logging.INFO
            log.log(level, "batch %d of %s: %d rows written, %d unpromoted records dropped, "
                    "%d decode errors", batch_id, query.name or query.id, rows, dropped, errors)

    def result(self) -> JobResult:
        done = self.batches.values()
        return JobResult(rows_written=sum(b[0] for b in done),
                         dropped_unpromoted=sum(b[1] for b in done),
                         decode_errors=sum(b[2] for b in done), batches=len(done))


def _await(query: StreamingQuery, require_promoted: bool, timeout_s: float | None,
           stop_event: threading.Event | None) -> JobResult:
    from pyspark.errors import StreamingQueryException

    metrics = _Metrics(require_promoted)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not query.awaitTermination(POLL_S):
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
    log.info("spark job done: %d rows written, %d unpromoted records dropped, %d decode "
             "errors in %d batches", result.rows_written, result.dropped_unpromoted,
             result.decode_errors, result.batches)
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
    """Add the ``spark`` subcommand to the ``rmq-semantics`` argparse subparsers."""
    cmd = sub.add_parser("spark", help="stream promoted topics into Parquet with Spark",
                         description="Read only promoted (business) topics, read_committed, "
                                     "drop and count records without rmq.promoted_from, "
                                     "decode Avro, write a checkpointed sink.")
    cmd.add_argument("--bootstrap-servers", required=True, metavar="B",
                     help="Kafka bootstrap servers, host:port[,host:port]")
    cmd.add_argument("--topics", required=True, metavar="T",
                     help="topic names (comma-separated) or one regex anchored with ^")
    cmd.add_argument("--output", metavar="DIR", required=True,
                     help="Parquet output directory (unused with --sink console)")
    cmd.add_argument("--checkpoint", metavar="DIR", default=None,
                     help="checkpoint directory (default <output>.checkpoint)")
    cmd.add_argument("--avro-schema", metavar="F", default=None,
                     help="Avro writer schema (.avsc) of the values; else values are text")
    cmd.add_argument("--available-now", action="store_true",
                     help="process what is there, then exit")
    cmd.add_argument("--master", default=None,
                     help="Spark master (default $RMQ_SPARK_MASTER or local[*])")
    cmd.add_argument("--sink", choices=SINKS, default="parquet")
    cmd.add_argument("--topic-prefix", default=DEFAULT_TOPIC_PREFIX)
    cmd.add_argument("--allow-unpromoted", action="store_true",
                     help="keep records without rmq.promoted_from (plain, non-RMQ topics)")
    cmd.add_argument("--kafka-option", action="append", type=_kafka_option, default=[],
                     metavar="KEY=VALUE",
                     help="option for Spark's Kafka source, e.g. maxOffsetsPerTrigger=1000 "
                          "or kafka.security.protocol=SASL_SSL; librdkafka security settings "
                          "as the coordinator takes them (security.protocol, sasl.*, ssl.*, "
                          "also env RMQ_KAFKA_*) are translated (repeatable)")
    cmd.set_defaults(func=_cmd_spark)


def _cmd_spark(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise ConfigError("PySpark is not installed: pip install 'rmq-semantics[spark]'") from exc
    kafka_options = _cli_source_options(args.kafka_option)
    _plan(args.topics, args.output, args.checkpoint, args.avro_schema, args.sink,
          args.topic_prefix, kafka_options)  # refuse bad input before starting a JVM
    master = args.master or os.environ.get("RMQ_SPARK_MASTER", "local[*]")
    session = build_session(master)
    stop = threading.Event()
    previous = _install_stop_handlers(stop)
    try:
        result = run_job(args.bootstrap_servers, args.topics, args.output,
                         checkpoint=args.checkpoint, avro_schema=args.avro_schema,
                         available_now=args.available_now, sink=args.sink,
                         require_promoted=not args.allow_unpromoted,
                         topic_prefix=args.topic_prefix, kafka_options=kafka_options,
                         spark=session, stop_event=stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        session.stop()
    print(json.dumps({"rows_written": result.rows_written,
                      "dropped_unpromoted": result.dropped_unpromoted,
                      "decode_errors": result.decode_errors, "batches": result.batches}))
    return 0


def _cli_source_options(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Source options from ``--kafka-option``: librdkafka-style security settings (as the
    coordinator takes them, also from ``RMQ_KAFKA_*`` env vars) are translated with
    :func:`spark_kafka_options`; everything else is a Spark source option and wins."""
    librdkafka = {k: v for k, v in kafka_env_conf().items() if _is_security_key(k)}
    source: dict[str, str] = {}
    for key, value in pairs:
        if _is_security_key(key):
            librdkafka[key] = value
        else:
            source[key] = value
    return {**spark_kafka_options(librdkafka), **source}


def _install_stop_handlers(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM/SIGINT stop the query after its batch; a second SIGINT interrupts."""

    def handle(signum: int, frame: object) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("received %s: stopping after the current batch", signal.Signals(signum).name)
        stop.set()

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, handle)
    return previous
