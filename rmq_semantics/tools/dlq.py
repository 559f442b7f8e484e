"""``rmq-semantics dlq list|redrive --group G``: read a consumer group's dead letters
(``<prefix>_dlq_<group>``, RocketMQ's ``%DLQ%<group>``) and send chosen ones back.

``list`` shows each dead letter's origin (topic, partition, offset), how often it was
consumed, the listener's exception if it raised, and its first and last failure times.
``redrive`` writes the chosen ones back to their original topic and partition: key, value
and user headers kept, the ``rmq.dlq.*`` and retry headers stripped, ``rmq.redrive_of``
(``<dlq topic>[<partition>]@<offset>``) added. All chosen messages go in one Kafka
transaction, so a failed run writes none of them and two concurrent runs for one group
fence each other. The dead letters stay in the DLQ: running ``redrive`` twice sends twice,
as RocketMQ's resend does.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition
from rich.table import Table

from rmq_semantics.errors import ConfigError, KafkaOperationError
from rmq_semantics.producer import producer_defaults
from rmq_semantics.records.headers import DLQ_HEADERS, RETRY_HEADERS, H
from rmq_semantics.tools.admin import READ_TIMEOUT_S, _read_to_eof, _reader, cli_context
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemTopics,
    is_system_topic,
    topic_partition_count,
)

__all__ = ["DeadLetter", "list_dead_letters", "redrive_dead_letters", "register_cli"]

#: Headers a re-driven message loses: the dead-letter reasons and the retry bookkeeping.
STRIPPED = frozenset(DLQ_HEADERS) | frozenset(RETRY_HEADERS)


@dataclass(frozen=True)
class DeadLetter:
    """One record of a DLQ topic and why it is there (None: the header is absent)."""

    partition: int
    offset: int
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    reconsume_times: int | None
    exception: str | None
    exception_message: str | None
    first_failure_ts: int | None
    last_failure_ts: int | None
    record: confluent_kafka.Message

    @property
    def where(self) -> str:
        return f"{self.partition}:{self.offset}"

    @classmethod
    def of(cls, msg: confluent_kafka.Message) -> DeadLetter:
        text = {k: (v or b"").decode(errors="replace") for k, v in msg.headers() or []}

        def number(name: str) -> int | None:
            value = text.get(name, "")
            return int(value) if value.lstrip("-").isdigit() else None

        return cls(
            msg.partition(),
            msg.offset(),
            text.get(H.DLQ_ORIGINAL_TOPIC),
            number(H.DLQ_ORIGINAL_PARTITION),
            number(H.DLQ_ORIGINAL_OFFSET),
            number(H.DLQ_RECONSUME_TIMES),
            text.get(H.DLQ_EXCEPTION),
            text.get(H.DLQ_EXCEPTION_MESSAGE),
            number(H.DLQ_FIRST_FAILURE_TS),
            number(H.DLQ_LAST_FAILURE_TS),
            msg,
        )


def _dlq_topic(conf: dict, group: str, topic_prefix: str) -> tuple[str, int]:
    if not group:
        raise ConfigError("--group: give the consumer group whose dead letters to read")
    topic = SystemTopics(topic_prefix).dlq(group)
    partitions = topic_partition_count(conf, topic)
    if partitions is None:
        raise ConfigError(
            f"no DLQ topic {topic}: group {group!r} dead-lettered nothing under "
            f"prefix {topic_prefix!r}"
        )
    return topic, partitions


def list_dead_letters(
    conf: dict, group: str, topic_prefix: str = DEFAULT_TOPIC_PREFIX
) -> list[DeadLetter]:
    """Every dead letter of ``group``, in partition and offset order."""
    topic, partitions = _dlq_topic(conf, group, topic_prefix)
    consumer = _reader(conf, f"{SystemTopics(topic_prefix).prefix}_admin")
    try:
        tps = [
            TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)
        ]
        letters = [DeadLetter.of(msg) for msg in _read_to_eof(consumer, tps)]
    finally:
        consumer.close()
    return sorted(letters, key=lambda d: (d.partition, d.offset))


def parse_position(text: str) -> tuple[int, int]:
    """``N`` (partition 0) or ``P:N``: a dead letter's place in the DLQ topic."""
    partition, _, offset = text.rpartition(":")
    try:
        return int(partition or 0), int(offset)
    except ValueError:
        raise ConfigError(f"--offset {text!r}: want N or PARTITION:N") from None


