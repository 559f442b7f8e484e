"""One settings table for Python kwargs, CLI ``--flag-name`` and env ``RMQ_FLAG_NAME``.

A settings class is a frozen dataclass whose fields are declared with :func:`setting`;
:func:`add_arguments` turns the fields into CLI flags and :func:`load` builds an instance
from (in order of precedence) explicit values, environment variables and defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rmq_semantics.errors import ConfigError
from rmq_semantics.helptext import plain_text
from rmq_semantics.records.half import MAX_TXN_SIZE
from rmq_semantics.records.timer import (
    DEFAULT_MAX_DELAY_MS,
    DEFAULT_TIMER_CANCELS_MAX,
    DEFAULT_TIMER_PARTITIONS,
    ROCKETMQ4_DELAY_LEVELS,
    parse_delay_levels,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "MAX_TRANSACTION_BYTES",
    "MAX_TRANSACTION_MESSAGES",
    "OrderlyConsumerSettings",
    "ProducerSettings",
    "PushConsumerSettings",
    "SimpleConsumerSettings",
    "add_arguments",
    "add_kafka_arguments",
    "env_name",
    "flag_name",
    "kafka_conf_from_args",
    "kafka_env_conf",
    "load",
    "setting",
]

T = TypeVar("T", bound="DataclassInstance")  # load() builds a settings dataclass


def setting(default: Any, help: str, *, secret: bool = False) -> Any:
    """A settings field. A ``secret`` one (a key, a password) is set by kwargs or env only,
    never a CLI flag (a command line is visible to every local user), and left out of repr."""
    return dataclasses.field(
        default=default, repr=not secret, metadata={"help": help, "secret": secret}
    )


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return "RMQ_" + field_name.upper()


def _field_type(cls: type, field: dataclasses.Field) -> type:
    hint = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    return {"int": int, "float": float, "bool": bool}.get(hint.split(" ")[0], str)


def _convert(cls: type, field: dataclasses.Field, raw: Any, source: str) -> Any:
    kind = _field_type(cls, field)
    if not isinstance(raw, str) or kind is str:
        return raw
    try:
        if kind is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        return kind(raw)
    except ValueError as exc:
        raise ConfigError(
            f"{field.name}={raw!r} (from {source}) is not a valid {kind.__name__}"
        ) from exc


class _RefusedSecret(argparse.Action):
    """A secret on the command line is visible to every local user: refuse it, naming the
    env variable instead, and never echo the value."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} is not taken on the command line (every local user "
            f"can read it there); set env {env_name(self.dest)} instead"
        )


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one ``--flag-name`` per settings field (defaults stay None: see :func:`load`); a
    secret's flag only refuses to be used."""
    for field in dataclasses.fields(cls):
        if field.metadata.get("secret"):
            # Registered so that it is not taken as an abbreviation of a longer flag.
            parser.add_argument(
                flag_name(field.name),
                dest=field.name,
                default=None,
                nargs="?",
                action=_RefusedSecret,
                help=argparse.SUPPRESS,
            )
            continue
        help_text = (
            f"{plain_text(field.metadata.get('help', ''))} (env {env_name(field.name)}; "
            f"default {field.default!r})"
        )
        parser.add_argument(
            flag_name(field.name),
            dest=field.name,
            default=None,
            metavar=field.name.upper(),
            help=help_text,
        )


def load(
    cls: type[T],
    values: Mapping[str, Any] | argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
) -> T:
    """Build ``cls`` from explicit ``values`` (kwargs or parsed CLI), then env, then defaults."""
    from_cli = isinstance(values, argparse.Namespace)
    values = dict(vars(values) if from_cli else (values or {}))
    env = os.environ if env is None else env
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown and not from_cli:  # a parsed CLI also carries the other commands' args
        raise ConfigError(f"unknown setting(s) {sorted(unknown)} for {cls.__name__}")
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if values.get(field.name) is not None:
            kwargs[field.name] = _convert(cls, field, values[field.name], flag_name(field.name))
        elif env_name(field.name) in env:
            kwargs[field.name] = _convert(
                cls, field, env[env_name(field.name)], env_name(field.name)
            )
    return cls(**kwargs)


