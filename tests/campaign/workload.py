"""What the campaign's worker processes share: the seeded plan of each producer operation,
the message body (a unique message id in every record), the local database (the business
rows behind the product's TransactionBarrier, one SQLite file per producer process) and the
ground truth read back from it.

The plan is pure: ``plan_ops(seed, producer, topics)`` yields the same operations for the same
seed, so a failing run replays. A share of the operations also schedule a timer message
(issue 35) through ``Producer.send``, some recalled at once; those come from a random stream
of their own, so a seed's transactions are what they were before timers joined. Which rows
committed is not planned but read from the databases at the end (a check may win the race,
a send may fail under a fault): the local database is the ground truth, as it is for a user.
"""

from __future__ import annotations

import json
import random
import sqlite3
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from rmq_semantics import LocalTransactionState, Message

# What one operation does (the weights of the mix below):
COMMIT = "commit"  # the local transaction commits and answers COMMIT
ROLLBACK = "rollback"  # it rolls back and answers ROLLBACK
RAISE = "raise"  # the business code raises: rolled back, the answer ROLLBACK
UNKNOWN = "unknown"  # it commits and answers UNKNOW: the back-check decides (COMMIT)
NO_ROW = "no_row"  # it answers UNKNOW without running: the check decides ROLLBACK
SLOW = "slow"  # it commits after outliving transaction_timeout_ms
BAD_PARTITION = "bad_partition"  # a partition the topic lacks: refused at send time
KINDS = {COMMIT: 40, ROLLBACK: 10, RAISE: 4, UNKNOWN: 15, NO_ROW: 4, SLOW: 3, BAD_PARTITION: 4}
# A share of the operations are multi-message transactions (send_transaction).
MULTI_SHARE = 0.25
MULTI_MAX = 4
PAD_MAX = 200
BUSINESS_TABLE = "campaign_rows"
BARRIER_TABLE = "rmq_barrier"
ADMIN_TIMEOUT_S = 30.0
# A partition no workload topic has, for the sends refused at send time.
MISSING_PARTITION = 97

# Timer messages beside the transactions: the share of operations that schedule one, how
# (weights: a time in the past, deliver_after_ms=0, a delay level, a delay, a time ahead),
# and the share of those due 5 s or more ahead that are recalled at once after the send.
TIMER_SHARE = 0.15
TIMER_HOW = {"past": 2, "now": 1, "level": 3, "after": 3, "at": 2}
TIMER_RECALL_SHARE = 0.2
TIMER_RECALL_MIN_MS = 5000
TIMER_PAST_MS = (1000, 30_000)  # how far in the past a "past" one is
# The producers' delay table (RocketMQ 4's first six levels): the producer refuses a table
# whose longest delay is over its max_delay_ms, and the campaign's is minutes.
DELAY_LEVELS = "1s 5s 10s 30s 1m 2m"
DELAY_LEVELS_MS = (1000, 5000, 10_000, 30_000, 60_000, 120_000)


@dataclass(frozen=True)
class PlannedMessage:
    mid: str  # unique in the campaign: <producer>-<op>-<index>
    topic: str
    key: str

    @property
    def message_group(self) -> str | None:
        return message_group_of(self.mid)

    def body(self, pad: int) -> bytes:
        return json.dumps(
            {"mid": self.mid, "key": self.key, "pad": "x" * pad}, separators=(",", ":")
        ).encode()


