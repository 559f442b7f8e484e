"""Pure transforms of the Spark job: subscription guard, promoted-only filter, Avro decoding.

Nothing here reads or writes Kafka; :mod:`spark.job` wires ``readStream`` → these →
``writeStream``. The DataFrame functions take and return the frame Spark's Kafka source
yields with ``includeHeaders=true`` (``key``, ``value``, ``topic``, ``partition``,
``offset``, ``timestamp``, ``headers: array<struct<key: string, value: binary>>``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from re import _constants as sre  # the parser below is CPython's own; 3.11+ keeps it here
from re import _parser as sre_parse
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rmq_semantics.errors import ConfigError, SystemTopicError
from rmq_semantics.records.headers import H
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, SystemTopics, is_system_topic

__all__ = [
    "DECODE_ERROR_COLUMN",
    "META_COLUMNS",
    "Subscription",
    "avro_spark_schema",
    "decode_avro",
    "decode_string",
    "drop_unpromoted",
    "guard_subscription",
    "header_value",
    "is_promoted",
]

#: Columns every output row carries next to the decoded value (all prefixed ``_``).
META_COLUMNS = ("_topic", "_partition", "_offset", "_key", "_timestamp", "_txn_id",
                "_promoted_from")
#: Set (to the reason) on rows whose value could not be decoded; null otherwise.
DECODE_ERROR_COLUMN = "_decode_error"

# Characters Kafka allows in a topic name, plus the comma of a name list: anything else
# makes the string a regex for ``subscribePattern``.
_NAME_LIST = re.compile(r"[A-Za-z0-9._\-,\s]+")
_DECODED = "__rmq_decoded"
# Longest decode-error text kept per row: enough for the exception, not a dump of the value.
_MAX_ERROR_CHARS = 300


# --------------------------------------------------------------------------- subscription


@dataclass(frozen=True)
class Subscription:
    """How the Kafka source subscribes: ``option`` is ``subscribe`` or ``subscribePattern``."""

    option: str
    value: str

    @property
    def is_pattern(self) -> bool:
        return self.option == "subscribePattern"


def _probe_names(prefix: str) -> list[str]:
    names = []
    for p in dict.fromkeys((prefix, DEFAULT_TOPIC_PREFIX)):
        t = SystemTopics(p)
        names += [t.half, t.op, t.check, t.discard, t.lock, t.lock_request, t.lock_reply,
                  t.dlq("x")]
    return [*names, "__rmqX_half", "__consumer_offsets", "__transaction_state"]


def guard_subscription(topics: str | list[str] | tuple[str, ...],
                       topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> Subscription:
    """Refuse any subscription that could reach a system topic; return how to subscribe.

    ``topics`` is a topic name, a comma-separated list of names, a list of names, or one
    regex (a string that starts with ``^`` or holds characters a topic name cannot).
    Names under ``<topic_prefix>_`` or ``__rmq_`` raise :class:`SystemTopicError`. A regex
    is used with ``subscribePattern``, which Spark matches *anywhere* in a topic name
    (``findFirstIn``); it is refused when it matches a probe system-topic name
    (``<prefix>_half``, ``_op``, ``_check``, ``_discard``, ``_lock``, ``_lock_request``,
    ``_lock_reply``, ``_dlq_x``) or could match a name starting with ``__`` or with
    ``<prefix>_`` — so it must be anchored with ``^`` and begin with something else.
    """
    prefix = SystemTopics(topic_prefix).prefix  # validates it
    items = [topics] if isinstance(topics, str) else list(topics)
    if not items or not all(isinstance(t, str) and t.strip() for t in items):
        raise ConfigError(f"topics={topics!r}: give a topic name, a list of names or a regex")
    patterns = [t for t in items if _is_pattern(t)]
    if patterns:
        if len(items) > 1:
            raise ConfigError(f"topics={topics!r}: give either one regex or a list of names, "
                              "not both")
        pattern = patterns[0]
        reason = _pattern_risk(pattern, prefix)
        if reason:
            raise SystemTopicError(
                f"topic pattern {pattern!r} is refused: {reason}; the Spark job reads only "
                f"promoted topics, never {prefix}_* system topics (anchor it, e.g. '^orders-.*')")
        return Subscription("subscribePattern", pattern)
    names = [n for item in items for n in re.split(r"[,\s]+", item) if n]
    for name in names:
        if is_system_topic(name, prefix):
            raise SystemTopicError(f"topic {name!r} is a system topic of rmq_semantics; the "
                                   "Spark job reads only promoted (business) topics")
    return Subscription("subscribe", ",".join(dict.fromkeys(names)))


def _is_pattern(topics: str) -> bool:
    return topics.startswith("^") or not _NAME_LIST.fullmatch(topics)


def _pattern_risk(pattern: str, prefix: str) -> str | None:
    """Why ``pattern`` could match a system topic, or None when it cannot."""
    try:
        compiled = re.compile(pattern)
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError) as exc:
        return f"it cannot be checked ({exc}); write it in the regex syntax Java and Python share"
    for probe in _probe_names(prefix):
        if compiled.search(probe):
            return f"it matches {probe!r}"
    icase = bool(parsed.state.flags & sre.SRE_FLAG_IGNORECASE)
    for start in dict.fromkeys(("__", f"{prefix}_", f"{DEFAULT_TOPIC_PREFIX}_")):
        for branch in _branches(list(parsed)):
            if not branch or branch[0] not in _ANCHORS:
                return "it is not anchored with '^', and Spark matches it anywhere in a name"
            if _may_start_with(branch[1:], start, icase):
                return f"it could match a topic name starting with {start!r}"
    return None


_ANCHORS = ((sre.AT, sre.AT_BEGINNING), (sre.AT, sre.AT_BEGINNING_STRING))
_UNKNOWN = (None, None)  # stands for "anything may follow"
_REPEATS = {sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT)}


def _branches(items: list) -> list[list]:
    if len(items) == 1 and items[0][0] is sre.BRANCH:
        return [list(alt) for alt in items[0][1][1]]
    return [items]


def _may_start_with(items: list, prefix: str, icase: bool) -> bool:
    """Whether the parsed regex ``items`` could match text beginning with ``prefix``.

    Conservative: any construct it does not follow exactly answers True.
    """
    for i, (op, arg) in enumerate(items):
        if not prefix:
            return True
        rest = items[i + 1:]
        if op is sre.AT:
            if arg in (sre.AT_END, sre.AT_END_STRING):
                return False  # the name would end before the prefix does
            continue
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN):
            member = _matches_char(op, arg, prefix[0], icase)
            if member is None:
                return True
            if not member:
                return False
            prefix = prefix[1:]
            continue
        if op is sre.SUBPATTERN:
            add_flags, sub = arg[1], arg[3]
            return _may_start_with(list(sub) + rest, prefix,
                                   icase or bool(add_flags & sre.SRE_FLAG_IGNORECASE))
        if op is sre.BRANCH:
            return any(_may_start_with(list(alt) + rest, prefix, icase) for alt in arg[1])
        if op in _REPEATS:
            low, high, sub = arg
            if low == high and low <= len(prefix):
                return _may_start_with(list(sub) * low + rest, prefix, icase)
            at_least = list(sub) * min(low, len(prefix)) + [_UNKNOWN]
            if low == 0:
                return _may_start_with(rest, prefix, icase) or _may_start_with(
                    at_least[:-1] + list(sub) + [_UNKNOWN], prefix, icase)
            return _may_start_with(at_least, prefix, icase)
        return True
    return True  # the match may be followed by anything: Spark searches, never full-matches


def _matches_char(op: Any, arg: Any, ch: str, icase: bool) -> bool | None:
    """Whether one-character item (op, arg) matches ``ch``; None when unsure."""
    variants = {ch, ch.lower(), ch.upper()} if icase else {ch}
    if op is sre.ANY:
        return ch != "\n"
    if op is sre.LITERAL:
        return any(chr(arg) in variants or (icase and chr(arg).lower() == v.lower())
                   for v in variants)
    if op is sre.NOT_LITERAL:
        return None if icase else chr(arg) != ch
    negate = False
    found = False
    for item_op, item_arg in arg:
        if item_op is sre.NEGATE:
            negate = True
        elif item_op is sre.LITERAL:
            found |= chr(item_arg) in variants
        elif item_op is sre.RANGE:
            found |= any(item_arg[0] <= ord(v) <= item_arg[1] for v in variants)
        elif item_op is sre.CATEGORY and item_arg in _CATEGORIES:
            found |= _CATEGORIES[item_arg](ch)
        else:
            return None
    return found != negate


_CATEGORIES: dict[Any, Callable[[str], bool]] = {
    sre.CATEGORY_DIGIT: str.isdigit,
    sre.CATEGORY_NOT_DIGIT: lambda c: not c.isdigit(),
    sre.CATEGORY_SPACE: str.isspace,
    sre.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
    sre.CATEGORY_WORD: lambda c: c.isalnum() or c == "_",
    sre.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
}


# --------------------------------------------------------------------------- headers


def header_value(name: str, headers: str | Column = "headers") -> Column:
    """The last value of header ``name`` as a string column (null when absent)."""
    col = F.col(headers) if isinstance(headers, str) else headers
    matching = F.filter(col, lambda h: h["key"] == F.lit(name))
    return F.try_element_at(matching, F.lit(-1))["value"].cast("string")


def is_promoted(headers: str | Column = "headers") -> Column:
    """True when the record carries ``rmq.promoted_from``; false (never null) otherwise."""
    col = F.col(headers) if isinstance(headers, str) else headers
    return F.coalesce(F.exists(col, lambda h: h["key"] == F.lit(H.PROMOTED_FROM)),
                      F.lit(False))


def drop_unpromoted(df: DataFrame) -> DataFrame:
    """Keep only records the coordinator promoted (those with header ``rmq.promoted_from``).

    A record without it on a transactional topic was written around the transaction
    protocol; the job drops it (:mod:`spark.job` counts how many).
    """
    return df.where(is_promoted("headers"))


def _meta_columns(df: DataFrame) -> list[Column]:
    has_headers = "headers" in df.columns
    txn = header_value(H.TXN_ID) if has_headers else F.lit(None).cast("string")
    promoted = (header_value(H.PROMOTED_FROM) if has_headers
                else F.lit(None).cast("string"))
    return [F.col("topic").alias("_topic"), F.col("partition").alias("_partition"),
            F.col("offset").alias("_offset"), F.col("key").cast("string").alias("_key"),
            F.col("timestamp").alias("_timestamp"), txn.alias("_txn_id"),
            promoted.alias("_promoted_from")]


def decode_string(df: DataFrame) -> DataFrame:
    """The output rows when no Avro schema is given: ``value`` as UTF-8 text plus metadata."""
    return df.select(F.col("value").cast("string").alias("value"), *_meta_columns(df))


# --------------------------------------------------------------------------- Avro

_Converter = Callable[[Any], Any]


def _check_int(bits: int) -> _Converter:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def convert(value: Any) -> Any:
        if not low <= value <= high:
            raise ValueError(f"{value} does not fit in {bits} bits")
        return value

    return convert


_PRIMITIVES: dict[str, tuple[T.DataType, _Converter | None]] = {
    "boolean": (T.BooleanType(), None),
    "int": (T.IntegerType(), _check_int(32)),
    "long": (T.LongType(), _check_int(64)),
    "float": (T.FloatType(), None),
    "double": (T.DoubleType(), None),
    "bytes": (T.BinaryType(), None),
    "string": (T.StringType(), None),
}
_LOGICAL: dict[tuple[str, str], T.DataType] = {
    ("long", "timestamp-millis"): T.TimestampType(),
    ("long", "timestamp-micros"): T.TimestampType(),
    ("long", "local-timestamp-millis"): T.TimestampNTZType(),
    ("long", "local-timestamp-micros"): T.TimestampNTZType(),
    ("int", "date"): T.DateType(),
}


class _AvroToSpark:
    """Maps an Avro writer schema to a Spark type plus a per-value converter."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.active: set[str] = set()  # records being compiled, to refuse recursive ones

    def register(self, schema: dict, namespace: str) -> str:
        """Remember a named type under its name and full name; return the full name."""
        name = schema.get("name", "")
        space = schema.get("namespace", namespace)
        full = name if "." in name or not space else f"{space}.{name}"
        self.named[full] = self.named[name] = schema
        return full

    def compile(self, schema: Any, where: str, namespace: str = ""
                ) -> tuple[T.DataType, bool, _Converter | None]:
        """(Spark type, nullable, converter or None) for ``schema``; ``where`` names it."""
        if isinstance(schema, list):
            branches = [s for s in schema if s != "null"]
            if len(branches) != 1 or len(schema) != 2:
                raise ConfigError(f"Avro field {where}: union {json.dumps(schema)} is not "
                                  "mapped; use a type or [\"null\", type]")
            spark_type, _, convert = self.compile(branches[0], where, namespace)
            return spark_type, True, _nullable(convert)
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                spark_type, convert = _PRIMITIVES[schema]
                return spark_type, False, convert
            if schema in self.named or f"{namespace}.{schema}" in self.named:
                return self.compile(self.named.get(schema) or self.named[f"{namespace}.{schema}"],
                                    where, namespace)
            raise ConfigError(f"Avro field {where}: type {schema!r} is not mapped to Spark")
        if not isinstance(schema, dict) or "type" not in schema:
            raise ConfigError(f"Avro field {where}: {schema!r} is not an Avro schema")
        kind = schema["type"]
        if kind in ("enum", "fixed"):
            self.register(schema, namespace)
        logical = schema.get("logicalType")
        if logical in ("time-millis", "time-micros"):
            raise ConfigError(f"Avro field {where}: logical type {logical} has no Spark type")
        if isinstance(kind, str) and (kind, logical) in _LOGICAL:
            return _LOGICAL[(kind, logical)], False, None
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
            if precision > 38:
                raise ConfigError(f"Avro field {where}: decimal precision {precision} > 38")
            return T.DecimalType(precision, scale), False, _check_decimal(precision, scale)
        if logical == "uuid" and kind == "string":
            return T.StringType(), False, str
        if kind in ("record", "error"):
            return self.record(schema, where, namespace)
        if kind == "enum":
            return T.StringType(), False, None
        if kind == "fixed":
            return T.BinaryType(), False, None
        if kind == "array":
            elem, elem_null, convert = self.compile(schema["items"], f"{where}[]", namespace)
            return (T.ArrayType(elem, elem_null), False,
                    None if convert is None else (lambda v: [convert(x) for x in v]))
        if kind == "map":
            val, val_null, convert = self.compile(schema["values"], f"{where}{{}}", namespace)
            return (T.MapType(T.StringType(), val, val_null), False,
                    None if convert is None else (lambda v: {k: convert(x) for k, x in v.items()}))
        if isinstance(kind, (str, list, dict)) and kind != schema:
            return self.compile(kind, where, namespace)  # {"type": "string"} and alike
        raise ConfigError(f"Avro field {where}: type {kind!r} is not mapped to Spark")

    def record(self, schema: dict, where: str, namespace: str
               ) -> tuple[T.StructType, bool, _Converter]:
        full = self.register(schema, namespace)
        if full in self.active:
            raise ConfigError(f"Avro field {where}: recursive record {full!r} has no Spark type")
        self.active.add(full)
        namespace = full.rpartition(".")[0]
        fields, converters, names = [], [], []
        for field in schema.get("fields", []):
            path = f"{where}.{field['name']}" if where else field["name"]
            spark_type, nullable, convert = self.compile(field["type"], path, namespace)
            fields.append(T.StructField(field["name"], spark_type, nullable))
            converters.append(convert)
            names.append(field["name"])
        self.active.discard(full)
        pairs = list(zip(names, converters, strict=True))

        def convert_record(value: dict) -> tuple:
            return tuple(value[n] if c is None else c(value[n]) for n, c in pairs)

        return T.StructType(fields), False, convert_record


