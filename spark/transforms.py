"""Pure transforms of the Spark job: promoted-only filter, header columns, value decoding.

Nothing here reads or writes Kafka; :mod:`spark.job` wires ``readStream`` → these →
``writeStream``. The DataFrame functions take and return the frame Spark's Kafka source
yields with ``includeHeaders=true`` (``key``, ``value``, ``topic``, ``partition``,
``offset``, ``timestamp``, ``headers: array<struct<key: string, value: binary>>``).
Avro values are decoded by Spark's own spark-avro (``from_avro``), which needs its jar on
the session's classpath (:func:`spark.job.build_session` puts it there).
"""

from __future__ import annotations

import operator
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.headers import H
from spark.schema import DECODE_ERROR_COLUMN, META_COLUMNS, RecordSchema, parse_record_schema
from spark.subscription import Subscription, guard_subscription

__all__ = [
    "DECODE_ERROR_COLUMN",
    "KAFKA_CARRY",
    "META_COLUMNS",
    "Subscription",
    "avro_spark_schema",
    "decode_avro",
    "decode_string",
    "drop_unpromoted",
    "guard_subscription",
    "header_value",
    "is_promoted",
    "kafka_records",
]

_DECODED = "__rmq_decoded"
#: The source columns :func:`kafka_records` needs beside the output row.
KAFKA_CARRY = ("key", "headers")
# Carried columns are renamed, so they cannot clash with a decoded field named "key".
_CARRIED = "__rmq_carried_"
# Spark's PERMISSIVE mode turns an undecodable value into a row of nulls and hides why.
_MALFORMED = "value does not decode with the writer schema"
_NOT_CANONICAL = (
    "value is not the Avro encoding of what it decodes to (another schema, or "
    "a non-canonical encoding)"
)


# --------------------------------------------------------------------------- headers


def header_value(name: str, headers: str | Column = "headers") -> Column:
    """The last value of header ``name`` as a string column (null when absent)."""
    col = F.col(headers) if isinstance(headers, str) else headers
    # Built-in array functions, not a lambda (filter/exists): Spark compiles these into the
    # stage's generated code, where a higher-order function is interpreted row by row.
    from_end = F.array_position(F.reverse(col.getField("key")), F.lit(name))  # 0: absent
    return F.get(col, F.size(col) - from_end)["value"].cast("string")


def is_promoted(headers: str | Column = "headers") -> Column:
    """True when the record carries ``rmq.promoted_from``; false (never null) otherwise."""
    col = F.col(headers) if isinstance(headers, str) else headers
    return F.coalesce(F.array_contains(col.getField("key"), F.lit(H.PROMOTED_FROM)), F.lit(False))


def keep_tags(df: DataFrame, tags: tuple[str, ...]) -> DataFrame:
    """Keep only records whose ``rmq.tags`` is one of ``tags`` (RocketMQ's ``TagA || TagB``;
    a record without the header matches none)."""
    return df.where(F.coalesce(header_value(H.TAGS).isin(list(tags)), F.lit(False)))


def drop_unpromoted(df: DataFrame) -> DataFrame:
    """Keep only records the coordinator promoted (those with header ``rmq.promoted_from``).

    A record without it on a transactional topic was written around the transaction
    protocol; the job drops it (:mod:`spark.job` counts how many).
    """
    return df.where(is_promoted("headers"))


def _meta_columns(df: DataFrame) -> list[Column]:
    has_headers = "headers" in df.columns
    txn = header_value(H.TXN_ID) if has_headers else F.lit(None).cast("string")
    promoted = header_value(H.PROMOTED_FROM) if has_headers else F.lit(None).cast("string")
    return [
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        F.col("key").cast("string").alias("_key"),
        F.col("timestamp").alias("_timestamp"),
        txn.alias("_txn_id"),
        promoted.alias("_promoted_from"),
    ]


def decode_string(df: DataFrame, carry: tuple[str, ...] = ()) -> DataFrame:
    """The output rows when no Avro schema is given: ``value`` as UTF-8 text plus metadata,
    then the source columns named in ``carry`` (renamed for :func:`kafka_records`)."""
    return df.select(
        F.col("value").cast("string").alias("value"), *_meta_columns(df), *_carried(carry)
    )


def _carried(carry: tuple[str, ...]) -> list[Column]:
    return [F.col(name).alias(_CARRIED + name) for name in carry]


def kafka_records(df: DataFrame) -> DataFrame:
    """The rows of :func:`decode_string` or :func:`decode_avro` (called with
    ``carry=KAFKA_CARRY``) as Kafka sink records.

    ``value``: the row as JSON (every output column, null ones as ``null``, the metadata
    ones ``_txn_id`` and ``_promoted_from`` included); ``key`` and ``headers``: the source
    record's, unchanged, so ``rmq.txn_id`` and ``rmq.promoted_from`` travel as headers too.
    """
    row = [c for c in df.columns if not c.startswith(_CARRIED)]
    return df.select(
        F.col(_CARRIED + "key").alias("key"),
        # Every column, nulls too (to_json leaves them out by default): one shape per row.
        F.to_json(F.struct(*row), {"ignoreNullFields": "false"}).alias("value"),
        F.col(_CARRIED + "headers").alias("headers"),
    )


