"""The full fault run on a 3-node cluster (`make test-cluster`), shaped like Kafka's own
transactions system test: 5,000 transactional messages, back-checks in the mix, and
mid-stream, in turn:

- SIGKILL of the node that leads the most half/op partitions, then its restart;
- SIGSTOP of the node that coordinates a coordinator's Kafka transactions, for longer than
  both the transaction timeout and a transactional call's timeout, then SIGCONT;
- a clean stop of that node, then its restart;
- SIGKILL of one of the two coordinators, then its restart.

A read_committed reader of the real topic then sees every committed message exactly once and
no rolled-back one, and a coordinator's log shows a transactional producer re-created after a
call to the frozen transaction coordinator timed out: an EndTxn when the pause caught one in
flight, otherwise a send_offsets_to_transaction that librdkafka never returns from
(librdkafka #5456), abandoned after 45 s.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient

from coordinator.kafka_txn import TXN_CALL_TIMEOUT_S
from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionListener, TransactionProducer
from rmq_semantics.errors import RmqError
from rmq_semantics.topics import SystemTopics
from tests.cluster.faults import (
    coordinator_node,
    describe_leaders,
    half_op_leaders,
    pause,
    resume,
    warm_up_internal_topics,
)
from tests.integration.txn_helpers import CoordinatorProcess, TopicReader, read_to_end, wait_for

pytestmark = pytest.mark.cluster

TOTAL = int(os.environ.get("RMQ_FAULT_MESSAGES", "5000"))
PARTITIONS = 3
SENDERS = 2
# Long enough that an EndTxn sent to the frozen transaction coordinator times out wherever
# the pause lands: a commit in flight at once; otherwise the offsets' call times out first and
# the abort's EndTxn a call timeout later.
PAUSE_S = 2 * TXN_CALL_TIMEOUT_S + 15
# check_max: the slow messages are answered UNKNOW through the whole pause, not discarded.
SETTINGS = {
    "half_partitions": 4,
    "check_partitions": 2,
    "transaction_timeout_ms": 3000,
    "check_interval_ms": 2500,
    "check_max": 200,
}
# Messages whose back-checks keep both coordinators writing transactions during the pause.
SLOW = 40


class LocalDatabase(TransactionListener):
    """The user's side: each local transaction's outcome, which its back-check reads. Every
    10th commits only on its back-check (UNKNOW first) and every 10th rolls back. A
    ``slow-`` message's back-check answers UNKNOW until :meth:`decide` (its local
    transaction is still running), which keeps the coordinators checking, so writing Kafka
    transactions, while a node is paused."""

    def __init__(self) -> None:
        self.outcomes: dict[bytes, S] = {}
        self.undecided: set[bytes] = set()
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg, arg):
        if msg.value.startswith(b"slow-"):
            with self.lock:
                self.outcomes[msg.value] = S.COMMIT_MESSAGE
                self.undecided.add(msg.value)
            return S.UNKNOW
        case = int(msg.value.split(b"-")[1]) % 10
        outcome = S.ROLLBACK_MESSAGE if case == 3 else S.COMMIT_MESSAGE
        with self.lock:
            self.outcomes[msg.value] = outcome
        return S.UNKNOW if case == 7 else outcome

    def check_local_transaction(self, msg):
        # A half record whose send raised never ran its local transaction: roll it back.
        with self.lock:
            if msg.value in self.undecided:
                return S.UNKNOW
            return self.outcomes.get(msg.value, S.ROLLBACK_MESSAGE)

    def decide(self) -> None:
        with self.lock:
            self.undecided.clear()

    def committed(self) -> set[bytes]:
        with self.lock:
            return {v for v, s in self.outcomes.items() if s is S.COMMIT_MESSAGE}


class Senders:
    """Threads sending the messages; a send that raises (its half write failed) is retried
    under a new value, as a user's request would be."""

    def __init__(self, producer: TransactionProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.sent = 0
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._send, args=(n,), daemon=True) for n in range(SENDERS)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _send(self, n: int) -> None:
        for i in range(n, TOTAL, SENDERS):
            for attempt in range(100):
                value = f"m-{i}-{attempt}".encode()
                try:
                    self.producer.send_message_in_transaction(
                        Message(self.topic, value, key=f"k{i % 50}")
                    )
                    break
                except RmqError as exc:
                    with self.lock:
                        self.failed.append(f"{value!r}: {exc}")
            with self.lock:
                self.sent += 1

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "the senders did not finish"


