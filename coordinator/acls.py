"""The Kafka ACLs of tenant isolation, per principal, generated from the tenants file the
coordinators read (docs/security.md): the allow-list a group's transactions are promoted
into IS the set of real topics its principal gets WRITE on, so the coordinator never writes
for a group where that group could not write itself. ``rmq-semantics tenant acls`` prints
them as ``kafka-acls.sh`` commands; the docs' table is rendered by :func:`markdown_table`
and a unit test keeps the two equal.

Every ACL a producer or consumer principal gets is LITERAL: a prefixed ``__rmq_check_ga``
would also match ``__rmq_check_gab``, and a prefixed ``__rmq_`` would cover ``__rmq_keys``.
Only the coordinators (and Spark's own consumer groups) get prefixed ones.

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

from coordinator.tenancy import Tenant, parse_tenants
from rmq_semantics.errors import ConfigError
from rmq_semantics.records.group_auth import derive_group_key
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, SystemTopics

__all__ = [
    "Acl",
    "Principals",
    "acl_bindings",
    "kafka_acls_commands",
    "markdown_table",
    "register_cli",
]

LITERAL, PREFIXED = "literal", "prefixed"
TOPIC, GROUP, TXN_ID = "topic", "group", "transactional-id"
ROLES = ("producer group", "consumer group", "coordinator", "Spark job", "operators' CLI")


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
    """A consumer group of the deployment: its principal and the real topics it reads."""

    group: str
    principal: str
    topics: tuple[str, ...]
    orderly: bool = False


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
        role = "consumer group"
        out += [
            Acl(role, c.principal, TOPIC, topic, LITERAL, ("READ", "DESCRIBE"))
            for topic in c.topics
        ]
        out.append(Acl(role, c.principal, GROUP, c.group, LITERAL, ("READ",)))
        if c.orderly:
            out += [
                Acl(role, c.principal, TOPIC, t.lock_request, LITERAL, rw),
                Acl(role, c.principal, TOPIC, t.lock_reply, LITERAL, ("READ", "DESCRIBE")),
                Acl(role, c.principal, TOPIC, t.dlq(c.group), LITERAL, rw),
                # The lock client's reply reader: assign() only (see the module's doc).
                Acl(role, c.principal, GROUP, f"{prefix}_lock_client", LITERAL, ("DESCRIBE",)),
            ]
    role, who = "coordinator", principals.coordinator
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
        Acl(role, who, GROUP, f"{prefix}_lock_coordinator", LITERAL, ("READ",)),
        Acl(role, who, GROUP, t.timer_group, LITERAL, ("READ",)),
        # The assign-only readers of the keys, lock and (read-back) delivery records.
        Acl(role, who, GROUP, f"{t.keys}-reader", LITERAL, ("DESCRIBE",)),
        Acl(role, who, GROUP, f"{prefix}_lock_coordinator-reader", LITERAL, ("DESCRIBE",)),
        Acl(role, who, GROUP, f"{t.timer_group}-reader", LITERAL, ("DESCRIBE",)),
        Acl(role, who, TXN_ID, f"{t.coordinator_group}-", PREFIXED, rw),
        Acl(role, who, TXN_ID, f"{prefix}_lock_coordinator-", PREFIXED, rw),
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
            Acl(role, who, TXN_ID, f"{prefix}_txn_redrive_", PREFIXED, rw),
        ]
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
    consumers = []
    for group, spec in (data.get("consumers") or {}).items():
        if not isinstance(spec, dict) or not isinstance(spec.get("principal"), str):
            raise ConfigError(f"--tenants-file {path}: consumer group {group!r} needs a principal")
        consumers.append(
            Consumer(
                group,
                spec["principal"],
                tuple(spec.get("topics", ())),
                bool(spec.get("orderly", False)),
            )
        )
    return tenants, tuple(consumers)


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
        "key", help="a producer group's key, derived from the tenant key (env RMQ_TENANT_KEY)"
    )
    key.add_argument("--group", required=True)
    key.add_argument("--tenant-key-file", default=None)
    key.set_defaults(func=_cmd_key)