@dataclass(frozen=True)
class PlannedTimer:
    """One timer message: ``how`` is "at" (``deliver_at_ms`` = the send's wall clock plus
    ``delay_ms``, which may be negative: in the past), "after" (``deliver_after_ms`` =
    ``delay_ms``) or "level" (``delay_time_level`` = ``level``, its delay ``delay_ms``)."""

    mid: str  # <producer>-<op>-t
    topic: str
    key: str
    how: str
    delay_ms: int
    level: int | None = None
    recall: bool = False

    def message(self, now_ms: int, pad: int) -> Message:
        body = PlannedMessage(self.mid, self.topic, self.key).body(pad)
        if self.how == "at":
            return Message(self.topic, body, key=self.key, deliver_at_ms=now_ms + self.delay_ms)
        if self.how == "level":
            return Message(self.topic, body, key=self.key, delay_time_level=self.level)
        return Message(self.topic, body, key=self.key, deliver_after_ms=self.delay_ms)

    def window(self, before_ms: int, after_ms: int) -> tuple[int, int]:
        """Bounds of the ``rmq.deliver_at`` the producer writes for a send that began at
        ``before_ms`` and returned at ``after_ms`` (its own wall clock): exact for "at". The
        producer reads ``int(time.time() * 1000)``, which a float's rounding may put 1 ms
        below the worker's ``time_ns`` reading of the same millisecond."""
        if self.how == "at":
            return before_ms + self.delay_ms, before_ms + self.delay_ms
        return before_ms - 1 + self.delay_ms, after_ms + self.delay_ms


def plan_timer(
    rng: random.Random, mid: str, live: list[str], keys: int, max_s: float
) -> PlannedTimer | None:
    """The timer message of one operation, or None (most operations have none)."""
    if rng.random() >= TIMER_SHARE:
        return None
    topic, key = rng.choice(live), f"k{rng.randrange(keys)}"
    how = rng.choices(list(TIMER_HOW), list(TIMER_HOW.values()))[0]
    level = None
    max_ms = max(1000, int(max_s * 1000))
    if how == "past":
        how, delay = "at", -rng.randint(*TIMER_PAST_MS)
    elif how == "now":
        how, delay = "after", 0
    elif how == "level":
        levels = sum(1 for d in DELAY_LEVELS_MS if d <= max_ms)
        level = rng.randint(1, max(1, levels))
        delay = DELAY_LEVELS_MS[level - 1]
    else:  # "after" or "at": anywhere up to the run's longest timer delay
        delay = rng.randint(1000, max_ms)
    recall = delay >= TIMER_RECALL_MIN_MS and rng.random() < TIMER_RECALL_SHARE
    return PlannedTimer(mid, topic, key, how, delay, level, recall)


@dataclass(frozen=True)
class Op:
    """One producer operation: a transaction of one or more messages and what its local
    transaction does."""

    n: int
    kind: str
    multi: bool
    messages: tuple[PlannedMessage, ...]
    pad: int = 0
    new_topic: str | None = None  # create this topic first, then send to it
    fields: dict = field(default_factory=dict)
    timer: PlannedTimer | None = None  # sent after the transaction, by Producer.send

    def to_kafka(self) -> list[Message]:
        partition = MISSING_PARTITION if self.kind == BAD_PARTITION else None
        return [
            Message(
                m.topic,
                m.body(self.pad),
                key=m.key,
                partition=partition,
                message_group=m.message_group,
            )
            for m in self.messages
        ]

    def describe(self) -> dict:
        return {
            "op": self.n,
            "op_kind": self.kind,
            "multi": self.multi,
            "mids": [m.mid for m in self.messages],
            "topics": [m.topic for m in self.messages],
            "keys": [m.key for m in self.messages],
        }


