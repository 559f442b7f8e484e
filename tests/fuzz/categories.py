"""The fuzzer's categories of bad input: each makes one :class:`Case` (the records to write,
and those to write once its half record has landed) and says what the coordinator owes it.

``known_bad`` names the categories today's code fails on (issue 12's items); they are
switchable (``select``), so each can be run alone: ``python -m tests.fuzz --only NAME``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from rmq_semantics.records.codec import RecordType, encode
from rmq_semantics.records.group_auth import derive_consumer_group_key, sign_lock_request
from rmq_semantics.records.headers import H
from rmq_semantics.records.locks import LockKey, LockRequest, QueueRef, RequestKind
from rmq_semantics.records.timer import TimerCancel, timer_partition
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
)
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX
from tests.fuzz.generators import (
    BEYOND_LONG,
    BREAKING,
    HEADER_VALUES,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MARKER_TYPES,
    NUMERIC_HALF,
    REQUIRED_HALF,
    REQUIRED_TIMER,
    RETRY_PARSED,
    V1_OUTCOMES,
    VALID,
    Ctx,
    Raw,
    RawHeaders,
    corrupted,
    end_request,
    garbage,
    huge_length,
    huge_text,
    lock_key,
    not_utf8,
    pick,
    relabelled,
    set_header,
    some_bytes,
    txn_id,
    valid_bytes,
    valid_half,
    valid_members,
    valid_retry,
    valid_timer,
)

#: Topics a case writes to (the runner maps them to ``<prefix>_<topic>``).
HALF, OP, CHECK, LOCK_REQUEST = "half", "op", "check", "lock_request"
#: A concurrent consumer's level-1 retry topic (the push test maps it to its group's).
RETRY = "retry"
#: Groups of stale lock requests start with this: none of them may ever be HELD.
STALE_LOCK_GROUP = "fuzz-stale-"
#: The timer topics (issue 35): the intake, level 1 (a 1 s hold) and the cancels.
TIMER, TIMER_LEVEL, TIMER_CANCEL = "timer", "timer_1", "timer_cancel"
#: What the coordinator owes a timer record written by a case (``Case.timer_outcomes``).
DELIVERED = "delivered"

FollowUp = Callable[[int, int], list[tuple[str, Raw]]]


@dataclass
class Case:
    """Records of one category: ``records`` go to ``topic``; ``then(partition, offset)``
    gives the records to write once the first one (a half record) has landed there."""

    category: str
    topic: str
    records: list[Raw]
    then: FollowUp | None = None
    txn_id: str | None = None
    #: The half record must never reach a real topic (or a system one).
    never_promoted: bool = False
    #: How many of ``records`` are bad (None: all).
    bad: int | None = None
    #: Timer records by value: DELIVERED (to their real topic, exactly once, not before
    #: their time) or the discard reason of their one copy in the discard topic.
    timer_outcomes: dict[bytes, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Category:
    name: str
    topic: str
    make: Callable[[random.Random, Ctx], Case]
    #: The coordinator must count every record of it under some reason (a metric moves).
    counted: bool
    #: Why today's code fails on it ("" when it should not).
    known_bad: str = ""


def _commit_after(txn: str, ctx: Ctx) -> FollowUp:
    """A COMMIT end request for the half record, as its producer would send it."""

    def then(partition: int, offset: int) -> list[tuple[str, Raw]]:
        request = end_request(ctx, partition, offset, txn, EndState.COMMIT)
        return [(OP, Raw(encode(request), partition=partition))]

    return then


def _half_case(
    name: str, raw: Raw, txn: str, ctx: Ctx, *, commit: bool = False, never_promoted: bool = False
) -> Case:
    return Case(name, HALF, [raw], _commit_after(txn, ctx) if commit else None, txn, never_promoted)


# -- half records ----------------------------------------------------------------------------
def half_missing_header(rng: random.Random, ctx: Ctx) -> Case:
    raw, txn = valid_half(rng, ctx)
    drop = pick(rng, REQUIRED_HALF)
    raw.headers = [h for h in raw.headers or [] if h[0] != drop]
    return _half_case("half_missing_header", raw, txn, ctx, commit=rng.random() < 0.5)


def half_bad_number(rng: random.Random, ctx: Ctx) -> Case:
    raw, txn = valid_half(rng, ctx)
    name = pick(rng, NUMERIC_HALF)
    raw.headers = set_header(raw.headers or [], name, HEADER_VALUES[name](rng, ctx))
    return _half_case("half_bad_number", raw, txn, ctx, commit=rng.random() < 0.5)


def half_not_utf8(rng: random.Random, ctx: Ctx) -> Case:
    raw, txn = valid_half(rng, ctx)
    name = pick(rng, [H.TXN_ID, H.PRODUCER_GROUP, H.REAL_TOPIC])
    raw.headers = set_header(raw.headers or [], name, not_utf8(rng))
    return _half_case("half_not_utf8", raw, txn, ctx)


def half_empty(rng: random.Random, ctx: Ctx) -> Case:
    raw = Raw(
        pick(rng, [None, b"", some_bytes(rng)]),
        pick(rng, [None, b""]),
        pick(rng, [None, [], [("app", b"1")]]),
        rng.randrange(ctx.partitions),
    )
    return Case("half_empty", HALF, [raw])


def _stray_headers(rng: random.Random, ctx: Ctx) -> RawHeaders:
    """User headers with binary values, and ``rmq.*`` headers a half record never has."""
    out: RawHeaders = [
        (f"fuzz-{rng.randrange(1000)}", some_bytes(rng, 300)) for _ in range(rng.randrange(4))
    ]
    stray = [n for n in HEADER_VALUES if n not in (*REQUIRED_HALF, *NUMERIC_HALF)]
    for name in rng.sample(stray, 1 + rng.randrange(3)):
        out.append((name, HEADER_VALUES[name](rng, ctx) or b""))
    return out


def half_random_header_bytes(rng: random.Random, ctx: Ctx) -> Case:
    """Valid, with random bytes in user headers and stray ``rmq.*`` headers: it is carried,
    checked, answered UNKNOW and discarded after ``check_max`` answers."""
    raw, txn = valid_half(rng, ctx, user_headers=_stray_headers(rng, ctx))
    return _half_case("half_random_header_bytes", raw, txn, ctx)


def half_abandoned(rng: random.Random, ctx: Ctx) -> Case:
    """Valid, of a producer group nobody serves: it stays pending (bounded by the horizon)."""
    raw, txn = valid_half(rng, ctx, group=f"fuzz-ghost-{rng.randrange(10**6)}")
    return _half_case("half_abandoned", raw, txn, ctx)


def half_far_future(rng: random.Random, ctx: Ctx) -> Case:
    """Born in the far future, or immune to checks for ages: never checked."""
    raw, txn = valid_half(rng, ctx)
    name, value = pick(rng, [(H.BORN_TS, ctx.now_ms + 10**12), (H.CHECK_IMMUNITY_MS, 10**15)])
    raw.headers = set_header(raw.headers or [], name, str(value).encode())
    return _half_case("half_far_future", raw, txn, ctx)


def half_null_header(rng: random.Random, ctx: Ctx) -> Case:
    raw, txn = valid_half(rng, ctx, user_headers=[("app", b"1")])
    name = pick(rng, ["app", H.TAGS, H.KEYS, H.TXN_ID, H.REAL_TOPIC, H.PRODUCER_GROUP])
    raw.headers = set_header(raw.headers or [], name, None)
    commit = name != H.REAL_TOPIC and rng.random() < 0.3
    return _half_case("half_null_header", raw, txn, ctx, commit=commit)


def half_born_ts_out_of_range(rng: random.Random, ctx: Ctx) -> Case:
    """A born time no Avro long holds: checked at once (negative) or promoted (10**400)."""
    raw, txn = valid_half(rng, ctx)
    born = pick(rng, [b for b in BEYOND_LONG if b < 0] + [10**400])
    raw.headers = set_header(raw.headers or [], H.BORN_TS, str(born).encode())
    return _half_case("half_born_ts_out_of_range", raw, txn, ctx, commit=born > 0)


def half_partition_out_of_range(rng: random.Random, ctx: Ctx) -> Case:
    """A COMMIT to a partition the real topic (1 partition) does not have."""
    raw, txn = valid_half(rng, ctx)
    partition = pick(rng, [1, 99, INT32_MAX, 2**31, 2**40, -5, -1])
    raw.headers = set_header(raw.headers or [], H.REAL_PARTITION, str(partition).encode())
    return _half_case(
        "half_partition_out_of_range", raw, txn, ctx, commit=True, never_promoted=True
    )


def half_system_topic(rng: random.Random, ctx: Ctx) -> Case:
    """A COMMIT whose real topic is a system topic; its value may be a forged Op marker."""
    raw, txn = valid_half(rng, ctx, topic=pick(rng, ctx.system_topics()))
    if rng.random() < 0.5:
        raw.value = valid_bytes(rng, ctx, pick(rng, MARKER_TYPES))
    return _half_case("half_system_topic", raw, txn, ctx, commit=True, never_promoted=True)


def half_unknown_topic(rng: random.Random, ctx: Ctx) -> Case:
    raw, txn = valid_half(rng, ctx, topic=ctx.missing_topic)
    return _half_case("half_unknown_topic", raw, txn, ctx, commit=True, never_promoted=True)


# -- members of multi-message transactions (issue 18) ---------------------------------------
BAD_MEMBERSHIP = (
    (b"x", b"0"),
    (b"", b"0"),
    (b"1", b"0"),
    (b"0", b"0"),
    (b"-3", b"1"),
    (b"3", b"3"),
    (b"3", b"9"),
    (b"1001", b"0"),
    (str(2**64).encode(), b"0"),
    (b"3", None),
    (None, b"1"),
    (b"2", b"-1"),
    (b"\xff", b"0"),
)


def txn_bad_membership(rng: random.Random, ctx: Ctx) -> Case:
    """A member whose size/index no transaction can have (not numbers, size < 2, index >=
    size, a huge size, one header alone): malformed, never promoted, even on COMMIT."""
    raws, txn = valid_members(rng, ctx, 2)
    size, index = pick(rng, BAD_MEMBERSHIP)
    headers = [h for h in raws[0].headers or [] if h[0] not in (H.TXN_SIZE, H.TXN_INDEX)]
    headers += [
        (name, value)
        for name, value in ((H.TXN_SIZE, size), (H.TXN_INDEX, index))
        if value is not None
    ]
    raw = Raw(raws[0].value, raws[0].key, headers, raws[0].partition)
    return _half_case(
        "txn_bad_membership", raw, txn, ctx, commit=rng.random() < 0.5, never_promoted=True
    )


def txn_member_mismatch(rng: random.Random, ctx: Ctx) -> Case:
    """Good members then one contradicting them (another size, an index already read,
    another producer group), and a COMMIT: the odd one is set aside as malformed, the rest
    are never promoted in part (discarded as incomplete)."""
    size = rng.randrange(2, 5)
    raws, txn = valid_members(rng, ctx, size)
    good = raws[: rng.randrange(1, size)]
    odd = pick(rng, raws[: len(good)])
    name, value = pick(
        rng,
        [
            (H.TXN_SIZE, str(size + 1).encode()),
            (H.TXN_INDEX, dict(odd.headers or [])[H.TXN_INDEX]),
            (H.PRODUCER_GROUP, b"fuzz-other-group"),
        ],
    )
    odd = Raw(odd.value, odd.key, set_header(odd.headers or [], name, value), odd.partition)
    return Case(
        "txn_member_mismatch",
        HALF,
        [*good, odd],
        _commit_after(txn, ctx),
        txn,
        never_promoted=True,
        bad=1,
    )


# -- Op records ------------------------------------------------------------------------------
OP_TYPES = (RecordType.END_REQUEST, RecordType.END_REQUESTS, *MARKER_TYPES)
NOT_OP_TYPES = (
    RecordType.CHECK_REQUEST,
    RecordType.LOCK_REQUEST,
    RecordType.LOCK_REPLY,
    RecordType.LOCK_STATE,
    RecordType.TIMER_CANCEL,  # issue 35: a recall written to the Op topic instead
)


def _op(
    name: str, rng: random.Random, ctx: Ctx, value: bytes | None, partition: int | None = None
) -> Case:
    p = rng.randrange(ctx.partitions) if partition is None else partition
    return Case(name, OP, [Raw(value, partition=p)])


def op_garbage(rng: random.Random, ctx: Ctx) -> Case:
    return _op("op_garbage", rng, ctx, garbage(rng, b""))


def op_broken(rng: random.Random, ctx: Ctx) -> Case:
    """A valid Op record truncated, or with a wrong magic byte, type or schema version."""
    record_type = pick(rng, OP_TYPES)
    data = valid_bytes(rng, ctx, record_type)
    # A marker starts with a long: a huge one in front is a marker for a far offset.
    mutations = BREAKING if record_type in MARKER_TYPES else (*BREAKING, huge_length)
    return _op("op_broken", rng, ctx, pick(rng, mutations)(rng, data))


def op_not_an_op_record(rng: random.Random, ctx: Ctx) -> Case:
    return _op("op_not_an_op_record", rng, ctx, valid_bytes(rng, ctx, pick(rng, NOT_OP_TYPES)))


def op_relabelled(rng: random.Random, ctx: Ctx) -> Case:
    """One record type's body under another (non-marker) type: malformed, or a decodable
    record of nonsense (an empty batch of end requests is harmless and not counted)."""
    source = pick(rng, [*NOT_OP_TYPES, RecordType.END_REQUEST, RecordType.END_REQUESTS])
    to = pick(rng, [*NOT_OP_TYPES, RecordType.END_REQUEST, RecordType.END_REQUESTS])
    return _op("op_relabelled", rng, ctx, relabelled(rng, valid_bytes(rng, ctx, source), to))


def end_request_mismatch(rng: random.Random, ctx: Ctx) -> Case:
    """An end request for a good transaction's offset with a wrong txn id or group."""
    p, offset, txn = pick(rng, ctx.targets) if ctx.targets else (0, rng.randrange(50), "x")
    wrong_txn = rng.random() < 0.5
    txn, group = (txn_id(), ctx.group) if wrong_txn else (txn, f"{ctx.group}-other")
    state = pick(rng, list(EndState))
    if rng.random() < 0.5:
        record = encode(EndRequest(txn, group, p, offset, state, False, 0, ctx.now_ms))
    else:
        record = encode(EndRequests(group, p, (EndEntry(txn, offset, state),), ctx.now_ms))
    return _op("end_request_mismatch", rng, ctx, record, p)