def _nullable(convert: _Converter | None) -> _Converter | None:
    if convert is None:
        return None
    return lambda v: None if v is None else convert(v)


def _check_decimal(precision: int, scale: int) -> _Converter:
    limit = Decimal(10) ** (precision - scale)

    def convert(value: Decimal) -> Decimal:
        if abs(value) >= limit:
            raise ValueError(f"{value} does not fit decimal({precision},{scale})")
        return value

    return convert


def _parse_record_schema(schema_json: str) -> tuple[Any, dict]:
    import fastavro

    try:
        raw = json.loads(schema_json)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"Avro schema is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("type") not in ("record", "error"):
        raise ConfigError("Avro schema must be a record schema ({\"type\": \"record\", ...})")
    try:
        parsed = fastavro.parse_schema(raw)
    except Exception as exc:  # fastavro raises several types for a bad schema
        raise ConfigError(f"Avro schema is invalid: {exc}") from exc
    return parsed, raw


def avro_spark_schema(schema_json: str) -> T.StructType:
    """The Spark struct a record schema decodes to (one column per top-level field)."""
    _, raw = _parse_record_schema(schema_json)
    struct, _, _ = _AvroToSpark().record(raw, "", raw.get("namespace", ""))
    return struct


def _make_decoder(parsed: Any, convert: _Converter, width: int) -> Callable[[Any], tuple]:
    empty = (None,) * width

    def decode(value: bytes | bytearray | None) -> tuple:
        import io

        import fastavro

        if value is None:
            return (*empty, "value is null")
        buf = io.BytesIO(value)
        try:
            record = fastavro.schemaless_reader(buf, parsed, None)
            left = len(value) - buf.tell()
            if left:
                raise ValueError(f"{left} bytes left after the record (wrong schema?)")
            return (*convert(record), None)
        except Exception as exc:  # any malformed value becomes an error row, never a crash
            return (*empty, f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS])

    return decode