def plan_ops(
    seed: int,
    producer: str,
    topics: list[str],
    keys: int,
    new_topics: list[tuple[int, str]],
    *,
    timer_max_s: float = 0.0,
) -> Iterator[Op]:
    """The producer's operations, endless; ``new_topics`` are (op number, topic): that op
    creates the topic and sends to it, and later ops use it like the others. With
    ``timer_max_s`` a share of them also schedule a timer message due at most that far
    ahead (0: none)."""
    rng = random.Random(f"{seed}/{producer}")
    timer_rng = random.Random(f"{seed}/{producer}/timer")
    kinds, weights = zip(*KINDS.items(), strict=True)
    live = list(topics)
    creations = dict(new_topics)
    n = 0
    while True:
        kind = rng.choices(kinds, weights)[0]
        new_topic = creations.get(n)
        multi = kind != BAD_PARTITION and rng.random() < MULTI_SHARE
        count = rng.randint(2, MULTI_MAX) if multi else 1
        msgs = []
        for i in range(count):
            topic = new_topic if new_topic and i == 0 else rng.choice(live)
            msgs.append(PlannedMessage(f"{producer}-{n:06d}-{i}", topic, f"k{rng.randrange(keys)}"))
        if new_topic:
            kind = COMMIT  # a new topic is used at once, by a transaction that commits
        timer = (
            plan_timer(timer_rng, f"{producer}-{n:06d}-t", live, keys, timer_max_s)
            if timer_max_s > 0
            else None
        )
        yield Op(n, kind, multi, tuple(msgs), rng.randrange(PAD_MAX), new_topic, timer=timer)
        if new_topic:
            live.append(new_topic)
        n += 1


# -- the local database ---------------------------------------------------------------------
def connect(path: Path | str) -> sqlite3.Connection:
    """A connection in autocommit mode: the barrier begins its own transactions."""
    conn = sqlite3.connect(str(path), timeout=10, isolation_level=None, check_same_thread=False)
    return conn


def create_schema(path: Path | str) -> None:
    from rmq_semantics.barrier import TransactionBarrier

    conn = connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # checks read while a local txn writes
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {BUSINESS_TABLE} (mid TEXT PRIMARY KEY, "
            "txn_id TEXT NOT NULL, topic TEXT NOT NULL, msg_key TEXT, op INTEGER, "
            "kind TEXT, producer TEXT)"
        )
        TransactionBarrier(table=BARRIER_TABLE).create_table(conn)
    finally:
        conn.close()


def business_rows(txn_id: str, op: Op, producer: str) -> list[tuple]:
    return [(m.mid, txn_id, m.topic, m.key, op.n, op.kind, producer) for m in op.messages]


