"""The wire contract (``rmq_semantics.records``): every record type round-trips, the six
transactional types keep their bytes, old JSON lock state is still read, garbage is
malformed, and the lock key routes like Java's partitioner."""

from __future__ import annotations

import pytest

from rmq_semantics.errors import ConfigError, MalformedRecordError
from rmq_semantics.message import Message
from rmq_semantics.records.codec import (
    MAGIC,
    RECORD_CLASSES,
    RecordType,
    decode,
    decode_as,
    decode_lock_state,
    encode,
)
from rmq_semantics.records.half import half_headers, parse_half, unparsed_half
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
from rmq_semantics.records.timer import TimerCancel
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

T = 1_700_000_000_000
CHECK = CheckRequest(
    "r",
    "pg",
    0,
    11,
    4,
    1699999999999,
    "orders",
    2,
    b"k",
    b"v\x00",
    [("app", b"1"), ("rmq.tags", b"A")],
    T + 5,
)

# Bytes the dict-based encoder wrote before the records became dataclasses (same schemas):
# the six transactional record types must not change on the wire. Since then DoneMarkers and
# CheckMarker are v2 (REAPPENDED, the coordinator's MAC: see V2 below) and check requests are
# v2 (a header value may be null: their v1 bytes below must still decode).
WIRE = [
    (
        EndRequest("t-1", "pg", 3, 1234567890123, EndState.ROLLBACK, True, 2, T),
        "a7010106742d31047067069693d89fee4702010480a0abfef962",
    ),
    (
        EndRequests(
            "pg", 1, (EndEntry("a", 5, EndState.COMMIT), EndEntry("b", 6, EndState.UNKNOWN)), T + 1
        ),
        "a70601047067020402610a0002620c040082a0abfef962",
    ),
    (DoneMarker(7, "t", Outcome.DISCARDED, 3, T + 2), "a702010e0274040684a0abfef962"),
    (
        DoneMarkers(
            (DoneEntry(8, "x", Outcome.COMMITTED, 0), DoneEntry(9, "y", Outcome.ROLLED_BACK, 1)),
            T + 3,
        ),
        "a7050104100278000012027902020086a0abfef962",
    ),
    (CheckMarker(10, "c", 2, 1, 1, T + 60000, T + 4), "a70301140263040202c0c9b2fef96288a0abfef962"),
    (
        CHECK,
        "a704020272047067001608fe9fabfef9620c6f7264657273020402026b0204760004066170700202"
        "3110726d712e74616773020241008aa0abfef962",
    ),
    (
        CheckRequest("r", "pg", 0, 11, 4, 1699999999999, "orders", None, None, None, [], T + 5),
        "a704020272047067001608fe9fabfef9620c6f7264657273000000008aa0abfef962",
    ),
    (
        CheckRequest(
            "r", "pg", 0, 11, 4, 1699999999999, "orders", None, None, None, [("app", None)], T + 5
        ),
        "a704020272047067001608fe9fabfef9620c6f7264657273000000020661707000008aa0abfef962",
    ),
]
# recall_message's cancel (issue 35): its v1 bytes are the contract from now on.
TIMER_WIRE = [
    (TimerCancel("t-1", "pg", T), "a70a0106742d310204706780a0abfef962"),
    (TimerCancel("t-2", None, T), "a70a0106742d320080a0abfef962"),
]
# Check requests as v1 wrote them, before a header value could be null.
CHECK_V1 = [
    (
        CHECK,
        "a704010272047067001608fe9fabfef9620c6f7264657273020402026b020476000406617070023110"
        "726d712e746167730241008aa0abfef962",
    ),
    (
        CheckRequest("r", "pg", 0, 11, 4, 1699999999999, "orders", None, None, None, [], T + 5),
        "a704010272047067001608fe9fabfef9620c6f7264657273000000008aa0abfef962",
    ),
]
V1_DONE_MARKERS = "a7050104100278000012027902020086a0abfef962"
LOCK_RECORDS = [
    LockRequest(
        RequestKind.UNLOCK,
        "r1",
        "c1",
        "g/with/slash",
        2,
        (QueueRef("t", 0, 3), QueueRef("t", 1)),
        0,
        T,
    ),
    LockRequest(RequestKind.LOCK, "r2", "c1", "g", 0, (QueueRef("t", 5),), 60000, T),
    LockReply(
        "r1",
        "c1",
        RequestKind.LOCK,
        (
            QueueResult("t", 0, True, "granted", 1, 3000, T + 3000, "c1"),
            QueueResult("t", 1, False, "held_by_other", 4, 3000, T + 10, "c2"),
        ),
    ),
    LockEntry(LockKey("billing/eu", "orders", 3), LockState.HELD, "c1", 7, 60000, T, T + 60000, T),
    LockEntry(LockKey("g", "t", 0)),
]
# A record of the compacted lock topic as the JSON-writing lock service wrote it.
OLD_JSON_KEY = b"billing/eu/orders/3"
OLD_JSON_STATE = (
    b'{"v":1,"group":"billing/eu","topic":"orders","partition":3,"state":"HELD",'
    b'"client_id":"lockclient-3f2a","epoch":7,"lease_ms":60000,'
    b'"acquired_at_ms":1700000000000,"expires_at_ms":1700000060000,'
    b'"updated_at_ms":1700000000000}'
)