def end_request_odd_fields(rng: random.Random, ctx: Ctx) -> Case:
    """An end request (of no transaction) with one field at an extreme of its type."""
    record = VALID[pick(rng, [RecordType.END_REQUEST, RecordType.END_REQUESTS])](rng, ctx)
    if isinstance(record, EndRequests) and rng.random() < 0.2:
        entries = tuple(EndEntry(txn_id(), i, EndState.COMMIT) for i in range(300))
        record = EndRequests(record.producer_group, record.half_partition, entries, record.ts)
    return _op("end_request_odd_fields", rng, ctx, corrupted(rng, record), record.half_partition)


def _marker_at(rng: random.Random, ctx: Ctx, offset: int, txn: str) -> bytes:
    outcome = pick(rng, V1_OUTCOMES)
    return encode(
        pick(
            rng,
            [
                DoneMarkers((DoneEntry(offset, txn, outcome, 0),), ctx.now_ms),
                DoneMarker(offset, txn, outcome, 0, ctx.now_ms),
                CheckMarker(
                    offset,
                    txn,
                    INT32_MAX,
                    pick(rng, [0, INT32_MAX]),
                    0,
                    pick(rng, [INT64_MAX, ctx.now_ms + 10**9]),
                    ctx.now_ms,
                ),
            ],
        )
    )


