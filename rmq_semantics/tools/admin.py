"""``rmq-semantics txn pending|discarded|redrive``: look into the coordinator's topics.

Pending transactions are rebuilt exactly as a new coordinator owner would: each half/op
partition pair is read from the coordinator group's committed offsets to its end and fed
into the same :class:`coordinator.state.PartitionState`.


Over 500 physical lines only since ``ruff format`` (one argument a line; under 500 as the
layering test counts them), and kept whole: the ``txn`` admin commands (``pending``,
``discarded``, ``redrive``) share one reader of the system topics and one view of their
records, and ``redrive`` is the listing plus its write-back."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from dataclasses import dataclass, replace

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from rich.console import Console
from rich.table import Table

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.consumed import headers_of
from rmq_semantics.errors import (
    ConfigError,
    FatalKafkaError,
    KafkaOperationError,
    MalformedRecordError,
    RmqError,
    RmqTimeoutError,
)
from rmq_semantics.message import produce_headers
from rmq_semantics.producer import DeliveryWaiter, producer_defaults
from rmq_semantics.records.codec import decode
from rmq_semantics.records.half import parse_half
from rmq_semantics.records.headers import DISCARD_HEADERS, H
from rmq_semantics.records.reasons import NOT_REDRIVABLE, DiscardReason
from rmq_semantics.records.txn import DoneMarker, DoneMarkers, Outcome
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemTopics,
    topic_partition_count,
)

__all__ = [
    "DiscardedTxn",
    "PendingTxn",
    "list_discarded",
    "list_pending",
    "redrive",
    "register_cli",
]

# Reading a partition to its end on a local broker takes well under this.
READ_TIMEOUT_S = 60.0
# A re-drive's Kafka transaction is a few records; a run killed inside one holds back the
# coordinator's read_committed half reader this long at most (the next run aborts it at once).
REDRIVE_TXN_TIMEOUT_MS = 10000
# What a producer whose transactional id a later run took over is told.
FENCED = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)


@dataclass(frozen=True)
class PendingTxn:
    txn_id: str
    real_topic: str
    producer_group: str
    age_s: float
    checks_issued: int
    checks_answered: int
    half_partition: int
    half_offset: int


@dataclass(frozen=True)
class DiscardedTxn:
    txn_id: str
    real_topic: str
    producer_group: str
    check_count: int
    reason: str  # a DiscardReason word (free text in discards written before them)
    age_s: float
    discard_offset: int
    record: confluent_kafka.Message
    half_partition: int | None = None
    half_offset: int | None = None
    late_commit: bool = False  # a COMMIT for it came after it was discarded
    # A multi-message transaction: its members' discard copies (index order), and how many
    # members it has (rmq.txn_size). One discard copy per member read.
    members: tuple[confluent_kafka.Message, ...] = ()
    size: int = 1
    discarded_ms: int = 0

    @property
    def count(self) -> str:
        """Members set aside / members in the transaction (``1/1`` for a single message)."""
        return f"{len(self.members) or 1}/{self.size}"

    @property
    def complete(self) -> bool:
        return (len(self.members) or 1) == self.size

    @property
    def status(self) -> str:
        """The reason, and ``late_commit`` when its producer committed too late."""
        return f"{self.reason}, {DiscardReason.LATE_COMMIT}" if self.late_commit else self.reason


def _reader(conf: dict, group: str) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer(
        {
            **shared_conf(conf),
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )


def _read_to_eof(consumer: confluent_kafka.Consumer, tps: list[TopicPartition]):
    """Yield records of the assigned partitions until each reported its end."""
    consumer.assign(tps)
    waiting = {(tp.topic, tp.partition) for tp in tps}
    deadline = time.monotonic() + READ_TIMEOUT_S
    while waiting:
        if time.monotonic() > deadline:
            raise RmqTimeoutError(
                f"could not read {sorted(waiting)} to the end within {READ_TIMEOUT_S:.0f} s"
            )
        for msg in consumer.consume(1000, 0.5):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    waiting.discard((msg.topic(), msg.partition()))
                elif err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise RmqError(f"{msg.topic()} does not exist (is the prefix right?)")
                continue
            yield msg


def list_pending(conf: dict, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> list[PendingTxn]:
    # The coordinator's own state machine, so the answer is what a new owner would rebuild.
    from coordinator.state import PartitionState

    topics = SystemTopics(topic_prefix)
    partitions = topic_partition_count(conf, topics.half)
    if partitions is None:
        return []
    consumer = _reader(conf, topics.coordinator_group)
    out: list[PendingTxn] = []
    now_ms = int(time.time() * 1000)
    try:
        tps = [TopicPartition(t, p) for p in range(partitions) for t in (topics.half, topics.op)]
        committed = consumer.committed(tps, timeout=READ_TIMEOUT_S)
        states = {p: PartitionState(p, 1, 1, 1 << 30) for p in range(partitions)}
        start = [
            TopicPartition(
                tp.topic,
                tp.partition,
                tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING,
            )
            for tp in committed
        ]
        for tp in committed:
            offset = max(tp.offset, 0)
            states[tp.partition].start_at(
                *((offset, 0) if tp.topic == topics.half else (0, offset))
            )
        for msg in _read_to_eof(consumer, start):
            state = states[msg.partition()]
            if msg.topic() == topics.half:
                try:
                    half = parse_half(
                        msg.partition(),
                        msg.offset(),
                        msg.timestamp()[1],
                        msg.key(),
                        msg.value(),
                        msg.headers(),
                    )
                except MalformedRecordError:
                    half = None
                state.on_half(msg.offset(), half, now_ms)
                continue
            try:
                record = decode(msg.value())
            except MalformedRecordError:
                continue
            state.on_op_marker(msg.offset(), record)
        for p, state in states.items():
            for entry in state.pending.values():
                half = entry.half
                out.append(
                    PendingTxn(
                        half.txn_id,
                        half.real_topic,
                        half.producer_group,
                        (now_ms - half.born_ts) / 1000,
                        entry.checks_issued,
                        entry.checks_answered,
                        p,
                        half.offset,
                    )
                )
    finally:
        consumer.close()
    return sorted(out, key=lambda t: -t.age_s)


def _number(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def list_discarded(conf: dict, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> list[DiscardedTxn]:
    """Discarded transactions, the latest discard per transaction id (per half offset for
    records without one), each marked when a COMMIT for it came too late."""
    topics = SystemTopics(topic_prefix)
    partitions = topic_partition_count(conf, topics.discard)
    if partitions is None:
        return []
    consumer = _reader(conf, f"{topics.prefix}_admin")
    latest: dict[str, DiscardedTxn] = {}
    # Members of one discard share the transaction id and rmq.discarded_ts (promote.py).
    groups: dict[tuple[str, int], list[DiscardedTxn]] = {}
    late: set[tuple[str, int | None, int | None]] = set()
    now_ms = int(time.time() * 1000)
    try:
        tps = [
            TopicPartition(topics.discard, p, confluent_kafka.OFFSET_BEGINNING)
            for p in range(partitions)
        ]
        for msg in _read_to_eof(consumer, tps):
            headers = {k: (v or b"").decode(errors="replace") for k, v in msg.headers() or []}
            txn_id = headers.get(H.TXN_ID, "")
            where = (_number(headers.get(H.HALF_PARTITION)), _number(headers.get(H.HALF_OFFSET)))
            reason = headers.get(H.DISCARD_REASON, "")
            if reason == DiscardReason.LATE_COMMIT:
                late.add((txn_id, *where))
                continue
            if not txn_id and where[1] is None:
                continue
            discarded_ms = _number(headers.get(H.DISCARDED_TS)) or now_ms
            found = DiscardedTxn(
                txn_id,
                headers.get(H.REAL_TOPIC, "?"),
                headers.get(H.PRODUCER_GROUP, "?"),
                int(headers.get(H.CHECK_COUNT, "0") or 0),
                reason,
                (now_ms - discarded_ms) / 1000,
                msg.offset(),
                msg,
                *where,
                size=_number(headers.get(H.TXN_SIZE)) or 1,
                discarded_ms=discarded_ms,
            )
            if found.size > 1 and txn_id:
                groups.setdefault((txn_id, discarded_ms), []).append(found)
            else:
                latest[txn_id or f"{where[0]}:{where[1]}"] = found
    finally:
        consumer.close()
    for copies in groups.values():
        whole = _one_line(copies)
        if whole.txn_id not in latest or latest[whole.txn_id].discarded_ms <= whole.discarded_ms:
            latest[whole.txn_id] = whole
    return [
        replace(t, late_commit=True) if (t.txn_id, t.half_partition, t.half_offset) in late else t
        for t in latest.values()
    ]


def _member_index(copy: DiscardedTxn) -> int:
    index: bytes = dict(headers_of(copy.record)).get(H.TXN_INDEX, b"")  # type: ignore[assignment]  # not null
    return _number(index.decode()) or 0


def _one_line(copies: list[DiscardedTxn]) -> DiscardedTxn:
    """The discard copies of one multi-message transaction's members as one transaction:
    named by member 0 (the lowest index set aside), the others in ``members``."""
    ordered = sorted(copies, key=_member_index)
    first = ordered[0]
    offsets = [c.half_offset for c in ordered if c.half_offset is not None]
    return replace(
        first,
        members=tuple(c.record for c in ordered),
        half_offset=min(offsets) if offsets else None,
    )


def _promoted_since(conf: dict, topics: SystemTopics, txn_id: str, since_ms: int) -> str | None:
    """Where (``op[p]@offset``) a done marker COMMITTED ``txn_id`` after ``since_ms``, if
    one did: a re-driven copy of a discarded transaction was promoted."""
    partitions = topic_partition_count(conf, topics.op)
    if partitions is None:
        return None
    consumer = _reader(conf, f"{topics.prefix}_admin")
    found = None
    try:
        starts = consumer.offsets_for_times(
            [TopicPartition(topics.op, p, since_ms) for p in range(partitions)],
            timeout=READ_TIMEOUT_S,
        )
        # -1: nothing written to that partition since.
        for msg in _read_to_eof(consumer, [tp for tp in starts if tp.offset >= 0]):
            try:
                record = decode(msg.value())
            except MalformedRecordError:
                continue
            entries = (
                record.entries
                if isinstance(record, DoneMarkers)
                else ([record] if isinstance(record, DoneMarker) else [])
            )
            if any(e.txn_id == txn_id and e.outcome is Outcome.COMMITTED for e in entries):
                found = found or f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
    finally:
        consumer.close()
    return found


def _redrivable(conf: dict, txn_id: str, topic_prefix: str) -> DiscardedTxn:
    """The discarded transaction ``txn_id`` if it may be re-driven now, else ConfigError."""
    found = {t.txn_id: t for t in list_discarded(conf, topic_prefix) if t.txn_id}.get(txn_id)
    if found is None:
        raise ConfigError(f"no discarded transaction {txn_id!r} under prefix {topic_prefix!r}")
    if not found.complete:
        raise ConfigError(
            f"transaction {txn_id} was discarded as {found.reason} with "
            f"{found.count} of its members: re-driving cannot bring back the "
            "members that never arrived"
        )
    if found.reason in NOT_REDRIVABLE:
        raise ConfigError(
            f"transaction {txn_id} was discarded as {found.reason}: its half "
            "message names no transaction or real topic a check could decide; "
            "it cannot be re-driven"
        )
    if any(p.txn_id == txn_id for p in list_pending(conf, topic_prefix)):
        raise ConfigError(f"transaction {txn_id} is already pending again (re-driven before?)")
    promoted = _promoted_since(
        conf, SystemTopics(topic_prefix), txn_id, found.record.timestamp()[1]
    )
    if promoted is not None:
        raise ConfigError(
            f"transaction {txn_id} was already promoted after its discard (done "
            f"marker {promoted}): re-driving it again would promote it twice"
        )
    return found


def _write_back(
    producer: confluent_kafka.Producer, half_topic: str, found: DiscardedTxn
) -> list[DeliveryWaiter]:
    """Produce every member, in index order, to the half partition they were in (the one
    producer keeps that order): the coordinator sees the whole transaction again."""
    waiters = []
    for record in found.members or (found.record,):
        # The coordinator writes a copy's rmq.* headers, never null.
        original: dict[str, bytes] = dict(headers_of(record))  # type: ignore[arg-type]  # see above
        headers = [(k, v) for k, v in headers_of(record) if k not in DISCARD_HEADERS]
        headers.append(
            (
                H.REDRIVE_OF,
                f"{original.get(H.HALF_PARTITION, b'?').decode()}:"
                f"{original.get(H.HALF_OFFSET, b'?').decode()}".encode(),
            )
        )
        # -1 is produce()'s own default (librdkafka's PARTITION_UA): placed by key.
        partition = (
            found.half_partition if found.members and (found.half_partition is not None) else -1
        )
        waiters.append(DeliveryWaiter())
        producer.produce(
            half_topic,
            record.value(),
            key=record.key(),
            headers=produce_headers(headers),
            on_delivery=waiters[-1],
            partition=partition,
        )
    return waiters


def redrive(conf: dict, txn_id: str, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> tuple[int, int]:
    """Write a discarded transaction back as a new half message, to be checked again.

    Re-driving is not committing: the producer group's check decides. The new half record
    keeps the transaction id and birth time (so it is checked at once) and names the
    original in ``rmq.redrive_of``. Returns the new half (partition, offset).

    Runs of one transaction exclude each other: each opens a transactional producer whose
    id names the transaction, *before* its checks, and writes in one Kafka transaction. A
    run started later fences an earlier one that has not committed (that one raises
    :class:`FatalKafkaError`, having written nothing), and one started after a commit sees
    the copy in its checks and refuses.
    """
    topics = SystemTopics(topic_prefix)
    producer = confluent_kafka.Producer(
        {
            **producer_defaults(conf, internal=True),
            "transactional.id": f"{topics.prefix}_txn_redrive_{txn_id}",
            "transaction.timeout.ms": REDRIVE_TXN_TIMEOUT_MS,
        }
    )
    try:
        producer.init_transactions(READ_TIMEOUT_S)
        found = _redrivable(conf, txn_id, topic_prefix)
        producer.begin_transaction()
        waiters = _write_back(producer, topics.half, found)
        producer.commit_transaction(READ_TIMEOUT_S)
    except KafkaException as exc:
        err = exc.args[0]
        if err.code() in FENCED:
            raise FatalKafkaError(
                f"re-driving txn {txn_id} was fenced: another `txn redrive` "
                "of it started after this run, so this run wrote nothing "
                f"({err.name()})",
                err,
            ) from None
        if err.txn_requires_abort():
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(READ_TIMEOUT_S)
        raise KafkaOperationError.wrap(f"re-driving txn {txn_id}", err) from None
    finally:
        producer.flush(0)
    for waiter in waiters:  # committed: every delivery report was served by the commit
        waiter.wait(producer, f"re-driving txn {txn_id}", READ_TIMEOUT_S)
    return waiters[0].partition, waiters[0].offset


def cli_context(args: argparse.Namespace) -> tuple[dict, Console]:
    """The Kafka conf and the console of an admin subcommand (``txn``, ``dlq``)."""
    from rmq_semantics.settings import kafka_conf_from_args

    conf = kafka_conf_from_args(args)
    if not getattr(args, "verbose", False):
        # A refused login or an unreachable broker becomes our one error line; librdkafka's
        # own retry chatter about it only shows with -v.
        logging.getLogger("rmq_semantics.librdkafka").setLevel(logging.CRITICAL)
    # Piped output keeps whole ids rather than wrapping them to 80 columns.
    return conf, Console(width=None if sys.stdout.isatty() else 250)


def _cmd_txn(args: argparse.Namespace) -> int:
    conf, console = cli_context(args)
    if args.action == "pending":
        table = Table(
            "txn id", "real topic", "producer group", "age (s)", "checks", "answered", "half"
        )
        for t in list_pending(conf, args.topic_prefix):
            table.add_row(
                t.txn_id,
                t.real_topic,
                t.producer_group,
                f"{t.age_s:.1f}",
                str(t.checks_issued),
                str(t.checks_answered),
                f"{t.half_partition}:{t.half_offset}",
            )
        console.print(table)
    elif args.action == "discarded":
        table = Table(
            "txn id",
            "real topic",
            "producer group",
            "checks",
            "reason",
            "discarded (s ago)",
            "half",
            "members",
        )
        for d in list_discarded(conf, args.topic_prefix):
            table.add_row(
                d.txn_id or "-",
                d.real_topic,
                d.producer_group,
                str(d.check_count),
                d.status,
                f"{d.age_s:.1f}",
                f"{d.half_partition}:{d.half_offset}",
                d.count,
            )
        console.print(table)
    else:
        partition, offset = redrive(conf, args.txn_id, args.topic_prefix)
        console.print(
            f"re-driven {args.txn_id} as half {partition}:{offset}; it will be checked again"
        )
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    from rmq_semantics.settings import add_kafka_arguments

    txn = sub.add_parser("txn", help="list pending/discarded transactions, re-drive one")
    actions = txn.add_subparsers(dest="action", required=True)
    for name, help_text in (
        ("pending", "transactions with no final decision yet"),
        ("discarded", "transactions set aside, with the reason"),
        ("redrive", "check a discarded transaction again"),
    ):
        parser = actions.add_parser(name, help=help_text)
        if name == "redrive":
            parser.add_argument("txn_id", metavar="TXN_ID")
        add_kafka_arguments(parser)
        parser.add_argument("--topic-prefix", default=DEFAULT_TOPIC_PREFIX)
    txn.set_defaults(func=_cmd_txn)
