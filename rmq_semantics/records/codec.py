"""Wire format of system records: ``MAGIC | type | schema version | schemaless Avro``.

Each record names its type and the version of the schema it was written with, so a newer
reader resolves older records with Avro schema resolution (writer schema -> reader schema).
Schemas live beside this module as ``<type>.v<N>.avsc``; each type's body is one frozen
dataclass (:mod:`.txn`, :mod:`.locks`, :mod:`.timer`) with ``to_body()``/``from_body()``.
"""

from __future__ import annotations

import io
import json
from enum import IntEnum
from functools import cache
from importlib import resources
from typing import Any, TypeVar

import fastavro
from fastavro.validation import ValidationError, validate

from rmq_semantics.errors import ConfigError, MalformedRecordError
from rmq_semantics.records.locks import LockEntry, LockReply, LockRequest
from rmq_semantics.records.timer import TimerCancel
from rmq_semantics.records.txn import (
    CheckMarker,
    CheckRequest,
    DoneMarker,
    DoneMarkers,
    EndRequest,
    EndRequests,
)

__all__ = [
    "RecordType",
    "SystemRecord",
    "decode",
    "decode_as",
    "decode_lock_state",
    "decode_timer_cancel",
    "encode",
]

MAGIC = 0xA7


class RecordType(IntEnum):
    END_REQUEST = 1
    DONE_MARKER = 2
    CHECK_MARKER = 3
    CHECK_REQUEST = 4
    DONE_MARKERS = 5  # several done markers of one partition in one record
    END_REQUESTS = 6  # several inline end requests of one producer and partition
    LOCK_REQUEST = 7
    LOCK_REPLY = 8
    LOCK_STATE = 9
    TIMER_CANCEL = 10  # recall_message, on <prefix>_timer_cancel

    @property
    def stem(self) -> str:
        return self.name.lower()


SystemRecord = (
    EndRequest
    | EndRequests
    | DoneMarker
    | DoneMarkers
    | CheckMarker
    | CheckRequest
    | LockRequest
    | LockReply
    | LockEntry
    | TimerCancel
)
R = TypeVar("R", bound=SystemRecord)

#: The dataclass of each record type.
RECORD_CLASSES: dict[RecordType, type[SystemRecord]] = {
    RecordType.END_REQUEST: EndRequest,
    RecordType.DONE_MARKER: DoneMarker,
    RecordType.CHECK_MARKER: CheckMarker,
    RecordType.CHECK_REQUEST: CheckRequest,
    RecordType.DONE_MARKERS: DoneMarkers,
    RecordType.END_REQUESTS: EndRequests,
    RecordType.LOCK_REQUEST: LockRequest,
    RecordType.LOCK_REPLY: LockReply,
    RecordType.LOCK_STATE: LockEntry,
    RecordType.TIMER_CANCEL: TimerCancel,
}
_TYPE_OF = {cls: record_type for record_type, cls in RECORD_CLASSES.items()}

#: The version new records are written with, per type (older versions still decode, by
#: schema resolution).
CURRENT_VERSION = {t: 1 for t in RecordType} | {
    # v2: the outcome REAPPENDED, and the writing coordinator's HMAC (``mac``, null in v1).
    RecordType.DONE_MARKERS: 2,
    RecordType.CHECK_MARKER: 2,  # v2: mac
    RecordType.CHECK_REQUEST: 2,  # v2: a header value may be null
    RecordType.LOCK_REQUEST: 3,  # v2: wait_ms; v3: mac (the consumer group's, or null)
}
_PREFIX = {t: bytes((MAGIC, t, CURRENT_VERSION[t])) for t in RecordType}


@cache
def schema(record_type: RecordType, version: int) -> Any:
    path = resources.files("rmq_semantics") / "records" / f"{record_type.stem}.v{version}.avsc"
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise MalformedRecordError(
            f"unknown schema version {version} for {record_type.name}"
        ) from exc
    return fastavro.parse_schema(json.loads(text))