def forged_done_marker(rng: random.Random, ctx: Ctx) -> Case:
    """A done marker for a good pending transaction, written by a plain producer."""
    p, offset, txn = pick(rng, ctx.targets) if ctx.targets else (0, rng.randrange(50), "x")
    outcome = pick(rng, V1_OUTCOMES)
    record = pick(
        rng,
        [
            DoneMarkers((DoneEntry(offset, txn, outcome, 0),), ctx.now_ms),
            DoneMarker(offset, txn, outcome, 0, ctx.now_ms),
        ],
    )
    return _op("forged_done_marker", rng, ctx, encode(record), p)


def forged_check_marker(rng: random.Random, ctx: Ctx) -> Case:
    """A check marker for a good pending transaction that puts its next check off for ever."""
    p, offset, txn = pick(rng, ctx.targets) if ctx.targets else (0, rng.randrange(50), "x")
    record = CheckMarker(
        offset,
        txn,
        pick(rng, [1, INT32_MAX]),
        pick(rng, [0, INT32_MAX]),
        0,
        pick(rng, [INT64_MAX, ctx.now_ms + 10**9]),
        ctx.now_ms,
    )
    return _op("forged_check_marker", rng, ctx, encode(record), p)


def marker_nowhere(rng: random.Random, ctx: Ctx) -> Case:
    """A done or check marker for an offset no half record has (far ahead or negative)."""
    offset = pick(rng, [2**40 + rng.randrange(1000), -1 - rng.randrange(1000), INT64_MAX])
    return _op("marker_nowhere", rng, ctx, _marker_at(rng, ctx, offset, txn_id()))


