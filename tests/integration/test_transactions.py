"""Transactional messages end to end on a real broker (issue: half topic, Op markers,
exactly-once promotion, back-check, discard)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter

import pytest
from confluent_kafka import Producer as RawProducer

from rmq_semantics import AsyncTransactionProducer, Message, TransactionProducer
from rmq_semantics import LocalTransactionState as S
from rmq_semantics.records.codec import encode
from rmq_semantics.records.txn import EndRequest, EndRequests
from rmq_semantics.selector import java_partition
from rmq_semantics.tools.admin import list_discarded
from tests.integration.txn_helpers import (
    FAST,
    REPO,
    CoordinatorProcess,
    ScriptedListener,
    ThreadCoordinator,
    TopicReader,
    no_pending,
    read_to_end,
    send_through_coordinator_crash,
    wait_for,
)

pytestmark = pytest.mark.integration


def _case(value: bytes) -> int:
    return int(value.split(b"-")[1]) % 5


def test_rocketmq_matrix_promotes_only_committed_exactly_once(broker, make_topic, unique):
    """RocketMQ's TransactionalMsgIT: 120 messages cycling COMMIT, ROLLBACK, UNKNOWN then
    check COMMIT, UNKNOWN then check ROLLBACK, always UNKNOWN."""
    prefix = unique("m").replace("-", "")
    topic = make_topic("matrix", partitions=3)
    inline = {0: S.COMMIT_MESSAGE, 1: S.ROLLBACK_MESSAGE, 2: S.UNKNOW, 3: None, 4: S.UNKNOW}
    checked = {
        0: S.ROLLBACK_MESSAGE,
        1: S.COMMIT_MESSAGE,
        2: S.COMMIT_MESSAGE,
        3: S.ROLLBACK_MESSAGE,
        4: S.UNKNOW,
    }
    listener = ScriptedListener(lambda v: inline[_case(v)], lambda v: checked[_case(v)])
    conf = broker.conf()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        results = [
            producer.send_message_in_transaction(
                Message(
                    topic,
                    f"msg-{i}".encode(),
                    key=f"k{i}",
                    headers={"app": f"h{i}"},
                    tags="TagA",
                    keys=f"order-{i}",
                )
            )
            for i in range(120)
        ]
        wait_for(
            lambda: no_pending(coordinator, FAST["half_partitions"]),
            90,
            "every transaction to be resolved or discarded",
        )

    assert [r.local_transaction_state for r in results[:5]] == [
        S.COMMIT_MESSAGE,
        S.ROLLBACK_MESSAGE,
        S.UNKNOW,
        S.UNKNOW,
        S.UNKNOW,
    ]
    records = read_to_end(conf, topic, 3)
    values = Counter(m.value() for m in records)
    expected = {f"msg-{i}".encode() for i in range(120) if i % 5 in (0, 2)}
    assert set(values) == expected
    assert max(values.values()) == 1
    by_value = {m.value(): m for m in records}
    sample = by_value[b"msg-10"]
    headers = dict(sample.headers())
    assert sample.key() == b"k10"
    assert headers["app"] == b"h10"
    assert headers["rmq.tags"] == b"TagA" and headers["rmq.keys"] == b"order-10"
    assert headers["rmq.txn_id"] == results[10].transaction_id.encode()
    assert headers["rmq.promoted_from"] == (
        f"{results[10].half_partition}:{results[10].half_offset}".encode()
    )
    assert not any(
        h.startswith(("rmq.real_", "rmq.producer_group", "rmq.born_ts"))
        for h, _ in sample.headers()
    )
    checks = Counter(listener.checked)
    # Decided inline: never checked. Always UNKNOWN: checked exactly check_max times.
    assert not [v for v in checks if _case(v) in (0, 1)]
    assert {checks[f"msg-{i}".encode()] for i in range(120) if i % 5 == 4} == {FAST["check_max"]}


def _diagnose(coordinator) -> str:
    from prometheus_client import generate_latest

    service = coordinator.server.transactions
    states = {
        p: (
            s.recovering,
            sorted(s.pending),
            s.deferred,
            s.half_position,
            s.op_position,
            service.committed_offsets(p),
            (s.half_commit, s.op_commit),
        )
        for p, s in dict(service.states).items()
    }
    metrics = [
        line
        for line in generate_latest(coordinator.server.metrics.registry).decode().splitlines()
        if line.startswith("rmq_") and not line.endswith(" 0.0")
    ]
    return f"states={states} metrics={metrics}"


def _sample(coordinator, name: str, **labels: str) -> float:
    value = coordinator.server.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_checks_that_never_resolve_are_discarded_listed_and_redriven(broker, make_topic, unique):
    prefix = unique("d").replace("-", "")
    topic = make_topic("discard")
    answer = {"check": S.UNKNOW}
    listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: answer["check"])
    conf = broker.conf()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        result = producer.send_message_in_transaction(Message(topic, b"never-decided"))
        discarded = wait_for(
            lambda: [t for t in list_discarded(conf, prefix) if t.txn_id == result.transaction_id],
            60,
            "the transaction to be discarded",
        )
        assert discarded[0].check_count == FAST["check_max"]
        assert listener.checked == [b"never-decided"] * FAST["check_max"]
        assert _sample(coordinator, "rmq_discarded_total", reason="check_max") == 1

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
        )
        assert cli.returncode == 0, cli.stderr
        assert result.transaction_id in cli.stdout and topic in cli.stdout

        answer["check"] = S.COMMIT_MESSAGE
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "rmq_semantics",
                "txn",
                "redrive",
                result.transaction_id,
                "--bootstrap-servers",
                broker.bootstrap,
                "--topic-prefix",
                prefix,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        wait_for(
            lambda: len(listener.checked) == FAST["check_max"] + 1,
            30,
            "the re-driven transaction to be checked",
        )
        wait_for(lambda: no_pending(coordinator, FAST["half_partitions"]), 30, "promotion")
    records = read_to_end(conf, topic, 1)
    assert [(m.value(), dict(m.headers())["rmq.txn_id"]) for m in records] == [
        (b"never-decided", result.transaction_id.encode())
    ]


def test_producer_killed_before_end_request_is_resolved_by_another_producer(
    broker, make_topic, unique, tmp_path
):
    prefix = unique("k").replace("-", "")
    topic = make_topic("killed")
    group = unique("pg")
    db = tmp_path / "db"
    db.mkdir()

    def check(msg_value: bytes) -> S:
        return S.UNKNOW  # replaced below by a lookup of the transaction id

    class DbListener(ScriptedListener):
        def check_local_transaction(self, msg):
            self.checked.append(msg.value)
            committed = (db / msg.transaction_id).exists()
            return S.COMMIT_MESSAGE if committed else S.ROLLBACK_MESSAGE

    conf = broker.conf()
    with ThreadCoordinator(conf, topic_prefix=prefix) as coordinator:
        for value, local in ((b"committed-locally", "commit"), (b"not-committed", "rollback")):
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.txn_producer_worker",
                    broker.bootstrap,
                    prefix,
                    group,
                    topic,
                    str(db),
                    local,
                    value.decode(),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            line = worker.stdout.readline()
            assert line.startswith("HALF_WRITTEN"), line
            worker.send_signal(signal.SIGKILL)
            worker.wait(30)
        listener = DbListener(lambda v: S.UNKNOW, check)
        with TransactionProducer(
            conf,
            producer_group=group,
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ):
            wait_for(
                lambda: no_pending(coordinator, FAST["half_partitions"]),
                90,
                "the surviving producer to answer both checks",
            )
        assert sorted(set(listener.checked)) == [b"committed-locally", b"not-committed"]
    assert [m.value() for m in read_to_end(conf, topic, 1)] == [b"committed-locally"]


def _forge_end(conf: dict, prefix: str, result, **overrides) -> None:
    body = {
        "txn_id": result.transaction_id,
        "producer_group": result.producer_group,
        "half_partition": result.half_partition,
        "half_offset": result.half_offset,
        "state": "COMMIT",
        "from_check": False,
        "check_seq": 0,
        "ts": 0,
        **overrides,
    }
    producer = RawProducer(conf)
    producer.produce(
        f"{prefix}_op", encode(EndRequest.from_body(body)), partition=body["half_partition"]
    )
    assert producer.flush(10) == 0


def test_forged_duplicate_and_conflicting_end_requests(broker, make_topic, unique):
    prefix = unique("f").replace("-", "")
    topic = make_topic("forged")
    listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.UNKNOW)
    conf = broker.conf()
    # No back-check during this test: every decision comes from an explicit request.
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, transaction_timeout_ms=600000) as c,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer,
    ):
        first = producer.send_message_in_transaction(Message(topic, b"first"))
        _forge_end(conf, prefix, first, producer_group="intruders")
        _forge_end(conf, prefix, first, txn_id="not-the-txn-id")
        producer.end_transaction(first, S.COMMIT_MESSAGE)
        producer.end_transaction(first, S.COMMIT_MESSAGE)
        second = producer.send_message_in_transaction(Message(topic, b"second"))
        producer.end_transaction(second, S.ROLLBACK_MESSAGE)
        producer.end_transaction(second, S.COMMIT_MESSAGE)
        wait_for(
            lambda: (
                no_pending(c, 4)
                and _sample(c, "rmq_conflicting_decisions_total", kind="conflicting_decisions") == 1
            ),
            60,
            "all requests to be processed",
            details=lambda: _diagnose(c),
        )
        assert _sample(c, "rmq_rejected_requests_total", reason="mismatch") == 2
        assert _sample(c, "rmq_conflicting_decisions_total", kind="duplicate_decisions") == 1
        assert _sample(c, "rmq_promotions_total") == 1
    assert [m.value() for m in read_to_end(conf, topic, 1)] == [b"first"]


def test_batched_sends_decide_each_message_and_forged_batch_entries_are_rejected(
    broker, make_topic, unique
):
    """send_messages_in_transaction: one end-requests record per half partition, and each
    of its entries is validated against its own half record."""
    prefix = unique("b").replace("-", "")
    topic = make_topic("batched", partitions=2)
    inline = {0: S.COMMIT_MESSAGE, 1: S.ROLLBACK_MESSAGE, 2: S.UNKNOW}
    listener = ScriptedListener(lambda v: inline[int(v) % 3], lambda v: S.ROLLBACK_MESSAGE)
    conf = broker.conf()
    # Checks start late enough for the forged records to meet pending transactions.
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, transaction_timeout_ms=5000) as c,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        results = producer.send_messages_in_transaction(
            [Message(topic, str(i).encode(), key=str(i)) for i in range(90)]
        )
        unknown = [r for r in results if r.local_transaction_state is S.UNKNOW]
        raw = RawProducer(conf)
        for partition in {r.half_partition for r in unknown}:
            raw.produce(
                f"{prefix}_op",
                encode(
                    EndRequests.from_body(
                        {
                            "producer_group": "intruders",
                            "half_partition": partition,
                            "ts": 0,
                            "entries": [
                                {
                                    "txn_id": r.transaction_id,
                                    "half_offset": r.half_offset,
                                    "state": "COMMIT",
                                }
                                for r in unknown
                                if r.half_partition == partition
                            ],
                        }
                    )
                ),
                partition=partition,
            )
        assert raw.flush(10) == 0
        wait_for(
            lambda: (
                no_pending(c, FAST["half_partitions"])
                and _sample(c, "rmq_rejected_requests_total", reason="mismatch") == len(unknown)
            ),
            90,
            "every transaction to be resolved",
            details=lambda: _diagnose(c),
        )
        assert _sample(c, "rmq_promotions_total") == 30
    assert len(unknown) == 30
    assert sorted(int(m.value()) for m in read_to_end(conf, topic, 2)) == list(range(0, 90, 3))
    # Decided inline, so never checked; the UNKNOWN ones were, and rolled back.
    assert sorted({int(v) for v in listener.checked}) == [i for i in range(90) if i % 3 == 2]


def test_malformed_input_is_counted_and_processing_goes_on(broker, make_topic, unique):
    prefix = unique("x").replace("-", "")
    topic = make_topic("malformed")
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.UNKNOW)
    conf = broker.conf()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as c,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer,
    ):
        raw = RawProducer(conf)
        raw.produce(f"{prefix}_half", b"no rmq headers", partition=0)
        for p in range(4):
            raw.produce(f"{prefix}_op", b"\x00garbage\xff", partition=p)
        assert raw.flush(10) == 0
        before = producer.send_message_in_transaction(Message(topic, b"before"))
        # An id the partition never had: a request naming a known id at an offset not read
        # yet decides that transaction's first record (a copy of it can only land there).
        _forge_end(conf, prefix, before, half_offset=10**9, txn_id="no-such-transaction")
        producer.send_message_in_transaction(Message(topic, b"after"))
        wait_for(
            lambda: (
                _sample(c, "rmq_rejected_requests_total", reason="no_such_offset") == 1
                and _sample(c, "rmq_promotions_total") == 2
            ),
            60,
            "the bad records to pass",
        )
        assert _sample(c, "rmq_malformed_records_total", topic=f"{prefix}_half") == 1
        assert _sample(c, "rmq_malformed_records_total", topic=f"{prefix}_op") == 4
        assert c.thread.is_alive()
    assert sorted(m.value() for m in read_to_end(conf, topic, 1)) == [b"after", b"before"]


def _send_all(producer, topic: str, count: int, sent: list) -> None:
    for i in range(count):
        producer.send_message_in_transaction(Message(topic, f"m{i}".encode(), key=f"k{i % 50}"))
        sent.append(i)


def test_coordinator_sigkill_mid_5000_commits_then_restart_promotes_each_once(
    broker, make_topic, unique
):
    prefix = unique("c").replace("-", "")
    topic = make_topic("crash", partitions=3)
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    conf = broker.conf()
    total = 5000
    with TransactionProducer(
        conf, producer_group=unique("pg"), listener=listener, topic_prefix=prefix, half_partitions=4
    ) as producer:
        messages = [Message(topic, f"m{i}".encode(), key=f"k{i % 50}") for i in range(total)]
        exit_code = send_through_coordinator_crash(
            broker, prefix, topic, 3, producer, messages, kill_after=1000, expect=total
        )
    assert exit_code == 0
    counts = Counter(m.value() for m in read_to_end(conf, topic, 3))
    assert len(counts) == total and set(counts.values()) == {1}


def test_two_coordinators_split_partitions_and_promote_each_once(broker, make_topic, unique):
    prefix = unique("s").replace("-", "")
    topic = make_topic("split", partitions=2)
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    conf = broker.conf()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as one,
        ThreadCoordinator(conf, topic_prefix=prefix) as two,
    ):
        wait_for(
            lambda: (
                len(one.server.transactions.states) == 2
                and len(two.server.transactions.states) == 2
            ),
            60,
            "a split of 4 partitions",
        )
        assert not set(one.server.transactions.states) & set(two.server.transactions.states)
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer:
            _send_all(producer, topic, 500, [])
        reader = TopicReader(conf, topic, 2)
        reader.read_until(lambda r: len(r) >= 500, 60, "every promotion")
        reader.close()
        assert _sample(one, "rmq_promotions_total") > 0 and _sample(two, "rmq_promotions_total") > 0
    counts = Counter(m.value() for m in read_to_end(conf, topic, 2))
    assert len(counts) == 500 and set(counts.values()) == {1}


def test_a_second_coordinator_with_the_same_instance_id_fences_the_first_which_exits_1(
    broker, make_topic, unique, tmp_path
):
    # Two live processes with one instance id share transactional ids: the newer one's
    # init_transactions fences the older, which must stop with one line, not flap.
    prefix = unique("f").replace("-", "")
    topic = make_topic("fence", partitions=2)
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    conf = broker.conf()
    first = CoordinatorProcess(
        broker.bootstrap, tmp_path / "first.log", topic_prefix=prefix, instance_id="twin"
    )
    second = None
    sent: list[int] = []
    try:
        first.wait_ready()
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer:
            _send_all(producer, topic, 100, sent)
            second = CoordinatorProcess(
                broker.bootstrap, tmp_path / "second.log", topic_prefix=prefix, instance_id="twin"
            )
            second.wait_ready()
            # The first learns it was fenced at its next Kafka transaction.
            while first.poll() is None and len(sent) < 5000:
                producer.send_message_in_transaction(
                    Message(topic, f"m{len(sent)}".encode(), key=f"k{len(sent) % 50}")
                )
                sent.append(len(sent))
        assert first.wait(60) == 1
        stopped = [line for line in first.log.splitlines() if "coordinator stopped:" in line]
        assert len(stopped) == 1 and "fenced" in stopped[0] and "-twin" in stopped[0], first.log[
            -2000:
        ]
        reader = TopicReader(conf, topic, 2)
        reader.read_until(lambda r: len(r) >= len(sent), 90, "every promotion by the second")
        reader.close()
        assert second.poll() is None  # the newer one goes on
    finally:
        if second is not None:
            second.stop()
        first.stop()
    counts = Counter(m.value() for m in read_to_end(conf, topic, 2))
    assert len(counts) == len(sent) and set(counts.values()) == {1}


def test_committed_messages_of_one_message_group_land_in_its_partition(broker, make_topic, unique):
    """FIFO placement through the transactional producers: committed messages of one message
    group sit in the group's partition (murmur2 of the group, as Producer.send places them)
    in send order whatever their record keys, by each send path (one, batch, multi-message,
    asyncio); an explicit partition still wins (read back with a plain read_committed
    consumer)."""
    prefix = unique("fifo").replace("-", "")
    partitions = 4
    topic = make_topic("txgroup", partitions=partitions)
    group = "order-7"
    conf = broker.conf()
    listener = ScriptedListener(lambda _v: S.COMMIT_MESSAGE, lambda _v: S.COMMIT_MESSAGE)

    def grouped(name: str, i: int) -> Message:
        return Message(topic, f"{name}-{i}".encode(), key=f"line-{i}", message_group=group)

    async def send_async() -> None:
        async with AsyncTransactionProducer(
            conf,
            producer_group=unique("apg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as aio:
            for i in range(3):
                await aio.send_message_in_transaction(grouped("async", i))

    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        for i in range(8):  # eight different keys, one group
            producer.send_message_in_transaction(grouped("one", i))
        producer.send_messages_in_transaction([grouped("batch", i) for i in range(3)])
        producer.send_transaction([grouped("multi", i) for i in range(3)])
        pinned = 1 if java_partition(group.encode(), partitions) != 1 else 2
        producer.send_message_in_transaction(
            Message(topic, b"pinned", key="x", message_group=group, partition=pinned)
        )
        asyncio.run(send_async())
        wait_for(
            lambda: no_pending(coordinator, FAST["half_partitions"]),
            90,
            "every transaction to be promoted",
        )
    records = read_to_end(conf, topic, partitions)
    where = {r.value(): r.partition() for r in records}
    group_partition = java_partition(group.encode(), partitions)
    assert where[b"pinned"] == pinned
    in_group = [r.value() for r in records if r.value() != b"pinned"]
    assert len(in_group) == 17, sorted(where)
    assert {v: where[v] for v in in_group} == dict.fromkeys(in_group, group_partition)
    sent = {
        f"{name}-{i}"
        for name, n in (("one", 8), ("batch", 3), ("multi", 3), ("async", 3))
        for i in range(n)
    }
    assert {v.decode() for v in in_group} == sent
    # The group's partition holds them in promotion order: a multi-message transaction's
    # members in index order; separate transactions as the coordinator decides them.
    assert [v for v in in_group if v.startswith(b"multi-")] == [b"multi-0", b"multi-1", b"multi-2"]
