"""A lock service that takes a lock partition over while the previous owner's transaction
is still open there (the fault campaign, seed 30: a takeover's grants were committed but
their markers not yet written when both coordinators re-read their partitions) must not
answer from the table before it. A read_committed reader stops at the open transaction,
so the partition's end arrives before the previous owner's grant, and a table rebuilt there
hands the queue out again with a lower epoch.

The previous owner is played by a plain confluent_kafka transactional producer: it writes
its grant to the lock topic in a transaction it commits only once the new service runs."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer as RawProducer

from coordinator.lock_service import lock_topic_specs
from coordinator.settings import CoordinatorSettings
from rmq_semantics.lock_client import LockClient, LockGrant
from rmq_semantics.records.codec import decode_lock_state, encode
from rmq_semantics.records.locks import LockEntry, LockKey, LockState
from rmq_semantics.topics import ensure_topics
from tests.integration.txn_helpers import FAST, ThreadCoordinator, read_to_end, wait_for

pytestmark = pytest.mark.integration

LEASE_MS = 60000


def test_a_lock_takeover_waits_for_the_previous_owners_open_transaction(broker, unique):
    """The previous owner granted the queue to ``second`` with epoch 2 in a transaction
    still open when the new service reads the lock topic. The new service waits for it:
    ``second`` keeps its lock and epoch, ``first`` is never granted the queue, and the
    epochs in the lock topic never go down."""
    prefix = unique("lt").replace("-", "")
    conf = broker.conf()
    group, topic = unique("g"), unique("orders")
    key = LockKey(group, topic, 0)
    ensure_topics(conf, lock_topic_specs(CoordinatorSettings(**FAST, topic_prefix=prefix)))
    now = int(time.time() * 1000)
    grant = LockEntry(key, LockState.HELD, "second", 2, LEASE_MS, now, now + LEASE_MS, now)
    previous_owner = RawProducer(
        {**conf, "transactional.id": unique("previous-owner"), "transaction.timeout.ms": 120000}
    )
    previous_owner.init_transactions(30)
    previous_owner.begin_transaction()
    previous_owner.produce(
        f"{prefix}_lock",
        encode(grant),
        key=key.record_key(),
        partition=key.request_partition(FAST["half_partitions"]),
    )
    assert previous_owner.flush(30) == 0
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        LockClient(conf, topic_prefix=prefix, client_id="first") as first,
        LockClient(conf, topic_prefix=prefix, client_id="second") as second,
    ):
        locks = coordinator.server.locks
        early: list[LockGrant] = []

        def granted_or_waiting() -> bool:
            grant = first.lock(group, [(topic, 0)], LEASE_MS, timeout=1)[(topic, 0)]
            early.extend([grant] if grant.granted else [])
            return grant.granted or locks.counts["takeover_waited"] > 0

        # The defect grants the queue to ``first`` at once; the fix waits and counts it.
        wait_for(
            granted_or_waiting, 60, "a grant to first, or the takeover waiting for the open txn"
        )
        previous_owner.commit_transaction(30)
        kept = second.lock(group, [(topic, 0)], LEASE_MS, timeout=30)[(topic, 0)]
        taken = first.lock(group, [(topic, 0)], LEASE_MS, timeout=30)[(topic, 0)]
    entries = [
        decode_lock_state(m.key(), m.value())
        for m in read_to_end(conf, f"{prefix}_lock", FAST["half_partitions"])
        if m.key() == key.record_key()
    ]
    epochs = [(e.client_id, e.epoch) for e in entries if e.state is LockState.HELD]
    assert not early, f"first was granted the queue before the takeover read: {epochs}"
    assert kept.granted and kept.epoch == 2, f"second lost its lock: {kept}, topic {epochs}"
    assert not taken.granted, f"first took second's live lock: {taken}, topic {epochs}"
    assert epochs == sorted(epochs, key=lambda ce: ce[1]), f"an epoch went down: {epochs}"
