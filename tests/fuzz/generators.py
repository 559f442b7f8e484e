"""Seeded generators of system records: valid ones from the product's own encoders, then
mutated (one field corrupted, bytes cut or flipped, wrong magic, type or schema version).

Everything takes a ``random.Random``, so a seed reproduces a run. Nothing here talks to
Kafka: a generated record is a :class:`Raw` (key, value, headers) for some topic.
"""

from __future__ import annotations

import io
import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import fastavro

from rmq_semantics.message import Message
from rmq_semantics.records.codec import CURRENT_VERSION, MAGIC, RecordType, encode, schema
from rmq_semantics.records.dead_letter import retry_headers
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.locks import (
    LockEntry,
    LockKey,
    LockReply,
    LockRequest,
    LockState,
    QueueRef,
    QueueResult,
    RequestKind,
)
from rmq_semantics.records.timer import TimerCancel, timer_headers, timer_partition
from rmq_semantics.records.txn import (
    CheckMarker,
    CheckRequest,
    DoneEntry,
    DoneMarker,
    DoneMarkers,
    EndEntry,
    EndRequest,
    EndRequests,
    EndState,
    Outcome,
)

RawHeaders = list[tuple[str, bytes | None]]

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
# Integers no Avro long holds; 10**400 is also beyond a float.
BEYOND_LONG = (2**63, -(2**63) - 1, 10**30, -(10**30), 10**400)


@dataclass
class Raw:
    """One record to write: ``partition`` None lets the writer choose."""

    value: bytes | None
    key: bytes | None = None
    headers: RawHeaders | None = None
    partition: int | None = None


@dataclass(frozen=True)
class Ctx:
    """What generated records may aim at."""

    prefix: str = "fuzz"
    partitions: int = 4  # of the half/op topics (and the lock request topic)
    group: str = "fuzz-pg"  # the live producer group: answers checks of unknown txns UNKNOW
    real_topic: str = "fuzz-sink"  # an existing topic bad half records may name
    missing_topic: str = "fuzz-missing"  # a topic that does not exist
    lock_group: str = "fuzz-lock"  # the good lock client's group: bad lock records avoid it
    # (half partition, half offset, txn id) of good transactions, for forged records.
    targets: tuple[tuple[int, int, str], ...] = ()
    now_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    # Timer messages (issue 35): the timer topics' partitions, the topic timer records name
    # (one partition), the good producer's group, and its messages still pending (id).
    timer_partitions: int = 2
    timer_topic: str = "fuzz-timed"
    timer_group: str = "fuzz-tg"
    timer_max_delay_ms: int = 8000  # the coordinator's max_delay_ms
    timer_targets: tuple[str, ...] = ()

    def system_topics(self) -> list[str]:
        return [
            f"{self.prefix}_{s}"
            for s in (
                "half",
                "op",
                "check",
                "discard",
                "lock",
                "lock_request",
                "lock_reply",
                "timer",
                "timer_1",
                "timer_cancel",
            )
        ]


# -- values ----------------------------------------------------------------------------------
#: The outcomes a v1 record (DoneMarker, never written since DoneMarkers) can carry.
V1_OUTCOMES = [o for o in Outcome if o is not Outcome.REAPPENDED]


def some_bytes(rng: random.Random, most: int = 48) -> bytes:
    return rng.randbytes(rng.randrange(most + 1))


def not_utf8(rng: random.Random) -> bytes:
    # 0xff never occurs in UTF-8, wherever it stands.
    return some_bytes(rng, 8) + b"\xff" + rng.choice([b"", b"\xc3\x28", b"\xed\xa0\x80"])


def some_text(rng: random.Random) -> str:
    return rng.choice(
        [
            "",
            "x",
            "ü€/\u0000",
            "a" * 300,
            uuid.uuid4().hex,
            "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(12)),
        ]
    )


def huge_text(rng: random.Random) -> str:
    return "h" * rng.choice([10_000, 200_000])


def txn_id() -> str:
    return uuid.uuid4().hex


def pick(rng: random.Random, options: list[Any] | tuple[Any, ...]) -> Any:
    return options[rng.randrange(len(options))]


