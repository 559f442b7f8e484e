"""Where the Spark job's rows go: the Parquet, console or Kafka sink, micro-batch or Real-time.

:func:`start` turns a :class:`~spark.settings.JobSettings` into a started streaming query;
:func:`check_realtime_cores` refuses a Real-time run whose master has fewer cores than the
subscription has partitions (Spark's Real-time Mode holds one core per input partition for
the whole batch; with fewer, some partitions silently never flow). PySpark is imported
inside functions only, as in :mod:`spark.job`.
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING, Any

from rmq_semantics.errors import ConfigError
from spark.settings import JobSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["check_realtime_cores", "sink_options", "start"]

log = logging.getLogger(__name__)

_LOCAL_MASTER = re.compile(r"local(?:\[(\d+|\*)(?:,\d+)?\])?")
# Kafka's admin calls from the driver (metadata of the subscribed topics).
ADMIN_TIMEOUT_S = 30


def sink_options(settings: JobSettings) -> dict[str, str]:
    """The Kafka sink's options: the servers, the topic, and the source's security options
    (``kafka.security.protocol``, ``kafka.sasl.*``, ``kafka.ssl.*``): one cluster."""
    options = {
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        "topic": str(settings.output_topic),
    }
    for key, value in settings.source_options.items():
        if key == "kafka.security.protocol" or key.startswith(("kafka.sasl.", "kafka.ssl.")):
            options[key] = value
    return options


def start(frame: DataFrame, settings: JobSettings) -> StreamingQuery:
    """Start the query writing ``frame`` to the sink ``settings`` names.

    Real-time Mode takes ``update`` output mode (every row is new: the query is stateless);
    the micro-batch sinks take ``append``.
    """
    realtime = settings.trigger == "realtime"
    writer = frame.writeStream.outputMode("update" if realtime else "append")
    if settings.sink == "parquet":
        writer = writer.format("parquet").option("path", settings.output)
    elif settings.sink == "kafka":
        writer = writer.format("kafka").options(**sink_options(settings))
    else:
        writer = writer.format("console").option("truncate", "false")
    if settings.checkpoint is not None:
        writer = writer.option("checkpointLocation", settings.checkpoint)
    if realtime:
        writer = writer.trigger(  # type: ignore[call-overload]  # pyspark 4.2.0's classic writer has no realTime overload (Spark Connect's has)
            realTime=f"{settings.realtime_batch_s} seconds"
        )
    elif settings.available_now:
        writer = writer.trigger(availableNow=True)
    sub = settings.subscription
    log.info(
        "spark job: %s=%s -> %s %s (%s, checkpoint %s)",
        sub.option,
        sub.value,
        settings.sink,
        settings.output or settings.output_topic or "",
        f"real-time, {settings.realtime_batch_s} s batches" if realtime else "micro-batch",
        settings.checkpoint,
    )
    return writer.start()


def check_realtime_cores(spark: SparkSession, settings: JobSettings) -> None:
    """Raise :class:`ConfigError` when the session has fewer cores than the subscribed
    topics have partitions (a no-op for the micro-batch trigger)."""
    if settings.trigger != "realtime":
        return
    master = spark.sparkContext.master
    cores = _cores(spark)
    partitions = _partition_count(spark, settings)
    log.info(
        "real-time mode: %d partitions to read, %d cores (master %s)", partitions, cores, master
    )
    if partitions > cores:
        raise ConfigError(
            f"trigger='realtime' needs a core per input partition: the subscription has "
            f"{partitions} partitions, master {master} gives {cores} cores; use --master "
            f"local[{partitions}] or a cluster with {partitions} cores or more"
        )


def _cores(spark: SparkSession) -> int:
    match = _LOCAL_MASTER.fullmatch(spark.sparkContext.master or "")
    if match is None:  # a cluster: the executors' cores registered so far
        return int(spark.sparkContext.defaultParallelism)
    if match.group(1) in (None, "*"):
        return 1 if match.group(1) is None else (os.cpu_count() or 1)
    return int(match.group(1))


def _partition_count(spark: SparkSession, settings: JobSettings) -> int:
    """Partitions of the subscribed topics, from Kafka's Java admin client in Spark's JVM
    (the connector's kafka-clients, with the source's own ``kafka.*`` options)."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 (py4j's gateway, as in spark.subscription)
    if jvm is None:
        raise ConfigError("trigger='realtime' needs a classic (py4j) Spark session")
    props = jvm.java.util.Properties()
    props.put("bootstrap.servers", settings.bootstrap_servers)
    for key, value in sink_options(settings).items():
        if key.startswith("kafka.") and key != "kafka.bootstrap.servers":
            props.put(key.removeprefix("kafka."), value)
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        return _count(jvm, admin, settings, seconds)
    finally:
        admin.close()


def _count(jvm: Any, admin: Any, settings: JobSettings, seconds: Any) -> int:
    from py4j.protocol import Py4JJavaError

    try:
        sub = settings.subscription
        if sub.is_pattern:
            pattern = jvm.java.util.regex.Pattern.compile(sub.value)
            listed = admin.listTopics().names().get(ADMIN_TIMEOUT_S, seconds)
            names = [n for n in listed if pattern.matcher(n).find()]
        else:
            names = sub.value.split(",")
        wanted = jvm.java.util.ArrayList()
        for name in names:
            wanted.add(name)
        described = admin.describeTopics(wanted).allTopicNames().get(ADMIN_TIMEOUT_S, seconds)
        return sum(described.get(n).partitions().size() for n in names)
    except Py4JJavaError as exc:  # a topic not created yet, no broker, no ACL to describe
        cause = str(exc.java_exception).strip().splitlines()[0]
        raise ConfigError(
            f"trigger='realtime': cannot count the subscribed topics' partitions ({cause}); "
            "the topics must exist before a Real-time run starts"
        ) from exc
