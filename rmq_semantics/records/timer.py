"""Timer messages (issue 35): the timer record a producer writes for a message with a
delivery time, the cancel record of ``recall_message``, the timing wheel's level arithmetic
and the headers of the delivered record. Pure: no Kafka import.

A timer record is the user's record (key, value, user headers) on the intake topic
``<prefix>_timer`` with the ``rmq.*`` headers that say where and when to deliver it; the
coordinator moves it through the level topics ``<prefix>_timer_<L>`` (level L holds a record
for ``2^(L-1)`` s) and writes it to its real topic once due. Every timer topic has the same
partitions, and a message's timer partition is ``murmur2(id) % partitions`` in all of them,
so the coordinator owning partition p also reads that message's cancels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from rmq_semantics.errors import ConfigError, MalformedRecordError
from rmq_semantics.message import Headers, Message, RecordHeaders
from rmq_semantics.records.group_auth import timer_canonical
from rmq_semantics.records.headers import RESERVED_PREFIX, TIMER_KEEPS, H, header_text
from rmq_semantics.selector import java_partition

__all__ = [
    "CANCEL_KEEP_DELAYS",
    "DEFAULT_MAX_DELAY_MS",
    "DEFAULT_TIMER_CANCELS_MAX",
    "DEFAULT_TIMER_PARTITIONS",
    "MAX_TIMER_ID_LENGTH",
    "ROCKETMQ4_DELAY_LEVELS",
    "ROCKETMQ4_DELAY_LEVELS_MS",
    "TimerCancel",
    "TimerRecord",
    "cancel_window_start",
    "delivered_headers",
    "format_delay_levels",
    "hold_ms",
    "level_for",
    "max_level",
    "parse_delay_levels",
    "parse_timer",
    "timer_headers",
    "timer_partition",
    "unparsed_timer",
    "valid_timer_id",
]

#: RocketMQ 5's ``timerMaxDelaySec`` default: 3 days.
DEFAULT_MAX_DELAY_MS: Final = 3 * 24 * 3600 * 1000
#: Partitions of every timer topic (intake, levels, cancel) when one creates them.
DEFAULT_TIMER_PARTITIONS: Final = 8
#: Cancel records a coordinator accepts per timer partition within a cancel window
#: (:func:`cancel_window_start`); the producer and the coordinators apply the same bound.
DEFAULT_TIMER_CANCELS_MAX: Final = 100_000
#: A cancel is kept this many maximum delays after it was written: its message is due
#: within one, the second covers a timer partition left unserved meanwhile.
CANCEL_KEEP_DELAYS: Final = 2
# Windows start at whole steps of this fraction of their length: one offset look-up per
# step and partition, whoever counts (a producer once, a coordinator per step it reads).
_WINDOW_STEPS = 64
#: RocketMQ 4's ``messageDelayLevel`` (its broker's default): ``delay_time_level=k`` is the
#: k-th (1-based).
ROCKETMQ4_DELAY_LEVELS: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# The longest id a producer may name: ours are 32 hex digits; the cancel map holds them.
MAX_TIMER_ID_LENGTH: Final = 128
# Kafka's partition numbers are int32; timestamps int64.
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
# What Kafka accepts as a topic name.
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_REQUIRED = (H.TIMER_ID, H.DELIVER_AT, H.REAL_TOPIC, H.BORN_TS)


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """A delay-level table in RocketMQ's ``messageDelayLevel`` form (``"1s 5s 1m 2h"``;
    units s, m, h, d) as milliseconds; anything else is a ConfigError naming the item."""
    items = text.split() if isinstance(text, str) else []
    if not items:
        raise ConfigError(f"delay_levels={text!r}: give delays like '1s 5s 10s 1m 2h'")
    out = []
    for item in items:
        number, unit = item[:-1], item[-1:]
        if unit not in _UNIT_MS or not number.isdigit() or not number.isascii():
            raise ConfigError(
                f"delay_levels: {item!r} is not a delay (a whole number and one of s, m, h, d)"
            )
        out.append(int(number) * _UNIT_MS[unit])
    return tuple(out)


def format_delay_levels(levels_ms: Sequence[int]) -> str:
    """``levels_ms`` in RocketMQ's form, each in its largest whole unit."""
    words = []
    for ms in levels_ms:
        unit = next(u for u in "dhms" if ms % _UNIT_MS[u] == 0) if ms % 1000 == 0 else None
        if unit is None:
            raise ConfigError(f"delay level of {ms} ms is not a whole number of seconds")
        words.append(f"{ms // _UNIT_MS[unit]}{unit}")
    return " ".join(words)


