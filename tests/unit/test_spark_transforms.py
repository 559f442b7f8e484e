"""Spark job transforms on static DataFrames: subscription guard, promoted filter, Avro."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import datetime

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from rmq_semantics.errors import ConfigError, SystemTopicError
from spark.transforms import (
    META_COLUMNS,
    avro_spark_schema,
    decode_avro,
    decode_string,
    drop_unpromoted,
    guard_subscription,
    header_value,
    is_promoted,
)

pytestmark = pytest.mark.spark

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "sku", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": ["null", "double"], "default": None},
        {"name": "paid", "type": "boolean"},
        {"name": "weight", "type": "float"},
        {"name": "blob", "type": "bytes"},
        {"name": "note", "type": ["string", "null"]},
    ],
}

# The frame Spark's Kafka source yields with includeHeaders=true.
KAFKA_SCHEMA = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
        T.StructField(
            "headers",
            T.ArrayType(
                T.StructType(
                    [T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]
                )
            ),
        ),
    ]
)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One small local session; built like the job's so a later Kafka test can share it."""
    from rmq_semantics.errors import RmqError
    from spark.job import build_session

    conf = {"spark.default.parallelism": "2"}
    try:
        session = build_session("local[2]", "rmq-test-transforms", conf=conf)
    except RmqError:  # Kafka source jars unavailable: transforms do not need them
        import os
        import sys

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        session = (
            SparkSession.builder.master("local[2]")
            .appName("rmq-test-transforms")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
    yield session
    session.stop()


def avro_bytes(record: dict, schema: dict = ORDER_SCHEMA) -> bytes:
    import fastavro

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def kafka_row(
    value: bytes | None, offset: int, headers: dict[str, str] | None = None, key: str | None = "k"
) -> tuple:
    hdrs = [(k, v.encode()) for k, v in (headers or {}).items()]
    return (
        key.encode() if key else None,
        value,
        "orders",
        0,
        offset,
        datetime(2026, 1, 1, 12, 0, offset),
        0,
        hdrs,
    )


def order(i: int, **extra: object) -> dict:
    return {
        "id": i,
        "sku": f"sku-{i}",
        "qty": i * 2,
        "price": 9.5 if i % 2 else None,
        "paid": bool(i % 2),
        "weight": 1.5,
        "blob": b"\x00\x01",
        "note": None,
        **extra,
    }


# ----------------------------------------------------------------------------- guard


@pytest.mark.parametrize(
    "topics",
    [
        "__rmq_half",
        "__rmq_op",
        ["orders", "__rmq_check"],
        "orders,__rmq_lock",
        "^__rmq.*",
        ".*",
        "^.*_half$",
        "^_",
        "orders-.*",
        "^(orders|__rmq_op)$",
        "^[_a-z]+$",
        "^.{2}rmq",
        "(?i)^__RMQ",
        r"^\w+_half",
        "^[^o].*",
        "^x?__rmq_op$",
        "^__.*",
    ],
)
def test_guard_refuses_any_subscription_that_could_reach_a_system_topic(topics):
    with pytest.raises(SystemTopicError) as info:
        guard_subscription(topics)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("topics", "option", "value"),
    [
        ("orders", "subscribe", "orders"),
        ("orders, payments", "subscribe", "orders,payments"),
        (["orders", "payments.v1"], "subscribe", "orders,payments.v1"),
        ("^orders-.*", "subscribePattern", "^orders-.*"),
        ("^(orders|payments)-[0-9]+$", "subscribePattern", "^(orders|payments)-[0-9]+$"),
        (r"\Ashop\..*", "subscribePattern", r"\Ashop\..*"),
        ("^[a-z].*", "subscribePattern", "^[a-z].*"),
    ],
)
def test_guard_accepts_business_topics_and_anchored_patterns(topics, option, value):
    sub = guard_subscription(topics)
    assert (sub.option, sub.value) == (option, value)


def test_guard_follows_a_custom_prefix_and_still_refuses_the_default_one():
    assert guard_subscription("^myapp-orders$", "myapp").value == "^myapp-orders$"
    for topics in ("myapp_half", "^myapp.*", "^myapp_lock_reply$", "__rmq_op", "^m.*"):
        with pytest.raises(SystemTopicError):
            guard_subscription(topics, "myapp")


def test_guard_refuses_a_regex_it_cannot_check_and_a_mix_of_names_and_regex():
    with pytest.raises(SystemTopicError, match="cannot be checked"):
        guard_subscription(r"^\p{Alpha}+$")
    with pytest.raises(ConfigError, match="either one regex or a list"):
        guard_subscription(["orders", "^pay.*"])
    with pytest.raises(ConfigError):
        guard_subscription([])


# ----------------------------------------------------------------------------- filter


