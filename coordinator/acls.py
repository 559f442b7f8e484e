"""The Kafka ACLs of tenant isolation, per principal, generated from the tenants file the
coordinators read (docs/security.md): the allow-list a group's transactions are promoted
into IS the set of real topics its principal gets WRITE on, so the coordinator never writes
for a group where that group could not write itself. ``rmq-semantics tenant acls`` prints
them as ``kafka-acls.sh`` commands; the docs' table is rendered by :func:`markdown_table`
and a unit test keeps the two equal.

Every ACL a producer or consumer principal gets on a topic or a group is LITERAL: a
prefixed ``__rmq_check_ga`` would also match ``__rmq_check_gab``, and a prefixed ``__rmq_``
would cover ``__rmq_keys``. Only the coordinators, the operators and Spark's own consumer
groups get prefixed ones, and a push consumer group its transactional ids
``<prefix>_push_<group>@<instance>``: prefixed ``<prefix>_push_<group>@``, a name that ends
at its group because a push group's name may not hold ``@``.

A consumer group says what it runs (``kind`` in the tenants file's ``consumers``), and gets
what that class touches: ``plain`` (``Consumer``) its topics and group; ``orderly``
(``OrderlyConsumer``) also the lock request and reply topics and its DLQ; ``push``
(``PushConsumer``) also its retry topics, DLQ and transactional ids; ``simple``
(``SimpleConsumer``) also its DLQ. The operators read every DLQ and re-drive into its
group's topics (``dlq redrive``).

librdkafka asks for the coordinator of a consumer's ``group.id`` even when the consumer only
``assign()``s (confluent-kafka refuses a consumer without one): such a reader's group gets
a literal DESCRIBE, which FindCoordinator needs, and nothing else (no READ: nobody joins it
or commits to it).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from coordinator.lock_clients import lock_coordinator_group
from coordinator.tenancy import Tenant, parse_tenants
from rmq_semantics.errors import ConfigError
from rmq_semantics.push.retry import DEFAULT_DELAY_LEVELS
from rmq_semantics.records.group_auth import derive_consumer_group_key, derive_group_key
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, SystemTopics

__all__ = [
    "Acl",
    "Principals",
    "acl_bindings",
    "kafka_acls_commands",
    "markdown_table",
    "parse_consumers",
    "register_cli",
]

LITERAL, PREFIXED = "literal", "prefixed"
TOPIC, GROUP, TXN_ID = "topic", "group", "transactional-id"
ROLES = ("producer group", "consumer group", "coordinator", "Spark job", "operators' CLI")
#: What a consumer group runs: ``Consumer``, ``OrderlyConsumer``, ``PushConsumer``,
#: ``SimpleConsumer``.
KINDS = ("plain", "orderly", "push", "simple")
WITH_DLQ = ("orderly", "push", "simple")


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW binding: ``principal`` may do ``operations`` on a resource."""

    role: str
    principal: str
    resource: str  # TOPIC, GROUP or TXN_ID
    name: str
    pattern: str  # LITERAL or PREFIXED
    operations: tuple[str, ...]  # READ, WRITE, DESCRIBE, CREATE, DESCRIBE_CONFIGS


@dataclass(frozen=True)
class Consumer:
    """A consumer group of the deployment: its principal, the real topics it reads, what it
    runs (one of :data:`KINDS`) and, for a push group, how many retry levels (its
    ``delay_levels``) it has."""

    group: str
    principal: str
    topics: tuple[str, ...]
    kind: str = "plain"
    retry_levels: int = len(DEFAULT_DELAY_LEVELS)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(
                f"consumer group {self.group!r}: kind {self.kind!r} is none of {', '.join(KINDS)}"
            )
        if self.kind == "push" and "@" in self.group:
            # Its transactional ids' prefixed ACL ends at the '@' after the group's name.
            raise ConfigError(
                f"push consumer group {self.group!r}: a name with '@' cannot be isolated "
                "(its transactional ids are <prefix>_push_<group>@<instance>)"
            )
        if isinstance(self.retry_levels, bool) or not isinstance(self.retry_levels, int):
            raise ConfigError(f"consumer group {self.group!r}: retry_levels must be an int")
        if self.retry_levels < 1:
            raise ConfigError(f"consumer group {self.group!r}: retry_levels must be >= 1")


