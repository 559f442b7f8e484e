"""The job's output columns and the Avro writer schema it decodes with. Pure: no Spark.

Spark's spark-avro maps the schema to Spark types; this module only refuses, before a
JVM starts, what the job does not write: a schema that is not a record, a union other
than ``["null", T]`` (spark-avro would make it a struct of ``member0..n``), a recursive
record, a decimal wider than Spark's 38 digits, fields named like the metadata columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rmq_semantics.errors import ConfigError

__all__ = [
    "DECODE_ERROR_COLUMN",
    "META_COLUMNS",
    "RecordSchema",
    "load_schema",
    "parse_record_schema",
]

#: Columns every output row carries next to the decoded value (all prefixed ``_``).
META_COLUMNS = (
    "_topic",
    "_partition",
    "_offset",
    "_key",
    "_timestamp",
    "_txn_id",
    "_promoted_from",
)
#: Set (to the reason) on rows whose value could not be decoded; null otherwise.
DECODE_ERROR_COLUMN = "_decode_error"
# Spark's DecimalType holds at most this many digits.
_MAX_DECIMAL_PRECISION = 38


@dataclass(frozen=True)
class RecordSchema:
    """A vetted Avro record schema: its JSON text, its top-level fields, and those of them
    that can never be null (a null there means the value did not decode)."""

    json: str
    fields: tuple[str, ...]
    required: tuple[str, ...]


def load_schema(avro_schema: str | Path) -> str:
    """The schema's JSON text: ``avro_schema`` itself when it is JSON, else a file's content."""
    text = str(avro_schema)
    if isinstance(avro_schema, str) and text.lstrip().startswith(("{", "[", '"')):
        return text
    try:
        return Path(text).read_text()
    except OSError as exc:
        raise ConfigError(f"avro_schema={text!r}: cannot read the schema file ({exc})") from exc


def parse_record_schema(schema_json: str) -> RecordSchema:
    """Parse and vet a writer schema; :class:`ConfigError` says what the job cannot write."""
    import fastavro

    try:
        raw = json.loads(schema_json)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"avro_schema is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("type") not in ("record", "error"):
        raise ConfigError(
            'avro_schema must be a record schema ({"type": "record", ...}), '
            f"got {schema_json[:80]!r}"
        )
    named: dict[str, Any] = {}
    try:
        # A record schema (checked above) parses to a dict.
        parsed = cast(dict[str, Any], fastavro.parse_schema(raw, named_schemas=named))
    except Exception as exc:  # fastavro raises several types for a bad schema
        raise ConfigError(f"avro_schema is invalid: {exc}") from exc
    _vet(parsed, "", named, set())
    fields = tuple(f["name"] for f in parsed["fields"])
    clash = set(fields) & {*META_COLUMNS, DECODE_ERROR_COLUMN}
    if clash:
        raise ConfigError(
            f"avro_schema fields {sorted(clash)} clash with the job's metadata columns"
        )
    required = tuple(f["name"] for f in parsed["fields"] if not _nullable(f["type"]))
    return RecordSchema(schema_json, fields, required)


def _vet(schema: Any, where: str, named: dict[str, Any], active: set[str]) -> None:
    """Walk a parsed schema; ``active`` holds the records being walked (recursion)."""
    if isinstance(schema, list):
        others = [s for s in schema if s != "null"]
        if len(schema) != 2 or len(others) != 1:
            raise ConfigError(
                f"avro_schema field {where}: union {json.dumps(schema)} is not "
                'mapped; use a type or ["null", type]'
            )
        _vet(others[0], where, named, active)
    elif isinstance(schema, str):
        if schema in active:
            raise ConfigError(
                f"avro_schema field {where}: recursive record {schema!r} has no Spark type"
            )
        if schema in named:
            _vet(named[schema], where, named, active)
    elif isinstance(schema, dict):
        kind = schema["type"]
        if kind in ("record", "error"):
            active.add(schema["name"])
            for field in schema["fields"]:
                path = f"{where}.{field['name']}" if where else field["name"]
                _vet(field["type"], path, named, active)
            active.discard(schema["name"])
        elif kind == "array":
            _vet(schema["items"], f"{where}[]", named, active)
        elif kind == "map":
            _vet(schema["values"], f"{where}{{}}", named, active)
        elif isinstance(kind, (list, dict)):
            _vet(kind, where, named, active)  # {"type": {"type": ...}} and alike
        elif (
            schema.get("logicalType") == "decimal"
            and int(schema.get("precision", 0)) > _MAX_DECIMAL_PRECISION
        ):
            raise ConfigError(
                f"avro_schema field {where}: decimal precision "
                f"{schema['precision']} > {_MAX_DECIMAL_PRECISION}"
            )


def _nullable(schema: Any) -> bool:
    if isinstance(schema, list):
        return "null" in schema
    if isinstance(schema, dict) and isinstance(schema["type"], (list, dict)):
        return _nullable(schema["type"])
    return schema == "null"