# --------------------------------------------------------------------------- Avro


def _decoder(schema: RecordSchema) -> tuple[Column, Column]:
    """(decoded struct, re-encoded bytes) of column ``value`` with Spark's spark-avro."""
    from pyspark.sql.avro.functions import from_avro, to_avro

    try:
        decoded = from_avro(F.col("value"), schema.json, {"mode": "PERMISSIVE"})
        return decoded, to_avro(decoded, schema.json)
    except TypeError as exc:  # pyspark's way of saying the spark-avro jar is missing
        from spark.jars import spark_packages

        raise ConfigError(
            "Spark's Avro functions (spark-avro) are not on this session's classpath: create "
            "the first SparkSession of the process with spark.job.build_session(), or start "
            f"Spark with --packages {spark_packages()}"
        ) from exc


def _decode_error(schema: RecordSchema, decoded: Column, reencoded: Column) -> Column:
    """Why a value did not decode, or null.

    A value that decodes must re-encode to exactly its own bytes: that finds trailing
    bytes (which from_avro ignores) and values written with another schema. A null in a
    field the schema never leaves null is Spark's mark of an undecodable value; it is
    checked first, as to_avro cannot encode that row.
    """
    value = F.col("value")
    nulls = [decoded[name].isNull() for name in schema.required]
    malformed = reduce(operator.or_, nulls) if nulls else F.lit(False)
    extra = F.length(value) - F.length(reencoded)
    trailing = (extra > 0) & (value.substr(F.lit(1), F.length(reencoded)) == reencoded)
    return (
        F.when(value.isNull(), F.lit("value is null"))
        .when(malformed, F.lit(_MALFORMED))
        .when(
            reencoded != value,
            F.when(
                trailing, F.format_string("%d bytes left after the record (wrong schema?)", extra)
            ).otherwise(F.lit(_NOT_CANONICAL)),
        )
    )


def avro_spark_schema(schema_json: str, spark: SparkSession | None = None) -> T.StructType:
    """The Spark struct a record schema decodes to (one field per top-level field), as
    spark-avro maps it; ``spark`` defaults to the active session."""
    schema = parse_record_schema(schema_json)
    session = spark or SparkSession.active()
    decoded, _ = _decoder(schema)
    empty = session.createDataFrame([], "value binary")
    struct = empty.select(decoded.alias(_DECODED)).schema[_DECODED].dataType
    if not isinstance(struct, T.StructType):
        raise ConfigError(f"avro_schema: spark-avro maps it to {struct.simpleString()}")
    return struct


def decode_avro(df: DataFrame, schema_json: str, carry: tuple[str, ...] = ()) -> DataFrame:
    """Decode the binary ``value`` with the Avro writer schema ``schema_json`` (a record).

    Output: one column per top-level field of the record, typed as spark-avro maps it
    (primitives, ``["null", T]`` unions, enums as string, fixed, arrays, maps, nested
    records, logical types), then ``_decode_error``, then :data:`META_COLUMNS`. A schema
    :func:`spark.schema.parse_record_schema` refuses is a :class:`ConfigError`.

    Malformed values are kept, never dropped: the row has null fields and
    ``_decode_error`` says why (undecodable, bytes left over after the record, not the
    record's encoding, or a null value). ``_decode_error`` is null on every row that
    decoded; the job counts the others.
    """
    schema = parse_record_schema(schema_json)
    decoded, reencoded = _decoder(schema)
    error = _decode_error(schema, decoded, reencoded)
    from pyspark.errors import AnalysisException

    try:
        checked = df.select(
            decoded.alias(_DECODED),
            error.alias(DECODE_ERROR_COLUMN),
            *_meta_columns(df),
            *_carried(carry),
        )
    except AnalysisException as exc:  # a schema spark-avro cannot map
        raise ConfigError(
            f"avro_schema: Spark cannot decode with it: {str(exc).strip().splitlines()[0]}"
        ) from exc
    # Every field is null on a row that did not decode, whatever the row decoded to.
    kept = F.when(F.col(DECODE_ERROR_COLUMN).isNull(), F.col(_DECODED)).alias(_DECODED)
    carried = [_CARRIED + name for name in carry]
    return checked.select(kept, DECODE_ERROR_COLUMN, *META_COLUMNS, *carried).select(
        *(F.col(_DECODED)[name].alias(name) for name in schema.fields),
        DECODE_ERROR_COLUMN,
        *META_COLUMNS,
        *carried,
    )