# -- check requests (read by the producers of the group, not by the coordinator) --------------
def _check(name: str, value: bytes | None, group: str) -> Case:
    return Case(name, CHECK, [Raw(value, key=group.encode())])


def check_garbage(rng: random.Random, ctx: Ctx) -> Case:
    data = valid_bytes(rng, ctx, RecordType.CHECK_REQUEST)
    return _check("check_garbage", pick(rng, [*BREAKING, huge_length])(rng, data), ctx.group)


def check_request_odd(rng: random.Random, ctx: Ctx) -> Case:
    """A check request of the live group for no transaction, one field at an extreme."""
    record = VALID[RecordType.CHECK_REQUEST](rng, ctx)
    keep = ("producer_group", "topic", "partition", "half_partition")
    return _check("check_request_odd", corrupted(rng, record, keep), ctx.group)


def check_request_unanswerable(rng: random.Random, ctx: Ctx) -> Case:
    """A check request whose message has no valid topic or partition, or whose half
    partition the Op topic lacks (the answer cannot be written)."""
    record: CheckRequest = VALID[RecordType.CHECK_REQUEST](rng, ctx)
    topic, partition, half_partition = pick(
        rng,
        [
            ("", None, record.half_partition),
            (record.topic, -1, record.half_partition),
            (record.topic, INT32_MIN, record.half_partition),
            (record.topic, None, pick(rng, [ctx.partitions, INT32_MAX, -5])),
        ],
    )
    bad = CheckRequest(
        record.txn_id,
        ctx.group,
        half_partition,
        record.half_offset,
        record.check_seq,
        record.born_ts,
        topic,
        partition,
        record.key,
        record.value,
        record.headers,
        record.ts,
    )
    return _check("check_request_unanswerable", encode(bad), ctx.group)


# -- lock requests ---------------------------------------------------------------------------
def _routed(key: LockKey, ctx: Ctx) -> int:
    return key.request_partition(ctx.partitions)


def _lock(request: LockRequest, partition: int) -> Raw:
    key = request.queues[0].key(request.group) if request.queues else None
    return Raw(encode(request), key.record_key() if key else None, partition=partition)


def lock_garbage(rng: random.Random, ctx: Ctx) -> Case:
    data = valid_bytes(rng, ctx, RecordType.LOCK_REQUEST)
    value = pick(rng, [*BREAKING, huge_length])(rng, data)
    return Case("lock_garbage", LOCK_REQUEST, [Raw(value, partition=rng.randrange(ctx.partitions))])


def _request(rng: random.Random, ctx: Ctx, group: str, **fields: object) -> LockRequest:
    key = lock_key(rng, ctx, group)
    base = {
        "kind": RequestKind.LOCK,
        "request_id": txn_id(),
        "client_id": "fuzz-c",
        "group": group,
        "reply_partition": 0,
        "queues": (QueueRef(key.topic, key.partition),),
        "lease_ms": 30_000,
        "sent_at_ms": ctx.now_ms,
    }
    return LockRequest(**{**base, **fields})


def lock_misrouted(rng: random.Random, ctx: Ctx) -> Case:
    request = _request(rng, ctx, f"fuzz-mr-{rng.randrange(10**6)}")
    right = _routed(request.queues[0].key(request.group), ctx)
    return Case(
        "lock_misrouted",
        LOCK_REQUEST,
        [_lock(request, (right + 1 + rng.randrange(ctx.partitions - 1)) % ctx.partitions)],
    )


def lock_invalid(rng: random.Random, ctx: Ctx) -> Case:
    request = _request(
        rng,
        ctx,
        f"fuzz-inv-{rng.randrange(10**6)}",
        client_id="",
        kind=pick(rng, list(RequestKind)),
    )
    return Case(
        "lock_invalid",
        LOCK_REQUEST,
        [_lock(request, _routed(request.queues[0].key(request.group), ctx))],
    )


def lock_stale_epoch(rng: random.Random, ctx: Ctx) -> Case:
    """A lock, then an unlock by the same client naming another epoch than the grant's."""
    group = f"fuzz-se-{txn_id()}"
    granted = _request(rng, ctx, group)
    ref = granted.queues[0]
    stale = _request(
        rng,
        ctx,
        group,
        kind=RequestKind.UNLOCK,
        queues=(QueueRef(ref.topic, ref.partition, pick(rng, [0, 2, 999, -1, INT64_MAX])),),
    )
    p = _routed(ref.key(group), ctx)
    return Case("lock_stale_epoch", LOCK_REQUEST, [_lock(granted, p), _lock(stale, p)], bad=1)


def lock_odd(rng: random.Random, ctx: Ctx) -> Case:
    """Valid requests with odd fields: lease, reply partition, many queues, huge names."""
    group = f"fuzz-odd-{rng.randrange(10**6)}"
    key = lock_key(rng, ctx, group)
    p = _routed(key, ctx)
    odd = pick(
        rng,
        [
            lambda: {"lease_ms": pick(rng, [0, -1, INT64_MAX])},
            lambda: {"reply_partition": pick(rng, [-1, 999, INT32_MAX])},
            lambda: {"kind": RequestKind.UNLOCK},
            lambda: {
                "queues": (QueueRef(key.topic, key.partition, pick(rng, [0, -1, INT64_MAX])),)
            },
            lambda: {
                "queues": tuple(
                    QueueRef(f"t{i}", i)
                    for i in range(3000)
                    if LockKey(group, f"t{i}", i).request_partition(ctx.partitions) == p
                )
            },
            lambda: {"request_id": huge_text(rng), "client_id": f"fuzz-{huge_text(rng)[:50_000]}"},
            lambda: {"queues": ()},
        ],
    )()
    if "queues" not in odd or odd["queues"]:
        odd.setdefault("queues", (QueueRef(key.topic, key.partition),))
    request = _request(rng, ctx, group, **odd)
    return Case("lock_odd", LOCK_REQUEST, [Raw(encode(request), partition=p)])


