"""Tenant isolation (docs/security.md): which producer groups exist, whose principal each is,
which real topics the coordinator may write on each one's behalf, and whether a record
read from the shared half and Op topics was written by the group it names.

Kafka's ACLs keep a group's check requests to its own principal (one check topic per group)
and the marker key to the coordinators; they cannot say who wrote a record of the shared
half and Op topics, so that is proven by an HMAC under the group's key
(rmq_semantics/records/group_auth.py), derived from the tenant key only coordinators hold.
The allow-list is what keeps the coordinator, which may write every real topic, from
writing one on behalf of a group whose principal may not: the timer service (a later issue)
asks the same :class:`AllowList`. Pure apart from reading the tenants and key files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from coordinator.settings import CoordinatorSettings
from rmq_semantics.errors import ConfigError
from rmq_semantics.topics import SystemTopics, is_system_topic

__all__ = ["AllowList", "Tenant", "load_tenants", "parse_tenants", "read_tenant_key"]

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
    if not isinstance(data, dict) or data.get("version") != TENANTS_VERSION \
            or not isinstance(data.get("groups"), dict):
        raise ConfigError(f"{source}: want {{\"version\": {TENANTS_VERSION}, \"groups\": "
                          "{GROUP: {\"principal\": \"User:NAME\", \"topics\": [...], "
                          "\"topic_prefixes\": [...]}}}")
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
        system = [t for t in [*topics, *prefixes] if is_system_topic(t, prefix)
                  or f"{prefix}_".startswith(t)]
        if system:
            raise ConfigError(f"{where}: {system} would let it promote into system topics")
        out[group] = Tenant(group, principal, frozenset(topics), tuple(prefixes))
    return out


def load_tenants(path: str, prefix: str) -> dict[str, Tenant]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--tenants-file {path}: cannot read it ({exc.strerror or exc})") \
            from exc
    except ValueError as exc:
        raise ConfigError(f"--tenants-file {path}: not JSON ({exc})") from exc
    return parse_tenants(data, prefix, f"--tenants-file {path}")


def read_tenant_key(settings: CoordinatorSettings) -> bytes:
    if settings.tenant_key:
        return settings.tenant_key.encode()
    try:
        return Path(settings.tenant_key_file).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"--tenant-key-file {settings.tenant_key_file}: cannot read it "
                          f"({exc.strerror or exc})") from exc


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