# Written as v2 since markers carry the coordinator's MAC (null here): the v1 bytes above
# still decode to the same record, and v2 is v1 with version 2 and a trailing null union.
V2 = {
    "a7050104100278000012027902020086a0abfef962": "a7050204100278000012027902020086a0abfef96200",
    "a70301140263040202c0c9b2fef96288a0abfef962": "a70302140263040202c0c9b2fef96288a0abfef96200",
}


@pytest.mark.parametrize("record, wire", WIRE, ids=lambda v: type(v).__name__)
def test_transactional_records_keep_their_bytes(record, wire):
    assert encode(record).hex() == V2.get(wire, wire)
    assert decode(bytes.fromhex(wire)) == record
    assert decode(encode(record)) == record


@pytest.mark.parametrize("record, wire", TIMER_WIRE, ids=["with-group", "no-group"])
def test_timer_cancels_keep_their_bytes(record, wire):
    assert encode(record).hex() == wire
    assert decode(bytes.fromhex(wire)) == record


def test_a_signed_marker_keeps_its_mac_and_a_v1_marker_reads_as_unsigned():
    signed = DoneMarkers((DoneEntry(8, "x", Outcome.COMMITTED, 0),), T, b"\x01" * 32)
    assert decode(encode(signed)).mac == b"\x01" * 32
    check = CheckMarker(10, "c", 2, 1, 1, T + 60000, T + 4, b"\x02" * 32)
    assert decode(encode(check)) == check
    assert decode(bytes.fromhex(WIRE[3][1])).mac is None


def test_done_markers_written_before_v2_are_still_read():
    assert decode(bytes.fromhex(V1_DONE_MARKERS)) == WIRE[3][0]
    reappended = DoneMarkers((DoneEntry(8, "x", Outcome.REAPPENDED, 2),), T)
    assert decode(encode(reappended)) == reappended
    assert encode(reappended)[:3] == bytes([MAGIC, RecordType.DONE_MARKERS, 2])


@pytest.mark.parametrize("record, wire", CHECK_V1, ids=["headers", "empty"])
def test_check_requests_written_as_v1_still_decode(record, wire):
    assert decode(bytes.fromhex(wire)) == record


def test_a_null_header_value_is_carried_as_null():
    record = WIRE[-1][0]
    assert decode(encode(record)).headers == [("app", None)]
    assert record.header_text("app") is None and record.header_text("absent") is None
    half = parse_half(
        0,
        1,
        T,
        None,
        None,
        [
            ("app", None),
            (H.TXN_ID, b"t"),
            (H.REAL_TOPIC, b"orders"),
            (H.PRODUCER_GROUP, b"pg"),
            (H.BORN_TS, b"1"),
        ],
    )
    assert half.headers[0] == ("app", None)
    assert ("app", None) in half.promoted_headers()
    assert CheckRequest.of_half(half, 1, T).headers[0] == ("app", None)


