"""The Spark job's pure parts, without Spark: settings, the topic-regex reader, the schema vet."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import pytest

from rmq_semantics.errors import ConfigError, SystemTopicError
from spark import topic_regex
from spark.schema import parse_record_schema
from spark.settings import JobSettings
from spark.subscription import pattern_risk

# ----------------------------------------------------------------------------- settings


def test_settings_normalise_paths_and_fill_in_the_checkpoint(tmp_path):
    settings = JobSettings(
        bootstrap_servers="b:9092", topics=["orders", "payments"], output=tmp_path / "out/"
    )
    assert settings.output == str(tmp_path / "out")
    assert settings.checkpoint == f"{tmp_path / 'out'}.checkpoint"
    assert settings.topics == ("orders", "payments")
    assert (settings.subscription.option, settings.subscription.value) == (
        "subscribe",
        "orders,payments",
    )
    assert settings.schema is None and settings.source_options["includeHeaders"] == "true"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bootstrap_servers": " "}, "bootstrap_servers=' '"),
        ({"available_now": "yes"}, "available_now='yes'"),
        ({"sink": "delta"}, "sink='delta'"),
        ({"output": None}, "output=None"),
        ({"topic_prefix": "bad prefix!"}, "bad prefix"),
        ({"kafka_options": {"includeHeaders": "false"}}, "kafka_options: includeHeaders='false'"),
    ],
)
def test_each_settings_error_names_the_field_and_its_value(tmp_path, kwargs, message):
    values = {"bootstrap_servers": "b:9092", "topics": "orders", "output": tmp_path / "o", **kwargs}
    with pytest.raises(ConfigError, match=message):
        JobSettings(**values)


def test_console_sink_needs_no_output():
    settings = JobSettings(bootstrap_servers="b", topics="orders", sink="console")
    assert (settings.output, settings.checkpoint) == (None, None)


def kafka_sink(**values: object) -> JobSettings:
    base = {
        "bootstrap_servers": "b",
        "topics": "orders",
        "sink": "kafka",
        "output_topic": "orders-out",
        "checkpoint": "/tmp/ck/",
    }
    return JobSettings(**{**base, **values})


def test_kafka_sink_takes_a_topic_and_a_checkpoint_and_defaults_to_micro_batch():
    settings = kafka_sink()
    assert (settings.output, settings.checkpoint, settings.output_topic) == (
        None,
        "/tmp/ck",
        "orders-out",
    )
    assert (settings.trigger, settings.realtime_batch_s) == ("microbatch", 10)
    assert kafka_sink(trigger="realtime", realtime_batch_s=5).trigger == "realtime"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"output_topic": None}, r"output_topic=None: the kafka sink needs a topic"),
        ({"checkpoint": None}, r"checkpoint=None: the kafka sink needs a checkpoint"),
        ({"output_topic": "orders"}, r"output_topic='orders' is one of the topics the job"),
        (
            {"topics": "^ord.*", "output_topic": "orders-out"},
            r"output_topic='orders-out' is one of the topics the job reads",
        ),
        ({"trigger": "continuous"}, r"trigger='continuous': use one of microbatch, realtime"),
        ({"trigger": "realtime", "realtime_batch_s": 4}, r"realtime_batch_s=4: give whole"),
        ({"trigger": "realtime", "available_now": True}, r"a query takes one trigger"),
        (
            {"sink": "parquet", "output": "/tmp/o", "trigger": "realtime", "output_topic": None},
            r"trigger='realtime' with sink='parquet': Real-time Mode writes to --sink kafka "
            r"only .*Parquet stays micro-batch",
        ),
        ({"sink": "parquet", "output": "/tmp/o"}, r"output_topic='orders-out': only --sink kafka"),
    ],
)
def test_kafka_sink_and_trigger_errors_name_the_setting(values, message):
    with pytest.raises(ConfigError, match=message):
        kafka_sink(**values)


def test_kafka_sink_refuses_a_system_output_topic():
    with pytest.raises(SystemTopicError, match="output_topic='__rmq_half'"):
        kafka_sink(output_topic="__rmq_half")


def test_settings_read_the_avro_schema_file_once_and_keep_its_text(tmp_path):
    schema = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
    path = tmp_path / "r.avsc"
    path.write_text(json.dumps(schema))
    settings = JobSettings(
        bootstrap_servers="b", topics="orders", output=tmp_path / "o", avro_schema=path
    )
    path.unlink()
    assert settings.avro_schema == str(path)
    assert settings.schema is not None and json.loads(settings.schema.json) == schema


def cli_args(**values: object) -> argparse.Namespace:
    base = {
        "bootstrap_servers": "b:9092",
        "topics": "orders",
        "output": "/tmp/o",
        "checkpoint": None,
        "avro_schema": None,
        "available_now": None,
        "spark_master": None,
        "sink": None,
        "output_topic": None,
        "trigger": None,
        "realtime_batch_s": None,
        "topic_prefix": None,
        "require_promoted": None,
        "kafka_option": [],
        "func": None,
        "verbose": False,
    }
    return argparse.Namespace(**{**base, **values})


def test_cli_settings_take_flags_then_env_then_defaults():
    env = {
        "RMQ_AVAILABLE_NOW": "true",
        "RMQ_TOPIC_PREFIX": "myapp",
        "RMQ_SPARK_MASTER": "local[1]",
        "RMQ_SINK": "console",
        "RMQ_KAFKA_SASL_USERNAME": "u",
        "RMQ_KAFKA_SASL_PASSWORD": "p",
    }
    settings = JobSettings.from_cli(
        cli_args(
            sink="parquet", require_promoted=False, kafka_option=[("maxOffsetsPerTrigger", "5")]
        ),
        env,
    )
    assert (settings.available_now, settings.topic_prefix, settings.spark_master) == (
        True,
        "myapp",
        "local[1]",
    )
    assert (settings.sink, settings.require_promoted) == ("parquet", False)  # flags win
    assert settings.kafka_options["maxOffsetsPerTrigger"] == "5"
    assert 'username="u"' in settings.kafka_options["kafka.sasl.jaas.config"]
    assert JobSettings.from_cli(cli_args(), {}).available_now is False


def test_cli_settings_take_the_kafka_sink_and_trigger_from_env():
    env = {
        "RMQ_SINK": "kafka",
        "RMQ_OUTPUT_TOPIC": "orders-out",
        "RMQ_TRIGGER": "realtime",
        "RMQ_REALTIME_BATCH_S": "7",
        "RMQ_CHECKPOINT": "/tmp/ck",
    }
    settings = JobSettings.from_cli(cli_args(output=None), env)
    assert (settings.sink, settings.output_topic, settings.trigger) == (
        "kafka",
        "orders-out",
        "realtime",
    )
    assert settings.realtime_batch_s == 7


def test_cli_settings_refuse_a_bad_env_value_naming_the_variable():
    with pytest.raises(ConfigError, match="RMQ_AVAILABLE_NOW"):
        JobSettings.from_cli(cli_args(), {"RMQ_AVAILABLE_NOW": "maybe"})


def test_the_spark_subcommand_keeps_its_flags_and_fills_settings_fields():
    from spark.job import register_cli

    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    args = parser.parse_args(
        [
            "spark",
            "--bootstrap-servers",
            "b",
            "--topics",
            "^orders$",
            "--output",
            "/tmp/o",
            "--checkpoint",
            "/tmp/c",
            "--avro-schema",
            "f.avsc",
            "--available-now",
            "--master",
            "local[1]",
            "--sink",
            "console",
            "--topic-prefix",
            "p",
            "--allow-unpromoted",
            "--kafka-option",
            "a=b=c",
            "--output-topic",
            "out",
            "--trigger",
            "realtime",
            "--realtime-batch-s",
            "6",
        ]
    )
    assert (args.output_topic, args.trigger, args.realtime_batch_s) == ("out", "realtime", 6)
    assert (args.available_now, args.spark_master, args.require_promoted) == (
        True,
        "local[1]",
        False,
    )
    assert args.kafka_option == [("a", "b=c")]
    bare = parser.parse_args(["spark", "--bootstrap-servers", "b", "--topics", "t"])
    assert (bare.available_now, bare.require_promoted, bare.sink) == (None, None, None)
    assert (bare.output, bare.trigger) == (None, None)


# ----------------------------------------------------------------------------- topic regex


@pytest.mark.parametrize(
    ("pattern", "start", "expected"),
    [
        ("^orders-.*", "__", False),
        ("^x?__rmq_op$", "__", True),
        ("^(?:a|_)_", "__", True),
        ("^(?:a|b)_", "__", False),
        ("^_{3}", "__", True),  # a longer name may follow what the start fixes
        ("^_$", "__", False),  # the name would have to end after one '_'
        ("^[^a-z0-9]{2}", "__", True),
        ("^[a-z-]+", "__", False),
        ("^(?i)x", "__", True),  # not in the subset: refused before this answer
        ("(?i)^_[R]", "_r", True),
        ("^(a*)*_", "_", True),  # an empty loop must not hang the walk
        ("^\\d+_", "__", False),
        ("^.{1000}", "__", True),
        ("^\\b_", "_", True),
    ],
)
def test_topic_regex_decides_whether_a_name_start_can_match(pattern, start, expected):
    try:
        parsed = topic_regex.parse(pattern)
    except ConfigError:
        assert expected  # refused = treated as able to match
        return
    assert parsed.may_match_name_starting_with(start) is expected


@pytest.mark.parametrize(
    "pattern",
    [
        r"^\p{Alpha}",
        r"^\Qab\E",
        "^[a-z&&[^x]]",
        "^[[a]]",
        "^(?x)a",
        r"^(a)\1",
        "^a{2",
        "^a**",
        "^(a",
        "^a)",
        "^é",
        "^[]a]",
        "^[a-\\d]",
        "^[z-a]",
        "^*",
    ],
)
def test_topic_regex_refuses_constructs_outside_the_subset_naming_them(pattern):
    with pytest.raises(ConfigError, match="position"):
        topic_regex.parse(pattern)


def test_unanchored_and_alternated_patterns_are_not_anchored():
    assert not topic_regex.parse("^a|b").is_anchored()
    assert not topic_regex.parse("(^a)?b").is_anchored()
    assert topic_regex.parse(r"(^a|\Ab)+c").is_anchored()
    assert topic_regex.parse(r"\b^a").is_anchored()


def test_pattern_risk_explains_itself_and_is_none_for_a_safe_pattern():
    assert pattern_risk("^orders-.*", "__rmq") is None
    assert "not anchored" in (pattern_risk("orders", "__rmq") or "")
    assert "'__'" in (pattern_risk("^_.*", "__rmq") or "")
    assert "'myapp_'" in (pattern_risk("^m.*", "myapp") or "")


def test_a_refused_pattern_is_one_line_naming_it():
    from spark.subscription import guard_subscription

    with pytest.raises(SystemTopicError, match=r"^topic pattern '\^_\.\*' is refused"):
        guard_subscription("^_.*")


# ----------------------------------------------------------------------------- Avro schema


def test_schema_vet_lists_fields_and_those_never_null():
    schema = parse_record_schema(
        json.dumps(
            {
                "type": "record",
                "name": "R",
                "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "note", "type": ["string", "null"]},
                    {"name": "n", "type": ["null", {"type": "int"}]},
                    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
                ],
            }
        )
    )
    assert schema.fields == ("id", "note", "n", "e")
    assert schema.required == ("id", "e")


@pytest.mark.parametrize(
    ("field_type", "message"),
    [
        ({"type": "bytes", "logicalType": "decimal", "precision": 39, "scale": 2}, "precision 39"),
        ({"type": "array", "items": ["int", "string", "null"]}, "x\\[\\]: union"),
        ({"type": "map", "values": ["int", "string"]}, "x\\{\\}: union"),
    ],
)
def test_schema_vet_refuses_what_spark_cannot_hold_naming_the_field(field_type, message):
    text = json.dumps(
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": field_type}]}
    )
    with pytest.raises(ConfigError, match=message):
        parse_record_schema(text)


def test_a_named_record_used_twice_is_not_recursive():
    addr = {"type": "record", "name": "Addr", "fields": [{"name": "city", "type": "string"}]}
    schema = parse_record_schema(
        json.dumps(
            {
                "type": "record",
                "name": "R",
                "fields": [{"name": "ship", "type": addr}, {"name": "bill", "type": "Addr"}],
            }
        )
    )
    assert schema.required == ("ship", "bill")


def test_the_package_pom_lists_the_kafka_source_and_spark_avro():
    from spark.jars import spark_packages, spark_version

    assert spark_packages().split(",") == [
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version()}",
        f"org.apache.spark:spark-avro_2.13:{spark_version()}",
    ]
    assert Path(__file__).parents[2].joinpath("spark", "pom.xml").is_file()


def test_the_pyspark_pins_are_the_release_the_pom_pins():
    from spark.jars import spark_version

    pyproject = tomllib.loads(Path(__file__).parents[2].joinpath("pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    pins = [req for extra in ("spark", "dev") for req in extras[extra] if "pyspark" in req]
    assert pins == [f"pyspark=={spark_version()}"] * 2


def test_jars_for_another_release_than_the_installed_pyspark_are_refused(monkeypatch):
    pyspark = pytest.importorskip("pyspark")
    from spark import jars

    monkeypatch.setattr(pyspark, "__version__", "4.0.0")
    monkeypatch.setattr(jars, "spark_version", lambda: "4.2.0")
    refused = r"installed PySpark is 4\.0\.0 but spark/pom\.xml .* install pyspark==4\.2\.0"
    with pytest.raises(ConfigError, match=refused):
        jars.spark_jars()


def test_a_complete_jar_cache_is_used_and_one_from_an_older_pom_resolved_again(
    tmp_path, monkeypatch
):
    pytest.importorskip("pyspark")
    from spark import jars

    monkeypatch.setenv("RMQ_CACHE_DIR", str(tmp_path))
    libs = tmp_path / f"spark-kafka-{jars.spark_version()}" / "libs"
    libs.mkdir(parents=True)
    kafka = f"spark-sql-kafka-0-10_2.13-{jars.spark_version()}.jar"
    avro = f"spark-avro_2.13-{jars.spark_version()}.jar"
    resolved: list[Path] = []

    def resolve(pom: Path, target: Path, what: str) -> Path:
        if any(target.glob("*.jar")):  # as Maven's resolver: a filled cache is kept
            return target
        resolved.append(target)
        target.mkdir(parents=True)
        for name in (kafka, avro):
            (target / name).touch()
        return target

    monkeypatch.setattr(jars, "resolve_maven_jars", resolve)
    (libs / kafka).touch()  # resolved before spark-avro was listed
    assert sorted(Path(p).name for p in jars.spark_jars()) == [avro, kafka]
    assert resolved == [libs]
    assert sorted(Path(p).name for p in jars.spark_jars()) == [avro, kafka]
    assert resolved == [libs]  # complete now: not resolved again