def lock_stale_request(rng: random.Random, ctx: Ctx) -> Case:
    """A lock request claiming it was sent ten minutes ago. The lock service ages requests by
    the broker's clock (the request topic is LogAppendTime), never by a client's claim: it is
    handled like any other, so nothing is owed a count (the refusal of a really stale request
    is tests/integration/test_edges.py's)."""
    request = _request(
        rng, ctx, f"{STALE_LOCK_GROUP}{rng.randrange(10**6)}", sent_at_ms=ctx.now_ms - 600_000
    )
    return Case(
        "lock_stale_request",
        LOCK_REQUEST,
        [_lock(request, _routed(request.queues[0].key(request.group), ctx))],
        bad=0,
    )


#: The fuzzer's own tenant key: a lock request signed under it for another group than it
#: names is a forgery a coordinator with another key cannot tell from any other.
FUZZ_TENANT_KEY = b"the fuzzer's tenant key, not the coordinator's"


def lock_unsigned_or_forged(rng: random.Random, ctx: Ctx) -> Case:
    """A lock or unlock request of a fresh group without its group's MAC (issue 44): none
    (v3, or a client of before's v1/v2), garbage, or the MAC of another group's key. Without
    tenant isolation it is decided like any other, so nothing is owed a count; under it each
    queue is refused as unauthenticated (tests/unit/test_fuzz.py)."""
    group = f"fuzz-mac-{rng.randrange(10**6)}"
    request = _request(rng, ctx, group, kind=pick(rng, list(RequestKind)))
    p = _routed(request.queues[0].key(group), ctx)
    other = derive_consumer_group_key(FUZZ_TENANT_KEY, pick(rng, ["fuzz-lock", group + "x"]))
    mac = pick(
        rng,
        [
            lambda: None,
            lambda: b"",
            lambda: some_bytes(rng),
            lambda: b"\x00" * 32,
            lambda: sign_lock_request(other, f"{ctx.prefix}_lock_request", p, request).mac,
            lambda: huge_text(rng).encode()[:100_000],
        ],
    )()
    version = pick(rng, [1, 2, 3]) if mac is None else 3
    raw = Raw(encode(replace(request, mac=mac), version), _lock(request, p).key, partition=p)
    return Case("lock_unsigned_or_forged", LOCK_REQUEST, [raw], bad=0)


# -- timer records and cancels (issue 35) ----------------------------------------------------
# A plain producer writes them straight to the timer topics. What each is owed is observable:
# a valid one is delivered once to its real topic, a bad one is copied once to the discard
# topic with its reason (and moves rmq_timer_discarded_total); a bad cancel moves
# rmq_malformed_records_total of the cancel topic and changes nothing.
#: Real topics a timer record may not be delivered to: ours (the timer topics among them)
#: and those of the default prefix.
def _system_targets(ctx: Ctx) -> list[str]:
    return [*ctx.system_topics(), f"{DEFAULT_TOPIC_PREFIX}_half", f"{DEFAULT_TOPIC_PREFIX}_timer"]


def _timer_case(name: str, topic: str, made: list[tuple[Raw, str, int]]) -> Case:
    """``made``: (record, outcome, due ms) each; every record gets a value no other has,
    which its delivery or its discard copy is found by."""
    records, outcomes = [], {}
    for raw, outcome, due in made:
        marked = Raw(f"fuzz-timer:{txn_id()}".encode(), raw.key, raw.headers, raw.partition)
        records.append(marked)
        outcomes[marked.value] = (outcome, due)
    bad = sum(1 for outcome, _ in outcomes.values() if outcome != DELIVERED)
    return Case(name, topic, records, bad=bad, timer_outcomes=outcomes)


def _due(raw: Raw) -> int:
    return int(dict(raw.headers or [])[H.DELIVER_AT] or 0)


def _other_partition(rng: random.Random, ctx: Ctx, partition: int | None) -> int:
    return (int(partition or 0) + 1 + rng.randrange(ctx.timer_partitions - 1)) % (
        ctx.timer_partitions
    )


def timer_valid_odd(rng: random.Random, ctx: Ctx) -> Case:
    """Valid timer records, due in the past (the epoch included), now, within the second or
    in a few seconds, some carrying forged ``rmq.*`` headers the delivery writes afresh
    (``rmq.promoted_from``, ``rmq.delivered_at``) or drops (``rmq.txn_id``): each delivered
    once."""
    raw, _ = valid_timer(rng, ctx, group=ctx.timer_group, due_in_ms=pick(rng, [-1000, 0, 1500]))
    if rng.random() < 0.2:
        raw.headers = set_header(raw.headers or [], H.DELIVER_AT, b"0")
    for name in rng.sample([H.PROMOTED_FROM, H.DELIVERED_AT, H.TXN_ID], rng.randrange(3)):
        raw.headers = set_header(raw.headers or [], name, HEADER_VALUES[name](rng, ctx))
    return _timer_case("timer_valid_odd", TIMER, [(raw, DELIVERED, _due(raw))])


def timer_wrong_partition(rng: random.Random, ctx: Ctx) -> Case:
    """A valid timer record in another timer partition than its id's. The coordinator does
    not check the placement (a partition count raised later would refuse every record
    written before): it is delivered once; only a recall of it is not seen."""
    raw, _ = valid_timer(rng, ctx, group=ctx.timer_group, due_in_ms=pick(rng, [0, 600]))
    raw.partition = _other_partition(rng, ctx, raw.partition)
    return _timer_case("timer_wrong_partition", TIMER, [(raw, DELIVERED, _due(raw))])


