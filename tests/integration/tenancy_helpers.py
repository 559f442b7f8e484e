"""Tenant isolation's test rig (docs/security.md): a SASL broker with Kafka's ACL authorizer,
principals ``a`` (producer group ``ga``, real topic ``ta``) and ``b`` (group ``gb``, topic
``tb``) with exactly the ACLs ``coordinator/acls.py`` generates, one coordinator (principal
``coord``) with the tenants file, and the adversary's tools (``b`` with plain Kafka clients
and the product's own codec). The broker is one per session (``secured_broker`` in
conftest.py); each deployment has a prefix of its own."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from coordinator.acls import Acl, Principals, acl_bindings, load_deployment
from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.embedded import EmbeddedKafka
from rmq_semantics.records.codec import encode
from rmq_semantics.records.group_auth import derive_consumer_group_key, derive_group_key
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.txn import EndRequest, EndState
from rmq_semantics.tools.admin import list_discarded, list_pending
from rmq_semantics.topics import SystemTopics, ensure_topics
from tests.integration.txn_helpers import (
    FAST,
    ScriptedListener,
    ThreadCoordinator,
    read_to_end,
    wait_for,
)

# The consumer groups' (c-*), operators' and Spark's principals serve
# test_tenancy_principals.py: every class under the ACLs generated for its role.
USERS = {
    "admin": "admin-secret",
    "coord": "coord-secret",
    "a": "a-secret",
    "b": "b-secret",
    **{user: f"{user}-secret" for user in ("c-orderly", "c-push", "c-simple", "c-plain")},
    # Orderly consumer groups' principals of test_tenancy_locks.py: ``cb`` attacks ``ca``.
    "ca": "ca-secret",
    "cb": "cb-secret",
    "ops": "ops-secret",
    "spark": "spark-secret",
}
#: The principals whose requests may be denied: the adversaries (``cb``: test_tenancy_locks.py).
ADVERSARIES = frozenset({"User:b", "User:cb"})
MARKER_KEY = "a-marker-key-for-the-tenancy-tests-0123456789"
TENANT_KEY = "the-tenant-key-of-the-tenancy-tests-0123456789"
# A transaction is decided within a few check intervals (FAST: 2.5 s) once its group answers.
DECIDED_WITHIN_S = 60.0
ACL_TIMEOUT_S = 30.0
# B reads a topic this long: records already there arrive at once, a refusal within ~0.5 s.
READ_WINDOW_S = 2.0
SIZES = {"half_partitions": FAST["half_partitions"], "check_partitions": FAST["check_partitions"]}

_RESOURCE = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional-id": ResourceType.TRANSACTIONAL_ID,
}
_PATTERN = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}


def user_conf(broker: EmbeddedKafka, user: str) -> dict:
    return {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": user,
        "sasl.password": USERS[user],
    }


def apply_acls(broker: EmbeddedKafka, acls: list[Acl]) -> None:
    """The generated ACLs, as ``kafka-acls.sh`` would add them."""
    admin = AdminClient(user_conf(broker, "admin"))
    bindings = [
        AclBinding(
            _RESOURCE[a.resource],
            a.name,
            _PATTERN[a.pattern],
            a.principal,
            "*",
            getattr(AclOperation, op),
            AclPermissionType.ALLOW,
        )
        for a in acls
        for op in a.operations
    ]
    for future in admin.create_acls(bindings).values():
        future.result(ACL_TIMEOUT_S)
    # Created once the controller has them; the broker's authorizer applies them a moment
    # later, and until then (allow.everyone.if.no.acl.found=false) refuses what they allow.
    everything = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    wait_for(
        lambda: set(bindings) <= set(admin.describe_acls(everything).result(ACL_TIMEOUT_S)),
        ACL_TIMEOUT_S,
        "the broker to apply the ACLs",
    )


@dataclass
class Deployment:
    broker: EmbeddedKafka
    prefix: str
    ta: str
    tb: str
    tenants_file: Path
    coordinator: ThreadCoordinator
    a: TransactionProducer  # group ga, its checker answers COMMIT for what it does not know
    a_listener: ScriptedListener

    @property
    def topics(self) -> SystemTopics:
        return SystemTopics(self.prefix)

    def conf(self, user: str) -> dict:
        return user_conf(self.broker, user)

    def decided(self, *txn_ids: str) -> bool:
        return resolved(self.conf("admin"), self.prefix, *txn_ids)


def group_key(group: str) -> str:
    return derive_group_key(TENANT_KEY.encode(), group).text()


def consumer_key(group: str) -> str:
    """Consumer group ``group``'s key (its orderly consumers sign their lock requests)."""
    return derive_consumer_group_key(TENANT_KEY.encode(), group).text()


