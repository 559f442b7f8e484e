"""The Spark job's settings: one frozen dataclass behind Python, CLI flags and ``RMQ_*`` env vars.

Built, it is valid: the subscription is guarded, the Avro schema read and vetted, the
source options and sink paths checked, all before a JVM starts. Pure: no Spark imports.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from rmq_semantics.errors import ConfigError, SystemTopicError
from rmq_semantics.helptext import plain_text
from rmq_semantics.settings import env_name, load, setting
from rmq_semantics.tags import TagFilter
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, is_system_topic
from spark.kafka_options import cli_source_options, source_options
from spark.schema import RecordSchema, load_schema, parse_record_schema
from spark.subscription import Subscription, guard_subscription

__all__ = ["MIN_REALTIME_BATCH_S", "SINKS", "TRIGGERS", "JobSettings"]

SINKS = ("parquet", "console", "kafka")
TRIGGERS = ("microbatch", "realtime")
# Spark 4.2.0's spark.sql.streaming.realTimeMode.minBatchDuration default (5000 ms).
MIN_REALTIME_BATCH_S = 5


class _Derived:
    """What ``JobSettings.__post_init__`` derives from the fields: declared here, in a base
    that is no dataclass, so they are no fields (no init argument, CLI flag or env var)."""

    _tag_filter: TagFilter
    _subscription: Subscription
    _source_options: Mapping[str, str]
    _schema: RecordSchema | None


@dataclass(frozen=True)
class JobSettings(_Derived):
    """Everything one run of the Spark job needs, checked when built.

    Field names are the CLI's (``--bootstrap-servers``) and the env's (``RMQ_SINK``; the
    CLI reads them, Python callers pass values). ``topics``: names (a list or
    comma-separated) or one regex, see :func:`spark.subscription.guard_subscription`.
    ``output``/``checkpoint``/``avro_schema`` take a ``str`` or a ``Path`` and keep a
    ``str``; ``checkpoint`` becomes ``<output>.checkpoint`` when not given and must not
    lie inside ``output``. ``kafka_options`` go to Spark's Kafka source as they are (e.g.
    ``kafka.sasl.jaas.config``, ``maxOffsetsPerTrigger``), except those that carry the
    job's guarantees; :func:`spark.kafka_options.spark_kafka_options` translates a
    librdkafka conf into them.
    """

    bootstrap_servers: str = setting("", "Kafka bootstrap servers, host:port[,host:port]")
    topics: str | tuple[str, ...] = setting(
        "", "topic names (comma-separated) or one regex anchored with ^"
    )
    output: str | None = setting(
        None, "Parquet output directory (--sink parquet; unused by the other sinks)"
    )
    checkpoint: str | None = setting(
        None, "checkpoint directory (default <output>.checkpoint; required with --sink kafka)"
    )
    avro_schema: str | None = setting(
        None, "Avro writer schema (.avsc file or its JSON) of the values; else values are text"
    )
    available_now: bool = setting(False, "process what is there, then exit")
    sink: str = setting("parquet", f"where rows go: {' or '.join(SINKS)}")
    require_promoted: bool = setting(True, "drop (and count) records without rmq.promoted_from")
    topic_prefix: str = setting(DEFAULT_TOPIC_PREFIX, "prefix of the system topics")
    tags: str = setting(
        "*", "RocketMQ tag expression on rmq.tags, e.g. 'TagA || TagB' (* keeps all)"
    )
    kafka_options: Mapping[str, str] = dataclasses.field(
        default_factory=dict, metadata={"help": "options for Spark's Kafka source"}
    )
    spark_master: str | None = setting(None, "Spark master (default local[*])")
    output_topic: str | None = setting(None, "Kafka topic --sink kafka writes to")
    trigger: str = setting(
        "microbatch",
        f"{' or '.join(TRIGGERS)}: realtime is Spark's Real-time Mode, --sink kafka only "
        "(Parquet stays micro-batch)",
    )
    realtime_batch_s: int = setting(
        10,
        "Real-time Mode batch duration in seconds, i.e. its checkpoint interval (minimum "
        f"{MIN_REALTIME_BATCH_S}): a restart re-emits at most the interrupted batch",
    )

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)  # frozen: normalise once, here

        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise ConfigError(
                f"bootstrap_servers={self.bootstrap_servers!r}: give host:port[,host:port]"
            )
        for name in ("available_now", "require_promoted"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be True or False")
        if self.sink not in SINKS:
            raise ConfigError(f"sink={self.sink!r}: use one of {', '.join(SINKS)}")
        _check_trigger(self)
        put("_tag_filter", TagFilter(self.tags))  # refuses a malformed expression
        put("tags", self._tag_filter.expression)
        topics = self.topics if isinstance(self.topics, str) else tuple(self.topics)
        put("topics", topics)
        put("_subscription", guard_subscription(topics, self.topic_prefix))
        options = MappingProxyType(dict(self.kafka_options or {}))
        put("kafka_options", options)
        put("_source_options", MappingProxyType(source_options(options)))
        schema = None
        if self.avro_schema is not None:
            schema = parse_record_schema(load_schema(self.avro_schema))
            put("avro_schema", str(self.avro_schema))
        put("_schema", schema)
        output, checkpoint = _sink_paths(self.output, self.checkpoint, self.sink)
        put("output", output)
        put("checkpoint", checkpoint)
        if self.sink == "kafka":
            _check_output_topic(self.output_topic, self._subscription, self.topic_prefix)
        elif self.output_topic is not None:
            raise ConfigError(
                f"output_topic={self.output_topic!r}: only --sink kafka writes to a topic"
            )

    @property
    def subscription(self) -> Subscription:
        """How the Kafka source subscribes (already guarded)."""
        return self._subscription

    @property
    def tag_values(self) -> tuple[str, ...] | None:
        """The tags a record's ``rmq.tags`` must be one of; None keeps every record."""
        tags = self._tag_filter.tags
        return None if tags is None else tuple(sorted(t.decode() for t in tags))

    @property
    def source_options(self) -> Mapping[str, str]:
        """Every option for the Kafka source except the bootstrap servers and subscription."""
        return self._source_options

    @property
    def schema(self) -> RecordSchema | None:
        """The vetted Avro writer schema, or None when values are written as text."""
        return self._schema

    @classmethod
    def from_cli(
        cls, args: argparse.Namespace, env: Mapping[str, str] | None = None
    ) -> JobSettings:
        """From parsed ``rmq-semantics spark`` flags, then ``RMQ_*`` env vars, then defaults.

        ``--kafka-option`` pairs and ``RMQ_KAFKA_*`` security settings are translated by
        :func:`spark.kafka_options.cli_source_options`.
        """
        values = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)}
        values["kafka_options"] = cli_source_options(getattr(args, "kafka_option", None) or [], env)
        return load(cls, values, env)

    @classmethod
    def help(cls, name: str) -> str:
        """A field's CLI help, naming its env var."""
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        return f"{plain_text(field.metadata['help'])} (env {env_name(name)})"


