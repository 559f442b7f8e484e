"""Half messages: the ``rmq.*`` headers a producer writes on a half record, and the parse
of them the coordinator (and ``txn pending``) reads back. Pure: no Kafka import."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.message import Headers, Message, RecordHeaders
from rmq_semantics.records.headers import PROMOTED_KEEPS, RESERVED_PREFIX, H, header_text

__all__ = [
    "MAX_CHECK_PARTITIONS",
    "MAX_INSTANCE_ID_LENGTH",
    "MAX_TXN_ID_LENGTH",
    "MAX_TXN_SIZE",
    "HalfMessage",
    "affinity_headers",
    "half_headers",
    "parse_half",
    "unparsed_half",
]

_REQUIRED = (H.TXN_ID, H.REAL_TOPIC, H.PRODUCER_GROUP, H.BORN_TS)
# Every done marker carries the transaction id, and one Op record holds a whole batch's
# markers: a longer id is malformed, so a batch stays far below max.message.bytes.
MAX_TXN_ID_LENGTH = 128
# Members of one transaction at most (the producer's max_transaction_messages can't exceed
# it): the coordinator holds a transaction's members in memory until it is decided.
MAX_TXN_SIZE = 1000
# A producer instance id (rmq.check_affinity; the check consumer's client.id carries it).
MAX_INSTANCE_ID_LENGTH = 128
# Check partitions one half record may name (rmq.check_partitions).
MAX_CHECK_PARTITIONS = 256


def affinity_headers(instance_id: str, check_partitions: tuple[int, ...]) -> Headers:
    """Check affinity: the instance, and the check partitions it holds now, where the
    coordinator writes this transaction's checks; none while it holds no partition."""
    if not check_partitions:
        return []
    return [
        (H.CHECK_AFFINITY, instance_id.encode()),
        (H.CHECK_PARTITIONS, ",".join(map(str, check_partitions)).encode()),
    ]


def half_headers(
    msg: Message,
    txn_id: str,
    producer_group: bytes,
    born_ts: bytes,
    affinity: Sequence[tuple[str, bytes]] = (),
) -> Headers:
    """The headers of ``msg``'s half record: its user headers plus the ``rmq.*`` ones.

    ``producer_group``, ``born_ts`` and ``affinity`` (:func:`affinity_headers`, or none) come
    encoded: they are the same for a whole batch.
    """
    headers = [
        *msg.user_headers(),
        (H.TXN_ID, txn_id.encode()),
        (H.REAL_TOPIC, msg.topic.encode()),
        (H.PRODUCER_GROUP, producer_group),
        (H.BORN_TS, born_ts),
    ]
    if msg.partition is not None:
        headers.append((H.REAL_PARTITION, str(msg.partition).encode()))
    if msg.check_immunity_ms is not None:
        headers.append((H.CHECK_IMMUNITY_MS, str(msg.check_immunity_ms).encode()))
    headers += affinity
    headers += msg.rmq_headers()
    return headers


# Kafka's partition numbers are int32; timestamps and durations in Avro int64.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class HalfMessage:
    """One record of the half topic, with its ``rmq.*`` headers parsed."""

    partition: int
    offset: int
    timestamp_ms: int
    txn_id: str
    producer_group: str
    real_topic: str
    real_partition: int | None
    born_ts: int
    check_immunity_ms: int | None
    key: bytes | None
    value: bytes | None
    # As read back: a header written with a null value is None.
    headers: RecordHeaders
    # Members of a multi-message transaction (rmq.txn_size / rmq.txn_index); 1 and 0 for a
    # transaction of one.
    txn_size: int = 1
    txn_index: int = 0
    # rmq.check_affinity: the producer instance that should answer the back-checks first;
    # rmq.check_partitions: the check partitions it held when it wrote this record.
    check_affinity: str | None = None
    check_partitions: tuple[int, ...] = ()

    @property
    def is_member(self) -> bool:
        """Whether this record is one member of a multi-message transaction."""
        return self.txn_size > 1

    @property
    def where(self) -> str:
        return f"half[{self.partition}]@{self.offset} txn={self.txn_id}"

    def user_headers(self) -> RecordHeaders:
        return [(k, v) for k, v in self.headers if not k.startswith(RESERVED_PREFIX)]

    def promoted_headers(self, promoted_at_ms: int | None = None) -> RecordHeaders:
        """User headers, the kept ``rmq.*`` ones, ``rmq.promoted_from`` and (when given)
        ``rmq.promoted_at``: the record's timestamp stays the producer's birth time."""
        kept = [
            (k, v)
            for k, v in self.headers
            if not k.startswith(RESERVED_PREFIX) or k in PROMOTED_KEEPS
        ]
        kept.append((H.PROMOTED_FROM, f"{self.partition}:{self.offset}".encode()))
        if promoted_at_ms is not None:
            kept.append((H.PROMOTED_AT, str(promoted_at_ms).encode()))
        return kept

    def first_check_ts(self, transaction_timeout_ms: int, now_ms: int | None = None) -> int:
        # A per-message immunity shorter than the transaction timeout is raised to it.
        immunity = max(self.check_immunity_ms or 0, transaction_timeout_ms)
        # A birth after ``now_ms`` is a producer clock running ahead: count from now, so
        # the skew never delays the check. (RocketMQ checks such a message at once; here
        # that would ask before the local transaction ended and could roll back a commit.)
        born = self.born_ts if now_ms is None else min(self.born_ts, now_ms)
        return born + immunity


