"""Tenant isolation without a broker: group names as topic names, the group MACs a signing
producer writes and the coordinator's guard verifies, the allow-list, the tenants file, and
the ACL table of docs/security.md generated from code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.acls import (
    Principals,
    acl_bindings,
    load_deployment,
    markdown_table,
    parse_consumers,
)
from coordinator.settings import CoordinatorSettings
from coordinator.tenancy import AllowList, TenantGuard, parse_tenants
from rmq_semantics import TransactionListener, TransactionProducer
from rmq_semantics.errors import ConfigError
from rmq_semantics.group_signing import SignedProducer
from rmq_semantics.message import Message
from rmq_semantics.records.codec import encode
from rmq_semantics.records.group_auth import (
    cancel_canonical,
    derive_group_key,
    encode_group,
    op_canonical,
    sign_half_headers,
    sign_timer_headers,
)
from rmq_semantics.records.half import half_headers, parse_half
from rmq_semantics.records.headers import H
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.records.timer import TimerCancel, parse_timer, timer_headers
from rmq_semantics.topics import SystemTopics

REPO = Path(__file__).resolve().parents[2]
TENANT_KEY = b"the tenant key of the unit tests, 32+"
TOPICS = SystemTopics("__rmq")
TENANTS = parse_tenants(
    {
        "version": 1,
        "groups": {
            "ga": {"principal": "User:a", "topics": ["orders-a"]},
            "gb": {"principal": "User:b", "topics": ["orders-b"], "topic_prefixes": ["b."]},
        },
    },
    "__rmq",
)


def guard(marks: dict | None = None) -> TenantGuard:
    return TenantGuard(TENANTS, TENANT_KEY, TOPICS, marks)


def half(
    group: str, topic: str, *, signer: str | None = None, offset: int = 5, value: bytes = b"v"
) -> object:
    headers = half_headers(Message(topic, value, key=b"k"), "t1", group.encode(), b"1")
    if signer is not None:
        headers = sign_half_headers(derive_group_key(TENANT_KEY, signer), headers, b"k", value)
    return parse_half(0, offset, 1, b"k", value, headers)


# -- group names as topic names ----------------------------------------------------------
@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_group_names_map_to_legal_distinct_topic_names(a, b):
    for name in (encode_group(a), encode_group(b)):
        assert re.fullmatch(r"[A-Za-z0-9_-]+", name)
    assert (encode_group(a) == encode_group(b)) == (a == b)


def test_plain_group_names_stay_readable_and_no_check_topic_is_a_prefix_match_issue():
    assert TOPICS.group_check("ga") == "__rmq_check_ga"
    assert TOPICS.group_check("g.a") == "__rmq_check_g_2ea"
    assert TOPICS.group_check("g_a") == "__rmq_check_g_5fa"
    with pytest.raises(ConfigError, match="over Kafka's 249"):
        TOPICS.group_check("g" * 240)


# -- half records ------------------------------------------------------------------------
def test_a_half_signed_by_its_own_group_for_an_allowed_topic_passes():
    assert guard().judge_half(half("ga", "orders-a", signer="ga"), "__rmq_half") is None


@pytest.mark.parametrize(
    "record, reason",
    [
        (lambda: half("ga", "orders-a"), DiscardReason.FORGED),  # unsigned
        (lambda: half("ga", "orders-a", signer="gb"), DiscardReason.FORGED),  # B claims A
        (lambda: half("gx", "orders-a", signer="gb"), DiscardReason.FORGED),  # unknown group
        (lambda: half("gb", "orders-a", signer="gb"), DiscardReason.NOT_ALLOWED),  # A's topic
        (lambda: half("gb", "secret", signer="gb"), DiscardReason.NOT_ALLOWED),
    ],
)
def test_forged_or_disallowed_halves_are_set_aside_with_their_reason(record, reason):
    refused = guard().judge_half(record(), "__rmq_half")
    assert refused is not None and refused[0] is reason


def test_a_signed_half_whose_value_or_topic_changed_does_not_verify():
    signed = half("ga", "orders-a", signer="ga")
    other = parse_half(0, 5, 1, b"k", b"changed", signed.headers)
    assert guard().judge_half(other, "h")[0] is DiscardReason.FORGED


def test_unsigned_halves_below_the_upgrade_watermark_are_trusted_but_still_allow_listed():
    marks = {"half": {0: 10}, "op": {}}
    assert guard(marks).judge_half(half("ga", "orders-a", offset=9), "h") is None
    assert (
        guard(marks).judge_half(half("ga", "orders-a", offset=10), "h")[0] is DiscardReason.FORGED
    )
    assert (
        guard(marks).judge_half(half("ga", "orders-b", offset=9), "h")[0]
        is DiscardReason.NOT_ALLOWED
    )


def test_a_re_appended_half_is_signed_again_for_its_group():
    legacy = half("ga", "orders-a", offset=3)
    headers = guard().resign(legacy, list(legacy.headers))
    again = parse_half(0, 50, 1, legacy.key, legacy.value, headers)
    assert guard({"half": {0: 10}}).judge_half(again, "h") is None


# -- end requests ------------------------------------------------------------------------
def test_end_requests_verify_only_under_their_own_groups_key_and_partition():
    g, value = guard(), b"an encoded end request"
    mac = derive_group_key(TENANT_KEY, "ga").mac(op_canonical(TOPICS.op, 2, value))
    assert g.end_refusal(2, 7, "ga", value, [(H.GROUP_MAC, mac)]) is None
    assert g.end_refusal(2, 7, "gb", value, [(H.GROUP_MAC, mac)]) is not None
    assert g.end_refusal(3, 7, "ga", value, [(H.GROUP_MAC, mac)]) is not None
    assert g.end_refusal(2, 7, "ga", value, []) is not None
    assert g.end_refusal(2, 7, "gx", value, [(H.GROUP_MAC, mac)]) is not None
    assert guard({"op": {2: 8}}).end_refusal(2, 7, "ga", value, []) is None


def test_the_signing_producer_signs_half_and_op_writes_and_nothing_else():
    key = derive_group_key(TENANT_KEY, "ga")
    producer = SignedProducer({"bootstrap.servers": "127.0.0.1:1"}, key=key, topics=TOPICS)
    headers = half_headers(Message("orders-a", b"v", key=b"k"), "t1", b"ga", b"1")
    kw1 = producer.signed(TOPICS.half, b"v", {"key": b"k", "headers": headers})
    kw2 = producer.signed(TOPICS.op, b"end", {"partition": 2})
    assert producer.signed("orders-a", b"plain", {}) == {}
    assert guard().judge_half(parse_half(0, 1, 1, b"k", b"v", kw1["headers"]), "h") is None
    assert guard().end_refusal(2, 9, "ga", b"end", kw2["headers"]) is None
    with pytest.raises(ConfigError, match="Op partition"):
        producer.signed(TOPICS.op, b"end", {})


# -- allow-list and tenants file --------------------------------------------------------
def test_the_allow_list_takes_exact_names_and_prefixes_per_group():
    allow = AllowList(TENANTS)
    assert allow.allows("gb", "b.x") and allow.allows("gb", "orders-b")
    assert not allow.allows("ga", "b.x") and not allow.allows("gz", "orders-a")
    assert "not on producer group 'ga'" in allow.refusal("ga", "orders-b")


@pytest.mark.parametrize(
    "spec, error",
    [
        ({"version": 1, "groups": {"g": {"principal": "alice"}}}, "User:NAME"),
        (
            {"version": 1, "groups": {"g": {"principal": "User:a", "topics": ["__rmq_half"]}}},
            "system topics",
        ),
        (
            {"version": 1, "groups": {"g": {"principal": "User:a", "topic_prefixes": ["__"]}}},
            "system topics",
        ),
        ({"groups": {}}, "version"),
        ({"version": 1, "groups": {"g": {"principal": "User:a", "topics": "t"}}}, "list"),
    ],
)
def test_a_wrong_tenants_file_is_one_config_error(spec, error):
    with pytest.raises(ConfigError, match=error):
        parse_tenants(spec, "__rmq")


def test_isolation_needs_both_the_tenants_file_and_a_tenant_key():
    with pytest.raises(ConfigError, match="needs both"):
        CoordinatorSettings(tenants_file="t.json")
    with pytest.raises(ConfigError, match="needs both"):
        CoordinatorSettings(tenant_key="k" * 32)
    assert CoordinatorSettings().tenants_file == ""  # off by default: PLAINTEXT as before


# -- the documented ACLs -------------------------------------------------------------------
def test_the_acl_table_in_docs_security_is_the_generated_one(tmp_path):
    doc = (REPO / "docs" / "security.md").read_text()
    example = re.search(r"<!-- tenants-example -->\n```json\n(.*?)```", doc, re.S).group(1)
    table = re.search(r"<!-- acls:begin -->\n(.*?)\n<!-- acls:end -->", doc, re.S).group(1)
    (tmp_path / "tenants.json").write_text(example)
    tenants, consumers = load_deployment(str(tmp_path / "tenants.json"), "__rmq")
    acls = acl_bindings(
        tenants,
        Principals("User:rmq-coordinator", "User:rmq-ops", "User:spark", ("orders",)),
        consumers,
    )
    assert table.strip() == markdown_table(acls), (
        "regenerate: rmq-semantics tenant acls --markdown (see docs/security.md)"
    )


def test_producer_principals_get_only_literal_acls_and_never_the_keys_topic():
    acls = acl_bindings(TENANTS, Principals("User:c", "User:ops", "User:s", ("orders-a",)))
    for acl in acls:
        if acl.role in ("producer group", "consumer group", "operators' CLI"):
            if acl.resource != "transactional-id" and acl.name.startswith("__rmq"):
                assert acl.pattern == "literal", acl
            assert acl.name != TOPICS.keys
    own = {(a.principal, a.name) for a in acls if a.name.startswith("__rmq_check")}
    assert own == {("User:a", "__rmq_check_ga"), ("User:b", "__rmq_check_gb")}
    writes = {
        a.name
        for a in acls
        if a.principal == "User:c"
        and "WRITE" in a.operations
        and a.resource == "topic"
        and not a.name.startswith("__rmq")
    }
    assert writes == {"orders-a", "orders-b", "b."}  # the allow-list, nothing more
    assert json.dumps([a.name for a in acls])  # plain strings throughout


def _acls_of(acls, principal: str) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {(a.resource, a.name, a.pattern, a.operations) for a in acls if a.principal == principal}


def test_each_consumer_kind_gets_what_its_class_touches_and_nothing_more():
    consumers = parse_consumers(
        {
            "plain": {"principal": "User:p", "topics": ["t"]},
            "ord": {"principal": "User:o", "topics": ["t"], "orderly": True},
            "push": {"principal": "User:u", "topics": ["t"], "kind": "push", "retry_levels": 2},
            "simple": {"principal": "User:s", "topics": ["t"], "kind": "simple"},
        }
    )
    acls = acl_bindings(TENANTS, Principals("User:c", "User:ops"), consumers)
    own = {("topic", "t", "literal", ("READ", "DESCRIBE"))}
    assert _acls_of(acls, "User:p") == own | {("group", "plain", "literal", ("READ",))}
    assert _acls_of(acls, "User:o") == own | {
        ("group", "ord", "literal", ("READ",)),
        ("topic", "__rmq_lock_request", "literal", ("WRITE", "DESCRIBE")),
        ("topic", "__rmq_lock_reply", "literal", ("READ", "DESCRIBE")),
        ("group", "__rmq_lock_client", "literal", ("DESCRIBE",)),
        ("topic", "__rmq_dlq_ord", "literal", ("WRITE", "DESCRIBE", "CREATE")),
    }
    retry = ("READ", "WRITE", "DESCRIBE", "CREATE")
    assert _acls_of(acls, "User:u") == own | {
        ("group", "push", "literal", ("READ",)),
        ("topic", "__rmq_retry_push_1", "literal", retry),
        ("topic", "__rmq_retry_push_2", "literal", retry),
        ("transactional-id", "__rmq_push_push@", "prefixed", ("WRITE", "DESCRIBE")),
        ("topic", "__rmq_dlq_push", "literal", ("WRITE", "DESCRIBE", "CREATE")),
    }
    assert _acls_of(acls, "User:s") == own | {
        ("group", "simple", "literal", ("READ",)),
        ("topic", "__rmq_dlq_simple", "literal", ("WRITE", "DESCRIBE", "CREATE")),
    }
    ops = _acls_of(acls, "User:ops")
    for group in ("ord", "push", "simple"):
        assert ("topic", f"__rmq_dlq_{group}", "literal", ("READ", "DESCRIBE")) in ops
        redrive = ("transactional-id", f"__rmq_dlq_redrive_{group}", "literal")
        assert (*redrive, ("WRITE", "DESCRIBE")) in ops
    assert ("topic", "t", "literal", ("WRITE", "DESCRIBE")) in ops  # dlq redrive's target
    assert not any("plain" in name for _, name, _, _ in ops)  # no DLQ: nothing to re-drive


def test_the_default_retry_levels_are_the_push_consumers_default_delay_levels():
    from rmq_semantics.push import DEFAULT_DELAY_LEVELS

    [push] = parse_consumers({"g": {"principal": "User:u", "topics": [], "kind": "push"}})
    assert push.retry_levels == len(DEFAULT_DELAY_LEVELS)


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"principal": "User:u", "kind": "pull"}, "kind 'pull' is none of"),
        ({"principal": "User:u", "kind": "push", "orderly": True}, "contradicts"),
        ({"principal": "User:u", "kind": "push", "retry_levels": 0}, "retry_levels"),
        ({"principal": "User:u", "topics": "t"}, "list of names"),
        ({"topics": ["t"]}, "needs a principal"),
    ],
)
def test_a_wrong_consumer_group_is_one_config_error(spec, error):
    with pytest.raises(ConfigError, match=error):
        parse_consumers({"g": spec})


def test_a_push_group_whose_name_holds_the_terminator_is_refused():
    # __rmq_push_g@ would also match the transactional ids of group "g@x".
    with pytest.raises(ConfigError, match="'@'"):
        parse_consumers({"g@x": {"principal": "User:u", "kind": "push"}})


# -- the producer's check topic ---------------------------------------------------------------
class NullListener(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return None

    def check_local_transaction(self, msg):
        return None


@pytest.mark.parametrize(
    "key, topic, group",
    [
        (None, "__rmq_check", "__rmq_check_g.a"),  # isolation off: as before
        ("k" * 32, "__rmq_check_g_2ea", "__rmq_check_g_2ea"),  # its own topic, same-named group
    ],
)
def test_a_producer_reads_its_checks_from_its_groups_topic_only_with_a_key(key, topic, group):
    producer = TransactionProducer(
        {"bootstrap.servers": "127.0.0.1:1"},
        producer_group="g.a",
        listener=NullListener(),
        group_key=key,
    )
    checks = producer._checks
    assert (checks.check_topic, checks._conf["group.id"]) == (topic, group)


# -- timer messages (coordinator/timer_service.py) ---------------------------------------------
def _timer(group: str, topic: str, signer: str | None, *, value: bytes = b"v"):

    headers = timer_headers(Message(topic, value, key=b"k"), "id1", 2000, 1000, group)
    if signer is not None:
        headers = sign_timer_headers(derive_group_key(TENANT_KEY, signer), headers, b"k", value)
    return parse_timer(0, 0, 7, 1000, b"k", value, headers)


@pytest.mark.parametrize(
    ("group", "topic", "signer", "verdict"),
    [
        ("ga", "orders-a", "ga", None),
        ("ga", "orders-a", None, DiscardReason.FORGED),
        ("ga", "orders-a", "gb", DiscardReason.FORGED),
        ("nobody", "orders-a", "nobody", DiscardReason.FORGED),
        ("ga", "orders-b", "ga", DiscardReason.NOT_ALLOWED),
    ],
)
def test_a_timer_record_is_delivered_only_signed_by_its_group_into_its_allow_list(
    group, topic, signer, verdict
):
    refused = guard().judge_timer(_timer(group, topic, signer))
    assert (refused and refused[0]) == verdict


def test_a_timer_cancel_is_trusted_only_with_its_group_mac():

    value = encode(TimerCancel("id1", "ga", 1000))
    mac = derive_group_key(TENANT_KEY, "ga").mac(cancel_canonical(TOPICS.timer_cancel, 3, value))
    g = guard()
    assert g.cancel_refusal(TOPICS.timer_cancel, 3, "ga", value, [(H.GROUP_MAC, mac)]) is None
    assert g.cancel_refusal(TOPICS.timer_cancel, 4, "ga", value, [(H.GROUP_MAC, mac)])
    assert g.cancel_refusal(TOPICS.timer_cancel, 3, "ga", value, [])
    assert g.cancel_refusal(TOPICS.timer_cancel, 3, "nobody", value, [(H.GROUP_MAC, mac)])


def test_timer_records_and_cancels_of_before_isolation_are_trusted_unsigned_below_the_marks():
    """Issue 44, item 8: the timer topics' upgrade watermarks, as the half topic's."""
    marks = {"timer": {0: 8}, "timer_2": {0: 3}, "timer_cancel": {3: 5}}
    g = guard(marks)
    assert g.judge_timer(_timer("ga", "orders-a", None)) is None  # intake 0@7 < 8
    assert g.judge_timer(_timer("ga", "orders-b", None))[0] is DiscardReason.NOT_ALLOWED
    assert g.judge_timer(_timer("nobody", "orders-a", None))[0] is DiscardReason.FORGED
    assert guard({"timer": {0: 7}}).judge_timer(_timer("ga", "orders-a", None))
    assert guard({"timer": {1: 8}}).judge_timer(_timer("ga", "orders-a", None))
    value = encode(TimerCancel("id1", "ga", 1000))
    assert g.cancel_refusal(TOPICS.timer_cancel, 3, "ga", value, [], offset=4) is None
    assert g.cancel_refusal(TOPICS.timer_cancel, 3, "ga", value, [], offset=5)
    assert g.cancel_refusal(TOPICS.timer_cancel, 3, "ga", value, [])  # no offset: no trust
    assert g.cancel_refusal(TOPICS.timer_cancel, 3, "nobody", value, [], offset=0)


def test_a_timer_record_of_before_is_signed_for_its_group_when_re_appended():
    legacy = _timer("ga", "orders-a", None)
    headers = guard().resign_timer(legacy, legacy.reappended_headers())
    again = parse_timer(2, 0, 50, 1000, legacy.key, legacy.value, headers)
    assert guard().judge_timer(again) is None  # above every watermark, and signed
    signed = _timer("ga", "orders-a", "ga")
    assert dict(guard().resign_timer(signed, list(signed.headers)))[H.GROUP_MAC] == (
        signed.group_mac
    )