@pytest.mark.parametrize(
    "record", [r for r, _ in WIRE] + LOCK_RECORDS, ids=lambda r: type(r).__name__
)
def test_every_record_type_round_trips(record):
    assert decode(encode(record)) == record
    assert decode_as(type(record), encode(record)) == record
    assert type(record).from_body(record.to_body()) == record


def test_every_record_type_has_a_dataclass_and_a_schema():
    assert set(RECORD_CLASSES) == set(RecordType)
    encoded = {encode(r)[1] for r, _ in WIRE + TIMER_WIRE} | {encode(r)[1] for r in LOCK_RECORDS}
    assert encoded == {t.value for t in RecordType}


def test_decoded_enums_are_members_not_bare_strings():
    end = decode(encode(WIRE[0][0]))
    assert end.state is EndState.ROLLBACK
    markers = decode(encode(WIRE[3][0]))
    assert [e.outcome for e in markers.entries] == [Outcome.COMMITTED, Outcome.ROLLED_BACK]
    assert all(type(e.outcome) is Outcome for e in markers.entries)


@pytest.mark.parametrize(
    "data",
    [
        None,
        b"",
        b"\xa7\x01",
        b"\x00garbage",
        bytes([MAGIC, 99, 1, 0]),  # unknown type
        bytes([MAGIC, RecordType.LOCK_STATE, 7, 0]),  # unknown version
        bytes([MAGIC, RecordType.DONE_MARKER, 1]) + b"\xff\xff",
        encode(WIRE[3][0])[:-3],  # truncated
        encode(LOCK_RECORDS[2])[:12],
    ],
)
def test_garbage_is_malformed(data):
    with pytest.raises(MalformedRecordError):
        decode(data)


def test_a_record_of_another_type_is_malformed_where_one_type_belongs():
    with pytest.raises(MalformedRecordError, match="LockReply record where a LockRequest"):
        decode_as(LockRequest, encode(LOCK_RECORDS[2]))
    with pytest.raises(MalformedRecordError):
        decode_lock_state(None, encode(WIRE[0][0]))


def test_encoding_something_else_is_refused():
    with pytest.raises(ConfigError, match="dict is not a system record type"):
        encode({"txn_id": "t"})  # type: ignore[arg-type]


# -- the lock topic ----------------------------------------------------------------------
def test_lock_state_written_as_json_is_still_read():
    entry = decode_lock_state(OLD_JSON_KEY, OLD_JSON_STATE)
    assert entry == LockEntry(
        LockKey("billing/eu", "orders", 3),
        LockState.HELD,
        "lockclient-3f2a",
        7,
        60000,
        T,
        T + 60000,
        T,
    )
    # Written again, it becomes Avro with the same record key.
    assert decode_lock_state(entry.key.record_key(), encode(entry)) == entry
    with pytest.raises(MalformedRecordError, match="does not match"):
        decode_lock_state(b"other/t/1", OLD_JSON_STATE)


def test_json_lock_state_without_the_optional_fields_reads_them_as_empty():
    value = (
        b'{"v":1,"group":"g","topic":"t","partition":0,"state":"RELEASED",'
        b'"client_id":null,"epoch":2,"expires_at_ms":5}'
    )
    assert decode_lock_state(b"g/t/0", value) == LockEntry(
        LockKey("g", "t", 0), LockState.RELEASED, "", 2, 0, 0, 5, 0
    )


@pytest.mark.parametrize(
    "value",
    [
        b"{not json",
        b"{}",
        OLD_JSON_STATE.replace(b'"v":1', b'"v":2'),
        OLD_JSON_STATE.replace(b'"v":1', b'"v":true'),
        OLD_JSON_STATE.replace(b'"HELD"', b'"STOLEN"'),
        OLD_JSON_STATE.replace(b'"epoch":7', b'"epoch":"7"'),
        OLD_JSON_STATE.replace(b'"epoch":7', b'"epoch":true'),
        OLD_JSON_STATE.replace(b'"partition":3,', b""),
        b"{\xff}",
    ],
)
def test_malformed_json_lock_state_is_malformed(value):
    with pytest.raises(MalformedRecordError):
        decode_lock_state(None, value)