def _redriven_headers(letter: DeadLetter, topic: str) -> list[tuple[str, bytes]]:
    headers = [
        (k, v if v is not None else b"")
        for k, v in letter.record.headers() or []
        if k not in STRIPPED and k != H.REDRIVE_OF
    ]
    headers.append((H.REDRIVE_OF, f"{topic}[{letter.partition}]@{letter.offset}".encode()))
    return headers


def redrive_dead_letters(
    conf: dict,
    group: str,
    positions: list[tuple[int, int]] | None,
    topic_prefix: str = DEFAULT_TOPIC_PREFIX,
) -> list[tuple[DeadLetter, str]]:
    """Send the dead letters at ``positions`` ((partition, offset); None: all) back to their
    original topic and partition in one Kafka transaction; returns (letter, destination)."""
    topic, _ = _dlq_topic(conf, group, topic_prefix)
    letters = {(d.partition, d.offset): d for d in list_dead_letters(conf, group, topic_prefix)}
    if positions is None:
        chosen = list(letters.values())
    else:
        missing = [f"{p}:{o}" for p, o in positions if (p, o) not in letters]
        if missing:
            raise ConfigError(f"no dead letter at {', '.join(missing)} in {topic}")
        chosen = [letters[pos] for pos in dict.fromkeys(positions)]
    for letter in chosen:
        # A forged DLQ record must not make this tool write into a system topic.
        if not letter.original_topic or is_system_topic(letter.original_topic, topic_prefix):
            raise ConfigError(
                f"dead letter {letter.where} of {topic} names no business topic "
                f"to go back to ({letter.original_topic!r})"
            )
    if not chosen:
        return []
    prefix = SystemTopics(topic_prefix).prefix
    producer = confluent_kafka.Producer(
        {
            **producer_defaults(conf, internal=True),
            "transactional.id": f"{prefix}_dlq_redrive_{group}",
        }
    )
    out = []
    try:
        producer.init_transactions(READ_TIMEOUT_S)
        producer.begin_transaction()
        for letter in chosen:
            kwargs = (
                {}
                if letter.original_partition is None
                else {"partition": letter.original_partition}
            )
            producer.produce(
                letter.original_topic,
                letter.record.value(),
                key=letter.record.key(),
                headers=_redriven_headers(letter, topic),
                **kwargs,
            )
            out.append((letter, f"{letter.original_topic}[{kwargs.get('partition', '?')}]"))
        producer.commit_transaction(READ_TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaOperationError(
            f"re-driving dead letters of {topic}: {exc.args[0].str()}", exc.args[0]
        ) from None
    finally:
        producer.flush(0)
    return out


def _ts(ms: int | None) -> str:
    return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def _cmd_dlq(args: argparse.Namespace) -> int:
    conf, console = cli_context(args)
    if args.action == "list":
        table = Table(
            "dlq",
            "original",
            "reconsumes",
            "exception",
            "first failure (UTC)",
            "last failure (UTC)",
            "key",
        )
        for d in list_dead_letters(conf, args.group, args.topic_prefix):
            exception = ": ".join(x for x in (d.exception, d.exception_message) if x) or "-"
            table.add_row(
                d.where,
                f"{d.original_topic}[{d.original_partition}]@{d.original_offset}",
                str(d.reconsume_times),
                exception,
                _ts(d.first_failure_ts),
                _ts(d.last_failure_ts),
                repr(d.record.key()),
            )
        console.print(table)
        return 0
    if bool(args.all) == bool(args.offset):
        raise ConfigError("dlq redrive: give --offset N (repeatable) or --all")
    positions = None if args.all else [parse_position(o) for o in args.offset]
    for letter, destination in redrive_dead_letters(conf, args.group, positions, args.topic_prefix):
        console.print(f"re-driven {letter.where} to {destination}")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    from rmq_semantics.settings import add_kafka_arguments

    dlq = sub.add_parser("dlq", help="list a consumer group's dead letters, re-drive some")
    actions = dlq.add_subparsers(dest="action", required=True)
    for name, help_text in (
        ("list", "dead letters with their reasons"),
        ("redrive", "send dead letters back to their original topic"),
    ):
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument("--group", required=True, metavar="G")
        if name == "redrive":
            parser.add_argument(
                "--offset",
                action="append",
                metavar="N",
                help="a dead letter's offset (or PARTITION:N), repeatable",
            )
            parser.add_argument("--all", action="store_true", help="every dead letter")
        add_kafka_arguments(parser)
        parser.add_argument("--topic-prefix", default=DEFAULT_TOPIC_PREFIX)
    dlq.set_defaults(func=_cmd_dlq)
