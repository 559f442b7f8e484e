"""The transactional producer's public types: RocketMQ's ``TransactionListener`` contract
(local transaction states, the listener base), the send result, and the view a listener gets
of a transaction of several messages. Pure: no Kafka import."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rmq_semantics.errors import ConfigError
from rmq_semantics.message import Headers, Message

__all__ = [
    "LocalTransactionState",
    "Transaction",
    "TransactionListener",
    "TransactionSendResult",
    "as_listener",
    "as_state",
]

log = logging.getLogger("rmq_semantics.transaction")


class LocalTransactionState(Enum):
    """Outcome of a local transaction (RocketMQ's spelling; ``UNKNOWN`` is an alias)."""

    COMMIT_MESSAGE = "COMMIT"
    ROLLBACK_MESSAGE = "ROLLBACK"
    UNKNOW = "UNKNOWN"
    UNKNOWN = "UNKNOWN"


class TransactionListener:
    """Implement both methods; an exception or ``None`` counts as ``UNKNOW``. ``msg`` is a
    :class:`Message`, or a :class:`Transaction` for one sent with ``send_transaction``.

    RocketMQ's names, ``executeLocalTransaction`` and ``checkLocalTransaction``, are
    aliases: a listener ported from Java that defines them instead is called by them."""

    def execute_local_transaction(
        self, msg: Message | Transaction, arg: Any
    ) -> LocalTransactionState:
        return _java_method(self, "executeLocalTransaction")(msg, arg)

    def check_local_transaction(self, msg: Message | Transaction) -> LocalTransactionState:
        return _java_method(self, "checkLocalTransaction")(msg)


def _java_method(listener: object, name: str) -> Any:
    method = getattr(listener, name, None)
    if not callable(method):
        python = "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
        raise NotImplementedError(
            f"{type(listener).__name__} implements neither {python} nor RocketMQ's {name}"
        )
    return method


class _RocketMQNamed(TransactionListener):
    """A listener that is no TransactionListener and has only RocketMQ's names."""

    def __init__(self, listener: Any) -> None:
        self.listener = listener
        # Bound as they are, so an ``async def`` one is still seen as a coroutine function.
        self.execute_local_transaction = listener.executeLocalTransaction  # type: ignore[method-assign]
        if callable(check := getattr(listener, "checkLocalTransaction", None)):
            self.check_local_transaction = check  # type: ignore[method-assign]


def as_listener(listener: Any) -> Any:
    """``listener`` as the producers call it: itself, or, for an object that has only
    RocketMQ's ``executeLocalTransaction`` (duck-typed, no TransactionListener base), one
    that calls RocketMQ's names."""
    if (
        listener is not None
        and not callable(getattr(listener, "execute_local_transaction", None))
        and callable(getattr(listener, "executeLocalTransaction", None))
    ):
        return _RocketMQNamed(listener)
    return listener


@dataclass(frozen=True)
class TransactionSendResult:
    """Where the half message went and what the local transaction said. For a transaction
    of several messages, ``half_partition`` holds every one of them and ``half_offset`` is
    the first one's (the offset the end request and the back-checks name)."""

    transaction_id: str
    local_transaction_state: LocalTransactionState
    half_partition: int
    half_offset: int
    producer_group: str = ""
    message_count: int = 1


def _first(name: str) -> property:
    return property(
        lambda self: getattr(self.messages[0], name), doc=f"The first message's ``{name}``."
    )


@dataclass(frozen=True)
class Transaction:
    """What the listener gets for a transaction sent with ``send_transaction``: its id, its
    messages and, for a listener written for one message, the first message's fields
    (``topic``, ``value``, ``key``, ``headers``, ``tags``, ``keys``, ...).

    In ``check_local_transaction`` only the first message travels: ``messages`` is
    ``(first,)`` and ``message_count`` says how many the transaction has. All of them would
    not fit one check record (a transaction may hold 16 MiB, a record ``max.message.bytes``).
    """

    transaction_id: str
    messages: tuple[Message, ...]
    message_count: int
    #: In a back-check: its number (1 first) and the transaction's birth time (ms).
    check_times: int | None = None
    born_timestamp: int | None = None

    topic = _first("topic")
    value = _first("value")
    key = _first("key")
    headers = _first("headers")
    partition = _first("partition")
    tags = _first("tags")
    keys = _first("keys")
    message_group = _first("message_group")
    check_immunity_ms = _first("check_immunity_ms")

    def __post_init__(self) -> None:
        if not self.messages:
            raise ConfigError("a Transaction needs at least one message")

    def user_headers(self) -> Headers:
        """The first message's user headers."""
        return self.messages[0].user_headers()


def as_state(
    value: Any, method: str, half_topic: str, partition: int, offset: int, txn_id: str
) -> LocalTransactionState:
    """The listener's answer; anything but a LocalTransactionState counts as UNKNOW and is
    logged (None, the documented "don't know", only at debug level)."""
    if isinstance(value, LocalTransactionState):
        return value
    if value is None:
        log.debug(
            "%s[%d]@%d txn=%s: %s returned None (counts as UNKNOW)",
            half_topic,
            partition,
            offset,
            txn_id,
            method,
        )
    else:
        log.warning(
            "%s[%d]@%d txn=%s: %s returned %r, not a LocalTransactionState (counts as UNKNOW)",
            half_topic,
            partition,
            offset,
            txn_id,
            method,
            value,
        )
    return LocalTransactionState.UNKNOW
