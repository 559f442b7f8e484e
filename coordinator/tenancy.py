"""Tenant isolation (docs/security.md): which producer groups exist, whose principal each is,
which real topics the coordinator may write on each one's behalf, and whether a record
read from the shared half and Op topics was written by the group it names.

Kafka's ACLs keep a group's check requests to its own principal (one check topic per group)
and the marker key to the coordinators; they cannot say who wrote a record of the shared
half and Op topics, so that is proven by an HMAC under the group's key
(rmq_semantics/records/group_auth.py), derived from the tenant key only coordinators hold.
The allow-list keeps the coordinator, which writes real topics with its own principal, from
writing one on behalf of a group whose principal may not (a confused deputy): the timer
service asks the same :class:`AllowList` (``TenantGuard.judge_timer``). Pure apart
from reading the tenants and key files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.settings import CoordinatorSettings
from rmq_semantics.errors import ConfigError
from rmq_semantics.records.codec import SystemRecord
from rmq_semantics.records.group_auth import (
    cancel_canonical,
    derive_group_key,
    half_canonical,
    header,
    op_canonical,
    sign_half_headers,
    sign_timer_headers,
)
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.headers import H
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.records.timer import TimerRecord
from rmq_semantics.records.txn import EndRequest, EndRequests
from rmq_semantics.topics import SystemTopics, is_system_topic

__all__ = [
    "AllowList",
    "Tenant",
    "TenantGuard",
    "check_topic",
    "load_tenants",
    "parse_tenants",
    "read_tenant_key",
    "resign",
    "tenant_guard",
]

log = logging.getLogger(__name__)

# The tenants file's one format version: {"version": 1, "groups": {group: {...}}}.
TENANTS_VERSION = 1


@dataclass(frozen=True)
class Tenant:
    """One producer group: its Kafka principal (``User:orders``) and the real topics its
    transactions may be promoted into (exact names, and name prefixes)."""

    group: str
    principal: str
    topics: frozenset[str] = frozenset()
    topic_prefixes: tuple[str, ...] = ()


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: want a list of non-empty strings, got {value!r}")
    return value


def parse_tenants(data: object, prefix: str, source: str = "tenants") -> dict[str, Tenant]:
    """The tenants of a parsed tenants file; a wrong shape is one ConfigError naming it."""
    if (
        not isinstance(data, dict)
        or data.get("version") != TENANTS_VERSION
        or not isinstance(data.get("groups"), dict)
    ):
        raise ConfigError(
            f'{source}: want {{"version": {TENANTS_VERSION}, "groups": '
            '{GROUP: {"principal": "User:NAME", "topics": [...], '
            '"topic_prefixes": [...]}}}'
        )
    out: dict[str, Tenant] = {}
    for group, spec in data["groups"].items():
        where = f"{source}: group {group!r}"
        SystemTopics(prefix).group_check(group)  # a name Kafka takes, or one clear error
        if not isinstance(spec, dict) or set(spec) - {"principal", "topics", "topic_prefixes"}:
            raise ConfigError(f"{where}: want principal, topics and topic_prefixes only")
        principal = spec.get("principal")
        if not isinstance(principal, str) or ":" not in principal:
            raise ConfigError(f"{where}: principal must be like 'User:NAME', got {principal!r}")
        topics = _strings(spec.get("topics", []), f"{where} topics")
        prefixes = _strings(spec.get("topic_prefixes", []), f"{where} topic_prefixes")
        system = [
            t
            for t in [*topics, *prefixes]
            if is_system_topic(t, prefix) or f"{prefix}_".startswith(t)
        ]
        if system:
            raise ConfigError(f"{where}: {system} would let it promote into system topics")
        out[group] = Tenant(group, principal, frozenset(topics), tuple(prefixes))
    return out


def load_tenants(path: str, prefix: str) -> dict[str, Tenant]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--tenants-file {path}: cannot read it ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise ConfigError(f"--tenants-file {path}: not JSON ({exc})") from exc
    return parse_tenants(data, prefix, f"--tenants-file {path}")


def read_tenant_key(settings: CoordinatorSettings) -> bytes:
    if settings.tenant_key:
        return settings.tenant_key.encode()
    try:
        return Path(settings.tenant_key_file).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(
            f"--tenant-key-file {settings.tenant_key_file}: cannot read it ({exc.strerror or exc})"
        ) from exc


def tenant_guard(settings: CoordinatorSettings) -> TenantGuard | None:
    """The guard the settings ask for (a tenants file), or None: isolation off."""
    if not settings.tenants_file:
        return None
    return TenantGuard(
        load_tenants(settings.tenants_file, settings.topic_prefix),
        read_tenant_key(settings),
        SystemTopics(settings.topic_prefix),
    )


def check_topic(guard: TenantGuard | None, topics: SystemTopics, half: HalfMessage) -> str:
    """Where the check requests of ``half`` go: the shared check topic, or under tenant
    isolation its group's own."""
    return topics.check if guard is None else topics.group_check(half.producer_group)


