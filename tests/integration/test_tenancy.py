"""Tenant isolation on a SASL broker with ACLs (docs/security.md): principals ``a`` (producer
group ``ga``, real topic ``ta``) and ``b`` (group ``gb``, topic ``tb``) with exactly the ACLs
``coordinator/acls.py`` generates, one coordinator (principal ``coord``) with the tenants
file. ``b`` plays the adversary with plain Kafka clients and the product's own API; every
test ends on what lands in the real topics, the discard topic and ``b``'s reads."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from coordinator.acls import Acl, Principals, acl_bindings
from coordinator.tenancy import parse_tenants
from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, Producer, RmqError, TransactionProducer
from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.group_signing import SignedProducer
from rmq_semantics.records.codec import encode
from rmq_semantics.records.group_auth import derive_group_key
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.timer import parse_timer
from rmq_semantics.records.txn import EndRequest, EndState
from rmq_semantics.tools.admin import list_discarded, list_pending
from rmq_semantics.topics import SystemTopics, ensure_topics
from tests.integration.txn_helpers import (
    FAST,
    ScriptedListener,
    ThreadCoordinator,
    metric,
    no_pending,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration

USERS = {"admin": "admin-secret", "coord": "coord-secret", "a": "a-secret", "b": "b-secret"}
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


# Values A's listener decides by: anything else is UNKNOW inline and COMMIT when checked.
A_INLINE = {b"a-commits": S.COMMIT_MESSAGE}
A_CHECKS = {b"a-rolls-back": S.ROLLBACK_MESSAGE}


@pytest.fixture(scope="module")
def iso() -> Iterator[Deployment]:
    data_dir = Path(tempfile.mkdtemp(prefix="rmq-test-tenancy-kafka-"))
    broker = EmbeddedKafka(data_dir, port=free_port(), sasl_users=USERS, acls=True)
    prefix = f"iso{uuid.uuid4().hex[:6]}"
    ta, tb = f"ta-{prefix}", f"tb-{prefix}"
    spec = {
        "version": 1,
        "groups": {
            "ga": {"principal": "User:a", "topics": [ta]},
            "gb": {"principal": "User:b", "topics": [tb]},
        },
    }
    tenants_file = data_dir / "tenants.json"
    tenants_file.write_text(json.dumps(spec))
    try:
        broker.start()
        ensure_topics(user_conf(broker, "admin"), {ta: (1, {}), tb: (1, {})})
        apply_acls(
            broker,
            acl_bindings(parse_tenants(spec, prefix), Principals("User:coord"), prefix=prefix),
        )
        listener = ScriptedListener(
            lambda v: A_INLINE.get(v, S.UNKNOW), lambda v: A_CHECKS.get(v, S.COMMIT_MESSAGE)
        )
        with (
            ThreadCoordinator(
                user_conf(broker, "coord"),
                topic_prefix=prefix,
                marker_key=MARKER_KEY,
                tenants_file=str(tenants_file),
                tenant_key=TENANT_KEY,
            ) as coordinator,
            TransactionProducer(
                user_conf(broker, "a"),
                producer_group="ga",
                listener=listener,
                topic_prefix=prefix,
                group_key=group_key("ga"),
                **SIZES,
            ) as a,
        ):
            yield Deployment(broker, prefix, ta, tb, tenants_file, coordinator, a, listener)
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


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
    iso: Deployment, producer: confluent_kafka.Producer, group: str, topic: str, value: bytes
) -> tuple[str, int, int]:
    """A half record naming ``group`` and ``topic``, as ``producer`` writes it: (txn, p, o)."""
    txn = uuid.uuid4().hex
    headers = half_headers(
        Message(topic, value), txn, group.encode(), str(int(time.time() * 1000)).encode()
    )
    err, msg = delivered(producer, iso.topics.half, value, headers=headers)
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


# -- Must show ---------------------------------------------------------------------------
def test_b_cannot_read_a_check_requests(iso):
    result = iso.a.send_message_in_transaction(Message(iso.ta, b"a-checked-secretly"))
    wait_for(
        lambda: b"a-checked-secretly" in iso.a_listener.checked,
        DECIDED_WITHIN_S,
        "A's check request to reach A",
    )
    # B reads, from offset 0, every check topic it could name: the shared one and A's own.
    seen, errors = b_reads(
        iso, [iso.topics.check, iso.topics.group_check("ga")], FAST["check_partitions"]
    )
    assert not [v for v in seen if result.transaction_id.encode() in v], "B read A's check request"
    assert exists(iso, iso.topics.group_check("ga"))
    assert refused_to_b(iso, iso.topics.group_check("ga"), errors), errors


def test_b_cannot_commit_or_roll_back_a_transaction(iso):
    plain_b = confluent_kafka.Producer(iso.conf("b"))
    # A would roll this one back when checked; B commits it directly on the Op topic.
    doomed = iso.a.send_message_in_transaction(Message(iso.ta, b"a-rolls-back"))
    err, _ = delivered(
        plain_b,
        iso.topics.op,
        end_request(
            doomed.transaction_id, "ga", doomed.half_partition, doomed.half_offset, EndState.COMMIT
        ),
        partition=doomed.half_partition,
    )
    assert err is None, err
    # A would commit this one when checked; B rolls it back as its API writes it, claiming
    # ga (signed with B's own key), then through the API itself.
    wanted = iso.a.send_message_in_transaction(Message(iso.ta, b"a-commits-later"))
    signed_b = SignedProducer(
        iso.conf("b"), key=derive_group_key(TENANT_KEY.encode(), "gb"), topics=iso.topics
    )
    err, _ = delivered(
        signed_b,
        iso.topics.op,
        end_request(
            wanted.transaction_id,
            "ga",
            wanted.half_partition,
            wanted.half_offset,
            EndState.ROLLBACK,
        ),
        partition=wanted.half_partition,
    )
    assert err is None, err
    b_as_a = TransactionProducer(
        iso.conf("b"),
        producer_group="ga",
        listener=iso.a_listener,
        topic_prefix=iso.prefix,
        group_key=group_key("gb"),
        **SIZES,
    )
    try:
        b_as_a.start()
        b_as_a.end_transaction(wanted, S.ROLLBACK_MESSAGE)
    except RmqError as exc:  # refused at start: ga's check topic is A's alone
        assert "authoriz" in str(exc).lower(), exc
    finally:
        b_as_a.shutdown()
    wait_for(
        lambda: iso.decided(doomed.transaction_id, wanted.transaction_id),
        DECIDED_WITHIN_S,
        "both transactions to be decided",
    )
    values = promoted_values(iso, iso.ta)
    assert b"a-rolls-back" not in values
    assert values.count(b"a-commits-later") == 1
    assert metric(iso.coordinator, "rmq_rejected_requests_total", reason="unauthenticated") >= 2


def test_b_half_claiming_ga_is_never_promoted_even_when_a_commits_unknown_ids(iso):
    plain_b = confluent_kafka.Producer(iso.conf("b"))
    signed_b = SignedProducer(
        iso.conf("b"), key=derive_group_key(TENANT_KEY.encode(), "gb"), topics=iso.topics
    )
    unsigned, _, _ = forged_half(iso, plain_b, "ga", iso.ta, b"b-as-ga-unsigned")
    signed, _, _ = forged_half(iso, signed_b, "ga", iso.ta, b"b-as-ga-signed-by-b")
    wait_for(
        lambda: iso.decided(unsigned, signed),
        DECIDED_WITHIN_S,
        "the forged transactions to be decided",
    )
    values = promoted_values(iso, iso.ta)
    assert b"b-as-ga-unsigned" not in values and b"b-as-ga-signed-by-b" not in values
    assert not {b"b-as-ga-unsigned", b"b-as-ga-signed-by-b"} & set(iso.a_listener.checked)
    reasons = discard_reasons(iso)
    assert (reasons.get(unsigned), reasons.get(signed)) == ("forged", "forged")


def test_b_cannot_get_a_record_into_a_topic_it_may_not_write_through_the_coordinator(iso):
    signed_b = SignedProducer(
        iso.conf("b"), key=derive_group_key(TENANT_KEY.encode(), "gb"), topics=iso.topics
    )
    err, _ = delivered(signed_b, iso.ta, b"b-direct")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # As gb, signed with its own key, COMMIT and all: only the real topic is not gb's.
    txn, p, o = forged_half(iso, signed_b, "gb", iso.ta, b"b-through-the-coordinator")
    err, _ = delivered(
        signed_b, iso.topics.op, end_request(txn, "gb", p, o, EndState.COMMIT), partition=p
    )
    assert err is None, err
    wait_for(lambda: iso.decided(txn), DECIDED_WITHIN_S, "B's transaction to be decided")
    assert b"b-through-the-coordinator" not in promoted_values(iso, iso.ta)
    assert discard_reasons(iso).get(txn) == "not_allowed"


def test_b_cannot_read_the_marker_key_nor_the_coordinators_topics(iso):
    private = [iso.topics.keys, iso.topics.half, iso.topics.op, iso.topics.discard]
    seen, errors = b_reads(iso, private, 1)
    assert seen == [], "B read a record of the coordinators' topics"
    assert all(exists(iso, topic) for topic in private)
    refused = {topic: refused_to_b(iso, topic, errors) for topic in private}
    assert all(refused.values()), refused
    # A producer with its group key never holds the marker key: nothing of it in its settings.
    assert MARKER_KEY not in repr(iso.a.settings)


# -- upgrade -------------------------------------------------------------------------------
def test_pending_transactions_of_before_the_switch_are_resolved_once_after_it(iso):
    """Transactions left pending by unsigned producers on the shared check topic are decided
    once their producers and the coordinators have switched to isolation (docs/security.md,
    "Upgrading"): unsigned records of before are below the watermarks the switch records."""
    admin, prefix = iso.conf("admin"), f"up{uuid.uuid4().hex[:6]}"
    topic = f"tu-{prefix}"
    ensure_topics(admin, {topic: (1, {})})
    spec = {"version": 1, "groups": {"gu": {"principal": "User:admin", "topics": [topic]}}}
    tenants = iso.tenants_file.with_name(f"{prefix}.json")
    tenants.write_text(json.dumps(spec))
    values = [b"before-1", b"before-2"]
    old = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.UNKNOW)
    with ThreadCoordinator(admin, topic_prefix=prefix, marker_key=MARKER_KEY) as coordinator:
        with TransactionProducer(
            admin, producer_group="gu", listener=old, topic_prefix=prefix, **SIZES
        ) as producer:
            txns = [
                producer.send_message_in_transaction(Message(topic, v)).transaction_id
                for v in values
            ]
        wait_for(
            lambda: {t.txn_id for t in list_pending(admin, prefix)} >= set(txns),
            DECIDED_WITHIN_S,
            "the coordinator to hold both pending",
        )
        assert metric(coordinator, "rmq_rejected_requests_total", reason="unauthenticated") == 0
    new = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.COMMIT_MESSAGE)
    with (
        ThreadCoordinator(
            admin,
            topic_prefix=prefix,
            marker_key=MARKER_KEY,
            tenants_file=str(tenants),
            tenant_key=TENANT_KEY,
        ) as coordinator,
        TransactionProducer(
            admin,
            producer_group="gu",
            listener=new,
            topic_prefix=prefix,
            group_key=group_key("gu"),
            **SIZES,
        ),
    ):
        wait_for(
            lambda: (
                no_pending(coordinator, FAST["half_partitions"]) and resolved(admin, prefix, *txns)
            ),
            DECIDED_WITHIN_S,
            "the transactions of before to be decided",
        )
    assert sorted(m.value() for m in read_to_end(admin, topic, 1)) == values
    assert not {t.txn_id for t in list_discarded(admin, prefix)} & set(txns)


def test_a_groups_principal_schedules_and_recalls_with_its_acls_and_key(iso: Deployment):
    """Timer messages under isolation (issue 35): with only the ACLs `tenant acls` gives
    group ga's principal, its Producer creates (or finds) the timer topics, writes a signed
    timer record and a signed cancel; nothing reaches its real topic at send."""
    with Producer(
        iso.conf("a"), topic_prefix=iso.prefix, producer_group="ga", group_key=group_key("ga")
    ) as producer:
        sent = producer.send(Message(iso.ta, b"a-later", deliver_after_ms=3_600_000))
        recalled = producer.recall_message(sent.message_id)
    key = derive_group_key(TENANT_KEY.encode(), "ga")
    [raw] = [
        m
        for m in read_to_end(iso.conf("admin"), iso.topics.timer, 8)  # the default count
        if (m.partition(), m.offset()) == (sent.partition, sent.offset)
    ]
    record = parse_timer(0, raw.partition(), raw.offset(), 0, raw.key(), raw.value(), raw.headers())
    assert record.timer_id == sent.message_id and key.verifies(record.canonical(), record.group_mac)
    assert recalled.topic == iso.topics.timer_cancel and recalled.partition == sent.partition
    assert b"a-later" not in promoted_values(iso, iso.ta)