@dataclass(frozen=True)
class Principals:
    """Who runs what: the coordinators, the operators' ``txn`` CLI, the Spark job."""

    coordinator: str
    operators: str | None = None
    spark: str | None = None
    spark_topics: tuple[str, ...] = ()


def _real_topics(tenant: Tenant) -> list[tuple[str, str]]:
    return [
        *((t, LITERAL) for t in sorted(tenant.topics)),
        *((p, PREFIXED) for p in tenant.topic_prefixes),
    ]


def acl_bindings(
    tenants: Mapping[str, Tenant],
    principals: Principals,
    consumers: tuple[Consumer, ...] = (),
    prefix: str = DEFAULT_TOPIC_PREFIX,
) -> list[Acl]:
    """Every ACL of a deployment under tenant isolation, in a stable order."""
    t = SystemTopics(prefix)
    out: list[Acl] = []
    rw = ("WRITE", "DESCRIBE")
    for group, tenant in sorted(tenants.items()):
        role, who, own = "producer group", tenant.principal, t.group_check(group)
        out += [
            Acl(role, who, TOPIC, t.half, LITERAL, rw),
            Acl(role, who, TOPIC, t.op, LITERAL, rw),
            # CREATE: a producer may start before the coordinators create its topic; so may
            # a Producer that schedules (timer messages) or recalls one.
            Acl(role, who, TOPIC, own, LITERAL, ("READ", "DESCRIBE", "CREATE")),
            Acl(role, who, TOPIC, t.timer, LITERAL, (*rw, "CREATE")),
            Acl(role, who, TOPIC, t.timer_cancel, LITERAL, (*rw, "CREATE")),
            Acl(role, who, GROUP, own, LITERAL, ("READ",)),
        ]
        # DESCRIBE_CONFIGS: the send-time check of a message's size against the topic's.
        out += [
            Acl(role, who, TOPIC, name, pattern, (*rw, "DESCRIBE_CONFIGS"))
            for name, pattern in _real_topics(tenant)
        ]
    for c in consumers:
        out += _consumer_acls(c, t)
    role, who = "coordinator", principals.coordinator
    locks = lock_coordinator_group(prefix)
    out += [
        Acl(
            role,
            who,
            TOPIC,
            f"{prefix}_",
            PREFIXED,
            ("READ", "WRITE", "DESCRIBE", "CREATE", "DESCRIBE_CONFIGS"),
        ),
        Acl(role, who, GROUP, t.coordinator_group, LITERAL, ("READ", "DESCRIBE")),
        Acl(role, who, GROUP, locks, LITERAL, ("READ",)),
        Acl(role, who, GROUP, t.timer_group, LITERAL, ("READ",)),
        # The assign-only readers of the keys, lock and (read-back) delivery records.
        Acl(role, who, GROUP, f"{t.keys}-reader", LITERAL, ("DESCRIBE",)),
        Acl(role, who, GROUP, f"{locks}-reader", LITERAL, ("DESCRIBE",)),
        Acl(role, who, GROUP, f"{t.timer_group}-reader", LITERAL, ("DESCRIBE",)),
        Acl(role, who, TXN_ID, f"{t.coordinator_group}-", PREFIXED, rw),
        Acl(role, who, TXN_ID, f"{locks}-", PREFIXED, rw),
        Acl(role, who, TXN_ID, f"{t.timer_group}-", PREFIXED, rw),
    ]
    # The coordinators write a group's real topics only as its allow-list says.
    real = sorted({rt for tenant in tenants.values() for rt in _real_topics(tenant)})
    out += [
        Acl(role, who, TOPIC, name, pattern, (*rw, "DESCRIBE_CONFIGS")) for name, pattern in real
    ]
    if principals.spark:
        role, who = "Spark job", principals.spark
        out += [
            Acl(role, who, TOPIC, topic, LITERAL, ("READ", "DESCRIBE"))
            for topic in principals.spark_topics
        ]
        out.append(Acl(role, who, GROUP, "spark-kafka-source-", PREFIXED, ("READ",)))
    if principals.operators:
        role, who = "operators' CLI", principals.operators
        out += [
            Acl(role, who, TOPIC, name, LITERAL, ("READ", "DESCRIBE"))
            for name in (t.half, t.op, t.discard)
        ]
        out += [
            Acl(role, who, TOPIC, t.half, LITERAL, ("WRITE",)),
            Acl(role, who, GROUP, t.coordinator_group, LITERAL, ("DESCRIBE",)),
            # The assign-only reader of txn discarded/redrive and dlq list/redrive.
            Acl(role, who, GROUP, f"{prefix}_admin", LITERAL, ("DESCRIBE",)),
            Acl(role, who, TXN_ID, f"{prefix}_txn_redrive_", PREFIXED, rw),
        ]
        # dlq list and redrive: a group's dead letters go back to the topics it reads.
        for c in consumers:
            if c.kind in WITH_DLQ:
                out += [
                    Acl(role, who, TOPIC, t.dlq(c.group), LITERAL, ("READ", "DESCRIBE")),
                    Acl(role, who, TXN_ID, f"{prefix}_dlq_redrive_{c.group}", LITERAL, rw),
                    *(Acl(role, who, TOPIC, topic, LITERAL, rw) for topic in c.topics),
                ]
    return out


