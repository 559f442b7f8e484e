"""Multi-message transactions on a real broker, the coordinator's side (issue 18): all of a
transaction's members promoted or none, across topics, a coordinator crash, a producer that
died mid-send, and more members than the coordinator reads per step.

The first two send with ``send_transaction``; the others write members with
:class:`MemberWriter` as the wire contract has them (a producer killed mid-send, huge sizes)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter

import pytest

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.records.codec import decode
from rmq_semantics.records.txn import DoneMarkers, EndState, Outcome
from rmq_semantics.tools.admin import list_discarded, redrive
from tests.integration.txn_helpers import (
    FAST,
    REPO,
    CoordinatorProcess,
    MemberWriter,
    ScriptedListener,
    ThreadCoordinator,
    TopicReader,
    by_txn,
    no_pending,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration

PARTITIONS = FAST["half_partitions"]


def _sample(coordinator: ThreadCoordinator, name: str, **labels: str) -> float:
    return coordinator.server.metrics.registry.get_sample_value(name, labels) or 0.0


def _members(topics: list[str], plan: str, n: int, size: int) -> list[Message]:
    return [
        Message(
            topics[i % len(topics)],
            f"{plan}-{n}-{i}".encode(),
            key=f"k{i}",
            headers={"app": str(i)},
            tags="TagA",
        )
        for i in range(size)
    ]


def _executed(value: bytes) -> S:
    # The plan is in the first member's value; check_* plans leave it to the back-check.
    return {b"commit-": S.COMMIT_MESSAGE, b"rollback-": S.ROLLBACK_MESSAGE}.get(
        value.split(b"-", 1)[0] + b"-", S.UNKNOW
    )


def _checked(value: bytes) -> S:
    return S.COMMIT_MESSAGE if value.startswith(b"check_commit") else S.ROLLBACK_MESSAGE


def test_transactions_of_1_to_50_messages_over_3_topics_are_seen_all_or_nothing(
    broker, make_topic, unique
):
    prefix = unique("mt").replace("-", "")
    topics = [make_topic(f"multi{i}", partitions=2) for i in range(3)]
    conf = broker.conf()
    group = unique("pg")
    rng = random.Random(18)
    sizes = [1, 50, 2, *(rng.randrange(1, 51) for _ in range(17))]
    plans = ["commit", "rollback", "check_commit", "check_rollback"]
    listener = ScriptedListener(_executed, _checked)
    sent: dict[str, tuple[str, set[bytes]]] = {}
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=group,
            listener=listener,
            topic_prefix=prefix,
            half_partitions=PARTITIONS,
        ) as producer,
    ):
        for n, size in enumerate(sizes):
            plan = plans[n % len(plans)]
            msgs = _members(topics, plan, n, size)
            result = producer.send_transaction(msgs)
            sent[result.transaction_id] = (plan, {m.value for m in msgs})
        wait_for(lambda: no_pending(coordinator, PARTITIONS), 90, "every transaction to be decided")
    promoted = by_txn([m for t in topics for m in read_to_end(conf, t, 2)])
    for txn_id, (plan, values) in sent.items():
        seen = Counter(m.value() for m in promoted.get(txn_id, []))
        if plan in ("commit", "check_commit"):
            assert seen == Counter(values), f"{plan} txn {txn_id}: {len(seen)}/{len(values)}"
        else:
            assert not seen, f"{plan} txn {txn_id}: {len(seen)} of its members promoted"
    assert set(promoted) <= set(sent)
    sample = next(m for ms in promoted.values() for m in ms)
    assert not [k for k, _ in sample.headers() if k in ("rmq.txn_size", "rmq.txn_index")]
    # One check per unanswered transaction, with member 0 (never one per member).
    checked = Counter(v.rsplit(b"-", 1)[0] for v in listener.checked)
    assert {v.rsplit(b"-", 1)[1] for v in listener.checked} == {b"0"}
    assert set(checked.values()) == {1} and len(checked) == len(sizes) // 2


def test_coordinator_sigkill_mid_500_multi_message_transactions_promotes_each_once_whole(
    broker, make_topic, unique
):
    prefix = unique("mk").replace("-", "")
    topic = make_topic("multicrash", partitions=3)
    conf = broker.conf()
    group = unique("pg")
    sizes = [2 + i % 4 for i in range(500)]
    instance = f"coord-{uuid.uuid4().hex[:8]}"
    coordinator = CoordinatorProcess(broker.bootstrap, topic_prefix=prefix, instance_id=instance)
    coordinator.wait_ready()
    committing = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    producer = TransactionProducer(
        conf,
        producer_group=group,
        listener=committing,
        topic_prefix=prefix,
        half_partitions=PARTITIONS,
    ).start()
    sent: dict[str, int] = {}

    def send_all() -> None:
        for n, size in enumerate(sizes):
            result = producer.send_transaction(_members([topic], "c", n, size))
            sent[result.transaction_id] = size

    reader = TopicReader(conf, topic, 3)
    sender = threading.Thread(target=send_all)
    try:
        sender.start()
        reader.read_until(lambda r: len(r) >= 300, 120, "the first promotions")
        coordinator.kill()
        coordinator = CoordinatorProcess(
            broker.bootstrap, coordinator.log_path, topic_prefix=prefix, instance_id=instance
        )
        coordinator.wait_ready()
        sender.join(300)
        assert not sender.is_alive(), "the writer did not finish"
        reader.read_until(lambda r: len(r) >= sum(sizes), 180, "every promotion")
    finally:
        exit_code = coordinator.stop()
        reader.close()
        producer.shutdown()
    assert exit_code == 0
    promoted = by_txn(read_to_end(conf, topic, 3))
    assert len(promoted) == 500 and set(promoted) == set(sent)
    wrong = {
        t: (len(ms), sent[t])
        for t, ms in promoted.items()
        if sorted(m.value() for m in ms) != sorted({m.value() for m in ms}) or len(ms) != sent[t]
    }
    assert not wrong, f"{len(wrong)} transactions not promoted exactly once, whole: {wrong}"


def test_a_producer_killed_mid_send_is_never_promoted_in_part_and_listed_incomplete(
    broker, make_topic, unique
):
    prefix = unique("mi").replace("-", "")
    topic = make_topic("multikill")
    conf = broker.conf()
    group = unique("pg")
    # The group's surviving producer answers every check COMMIT (its database committed).
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=group,
            listener=listener,
            topic_prefix=prefix,
            half_partitions=PARTITIONS,
        ),
    ):
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.multi_txn_worker",
                broker.bootstrap,
                prefix,
                group,
                topic,
                str(PARTITIONS),
                "5",
                "3",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        try:
            line = worker.stdout.readline()
            assert line.startswith("MEMBERS_WRITTEN"), line
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait(30)
        txn_id = line.split()[1]
        [found] = wait_for(
            lambda: [t for t in list_discarded(conf, prefix) if t.txn_id == txn_id],
            60,
            "the transaction to be discarded",
        )
        assert listener.checked == [b"member-0"]  # one check, member 0, answered COMMIT
        assert _sample(coordinator, "rmq_discarded_total", reason="incomplete") == 1
        assert _sample(coordinator, "rmq_promotions_total") == 0
    assert (found.reason, found.count, len(found.members)) == ("incomplete", "3/5", 3)
    assert read_to_end(conf, topic, 1) == []
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "txn",
            "discarded",
            "--bootstrap-servers",
            broker.bootstrap,
            "--topic-prefix",
            prefix,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert cli.returncode == 0, cli.stderr
    [row] = [r for r in cli.stdout.splitlines() if txn_id in r]
    assert "incomplete" in row and "3/5" in row
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "txn",
            "redrive",
            txn_id,
            "--bootstrap-servers",
            broker.bootstrap,
            "--topic-prefix",
            prefix,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert again.returncode != 0 and "3/5" in again.stderr


def test_more_members_than_the_coordinator_reads_per_step_promote_in_one_kafka_transaction(
    broker, make_topic, unique
):
    prefix = unique("mb").replace("-", "")
    topic = make_topic("multibatch", partitions=2)
    conf = broker.conf()
    group = unique("pg")
    with ThreadCoordinator(conf, topic_prefix=prefix, max_batch=50) as coordinator:
        writer = MemberWriter(conf, prefix, group, PARTITIONS)
        txn_id, partition, offsets = writer.send(_members([topic], "b", 0, 120), EndState.COMMIT)
        writer.close()
        wait_for(lambda: no_pending(coordinator, PARTITIONS), 60, "the transaction")
        assert _sample(coordinator, "rmq_promotions_total") == 120
    # All 120 done in one Op record: written, with the promotions, in one Kafka transaction.
    markers = [
        decode(m.value())
        for m in read_to_end(conf, f"{prefix}_op", PARTITIONS)
        if m.partition() == partition
    ]
    done = [
        {e.half_offset for e in r.entries if e.outcome is Outcome.COMMITTED}
        for r in markers
        if isinstance(r, DoneMarkers)
    ]
    assert [d for d in done if d & set(offsets)] == [set(offsets)]
    promoted = by_txn(read_to_end(conf, topic, 2))[txn_id]
    assert sorted(m.value() for m in promoted) == sorted(f"b-0-{i}".encode() for i in range(120))


def test_a_discarded_multi_message_transaction_is_redriven_whole(broker, make_topic, unique):
    prefix = unique("mr").replace("-", "")
    topic = make_topic("multiredrive")
    conf = broker.conf()
    group = unique("pg")
    answer = {"check": S.UNKNOW}
    listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: answer["check"])
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=group,
            listener=listener,
            topic_prefix=prefix,
            half_partitions=PARTITIONS,
        ),
    ):
        writer = MemberWriter(conf, prefix, group, PARTITIONS)
        txn_id, _, _ = writer.send(_members([topic], "r", 0, 3), None)
        [found] = wait_for(
            lambda: [t for t in list_discarded(conf, prefix) if t.txn_id == txn_id],
            60,
            "the check_max discard",
        )
        assert (found.reason, found.count) == ("check_max", "3/3")
        answer["check"] = S.COMMIT_MESSAGE
        redrive(conf, txn_id, prefix)
        reader = TopicReader(conf, topic, 1)
        try:
            records = reader.read_until(lambda r: len(r) >= 3, 60, "the re-driven members")
        finally:
            reader.close()
        writer.close()
        assert _sample(coordinator, "rmq_discarded_total", reason="check_max") == 1
    assert sorted(m.value() for m in records) == [b"r-0-0", b"r-0-1", b"r-0-2"]