# -- valid records, one builder per record type ----------------------------------------------
def valid_half(
    rng: random.Random,
    ctx: Ctx,
    *,
    topic: str | None = None,
    partition: int | None = None,
    group: str | None = None,
    user_headers: RawHeaders | None = None,
) -> tuple[Raw, str]:
    """A half record as ``TransactionProducer`` writes it; returns it and its txn id."""
    msg = Message(
        topic or ctx.real_topic,
        some_bytes(rng),
        key=pick(rng, [None, b"k"]),
        partition=partition,
        tags=pick(rng, [None, "TagA"]),
        keys=pick(rng, [None, "key-1"]),
        check_immunity_ms=pick(rng, [None, 0, 500]),
    )
    txn = txn_id()
    headers: RawHeaders = list(
        half_headers(msg, txn, (group or ctx.group).encode(), str(ctx.now_ms).encode())
    )
    headers = [*(user_headers or []), *headers]
    return Raw(msg.value, msg.key, headers, rng.randrange(ctx.partitions)), txn


def valid_members(rng: random.Random, ctx: Ctx, size: int) -> tuple[list[Raw], str]:
    """The ``size`` half records of one multi-message transaction as a producer writes them
    (one partition, index order, ``rmq.txn_size`` / ``rmq.txn_index``); and its txn id."""
    first, txn = valid_half(rng, ctx)
    out = []
    for index in range(size):
        raw = first if index == 0 else valid_half(rng, ctx)[0]
        headers = set_header(raw.headers or [], H.TXN_ID, txn.encode())
        headers = set_header(headers, H.TXN_SIZE, str(size).encode())
        out.append(
            Raw(
                raw.value,
                raw.key,
                set_header(headers, H.TXN_INDEX, str(index).encode()),
                first.partition,
            )
        )
    return out, txn


def end_request(
    ctx: Ctx,
    partition: int,
    offset: int,
    txn: str,
    state: EndState = EndState.COMMIT,
    group: str | None = None,
) -> EndRequest:
    return EndRequest(txn, group or ctx.group, partition, offset, state, False, 0, ctx.now_ms)


def _target(rng: random.Random, ctx: Ctx) -> tuple[int, int, str]:
    if ctx.targets:
        return pick(rng, ctx.targets)
    return rng.randrange(ctx.partitions), rng.randrange(50), txn_id()


def _end_request(rng: random.Random, ctx: Ctx) -> EndRequest:
    p, offset, _ = _target(rng, ctx)
    return EndRequest(
        txn_id(),
        ctx.group,
        p,
        offset,
        pick(rng, list(EndState)),
        rng.random() < 0.3,
        rng.randrange(4),
        ctx.now_ms,
    )


def _end_requests(rng: random.Random, ctx: Ctx) -> EndRequests:
    p, offset, _ = _target(rng, ctx)
    entries = tuple(
        EndEntry(txn_id(), offset + i, pick(rng, list(EndState)))
        for i in range(1 + rng.randrange(5))
    )
    return EndRequests(ctx.group, p, entries, ctx.now_ms)


def _done_marker(rng: random.Random, ctx: Ctx) -> DoneMarker:
    _, offset, txn = _target(rng, ctx)
    return DoneMarker(offset, txn, pick(rng, V1_OUTCOMES), rng.randrange(3), ctx.now_ms)


def _done_markers(rng: random.Random, ctx: Ctx) -> DoneMarkers:
    _, offset, txn = _target(rng, ctx)
    return DoneMarkers((DoneEntry(offset, txn, pick(rng, list(Outcome)), 0),), ctx.now_ms)


def _check_marker(rng: random.Random, ctx: Ctx) -> CheckMarker:
    _, offset, txn = _target(rng, ctx)
    return CheckMarker(offset, txn, 1, 0, 0, ctx.now_ms + 60_000, ctx.now_ms)


def _check_request(rng: random.Random, ctx: Ctx) -> CheckRequest:
    half, txn = valid_half(rng, ctx)
    p, offset, _ = _target(rng, ctx)
    headers = [(k, v or b"") for k, v in half.headers or []]
    return CheckRequest(
        txn,
        ctx.group,
        p,
        offset,
        1 + rng.randrange(3),
        ctx.now_ms,
        ctx.real_topic,
        None,
        half.key,
        half.value,
        headers,
        ctx.now_ms,
    )