# Values A's listener decides by: anything else is UNKNOW inline and COMMIT when checked.
A_INLINE = {b"a-commits": S.COMMIT_MESSAGE}
A_CHECKS = {b"a-rolls-back": S.ROLLBACK_MESSAGE}


@contextlib.contextmanager
def deployment(
    broker: EmbeddedKafka,
    data_dir: Path,
    *,
    a_topics: tuple[str, ...] = (),
    consumers: dict | None = None,
    principals: Principals | None = None,
    before_start: Callable[[Deployment], None] | None = None,
) -> Iterator[Deployment]:
    """Two tenants on a prefix of their own, their ACLs, a coordinator and A's producer.
    ``a_topics`` are more real topics of ``ga`` (``{prefix}`` in a name is replaced, as in
    ``consumers``, the tenants file's section, and Spark's topics in ``principals``); the
    ACLs are what ``tenant acls`` prints for that file and ``principals`` (default: the
    coordinator's alone). ``before_start`` runs once the ACLs are in place, before the
    coordinator and A's producer start."""
    prefix = f"iso{uuid.uuid4().hex[:6]}"
    ta, tb = f"ta-{prefix}", f"tb-{prefix}"
    more = [t.format(prefix=prefix) for t in a_topics]
    spec: dict = {
        "version": 1,
        "groups": {
            "ga": {"principal": "User:a", "topics": [ta, *more]},
            "gb": {"principal": "User:b", "topics": [tb]},
        },
    }
    if consumers:
        spec["consumers"] = json.loads(json.dumps(consumers).replace("{prefix}", prefix))
    tenants_file = data_dir / f"tenants-{prefix}.json"
    tenants_file.write_text(json.dumps(spec))
    ensure_topics(user_conf(broker, "admin"), {t: (1, {}) for t in (ta, tb, *more)})
    tenants, groups = load_deployment(str(tenants_file), prefix)
    principals = principals or Principals("User:coord")
    spark_topics = tuple(t.format(prefix=prefix) for t in principals.spark_topics)
    principals = dataclasses.replace(principals, spark_topics=spark_topics)
    apply_acls(broker, acl_bindings(tenants, principals, groups, prefix))
    listener = ScriptedListener(
        lambda v: A_INLINE.get(v, S.UNKNOW), lambda v: A_CHECKS.get(v, S.COMMIT_MESSAGE)
    )
    coordinator = ThreadCoordinator(
        user_conf(broker, "coord"),
        topic_prefix=prefix,
        marker_key=MARKER_KEY,
        tenants_file=str(tenants_file),
        tenant_key=TENANT_KEY,
    )
    a = TransactionProducer(
        user_conf(broker, "a"),
        producer_group="ga",
        listener=listener,
        topic_prefix=prefix,
        group_key=group_key("ga"),
        **SIZES,
    )
    dep = Deployment(broker, prefix, ta, tb, tenants_file, coordinator, a, listener)
    if before_start is not None:
        before_start(dep)
    with coordinator, a:
        yield dep


def delivered(producer: confluent_kafka.Producer, topic: str, value: bytes | None, **kw):
    """Produce one record and wait for its report: the message (error included)."""
    out: list = []
    producer.produce(topic, value, on_delivery=lambda err, msg: out.append((err, msg)), **kw)
    producer.flush(30)
    assert out, f"no delivery report for {topic}"
    return out[0]


