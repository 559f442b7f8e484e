"""Queue locks under tenant isolation (docs/security.md, "Consumer groups"): two orderly
consumer groups, ``ca`` (principal ``ca``) and ``cb`` (principal ``cb``), with exactly the
ACLs ``coordinator/acls.py`` generates for them (WRITE on the lock request topic, READ on
the lock reply topic). ``cb`` plays the adversary with a plain Kafka client and the
product's own codec: it reads every reply, learns ``ca``'s client id and epochs there and
sends unlock and lock requests for ``ca``'s queues. The rig is tenancy_helpers.py, on the
session's secured broker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition

from rmq_semantics import ConsumeOrderlyStatus, OrderlyConsumer
from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.records.codec import decode_as, encode
from rmq_semantics.records.locks import LockReply, LockRequest, QueueRef, RequestKind
from rmq_semantics.selector import java_partition
from rmq_semantics.topics import ensure_topics
from tests.integration.tenancy_helpers import (
    Deployment,
    consumer_key,
    delivered,
    deployment,
)
from tests.integration.txn_helpers import wait_for

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

    def __init__(self, iso: Deployment) -> None:
        self.iso = iso
        conf = iso.conf("cb")
        meta = confluent_kafka.Producer(conf).list_topics(timeout=30)
        self.requests = len(meta.topics[iso.topics.lock_request].partitions)
        self.replies = len(meta.topics[iso.topics.lock_reply].partitions)
        self.producer = confluent_kafka.Producer(conf)
        self.reader = confluent_kafka.Consumer(
            {**conf, "group.id": "cb", "enable.auto.commit": False}
        )
        self.reader.assign(
            [TopicPartition(iso.topics.lock_reply, p, 0) for p in range(self.replies)]
        )
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
            self.iso.topics.lock_request,
            encode(request),
            key=key.record_key(),
            partition=key.request_partition(self.requests),
        )
        assert err is None, err

    def request(self, kind: RequestKind, client: str, group: str, ref: QueueRef) -> LockRequest:
        return LockRequest(
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

    def close(self) -> None:
        self.reader.close()


def test_b_cannot_release_nor_take_a_groups_queue_locks(locks: Locks, monkeypatch):
    iso = locks.iso
    monkeypatch.setenv("RMQ_CONSUMER_GROUP_KEY", consumer_key("ca"))
    recorder = Recorder()
    a = OrderlyConsumer(
        {**iso.conf("ca"), "group.id": "ca", "auto.offset.reset": "earliest"},
        listener=recorder,
        topic_prefix=iso.prefix,
        **A_LEASE,
    )
    a.subscribe([locks.topic])
    a.start()
    b = Adversary(iso)
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
            release = b.request(RequestKind.UNLOCK, client, "ca", QueueRef(locks.topic, 0, epoch))
            take = b.request(RequestKind.LOCK, THIEF, "ca", QueueRef(locks.topic, 0))
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
    finally:
        b.close()
        a.shutdown()
