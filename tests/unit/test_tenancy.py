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

from coordinator.acls import Principals, acl_bindings
from coordinator.settings import CoordinatorSettings
from coordinator.tenancy import AllowList, parse_tenants
from rmq_semantics.errors import ConfigError
from rmq_semantics.group_signing import SignedProducer
from rmq_semantics.message import Message
from rmq_semantics.records.group_auth import (
    derive_group_key,
    encode_group,
    half_canonical,
    op_canonical,
)
from rmq_semantics.records.half import half_headers, parse_half
from rmq_semantics.records.headers import H
from rmq_semantics.topics import SystemTopics

REPO = Path(__file__).resolve().parents[2]
TENANT_KEY = b"the tenant key of the unit tests, 32+"
TOPICS = SystemTopics("__rmq")
TENANTS = parse_tenants({"version": 1, "groups": {
    "ga": {"principal": "User:a", "topics": ["orders-a"]},
    "gb": {"principal": "User:b", "topics": ["orders-b"], "topic_prefixes": ["b."]},
}}, "__rmq")


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


# -- the signing producer -------------------------------------------------------------------
def test_the_signing_producer_signs_half_and_op_writes_and_nothing_else():
    key = derive_group_key(TENANT_KEY, "ga")
    producer = SignedProducer({"bootstrap.servers": "127.0.0.1:1"}, key=key, topics=TOPICS)
    headers = half_headers(Message("orders-a", b"v", key=b"k"), "t1", b"ga", b"1")
    kw1 = producer.signed(TOPICS.half, b"v", {"key": b"k", "headers": headers})
    kw2 = producer.signed(TOPICS.op, b"end", {"partition": 2})
    assert producer.signed("orders-a", b"plain", {}) == {}
    half = parse_half(0, 1, 1, b"k", b"v", kw1["headers"])
    canonical = half_canonical("ga", "t1", "orders-a", None, 1, 0, b"k", b"v")
    assert key.verifies(canonical, dict(half.headers)[H.GROUP_MAC])
    assert key.verifies(op_canonical(TOPICS.op, 2, b"end"), dict(kw2["headers"])[H.GROUP_MAC])
    assert not derive_group_key(TENANT_KEY, "gb").verifies(canonical,
                                                           dict(half.headers)[H.GROUP_MAC])
    with pytest.raises(ConfigError, match="Op partition"):
        producer.signed(TOPICS.op, b"end", {})


# -- allow-list and tenants file --------------------------------------------------------
def test_the_allow_list_takes_exact_names_and_prefixes_per_group():
    allow = AllowList(TENANTS)
    assert allow.allows("gb", "b.x") and allow.allows("gb", "orders-b")
    assert not allow.allows("ga", "b.x") and not allow.allows("gz", "orders-a")
    assert "not on producer group 'ga'" in allow.refusal("ga", "orders-b")


@pytest.mark.parametrize("spec, error", [
    ({"version": 1, "groups": {"g": {"principal": "alice"}}}, "User:NAME"),
    ({"version": 1, "groups": {"g": {"principal": "User:a", "topics": ["__rmq_half"]}}},
     "system topics"),
    ({"version": 1, "groups": {"g": {"principal": "User:a", "topic_prefixes": ["__"]}}},
     "system topics"),
    ({"groups": {}}, "version"),
    ({"version": 1, "groups": {"g": {"principal": "User:a", "topics": "t"}}}, "list"),
])
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
def test_producer_principals_get_only_literal_acls_and_never_the_keys_topic():
    acls = acl_bindings(TENANTS, Principals("User:c", "User:ops", "User:s", ("orders-a",)))
    for acl in acls:
        if acl.role in ("producer group", "consumer group", "operators' CLI"):
            if acl.resource != "transactional-id" and acl.name.startswith("__rmq"):
                assert acl.pattern == "literal", acl
            assert acl.name != TOPICS.keys
    writes = {a.name for a in acls if a.principal == "User:c" and "WRITE" in a.operations
              and a.resource == "topic" and not a.name.startswith("__rmq")}
    assert writes == {"orders-a", "orders-b", "b."}  # the allow-list, nothing more
    assert json.dumps([a.name for a in acls])  # plain strings throughout