def parse_half(
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: RecordHeaders | None,
) -> HalfMessage:
    """Parse a half record; missing or unreadable ``rmq.*`` headers raise MalformedRecordError."""
    found: dict[str, bytes] = {}
    for name, raw in headers or []:
        if name.startswith(RESERVED_PREFIX):
            found[name] = raw or b""
    # A required header with a null (or empty) value is as good as missing.
    missing = [h for h in _REQUIRED if not found.get(h)]
    if missing:
        raise MalformedRecordError(f"half[{partition}]@{offset}: missing headers {missing}")
    if len(found[H.TXN_ID]) > MAX_TXN_ID_LENGTH:
        raise MalformedRecordError(
            f"half[{partition}]@{offset}: {H.TXN_ID} is longer than {MAX_TXN_ID_LENGTH} bytes"
        )
    try:
        real_partition = found.get(H.REAL_PARTITION)
        immunity = found.get(H.CHECK_IMMUNITY_MS)
        size, index = _membership(found, partition, offset)
        return HalfMessage(
            partition=partition,
            offset=offset,
            timestamp_ms=timestamp_ms,
            txn_id=found[H.TXN_ID].decode(),
            producer_group=found[H.PRODUCER_GROUP].decode(),
            real_topic=found[H.REAL_TOPIC].decode(),
            real_partition=_in_range(real_partition, H.REAL_PARTITION, INT32_MAX)
            if real_partition
            else None,
            born_ts=_in_range(found[H.BORN_TS], H.BORN_TS, INT64_MAX),
            check_immunity_ms=_in_range(immunity, H.CHECK_IMMUNITY_MS, INT64_MAX)
            if immunity
            else None,
            key=key,
            value=value,
            headers=list(headers or []),
            txn_size=size,
            txn_index=index,
            check_affinity=_affinity(found.get(H.CHECK_AFFINITY), partition, offset),
            check_partitions=_check_partitions(found.get(H.CHECK_PARTITIONS), partition, offset),
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRecordError(f"half[{partition}]@{offset}: bad rmq.* header: {exc}") from exc


def _affinity(raw: bytes | None, partition: int, offset: int) -> str | None:
    """An instance id of printable ASCII, at most MAX_INSTANCE_ID_LENGTH bytes; empty means
    none; anything else makes the record malformed."""
    if not raw:
        return None
    if len(raw) > MAX_INSTANCE_ID_LENGTH or not raw.isascii() or not raw.decode().isprintable():
        raise MalformedRecordError(
            f"half[{partition}]@{offset}: {H.CHECK_AFFINITY} is not an "
            f"instance id (printable ASCII, at most "
            f"{MAX_INSTANCE_ID_LENGTH} bytes)"
        )
    return raw.decode()


def _check_partitions(raw: bytes | None, partition: int, offset: int) -> tuple[int, ...]:
    """Decimal partition numbers separated by commas, at most MAX_CHECK_PARTITIONS; empty
    means none; anything else makes the record malformed."""
    if not raw:
        return ()
    parts = raw.split(b",")
    if len(parts) > MAX_CHECK_PARTITIONS or not all(
        p.isdigit() and p.isascii() and len(p) <= 10 for p in parts
    ):
        raise MalformedRecordError(
            f"half[{partition}]@{offset}: {H.CHECK_PARTITIONS} is not "
            f"a list of at most {MAX_CHECK_PARTITIONS} partitions"
        )
    return tuple(_in_range(p, H.CHECK_PARTITIONS, INT32_MAX) for p in parts)


def _membership(found: dict[str, bytes], partition: int, offset: int) -> tuple[int, int]:
    """(txn_size, txn_index): (1, 0) when both headers are absent; both present, decimal,
    2 <= size <= MAX_TXN_SIZE and index < size, or the record is malformed."""
    size_raw, index_raw = found.get(H.TXN_SIZE), found.get(H.TXN_INDEX)
    if size_raw is None and index_raw is None:
        return 1, 0
    where = f"half[{partition}]@{offset}"
    if not size_raw or not index_raw:
        raise MalformedRecordError(
            f"{where}: {H.TXN_SIZE} and {H.TXN_INDEX} go together, "
            f"got only {H.TXN_SIZE if size_raw else H.TXN_INDEX}"
        )
    if not all(raw.isdigit() and len(raw) <= 10 for raw in (size_raw, index_raw)):
        raise MalformedRecordError(
            f"{where}: {H.TXN_SIZE}/{H.TXN_INDEX} are not decimal "
            f"numbers: {size_raw[:20]!r}/{index_raw[:20]!r}"
        )
    size, index = int(size_raw), int(index_raw)
    if not 2 <= size <= MAX_TXN_SIZE or index >= size:
        raise MalformedRecordError(
            f"{where}: {H.TXN_INDEX}={index} of {H.TXN_SIZE}={size} "
            f"(need 2 <= size <= {MAX_TXN_SIZE}, index < size)"
        )
    return size, index


def _in_range(raw: bytes, name: str, high: int) -> int:
    """A non-negative number that fits Kafka's field (a partition is an int32, times and
    durations int64): anything else would fail an encoder or the producer later."""
    value = int(raw)
    if not 0 <= value <= high:
        raise ValueError(f"{name}={value} is not in 0..{high}")
    return value


def unparsed_half(
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: RecordHeaders | None,
) -> HalfMessage:
    """A half record :func:`parse_half` refused, as far as it can be read (never raises):
    what the coordinator copies to the discard topic and names in its done marker."""

    def text(name: str, limit: int) -> str:
        return header_text(headers, name, limit)

    return HalfMessage(
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        txn_id=text(H.TXN_ID, MAX_TXN_ID_LENGTH),
        producer_group=text(H.PRODUCER_GROUP, 1024),
        real_topic=text(H.REAL_TOPIC, 1024),
        real_partition=None,
        born_ts=timestamp_ms,
        check_immunity_ms=None,
        key=key,
        value=value,
        headers=list(headers or []),
    )
