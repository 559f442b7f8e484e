"""Multi-message transactions (issue 18): the half records of one, the bounds checked before
anything is written, and what a back-check of one hands the listener. Pure: no Kafka import.

A transaction of N >= 2 messages is N half records ("members") in ONE half partition, chosen
from the transaction id; each carries ``rmq.txn_size`` = N and its ``rmq.txn_index``. Its
identity in the protocol is member 0: the end request and every back-check name member 0's
offset. A transaction of one carries neither header: it is today's half record.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from rmq_semantics.errors import ConfigError, TransactionSizeError
from rmq_semantics.message import Headers, Message
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.transaction_api import Transaction

__all__ = [
    "check_members",
    "check_view",
    "half_partition_for",
    "listener_message",
    "member_headers",
    "record_bytes",
]


def listener_message(msg: Message, txn_id: str) -> Message:
    """``msg`` as a listener sees it: with its transaction id."""
    return dataclasses.replace(msg, transaction_id=txn_id)


def half_partition_for(txn_id: str, half_partitions: int) -> int:
    """The one half partition of every member of transaction ``txn_id``."""
    return zlib.crc32(txn_id.encode()) % half_partitions


def record_bytes(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """What a record weighs against ``max_transaction_bytes``: key, value and headers."""
    return (
        len(key or b"")
        + len(value or b"")
        + sum(len(name.encode()) + len(raw or b"") for name, raw in headers)
    )


def check_members(msgs: Sequence[Message], *, max_messages: int) -> None:
    """Raise :class:`TransactionSizeError` for an empty list or one of more than
    ``max_messages``, :class:`ConfigError` for an item that is not a Message (before
    anything is validated against the broker or written)."""
    if not msgs:
        raise TransactionSizeError("send_transaction: no messages (a transaction needs 1 or more)")
    if len(msgs) > max_messages:
        raise TransactionSizeError(
            f"send_transaction: {len(msgs)} messages, more than max_transaction_messages="
            f"{max_messages}; nothing was written"
        )
    for index, msg in enumerate(msgs):
        if not isinstance(msg, Message):
            raise ConfigError(
                f"send_transaction: messages[{index}] is a {type(msg).__name__}, not a Message"
            )


def member_headers(
    msgs: Sequence[Message],
    txn_id: str,
    producer_group: bytes,
    born_ts: bytes,
    *,
    max_messages: int,
    max_bytes: int,
    affinity: Sequence[tuple[str, bytes]] = (),
) -> list[Headers]:
    """The half-record headers of every member of one transaction, in index order; raises
    as :func:`check_members`, and :class:`TransactionSizeError` for members over
    ``max_bytes`` (before anything is written)."""
    check_members(msgs, max_messages=max_messages)
    size = len(msgs)
    out, total = [], 0
    for index, msg in enumerate(msgs):
        headers = half_headers(msg, txn_id, producer_group, born_ts, affinity)
        if size > 1:
            headers += [(H.TXN_SIZE, str(size).encode()), (H.TXN_INDEX, str(index).encode())]
        total += record_bytes(msg.key, msg.value, headers)  # type: ignore[arg-type]  # bytes once built
        out.append(headers)
    if total > max_bytes:
        raise TransactionSizeError(
            f"send_transaction: {size} messages of {total:,} bytes (keys, values and "
            f"headers), more than max_transaction_bytes={max_bytes:,}; nothing was written"
        )
    return out


def check_view(check: CheckRequest) -> Message | Transaction:
    """What ``check_local_transaction`` gets: the checked message as before, or, for a
    member of a multi-message transaction, a :class:`Transaction` of it and the count."""
    msg = Message(
        check.topic,
        check.value,
        key=check.key,
        headers=check.user_headers(),  # type: ignore[arg-type]  # a null value becomes b""
        partition=check.partition,
        transaction_id=check.txn_id,
        tags=check.header_text(H.TAGS),
        keys=check.header_text(H.KEYS),
        message_group=check.header_text(H.MESSAGE_GROUP) or None,
        check_times=check.check_seq,
        born_timestamp=check.born_ts,
    )
    size = check.header_text(H.TXN_SIZE)
    if size is None or not (size.isascii() and size.isdigit()) or int(size) < 2:
        return msg  # a transaction of one (a malformed size is never checked)
    return Transaction(
        check.txn_id, (msg,), int(size), check_times=check.check_seq, born_timestamp=check.born_ts
    )
