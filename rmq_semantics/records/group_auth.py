"""Tenant isolation on the wire: a producer group's key, the MAC it puts on its half records,
end requests, timer records and cancel records (header ``rmq.group_mac``), and the name of
its own check topic.

Kafka cannot say which principal wrote a record of the shared half and Op topics, so a
record's ``rmq.producer_group`` is only a claim; with tenant isolation on, the coordinator
acts on a claim only when the record carries an HMAC-SHA256 under that group's key (derived
from the coordinators' tenant key: :func:`derive_group_key`; docs/security.md). The MAC of a
half record covers what decides where and what is promoted (group, transaction id, real
topic and partition, membership, key and value digests), not header order nor affinity, so
a re-appended or re-driven copy still verifies; an end request's covers its Op topic,
partition and the bytes of its value. A timer record's covers what decides what is
delivered, where and when (:func:`timer_canonical`), so its copies on the level topics still
verify; a cancel record's is like an end request's. A consumer group's key (its own
derivation, :func:`derive_consumer_group_key`: producer and consumer groups are separate
name spaces) signs its lock requests (:func:`sign_lock_request`). Pure: no Kafka import.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import replace

from rmq_semantics.errors import ConfigError
from rmq_semantics.message import Headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.locks import LockRequest

__all__ = [
    "MAX_TOPIC_LENGTH",
    "MIN_GROUP_KEY_BYTES",
    "GroupKey",
    "cancel_canonical",
    "derive_consumer_group_key",
    "derive_group_key",
    "encode_group",
    "half_canonical",
    "header",
    "lock_request_verifies",
    "op_canonical",
    "sign_half_headers",
    "sign_lock_request",
    "sign_timer_headers",
    "timer_canonical",
]

MIN_GROUP_KEY_BYTES = 16
# Separate these MACs from any other use of a key; bump them if a canonical form changes.
HALF_DOMAIN = "rmq.group-half.v1"
OP_DOMAIN = "rmq.group-op.v1"
TIMER_DOMAIN = "rmq.group-timer.v1"
CANCEL_DOMAIN = "rmq.group-timer-cancel.v1"
_DERIVE_LABEL = b"rmq.group-key.v1\x00"
# A consumer group named like a producer group is another team's: another key.
_CONSUMER_DERIVE_LABEL = b"rmq.consumer-group-key.v1\x00"
# Kafka's limit on a topic name.
MAX_TOPIC_LENGTH = 249
# Kept as they are in a group's topic name: Kafka accepts them and none is the escape or
# '.', which Kafka treats as colliding with '_' in metric names.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def encode_group(group: str) -> str:
    """``group`` as a legal, collision-free part of a topic name: letters, digits and '-'
    stay, every other UTF-8 byte becomes ``_xx`` (lowercase hex). '_' only ever starts an
    escape, so two groups never share a name."""
    if not group:
        raise ConfigError("a producer group name must not be empty")
    return "".join(c if c in _PLAIN else "".join(f"_{b:02x}" for b in c.encode()) for c in group)


def header(headers: Iterable[tuple[str, bytes | None]] | None, name: str) -> bytes | None:
    """The first value of header ``name``, or None."""
    return next((v for k, v in headers or () if k == name), None)


def _digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def half_canonical(
    group: str,
    txn_id: str,
    real_topic: str,
    real_partition: int | None,
    txn_size: int,
    txn_index: int,
    key: bytes | None,
    value: bytes | None,
) -> bytes:
    """The bytes a half record's MAC covers."""
    return json.dumps(
        [
            HALF_DOMAIN,
            group,
            txn_id,
            real_topic,
            real_partition,
            txn_size,
            txn_index,
            _digest(key),
            _digest(value),
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


def op_canonical(op_topic: str, partition: int, value: bytes | None) -> bytes:
    """The bytes an end request's MAC covers: where it is and what it says."""
    return json.dumps(
        [OP_DOMAIN, op_topic, partition, _digest(value)], separators=(",", ":")
    ).encode()


def timer_canonical(
    group: str,
    timer_id: str,
    real_topic: str,
    real_partition: int | None,
    deliver_at_ms: int,
    born_ts: int,
    key: bytes | None,
    value: bytes | None,
) -> bytes:
    """The bytes a timer record's MAC covers: what decides what is delivered, where and
    when; not the topic or offset it is read at, so a copy the coordinator re-appends to a
    level topic still verifies."""
    return json.dumps(
        [
            TIMER_DOMAIN,
            group,
            timer_id,
            real_topic,
            real_partition,
            deliver_at_ms,
            born_ts,
            _digest(key),
            _digest(value),
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


def cancel_canonical(cancel_topic: str, partition: int, value: bytes | None) -> bytes:
    """The bytes a cancel record's MAC covers: where it is and what it says (its value
    names the message id and the group)."""
    return json.dumps(
        [CANCEL_DOMAIN, cancel_topic, partition, _digest(value)], separators=(",", ":")
    ).encode()


class GroupKey:
    """One producer group's secret. Its repr and str never show it."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) < MIN_GROUP_KEY_BYTES:
            size = len(key) if isinstance(key, bytes) else type(key).__name__
            raise ConfigError(
                f"a group key must be at least {MIN_GROUP_KEY_BYTES} bytes, got "
                f"{size}; derive it with `rmq-semantics tenant key --group G`"
            )
        self._key = key

    def mac(self, canonical: bytes) -> bytes:
        return hmac.new(self._key, canonical, hashlib.sha256).digest()

    def verifies(self, canonical: bytes, mac: bytes | None) -> bool:
        return mac is not None and hmac.compare_digest(self.mac(canonical), mac)

    def text(self) -> str:
        """The key itself, for ``rmq-semantics tenant key`` to hand to the group's owners."""
        return self._key.decode(errors="replace")

    def __repr__(self) -> str:
        return "GroupKey(<hidden>)"

    __str__ = __repr__


def derive_group_key(tenant_key: bytes, group: str) -> GroupKey:
    """``group``'s key from the coordinators' tenant key (an HMAC of the group's name): the
    coordinators hold one secret, each group's producers only their own key."""
    return _derive(tenant_key, _DERIVE_LABEL, group)


def derive_consumer_group_key(tenant_key: bytes, group: str) -> GroupKey:
    """Consumer group ``group``'s key (its orderly consumers sign their lock requests with
    it), derived like a producer group's under a label of its own."""
    return _derive(tenant_key, _CONSUMER_DERIVE_LABEL, group)


def _derive(tenant_key: bytes, label: bytes, group: str) -> GroupKey:
    if len(tenant_key) < MIN_GROUP_KEY_BYTES:
        raise ConfigError(
            f"the tenant key must be at least {MIN_GROUP_KEY_BYTES} bytes, got "
            f"{len(tenant_key)}; generate one with `openssl rand -base64 32`"
        )
    raw = hmac.new(
        tenant_key, label + group.encode(errors="surrogatepass"), hashlib.sha256
    ).hexdigest()
    return GroupKey(raw.encode())


def sign_lock_request(
    key: GroupKey, topic: str, partition: int, request: LockRequest
) -> LockRequest:
    """``request`` with its consumer group's MAC, for request ``topic``[``partition``]."""
    return replace(request, mac=key.mac(request.canonical(topic, partition)))


def lock_request_verifies(key: GroupKey, topic: str, partition: int, request: LockRequest) -> bool:
    """Whether ``request``, read at ``topic``[``partition``], carries ``key``'s MAC."""
    return key.verifies(request.canonical(topic, partition), request.mac)


def sign_half_headers(
    key: GroupKey, headers: Headers, record_key: bytes | None, value: bytes | None
) -> Headers:
    """``headers`` of a half record with its ``rmq.group_mac`` (replacing any); unchanged if
    they lack what a half record needs (the coordinator sets such a record aside anyway)."""
    found = {k: v for k, v in headers if k.startswith("rmq.")}
    try:
        size = int(found.get(H.TXN_SIZE) or 1)
        index = int(found.get(H.TXN_INDEX) or 0)
        real_partition = found.get(H.REAL_PARTITION)
        canonical = half_canonical(
            found[H.PRODUCER_GROUP].decode(),
            found[H.TXN_ID].decode(),
            found[H.REAL_TOPIC].decode(),
            int(real_partition) if real_partition else None,
            size,
            index,
            record_key,
            value,
        )
    except (KeyError, ValueError, AttributeError, UnicodeDecodeError):
        return list(headers)
    return [*((k, v) for k, v in headers if k != H.GROUP_MAC), (H.GROUP_MAC, key.mac(canonical))]


def sign_timer_headers(
    key: GroupKey, headers: Headers, record_key: bytes | None, value: bytes | None
) -> Headers:
    """``headers`` of a timer record with its ``rmq.group_mac`` (replacing any); unchanged
    if they lack what a signed timer record needs (the coordinator sets it aside anyway)."""
    found = {k: v for k, v in headers if k.startswith("rmq.")}
    try:
        real_partition = found.get(H.REAL_PARTITION)
        canonical = timer_canonical(
            found[H.PRODUCER_GROUP].decode(),
            found[H.TIMER_ID].decode(),
            found[H.REAL_TOPIC].decode(),
            int(real_partition) if real_partition else None,
            int(found[H.DELIVER_AT]),
            int(found[H.BORN_TS]),
            record_key,
            value,
        )
    except (KeyError, ValueError, AttributeError, UnicodeDecodeError):
        return list(headers)
    return [*((k, v) for k, v in headers if k != H.GROUP_MAC), (H.GROUP_MAC, key.mac(canonical))]
