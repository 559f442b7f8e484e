"""Queue locks under tenant isolation (docs/security.md, "Consumer groups"): two orderly
consumer groups, ``ca`` (principal ``ca``) and ``cb`` (principal ``cb``), with exactly the
ACLs ``coordinator/acls.py`` generates for them (WRITE on the lock request topic, READ on
the lock reply topic). ``cb`` plays the adversary with a plain Kafka client and the
product's own codec: it reads every reply, learns ``ca``'s client id and epochs there and
sends unlock and lock requests for ``ca``'s queues. The rig is tenancy_helpers.py, on the
session's secured broker."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition

from rmq_semantics import ConsumeOrderlyStatus, OrderlyConsumer
from rmq_semantics.errors import KafkaOperationError, MalformedRecordError
from rmq_semantics.lock_client import LockClient
from rmq_semantics.records.codec import decode_as, encode
from rmq_semantics.records.group_auth import GroupKey, sign_lock_request
from rmq_semantics.records.locks import LockKey, LockReply, LockRequest, QueueRef, RequestKind
from rmq_semantics.selector import java_partition
from rmq_semantics.topics import SystemTopics, ensure_topics
from tests.integration.tenancy_helpers import (
    MARKER_KEY,
    SIZES,
    Deployment,
    consumer_key,
    delivered,
    deployment,
    user_conf,
)
from tests.integration.txn_helpers import ThreadCoordinator, metric, wait_for

pytestmark = pytest.mark.integration

# A's consumer renews every second, so a lock taken from it shows within seconds; the
# adversary asks for the coordinator's whole lease (60 s), well past the waits below.
A_LEASE = {"lock_lease_ms": 6000, "lock_renew_ms": 1000}
# A record written after the attack is consumed within this while A keeps its locks.
CONSUMED_WITHIN_S = 20.0
THIEF = "thief"
ATTEMPTS = 5


@dataclass
class Locks:
    iso: Deployment
    topic: str  # read by consumer group ca only (one partition)


@pytest.fixture(scope="module")
def locks(secured_broker) -> Iterator[Locks]:
    topic = f"tl-{uuid.uuid4().hex[:6]}"
    consumers = {
        "ca": {"principal": "User:ca", "topics": [topic], "orderly": True},
        "cb": {"principal": "User:cb", "topics": [topic + "-b"], "orderly": True},
    }
    with deployment(*secured_broker, consumers=consumers) as iso:
        ensure_topics(iso.conf("admin"), {topic: (1, {}), topic + "-b": (1, {})})
        yield Locks(iso, topic)


class Recorder:
    """A's listener: the values it consumed."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self._lock = threading.Lock()

    def __call__(self, msgs, context) -> ConsumeOrderlyStatus:
        with self._lock:
            self.values += [m.value for m in msgs]
        return ConsumeOrderlyStatus.SUCCESS

    def has(self, value: bytes) -> bool:
        with self._lock:
            return value in self.values


def write(iso: Deployment, topic: str, value: bytes) -> None:
    producer = confluent_kafka.Producer(iso.conf("admin"))
    err, _ = delivered(producer, topic, value)
    assert err is None, err


class Adversary:
    """B with a plain consumer of every reply partition and a plain producer of requests."""

    def __init__(self, conf: dict, topics: SystemTopics, user: str = "cb") -> None:
        self.topics = topics
        meta = confluent_kafka.Producer(conf).list_topics(timeout=30)
        self.requests = len(meta.topics[topics.lock_request].partitions)
        self.replies = len(meta.topics[topics.lock_reply].partitions)
        self.producer = confluent_kafka.Producer(conf)
        self.reader = confluent_kafka.Consumer(
            {**conf, "group.id": user, "enable.auto.commit": False}
        )
        self.reader.assign([TopicPartition(topics.lock_reply, p, 0) for p in range(self.replies)])
        self.seen: list[LockReply] = []

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.reader.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            try:
                self.seen.append(decode_as(LockReply, msg.value()))
            except MalformedRecordError:
                continue

    def holder(self, topic: str) -> tuple[str, int] | None:
        """The client id and epoch of the last grant of ``topic``[0] to another client
        than B's, as B read it."""
        grants = [
            (reply.client_id, r.epoch)
            for reply in self.seen
            if reply.kind is RequestKind.LOCK and reply.client_id != THIEF
            for r in reply.results
            if (r.topic, r.partition, r.granted) == (topic, 0, True)
        ]
        return grants[-1] if grants else None

    def send(self, request: LockRequest) -> None:
        key = request.queues[0].key(request.group)
        err, _ = delivered(
            self.producer,
            self.topics.lock_request,
            encode(request),
            key=key.record_key(),
            partition=key.request_partition(self.requests),
        )
        assert err is None, err

    def request(
        self,
        kind: RequestKind,
        client: str,
        group: str,
        ref: QueueRef,
        key: GroupKey | None = None,
    ) -> LockRequest:
        """A request as a LockClient writes it; signed with ``key`` if given."""
        request = LockRequest(
            kind,
            uuid.uuid4().hex,
            client,
            group,
            java_partition(THIEF.encode(), self.replies),
            (ref,),
            60_000,
            int(time.time() * 1000),
            30_000,
        )
        if key is None:
            return request
        p = request.queues[0].key(group).request_partition(self.requests)
        return sign_lock_request(key, self.topics.lock_request, p, request)

    def close(self) -> None:
        self.reader.close()