def timer_missing_header(rng: random.Random, ctx: Ctx) -> Case:
    """A required header dropped, or given with a null value: malformed."""
    raw, _ = valid_timer(rng, ctx, group=ctx.timer_group)
    name = pick(rng, REQUIRED_TIMER)
    headers = [h for h in raw.headers or [] if h[0] != name]
    raw.headers = headers + ([(name, None)] if rng.random() < 0.3 else [])
    return _timer_case("timer_missing_header", TIMER, [(raw, "malformed", 0)])


#: ``rmq.deliver_at`` (and ``rmq.born_ts``) values a plain producer may write, and what the
#: coordinator owes each: not a decimal in 0..2^63-1 is malformed; further ahead of its birth
#: than max_delay_ms, or a birth in the future beyond it, too far; the epoch is due at once.
def _deliver_at_choices(ctx: Ctx, max_delay_ms: int) -> list[tuple[bytes, bytes | None, str]]:
    far = ctx.now_ms + 10 * 24 * 3600 * 1000
    return [
        (b"soon", None, "malformed"),
        (b"-5", None, "malformed"),
        (b"1.5e3", None, "malformed"),
        (b" 1", None, "malformed"),
        (str(2**63).encode(), None, "malformed"),
        (b"99999999999999999999", None, "malformed"),
        (str(INT64_MAX).encode(), None, "too_far"),
        (str(ctx.now_ms + max_delay_ms + 30_000).encode(), None, "too_far"),
        (str(far).encode(), str(far).encode(), "too_far"),  # born then too: the wheel's check
        (str(ctx.now_ms).encode(), b"0", "too_far"),  # born at the epoch, due now
        (b"0", None, DELIVERED),
    ]


def timer_bad_deliver_at(rng: random.Random, ctx: Ctx) -> Case:
    raw, _ = valid_timer(rng, ctx, group=ctx.timer_group)
    deliver_at, born, outcome = pick(rng, _deliver_at_choices(ctx, ctx.timer_max_delay_ms))
    raw.headers = set_header(raw.headers or [], H.DELIVER_AT, deliver_at)
    if born is not None:
        raw.headers = set_header(raw.headers, H.BORN_TS, born)
    due = int(deliver_at) if outcome == DELIVERED else 0
    return _timer_case("timer_bad_deliver_at", TIMER, [(raw, outcome, due)])


def timer_odd_id(rng: random.Random, ctx: Ctx) -> Case:
    """An id no producer gives (empty, over 128 bytes, not printable ASCII): malformed."""
    raw, _ = valid_timer(rng, ctx, group=ctx.timer_group)
    odd = pick(rng, [HEADER_VALUES[H.TIMER_ID](rng, ctx), b"i" * 129, huge_text(rng).encode()])
    raw.headers = set_header(raw.headers or [], H.TIMER_ID, odd)
    raw.partition = rng.randrange(ctx.timer_partitions)
    return _timer_case("timer_odd_id", TIMER, [(raw, "malformed", 0)])


def timer_bad_header(rng: random.Random, ctx: Ctx) -> Case:
    """A real topic that is no topic name, a born time or real partition that is no
    number, a ``rmq.timer_origin`` on the intake (only the coordinator writes one), or a
    ``rmq.*`` header given twice: malformed."""
    raw, _ = valid_timer(rng, ctx, group=ctx.timer_group)
    headers = raw.headers or []
    how = rng.randrange(5)
    if how == 0:
        bad = pick(rng, [b"a b", b"x" * 250, b"..", b"t/1", not_utf8(rng)])
        headers = set_header(headers, H.REAL_TOPIC, bad)
    elif how == 1:
        headers = set_header(headers, H.BORN_TS, HEADER_VALUES[H.BORN_TS](rng, ctx))
    elif how == 2:
        headers = set_header(headers, H.REAL_PARTITION, HEADER_VALUES[H.REAL_PARTITION](rng, ctx))
    elif how == 3:
        headers = set_header(headers, H.TIMER_ORIGIN, pick(rng, [b"0", b"7", b"-1", b""]))
    else:
        twice = pick(rng, [h for h in headers if h[0].startswith("rmq.")])
        headers = [*headers, twice]
    raw.headers = headers
    return _timer_case("timer_bad_header", TIMER, [(raw, "malformed", 0)])


def timer_system_topic(rng: random.Random, ctx: Ctx) -> Case:
    """A valid timer record whose real topic is a system topic (a timer topic among them):
    set aside as system_topic, never written there."""
    raw, _ = valid_timer(rng, ctx, group=ctx.timer_group, due_in_ms=0)
    raw.headers = set_header(
        raw.headers or [], H.REAL_TOPIC, pick(rng, _system_targets(ctx)).encode()
    )
    raw.headers = [h for h in raw.headers if h[0] != H.REAL_PARTITION]
    return _timer_case("timer_system_topic", TIMER, [(raw, "system_topic", 0)])


#: ``rmq.timer_origin`` values on a level topic and what each is owed: a decimal is an origin
#: (a forged one is indistinguishable from the coordinator's re-append: delivered once, after
#: the level's hold); none, or not a decimal, is malformed.
ORIGINS = (
    (None, "malformed"),
    (b"", "malformed"),
    (b"-1", "malformed"),
    (b"x1", "malformed"),
    (b"99999999999999999999", "malformed"),
    (b"0", DELIVERED),
    (str(2**62).encode(), DELIVERED),
)


def timer_forged_origin(rng: random.Random, ctx: Ctx) -> Case:
    """A timer record written straight to level 1, with a forged, odd or no origin."""
    raw, _ = valid_timer(rng, ctx, group=ctx.timer_group, due_in_ms=pick(rng, [-500, 0, 800]))
    origin, outcome = pick(rng, ORIGINS)
    if origin is not None:
        raw.headers = set_header(raw.headers or [], H.TIMER_ORIGIN, origin)
    due = _due(raw) if outcome == DELIVERED else 0
    return _timer_case("timer_forged_origin", TIMER_LEVEL, [(raw, outcome, due)])