def resign(guard: TenantGuard | None, half: HalfMessage, headers: list) -> list:
    """Headers of ``half`` re-appended by the coordinator, signed for its group under tenant
    isolation: a record trusted below the watermark stays trusted above it."""
    return headers if guard is None else guard.resign(half, headers)


class AllowList:
    """The real topics the coordinator may write for each producer group: a group outside
    the tenants, or a topic outside its group's names and prefixes, is refused. Whoever
    writes a real topic with the coordinator's principal on a group's behalf asks this
    first (promotion; timer delivery)."""

    def __init__(self, tenants: Mapping[str, Tenant]) -> None:
        self.tenants = dict(tenants)

    def refusal(self, group: str, topic: str) -> str | None:
        """Why ``group`` may not have ``topic`` written for it, or None if it may."""
        tenant = self.tenants.get(group)
        if tenant is None:
            return f"producer group {group!r} is not in the tenants file"
        if topic in tenant.topics or topic.startswith(tenant.topic_prefixes):
            return None
        return f"topic {topic!r} is not on producer group {group!r}'s allow-list"

    def allows(self, group: str, topic: str) -> bool:
        return self.refusal(group, topic) is None


class TenantGuard:
    """Judges half records and end requests under tenant isolation. ``watermarks``
    (``{"half": {p: offset}, "op": ...}``) name where records written before isolation was
    on end: those are not asked for a MAC (their topics still are for the allow-list)."""

    def __init__(
        self,
        tenants: Mapping[str, Tenant],
        tenant_key: bytes,
        topics: SystemTopics,
        watermarks: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        self.allow = AllowList(tenants)
        self.topics = topics
        self._keys = {g: derive_group_key(tenant_key, g) for g in tenants}
        self.watermarks(watermarks or {})

    def watermarks(self, marks: Mapping[str, Mapping[int, int]]) -> None:
        """Where records written before isolation was on end (read at startup)."""
        self._half_marks = dict(marks.get("half", {}))
        self._op_marks = dict(marks.get("op", {}))
        # By timer topic name without the prefix: "timer", "timer_cancel", "timer_<L>".
        self._timer_marks = {t: dict(m) for t, m in marks.items() if t.startswith("timer")}

    def _timer_legacy(self, name: str, partition: int, offset: int) -> bool:
        """Whether a timer topic's record was written before isolation was on."""
        return offset < self._timer_marks.get(name, {}).get(partition, 0)

    def topic_specs(
        self,
        specs: Mapping[str, tuple[int, dict[str, str]]],
    ) -> dict[str, tuple[int, dict[str, str]]]:
        """The per-group check topics, made like the shared one in ``specs``."""
        return {t: specs[self.topics.check] for t in self.check_topics()}

    def check_topics(self) -> list[str]:
        """Every group's own check topic."""
        return [self.topics.group_check(g) for g in self.allow.tenants]

    def judge_half(self, half: HalfMessage, topic: str) -> tuple[DiscardReason, str] | None:
        """None if ``half`` (read from ``topic``) may be checked and promoted, else why it is
        set aside (logged here)."""
        refused = self._judge_half(half)
        if refused is not None:
            log.warning(
                "%s[%s]@%s txn=%s to be set aside as %s: %s",
                topic,
                half.partition,
                half.offset,
                half.txn_id,
                *refused,
            )
        return refused

    def _judge_half(self, half: HalfMessage) -> tuple[DiscardReason, str] | None:
        key = self._keys.get(half.producer_group)
        if key is None:
            return DiscardReason.FORGED, (
                f"producer group {half.producer_group!r} is not in the tenants file"
            )
        legacy = half.offset < self._half_marks.get(half.partition, 0)
        canonical = half_canonical(
            half.producer_group,
            half.txn_id,
            half.real_topic,
            half.real_partition,
            half.txn_size,
            half.txn_index,
            half.key,
            half.value,
        )
        if not legacy and not key.verifies(canonical, header(half.headers, H.GROUP_MAC)):
            return DiscardReason.FORGED, (
                f"no valid {H.GROUP_MAC} of producer group {half.producer_group!r}"
            )
        refusal = self.allow.refusal(half.producer_group, half.real_topic)
        return None if refusal is None else (DiscardReason.NOT_ALLOWED, refusal)

    def trusted_end(self, msg: Any, record: SystemRecord, rejected: Any) -> bool:
        """Whether an Op record ``msg`` (decoded: ``record``) may be acted on: anything but
        an end request, or one its group signed. Else it is logged and counted in
        ``rejected`` (``rmq_rejected_requests_total{reason="unauthenticated"}``)."""
        if not isinstance(record, (EndRequest, EndRequests)):
            return True
        refused = self.end_refusal(
            msg.partition(), msg.offset(), record.producer_group, msg.value(), msg.headers()
        )
        if refused is None:
            return True
        rejected.labels("unauthenticated").inc()
        log.warning(
            "%s[%s]@%s txn=%s rejected: %s",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            getattr(record, "txn_id", "(a batch)"),
            refused,
        )
        return False

    def end_refusal(
        self,
        partition: int,
        offset: int,
        group: str,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] | None,
    ) -> str | None:
        """None if an end request (or a batch of them) at Op ``partition``@``offset``
        naming ``group`` was written by that group, else why it is not trusted."""
        if offset < self._op_marks.get(partition, 0):
            return None
        key = self._keys.get(group)
        if key is None:
            return f"producer group {group!r} is not in the tenants file"
        if not key.verifies(
            op_canonical(self.topics.op, partition, value), header(headers, H.GROUP_MAC)
        ):
            return f"no valid {H.GROUP_MAC} of producer group {group!r}"
        return None

    def judge_timer(self, record: TimerRecord) -> tuple[DiscardReason, str] | None:
        """None if timer ``record`` was signed by the group it names and may be delivered
        to its real topic, else why it is set aside (``forged`` / ``not_allowed``)."""
        group = record.producer_group
        key = self._keys.get(group) if group else None
        if group is None or key is None:
            return DiscardReason.FORGED, f"producer group {group!r} is not in the tenants file"
        lane = "timer" if record.level == 0 else f"timer_{record.level}"
        legacy = self._timer_legacy(lane, record.partition, record.offset)
        if not legacy and not key.verifies(record.canonical(), record.group_mac):
            return DiscardReason.FORGED, f"no valid {H.GROUP_MAC} of producer group {group!r}"
        refusal = self.allow.refusal(group, record.real_topic)
        return None if refusal is None else (DiscardReason.NOT_ALLOWED, refusal)

    def cancel_refusal(
        self,
        topic: str,
        partition: int,
        group: str,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] | None,
        *,
        offset: int | None = None,
    ) -> str | None:
        """None if a cancel record at ``topic[partition]`` (at ``offset``) naming ``group``
        was written by that group, or before isolation was on; else why it is not trusted."""
        key = self._keys.get(group)
        if key is None:
            return f"producer group {group!r} is not in the tenants file"
        if offset is not None and self._timer_legacy("timer_cancel", partition, offset):
            return None
        if not key.verifies(
            cancel_canonical(topic, partition, value), header(headers, H.GROUP_MAC)
        ):
            return f"no valid {H.GROUP_MAC} of producer group {group!r}"
        return None

    def resign_timer(self, record: TimerRecord, headers: list) -> list:
        """Headers of timer ``record`` re-appended to a level, signed with its group's key:
        a record of before the switch, trusted below its watermark, stays trusted above."""
        key = self._keys.get(record.producer_group or "")
        return (
            headers if key is None else sign_timer_headers(key, headers, record.key, record.value)
        )

    def resign(self, half: HalfMessage, headers: list) -> list:
        """Headers of ``half`` written again by the coordinator (a re-append), signed with
        its group's key: a record trusted below the watermark stays trusted above it."""
        key = self._keys.get(half.producer_group)
        return headers if key is None else sign_half_headers(key, headers, half.key, half.value)