INSERT_SQL = (
    f"INSERT INTO {BUSINESS_TABLE} (mid, txn_id, topic, msg_key, op, kind, producer) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def answer_for(kind: str) -> LocalTransactionState | None:
    """What the business code returns once its rows are written (RAISE raises instead)."""
    if kind == ROLLBACK:
        return LocalTransactionState.ROLLBACK_MESSAGE
    if kind == UNKNOWN:
        return LocalTransactionState.UNKNOW
    return None  # commit


class PlannedFailure(Exception):
    """The business code's planned raise (kind RAISE): the local transaction rolls back."""


def committed_rows(path: Path | str) -> dict[str, dict]:
    """The ground truth of one database: message id -> row, for every business row whose
    barrier row says the local transaction committed."""
    conn = connect(path)
    try:
        rows = conn.execute(
            f"SELECT r.mid, r.txn_id, r.topic, r.msg_key, r.op, r.kind, r.producer, b.reason "
            f"FROM {BUSINESS_TABLE} r LEFT JOIN {BARRIER_TABLE} b ON b.gid = r.txn_id"
        ).fetchall()
    finally:
        conn.close()
    return {
        mid: {
            "mid": mid,
            "txn_id": txn,
            "topic": topic,
            "key": key,
            "op": op,
            "kind": kind,
            "producer": producer,
            "barrier": reason,
        }
        for mid, txn, topic, key, op, kind, producer, reason in rows
    }


def barrier_reason(path: Path | str, txn_id: str) -> str | None:
    """The barrier row's reason of one transaction (None: no row, the local transaction
    never ran)."""
    conn = connect(path)
    try:
        row = conn.execute(
            f"SELECT reason FROM {BARRIER_TABLE} WHERE gid = ?", (txn_id,)
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else row[0]


def intent_of(kind: str) -> str:
    """What the plan means an operation's transaction to end as (history.Intent's values)."""
    return {
        ROLLBACK: "ROLLBACK",
        RAISE: "ROLLBACK",
        UNKNOWN: "UNKNOW_then_COMMIT",
        NO_ROW: "UNKNOW_then_ROLLBACK",
        SLOW: "slow_local_txn",
    }.get(kind, "COMMIT")


def barrier_rows(path: Path | str) -> dict[str, str]:
    """Transaction id -> the barrier row's reason (``msg``: committed, ``rollback``)."""
    conn = connect(path)
    try:
        return dict(conn.execute(f"SELECT gid, reason FROM {BARRIER_TABLE}").fetchall())
    finally:
        conn.close()


# -- topics ---------------------------------------------------------------------------------
def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """Replicated three times with min ISR 2, as a user's production topics would be; an
    existing topic is fine (a restarted worker)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, partitions, 3, config={"min.insync.replicas": "2"}) for t in names],
        operation_timeout=ADMIN_TIMEOUT_S,
        request_timeout=ADMIN_TIMEOUT_S,
    )
    for name, future in futures.items():
        try:
            future.result(ADMIN_TIMEOUT_S)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise RuntimeError(f"creating {name}: {exc}") from exc


def parse_body(value: bytes | str | None) -> dict:
    """A workload record's body; {} when it is not one (the checker counts those)."""
    if value is None:
        return {}
    try:
        body = json.loads(value)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


# -- what the consumers' listeners do ---------------------------------------------------------
def _bucket(mid: str, salt: str, modulo: int) -> int:
    return zlib.crc32(f"{salt}/{mid}".encode()) % modulo


def push_fails(mid: str, reconsume_times: int) -> bool:
    """The push listener's seeded answer: 1 in 10 messages fails its first delivery
    (retried), 1 in 40 fails every time (dead-lettered after max_reconsume_times)."""
    if _bucket(mid, "push-always", 40) == 0:
        return True
    return reconsume_times == 0 and _bucket(mid, "push-once", 10) == 0


def push_dead_letter_expected(mid: str) -> bool:
    return _bucket(mid, "push-always", 40) == 0


def orderly_suspends(mid: str, reconsume_times: int) -> bool:
    """The orderly listeners suspend 1 in 25 messages once (retried in place)."""
    return reconsume_times == 0 and _bucket(mid, "orderly-once", 25) == 0


# -- the SimpleConsumer lane (issue 36) --------------------------------------------------------
# Three in four transactional messages carry a message group (placed by it, ordered by it);
# the rest none. Drawn from the message id, not the plan's random stream: a seed's
# transactions stay what they were.
MESSAGE_GROUPS = 5
SIMPLE_POISON = "poison"  # never acked: dead-lettered after max_delivery_attempts
SIMPLE_ONCE = "once"  # its first delivery not acked: back after its invisible duration
SIMPLE_CHANGE = "change"  # change_invisible_duration first, then acked
SIMPLE_ACK = "ack"


def message_group_of(mid: str) -> str | None:
    """The message group of a planned message (None for one in four)."""
    bucket = _bucket(mid, "message-group", 4 * MESSAGE_GROUPS)
    return None if bucket < MESSAGE_GROUPS else f"g{bucket % MESSAGE_GROUPS}"


def simple_fate(mid: str, attempt: int) -> str:
    """What the SimpleConsumer worker does with a delivery: 1 in 30 messages is never
    acked, 1 in 8 not at its first delivery, 1 in 10 has its invisible duration changed
    before the ack."""
    if _bucket(mid, "simple-poison", 30) == 0:
        return SIMPLE_POISON
    if attempt <= 1 and _bucket(mid, "simple-once", 8) == 0:
        return SIMPLE_ONCE
    return SIMPLE_CHANGE if _bucket(mid, "simple-change", 10) == 0 else SIMPLE_ACK


def simple_dead_letter_expected(mid: str) -> bool:
    return simple_fate(mid, 1) == SIMPLE_POISON
