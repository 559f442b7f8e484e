"""The fuzzer's unit part (issue 12): thousands of random and mutated system records through
the parsers, the coordinator's transaction service (simulated Kafka, real code), the lock
table, the producer's check worker and the orderly queue, in a few seconds.

Seeds are fixed (reproducible CI); ``RMQ_FUZZ_SEED=N`` replays or varies them and
``RMQ_FUZZ_SEED=random`` draws one. A failing test prints its seed. Categories today's code
fails on (``categories.KNOWN_BAD``) are strict xfails: once a fix makes one pass, remove
its ``known_bad`` text and the test holds the fix.
"""

from __future__ import annotations

import base64
import contextlib
import os
import queue
import random
import threading
import zlib
from collections import Counter
from dataclasses import replace

import pytest

from coordinator.lock import LeaseCeiling, LockTable, RequestPoison
from coordinator.lock_auth import LockGuard
from coordinator.lock_requests import Partitions, answer
from coordinator.timer_wheel import TOO_FAR_GRACE_MS
from rmq_semantics.check_pool import CheckJob
from rmq_semantics.errors import ConfigError, MalformedRecordError
from rmq_semantics.orderly.api import OrderlyMessage
from rmq_semantics.orderly.queue import QueuePhase, QueueState
from rmq_semantics.records.codec import (
    RECORD_CLASSES,
    RecordType,
    decode,
    decode_as,
    decode_lock_state,
    decode_timer_cancel,
    encode,
)
from rmq_semantics.records.group_auth import derive_consumer_group_key, sign_lock_request
from rmq_semantics.records.half import parse_half
from rmq_semantics.records.headers import H
from rmq_semantics.records.locks import LockEntry, LockKey, LockRequest, LockState, RequestKind
from rmq_semantics.records.timer import parse_timer, unparsed_timer
from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.simple.engine import PartitionEngine
from rmq_semantics.simple.leases import Lease, decode_leases, encode_leases
from rmq_semantics.simple.leases import compose_metadata as compose_lease_metadata
from rmq_semantics.simple.leases import split_metadata as split_lease_metadata
from rmq_semantics.topics import is_system_topic
from rmq_semantics.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
)
from tests.fuzz import generators as gen
from tests.fuzz.categories import (
    CATEGORIES,
    CHECK,
    DELIVERED,
    HALF,
    LOCK_REQUEST,
    OP,
    TIMER,
    TIMER_CANCEL,
    TIMER_LEVEL,
    cases,
    select,
)
from tests.fuzz.sim import Message as SimMessage
from tests.fuzz.sim import fuzz

# The lock service's tenant key in the isolation test (the fuzzer's forgeries use another).
FUZZ_ISOLATION_KEY = b"the coordinators' tenant key of the fuzz test"
# Enough for thousands of records per test, within the few seconds `make test` allows.
RECORDS = 3000


def _seed(name: str) -> int:
    base = os.environ.get("RMQ_FUZZ_SEED", "12")
    if base == "random":
        base = str(random.SystemRandom().randrange(2**32))
    return (int(base) + zlib.crc32(name.encode())) % 2**32


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    seed = _seed(request.node.name)
    # Captured output is shown for a failing test: the seed that reproduces it.
    print(
        f"fuzz seed {seed} (test {request.node.name}; base RMQ_FUZZ_SEED="
        f"{os.environ.get('RMQ_FUZZ_SEED', '12')})"
    )
    return random.Random(seed)


def _known_bad(categories: list) -> list:
    return [
        pytest.param(c, id=c.name, marks=pytest.mark.xfail(strict=True, reason=c.known_bad))
        if c.known_bad
        else pytest.param(c, id=c.name)
        for c in categories
    ]


