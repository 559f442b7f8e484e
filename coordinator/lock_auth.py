"""Tenant isolation of queue locks (docs/security.md, "Consumer groups"): under a tenants
file, a lock or unlock request is decided only when it carries the MAC of the consumer
group it names, under that group's key (derived from the tenant key the coordinators hold,
:func:`rmq_semantics.records.group_auth.derive_consumer_group_key`).

Kafka's ACLs let every orderly consumer principal write the one request topic and read the
one reply topic, so a principal learns other groups' client ids and epochs from the replies
and could write requests in their name; it cannot hold another group's key. Pure apart from
reading the tenant key file."""

from __future__ import annotations

from collections import OrderedDict

from coordinator.settings import CoordinatorSettings
from coordinator.tenancy import read_tenant_key
from rmq_semantics.records.group_auth import (
    GroupKey,
    derive_consumer_group_key,
    lock_request_verifies,
)
from rmq_semantics.records.locks import LockRequest

__all__ = ["UNAUTHENTICATED", "LockGuard", "lock_guard"]

#: The reason a refused queue's result carries (and the lock-event counter's label).
UNAUTHENTICATED = "unauthenticated"
# Derived keys kept (a group name comes from an untrusted record: the cache is bounded).
KEY_CACHE = 1024


class LockGuard:
    """Judges lock requests under tenant isolation; every consumer group's key derives
    from ``tenant_key``, so no list of groups is needed (a group nobody was given the key
    of signs nothing)."""

    def __init__(self, tenant_key: bytes) -> None:
        derive_consumer_group_key(tenant_key, "")  # a short key is one ConfigError, now
        self._tenant_key = tenant_key
        self._keys: OrderedDict[str, GroupKey] = OrderedDict()

    def __repr__(self) -> str:
        return "LockGuard(<hidden>)"

    def _key(self, group: str) -> GroupKey:
        key = self._keys.get(group)
        if key is None:
            key = self._keys[group] = derive_consumer_group_key(self._tenant_key, group)
            if len(self._keys) > KEY_CACHE:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(group)
        return key

    def refusal(self, topic: str, partition: int, request: LockRequest) -> str | None:
        """None if ``request`` (read at ``topic``[``partition``]) was signed by the
        consumer group it names, else why it is not decided."""
        if request.mac is None:
            return f"no mac, and consumer group {request.group!r} must sign its requests"
        if not lock_request_verifies(self._key(request.group), topic, partition, request):
            return f"no valid mac of consumer group {request.group!r}"
        return None


def lock_guard(settings: CoordinatorSettings) -> LockGuard | None:
    """The guard the settings ask for (a tenants file), or None: isolation off."""
    if not settings.tenants_file:
        return None
    return LockGuard(read_tenant_key(settings))