def lock_key(rng: random.Random, ctx: Ctx, group: str | None = None) -> LockKey:
    return LockKey(
        group or f"fuzz-g{rng.randrange(5)}", f"fuzz-t{rng.randrange(3)}", rng.randrange(8)
    )


def _lock_request(rng: random.Random, ctx: Ctx) -> LockRequest:
    key = lock_key(rng, ctx)
    return LockRequest(
        pick(rng, list(RequestKind)),
        txn_id(),
        f"fuzz-c{rng.randrange(3)}",
        key.group,
        0,
        (QueueRef(key.topic, key.partition),),
        30_000,
        ctx.now_ms,
        pick(rng, [0, 5000]),
        # v3: a MAC (here never one a coordinator verifies: no fuzzer holds a tenant key).
        pick(rng, [None, some_bytes(rng)]),
    )


def _lock_reply(rng: random.Random, ctx: Ctx) -> LockReply:
    key = lock_key(rng, ctx)
    return LockReply(
        txn_id(),
        "fuzz-c0",
        RequestKind.LOCK,
        (
            QueueResult(
                key.topic, key.partition, True, "granted", 1, 30_000, ctx.now_ms + 30_000, "c"
            ),
        ),
    )


def _lock_state(rng: random.Random, ctx: Ctx) -> LockEntry:
    return LockEntry(
        lock_key(rng, ctx),
        pick(rng, list(LockState)),
        "fuzz-c0",
        rng.randrange(5),
        30_000,
        ctx.now_ms,
        ctx.now_ms + 30_000,
        ctx.now_ms,
    )


def _timer_cancel(rng: random.Random, ctx: Ctx) -> TimerCancel:
    return TimerCancel(txn_id(), pick(rng, [ctx.group, None]), ctx.now_ms)


def valid_timer(
    rng: random.Random, ctx: Ctx, *, group: str | None = None, due_in_ms: int | None = None
) -> tuple[Raw, str]:
    """A timer record as ``Producer.send`` writes it for a scheduled message, in the id's
    timer partition (of ``ctx.timer_partitions``); returns it and its message id."""
    msg = Message(
        ctx.timer_topic,
        some_bytes(rng),
        key=pick(rng, [None, b"k"]),
        partition=pick(rng, [None, 0]),
        tags=pick(rng, [None, "TagA"]),
        keys=pick(rng, [None, "key-1"]),
        message_group=pick(rng, [None, "mg"]),
    )
    timer_id = txn_id()
    due = ctx.now_ms + (pick(rng, [-1000, 0, 500, 3000]) if due_in_ms is None else due_in_ms)
    headers = list(timer_headers(msg, timer_id, due, ctx.now_ms, producer_group=group))
    partition = timer_partition(timer_id, ctx.timer_partitions)
    return Raw(msg.value, msg.key, [*headers], partition), timer_id


#: One builder of a valid record per record type (the house rule: a new type adds one).
VALID: dict[RecordType, Callable[[random.Random, Ctx], Any]] = {
    RecordType.END_REQUEST: _end_request,
    RecordType.DONE_MARKER: _done_marker,
    RecordType.CHECK_MARKER: _check_marker,
    RecordType.CHECK_REQUEST: _check_request,
    RecordType.DONE_MARKERS: _done_markers,
    RecordType.END_REQUESTS: _end_requests,
    RecordType.LOCK_REQUEST: _lock_request,
    RecordType.LOCK_REPLY: _lock_reply,
    RecordType.LOCK_STATE: _lock_state,
    RecordType.TIMER_CANCEL: _timer_cancel,
}
MARKER_TYPES = (RecordType.DONE_MARKER, RecordType.DONE_MARKERS, RecordType.CHECK_MARKER)


def valid_bytes(rng: random.Random, ctx: Ctx, record_type: RecordType) -> bytes:
    return encode(VALID[record_type](rng, ctx))


# -- field corruption: the body of a valid record with one leaf set to an extreme ------------
@cache
def schema_json(record_type: RecordType) -> dict:
    """The schema new records of ``record_type`` are written with."""
    version = CURRENT_VERSION[record_type]
    path = resources.files("rmq_semantics") / "records" / f"{record_type.stem}.v{version}.avsc"
    return json.loads(path.read_text())


