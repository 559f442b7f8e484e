"""A commit whose transaction coordinator freezes, forced: the coordinator's transactional
producer (its ``KafkaTransactions``) copies one input record into a transaction with its
offset, then the broker that coordinates that transactional id is frozen (SIGSTOP) between
the offsets and the commit's EndTxn. The fault run (test_faults.py) meets this only when its
pause happens to land on a commit; here it always does, both ways it can end:

- ``endtxn_timeout``: the EndTxn times out before the cluster fails over (the coordinator
  unreachable without a failover, as behind a network partition; the test shortens the call
  timeout to 3 s to get there before the controller fences the frozen node after 9 s);
- ``failover_fence``: with the coordinator's own 30 s call timeout the cluster fails over
  first; the new transaction coordinator aborts the transaction, now past its 10 s timeout,
  and the EndTxn comes back fenced.

Either way the producer is re-created (librdkafka #5423: only a new epoch fences the old
transaction's late requests), and the replay from the committed offset leaves the record in
the output exactly once, whether the frozen broker had taken the commit or not."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from coordinator import kafka_txn
from coordinator.kafka_txn import KafkaTransactions
from rmq_semantics.errors import TransactionAborted
from tests.cluster.faults import coordinator_node, pause, resume, warm_up_internal_topics
from tests.integration.txn_helpers import read_to_end

pytestmark = pytest.mark.cluster


def _committed(conf: dict, group: str, topic: str) -> int:
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        offset = consumer.committed([TopicPartition(topic, 0)], timeout=30)[0].offset
        return max(offset, 0)
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("call_timeout_s", "logged"),
    [
        (3.0, "committing timed out"),
        (kafka_txn.TXN_CALL_TIMEOUT_S, "outlived its 10000 ms timeout"),
    ],
    ids=["endtxn_timeout", "failover_fence"],
)
def test_a_frozen_commit_recreates_the_producer_and_the_replay_copies_once(
    cluster, broker, make_topic, caplog, monkeypatch, call_timeout_s, logged
):
    monkeypatch.setattr(kafka_txn, "TXN_CALL_TIMEOUT_S", call_timeout_s)
    conf = broker.conf()
    source, sink = make_topic("endtxn-in"), make_topic("endtxn-out")
    warm_up_internal_topics(conf, source)
    seed = Producer(conf)
    seed.produce(source, value=b"order-1")
    seed.flush(30)

    group = f"endtxn-{uuid.uuid4().hex[:8]}"
    input_consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    metadata = input_consumer.consumer_group_metadata()
    txn = KafkaTransactions(conf, f"{group}-copier", who="endtxn-test")
    txn.init()
    frozen = coordinator_node(AdminClient(conf), "__transaction_state", txn.transactional_id)

    caplog.set_level(logging.WARNING, logger="coordinator.kafka_txn")
    with txn.body() as producer:
        producer.produce(sink, value=b"order-1")
        assert producer.flush(30) == 0, "the copy was not written before the pause"
    txn.producer.send_offsets_to_transaction([TopicPartition(source, 0, 1)], metadata, 30)
    pause(cluster, frozen)
    try:
        # No offsets left to send: finish() goes straight to the commit's EndTxn, which the
        # frozen transaction coordinator never answers.
        with pytest.raises(TransactionAborted, match="re-created"):
            txn.finish([], metadata)
    finally:
        resume(cluster, frozen)
    assert any(
        logged in r.getMessage() and "re-creating" in r.getMessage() for r in caplog.records
    ), caplog.text
    assert txn.renewals == 1

    # The replay, as the coordinator's: the new epoch first (it settles the old transaction,
    # committed or aborted), then the committed offset says whether the copy is still owed.
    txn.ensure_initialised()
    if _committed(conf, group, source) == 0:
        with txn.body() as producer:
            producer.produce(sink, value=b"order-1")
        txn.finish([TopicPartition(source, 0, 1)], metadata)
    input_consumer.close()
    txn.close()

    assert _committed(conf, group, source) == 1
    assert [m.value() for m in read_to_end(conf, sink, 1)] == [b"order-1"]
