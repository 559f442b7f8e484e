"""Wire format of system records: ``MAGIC | type | schema version | schemaless Avro``.

Each record names its type and the version of the schema it was written with, so a newer
reader resolves older records with Avro schema resolution (writer schema -> reader schema).
Schemas live beside this module as ``<type>.v<N>.avsc``.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from importlib import resources
from typing import Any

import fastavro

from rmq_semantics.errors import MalformedRecordError

__all__ = ["RecordType", "SystemRecord", "decode", "encode"]

MAGIC = 0xA7


class RecordType(IntEnum):
    END_REQUEST = 1
    DONE_MARKER = 2
    CHECK_MARKER = 3
    CHECK_REQUEST = 4
    DONE_MARKERS = 5  # several done markers of one partition in one record
    END_REQUESTS = 6  # several inline end requests of one producer and partition

    @property
    def stem(self) -> str:
        return self.name.lower()


#: The version new records are written with, per type.
CURRENT_VERSION = {t: 1 for t in RecordType}


@cache
def schema(record_type: RecordType, version: int) -> Any:
    path = resources.files("rmq_semantics") / "records" / f"{record_type.stem}.v{version}.avsc"
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise MalformedRecordError(
            f"unknown schema version {version} for {record_type.name}") from exc
    return fastavro.parse_schema(json.loads(text))


@dataclass(frozen=True)
class SystemRecord:
    type: RecordType
    version: int
    body: dict[str, Any]


def encode(record_type: RecordType, body: dict[str, Any]) -> bytes:
    version = CURRENT_VERSION[record_type]
    out = io.BytesIO()
    out.write(bytes((MAGIC, record_type, version)))
    fastavro.schemaless_writer(out, schema(record_type, version), body)
    return out.getvalue()


def decode(data: bytes | None) -> SystemRecord:
    """Decode a system record; anything else raises :class:`MalformedRecordError`."""
    if not data or len(data) < 4 or data[0] != MAGIC:
        raise MalformedRecordError("not a system record (bad magic byte or too short)")
    try:
        record_type = RecordType(data[1])
    except ValueError as exc:
        raise MalformedRecordError(f"unknown system record type {data[1]}") from exc
    version = data[2]
    writer = schema(record_type, version)
    # Schema resolution only for an older (or newer) writer: it costs a third of a decode.
    reader = None if version == CURRENT_VERSION[record_type] else schema(
        record_type, CURRENT_VERSION[record_type])
    try:
        body = fastavro.schemaless_reader(io.BytesIO(data[3:]), writer, reader)
    except Exception as exc:  # fastavro raises many types on garbage input
        raise MalformedRecordError(
            f"{record_type.name} v{version} does not decode: {exc}") from exc
    if not isinstance(body, dict):
        raise MalformedRecordError(f"{record_type.name} v{version} decoded to {type(body)}")
    return SystemRecord(record_type, version, body)