def _extremes(rng: random.Random, avro_type: Any) -> list[Any]:
    """Values of ``avro_type`` a writer may put there that a reader may not expect."""
    if isinstance(avro_type, list):  # a union: null or any branch
        return [None, *(v for t in avro_type if t != "null" for v in _extremes(rng, t))]
    if isinstance(avro_type, dict) and avro_type.get("type") == "enum":
        return list(avro_type["symbols"])
    return {
        "int": [INT32_MIN, INT32_MAX, -1, 0],
        "long": [INT64_MIN, INT64_MAX, -1, 0, 2**40],
        "string": ["", "\u0000", huge_text(rng), some_text(rng)],
        "bytes": [b"", some_bytes(rng, 4000)],
        "boolean": [True, False],
    }.get(avro_type if isinstance(avro_type, str) else "", [None])


def _leaves(body: Any, avro_type: Any, path: tuple) -> list[tuple[tuple, Any]]:
    """Every (path, schema type) of a scalar in ``body``."""
    if isinstance(avro_type, dict) and avro_type.get("type") == "record":
        out = []
        for f in avro_type["fields"]:
            out += _leaves(body[f["name"]], f["type"], (*path, f["name"]))
        return out
    if isinstance(avro_type, dict) and avro_type.get("type") == "array":
        out = []
        for i, item in enumerate(body):
            out += _leaves(item, avro_type["items"], (*path, i))
        return out
    return [(path, avro_type)]


def corrupt_body(
    rng: random.Random, record_type: RecordType, body: dict, keep: tuple[str, ...] = ()
) -> tuple[dict, str]:
    """``body`` with one scalar set to an extreme of its type (top-level fields in ``keep``
    stay as they are); also says which."""
    leaves = [
        leaf for leaf in _leaves(body, schema_json(record_type), ()) if leaf[0][0] not in keep
    ]
    path, avro_type = pick(rng, leaves)
    value = pick(rng, _extremes(rng, avro_type))
    holder = body
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = value
    return body, ".".join(map(str, path))


def encode_body(record_type: RecordType, body: dict, version: int | None = None) -> bytes:
    """``MAGIC | type | version | Avro``, the body written with the current schema."""
    current = CURRENT_VERSION[record_type]
    out = io.BytesIO()
    out.write(bytes((MAGIC, record_type, current if version is None else version)))
    fastavro.schemaless_writer(out, schema(record_type, current), body)
    return out.getvalue()


def corrupted(rng: random.Random, record: Any, keep: tuple[str, ...] = ()) -> bytes:
    """A valid record with one field set to an extreme value (still valid Avro)."""
    record_type = RecordType(encode(record)[1])
    body, _ = corrupt_body(rng, record_type, record.to_body(), keep)
    return encode_body(record_type, body)


# -- byte mutations --------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    zigzag = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def truncated(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(3, len(data))] if len(data) > 3 else data[:1]


def bad_magic(rng: random.Random, data: bytes) -> bytes:
    return bytes((pick(rng, [0, 0x7B, MAGIC ^ 1, 255]),)) + data[1:]


def unknown_type(rng: random.Random, data: bytes) -> bytes:
    known = {t.value for t in RecordType}
    return data[:1] + bytes((pick(rng, [t for t in range(256) if t not in known]),)) + data[2:]


def bad_version(rng: random.Random, data: bytes) -> bytes:
    return data[:2] + bytes((pick(rng, [0, 9, 100, 255]),)) + data[3:]  # no schema has these


def huge_length(rng: random.Random, data: bytes) -> bytes:
    """The body starts with a length or count no record has (fastavro must not allocate it)."""
    return data[:3] + _varint(pick(rng, [2**31, 2**60, -(2**40)])) + data[3:]


def garbage(rng: random.Random, data: bytes) -> bytes | None:
    return pick(
        rng,
        [
            None,
            b"",
            b"\x00",
            bytes((MAGIC,)),
            bytes((MAGIC, 1, 1)),
            some_bytes(rng, 200),
            b'{"v": 1}',
            b"{" + some_bytes(rng, 20),
        ],
    )