def encode(record: SystemRecord, version: int | None = None) -> bytes:
    """``record`` in its type's current schema version, or in an older ``version`` (for
    readers of before; the fields that version lacks are left out)."""
    record_type = _TYPE_OF.get(type(record))
    if record_type is None:
        raise ConfigError(f"encode: {type(record).__name__} is not a system record type")
    current = CURRENT_VERSION[record_type]
    if version is None or version == current:
        prefix, writer = _PREFIX[record_type], schema(record_type, current)
    elif 1 <= version < current:
        prefix, writer = bytes((MAGIC, record_type, version)), schema(record_type, version)
    else:
        raise ConfigError(f"encode: {record_type.name} has versions 1..{current}, not {version}")
    out = io.BytesIO()
    out.write(prefix)
    fastavro.schemaless_writer(out, writer, record.to_body())
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
    reader = (
        None
        if version == CURRENT_VERSION[record_type]
        else schema(record_type, CURRENT_VERSION[record_type])
    )
    try:
        body = fastavro.schemaless_reader(io.BytesIO(data[3:]), writer, reader)
    except Exception as exc:  # fastavro raises many types on garbage input
        raise MalformedRecordError(f"{record_type.name} v{version} does not decode: {exc}") from exc
    if not isinstance(body, dict):
        raise MalformedRecordError(f"{record_type.name} v{version} decoded to {type(body)}")
    return RECORD_CLASSES[record_type].from_body(body)


def decode_as(record_class: type[R], data: bytes | None) -> R:
    """Decode a record that must be a ``record_class``; any other is malformed here."""
    record = decode(data)
    if not isinstance(record, record_class):
        raise MalformedRecordError(
            f"a {type(record).__name__} record where a {record_class.__name__} belongs"
        )
    return record


def decode_timer_cancel(key: bytes | None, value: bytes | None) -> TimerCancel:
    """A record of the cancel topic: a :class:`TimerCancel` whose fields and record key
    hold (:meth:`TimerCancel.check`); anything else raises MalformedRecordError."""
    return decode_as(TimerCancel, value).check(key)


# -- the lock topic ----------------------------------------------------------------------
# Lock state was compact JSON with a version field "v" before it became Avro; the topic is
# compacted, so a lock not touched since keeps its JSON record: read it as LOCK_STATE.
LEGACY_JSON_VERSION = 1
# Epochs grow by one per grant, so none reaches this; above it the next grant's epoch would
# not fit the schema's long (only a forged record gets there).
MAX_LOCK_EPOCH = 2**62
_LEGACY_DEFAULTS = {"client_id": "", "lease_ms": 0, "acquired_at_ms": 0, "updated_at_ms": 0}


def decode_lock_state(key: bytes | None, value: bytes | None) -> LockEntry:
    """A record of the compacted lock topic, Avro or legacy JSON; ``key`` must match it."""
    if value and value[:1] == b"{":
        entry = LockEntry.from_body(_legacy_lock_state(value))
    else:
        entry = decode_as(LockEntry, value)
    if key is not None and key != entry.key.record_key():
        raise MalformedRecordError(f"lock state: record key {key!r} does not match {entry.key}")
    if not 0 <= entry.epoch <= MAX_LOCK_EPOCH:
        raise MalformedRecordError(
            f"lock state of {entry.key}: epoch {entry.epoch} is out of range (0..{MAX_LOCK_EPOCH})"
        )
    return entry


def _legacy_lock_state(value: bytes) -> dict[str, Any]:
    try:
        body = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRecordError(f"lock state: not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise MalformedRecordError("lock state: not a JSON object")
    version = body.get("v")
    if type(version) is not int or version != LEGACY_JSON_VERSION:
        raise MalformedRecordError(f"lock state: unsupported JSON version {version!r}")
    for name, default in _LEGACY_DEFAULTS.items():
        if body.get(name) is None:
            body[name] = default
    try:
        # The JSON fields are those of the first Avro schema, so fastavro checks their types.
        validate(body, schema(RecordType.LOCK_STATE, 1), raise_errors=True)
    except ValidationError as exc:
        raise MalformedRecordError(f"lock state: {exc}") from exc
    return body
