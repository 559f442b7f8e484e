"""``rmq-semantics timer list``: the timer messages not delivered yet, counted per real topic
and due window, or one of them by id.

What is still scheduled is what the timer service has not finished: every timer partition's
intake topic (``<prefix>_timer``) and level topics (``<prefix>_timer_<L>``) from the timer
group's committed offsets to their ends, read_committed, the finished records above a
committed offset (the done offsets in its commit metadata) skipped, as a new owner would. A
message is in exactly one of those places, so it is counted once; the counts are a snapshot
per partition, not across them (a record moved between two reads can be counted twice or
not at all; list again). Cancels (``<prefix>_timer_cancel``) are read whole first: a message
whose id its own group recalled, and that the timer service has not dropped yet, is counted
as recalled, not as scheduled.

Memory is the counts and the set of recalled ids, never the scheduled records. Every record
is untrusted input: one that does not parse is counted as malformed, logged with
``topic[partition]@offset`` and skipped. The pure part (:func:`due_window`,
:class:`TimerCounts`, :func:`done_offsets`) takes records and a clock; Kafka I/O is in
:func:`list_timers` and :func:`find_timer`.
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from rich.table import Table

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.consumed import headers_of, offset_of, partition_of, topic_of
from rmq_semantics.errors import ConfigError, KafkaOperationError, RmqTimeoutError
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.records.codec import decode_timer_cancel
from rmq_semantics.records.headers import H
from rmq_semantics.records.timer import (
    TimerRecord,
    hold_ms,
    parse_timer,
    timer_partition,
    valid_timer_id,
)
from rmq_semantics.retry import retriable_kafka_error
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, SystemTopics, list_topics

__all__ = [
    "WINDOWS",
    "ScheduledTimer",
    "TimerCounts",
    "TimerLookup",
    "done_offsets",
    "due_window",
    "find_timer",
    "list_timers",
    "register_cli",
]

log = logging.getLogger(__name__)

_MINUTE, _HOUR, _DAY = 60_000, 3_600_000, 86_400_000
#: The due windows of ``timer list``: (column, due before this many ms from now; None: any).
WINDOWS: tuple[tuple[str, int | None], ...] = (
    ("overdue", 0),
    ("<1 min", _MINUTE),
    ("<1 h", _HOUR),
    ("<1 day", _DAY),
    ("later", None),
)
# No record and no end of partition for this long: the broker stopped answering.
IDLE_TIMEOUT_S = 30.0
# Committed offsets and the topics' metadata, each one round trip.
METADATA_TIMEOUT_S = 15.0
POLL_S = 0.5
# librdkafka pre-fetches up to 64 MiB by default; the listing only counts, so a small
# queue keeps its memory flat however many records the topics hold.
QUEUED_MAX_KBYTES = 8192


# -- pure: windows, counts, done offsets ---------------------------------------------------
def due_window(deliver_at_ms: int, now_ms: int) -> int:
    """The index in :data:`WINDOWS` of a message due at ``deliver_at_ms`` seen at ``now_ms``:
    0 (overdue) once its time has come, else the first window it falls before."""
    remaining = deliver_at_ms - now_ms
    if remaining <= 0:
        return 0
    return next(
        (i for i, (_, bound) in enumerate(WINDOWS) if i and (bound is None or remaining < bound)),
        len(WINDOWS) - 1,
    )


@dataclass
class TimerCounts:
    """Scheduled messages per real topic and due window (``by_topic[topic][window]``), the
    recalled ones still waiting to be dropped, and the malformed records skipped."""

    now_ms: int
    by_topic: dict[str, list[int]] = field(default_factory=dict)
    cancelled: int = 0
    malformed: int = 0

    def add(self, record: TimerRecord, cancelled: bool = False) -> None:
        if cancelled:
            self.cancelled += 1
            return
        row = self.by_topic.setdefault(record.real_topic, [0] * len(WINDOWS))
        row[due_window(record.deliver_at_ms, self.now_ms)] += 1

    @property
    def scheduled(self) -> int:
        return sum(sum(row) for row in self.by_topic.values())

    def rows(self) -> list[tuple[str, list[int]]]:
        """(real topic, counts per window), by topic name."""
        return sorted((topic, list(row)) for topic, row in self.by_topic.items())


def done_offsets(committed: int, metadata: str | None, where: str) -> Callable[[int], bool]:
    """Whether an offset at or above ``committed`` was finished already: the done offsets
    the timer service keeps in its commit metadata (an OffsetTracker's field)."""
    tracker = OffsetTracker.restore(committed, metadata, where=where)
    return tracker.is_done if committed >= 0 else (lambda offset: False)


@dataclass(frozen=True)
class ScheduledTimer:
    """One scheduled message as ``timer list --id`` shows it."""

    timer_id: str
    topic: str  # the timer topic holding it now (intake or a level)
    partition: int
    offset: int
    level: int  # 0: the intake; L: level L, released 2^(L-1) s after its append time
    deliver_at_ms: int
    real_topic: str
    real_partition: int | None
    producer_group: str | None
    born_ts: int
    cancelled: bool

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True)
class TimerLookup:
    """What ``--id`` found: the message's record(s) still scheduled (one, or two when it
    moved between two reads), and when its cancel was written (None: never recalled)."""

    timer_id: str
    found: tuple[ScheduledTimer, ...]
    cancelled_at_ms: int | None


