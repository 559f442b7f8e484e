"""Queue locks under tenant isolation, without a broker: a consumer group's key, the MAC of a
lock request (schema v3), the lock service's judgement of each request version
(``coordinator/lock_auth.py``, ``coordinator/lock_requests.answer``), the orderly
consumer's key settings and ``rmq-semantics tenant key --consumer-group``."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from coordinator.lock import LeaseCeiling, LockTable, RequestPoison
from coordinator.lock_auth import KEY_CACHE, UNAUTHENTICATED, LockGuard, lock_guard
from coordinator.lock_requests import Partitions, answer
from coordinator.settings import CoordinatorSettings
from rmq_semantics import OrderlyConsumer, OrderlyConsumerSettings
from rmq_semantics.errors import ConfigError
from rmq_semantics.group_signing import consumer_group_key_of
from rmq_semantics.lock_client import LockClient
from rmq_semantics.records.codec import decode, decode_as, encode
from rmq_semantics.records.group_auth import (
    GroupKey,
    derive_consumer_group_key,
    derive_group_key,
    lock_request_verifies,
    sign_lock_request,
)
from rmq_semantics.records.locks import LockKey, LockRequest, QueueRef, RequestKind
from rmq_semantics.settings import load

TENANT_KEY = b"the tenant key of the lock unit tests, 32+"
TOPIC = "__rmq_lock_request"
PARTITIONS = 4
T0 = 1_700_000_000_000
NOWHERE = {"bootstrap.servers": "127.0.0.1:1"}


def request(group: str = "ca", client: str = "ca@1", kind=RequestKind.LOCK, **kw) -> LockRequest:
    fields = {
        "kind": kind,
        "request_id": "r-" + client,
        "client_id": client,
        "group": group,
        "reply_partition": 1,
        "queues": (QueueRef("orders", 0, kw.pop("epoch", None)),),
        "lease_ms": 6000,
        "sent_at_ms": T0,
        "wait_ms": 5000,
    }
    return LockRequest(**{**fields, **kw})


def partition(r: LockRequest) -> int:
    return r.queues[0].key(r.group).request_partition(PARTITIONS)


def signed(r: LockRequest, group: str | None = None) -> LockRequest:
    key = derive_consumer_group_key(TENANT_KEY, group or r.group)
    return sign_lock_request(key, TOPIC, partition(r), r)


# -- the key and the MAC ---------------------------------------------------------------------
def test_a_consumer_groups_key_is_not_the_producer_group_key_of_the_same_name():
    consumer = derive_consumer_group_key(TENANT_KEY, "orders")
    assert consumer.text() != derive_group_key(TENANT_KEY, "orders").text()
    assert consumer.text() == derive_consumer_group_key(TENANT_KEY, "orders").text()
    assert consumer.text() != derive_consumer_group_key(TENANT_KEY, "orders2").text()
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        derive_consumer_group_key(b"short", "orders")


def test_a_signed_request_verifies_only_where_and_as_it_was_written():
    r = signed(request())
    key = derive_consumer_group_key(TENANT_KEY, "ca")
    p = partition(r)
    assert lock_request_verifies(key, TOPIC, p, r)
    assert lock_request_verifies(key, TOPIC, p, decode_as(LockRequest, encode(r)))
    assert not lock_request_verifies(key, TOPIC, p + 1, r)
    assert not lock_request_verifies(key, "other_lock_request", p, r)
    assert not lock_request_verifies(derive_consumer_group_key(TENANT_KEY, "cb"), TOPIC, p, r)
    changes = {
        "kind": RequestKind.UNLOCK,
        "request_id": "other",
        "client_id": "ca@2",
        "group": "cb",
        "reply_partition": 2,
        "queues": (QueueRef("orders", 0, 7),),
        "lease_ms": 60_000,
        "sent_at_ms": T0 + 1,
        "wait_ms": 1,
    }
    for name, value in changes.items():
        assert not lock_request_verifies(key, TOPIC, p, dataclasses.replace(r, **{name: value})), (
            name
        )


@pytest.mark.parametrize("version", [1, 2])
def test_a_request_of_before_v3_decodes_unsigned(version):
    data = encode(signed(request()), version)
    assert data[2] == version
    decoded = decode(data)
    assert isinstance(decoded, LockRequest) and decoded.mac is None
    assert decoded.wait_ms == (0 if version == 1 else 5000)


def test_encode_refuses_a_version_the_type_does_not_have():
    with pytest.raises(ConfigError, match=r"versions 1\.\.3"):
        encode(request(), 4)
    with pytest.raises(ConfigError, match=r"versions 1\.\.3"):
        encode(request(), 0)


# -- the guard -------------------------------------------------------------------------------
def test_the_guard_refuses_unsigned_and_wrongly_signed_requests():
    guard = LockGuard(TENANT_KEY)
    good = signed(request())
    assert guard.refusal(TOPIC, partition(good), good) is None
    assert "no mac" in guard.refusal(TOPIC, partition(good), request())
    forged = signed(request(), group="cb")  # B's own key, A's group
    assert "no valid mac of consumer group 'ca'" in guard.refusal(TOPIC, partition(forged), forged)
    garbage = dataclasses.replace(good, mac=b"\x00" * 3)
    assert guard.refusal(TOPIC, partition(good), garbage) is not None
    assert "hidden" in repr(guard) and TENANT_KEY.decode() not in repr(guard)


def test_the_guards_key_cache_is_bounded():
    guard = LockGuard(TENANT_KEY)
    for i in range(KEY_CACHE + 50):
        r = dataclasses.replace(request(group=f"g{i}"), mac=b"x" * 32)
        guard.refusal(TOPIC, partition(r), r)
    assert len(guard._keys) == KEY_CACHE


def test_the_guard_is_on_with_a_tenants_file_only(tmp_path):
    assert lock_guard(CoordinatorSettings()) is None
    tenants = tmp_path / "tenants.json"
    tenants.write_text('{"version": 1, "groups": {}}')
    settings = CoordinatorSettings(tenants_file=str(tenants), tenant_key=TENANT_KEY.decode())
    assert isinstance(lock_guard(settings), LockGuard)


# -- the lock service's decisions ------------------------------------------------------------
@dataclass
class Record:
    """A consumed request record, as much of it as ``answer`` reads."""

    data: bytes
    p: int
    off: int

    def value(self) -> bytes:
        return self.data

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.off

    def topic(self) -> str:
        return TOPIC

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)


def decide(tables: dict, requests: list[tuple[LockRequest, int]], guard, now: int = T0):
    """``requests`` (each with the schema version to write it in) answered in one batch;
    the tables keep what it changed. Returns (client, granted, reason) per reply, counts."""
    counts: Counter[str] = Counter()
    batch = [Record(encode(r, version), partition(r), i) for i, (r, version) in enumerate(requests)]
    out = answer(
        batch,
        tables,
        Partitions(PARTITIONS, PARTITIONS),
        LeaseCeiling(60_000),
        RequestPoison(3),
        now,
        lambda event: counts.update([event]),
        guard,
    )
    for p, table in out.staged.items():
        tables[p].absorb(table)
    replies = [(r.client_id, r.results[0].granted, r.results[0].reason) for _, r in out.replies]
    return replies, counts


def holder(tables: dict, group: str = "ca") -> str:
    key = LockKey(group, "orders", 0)
    return tables[key.request_partition(PARTITIONS)].get(key).client_id


def test_under_isolation_only_the_groups_signed_requests_change_its_lock():
    tables: dict[int, LockTable] = {}
    guard = LockGuard(TENANT_KEY)
    replies, _ = decide(tables, [(signed(request()), 3)], guard)
    assert replies == [("ca@1", True, "granted")]
    # B releases A's lock as A's client, then takes it: unsigned (v1, v2, v3), or signed
    # with B's own group's key.
    attack = [
        (request(client="ca@1", kind=RequestKind.UNLOCK, epoch=1), 1),
        (request(client="ca@1", kind=RequestKind.UNLOCK, epoch=1), 2),
        (request(client="ca@1", kind=RequestKind.UNLOCK, epoch=1), 3),
        (signed(request(client="ca@1", kind=RequestKind.UNLOCK, epoch=1), "cb"), 3),
        (request(client="thief"), 2),
        (signed(request(client="thief"), "cb"), 3),
    ]
    replies, counts = decide(tables, attack, guard)
    assert replies == [(r.client_id, False, UNAUTHENTICATED) for r, _ in attack]
    assert counts[UNAUTHENTICATED] == len(attack) and counts["released"] == 0
    assert holder(tables) == "ca@1"
    replies, _ = decide(tables, [(signed(request(kind=RequestKind.UNLOCK, epoch=1)), 3)], guard)
    assert replies == [("ca@1", True, "released")]


def test_with_isolation_off_requests_of_every_version_are_decided():
    tables: dict[int, LockTable] = {}
    replies, counts = decide(
        tables,
        [
            (request(client="old-v1"), 1),
            (request(client="old-v1", kind=RequestKind.UNLOCK, epoch=1), 1),
            (request(client="old-v2"), 2),
            (request(client="old-v2", kind=RequestKind.UNLOCK, epoch=2), 2),
            (signed(request(client="new")), 3),
            (signed(request(client="thief"), "cb"), 3),  # its MAC is not asked for
        ],
        None,
    )
    assert replies == [
        ("old-v1", True, "granted"),
        ("old-v1", True, "released"),
        ("old-v2", True, "granted"),
        ("old-v2", True, "released"),
        ("new", True, "granted"),
        ("thief", False, "held_by_other"),
    ]
    assert counts[UNAUTHENTICATED] == 0


# -- the lock client -------------------------------------------------------------------------
def sent_by(group_key: GroupKey | None) -> list[tuple[bytes, int]]:
    """What a LockClient with ``group_key`` writes for one lock call: (value, partition)."""
    client = LockClient(NOWHERE, topic_prefix="app", client_id="ca@1", group_key=group_key)
    sent: list[tuple[bytes, int]] = []
    client._producer = SimpleNamespace(
        produce=lambda topic, value, **kw: sent.append((value, kw["partition"])),
        flush=lambda timeout: 0,
    )
    client._consumer = SimpleNamespace(consume=lambda n, timeout: [])
    client._request_partitions, client.reply_partition = PARTITIONS, 1
    client.lock("ca", [("orders", 0), ("payments", 3)], 30000, timeout=0.05)
    return sent


def test_a_lock_client_with_its_groups_key_writes_signed_v3_requests():
    key = derive_consumer_group_key(TENANT_KEY, "ca")
    sent = sent_by(key)
    assert sent and all(value[2] == 3 for value, _ in sent)
    guard = LockGuard(TENANT_KEY)
    for value, p in sent:
        assert guard.refusal("app_lock_request", p, decode_as(LockRequest, value)) is None


def test_a_lock_client_without_a_key_writes_v2_as_before():
    sent = sent_by(None)
    assert sent and all(value[2] == 2 for value, _ in sent)
    assert all(decode_as(LockRequest, value).mac is None for value, _ in sent)


# -- the consumer's settings and the CLI ------------------------------------------------------
def test_the_consumer_group_key_comes_from_kwargs_env_or_a_file(tmp_path):
    key = derive_consumer_group_key(TENANT_KEY, "ca").text()
    assert consumer_group_key_of(load(OrderlyConsumerSettings, {}, env={})) is None
    from_env = load(OrderlyConsumerSettings, {}, env={"RMQ_CONSUMER_GROUP_KEY": key})
    assert isinstance(consumer_group_key_of(from_env), GroupKey)
    path = tmp_path / "key"
    path.write_text(key + "\n")
    from_file = consumer_group_key_of(OrderlyConsumerSettings(consumer_group_key_file=str(path)))
    assert from_file is not None and from_file.text() == key
    assert key not in repr(OrderlyConsumerSettings(consumer_group_key=key))
    with pytest.raises(ConfigError, match="give one of them"):
        OrderlyConsumerSettings(consumer_group_key=key, consumer_group_key_file=str(path))
    with pytest.raises(ConfigError, match="consumer_group_key_file="):
        consumer_group_key_of(OrderlyConsumerSettings(consumer_group_key_file=str(path) + "x"))
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        OrderlyConsumer(
            {"bootstrap.servers": "127.0.0.1:1", "group.id": "ca"},
            listener=lambda msgs, context: None,
            consumer_group_key="short",
        )


def test_the_orderly_consumer_signs_with_its_key(monkeypatch):
    key = derive_consumer_group_key(TENANT_KEY, "ca").text()
    monkeypatch.setenv("RMQ_CONSUMER_GROUP_KEY", key)
    consumer = OrderlyConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "ca"},
        listener=lambda msgs, context: None,
        ordering="key",
    )
    assert consumer._lock_client._group_key.text() == key
    consumer.shutdown()


def test_the_cli_prints_a_consumer_groups_key(monkeypatch, capsys):
    from rmq_semantics.cli import main

    monkeypatch.setenv("RMQ_TENANT_KEY", TENANT_KEY.decode())
    assert main(["tenant", "key", "--consumer-group", "ca"]) == 0
    assert capsys.readouterr().out.strip() == derive_consumer_group_key(TENANT_KEY, "ca").text()
    assert main(["tenant", "key", "--group", "ca"]) == 0
    assert capsys.readouterr().out.strip() == derive_group_key(TENANT_KEY, "ca").text()
    assert main(["tenant", "key", "--group", "ca", "--consumer-group", "ca"]) != 0