def _check_trigger(settings: JobSettings) -> None:
    trigger, batch_s = settings.trigger, settings.realtime_batch_s
    if trigger not in TRIGGERS:
        raise ConfigError(f"trigger={trigger!r}: use one of {', '.join(TRIGGERS)}")
    if isinstance(batch_s, bool) or not isinstance(batch_s, int) or batch_s < MIN_REALTIME_BATCH_S:
        raise ConfigError(
            f"realtime_batch_s={batch_s!r}: give whole seconds, at least {MIN_REALTIME_BATCH_S} "
            "(Spark's minimum Real-time Mode batch duration)"
        )
    if trigger != "realtime":
        return
    if settings.sink != "kafka":
        raise ConfigError(
            f"trigger='realtime' with sink={settings.sink!r}: Real-time Mode writes to "
            "--sink kafka only (it needs update output mode, which the Parquet file sink "
            "refuses: Parquet stays micro-batch)"
        )
    if settings.available_now:
        raise ConfigError(
            "trigger='realtime' with available_now=True: a query takes one trigger, "
            "drop one of them"
        )


def _check_output_topic(topic: str | None, subscription: Subscription, prefix: str) -> None:
    if not isinstance(topic, str) or not topic.strip():
        raise ConfigError(
            f"output_topic={topic!r}: the kafka sink needs a topic to write to (--output-topic T)"
        )
    if is_system_topic(topic, prefix):
        raise SystemTopicError(
            f"output_topic={topic!r} is a system topic of rmq_semantics (prefix {prefix!r}); "
            "the Spark job writes to business topics only"
        )
    read = (
        re.search(subscription.value, topic) is not None
        if subscription.is_pattern
        else topic in subscription.value.split(",")
    )
    if read:
        raise ConfigError(
            f"output_topic={topic!r} is one of the topics the job reads "
            f"({subscription.option}={subscription.value}): it would read its own output"
        )


def _sink_paths(
    output: str | Path | None, checkpoint: str | Path | None, sink: str
) -> tuple[str | None, str | None]:
    if sink == "kafka" and (checkpoint is None or not str(checkpoint).strip()):
        raise ConfigError(
            f"checkpoint={checkpoint!r}: the kafka sink needs a checkpoint directory "
            "(--checkpoint DIR), where it keeps the offsets it has written up to"
        )
    if sink in ("console", "kafka"):
        return None, (str(checkpoint).rstrip("/") if checkpoint is not None else None)
    if output is None or not str(output).strip():
        raise ConfigError(
            f"output={output!r}: the parquet sink needs an output directory (--output DIR)"
        )
    out = str(output).rstrip("/")
    ckpt = str(checkpoint).rstrip("/") if checkpoint is not None else f"{out}.checkpoint"
    if "://" not in out and "://" not in ckpt:
        out_abs, ckpt_abs = Path(out).resolve(), Path(ckpt).resolve()
        if ckpt_abs == out_abs or out_abs in ckpt_abs.parents:
            raise ConfigError(
                f"checkpoint={ckpt!r} lies inside output={out!r}; Spark would "
                "read it as data: put it next to it (default <output>.checkpoint)"
            )
    elif ckpt == out or ckpt.startswith(out + "/"):
        raise ConfigError(f"checkpoint={ckpt!r} lies inside output={out!r}")
    return out, ckpt