# -- Kafka I/O -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    topics: SystemTopics
    partitions: int
    lanes: dict[str, int]  # timer topic -> lane (0: intake, L: level L)
    cancel: bool  # the cancel topic exists


def _layout(conf: dict, topic_prefix: str) -> _Layout | None:
    """The timer topics that exist under ``topic_prefix`` (None: no intake topic yet)."""
    topics = SystemTopics(topic_prefix)
    meta = list_topics(conf, METADATA_TIMEOUT_S).topics
    intake = meta.get(topics.timer)
    if intake is None or not intake.partitions:
        return None
    level_name = re.compile(re.escape(topics.timer) + r"_(\d{1,2})")
    lanes = {topics.timer: 0}
    for name in meta:
        found = level_name.fullmatch(name)
        if found:
            lanes[name] = int(found.group(1))
    return _Layout(topics, len(intake.partitions), lanes, topics.timer_cancel in meta)


def _consumer(conf: dict, group: str) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer(
        {
            **shared_conf(conf),
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "queued.max.messages.kbytes": QUEUED_MAX_KBYTES,
        }
    )


def _scan(consumer: confluent_kafka.Consumer, tps: list[TopicPartition]) -> Iterator:
    """Records of ``tps`` from their offsets to their ends (read_committed: the last
    stable offset); RmqTimeoutError after IDLE_TIMEOUT_S without a record or an end."""
    if not tps:
        return
    consumer.assign(tps)
    waiting = {(tp.topic, tp.partition) for tp in tps}
    idle_until = time.monotonic() + IDLE_TIMEOUT_S
    try:
        while waiting:
            if time.monotonic() > idle_until:
                raise RmqTimeoutError(
                    f"reading {sorted(waiting)[:4]} to the end: nothing came for "
                    f"{IDLE_TIMEOUT_S:.0f} s (is the broker still up?)"
                )
            try:
                batch = consumer.consume(1000, POLL_S)
            except KafkaException as exc:
                raise KafkaOperationError.wrap("reading the timer topics", exc.args[0]) from exc
            for msg in batch:
                idle_until = time.monotonic() + IDLE_TIMEOUT_S
                err = msg.error()
                if err is None:
                    yield msg
                elif err.code() == KafkaError._PARTITION_EOF:
                    waiting.discard((msg.topic(), msg.partition()))
                elif not retriable_kafka_error(err):
                    raise KafkaOperationError.wrap(f"reading {msg.topic()}[{msg.partition()}]", err)
    finally:
        consumer.unassign()


def _cancels(
    consumer: confluent_kafka.Consumer,
    layout: _Layout,
    partitions: list[int],
    counts: TimerCounts | None,
    only: str | None = None,
) -> dict[tuple[str, str], int]:
    """(id, group) -> when written (ms) of every cancel in ``partitions`` (only ``only``'s
    when given); a malformed one is logged and counted in ``counts``."""
    if not layout.cancel:
        return {}
    topic = layout.topics.timer_cancel
    tps = [TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in partitions]
    out: dict[tuple[str, str], int] = {}
    for msg in _scan(consumer, tps):
        if only is not None and msg.key() != only.encode():
            continue
        try:
            cancel = decode_timer_cancel(msg.key(), msg.value())
        except Exception as exc:  # MalformedRecordError, or anything its content caused
            log.warning("%s[%d]@%d skipped: %s", topic, partition_of(msg), offset_of(msg), exc)
            if counts is not None:
                counts.malformed += 1
            continue
        out[(cancel.timer_id, cancel.producer_group or "")] = msg.timestamp()[1]
    return out