# Java's BuiltInPartitioner.partitionForKey(key UTF-8, n) for n in (1, 4, 8, 50), from
# kafka-clients 4.1.1: the partition of a lock key must be the one Java would pick.
JAVA_PARTITIONS = {
    LockKey("billing", "orders", 0): (0, 0, 0, 30),
    LockKey("billing", "orders", 3): (0, 3, 3, 31),
    LockKey("group/with/slashes", "orders", 3): (0, 2, 2, 38),
    LockKey("g", "t", 0): (0, 3, 7, 23),
    LockKey("café-group", "événements", 12): (0, 0, 4, 48),
    LockKey("orderly-a1b2c3", "payments", 7): (0, 3, 3, 31),
}


@pytest.mark.parametrize("key, expected", JAVA_PARTITIONS.items(), ids=str)
def test_a_lock_key_routes_to_the_partition_javas_partitioner_picks(key, expected):
    assert tuple(key.request_partition(n) for n in (1, 4, 8, 50)) == expected
    assert key.record_key() == str(key).encode()


def test_a_request_for_queues_routes_by_each_queues_key():
    ref = QueueRef("orders", 3)
    assert ref.key("billing").request_partition(50) == 31


# -- half messages -----------------------------------------------------------------------
def test_half_headers_parse_back_to_the_message():
    msg = Message(
        "orders",
        b"v",
        key=b"k",
        headers=[("app", b"1")],
        partition=2,
        tags="A",
        keys="K1",
        check_immunity_ms=500,
    )
    headers = half_headers(msg, "txn-1", b"pg", str(T).encode())
    half = parse_half(4, 9, T, msg.key, msg.value, headers)
    assert (
        half.txn_id,
        half.producer_group,
        half.real_topic,
        half.real_partition,
        half.born_ts,
        half.check_immunity_ms,
    ) == ("txn-1", "pg", "orders", 2, T, 500)
    assert half.user_headers() == [("app", b"1")]
    assert (H.TAGS, b"A") in half.promoted_headers()
    check = CheckRequest.of_half(half, 3, T)
    assert (check.topic, check.partition, check.check_seq, check.half_offset) == ("orders", 2, 3, 9)
    assert (check.header_text(H.TAGS), check.header_text(H.KEYS)) == ("A", "K1")
    assert check.user_headers() == [("app", b"1")]
    assert decode(encode(check)) == check


def test_half_headers_leave_out_what_the_message_does_not_set():
    headers = half_headers(Message("orders", b"v"), "txn-2", b"pg", b"1")
    assert [name for name, _ in headers] == [H.TXN_ID, H.REAL_TOPIC, H.PRODUCER_GROUP, H.BORN_TS]
    half = parse_half(0, 0, 0, None, b"v", headers)
    assert (half.real_partition, half.check_immunity_ms) == (None, None)


@pytest.mark.parametrize(
    "broken",
    [
        {H.TXN_ID: None},
        {H.REAL_TOPIC: b""},
        {H.BORN_TS: None},
        {H.BORN_TS: b"\xff\x00"},
        {H.TXN_ID: b"\xff\xfe"},
        {H.TXN_ID: b"t" * 129},
        {H.REAL_PARTITION: b"x"},
    ],
    ids=str,
)
def test_a_required_header_null_empty_unreadable_or_too_long_is_malformed(broken):
    headers = {
        H.TXN_ID: b"t",
        H.REAL_TOPIC: b"orders",
        H.PRODUCER_GROUP: b"pg",
        H.BORN_TS: b"1",
        **broken,
    }
    with pytest.raises(MalformedRecordError):
        parse_half(0, 3, T, None, b"v", list(headers.items()))


def test_an_unparsed_half_keeps_what_can_be_read_and_never_raises():
    headers = [
        (H.TXN_ID, b"t-\xff"),
        (H.REAL_TOPIC, None),
        ("junk", b"\x00\xff"),
        (H.BORN_TS, b"\xfe"),
    ]
    half = unparsed_half(2, 5, T, b"k", b"v", headers)
    assert (half.partition, half.offset, half.txn_id, half.real_topic) == (2, 5, "t-\ufffd", "")
    assert (half.key, half.value, half.headers) == (b"k", b"v", headers)
    assert unparsed_half(0, 0, T, None, None, None).headers == []