#: Mutations that leave no decodable record (the decoder must call each malformed).
BREAKING = (truncated, bad_magic, unknown_type, bad_version, garbage)


def relabelled(rng: random.Random, data: bytes, to: RecordType) -> bytes:
    """The Avro body of one record type under another's type byte."""
    return data[:1] + bytes((to,)) + data[2:]


def flipped(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(1 + rng.randrange(3)):
        i = 3 + rng.randrange(max(1, len(out) - 3))
        if i < len(out):
            out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


# -- the keys topic: small JSON records (coordinator/marker_keys.py) ----------------------
def _keys_record(kind: str, **fields: Any) -> bytes:
    return json.dumps({"v": 1, "kind": kind, **fields}).encode()


#: A valid record of each kind of ``<prefix>_keys`` (house rule: a new kind adds one).
KEYS_RECORDS: dict[str, Callable[[random.Random], bytes]] = {
    "key": lambda rng: _keys_record("key", key=some_text(rng) or "k"),
    "fingerprint": lambda rng: _keys_record("fingerprint", fingerprint=some_bytes(rng).hex()),
    "watermark": lambda rng: _keys_record(
        "watermark", partition=rng.randrange(64), offset=rng.randrange(10**9)
    ),
    "history": lambda rng: _keys_record("history", earlier=rng.random() < 0.5),
    "tenancy": lambda rng: _keys_record(
        "tenancy",
        **{
            t: {str(p): rng.randrange(10**9) for p in range(rng.randrange(4))}
            # The timer topics' since issue 44 (absent from records written before).
            for t in ("half", "op", *(("timer", "timer_cancel", "timer_3") * rng.randrange(2)))
        },
    ),
}
#: Odd values for the fields of a keys record: wrong types, out of range, missing.
KEYS_ODD_VALUES = (None, "", "1", 1.5, -1, True, [], {}, 2**70)


def keys_mutation(rng: random.Random, data: bytes) -> bytes | None:
    """A keys record with one field oddly set or dropped, its version or kind changed, or
    its bytes broken."""
    record = json.loads(data)
    field_name = pick(rng, sorted(record))
    how = rng.randrange(4)
    if how == 0:
        record[field_name] = pick(rng, KEYS_ODD_VALUES)
    elif how == 1:
        del record[field_name]
    elif how == 2:
        record["kind"] = pick(rng, [*KEYS_RECORDS, "other", None])
    else:
        return pick(
            rng, [None, b"", data[: rng.randrange(len(data))], not_utf8(rng), b"[" + data + b"]"]
        )
    return json.dumps(record).encode()


# -- headers: an odd value for every rmq.* header --------------------------------------------
def _number_text(rng: random.Random) -> bytes:
    return pick(rng, [b"abc", b"1.5", b"1e3", b"0x10", b"--1", b"\xff", b"12a"])


def _any(rng: random.Random) -> bytes | None:
    return pick(rng, [None, b"", some_bytes(rng), not_utf8(rng), huge_text(rng).encode()])


#: An odd value for each ``rmq.*`` header name (house rule: a new header adds one). The half
#: generators put these on half records: required ones break the parse, the rest are carried.
HEADER_VALUES: dict[str, Callable[[random.Random, Ctx], bytes | None]] = {
    H.TXN_ID: lambda rng, ctx: pick(rng, [not_utf8(rng), b""]),
    H.REAL_TOPIC: lambda rng, ctx: pick(rng, [not_utf8(rng), b"", ctx.missing_topic.encode()]),
    H.REAL_PARTITION: lambda rng, ctx: _number_text(rng),
    H.PRODUCER_GROUP: lambda rng, ctx: pick(rng, [not_utf8(rng), b""]),
    H.BORN_TS: lambda rng, ctx: pick(rng, [_number_text(rng), b""]),
    H.CHECK_IMMUNITY_MS: lambda rng, ctx: _number_text(rng),
    H.TAGS: lambda rng, ctx: pick(rng, [not_utf8(rng), huge_text(rng).encode()]),
    H.KEYS: lambda rng, ctx: pick(rng, [not_utf8(rng), huge_text(rng).encode()]),
    H.MESSAGE_GROUP: lambda rng, ctx: pick(rng, [not_utf8(rng), huge_text(rng).encode(), b""]),
    H.PROMOTED_FROM: lambda rng, ctx: pick(rng, [b"0:0", b"x:y", not_utf8(rng)]),
    H.HALF_PARTITION: lambda rng, ctx: _number_text(rng),
    H.HALF_OFFSET: lambda rng, ctx: _number_text(rng),
    H.CHECK_COUNT: lambda rng, ctx: _number_text(rng),
    H.DISCARD_REASON: lambda rng, ctx: _any(rng),
    H.DISCARDED_TS: lambda rng, ctx: _number_text(rng),
    H.REDRIVE_OF: lambda rng, ctx: pick(rng, [b"0:0", not_utf8(rng)]),
    H.DLQ_ORIGINAL_TOPIC: lambda rng, ctx: _any(rng),
    H.DLQ_ORIGINAL_PARTITION: lambda rng, ctx: _number_text(rng),
    H.DLQ_ORIGINAL_OFFSET: lambda rng, ctx: _number_text(rng),
    H.DLQ_RECONSUME_TIMES: lambda rng, ctx: _number_text(rng),
    H.REAPPEND_OF: lambda rng, ctx: pick(rng, [b"0:0", b"x:y", _number_text(rng)]),
    H.ORIGIN_OFFSET: lambda rng, ctx: _number_text(rng),
    H.ORIGIN_TS: lambda rng, ctx: _number_text(rng),
    H.CHECKS_ISSUED: lambda rng, ctx: _number_text(rng),
    H.CHECKS_ANSWERED: lambda rng, ctx: _number_text(rng),
    H.ANSWERED_SEQ: lambda rng, ctx: _number_text(rng),
    H.NEXT_CHECK_TS: lambda rng, ctx: _number_text(rng),
    # Alone, or next to a good partner, each of these is a malformed member (issue 18).
    H.TXN_SIZE: lambda rng, ctx: pick(
        rng, [_number_text(rng), b"", b"0", b"1", b"-2", b"1001", b"3x", not_utf8(rng)]
    ),
    H.TXN_INDEX: lambda rng, ctx: pick(
        rng, [_number_text(rng), b"", b"-1", b"1000", b"1e3", not_utf8(rng)]
    ),
    # Not an instance id (printable ASCII, at most 128 bytes): the record is malformed.
    H.CHECK_AFFINITY: lambda rng, ctx: pick(
        rng, [not_utf8(rng), b"x" * 129, b"id\x00", b"caf\xc3\xa9", b"a\nb"]
    ),
    # Not a list of check partitions: the record is malformed.
    H.CHECK_PARTITIONS: lambda rng, ctx: pick(
        rng,
        [b"-1", b"1,,2", b"a", b"1;2", b" 1", b"99999999999", b"0," * 300 + b"0", not_utf8(rng)],
    ),
    # Tenant isolation (issue 31): a MAC that is short, long, of another group or none;
    # the record is set aside as forged (isolation on) or carried unread (off).
    H.GROUP_MAC: lambda rng, ctx: pick(
        rng, [None, b"", some_bytes(rng), b"\x00" * 32, not_utf8(rng), huge_text(rng).encode()]
    ),
    # W3C trace context (issue 20): user headers the coordinator keeps on promotion and reads
    # for its promote span; a forged one must neither stop it nor block the record.
    "traceparent": lambda rng, ctx: pick(
        rng,
        [
            not_utf8(rng),
            b"",
            b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01",
            b"ff-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01",
            b"00-xyz-abc-01",
            b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01-extra",
            huge_text(rng).encode(),
        ],
    ),
    "tracestate": lambda rng, ctx: pick(
        rng, [not_utf8(rng), b"=,=,", b"a=" * 1000, huge_text(rng).encode()]
    ),
}
# The concurrent consumer's retry headers and the extended DLQ family (issue 17): odd
# values a forged retry or dead-letter record may carry.
HEADER_VALUES.update(
    {
        H.PROMOTED_AT: lambda rng, ctx: _number_text(rng),
        H.RECONSUME_TIMES: lambda rng, ctx: pick(
            rng, [_number_text(rng), b"", b"-1", b"0", str(2**40).encode()]
        ),
        H.ORIGINAL_TOPIC: lambda rng, ctx: pick(rng, [not_utf8(rng), b""]),
        H.ORIGINAL_PARTITION: lambda rng, ctx: pick(rng, [_number_text(rng), b"-1"]),
        H.ORIGINAL_OFFSET: lambda rng, ctx: pick(rng, [_number_text(rng), b"-7"]),
        H.FIRST_FAILURE_TS: lambda rng, ctx: pick(rng, [_number_text(rng), b"-1"]),
        H.RETRY_DUE_TS: lambda rng, ctx: pick(
            rng, [_number_text(rng), b"-1", str(ctx.now_ms + 10**9).encode()]
        ),
        H.DLQ_EXCEPTION: lambda rng, ctx: _any(rng),
        H.DLQ_EXCEPTION_MESSAGE: lambda rng, ctx: _any(rng),
        H.DLQ_FIRST_FAILURE_TS: lambda rng, ctx: _number_text(rng),
        H.DLQ_LAST_FAILURE_TS: lambda rng, ctx: _number_text(rng),
        H.DLQ_REASON: lambda rng, ctx: pick(rng, [_any(rng), b"raised", b"", not_utf8(rng)]),
    }
)
# Timer messages (issue 35): odd ids, due times and origins a forged timer record carries.
HEADER_VALUES.update(
    {
        H.TIMER_ID: lambda rng, ctx: pick(
            rng, [not_utf8(rng), b"", b"x" * 129, b"id\x00", b"a\nb", b"caf\xc3\xa9"]
        ),
        H.DELIVER_AT: lambda rng, ctx: pick(
            rng, [_number_text(rng), b"", b"-1", b"99999999999999999999", b" 1"]
        ),
        H.DELIVERED_AT: lambda rng, ctx: pick(rng, [_number_text(rng), b"-1"]),
        H.TIMER_ORIGIN: lambda rng, ctx: pick(rng, [_number_text(rng), b"-1", b"", b"0"]),
    }
)
#: Headers a timer record must carry (``records.timer``), and those whose odd value makes it
#: malformed.
REQUIRED_TIMER = (H.TIMER_ID, H.DELIVER_AT, H.REAL_TOPIC, H.BORN_TS)
NUMERIC_TIMER = (H.DELIVER_AT, H.BORN_TS, H.REAL_PARTITION, H.TIMER_ORIGIN)

#: The retry headers a concurrent consumer parses (each odd value above is refused).
RETRY_PARSED = (
    H.RECONSUME_TIMES,
    H.ORIGINAL_TOPIC,
    H.ORIGINAL_PARTITION,
    H.ORIGINAL_OFFSET,
    H.FIRST_FAILURE_TS,
    H.RETRY_DUE_TS,
)


def valid_retry(rng: random.Random, ctx: Ctx, *, reconsume_times: int = 1) -> Raw:
    """A retry copy as a PushConsumer writes it, due now, from ``ctx.real_topic``."""
    headers = retry_headers(
        [("app", b"1")],
        topic=ctx.real_topic,
        partition=0,
        offset=rng.randrange(1000),
        reconsume_times=reconsume_times,
        first_failure_ms=ctx.now_ms,
        due_ms=ctx.now_ms,
    )
    return Raw(some_bytes(rng), pick(rng, [None, b"k"]), list(headers), 0)


#: Headers a half record must carry (``records.half``), and those whose odd value makes it
#: malformed (numbers, and the check affinity's instance id).
REQUIRED_HALF = (H.TXN_ID, H.REAL_TOPIC, H.PRODUCER_GROUP, H.BORN_TS)
NUMERIC_HALF = (
    H.BORN_TS,
    H.REAL_PARTITION,
    H.CHECK_IMMUNITY_MS,
    H.TXN_SIZE,
    H.TXN_INDEX,
    H.CHECK_AFFINITY,
    H.CHECK_PARTITIONS,
)


def header_names() -> set[str]:
    """Every ``rmq.*`` header name ``H`` defines."""
    return {v for k, v in vars(H).items() if not k.startswith("_") and isinstance(v, str)}


def set_header(headers: RawHeaders, name: str, value: bytes | None) -> RawHeaders:
    """``headers`` with every ``name`` replaced by one ``(name, value)``."""
    return [*(h for h in headers if h[0] != name), (name, value)]