def _scheduled(
    consumer: confluent_kafka.Consumer, layout: _Layout, partitions: list[int]
) -> Iterator[tuple[int, confluent_kafka.Message]]:
    """(lane, record) of every unfinished record of ``partitions`` in every lane: from
    the timer group's committed offsets to the ends, done offsets skipped."""
    lanes = [TopicPartition(t, p) for p in partitions for t in layout.lanes]
    try:
        committed = consumer.committed(lanes, timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaOperationError.wrap(
            f"reading the committed offsets of group {layout.topics.timer_group}", exc.args[0]
        ) from exc
    done = {
        (tp.topic, tp.partition): done_offsets(
            tp.offset, tp.metadata, f"{tp.topic}[{tp.partition}]"
        )
        for tp in committed
    }
    starts = [
        TopicPartition(
            tp.topic,
            tp.partition,
            tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING,
        )
        for tp in committed
    ]
    for msg in _scan(consumer, starts):
        if not done[(msg.topic(), msg.partition())](offset_of(msg)):
            yield layout.lanes[topic_of(msg)], msg


def _parsed(lane: int, msg: confluent_kafka.Message) -> TimerRecord | None:
    try:
        return parse_timer(
            lane,
            partition_of(msg),
            offset_of(msg),
            msg.timestamp()[1],
            msg.key(),
            msg.value(),
            headers_of(msg),
        )
    except Exception as exc:  # MalformedRecordError, or anything its content caused
        log.warning("%s[%d]@%d skipped: %s", topic_of(msg), partition_of(msg), offset_of(msg), exc)
        return None


def _now_ms() -> int:
    return int(time.time() * 1000)


def list_timers(
    conf: dict, topic_prefix: str = DEFAULT_TOPIC_PREFIX, now_ms: int | None = None
) -> TimerCounts:
    """The scheduled messages under ``topic_prefix`` counted per real topic and due window
    (seen at ``now_ms``, default now); all zero when no timer topic exists yet."""
    counts = TimerCounts(_now_ms() if now_ms is None else now_ms)
    layout = _layout(conf, topic_prefix)
    if layout is None:
        return counts
    consumer = _consumer(conf, layout.topics.timer_group)
    try:
        partitions = list(range(layout.partitions))
        cancels = _cancels(consumer, layout, partitions, counts)
        for lane, msg in _scheduled(consumer, layout, partitions):
            record = _parsed(lane, msg)
            if record is None:
                counts.malformed += 1
                continue
            counts.add(record, (record.timer_id, record.producer_group or "") in cancels)
    finally:
        consumer.close()
    return counts


def find_timer(conf: dict, timer_id: str, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> TimerLookup:
    """Where message ``timer_id`` (a send's ``message_id``) waits, when it is due and whether
    it was recalled: only its timer partition is read."""
    valid_timer_id(timer_id)
    layout = _layout(conf, topic_prefix)
    if layout is None:
        raise ConfigError(f"no timer topics under prefix {topic_prefix!r}: nothing scheduled")
    p = timer_partition(timer_id, layout.partitions)
    consumer = _consumer(conf, layout.topics.timer_group)
    found: list[ScheduledTimer] = []
    try:
        cancels = _cancels(consumer, layout, [p], None, only=timer_id)
        wanted = timer_id.encode()
        for lane, msg in _scheduled(consumer, layout, [p]):
            if not any(k == H.TIMER_ID and v == wanted for k, v in headers_of(msg)):
                continue
            record = _parsed(lane, msg)
            if record is None:
                continue
            found.append(
                ScheduledTimer(
                    timer_id,
                    topic_of(msg),
                    record.partition,
                    record.offset,
                    lane,
                    record.deliver_at_ms,
                    record.real_topic,
                    record.real_partition,
                    record.producer_group,
                    record.born_ts,
                    (timer_id, record.producer_group or "") in cancels,
                )
            )
    finally:
        consumer.close()
    recalled = [at for (tid, _), at in cancels.items() if tid == timer_id]
    return TimerLookup(timer_id, tuple(found), max(recalled) if recalled else None)


# -- the command line ----------------------------------------------------------------------
def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d} UTC"


def _span(ms: int) -> str:
    """``ms`` as ``1 d 2 h``, ``3 h 4 min``, ``5 min 6 s`` or ``7.8 s``."""
    ms = abs(ms)
    if ms < _MINUTE:
        return f"{ms / 1000:.1f} s"
    if ms < _HOUR:
        return f"{ms // _MINUTE} min {ms % _MINUTE // 1000} s"
    if ms < _DAY:
        return f"{ms // _HOUR} h {ms % _HOUR // _MINUTE} min"
    return f"{ms // _DAY} d {ms % _DAY // _HOUR} h"


def _cancelled(s: ScheduledTimer, lookup: TimerLookup) -> str:
    if lookup.cancelled_at_ms is None:
        return "no"
    at = _utc(lookup.cancelled_at_ms)
    if s.cancelled:
        return f"yes, recalled at {at}: dropped when the timer service next reads it"
    return f"no (a recall of its id by another producer group, at {at}, has no effect)"


def describe(lookup: TimerLookup, now_ms: int) -> list[str]:
    """The lines ``timer list --id`` prints for ``lookup``."""
    lines = []
    for s in lookup.found:
        due = s.deliver_at_ms - now_ms
        when = f"in {_span(due)}" if due > 0 else f"{_span(due)} ago, not delivered yet"
        place = (
            "the intake" if s.level == 0 else f"level {s.level} ({_span(hold_ms(s.level))} hold)"
        )
        partition = "by key" if s.real_partition is None else f"partition {s.real_partition}"
        lines += [
            f"message {s.timer_id}",
            f"  where:      {s.where} ({place})",
            f"  due:        {_utc(s.deliver_at_ms)} ({when})",
            f"  real topic: {s.real_topic} ({partition})",
            f"  group:      {s.producer_group or '-'}",
            f"  born:       {_utc(s.born_ts)}",
            f"  cancelled:  {_cancelled(s, lookup)}",
        ]
    if not lookup.found:
        lines.append(
            f"message {lookup.timer_id}: not scheduled any more; recalled at "
            f"{_utc(lookup.cancelled_at_ms or 0)} (dropped, or delivered before the recall)"
        )
    return lines


def _cmd_timer(args: argparse.Namespace) -> int:
    from rmq_semantics.tools.admin import cli_context

    conf, console = cli_context(args)
    if args.id is not None:
        lookup = find_timer(conf, args.id, args.topic_prefix)
        if not lookup.found and lookup.cancelled_at_ms is None:
            raise ConfigError(
                f"no scheduled message {args.id!r} under prefix {args.topic_prefix!r} "
                "(delivered, set aside, or never sent)"
            )
        console.print("\n".join(describe(lookup, _now_ms())), highlight=False, markup=False)
        return 0
    counts = list_timers(conf, args.topic_prefix)
    table = Table("real topic", *(name for name, _ in WINDOWS), "total")
    for topic, row in counts.rows():
        table.add_row(topic, *(str(n) for n in row), str(sum(row)))
    console.print(table)
    console.print(
        f"{counts.scheduled} scheduled; {counts.cancelled} recalled, not dropped yet (not "
        f"counted above); {counts.malformed} malformed records skipped",
        highlight=False,
        markup=False,
    )
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    from rmq_semantics.settings import add_kafka_arguments

    timer = sub.add_parser("timer", help="look into the scheduled (timer) messages")
    actions = timer.add_subparsers(dest="action", required=True)
    parser = actions.add_parser(
        "list",
        help="scheduled messages per real topic and due window, or one by --id",
        description="Scheduled messages not delivered yet, counted per real topic and due "
        "window (read from the timer group's committed offsets to the ends of the timer "
        "topics), or with --id one message: where it waits, when it is due, its real "
        "topic, whether it was recalled.",
    )
    parser.add_argument(
        "--id", metavar="MESSAGE_ID", default=None, help="show this message (a send's message_id)"
    )
    add_kafka_arguments(parser)
    parser.add_argument("--topic-prefix", default=DEFAULT_TOPIC_PREFIX)
    timer.set_defaults(func=_cmd_timer)