def test_transactions_through_broker_and_coordinator_faults(
    cluster, broker, make_topic, unique, tmp_path
):
    prefix = unique("f").replace("-", "")
    topics = SystemTopics(prefix)
    topic = make_topic("faults", partitions=PARTITIONS)
    conf = broker.conf()
    admin = AdminClient(conf)
    database = LocalDatabase()
    # Coordinator a's first transactional id must not be coordinated by the node that
    # coordinates the coordinators' group: the pause is the transaction coordinator's, and a
    # frozen group coordinator hangs send_offsets_to_transaction instead (librdkafka #5511).
    warm_up_internal_topics(conf, topic)
    group_node = coordinator_node(admin, "__consumer_offsets", topics.coordinator_group)
    ids = [
        next(
            i
            for i in (f"a-{uuid.uuid4().hex[:8]}" for _ in range(100))
            if coordinator_node(admin, "__transaction_state", f"{topics.coordinator_group}-{i}")
            != group_node
        ),
        f"b-{uuid.uuid4().hex[:8]}",
    ]
    coordinators = [
        CoordinatorProcess(
            broker.bootstrap, tmp_path / f"{i}.log", topic_prefix=prefix, instance_id=i, **SETTINGS
        )
        for i in ids
    ]
    reader = TopicReader(conf, topic, PARTITIONS)
    down: list[tuple[str, int]] = []  # nodes to bring back whatever happens

    def stage(sent_fraction: float) -> None:
        """Wait until this share of the messages is sent (the next fault hits mid-stream)."""
        wait_for(
            lambda: (
                [c.require_running() for c in coordinators]
                and senders.sent >= TOTAL * sent_fraction
            ),
            600,
            f"{sent_fraction:.0%} of the messages sent",
            details=lambda: f"sent {senders.sent}, failed sends {len(senders.failed)}",
        )

    try:
        for coordinator in coordinators:
            coordinator.wait_ready()
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=database,
            topic_prefix=prefix,
            half_partitions=4,
            check_partitions=2,
        ) as producer:
            senders = Senders(producer, topic)
            senders.start()

            stage(0.1)
            victim = half_op_leaders(admin, topics).most_common(1)[0][0]
            down.append(("start", victim))
            assert cluster.stop(victim, kill=True) == [victim]
            wait_for(
                lambda: victim not in half_op_leaders(admin, topics),
                60,
                f"the half/op leaderships of node {victim} to move",
                details=lambda: describe_leaders(admin, topics.half, topics.op),
            )
            cluster.start_node(victim)
            down.clear()

            stage(0.3)
            for i in range(SLOW):
                producer.send_message_in_transaction(Message(topic, f"slow-{i}".encode()))
            tid = f"{topics.coordinator_group}-{ids[0]}"
            txn_node = coordinator_node(admin, "__transaction_state", tid)
            pause(cluster, txn_node)
            down.append(("resume", txn_node))
            time.sleep(PAUSE_S)  # the fault itself is a duration: nothing to await
            resume(cluster, txn_node)
            down.clear()
            database.decide()

            stage(0.5)
            txn_node = coordinator_node(admin, "__transaction_state", tid)
            down.append(("start", txn_node))
            assert cluster.stop(txn_node) == [txn_node]
            cluster.start_node(txn_node)
            down.clear()

            stage(0.7)
            before = len(reader.records)
            coordinators[0].kill()
            reader.read_until(
                lambda r: coordinators[1].require_running() or len(r) >= before + 100,
                300,
                "promotions by the survivor",
            )
            coordinators[0] = CoordinatorProcess(
                broker.bootstrap,
                tmp_path / f"{ids[0]}.log",
                topic_prefix=prefix,
                instance_id=ids[0],
                **SETTINGS,
            )
            coordinators[0].wait_ready()

            senders.join(900)
            committed = database.committed()
            reader.read_until(
                lambda r: [c.require_running() for c in coordinators] and len(r) >= len(committed),
                600,
                "every promotion",
            )
    finally:
        for action, node in down:
            if action == "resume":
                resume(cluster, node)
            else:
                cluster.start_node(node)
        reader.close()
        exit_codes = [c.stop() for c in coordinators]
    logs = "".join(c.log for c in coordinators)
    assert exit_codes == [0, 0], logs[-3000:]
    counts = Counter(m.value() for m in read_to_end(conf, topic, PARTITIONS))
    assert set(counts) == committed, (
        f"missing {len(committed - set(counts))}, rolled back yet visible "
        f"{len(set(counts) - committed)}"
    )
    assert set(counts.values()) == {1}, [v for v, n in counts.items() if n > 1][:10]
    # A call to the frozen transaction coordinator times out (an EndTxn, when the pause
    # caught one in flight) or, as librdkafka's send_offsets_to_transaction does, never
    # returns and is abandoned: either way a new producer's epoch takes over.
    # Which of the three paths shows depends on where the pause lands (an EndTxn in flight
    # times out; a send_offsets_to_transaction never returns, librdkafka #5456; or the
    # broker times the transaction out first and fences it): each re-creates the producer.
    assert re.search(
        r"((committing|aborting) timed out|has not returned in \d+ s[^\n]*past its "
        r"\d+ s timeout|outlived its \d+ ms timeout)[^\n]*re-creating",
        logs,
    ), "no producer was re-created after the pause"