def timer_cancel_garbage(rng: random.Random, ctx: Ctx) -> Case:
    """A cancel that is no cancel: broken bytes, another record type, an odd id, an empty
    group, a negative time, a record key that is not its id. Counted, logged, skipped."""
    cancel = TimerCancel(txn_id(), ctx.timer_group, ctx.now_ms)
    key: bytes | None = cancel.timer_id.encode()
    how = rng.randrange(4)
    if how == 0:
        value = pick(rng, [*BREAKING, huge_length])(rng, encode(cancel))
    elif how == 1:
        value = valid_bytes(
            rng, ctx, pick(rng, [t for t in RecordType if t != RecordType.TIMER_CANCEL])
        )
    elif how == 2:
        odd = pick(
            rng,
            [
                TimerCancel(pick(rng, ["", "i" * 129, "a\nb", "caf\u00e9"]), ctx.timer_group, 0),
                TimerCancel(cancel.timer_id, "", ctx.now_ms),
                TimerCancel(cancel.timer_id, ctx.timer_group, pick(rng, [-1, INT64_MIN])),
            ],
        )
        value, key = encode(odd), None
    else:
        value, key = encode(cancel), b"not-" + cancel.timer_id.encode()
    return Case(
        "timer_cancel_garbage",
        TIMER_CANCEL,
        [Raw(value, key, partition=rng.randrange(ctx.timer_partitions))],
    )


def timer_cancel_other_group(rng: random.Random, ctx: Ctx) -> Case:
    """A well-formed cancel of a pending good message naming another group (or none): a
    cancel binds only its own group's message, so the message is still delivered once.
    Nothing is owed a count (without tenant isolation a group is not authenticated)."""
    timer_id = pick(rng, ctx.timer_targets) if ctx.timer_targets else txn_id()
    group = pick(rng, [None, f"{ctx.timer_group}-other", ctx.group])
    record = TimerCancel(timer_id, group, ctx.now_ms)
    raw = Raw(
        encode(record), timer_id.encode(), partition=timer_partition(timer_id, ctx.timer_partitions)
    )
    return Case("timer_cancel_other_group", TIMER_CANCEL, [raw], bad=0)


CATEGORIES: tuple[Category, ...] = (
    Category("half_missing_header", HALF, half_missing_header, True),
    Category("half_bad_number", HALF, half_bad_number, True),
    Category("half_not_utf8", HALF, half_not_utf8, True),
    Category("half_empty", HALF, half_empty, True),
    Category("half_random_header_bytes", HALF, half_random_header_bytes, True),
    Category("half_abandoned", HALF, half_abandoned, False),
    Category("half_far_future", HALF, half_far_future, False),
    Category("half_null_header", HALF, half_null_header, True),
    Category("half_born_ts_out_of_range", HALF, half_born_ts_out_of_range, True),
    Category("half_partition_out_of_range", HALF, half_partition_out_of_range, True),
    Category("half_system_topic", HALF, half_system_topic, True),
    Category("half_unknown_topic", HALF, half_unknown_topic, True),
    Category("txn_bad_membership", HALF, txn_bad_membership, True),
    Category("txn_member_mismatch", HALF, txn_member_mismatch, True),
    Category("op_garbage", OP, op_garbage, True),
    Category("op_broken", OP, op_broken, True),
    Category("op_not_an_op_record", OP, op_not_an_op_record, True),
    Category("op_relabelled", OP, op_relabelled, False),
    Category("end_request_mismatch", OP, end_request_mismatch, True),
    Category("end_request_odd_fields", OP, end_request_odd_fields, True),
    Category("forged_done_marker", OP, forged_done_marker, True),
    Category("forged_check_marker", OP, forged_check_marker, True),
    Category("marker_nowhere", OP, marker_nowhere, True),
    Category("check_garbage", CHECK, check_garbage, False),
    Category("check_request_odd", CHECK, check_request_odd, False),
    Category("check_request_unanswerable", CHECK, check_request_unanswerable, False),
    Category("lock_garbage", LOCK_REQUEST, lock_garbage, True),
    Category("lock_misrouted", LOCK_REQUEST, lock_misrouted, True),
    Category("lock_invalid", LOCK_REQUEST, lock_invalid, True),
    Category("lock_stale_epoch", LOCK_REQUEST, lock_stale_epoch, True),
    Category("lock_odd", LOCK_REQUEST, lock_odd, False),
    Category("lock_stale_request", LOCK_REQUEST, lock_stale_request, True),
    Category("lock_unsigned_or_forged", LOCK_REQUEST, lock_unsigned_or_forged, False),
    Category("timer_valid_odd", TIMER, timer_valid_odd, False),
    Category("timer_wrong_partition", TIMER, timer_wrong_partition, False),
    Category("timer_missing_header", TIMER, timer_missing_header, True),
    Category("timer_bad_deliver_at", TIMER, timer_bad_deliver_at, True),
    Category("timer_odd_id", TIMER, timer_odd_id, True),
    Category("timer_bad_header", TIMER, timer_bad_header, True),
    Category("timer_system_topic", TIMER, timer_system_topic, True),
    Category("timer_forged_origin", TIMER_LEVEL, timer_forged_origin, True),
    Category("timer_cancel_garbage", TIMER_CANCEL, timer_cancel_garbage, True),
    Category("timer_cancel_other_group", TIMER_CANCEL, timer_cancel_other_group, False),
)


# -- retry records of a concurrent consumer (PushConsumer) ----------------------------------
def retry_bad_header(rng: random.Random, ctx: Ctx) -> Case:
    raw = valid_retry(rng, ctx)
    name = pick(rng, RETRY_PARSED)
    raw.headers = set_header(raw.headers or [], name, HEADER_VALUES[name](rng, ctx))
    return Case("retry_bad_header", RETRY, [raw])