def test_b_cannot_release_nor_take_a_groups_queue_locks(locks: Locks):
    iso = locks.iso
    recorder = Recorder()
    a = OrderlyConsumer(
        {**iso.conf("ca"), "group.id": "ca", "auto.offset.reset": "earliest"},
        listener=recorder,
        topic_prefix=iso.prefix,
        consumer_group_key=consumer_key("ca"),
        **A_LEASE,
    )
    a.subscribe([locks.topic])
    a.start()
    b = Adversary(iso.conf("cb"), iso.topics)
    b_key = GroupKey(consumer_key("cb").encode())
    try:
        write(iso, locks.topic, b"before")
        wait_for(lambda: recorder.has(b"before"), CONSUMED_WITHIN_S, "A to consume 'before'")
        own = []
        for _ in range(ATTEMPTS):
            b.read(1.0)
            held = b.holder(locks.topic)
            assert held is not None, "B read no grant of A's queue in the replies"
            client, epoch = held
            assert client.startswith("ca@"), client
            # As A's client: release A's lock (with the epoch B read); then take it as B.
            # Unsigned, and signed with B's own group's key.
            for sign in (None, b_key):
                release = b.request(
                    RequestKind.UNLOCK, client, "ca", QueueRef(locks.topic, 0, epoch), sign
                )
                take = b.request(RequestKind.LOCK, THIEF, "ca", QueueRef(locks.topic, 0), sign)
                b.send(release)
                b.send(take)
                own += [release.request_id, take.request_id]
        write(iso, locks.topic, b"after")
        wait_for(
            lambda: recorder.has(b"after"),
            CONSUMED_WITHIN_S,
            "A to consume 'after'",
            details=lambda: f"A's status: {a.status()}",
        )
        b.read(1.0)
        granted = [
            (r.kind.value, r.client_id, q.reason)
            for r in b.seen
            if r.request_id in own
            for q in r.results
            if q.granted
        ]
        assert not granted, f"B's requests for group ca were granted: {granted}"
        refused = [q.reason for r in b.seen if r.request_id in own for q in r.results]
        assert set(refused) == {"unauthenticated"}, refused
        counted = metric(iso.coordinator, "rmq_lock_events_total", event="unauthenticated")
        assert counted >= len(own), counted
    finally:
        b.close()
        a.shutdown()


def old_request(client: str, group: str, topic: str, version: int, **fields) -> tuple[bytes, int]:
    """A lock request as a client of before writes it (schema ``version``, no MAC), with
    the library's own codec: (value, request partition of 4)."""
    request = LockRequest(
        fields.pop("kind", RequestKind.LOCK),
        uuid.uuid4().hex,
        client,
        group,
        0,
        (QueueRef(topic, 0, fields.pop("epoch", None)),),
        60_000,
        int(time.time() * 1000),
        30_000,
    )
    partition = LockKey(group, topic, 0).request_partition(SIZES["half_partitions"])
    return encode(request, version), partition


def answers(reader: Adversary, values: list[tuple[bytes, int]]) -> list[tuple[str, bool, str]]:
    """Each request written (in order), then its reply: (client, granted, reason)."""
    ids = []
    for value, partition in values:
        request = decode_as(LockRequest, value)
        ids.append(request.request_id)
        err, _ = delivered(
            reader.producer,
            reader.topics.lock_request,
            value,
            key=request.queues[0].key(request.group).record_key(),
            partition=partition,
        )
        assert err is None, err
    wait_for(
        lambda: reader.read(0.5) or {r.request_id for r in reader.seen} >= set(ids),
        CONSUMED_WITHIN_S,
        "the replies",
    )
    by_id = {r.request_id: r for r in reader.seen}
    return [
        (by_id[i].client_id, by_id[i].results[0].granted, by_id[i].results[0].reason) for i in ids
    ]