def _consumer_acls(c: Consumer, t: SystemTopics) -> list[Acl]:
    """What a consumer group's principal needs for the class its kind names."""
    role, who, rw = "consumer group", c.principal, ("WRITE", "DESCRIBE")
    out = [Acl(role, who, TOPIC, topic, LITERAL, ("READ", "DESCRIBE")) for topic in c.topics]
    out.append(Acl(role, who, GROUP, c.group, LITERAL, ("READ",)))
    if c.kind == "orderly":
        out += [
            Acl(role, who, TOPIC, t.lock_request, LITERAL, rw),
            Acl(role, who, TOPIC, t.lock_reply, LITERAL, ("READ", "DESCRIBE")),
            # The lock client's assign-only reply reader.
            Acl(role, who, GROUP, f"{t.prefix}_lock_client", LITERAL, ("DESCRIBE",)),
        ]
    if c.kind == "push":
        out += [
            Acl(role, who, TOPIC, t.retry(c.group, level), LITERAL, ("READ", *rw, "CREATE"))
            for level in range(1, c.retry_levels + 1)
        ]
        out.append(Acl(role, who, TXN_ID, f"{t.prefix}_push_{c.group}@", PREFIXED, rw))
    if c.kind in WITH_DLQ:
        # CREATE: the consumer creates its DLQ (at start, or at its first dead letter).
        out.append(Acl(role, who, TOPIC, t.dlq(c.group), LITERAL, (*rw, "CREATE")))
    return out


def kafka_acls_commands(acls: list[Acl], bootstrap: str = "B") -> list[str]:
    """One ``kafka-acls.sh --add`` command per binding."""
    flag = {TOPIC: "--topic", GROUP: "--group", TXN_ID: "--transactional-id"}
    return [
        f"kafka-acls.sh --bootstrap-server {bootstrap} --add --allow-principal "
        f"{a.principal} "
        + " ".join(f"--operation {_camel(o)}" for o in a.operations)
        + f" {flag[a.resource]} {a.name} --resource-pattern-type {a.pattern}"
        for a in acls
    ]


def _camel(operation: str) -> str:
    return "".join(p.capitalize() for p in operation.split("_"))


def markdown_table(acls: list[Acl]) -> str:
    """The ACLs as the docs show them: one row per binding, grouped by role."""
    rows = [
        "| role | principal | resource | name | pattern | operations |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows += [
        f"| {a.role} | `{a.principal}` | {a.resource} | `{a.name}` | {a.pattern} | "
        f"{', '.join(a.operations)} |"
        for a in acls
    ]
    return "\n".join(rows)