def test_drop_unpromoted_keeps_only_rows_with_the_promoted_from_header(spark):
    rows = [
        kafka_row(b"a", 0, {"rmq.promoted_from": "3:17", "rmq.txn_id": "t-1"}),
        kafka_row(b"b", 1, {"rmq.txn_id": "t-2"}),  # half-like, never promoted
        kafka_row(b"c", 2),  # no headers at all
        kafka_row(b"d", 3, {"app": "x", "rmq.promoted_from": "0:5"}),
    ]
    df = spark.createDataFrame(rows, KAFKA_SCHEMA)
    df = df.union(
        spark.createDataFrame([(None, b"e", "orders", 0, 4, None, 0, None)], KAFKA_SCHEMA)
    )  # null headers array
    kept = decode_string(drop_unpromoted(df)).orderBy("_offset").collect()
    assert [(r.value, r._txn_id, r._promoted_from) for r in kept] == [
        ("a", "t-1", "3:17"),
        ("d", None, "0:5"),
    ]
    assert list(decode_string(df).columns) == ["value", *META_COLUMNS]


def test_header_value_is_the_last_of_repeated_headers_and_null_when_absent(spark):
    headers = T.StructType([KAFKA_SCHEMA["headers"]])
    df = spark.createDataFrame(
        [
            (None,),
            ([],),
            ([("rmq.txn_id", b"t-1")],),
            ([("rmq.promoted_from", b"1:1"), ("app", None), ("rmq.promoted_from", b"1:2")],),
            ([("rmq.promoted_from", None), ("rmq.txn_id", b"t-2")],),
        ],
        headers,
    )
    rows = df.select(
        header_value("rmq.promoted_from").alias("from"),
        header_value("rmq.txn_id").alias("txn"),
        is_promoted().alias("promoted"),
    ).collect()
    assert [tuple(r) for r in rows] == [
        (None, None, False),
        (None, None, False),
        (None, "t-1", False),
        ("1:2", None, True),
        (None, "t-2", True),
    ]


# ----------------------------------------------------------------------------- Avro


def test_decode_avro_decodes_fastavro_bytes_with_the_writer_schema(spark):
    headers = {"rmq.promoted_from": "3:17", "rmq.txn_id": "txn-1"}
    df = spark.createDataFrame(
        [
            kafka_row(avro_bytes(order(1)), 0, headers),
            kafka_row(avro_bytes(order(2, note="hi")), 1, headers),
        ],
        KAFKA_SCHEMA,
    )
    out = decode_avro(df, json.dumps(ORDER_SCHEMA))
    assert out.columns == [f["name"] for f in ORDER_SCHEMA["fields"]] + [
        "_decode_error",
        *META_COLUMNS,
    ]
    assert out.schema["id"].dataType == T.LongType()
    assert all(f.nullable for f in out.schema.fields)  # undecodable rows hold nulls
    rows = out.orderBy("_offset").collect()
    first = rows[0].asDict()
    assert {k: first[k] for k in ("id", "sku", "qty", "price", "paid", "weight", "note")} == {
        "id": 1,
        "sku": "sku-1",
        "qty": 2,
        "price": 9.5,
        "paid": True,
        "weight": 1.5,
        "note": None,
    }
    assert bytes(first["blob"]) == b"\x00\x01"
    assert (
        first["_decode_error"],
        first["_topic"],
        first["_partition"],
        first["_offset"],
        first["_key"],
        first["_txn_id"],
        first["_promoted_from"],
    ) == (None, "orders", 0, 0, "k", "txn-1", "3:17")
    assert (rows[1].id, rows[1].price, rows[1].note) == (2, None, "hi")


def test_kafka_records_keep_the_source_key_and_headers_and_carry_the_row_as_json(spark):
    from spark.transforms import KAFKA_CARRY, decode_string, kafka_records

    schema = {
        "type": "record",
        "name": "Keyed",
        "fields": [{"name": "key", "type": "string"}, {"name": "headers", "type": "int"}],
    }
    headers = {"rmq.txn_id": "txn-1", "rmq.promoted_from": "3:17", "traceparent": "00-ab"}
    df = spark.createDataFrame(
        [kafka_row(avro_bytes({"key": "field", "headers": 7}, schema), 0, headers, key="k1")],
        KAFKA_SCHEMA,
    )

    [avro] = kafka_records(decode_avro(df, json.dumps(schema), KAFKA_CARRY)).collect()
    [text] = kafka_records(decode_string(df, KAFKA_CARRY)).collect()

    assert bytes(avro.key) == b"k1"  # the source key, not the decoded field named "key"
    assert [(h.key, bytes(h.value).decode()) for h in avro.headers] == list(headers.items())
    row = json.loads(avro.value)
    assert (row["key"], row["headers"], row["_txn_id"], row["_promoted_from"]) == (
        "field",
        7,
        "txn-1",
        "3:17",
    )
    assert list(row) == ["key", "headers", "_decode_error", *META_COLUMNS]
    assert row["_decode_error"] is None  # null columns are in the JSON too
    assert json.loads(text.value)["_txn_id"] == "txn-1" and bytes(text.key) == b"k1"


