"""Promotion sets (``promotion_sets`` > 1: several Kafka transactions open at once per
coordinator, one per set of its half partitions) keep exactly-once through a zombie.

Coordinators A and B share the half partitions, each promoting with two sets; A is paused
(SIGSTOP) while a Kafka transaction of one of its sets is open; B takes A's partitions once
A's session expires; A wakes up with its transactions in flight and the group moves
partitions back to it. Every committed transaction is on the real topic exactly once, by
``rmq.txn_id``; none rolled back is."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections import Counter

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.records.headers import H
from tests.integration.txn_helpers import (
    CoordinatorProcess,
    ScriptedListener,
    TopicReader,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2  # of the real topic
# The broker's smallest session timeout by default: A's partitions move to B this soon after
# it is paused, while the Kafka transaction it left open (10 s timeout) may still be open.
SHORT_SESSION = ("--kafka-option", "session.timeout.ms=6000")
PAUSE_ATTEMPTS = 20
ALL = "[0, 1, 2, 3]"
ASSIGNED = re.compile(r"assigned half/op partitions (\[[0-9, ]*\])")


def _decide(value: bytes) -> S:
    return S.COMMIT_MESSAGE if value.startswith(b"c") else S.ROLLBACK_MESSAGE


def _open_transaction(conf: dict, topic: str) -> bool:
    """Whether a Kafka transaction is open on ``topic``: some partition's last stable offset
    (what a read_committed reader may read up to) is below its high watermark."""
    ends = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = RawConsumer({**conf, "group.id": "unused-lso", "isolation.level": isolation})
        try:
            ends[isolation] = [
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)
            ]
        finally:
            consumer.close()
    return ends["read_committed"] != ends["read_uncommitted"]


def _signal(process: CoordinatorProcess, sig: signal.Signals) -> None:
    if process.pid is not None and process.poll() is None:
        os.kill(process.pid, sig)


def _assigned(process: CoordinatorProcess) -> list[str]:
    """The partition lists ``process`` was assigned, in order (from its log)."""
    return ASSIGNED.findall(process.log)


def _txn_id(msg) -> str:
    return dict(msg.headers() or [])[H.TXN_ID].decode()


def test_a_set_moved_while_its_transaction_is_open_promotes_each_commit_once(
    broker, make_topic, unique, tmp_path
):
    prefix = unique("ps").replace("-", "")
    topic = make_topic("sets", partitions=PARTITIONS)
    conf = broker.conf()
    sets = {"promotion_sets": 2, "topic_prefix": prefix}
    a = CoordinatorProcess(
        broker.bootstrap, tmp_path / "a.log", *SHORT_SESSION, instance_id="set-a", **sets
    )
    b = None
    sent: dict[str, bytes] = {}  # transaction id -> value, of every send that returned
    stop = threading.Event()
    listener = ScriptedListener(_decide, _decide)
    reader = TopicReader(conf, topic, PARTITIONS)
    try:
        a.wait_ready()
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer:

            def send() -> None:
                i = 0
                while not stop.is_set():
                    value = f"{'r' if i % 4 == 3 else 'c'}{i}".encode()
                    result = producer.send_message_in_transaction(
                        Message(topic, value, key=f"k{i % 50}".encode())
                    )
                    sent[result.transaction_id] = value
                    i += 1

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            reader.read_until(lambda r: len(r) >= 50, 120, "A's first promotions")
            b = CoordinatorProcess(
                broker.bootstrap, tmp_path / "b.log", *SHORT_SESSION, instance_id="set-b", **sets
            )
            wait_for(lambda: _assigned(b), 120, "B to share the partitions with A")
            seen = len(reader.records)
            reader.read_until(lambda r: len(r) >= seen + 50, 120, "promotions by A and B")
            # Paused with a transaction open: a zombie holding a set's Kafka transaction.
            for _ in range(PAUSE_ATTEMPTS):
                _signal(a, signal.SIGSTOP)
                if _open_transaction(conf, topic):
                    break
                _signal(a, signal.SIGCONT)
                seen = len(reader.records)
                reader.read_until(lambda r, seen=seen: len(r) > seen, 60, "more promotions")
            else:
                pytest.fail(f"no Kafka transaction open in {PAUSE_ATTEMPTS} pauses of A")
            wait_for(
                lambda: _assigned(b)[-1] == ALL,
                60,
                "B to take every partition from the paused A",
            )
            # The zombie wakes up (within its transactions' timeout, unless the machine is
            # slow) with them in flight, and the group moves partitions back to it.
            _signal(a, signal.SIGCONT)
            wait_for(
                lambda: f"revoked half/op partitions {ALL}" in b.log,
                120,
                "A to rejoin and B to give partitions back",
            )
            seen = len(reader.records)
            reader.read_until(lambda r: len(r) >= seen + 100, 120, "promotions after A rejoined")
            stop.set()
            sender.join(120)
            assert not sender.is_alive(), "the producer did not finish sending"
        committed = {t for t, v in sent.items() if v.startswith(b"c")}
        reader.read_until(
            lambda r: committed <= {_txn_id(m) for m in r}, 180, "every committed transaction"
        )
        assert a.poll() is None and b.poll() is None, "a coordinator exited"
    finally:
        stop.set()
        reader.close()
        if b is not None:
            b.stop()
        _signal(a, signal.SIGCONT)
        a.stop()
    promoted = Counter(_txn_id(m) for m in read_to_end(conf, topic, PARTITIONS))
    rolled_back = {t for t, v in sent.items() if not v.startswith(b"c")}
    assert not set(promoted) & rolled_back, "a rolled-back transaction was promoted"
    assert set(promoted) == committed, set(promoted) ^ committed
    assert set(promoted.values()) == {1}, [t for t, n in promoted.items() if n > 1][:10]
