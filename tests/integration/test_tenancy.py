"""Tenant isolation on a SASL broker with ACLs (docs/security.md): principals ``a`` (producer
group ``ga``, real topic ``ta``) and ``b`` (group ``gb``, topic ``tb``) with exactly the ACLs
``coordinator/acls.py`` generates, one coordinator (principal ``coord``) with the tenants
file. ``b`` plays the adversary with plain Kafka clients and the product's own API; every
test ends on what lands in the real topics, the discard topic and ``b``'s reads. The rig is
tests/integration/tenancy_helpers.py."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka import KafkaError

from coordinator.rollback_ids import ROLLBACK_IDS_MAX
from coordinator.txn_service import system_topic_specs
from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, Producer, RmqError, TransactionProducer
from rmq_semantics.errors import TimerRecallRefused
from rmq_semantics.group_signing import SignedProducer
from rmq_semantics.records.codec import encode
from rmq_semantics.records.group_auth import cancel_canonical, derive_group_key
from rmq_semantics.records.headers import H
from rmq_semantics.records.timer import TimerCancel, parse_timer
from rmq_semantics.records.txn import EndState
from rmq_semantics.tools.admin import list_discarded, list_pending
from rmq_semantics.topics import SystemTopics, ensure_topics
from tests.integration.tenancy_helpers import (
    DECIDED_WITHIN_S,
    MARKER_KEY,
    SIZES,
    TENANT_KEY,
    Deployment,
    b_reads,
    delivered,
    deployment,
    discard_reasons,
    end_request,
    exists,
    forged_half,
    group_key,
    promoted_values,
    refused_to_b,
    resolved,
)
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


@pytest.fixture(scope="module")
def iso(secured_broker) -> Iterator[Deployment]:
    with deployment(*secured_broker) as dep:
        yield dep


def side_tenant(iso: Deployment, stem: str) -> tuple[str, str, Path]:
    """A prefix of its own beside ``iso``'s, whose one producer group ``gu`` (the admin's
    principal) has one real topic: (prefix, topic, its tenants file)."""
    prefix = f"{stem}{uuid.uuid4().hex[:6]}"
    topic = f"t{stem}-{prefix}"
    ensure_topics(iso.conf("admin"), {topic: (1, {})})
    spec = {"version": 1, "groups": {"gu": {"principal": "User:admin", "topics": [topic]}}}
    tenants = iso.tenants_file.with_name(f"{prefix}.json")
    tenants.write_text(json.dumps(spec))
    return prefix, topic, tenants


def isolated_coordinator(admin: dict, prefix: str, tenants: Path, **settings) -> ThreadCoordinator:
    """A coordinator of ``side_tenant``'s prefix with isolation on (its tenants file)."""
    return ThreadCoordinator(
        admin,
        topic_prefix=prefix,
        marker_key=MARKER_KEY,
        tenants_file=str(tenants),
        tenant_key=TENANT_KEY,
        **settings,
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


def test_a_commit_for_a_half_set_aside_as_forged_is_rejected_as_unauthenticated(iso):
    """B writes a half record claiming ga, waits for it to be set aside, then commits it: in
    ga's name unsigned, and as gb with its own key. Neither is noted as a late commit."""
    plain_b = confluent_kafka.Producer(iso.conf("b"))
    signed_b = SignedProducer(
        iso.conf("b"), key=derive_group_key(TENANT_KEY.encode(), "gb"), topics=iso.topics
    )
    txn, p, o = forged_half(iso, plain_b, "ga", iso.ta, b"b-as-ga-committed-late")
    wait_for(
        lambda: discard_reasons(iso).get(txn) == "forged", DECIDED_WITHIN_S, "the forged discard"
    )
    before = metric(iso.coordinator, "rmq_rejected_requests_total", reason="unauthenticated")
    for producer, group in ((plain_b, "ga"), (signed_b, "gb")):
        err, _ = delivered(
            producer, iso.topics.op, end_request(txn, group, p, o, EndState.COMMIT), partition=p
        )
        assert err is None, err
    # Then a transaction of B's own on the same Op partition: once it is promoted, both
    # COMMITs before it were read.
    own, p2, o2 = forged_half(iso, signed_b, "gb", iso.tb, b"b-after-its-late-commits", p)
    assert p2 == p
    err, _ = delivered(
        signed_b, iso.topics.op, end_request(own, "gb", p, o2, EndState.COMMIT), partition=p
    )
    assert err is None, err
    wait_for(
        lambda: b"b-after-its-late-commits" in promoted_values(iso, iso.tb),
        DECIDED_WITHIN_S,
        "B's own transaction to be promoted",
    )
    [listed] = [t for t in list_discarded(iso.conf("admin"), iso.prefix) if t.txn_id == txn]
    assert listed.status == "forged"
    wait_for(
        lambda: (
            metric(iso.coordinator, "rmq_rejected_requests_total", reason="unauthenticated")
            >= before + 2
        ),
        DECIDED_WITHIN_S,
        "both COMMITs to be rejected as unauthenticated",
    )


def test_a_flood_of_bs_rollbacks_by_id_does_not_make_the_coordinator_forget_as(iso):
    """A's half write was reported failed, so its producer sent a ROLLBACK by transaction id;
    B then floods the same Op partition with ROLLBACKs by made-up ids (as gb, signed). A's
    half record lands after all that: it is rolled back on arrival, never checked (A's
    checker would commit it) nor promoted."""
    signed_a = SignedProducer(
        iso.conf("a"), key=derive_group_key(TENANT_KEY.encode(), "ga"), topics=iso.topics
    )
    signed_b = SignedProducer(
        iso.conf("b"), key=derive_group_key(TENANT_KEY.encode(), "gb"), topics=iso.topics
    )
    p, txn = 1, uuid.uuid4().hex
    err, _ = delivered(
        signed_a, iso.topics.op, end_request(txn, "ga", p, -1, EndState.ROLLBACK), partition=p
    )
    assert err is None, err
    for _ in range(ROLLBACK_IDS_MAX + 1):
        signed_b.produce(
            iso.topics.op,
            end_request(uuid.uuid4().hex, "gb", p, -1, EndState.ROLLBACK),
            partition=p,
        )
        signed_b.poll(0)
    own, _, o = forged_half(iso, signed_b, "gb", iso.tb, b"b-after-its-flood", p)
    err, _ = delivered(
        signed_b, iso.topics.op, end_request(own, "gb", p, o, EndState.COMMIT), partition=p
    )
    assert err is None, err
    wait_for(
        lambda: b"b-after-its-flood" in promoted_values(iso, iso.tb),
        DECIDED_WITHIN_S,
        "B's flood to be read (its transaction after it promoted)",
    )
    forged_half(iso, signed_a, "ga", iso.ta, b"a-reported-failed", p, txn=txn)  # lands late
    wait_for(lambda: iso.decided(txn), DECIDED_WITHIN_S, "A's late half to be decided")
    assert b"a-reported-failed" not in promoted_values(iso, iso.ta)
    assert b"a-reported-failed" not in iso.a_listener.checked


# -- upgrade -------------------------------------------------------------------------------
def test_a_record_forged_before_the_first_coordinator_ran_is_never_promoted(secured_broker):
    """A fresh install whose system topics were created first (docs/operations/
    kafka-security.md): B writes a half record claiming ga and its COMMIT, unsigned, before
    any coordinator ran. The first coordinator, isolated from its start, trusts neither."""
    forged: list[str] = []

    def forge(iso: Deployment) -> None:
        settings = iso.coordinator.server.settings
        ensure_topics(iso.conf("admin"), system_topic_specs(settings))
        plain_b = confluent_kafka.Producer(iso.conf("b"))
        txn, p, o = forged_half(iso, plain_b, "ga", iso.ta, b"b-as-ga-before-any-coordinator")
        err, _ = delivered(
            plain_b, iso.topics.op, end_request(txn, "ga", p, o, EndState.COMMIT), partition=p
        )
        assert err is None, err
        forged.append(txn)

    with deployment(*secured_broker, before_start=forge) as iso:
        wait_for(lambda: iso.decided(*forged), DECIDED_WITHIN_S, "the forged record decided")
        assert b"b-as-ga-before-any-coordinator" not in promoted_values(iso, iso.ta)
        assert discard_reasons(iso).get(forged[0]) == "forged"
        wait_for(
            lambda: metric(
                iso.coordinator, "rmq_rejected_requests_total", reason="unauthenticated"
            ),
            DECIDED_WITHIN_S,
            "the forged COMMIT to be rejected as unauthenticated",
        )


def test_pending_transactions_of_before_the_switch_are_resolved_once_after_it(iso):
    """Transactions left pending by unsigned producers on the shared check topic are decided
    once their producers and the coordinators have switched to isolation (docs/security.md,
    "Upgrading"): unsigned records of before are below the watermarks the switch records."""
    admin = iso.conf("admin")
    prefix, topic, tenants = side_tenant(iso, "up")
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
        isolated_coordinator(admin, prefix, tenants) as coordinator,
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


def test_timer_messages_of_before_the_switch_are_delivered_once_after_it(iso):
    """A timer message scheduled unsigned before isolation was turned on (and moved onto a
    level by a coordinator of before) is delivered once after the switch; one recalled
    before the switch never (issue 44, item 8): the timer and cancel topics get upgrade
    watermarks as the half and Op topics do, and a re-append of a record of before is signed."""
    admin = iso.conf("admin")
    prefix, topic, tenants = side_tenant(iso, "ut")
    timers = {"max_delay_ms": 60_000, "timer_partitions": 1}
    with Producer(admin, topic_prefix=prefix, producer_group="gu", timer_partitions=1) as producer:
        with ThreadCoordinator(admin, topic_prefix=prefix, marker_key=MARKER_KEY, **timers) as old:
            kept = producer.send(Message(topic, b"kept", deliver_after_ms=20_000))
            recalled = producer.send(Message(topic, b"recalled", deliver_after_ms=20_000))
            wait_for(
                lambda: metric(old, "rmq_timer_reappended_total") == 2,
                30,
                "both to wait on a level topic",
            )
        producer.recall_message(recalled.message_id)  # unsigned, before the switch
    assert kept.message_id
    with isolated_coordinator(admin, prefix, tenants, **timers) as new:
        wait_for(
            lambda: (
                metric(new, "rmq_timer_cancelled_total") == 1
                and metric(new, "rmq_timer_delivered_total") == 1
            ),
            60,
            "the message of before delivered and the recalled one dropped",
            details=lambda: str([m.value() for m in read_to_end(admin, topic, 1)]),
        )
        rejected = metric(new, "rmq_rejected_requests_total", reason="unauthenticated")
    assert [m.value() for m in read_to_end(admin, topic, 1)] == [b"kept"]
    assert not [
        m for m in read_to_end(admin, iso.topics.discard, 1) if m.value() in (b"kept", b"recalled")
    ]
    assert rejected == 0


def test_a_flood_of_signed_cancels_of_made_up_ids_is_bounded_and_a_recall_past_it_refused(iso):
    """Issue 44, item 9: a tenant signs cancels of ids it never scheduled (the product's own
    codec and its group key); the coordinator holds at most ``timer_cancels_max`` per timer
    partition (the gauge), forgets a recall of a delivered message, and a legitimate recall
    past the bound is refused at ``recall_message``: its message is then delivered."""
    admin = iso.conf("admin")
    prefix, topic, tenants = side_tenant(iso, "fl")
    bound = 50
    timers = {"max_delay_ms": 60_000, "timer_partitions": 1, "timer_cancels_max": bound}
    with (
        isolated_coordinator(admin, prefix, tenants, **timers) as coordinator,
        Producer(
            admin,
            topic_prefix=prefix,
            producer_group="gu",
            group_key=group_key("gu"),
            delay_levels="1s 5s",  # within max_delay_ms
            **timers,
        ) as producer,
    ):
        producer.send(Message(topic, b"due-soon", deliver_after_ms=0))
        recalled = producer.send(Message(topic, b"recalled", deliver_after_ms=4000))
        producer.recall_message(recalled.message_id)
        wait_for(lambda: metric(coordinator, "rmq_timer_delivered_total") == 1, 60, "due-soon")
        delivered = [m for m in read_to_end(admin, topic, 1) if m.value() == b"due-soon"]
        producer.recall_message(dict(delivered[0].headers())["rmq.timer_id"].decode())
        key, cancels = (
            derive_group_key(TENANT_KEY.encode(), "gu"),
            SystemTopics(prefix).timer_cancel,
        )
        flood = confluent_kafka.Producer({**admin, "linger.ms": 5})
        for _ in range(4 * bound):
            made_up = uuid.uuid4().hex
            value = encode(TimerCancel(made_up, "gu", int(time.time() * 1000)))
            mac = key.mac(cancel_canonical(cancels, 0, value))
            flood.produce(
                cancels, value, key=made_up.encode(), partition=0, headers=[(H.GROUP_MAC, mac)]
            )
        assert flood.flush(30) == 0
        over = 4 * bound + 2 - bound  # the early recall and the too late one come first
        wait_for(
            lambda: (
                metric(coordinator, "rmq_timer_cancels_refused_total", reason="over_bound") == over
            ),
            60,
            "the flood read",
        )
        # The early recall, and the flood's first ones; not the recall of a delivered message.
        wait_for(lambda: metric(coordinator, "rmq_timer_cancels_held") == bound - 1, 10, "gauge")
        late = producer.send(Message(topic, b"late", deliver_after_ms=3000))
        with pytest.raises(TimerRecallRefused, match="timer_cancels_max=50"):
            producer.recall_message(late.message_id)
        wait_for(lambda: metric(coordinator, "rmq_timer_delivered_total") == 2, 60, "late")
        wait_for(
            lambda: (
                metric(coordinator, "rmq_timer_cancels_refused_total", reason="over_bound")
                == over + 1
            ),
            10,
            "the refused recall counted",
        )
    values = [m.value() for m in read_to_end(admin, topic, 1)]
    assert values == [b"due-soon", b"late"]  # the recalled one never: its time has passed
    assert metric(coordinator, "rmq_timer_cancelled_total") == 1