def retry_missing_header(rng: random.Random, ctx: Ctx) -> Case:
    raw = valid_retry(rng, ctx)
    drop = pick(rng, RETRY_PARSED)
    raw.headers = [h for h in raw.headers or [] if h[0] != drop]
    return Case("retry_missing_header", RETRY, [raw])


def retry_forged_dlq_headers(rng: random.Random, ctx: Ctx) -> Case:
    """A good retry copy carrying forged ``rmq.dlq.*`` headers: not a problem to read
    (a dead letter writes its own afresh), so nothing is owed a count."""
    raw = valid_retry(rng, ctx)
    for name in (H.DLQ_RECONSUME_TIMES, H.DLQ_EXCEPTION, H.DLQ_LAST_FAILURE_TS):
        raw.headers = set_header(raw.headers or [], name, HEADER_VALUES[name](rng, ctx))
    return Case("retry_forged_dlq_headers", RETRY, [raw], bad=0)


#: Run by tests/integration/test_push.py against a PushConsumer, not by the coordinator
#: runner: ``counted`` means the consumer's ``malformed`` count moves.
PUSH_CATEGORIES: tuple[Category, ...] = (
    Category("retry_bad_header", RETRY, retry_bad_header, True),
    Category("retry_missing_header", RETRY, retry_missing_header, True),
    Category("retry_forged_dlq_headers", RETRY, retry_forged_dlq_headers, False),
)
BY_NAME = {c.name: c for c in CATEGORIES}
KNOWN_BAD = {c.name: c.known_bad for c in CATEGORIES if c.known_bad}


def select(
    only: Iterable[str] = (), skip: Iterable[str] = (), *, safe: bool = False
) -> list[Category]:
    """Categories by name (``only``; all by default) less ``skip``; ``safe`` drops the known
    bad ones. Unknown names are a ValueError naming the known ones."""
    only, skip = list(only), list(skip)
    unknown = [n for n in (*only, *skip) if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown fuzz categories {unknown}; known: {sorted(BY_NAME)}")
    chosen = [BY_NAME[n] for n in only] if only else list(CATEGORIES)
    return [c for c in chosen if c.name not in skip and not (safe and c.known_bad)]


def cases(rng: random.Random, ctx: Ctx, categories: list[Category], n: int) -> list[Case]:
    """``n`` cases, categories drawn uniformly."""
    return [pick(rng, categories).make(rng, ctx) for _ in range(n)]


# -- what the coordinator counted ------------------------------------------------------------
#: Counters of normal work, not of bad input.
NORMAL_COUNTERS = (
    "rmq_promotions_total",
    "rmq_rollbacks_total",
    "rmq_checks_issued_total",
    "rmq_transactions_aborted_total",
    # Timer messages (issue 35): scheduled, re-appended, delivered, recalled; a cancel read
    # after its message was delivered is a race a good producer can lose too.
    "rmq_timer_scheduled_total",
    "rmq_timer_reappended_total",
    "rmq_timer_delivered_total",
    "rmq_timer_cancelled_total",
    "rmq_timer_cancel_too_late_total",
)
NORMAL_LOCK_EVENTS = (
    "requests",
    "granted",
    "renewed",
    "taken_over",
    "released",
    "aborted",
    "expired",
)


# An inline UNKNOW (a good producer's) is ignored: only answers to checks count.
NORMAL_DECISIONS = ("unknown_ignored",)


def bad_input(counts: dict[str, float]) -> dict[str, float]:
    """The counters (``name{label=value}``) that count bad input under a reason."""
    normal = {
        *NORMAL_COUNTERS,
        *(f"rmq_lock_events_total{{event={e}}}" for e in NORMAL_LOCK_EVENTS),
        *(f"rmq_conflicting_decisions_total{{kind={k}}}" for k in NORMAL_DECISIONS),
    }
    return {k: v for k, v in counts.items() if v and k not in normal}


def counted_by_topic(counts: dict[str, float], prefix: str) -> Counter[str]:
    """Bad-input counts by the topic of the records they count: lock events for lock
    requests, malformed half records and discards for half records, timer discards for
    timer records, malformed cancels for the cancel topic, the rest for Op
    records (rejected and conflicting end requests, malformed Op records, and whatever new
    counter a fix adds, such as forged markers)."""
    out: Counter[str] = Counter()
    for key, value in bad_input(counts).items():
        if key.startswith("rmq_lock_events_total"):
            out[LOCK_REQUEST] += value
        elif key.startswith("rmq_timer_discarded_total"):
            out[TIMER] += value  # of the intake and the level topics
        elif key == f"rmq_malformed_records_total{{topic={prefix}_{TIMER_CANCEL}}}":
            out[TIMER_CANCEL] += value
        elif key.startswith(f"rmq_malformed_records_total{{topic={prefix}_{TIMER}"):
            pass  # a malformed timer record: rmq_timer_discarded_total counts it too
        elif key.startswith("rmq_discarded_total") or (
            key == f"rmq_malformed_records_total{{topic={prefix}_{HALF}}}"
        ):
            out[HALF] += value
        else:
            out[OP] += value
    return out


def owed_by_topic(cases: Iterable[Case]) -> Counter[str]:
    """How many records of counted categories each topic got."""
    out: Counter[str] = Counter()
    for case in cases:
        if BY_NAME[case.category].counted:
            topic = TIMER if case.topic == TIMER_LEVEL else case.topic  # one counter for both
            out[topic] += len(case.records) if case.bad is None else case.bad
    return out


def uncounted(counts: dict[str, float], prefix: str, cases: Iterable[Case]) -> list[str]:
    """Topics whose counted bad records moved fewer counters than there were records."""
    owed, counted = owed_by_topic(cases), counted_by_topic(counts, prefix)
    return [
        f"{topic}: {n} bad records owed a count, {counted[topic]:.0f} counted"
        for topic, n in sorted(owed.items())
        if counted[topic] < n
    ]