def decode_avro(df: DataFrame, schema_json: str) -> DataFrame:
    """Decode the binary ``value`` with the Avro writer schema ``schema_json`` (a record).

    Output: one column per top-level field of the record, then ``_decode_error``, then
    :data:`META_COLUMNS`. Avro primitives (string, int, long, float, double, boolean,
    bytes), ``["null", T]`` unions, enums (as string), fixed, arrays, maps, nested records
    and the timestamp/date/decimal/uuid logical types are mapped; any other type is a
    :class:`ConfigError` before Spark runs.

    Malformed values are kept, never dropped: the row has null fields and
    ``_decode_error`` says why (exception text, or bytes left over after the record, or a
    null value). ``_decode_error`` is null on every row that decoded; the job counts the
    others.
    """
    parsed, raw = _parse_record_schema(schema_json)
    struct, _, convert = _AvroToSpark().record(raw, "", raw.get("namespace", ""))
    clash = {f.name for f in struct.fields} & {*META_COLUMNS, DECODE_ERROR_COLUMN}
    if clash:
        raise ConfigError(f"Avro fields {sorted(clash)} clash with the job's metadata columns")
    # Every top-level field is nullable: a row that did not decode has nulls in all of them.
    fields = [T.StructField(f.name, f.dataType, True) for f in struct.fields]
    result = T.StructType([*fields, T.StructField(DECODE_ERROR_COLUMN, T.StringType())])
    decode = F.udf(_make_decoder(parsed, convert, len(struct.fields)), result)
    with_decoded = df.select(decode(F.col("value")).alias(_DECODED), *_meta_columns(df))
    return with_decoded.select(f"{_DECODED}.*", *META_COLUMNS)