def test_lock_requests_of_before_are_served_while_isolation_is_off(secured_broker):
    """A rolling upgrade, isolation still off: v1 and v2 requests of clients of before are
    decided as ever; a new client's signed v3 request too (its MAC is not asked for)."""
    broker, _ = secured_broker
    prefix = f"up{uuid.uuid4().hex[:6]}"
    topic = f"tu-{prefix}"
    conf = user_conf(broker, "admin")
    ensure_topics(conf, {topic: (1, {})})
    with ThreadCoordinator(conf, topic_prefix=prefix, marker_key=MARKER_KEY) as coordinator:
        wait_for(coordinator.server.locks.ready.is_set, 60, "the lock service")
        reader = Adversary(conf, SystemTopics(prefix), user="admin")
        try:
            got = answers(
                reader,
                [
                    old_request("old-v1", "g1", topic, 1),
                    old_request("old-v2", "g2", topic, 2),
                    old_request("old-v2", "g2", topic, 2, kind=RequestKind.UNLOCK, epoch=1),
                ],
            )
        finally:
            reader.close()
        assert got == [
            ("old-v1", True, "granted"),
            ("old-v2", True, "granted"),
            ("old-v2", True, "released"),
        ]
        key = GroupKey(consumer_key("g1").encode())
        with LockClient(conf, topic_prefix=prefix, client_id="new", group_key=key) as new:
            grants = new.lock("g2", [(topic, 0)], 60_000, timeout=CONSUMED_WITHIN_S)
        assert grants[(topic, 0)].granted and grants[(topic, 0)].epoch == 2


def test_with_isolation_on_unsigned_requests_of_before_are_refused_and_a_keyless_client_says_why(
    locks: Locks, caplog
):
    iso = locks.iso
    b = Adversary(iso.conf("ca"), iso.topics, user="ca")
    try:
        got = answers(
            b,
            [
                old_request("old-v1", "ca", locks.topic + "-x", 1),
                old_request("old-v2", "ca", locks.topic + "-x", 2),
            ],
        )
    finally:
        b.close()
    assert got == [("old-v1", False, "unauthenticated"), ("old-v2", False, "unauthenticated")]
    with (
        caplog.at_level(logging.WARNING, logger="rmq_semantics.lock_client"),
        LockClient(iso.conf("ca"), topic_prefix=iso.prefix, client_id="keyless") as keyless,
    ):
        grants = keyless.lock("ca", [(locks.topic + "-x", 0)], 60_000, timeout=CONSUMED_WITHIN_S)
    assert not grants[(locks.topic + "-x", 0)].granted
    assert any(
        "refused as unauthenticated" in m and "consumer_group_key" in m for m in caplog.messages
    ), caplog.messages


def test_a_key_ordered_consumer_signs_with_its_groups_key(locks: Locks):
    iso = locks.iso
    recorder = Recorder()
    topic = locks.topic + "-b"
    write(iso, topic, b"keyed")
    with OrderlyConsumer(
        {**iso.conf("cb"), "group.id": "cb", "auto.offset.reset": "earliest"},
        listener=recorder,
        topic_prefix=iso.prefix,
        ordering="key",
        consumer_group_key=consumer_key("cb"),
    ) as b:
        b.subscribe([topic])
        b.start()
        wait_for(lambda: recorder.has(b"keyed"), CONSUMED_WITHIN_S, "B to consume 'keyed'")


def test_a_principal_without_the_lock_topics_acls_is_told_so_not_that_they_do_not_exist(
    locks: Locks,
):
    """A principal the lock topics' ACLs leave out (``b``: a producer group's, no orderly
    consumer group) gets one error naming the authorization, not a missing lock service."""
    with (
        LockClient(locks.iso.conf("b"), topic_prefix=locks.iso.prefix, client_id="b") as b,
        pytest.raises(KafkaOperationError) as refused,
    ):
        b.lock("gb", [(locks.topic, 0)], 60_000, timeout=CONSUMED_WITHIN_S)
    text = str(refused.value)
    assert "not authorized" in text and locks.iso.topics.lock_request in text, text
    assert "does not exist" not in text, text