#: :data:`ROCKETMQ4_DELAY_LEVELS` in milliseconds.
ROCKETMQ4_DELAY_LEVELS_MS: Final = parse_delay_levels(ROCKETMQ4_DELAY_LEVELS)


# -- the timing wheel's arithmetic --------------------------------------------------------
def level_for(remaining_ms: int) -> int:
    """The level topic for a record due in ``remaining_ms``: ``floor(log2(R_s)) + 1`` with
    ``R_s`` whole seconds, so its hold ``2^(L-1)`` s is never past its time; 0 for under a
    second (the coordinator holds it in memory)."""
    return (max(0, remaining_ms) // 1000).bit_length()


def hold_ms(level: int) -> int:
    """How long level ``level`` (1, 2, ...) holds a record: ``2^(L-1)`` s."""
    if level < 1:
        raise ConfigError(f"timer level {level}: levels start at 1")
    return 1000 << (level - 1)


def max_level(max_delay_ms: int) -> int:
    """The highest level a delay of at most ``max_delay_ms`` needs (18 for 3 days)."""
    if max_delay_ms < 1000:
        raise ConfigError(f"max_delay_ms must be at least 1000 (one second), got {max_delay_ms}")
    return level_for(max_delay_ms)


def timer_partition(timer_id: str, partitions: int) -> int:
    """The partition of message ``timer_id`` in every timer topic (Java's murmur2 of its
    UTF-8 bytes, as Kafka places a key), so a process in any language agrees."""
    return java_partition(timer_id.encode(), partitions)


def valid_timer_id(timer_id: object) -> str:
    """``timer_id`` if it is a message id: printable ASCII, 1..MAX_TIMER_ID_LENGTH
    characters; else ConfigError."""
    if (
        not isinstance(timer_id, str)
        or not 0 < len(timer_id) <= MAX_TIMER_ID_LENGTH
        or not timer_id.isascii()
        or not timer_id.isprintable()
    ):
        raise ConfigError(
            f"message id {timer_id!r}: want the message_id a send returned (printable "
            f"ASCII, at most {MAX_TIMER_ID_LENGTH} characters)"
        )
    return timer_id


# -- the timer record ---------------------------------------------------------------------
def timer_headers(
    msg: Message,
    timer_id: str,
    deliver_at_ms: int,
    born_ts_ms: int,
    producer_group: str | None = None,
    *,
    real_partition: int | None = None,
) -> Headers:
    """The headers of ``msg``'s timer record: its user headers, then the ``rmq.*`` ones
    (``rmq.producer_group`` when given; the MAC is added by
    :func:`~rmq_semantics.records.group_auth.sign_timer_headers`). ``real_partition`` (a
    selector's choice) overrides ``msg.partition``; neither: placed by key at delivery."""
    headers = [
        *msg.user_headers(),
        (H.TIMER_ID, timer_id.encode()),
        (H.DELIVER_AT, str(deliver_at_ms).encode()),
        (H.REAL_TOPIC, msg.topic.encode()),
        (H.BORN_TS, str(born_ts_ms).encode()),
    ]
    partition = msg.partition if real_partition is None else real_partition
    if partition is not None:
        headers.append((H.REAL_PARTITION, str(partition).encode()))
    if producer_group is not None:
        headers.append((H.PRODUCER_GROUP, producer_group.encode()))
    headers += msg.rmq_headers()
    return headers


@dataclass(frozen=True, slots=True)
class TimerRecord:
    """One record of a timer topic (intake, ``level`` 0, or a level topic), ``rmq.*``
    headers parsed. ``origin_offset`` is the intake offset the message was first written
    at (its own on the intake; ``rmq.timer_origin`` on a level): ``rmq.promoted_from`` of the
    delivered record names it, whichever level delivers."""

    level: int
    partition: int
    offset: int
    timestamp_ms: int
    timer_id: str
    deliver_at_ms: int
    real_topic: str
    real_partition: int | None
    born_ts: int
    producer_group: str | None
    group_mac: bytes | None
    key: bytes | None
    value: bytes | None
    # As read back: a header written with a null value is None.
    headers: RecordHeaders
    origin_offset: int

    @property
    def where(self) -> str:
        """``timer[p]@o`` (intake) or ``timer_<L>[p]@o``, and the id, for log lines."""
        topic = "timer" if self.level == 0 else f"timer_{self.level}"
        return f"{topic}[{self.partition}]@{self.offset} id={self.timer_id}"

    def exceeds(self, max_delay_ms: int) -> bool:
        """Whether it was scheduled further ahead of its birth than ``max_delay_ms`` (a
        producer with a longer limit, or a forged record: set aside as ``too_far``)."""
        return self.deliver_at_ms - self.born_ts > max_delay_ms

    def user_headers(self) -> RecordHeaders:
        return [(k, v) for k, v in self.headers if not k.startswith(RESERVED_PREFIX)]

    def canonical(self) -> bytes:
        """What its ``rmq.group_mac`` covers (``GroupKey.verifies(canonical, group_mac)``)."""
        return timer_canonical(
            self.producer_group or "",
            self.timer_id,
            self.real_topic,
            self.real_partition,
            self.deliver_at_ms,
            self.born_ts,
            self.key,
            self.value,
        )

    def reappended_headers(self) -> RecordHeaders:
        """Its headers for a re-append to a level topic: as read, with ``rmq.timer_origin``
        (the intake offset) set once."""
        kept = [(k, v) for k, v in self.headers if k != H.TIMER_ORIGIN]
        kept.append((H.TIMER_ORIGIN, str(self.origin_offset).encode()))
        return kept

    def delivered_headers(self, delivered_at_ms: int) -> RecordHeaders:
        """The headers of the record delivered to its real topic (:func:`delivered_headers`)."""
        return delivered_headers(self, delivered_at_ms)


def delivered_headers(record: TimerRecord, delivered_at_ms: int) -> RecordHeaders:
    """What the delivered record carries: the user headers, the kept ``rmq.*`` ones
    (:data:`~.headers.TIMER_KEEPS`), ``rmq.timer_id``, ``rmq.delivered_at`` and
    ``rmq.promoted_from`` = ``timer:<partition>:<intake offset>`` (what the Spark guard and
    the promoted-only consumers require). Its Kafka timestamp is the birth time."""
    kept = [
        (k, v) for k, v in record.headers if not k.startswith(RESERVED_PREFIX) or k in TIMER_KEEPS
    ]
    kept += [
        (H.TIMER_ID, record.timer_id.encode()),
        (H.DELIVERED_AT, str(delivered_at_ms).encode()),
        (H.PROMOTED_FROM, f"timer:{record.partition}:{record.origin_offset}".encode()),
    ]
    return kept


def parse_timer(
    level: int,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: RecordHeaders | None,
) -> TimerRecord:
    """Parse a record of the intake (``level`` 0) or a level topic; anything wrong raises
    MalformedRecordError with the reason.

    On the intake ``rmq.timer_origin`` is refused (only the coordinator writes it); on a
    level it is required. A ``rmq.*`` header given twice is refused: which value a reader
    took would be a guess.
    """
    where = f"{'timer' if level == 0 else f'timer_{level}'}[{partition}]@{offset}"
    found: dict[str, bytes] = {}
    for name, raw in headers or []:
        if name.startswith(RESERVED_PREFIX):
            if name in found:
                raise MalformedRecordError(f"{where}: header {name} appears twice")
            found[name] = raw or b""
    missing = [h for h in _REQUIRED if not found.get(h)]
    if missing:
        raise MalformedRecordError(f"{where}: missing headers {missing}")
    raw_id = found[H.TIMER_ID]
    if (
        len(raw_id) > MAX_TIMER_ID_LENGTH
        or not raw_id.isascii()
        or not raw_id.decode().isprintable()
    ):
        raise MalformedRecordError(
            f"{where}: {H.TIMER_ID} is not a message id (printable ASCII, at most "
            f"{MAX_TIMER_ID_LENGTH} bytes)"
        )
    try:
        real_topic = found[H.REAL_TOPIC].decode()
        if not _TOPIC_NAME.fullmatch(real_topic) or real_topic in (".", ".."):
            raise ValueError(f"{H.REAL_TOPIC}={real_topic[:60]!r} is not a Kafka topic name")
        raw_partition = found.get(H.REAL_PARTITION)
        group = found.get(H.PRODUCER_GROUP)
        origin = _origin(found.get(H.TIMER_ORIGIN), level, offset)
        return TimerRecord(
            level=level,
            partition=partition,
            offset=offset,
            timestamp_ms=timestamp_ms,
            timer_id=raw_id.decode(),
            deliver_at_ms=_number(found[H.DELIVER_AT], H.DELIVER_AT, _INT64_MAX),
            real_topic=real_topic,
            real_partition=_number(raw_partition, H.REAL_PARTITION, _INT32_MAX)
            if raw_partition
            else None,
            born_ts=_number(found[H.BORN_TS], H.BORN_TS, _INT64_MAX),
            producer_group=group.decode() if group else None,
            group_mac=found.get(H.GROUP_MAC) or None,
            key=key,
            value=value,
            headers=list(headers or []),
            origin_offset=offset if origin is None else origin,
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRecordError(f"{where}: bad rmq.* header: {exc}") from exc


def _origin(raw: bytes | None, level: int, offset: int) -> int | None:
    if level == 0:
        if raw is not None:
            raise ValueError(f"{H.TIMER_ORIGIN} on the intake (only the coordinator writes it)")
        return None
    if not raw:
        raise ValueError(f"{H.TIMER_ORIGIN} missing on a level topic")
    return _number(raw, H.TIMER_ORIGIN, _INT64_MAX)


def _number(raw: bytes, name: str, high: int) -> int:
    """A decimal in 0..high (what Kafka's field holds); else ValueError naming ``name``."""
    if not raw.isdigit() or not raw.isascii() or len(raw) > 19:
        raise ValueError(f"{name}={raw[:20]!r} is not a decimal number")
    number = int(raw)
    if number > high:
        raise ValueError(f"{name}={number} is not in 0..{high}")
    return number


def unparsed_timer(
    level: int,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: RecordHeaders | None,
) -> TimerRecord:
    """A timer record :func:`parse_timer` refused, as far as it can be read (never raises):
    what the coordinator copies to the discard topic and names in its log line."""

    def text(name: str, limit: int) -> str:
        return header_text(headers, name, limit)

    return TimerRecord(
        level=level,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        timer_id=text(H.TIMER_ID, MAX_TIMER_ID_LENGTH),
        deliver_at_ms=0,
        real_topic=text(H.REAL_TOPIC, 249),
        real_partition=None,
        born_ts=timestamp_ms,
        producer_group=text(H.PRODUCER_GROUP, 1024) or None,
        group_mac=None,
        key=key,
        value=value,
        headers=list(headers or []),
        origin_offset=offset,
    )


def cancel_window_start(written_ts: int, max_delay_ms: int) -> int:
    """Where the window of a cancel record written at ``written_ts`` starts: the cancel
    records of its timer partition from the first one written at or after this time up to
    it are counted against ``timer_cancels_max`` (about ``CANCEL_KEEP_DELAYS`` maximum
    delays; its start rounded down to a 64th of that). Producer and coordinator agree: both
    count offsets of the same log."""
    keep = CANCEL_KEEP_DELAYS * max_delay_ms
    step = max(1000, keep // _WINDOW_STEPS)
    return written_ts - written_ts % step - keep


# -- the cancel record --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TimerCancel:
    """``recall_message``: cancel message ``timer_id`` of ``producer_group`` (None when
    the producer names none), written at ``ts`` (ms). A system record (``codec``'s
    ``TIMER_CANCEL``), keyed by the id, in the message's timer partition of
    ``<prefix>_timer_cancel``; signed (``rmq.group_mac``) under tenant isolation."""

    timer_id: str
    producer_group: str | None
    ts: int

    def to_body(self) -> dict[str, Any]:
        return {"timer_id": self.timer_id, "producer_group": self.producer_group, "ts": self.ts}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> TimerCancel:
        return cls(body["timer_id"], body["producer_group"], body["ts"])

    def check(self, key: bytes | None) -> TimerCancel:
        """Itself if it is a cancel a producer could write (an id, a non-empty group or
        none, a time >= 0, the record key the id or none); else MalformedRecordError."""
        try:
            valid_timer_id(self.timer_id)
        except ConfigError as exc:
            raise MalformedRecordError(f"timer cancel: {exc}") from exc
        if self.producer_group == "":
            raise MalformedRecordError("timer cancel: an empty producer group (none is null)")
        if self.ts < 0:
            raise MalformedRecordError(f"timer cancel: ts={self.ts} is negative")
        if key is not None and key != self.timer_id.encode():
            raise MalformedRecordError(
                f"timer cancel: record key {key[:40]!r} is not its id {self.timer_id!r}"
            )
        return self