def test_malformed_values_become_rows_with_null_fields_and_a_decode_error(spark):
    good = avro_bytes(order(1))
    df = spark.createDataFrame(
        [
            kafka_row(b"\xff\xff\xff", 0),
            kafka_row(good + b"zz", 1),
            kafka_row(None, 2),
            kafka_row(good, 3),
        ],
        KAFKA_SCHEMA,
    )
    rows = decode_avro(df, json.dumps(ORDER_SCHEMA)).orderBy("_offset").collect()
    assert [r.id for r in rows] == [None, None, None, 1]
    errors = [r._decode_error for r in rows]
    assert all(errors[:3]) and errors[3] is None
    assert "bytes left" in errors[1] and "null" in errors[2]


def test_avro_logical_nested_and_collection_types_map_to_spark_types(spark):
    schema = {
        "type": "record",
        "name": "Event",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "attrs", "type": {"type": "map", "values": "long"}},
            {
                "name": "ship",
                "type": [
                    "null",
                    {
                        "type": "record",
                        "name": "Addr",
                        "fields": [{"name": "city", "type": "string"}],
                    },
                ],
            },
            {"name": "bill", "type": "Addr"},
        ],
    }
    struct = avro_spark_schema(json.dumps(schema))
    assert [f.dataType for f in struct.fields][:3] == [
        T.TimestampType(),
        T.DateType(),
        T.StringType(),
    ]
    record = {
        "at": datetime(2026, 1, 2, 3, 4, 5),
        "day": datetime(2026, 1, 2).date(),
        "kind": "B",
        "tags": ["x", "y"],
        "attrs": {"n": 7},
        "ship": None,
        "bill": {"city": "Hangzhou"},
    }
    df = spark.createDataFrame([kafka_row(avro_bytes(record, schema), 0)], KAFKA_SCHEMA)
    [row] = decode_avro(df, json.dumps(schema)).collect()
    assert row._decode_error is None
    assert (row.kind, row.tags, row.attrs, row.ship, row.bill.city) == (
        "B",
        ["x", "y"],
        {"n": 7},
        None,
        "Hangzhou",
    )
    assert row.day == record["day"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]},
        {"type": "record", "name": "R", "fields": [{"name": "_topic", "type": "string"}]},
        {"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]},
        {"type": "string"},
        "not json",
    ],
)
def test_unmappable_avro_schemas_are_config_errors(spark, schema):
    text = schema if isinstance(schema, str) else json.dumps(schema)
    df = spark.createDataFrame([], KAFKA_SCHEMA)
    with pytest.raises(ConfigError):
        decode_avro(df, text)


# ----------------------------------------------------------------------------- job input


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"checkpoint": "OUT/_checkpoint"}, "lies inside output"),
        ({"checkpoint": "OUT"}, "lies inside output"),
        ({"kafka_options": {"kafka.isolation.level": "read_uncommitted"}}, "set by the job"),
        ({"kafka_options": {"subscribePattern": ".*"}}, "set by the job"),
        ({"sink": "delta"}, "sink='delta'"),
        ({"avro_schema": "NOFILE"}, "cannot read the schema file"),
        (
            {
                "avro_schema": '{"type": "record", "name": "R", "fields": [{"name": "u", '
                '"type": ["int", "string"]}]}'
            },
            "union",
        ),
    ],
)
def test_run_job_refuses_bad_input_before_starting_spark(monkeypatch, tmp_path, kwargs, message):
    import spark.job as job

    def no_spark(*args: object, **kw: object) -> None:
        raise AssertionError("a Spark session was requested for refused input")

    monkeypatch.setattr(job, "build_session", no_spark)
    out = tmp_path / "out"
    kwargs = {
        k: (
            v.replace("OUT", str(out)).replace("NOFILE", str(tmp_path / "x.avsc"))
            if isinstance(v, str)
            else v
        )
        for k, v in kwargs.items()
    }
    with pytest.raises(ConfigError, match=message):
        job.run_job(
            job.JobSettings(
                bootstrap_servers="127.0.0.1:9",
                topics="orders",
                output=out,
                available_now=True,
                **kwargs,
            )
        )
    assert list(tmp_path.iterdir()) == []


def test_kafka_security_options_pass_through_and_the_checkpoint_sits_beside_the_output(tmp_path):
    from spark.job import JobSettings

    sasl = {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "x required;",
        "startingOffsets": "latest",
    }
    settings = JobSettings(
        bootstrap_servers="b:9092",
        topics="orders",
        output=tmp_path / "out",
        topic_prefix="__rmq",
        kafka_options=sasl,
    )
    assert settings.checkpoint == f"{tmp_path / 'out'}.checkpoint"
    assert settings.source_options == {
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
        "failOnDataLoss": "false",
        **sasl,
    }