def resolved(conf: dict, prefix: str, *txn_ids: str) -> bool:
    """None of ``txn_ids`` is pending (as ``txn pending`` shows it)."""
    return not {t.txn_id for t in list_pending(conf, prefix)} & set(txn_ids)


def promoted_values(iso: Deployment, topic: str) -> list[bytes]:
    return sorted(m.value() for m in read_to_end(iso.conf("admin"), topic, 1))


def discard_reasons(iso: Deployment) -> dict[str, str]:
    return {t.txn_id: t.reason for t in list_discarded(iso.conf("admin"), iso.prefix)}


def forged_half(
    iso: Deployment,
    producer: confluent_kafka.Producer,
    group: str,
    topic: str,
    value: bytes,
    partition: int | None = None,
    txn: str | None = None,
) -> tuple[str, int, int]:
    """A half record naming ``group`` and ``topic``, as ``producer`` writes it (to half
    ``partition``, by default any): (txn, p, o)."""
    txn = txn or uuid.uuid4().hex
    headers = half_headers(
        Message(topic, value), txn, group.encode(), str(int(time.time() * 1000)).encode()
    )
    where = {} if partition is None else {"partition": partition}
    err, msg = delivered(producer, iso.topics.half, value, headers=headers, **where)
    assert err is None, err
    return txn, msg.partition(), msg.offset()


# What B is told for a topic it may not read: not authorized, or (no DESCRIBE either) that
# no such topic exists for it.
REFUSED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
}


def b_reads(iso: Deployment, topics: list[str], partitions: int) -> tuple[list, dict]:
    """What B reads from offset 0 of each of ``topics``: (values, topic -> error codes)."""
    reader = confluent_kafka.Consumer(
        {**iso.conf("b"), "group.id": iso.topics.group_check("gb"), "enable.auto.commit": False}
    )
    seen: list[bytes] = []
    errors: dict[str, set[int]] = {}
    try:
        for topic in topics:
            reader.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            deadline = time.monotonic() + READ_WINDOW_S
            while time.monotonic() < deadline and not errors.get(topic, set()) & REFUSED:
                msg = reader.poll(0.2)
                if msg is None:
                    continue
                if msg.error() is not None:
                    errors.setdefault(topic, set()).add(msg.error().code())
                else:
                    seen.append(msg.value())
            reader.unassign()
    finally:
        reader.close()
    return seen, errors


def exists(iso: Deployment, topic: str) -> bool:
    admin = AdminClient(iso.conf("admin"))
    return topic in admin.list_topics(timeout=ACL_TIMEOUT_S).topics


def refused_to_b(iso: Deployment, topic: str, errors: dict[str, set[int]]) -> bool:
    """B's read of ``topic`` was refused, or B may not even describe it (its consumer is
    then told nothing, and reads nothing)."""
    if errors.get(topic, set()) & REFUSED:
        return True
    admin = AdminClient(iso.conf("b"))  # held: the future fails once the client is gone
    try:
        admin.describe_topics(TopicCollection([topic]))[topic].result(ACL_TIMEOUT_S)
    except KafkaException as exc:
        return exc.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    return False


def end_request(txn: str, group: str, partition: int, offset: int, state: EndState) -> bytes:
    return encode(
        EndRequest(txn, group, partition, offset, state, False, 0, int(time.time() * 1000))
    )


def denied_principals(broker: EmbeddedKafka) -> dict[str, list[str]]:
    """Principal -> the broker's authorizer log lines that denied it something (the broker
    writes them to ``authorizer.log``; rmq_semantics/kafka/log4j2.properties)."""
    out: dict[str, list[str]] = {}
    path = broker.data_dir / "authorizer.log"
    for line in path.read_text().splitlines() if path.exists() else ():
        found = re.search(r"Principal = (\S+) is Denied", line)
        if found:
            out.setdefault(found.group(1), []).append(line)
    return out