# -- the house rule: every record type and header has a generator ---------------------------
def test_every_record_type_has_a_generator_and_round_trips(rng):
    assert set(gen.VALID) == set(RecordType), "a RecordType without a generator in VALID"
    ctx = gen.Ctx()
    for record_type, build in gen.VALID.items():
        record = build(rng, ctx)
        assert isinstance(record, RECORD_CLASSES[record_type])
        assert decode(encode(record)) == record


def test_every_header_has_a_generator():
    missing = gen.header_names() - set(gen.HEADER_VALUES)
    assert not missing, f"rmq.* headers without a generator in HEADER_VALUES: {missing}"


def test_every_category_makes_records_for_its_topic(rng):
    ctx = gen.Ctx(targets=((0, 3, "t"),))
    for category in CATEGORIES:
        case = category.make(rng, ctx)
        assert case.category == category.name and case.topic == category.topic
        assert case.records and all(isinstance(r, gen.Raw) for r in case.records)


# -- parsers: nothing but MalformedRecordError ----------------------------------------------
def _payloads(rng: random.Random, n: int) -> list[bytes | None]:
    ctx = gen.Ctx(targets=((0, 3, "t"),))
    out: list[bytes | None] = []
    for case in cases(rng, ctx, select(), n // 2):
        out += [r.value for r in case.records]
    while len(out) < n:
        record_type = gen.pick(rng, list(RecordType))
        data = gen.valid_bytes(rng, ctx, record_type)
        mutate = gen.pick(
            rng,
            [
                *gen.BREAKING,
                gen.huge_length,
                gen.flipped,
                lambda r, d: gen.relabelled(r, d, gen.pick(r, list(RecordType))),
                lambda r, d, t=record_type: gen.corrupted(r, gen.VALID[t](r, ctx)),
            ],
        )
        out.append(mutate(rng, data))
    return out


def test_decoders_raise_nothing_but_malformed_record_error(rng):
    escaped = []
    for data in _payloads(rng, RECORDS):
        key = gen.pick(rng, [None, b"g/t/0", gen.some_bytes(rng)])
        calls = [
            lambda d=data: decode(d),
            lambda d=data, k=key: decode_lock_state(k, d),
            lambda d=data, k=key: decode_timer_cancel(k, d),
            *(lambda d=data, c=cls: decode_as(c, d) for cls in set(RECORD_CLASSES.values())),
        ]
        for call in calls:
            try:
                call()
            except MalformedRecordError:
                pass
            except Exception as exc:
                escaped.append(f"{type(exc).__name__}: {exc} <- {(data or b'')[:40].hex()}")
    assert not escaped, f"{len(escaped)} escaped, e.g. {escaped[:5]}"


def test_breaking_mutations_are_always_malformed(rng):
    ctx = gen.Ctx()
    decoded = []
    for _ in range(RECORDS):
        data = gen.valid_bytes(rng, ctx, gen.pick(rng, list(RecordType)))
        mutate = gen.pick(rng, gen.BREAKING)
        with contextlib.suppress(MalformedRecordError):
            decoded.append((mutate.__name__, decode(mutate(rng, data))))
    assert not decoded, decoded[:5]


def test_parse_half_raises_nothing_but_malformed_record_error(rng):
    ctx = gen.Ctx()
    halves = [c for c in select() if c.topic == HALF]
    escaped, parsed = [], 0
    for case in cases(rng, ctx, halves, RECORDS):
        raw = case.records[0]
        headers = raw.headers
        if headers and rng.random() < 0.3:  # and some headers at random on top
            name = gen.pick(rng, sorted(gen.HEADER_VALUES))
            headers = gen.set_header(headers, name, gen.HEADER_VALUES[name](rng, ctx))
        try:
            half = parse_half(0, 7, ctx.now_ms, raw.key, raw.value, headers)
            parsed += 1
            assert isinstance(half.txn_id, str) and isinstance(half.born_ts, int)
        except MalformedRecordError:
            pass
        except Exception as exc:
            escaped.append(f"{case.category}: {type(exc).__name__}: {exc}")
    assert not escaped, f"{len(escaped)} escaped, e.g. {escaped[:5]}"
    assert parsed, "no generated half record parsed at all"


def test_parse_timer_raises_nothing_but_malformed_record_error_with_a_reason(rng):
    """Timer records as a producer writes them, each header set to an odd value, dropped,
    or given twice: parsed (intake or level) or malformed with where and why, and
    ``unparsed_timer`` reads whatever was refused."""
    ctx = gen.Ctx()
    escaped, parsed, malformed = [], 0, 0
    for _ in range(RECORDS):
        raw, _ = gen.valid_timer(rng, ctx, group=gen.pick(rng, [None, ctx.group]))
        headers = list(raw.headers or [])
        for _ in range(rng.randrange(3)):
            name = gen.pick(rng, sorted(gen.HEADER_VALUES))
            how = rng.randrange(3)
            if how == 0:
                headers = gen.set_header(headers, name, gen.HEADER_VALUES[name](rng, ctx))
            elif how == 1:
                headers = [h for h in headers if h[0] != name]
            else:
                headers.append((name, gen.HEADER_VALUES[name](rng, ctx)))
        level = gen.pick(rng, [0, 0, 1, 18])
        if level and rng.random() < 0.8:
            headers = gen.set_header(headers, H.TIMER_ORIGIN, b"7")
        key, value = gen.pick(rng, [raw.key, None, gen.not_utf8(rng)]), raw.value
        try:
            record = parse_timer(level, 1, 9, ctx.now_ms, key, value, headers)
            parsed += 1
            assert isinstance(record.deliver_at_ms, int) and record.timer_id
            record.delivered_headers(ctx.now_ms)
        except MalformedRecordError as exc:
            malformed += 1
            where = "timer" if level == 0 else f"timer_{level}"
            if not str(exc).startswith(f"{where}[1]@9: "):
                escaped.append(f"no where in {exc}")
            unparsed_timer(level, 1, 9, ctx.now_ms, key, value, headers)
        except Exception as exc:
            escaped.append(f"{type(exc).__name__}: {exc}")
    assert not escaped, f"{len(escaped)} escaped, e.g. {escaped[:5]}"
    assert parsed and malformed, (parsed, malformed)


def test_each_timer_case_is_owed_what_the_wire_contract_says(rng):
    """What the coordinator run expects of each forged timer record (delivered, or its
    discard reason) agrees with the pure parser and the refusals the contract names (a
    system real topic, a time beyond max_delay_ms); a bad cancel never decodes, a cancel of
    another group always does. Guards the fuzzer's expectations, not the coordinator."""
    ctx = gen.Ctx(prefix="fz", timer_targets=("t1",))
    wrong = []
    for category in [c for c in CATEGORIES if c.topic in (TIMER, TIMER_LEVEL, TIMER_CANCEL)]:
        for _ in range(200):
            case = category.make(rng, ctx)
            for raw in case.records:
                if category.topic == TIMER_CANCEL:
                    try:
                        decode_timer_cancel(raw.key, raw.value)
                        got = DELIVERED
                    except MalformedRecordError:
                        got = "malformed"
                    want = "malformed" if category.counted else DELIVERED
                else:
                    level = 1 if category.topic == TIMER_LEVEL else 0
                    want = case.timer_outcomes[raw.value][0]
                    got = _timer_verdict(ctx, level, raw)
                if got != want:
                    wrong.append((category.name, got, want, raw.headers))
    assert not wrong, wrong[:3]


def _timer_verdict(ctx: gen.Ctx, level: int, raw: gen.Raw) -> str:
    try:
        record = parse_timer(level, 0, 5, ctx.now_ms, raw.key, raw.value, raw.headers)
    except MalformedRecordError:
        return "malformed"
    if is_system_topic(record.real_topic, ctx.prefix):
        return "system_topic"
    beyond = ctx.timer_max_delay_ms + TOO_FAR_GRACE_MS
    if (level == 0 and record.exceeds(ctx.timer_max_delay_ms)) or (
        record.deliver_at_ms - ctx.now_ms > beyond
    ):
        return "too_far"
    return DELIVERED


# -- the transaction service: never raises; good transactions decided exactly once ----------
@pytest.mark.parametrize("category", _known_bad([c for c in CATEGORIES if c.topic in (HALF, OP)]))
def test_the_transaction_service_survives_each_category(rng, category):
    """60 records of one category among 40 good transactions: once quiet (every counted
    record must move a counter), once with restarts and aborted commits."""
    _, quiet = fuzz(rng, [category], 60, good=40, chaos=False)
    _, chaos = fuzz(rng, [category], 60, good=40, chaos=True)
    assert not quiet and not chaos, (quiet + chaos)[:10]


def test_the_transaction_service_survives_every_safe_category_mixed(rng):
    safe = [c for c in select(safe=True) if c.topic in (HALF, OP)]
    sim, violations = fuzz(rng, safe, RECORDS // 5, good=RECORDS // 20, chaos=True)
    assert not violations, violations[:10]
    assert sim.restarts and len(sim.good) == RECORDS // 20


def test_two_promotion_sets_decide_every_good_transaction_once_through_aborts(rng):
    """Each set its own Kafka transaction over its own half partition, commits failing and
    the coordinator restarting: still every good transaction decided once, nothing else."""
    safe = [c for c in select(safe=True) if c.topic in (HALF, OP)]
    sim, violations = fuzz(rng, safe, RECORDS // 10, good=RECORDS // 10, chaos=True, sets=2)
    assert not violations, violations[:10]
    assert len(sim.good) == RECORDS // 10


# -- the producer's back-check worker -------------------------------------------------------
class _Listener(TransactionListener):
    def __init__(self) -> None:
        self.sentinel = threading.Event()

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        if msg.value == b"sentinel":
            self.sentinel.set()
        return LocalTransactionState.UNKNOW


@pytest.mark.parametrize(
    "category", _known_bad(select(only=[c.name for c in CATEGORIES if c.topic == CHECK]))
)
def test_the_check_worker_survives_any_check_request(rng, category):
    """Check requests of each kind, then one the listener recognises: it must be answered."""
    ctx = gen.Ctx()
    listener = _Listener()
    producer = TransactionProducer(
        {"bootstrap.servers": "unused:9092"}, producer_group=ctx.group, listener=listener
    )
    answers: queue.Queue = queue.Queue()
    producer._send_end = lambda result, state, **kw: answers.put(state)  # no Kafka here
    checks = []
    for case in cases(rng, ctx, [category], 200):
        with contextlib.suppress(MalformedRecordError):
            checks.append(decode_as(CheckRequest, case.records[0].value))
    sentinel = replace(gen.VALID[RecordType.CHECK_REQUEST](rng, ctx), value=b"sentinel")
    pool = producer._checks._pool  # one worker: a request that killed it would stop the rest
    pool._threads = 1
    pool.start()
    try:
        for offset, check in enumerate([*checks, sentinel]):
            assert pool.submit(CheckJob(check, "__rmq_check", 0, offset))
        assert listener.sentinel.wait(10), (
            f"the check worker stopped answering after {answers.qsize()} of {len(checks)} "
            f"{category.name} checks"
        )
    finally:
        pool.stop(5)


# -- the lock table -------------------------------------------------------------------------
LEASE_CEILING_MS = 60_000


def test_the_lock_table_decides_any_request_and_keeps_its_rules(rng):
    """Lock requests of every lock category, decided as the lock service does; lock-state
    records of every kind restored in between. Epochs never go down, one holder at most."""
    n = 4
    ctx = gen.Ctx(partitions=n)
    tables = {p: LockTable() for p in range(n)}
    epochs: dict = {}
    now = ctx.now_ms
    broken = []
    locks = [c for c in CATEGORIES if c.topic == LOCK_REQUEST]
    for case in cases(rng, ctx, locks, RECORDS // 3):
        now += gen.pick(rng, [0, 1, 100, 30_000, 120_000])
        if rng.random() < 0.2:  # and valid requests for the keys lock states are about
            request = gen.VALID[RecordType.LOCK_REQUEST](rng, ctx)
            p = request.queues[0].key(request.group).request_partition(n)
            case.records.append(gen.Raw(encode(request), partition=p))
        for raw in case.records:
            p = raw.partition if raw.partition is not None else 0
            try:
                request = decode_as(LockRequest, raw.value)
            except MalformedRecordError:
                continue
            table = tables[p]
            for ref in request.queues:
                key = ref.key(request.group)
                if key.request_partition(n) != p:
                    continue  # the service answers "misrouted"
                lease = (
                    min(request.lease_ms, LEASE_CEILING_MS)
                    if request.lease_ms > 0
                    else LEASE_CEILING_MS
                )
                try:
                    if request.kind is RequestKind.LOCK:
                        decision = table.lock(key, request.client_id, lease, now)
                    else:
                        decision = table.unlock(key, request.client_id, now, ref.epoch)
                except ConfigError:
                    continue  # the service answers "invalid"
                entry = table.get(key)
                if decision.entry is not None:
                    try:  # the service persists it to the lock topic
                        encode(decision.entry)
                    except Exception as exc:
                        broken.append(f"{key}: the decided entry does not encode: {exc!r}")
                if entry.epoch < epochs.get(key, 0):
                    broken.append(f"{key}: epoch went down to {entry.epoch}")
                epochs[key] = entry.epoch
                if (
                    decision.granted
                    and request.kind is RequestKind.LOCK
                    and not entry.held_by(request.client_id, now)
                ):
                    broken.append(f"{key}: granted to {request.client_id}, not held")
                if (
                    not decision.granted
                    and decision.reason == "held_by_other"
                    and (entry.client_id == request.client_id or not entry.live(now))
                ):
                    broken.append(f"{key}: denied with no other live holder")
        if rng.random() < 0.1:  # a lock-state record, maybe corrupted, read on a takeover
            state = gen.VALID[RecordType.LOCK_STATE](rng, ctx)
            data = gen.pick(
                rng, [encode(state), gen.corrupted(rng, state), gen.truncated(rng, encode(state))]
            )
            try:
                entry = decode_lock_state(None, data)
            except MalformedRecordError:
                continue
            if gen.INT64_MAX in (entry.epoch, entry.lease_ms, entry.expires_at_ms):
                continue  # the next grant overflows: see the test below
            table = tables[entry.key.request_partition(n)]
            known = any(e.key == entry.key for e in table)
            before = table.get(entry.key).epoch
            # As the service restores one on a takeover (its own lease, else the setting).
            table.restore(entry, now, entry.lease_ms or LEASE_CEILING_MS)
            if known and table.get(entry.key).epoch < before:
                broken.append(f"{entry.key}: restore took the epoch down")
            epochs[entry.key] = table.get(entry.key).epoch
    assert not broken, broken[:10]
    assert any(isinstance(e, LockEntry) for t in tables.values() for e in t), "nothing granted"


def test_under_isolation_no_lock_request_without_its_groups_mac_changes_a_lock(rng):
    """Requests of every lock category (unsigned, of before v3, garbage MACs, MACs under
    another key or group) decided by the lock service's own code under tenant isolation,
    between signed requests of one group: only the signed group's locks ever change, and
    every unsigned request that is answered is refused as unauthenticated (issue 44)."""
    n = 4
    ctx = gen.Ctx(partitions=n)
    guard = LockGuard(FUZZ_ISOLATION_KEY)
    key = derive_consumer_group_key(FUZZ_ISOLATION_KEY, "fuzz-signed")
    tables: dict[int, LockTable] = {}
    counts: Counter[str] = Counter()
    locks = [c for c in CATEGORIES if c.topic == LOCK_REQUEST]
    batch, signed = [], 0
    for case in cases(rng, ctx, locks, RECORDS // 3):
        records = list(case.records)
        if rng.random() < 0.2:
            request = replace(gen.VALID[RecordType.LOCK_REQUEST](rng, ctx), group="fuzz-signed")
            p = request.queues[0].key(request.group).request_partition(n)
            request = sign_lock_request(key, "fuzz_lock_request", p, request)
            records.append(gen.Raw(encode(request), partition=p))
            signed += 1
        for raw in records:
            p = raw.partition if raw.partition is not None else 0
            batch.append(SimMessage("fuzz_lock_request", p, len(batch), raw, ctx.now_ms))
    answered = answer(
        batch,
        tables,
        Partitions(n, n),
        LeaseCeiling(60_000),
        RequestPoison(3),
        ctx.now_ms,
        lambda event: counts.update([event]),
        guard,
    )
    changed = {e.key.group for t in answered.staged.values() for e in t}
    assert changed <= {"fuzz-signed"}, sorted(changed)[:10]
    assert changed, "no signed request was granted"
    refused = [
        reply
        for _, reply in answered.replies
        if any(r.reason == "unauthenticated" for r in reply.results)
    ]
    # Refused requests naming no existing reply partition are counted, not answered.
    assert counts["unauthenticated"] >= len(refused) > 0
    assert all(r.reason == "unauthenticated" for reply in refused for r in reply.results)
    assert counts["requests"] >= signed + counts["unauthenticated"]


def test_a_lock_state_at_the_largest_epoch_is_refused_as_malformed_or_still_encodes():
    """A lock-state record whose epoch is the long maximum (only a forged record gets
    there) must neither make the next grant's epoch unencodable nor stop the service."""
    key = LockKey("g", "t", 0)
    now = 1_700_000_000_000
    state = LockEntry(
        key, LockState.HELD, "old", gen.INT64_MAX, 30_000, now - 1000, now + 1000, now - 1000
    )
    with pytest.raises(MalformedRecordError, match=r"epoch .* is out of range"):
        decode_lock_state(key.record_key(), encode(state))
    table = LockTable()
    table.restore(
        decode_lock_state(key.record_key(), encode(replace(state, epoch=2**62))),
        now,
        state.lease_ms or LEASE_CEILING_MS,
    )
    decisions = [table.lock(key, "new", 30_000, now + 10**12), table.expire(key, now + 10**12)]
    for decision in decisions:
        if decision.entry is not None:
            encode(decision.entry)


# -- the orderly queue: any lock answer and committed offset --------------------------------
def test_the_orderly_queue_takes_any_lock_answer_and_committed_offset(rng):
    broken = []
    for _ in range(RECORDS // 10):
        q = QueueState(("t", 0))
        now = 1000.0
        for _ in range(30):
            now += gen.pick(rng, [0.0, 0.01, 5.0, 100.0])
            epoch = gen.pick(rng, [q.epoch, q.epoch + 1, -1, 0, gen.INT64_MAX, gen.INT64_MIN])
            offset = gen.pick(rng, [-1001, -1, 0, 5, 10**12, gen.INT64_MAX])
            action = gen.pick(
                rng,
                [
                    "grant",
                    "grant",
                    "deny",
                    "align",
                    "align",
                    "align_failed",
                    "add",
                    "batch",
                    "processed",
                    "revoke",
                    "lose",
                    "drop",
                ],
            )
            if action == "grant":
                q.grant(epoch, now + gen.pick(rng, [-1.0, 0.0, 30.0, 1e12]))
            elif action == "deny":
                q.deny()
            elif action == "align":
                q.align(epoch, offset)
            elif action == "align_failed":
                q.align_failed()
            elif action == "add":
                q.add(
                    [
                        OrderlyMessage("t", 0, o, None, b"v", (), 0)
                        for o in sorted(rng.sample(range(0, 50), 5))
                    ]
                )
            elif action == "batch":
                q.next_batch(gen.pick(rng, [0, 1, 10]))
            elif action == "processed" and q.inflight:
                q.processed(q.inflight[-1].offset + 1, q.epoch)
            elif action == "revoke":
                q.revoke()
            elif action == "lose":
                q.lose()
            elif action == "drop" and q.phase is QueuePhase.REVOKING:
                q.drop()
            if q.may_commit(epoch, now) is None and not (
                epoch == q.epoch and q.held and now < q.deadline and q.phase is not QueuePhase.LOST
            ):
                broken.append(f"commit allowed for epoch {epoch} in {q.phase} after {action}")
            if q.runnable(now) and q.phase is not QueuePhase.ALIGNED:
                broken.append(f"runnable in {q.phase}")
    assert not broken, broken[:10]


def _lease_metadata(rng: random.Random, committed: int) -> str:
    """A commit metadata with a lease field: valid, mutated, truncated or garbage."""
    leases = {
        committed + gap: Lease(gen.pick(rng, [1, 2, 16, (1 << 14) - 1]), gen.pick(rng, [0, 10**13]))
        for gap in rng.sample(range(0, 300), rng.randrange(1, 20))
    }
    field = encode_leases(committed, gen.pick(rng, [0, 1_700_000_000_000]), leases)
    kind = gen.pick(rng, ["valid", "flip", "cut", "swap", "garbage", "forged"])
    if kind == "flip":
        i = rng.randrange(len(field))
        field = field[:i] + rng.choice("09azAZ-_.|=") + field[i + 1 :]
    elif kind == "cut":
        field = field[: rng.randrange(len(field))]
    elif kind == "swap":
        field = field.replace(f".{committed}.", f".{committed + 1}.", 1)
    elif kind == "garbage":
        field = "rmqlease1." + gen.some_text(rng)
    elif kind == "forged":  # a well-formed field whose entries are out of every range
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        b64 = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        field = f"rmqlease1.{committed}.0.b{b64}.{zlib.crc32(raw):08x}"
    return compose_lease_metadata(gen.pick(rng, ["", "rmqdone1.x"]), field, "c:1")


def test_the_lease_engine_restores_from_any_commit_metadata(rng):
    """Any lease field (the group's commit is untrusted input): decoded or refused with a
    ValueError; a restored engine then hands out every record, never an attempt below 1."""
    broken = []
    for _ in range(RECORDS // 3):
        committed = gen.pick(rng, [0, 7, 10**12])
        metadata = _lease_metadata(rng, committed)
        _, field, _ = split_lease_metadata(metadata)
        try:
            leases = decode_leases(field, committed)
        except ValueError:
            leases = {}
        except Exception as exc:  # the finding: any other exception
            broken.append(f"{type(exc).__name__} on {metadata[:80]!r}")
            continue
        if any(o < committed or lease.attempts < 1 for o, lease in leases.items()):
            broken.append(f"entry below the commit or without attempts: {metadata[:80]!r}")
        try:
            engine = PartitionEngine.restore("t", 0, committed, metadata)
            for offset in range(committed, committed + 5):
                engine.offer(offset, None, 2_000_000_000_000)
            out = engine.receive(10, 2_000_000_000_000, 1000)
        except Exception as exc:  # the finding: any exception
            broken.append(f"restore: {type(exc).__name__} {exc} on {metadata[:80]!r}")
            continue
        dead = {d.offset for d in engine.take_dead_letters(2_000_000_000_000)}
        if {d.receipt.offset for d in out} | dead != set(range(committed, committed + 5)):
            broken.append(f"records held back after a restore from {metadata[:80]!r}")
    assert not broken, broken[:10]