# ----------------------------------------------------------------------------- Java's view


@pytest.mark.parametrize(
    "pattern",
    [
        "^__rmq.*",
        ".*",
        "^.*_half$",
        "^_",
        "orders-.*",
        "^(orders|__rmq_op)$",
        "^[_a-z]+$",
        "^.{2}rmq",
        "(?i)^__RMQ",
        r"^\w+_half",
        "^[^o].*",
        "^x?__rmq_op$",
        "^__.*",
        "^a|__rmq_op",
        r"^\p{Punct}",
        "^(ab",
    ],
)
def test_java_regex_engine_refuses_what_could_reach_a_system_topic(spark, pattern):
    from spark.subscription import Subscription, confirm_with_java

    with pytest.raises(SystemTopicError, match="Java"):
        confirm_with_java(spark, Subscription("subscribePattern", pattern))


@pytest.mark.parametrize(
    "pattern",
    [
        "^orders-.*",
        "^(orders|payments)-[0-9]+$",
        r"\Ashop\..*",
        "^[a-z].*",
        r"^\p{Alpha}+$",
    ],
)
def test_java_regex_engine_accepts_anchored_business_patterns(spark, pattern):
    from spark.subscription import Subscription, confirm_with_java

    confirm_with_java(spark, Subscription("subscribePattern", pattern))
    confirm_with_java(spark, Subscription("subscribe", "__rmq_half"))  # names: guarded before


# ----------------------------------------------------------------------------- Avro, more


DECIMAL_SCHEMA = {
    "type": "record",
    "name": "Pay",
    "fields": [
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2},
        },
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "tag", "type": {"type": "fixed", "name": "Tag", "size": 2}},
    ],
}


def test_decimals_decode_exactly_and_one_too_wide_is_a_decode_error(spark):
    from decimal import Decimal

    wide = {
        **DECIMAL_SCHEMA,
        "fields": [
            {
                **DECIMAL_SCHEMA["fields"][0],
                "type": {**DECIMAL_SCHEMA["fields"][0]["type"], "precision": 12},
            },
            *DECIMAL_SCHEMA["fields"][1:],
        ],
    }
    ref = "6f1c8a52-1a3b-4c55-9d7e-0123456789ab"
    df = spark.createDataFrame(
        [
            kafka_row(
                avro_bytes(
                    {"amount": Decimal("-1234.56"), "ref": ref, "tag": b"ab"}, DECIMAL_SCHEMA
                ),
                0,
            ),
            kafka_row(
                avro_bytes({"amount": Decimal("123456.78"), "ref": ref, "tag": b"ab"}, wide), 1
            ),
        ],
        KAFKA_SCHEMA,
    )
    out = decode_avro(df, json.dumps(DECIMAL_SCHEMA))
    assert [f.dataType for f in out.schema.fields[:3]] == [
        T.DecimalType(6, 2),
        T.StringType(),
        T.BinaryType(),
    ]
    good, bad = out.orderBy("_offset").collect()
    assert (good.amount, good.ref, bytes(good.tag), good._decode_error) == (
        Decimal("-1234.56"),
        ref,
        b"ab",
        None,
    )
    assert (bad.amount, bad.ref) == (None, None) and bad._decode_error


def test_a_value_of_another_schema_is_an_error_even_when_every_field_may_be_null(spark):
    optional = {
        "type": "record",
        "name": "Opt",
        "fields": [
            {"name": "a", "type": ["null", "long"], "default": None},
            {"name": "b", "type": ["null", "string"], "default": None},
        ],
    }
    other = {"type": "record", "name": "O", "fields": [{"name": "s", "type": "string"}]}
    df = spark.createDataFrame(
        [
            kafka_row(avro_bytes({"a": None, "b": "x"}, optional), 0),
            kafka_row(avro_bytes({"s": "hello world"}, other), 1),
            kafka_row(b"\x00\x00", 2),
        ],
        KAFKA_SCHEMA,
    )
    rows = decode_avro(df, json.dumps(optional)).orderBy("_offset").collect()
    assert [(r.a, r.b, r._decode_error is None) for r in rows] == [
        (None, "x", True),
        (None, None, False),
        (None, None, True),
    ]


def test_avro_spark_schema_is_what_decode_avro_writes(spark):
    struct = avro_spark_schema(json.dumps(ORDER_SCHEMA))
    df = spark.createDataFrame([], KAFKA_SCHEMA)
    decoded = decode_avro(df, json.dumps(ORDER_SCHEMA))
    assert [(f.name, f.dataType) for f in struct.fields] == [
        (f.name, f.dataType) for f in decoded.schema.fields[: len(struct.fields)]
    ]