def kafka_env_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """librdkafka settings from ``RMQ_KAFKA_<KEY>`` env vars (``RMQ_KAFKA_SASL_PASSWORD`` ->
    ``sasl.password``), so secrets need not be on a command line."""
    env = os.environ if env is None else env
    return {
        key.removeprefix("RMQ_KAFKA_").lower().replace("_", "."): value
        for key, value in env.items()
        if key.startswith("RMQ_KAFKA_")
    }


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-servers`` and repeatable ``--kafka-option KEY=VALUE`` (every command that
    talks to Kafka)."""
    parser.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    parser.add_argument(
        "--kafka-option",
        action="append",
        metavar="KEY=VALUE",
        help="extra librdkafka setting for every client (e.g. "
        "security.protocol=SASL_SSL); env RMQ_KAFKA_<KEY> works too",
    )


def kafka_conf_from_args(args: argparse.Namespace) -> dict:
    """The librdkafka conf of every client: ``RMQ_KAFKA_*`` env vars, then ``--kafka-option
    KEY=VALUE`` pairs (which win), then ``--bootstrap-servers``. Security settings
    (``security.protocol``, ``sasl.*``, ``ssl.*``) pass through untouched."""
    conf = kafka_env_conf()
    for option in args.kafka_option or []:
        key, sep, value = option.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--kafka-option {option!r}: want KEY=VALUE")
        conf[key.strip()] = value
    conf["bootstrap.servers"] = args.bootstrap_servers
    return conf


#: The coordinator's cap on the members of one transaction (it holds them in memory until the
#: transaction is decided, and sets a larger one aside as malformed): the wire's one constant.
MAX_TRANSACTION_MESSAGES = MAX_TXN_SIZE
MAX_TRANSACTION_BYTES = 16 * 1024 * 1024
# The SimpleConsumer engine's MAX_LEASED (simple/engine.py; a unit test holds them equal).
SIMPLE_MAX_LEASED = 128


@dataclass(frozen=True)
class ProducerSettings:
    """Tunables of a ``TransactionProducer`` and a ``Producer`` beyond their Kafka conf:
    kwargs of the constructor, else env ``RMQ_<NAME>`` (e.g. ``RMQ_MAX_TRANSACTION_BYTES``),
    else these. The timer settings (``max_delay_ms``, ``delay_levels``,
    ``timer_partitions``) are the ``Producer``'s; the transaction ones the other's; the group
    key both's."""

    max_transaction_messages: int = setting(
        MAX_TRANSACTION_MESSAGES,
        f"messages one send_transaction may carry (at most {MAX_TRANSACTION_MESSAGES})",
    )
    max_transaction_bytes: int = setting(
        MAX_TRANSACTION_BYTES,
        "bytes (keys, values and headers of its half records) one send_transaction may carry",
    )
    check_threads: int = setting(
        4,
        "threads answering back-checks (RocketMQ's setExecutorService): a hung "
        "check_local_transaction holds one until check_timeout_ms",
    )
    check_timeout_ms: int = setting(
        30_000,
        "a check_local_transaction running longer is answered UNKNOW (the coordinator "
        "checks again later) and its thread replaced",
    )
    check_affinity: bool = setting(
        True,
        "name this instance in its half records (rmq.check_affinity), so their back-checks "
        "come to it while it is a live member of the group",
    )

    max_delay_ms: int = setting(
        DEFAULT_MAX_DELAY_MS,
        "the furthest ahead a timer message may be scheduled (RocketMQ 5's timerMaxDelaySec, "
        "3 days); a later one is refused at send. The coordinator's max_delay_ms must not be "
        "lower",
    )
    delay_levels: str = setting(
        ROCKETMQ4_DELAY_LEVELS,
        "the delays of delay_time_level 1, 2, ... (RocketMQ 4's messageDelayLevel; units "
        "s, m, h, d)",
    )
    timer_partitions: int = setting(
        DEFAULT_TIMER_PARTITIONS,
        "partitions of the timer topics when this producer creates them (on its first "
        "scheduled send or recall); the coordinator's timer_partitions should match",
    )
    timer_cancels_max: int = setting(
        DEFAULT_TIMER_CANCELS_MAX,
        "the coordinators' timer_cancels_max (give the same value): recall_message raises "
        "TimerRecallRefused for a cancel past it, which the coordinators do not hold",
    )

    group_key: str = setting(
        "",
        "this producer group's key under tenant isolation (docs/security.md): its half "
        "records and end requests are signed with it and its checks read from its own "
        "check topic; empty: isolation off",
        secret=True,
    )
    group_key_file: str = setting(
        "", "a file holding group_key (surrounding whitespace stripped), e.g. a mounted secret"
    )

    def __post_init__(self) -> None:
        if self.group_key and self.group_key_file:
            raise ConfigError("group_key and group_key_file: give one of them, not both")
        if not isinstance(self.check_affinity, bool):
            raise ConfigError(f"check_affinity must be a bool, got {self.check_affinity!r}")
        for name in (
            "max_transaction_messages",
            "max_transaction_bytes",
            "check_threads",
            "check_timeout_ms",
            "timer_partitions",
            "timer_cancels_max",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.max_delay_ms, bool) or not isinstance(self.max_delay_ms, int):
            raise ConfigError(f"max_delay_ms must be an int, got {self.max_delay_ms!r}")
        if self.max_delay_ms < 1000:
            raise ConfigError(f"max_delay_ms must be at least 1000 (1 s), got {self.max_delay_ms}")
        too_long = [d for d in parse_delay_levels(self.delay_levels) if d > self.max_delay_ms]
        if too_long:
            raise ConfigError(
                f"delay_levels={self.delay_levels!r}: a delay of {too_long[0]} ms is over "
                f"max_delay_ms={self.max_delay_ms}"
            )
        if self.max_transaction_messages > MAX_TRANSACTION_MESSAGES:
            raise ConfigError(
                f"max_transaction_messages must be at most "
                f"{MAX_TRANSACTION_MESSAGES} (the coordinator's cap), got "
                f"{self.max_transaction_messages}"
            )