def load_deployment(path: str, prefix: str) -> tuple[dict[str, Tenant], tuple[Consumer, ...]]:
    """The tenants and (optional ``consumers`` section) consumer groups of a tenants file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--tenants-file {path}: cannot read it as JSON ({exc})") from exc
    tenants = parse_tenants(data, prefix, f"--tenants-file {path}")
    try:
        consumers = parse_consumers(data.get("consumers") or {})
    except ConfigError as exc:
        raise ConfigError(f"--tenants-file {path}: {exc}") from None
    return tenants, consumers


def parse_consumers(section: Mapping) -> tuple[Consumer, ...]:
    """The tenants file's ``consumers``: group -> ``principal``, ``topics``, ``kind`` (one
    of :data:`KINDS`, default ``plain``; ``"orderly": true`` is ``kind: orderly``) and, for
    a push group, ``retry_levels`` (default: the PushConsumer's default delay levels)."""
    consumers = []
    for group, spec in section.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("principal"), str):
            raise ConfigError(f"consumer group {group!r} needs a principal")
        topics = spec.get("topics", [])
        if not isinstance(topics, list) or not all(isinstance(x, str) for x in topics):
            raise ConfigError(f"consumer group {group!r}: topics must be a list of names")
        kind = spec.get("kind", "orderly" if spec.get("orderly") else "plain")
        if "orderly" in spec and bool(spec["orderly"]) != (kind == "orderly"):
            raise ConfigError(f"consumer group {group!r}: 'orderly' contradicts kind {kind!r}")
        consumers.append(
            Consumer(
                group,
                spec["principal"],
                tuple(topics),
                kind,
                spec.get("retry_levels", len(DEFAULT_DELAY_LEVELS)),
            )
        )
    return tuple(consumers)


def _cmd_acls(args: argparse.Namespace) -> int:
    tenants, consumers = load_deployment(args.tenants_file, args.topic_prefix)
    principals = Principals(
        args.coordinator_principal,
        args.operator_principal,
        args.spark_principal,
        tuple(args.spark_topic or ()),
    )
    acls = acl_bindings(tenants, principals, consumers, args.topic_prefix)
    print(markdown_table(acls) if args.markdown else "\n".join(kafka_acls_commands(acls)))
    return 0


def _cmd_key(args: argparse.Namespace) -> int:
    raw = os.environ.get("RMQ_TENANT_KEY", "").encode()
    if args.tenant_key_file:
        raw = Path(args.tenant_key_file).read_bytes().strip()
    if not raw:
        raise ConfigError("no tenant key: set env RMQ_TENANT_KEY or --tenant-key-file")
    if (args.group is None) == (args.consumer_group is None):
        raise ConfigError("tenant key: give --group (a producer group) or --consumer-group")
    if args.consumer_group is not None:  # its orderly consumers' consumer_group_key
        key = derive_consumer_group_key(raw, args.consumer_group)
    else:
        key = derive_group_key(raw, args.group)
    print(key.text())  # the group's producers' group_key (their secret alone)
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    tenant = sub.add_parser("tenant", help="tenant isolation: ACLs and group keys")
    tenant_sub = tenant.add_subparsers(dest="action", required=True)
    acls = tenant_sub.add_parser("acls", help="the Kafka ACLs of every principal")
    acls.add_argument("--tenants-file", required=True)
    acls.add_argument("--topic-prefix", default=DEFAULT_TOPIC_PREFIX)
    acls.add_argument("--coordinator-principal", required=True, metavar="User:NAME")
    acls.add_argument("--operator-principal", default=None, metavar="User:NAME")
    acls.add_argument("--spark-principal", default=None, metavar="User:NAME")
    acls.add_argument("--spark-topic", action="append", metavar="TOPIC")
    acls.add_argument("--markdown", action="store_true", help="a table instead of commands")
    acls.set_defaults(func=_cmd_acls)
    key = tenant_sub.add_parser(
        "key",
        help="a producer or consumer group's key, derived from the tenant key (env RMQ_TENANT_KEY)",
    )
    key.add_argument("--group", default=None, help="a producer group: its group_key")
    key.add_argument(
        "--consumer-group",
        default=None,
        help="an orderly consumer group: its consumer_group_key (signs its lock requests)",
    )
    key.add_argument("--tenant-key-file", default=None)
    key.set_defaults(func=_cmd_key)