@dataclass(frozen=True)
class OrderlyConsumerSettings:
    """Settings of an ``OrderlyConsumer`` (both orderings) beyond its Kafka conf and the
    constructor's tuning arguments: kwargs of the constructor, else env ``RMQ_<NAME>``
    (``RMQ_CONSUMER_GROUP_KEY``), else these. Named apart from a producer's ``group_key``:
    one process may run a producer group and a consumer group, each with its own key."""

    consumer_group_key: str = setting(
        "",
        "this consumer group's key under tenant isolation (docs/security.md), from "
        "`rmq-semantics tenant key --consumer-group G`: its queue-lock requests are signed "
        "with it, and the coordinators decide no unsigned one; empty: isolation off",
        secret=True,
    )
    consumer_group_key_file: str = setting(
        "",
        "a file holding consumer_group_key (surrounding whitespace stripped), e.g. a "
        "mounted secret",
    )

    def __post_init__(self) -> None:
        if self.consumer_group_key and self.consumer_group_key_file:
            raise ConfigError(
                "consumer_group_key and consumer_group_key_file: give one of them, not both"
            )


@dataclass(frozen=True)
class SimpleConsumerSettings:
    """Tunables of a ``SimpleConsumer`` beyond its Kafka conf: kwargs of the constructor,
    else env ``RMQ_<NAME>`` (e.g. ``RMQ_MAX_DELIVERY_ATTEMPTS``), else these
    (docs/design/simple-consumer.md)."""

    await_duration: float = setting(
        20.0,
        "seconds a receive waits for a message when none is ready (RocketMQ's "
        "await_duration, its long poll); then it returns an empty list",
    )
    # The engine's defaults (simple/engine.py; importing it here would make a cycle through
    # rmq_semantics.orderly; tests/unit/test_simple_engine.py holds them equal).
    max_delivery_attempts: int = setting(
        16,
        "deliveries of a message without an ack before it goes to <prefix>_dlq_<group> "
        "(RocketMQ 5's maxDeliveryAttempts)",
    )
    max_leased: int = setting(
        100,
        "messages per partition delivered and not acked yet, at most 128; at the bound only "
        "redeliveries go out (their leases travel in the commit metadata, which Kafka caps "
        "at 4096 bytes)",
    )
    commit_interval_ms: int = setting(
        100,
        "acks are committed with the next receive, or by an ack or receive this long after "
        "the last commit; an instance that dies may see its last interval's acks redelivered",
    )
    fifo: bool = setting(
        True,
        "order the messages of one message group (rmq.message_group): one in flight per "
        "group, the next after the ack; False delivers every message concurrently",
    )
    operation_timeout_s: float = setting(
        30.0,
        "the bound of each blocking Kafka call (offset commit, committed-offset read, dead "
        "letter send, close)",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.fifo, bool):
            raise ConfigError(f"fifo must be a bool, got {self.fifo!r}")
        for name in ("max_delivery_attempts", "max_leased", "commit_interval_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_leased > SIMPLE_MAX_LEASED:
            raise ConfigError(
                f"max_leased must be at most {SIMPLE_MAX_LEASED} (the leases travel in the "
                f"offset commit's metadata, which Kafka caps at 4096 bytes), got "
                f"{self.max_leased!r}"
            )
        for name in ("await_duration", "operation_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}")
        if self.operation_timeout_s <= 0:
            raise ConfigError(f"operation_timeout_s must be > 0, got {self.operation_timeout_s!r}")


@dataclass(frozen=True)
class PushConsumerSettings:
    """Tunables of a ``PushConsumer`` beyond its Kafka conf and listener: kwargs of the
    constructor, else env ``RMQ_<NAME>`` (e.g. ``RMQ_FIFO_RETRY_INTERVAL_MS``), else these
    (docs/guides/push-consumer.md, "FIFO message groups")."""

    fifo: bool = setting(
        True,
        "order the messages of one message group (rmq.message_group): one in flight per "
        "group, in partition order, retried in place every fifo_retry_interval_ms; False "
        "consumes every message concurrently, retried through the retry topics",
    )
    fifo_retry_interval_ms: int = setting(
        1000,
        "how long a FIFO message the listener failed (RECONSUME_LATER, a raise, a timeout) "
        "waits before it is delivered again, in place, its group held behind it",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.fifo, bool):
            raise ConfigError(f"fifo must be a bool, got {self.fifo!r}")
        value = self.fifo_retry_interval_ms
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"fifo_retry_interval_ms must be an int >= 1, got {value!r}")
