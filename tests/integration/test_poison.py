"""Poison records on a real broker (issue 12): half records no promotion can ever succeed
for sit in front of good transactions; the coordinator sets them aside in the discard topic
with a reason and promotes everything behind them exactly once."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from confluent_kafka import Producer as RawProducer

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.errors import ConfigError
from rmq_semantics.records.codec import encode
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import EndRequest, EndState
from rmq_semantics.tools.admin import list_discarded, redrive
from rmq_semantics.topics import ensure_topics
from tests.integration.txn_helpers import (
    FAST,
    MemberWriter,
    ScriptedListener,
    ThreadCoordinator,
    no_pending,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration

GOOD = 200


def forged_half(txn_id: str, topic: str, group: str, **overrides: bytes | None) -> list:
    """The headers a TransactionProducer writes on a half record, with ``overrides``."""
    headers = {
        H.TXN_ID: txn_id.encode(),
        H.REAL_TOPIC: topic.encode(),
        H.PRODUCER_GROUP: group.encode(),
        H.BORN_TS: str(int(time.time() * 1000)).encode(),
    }
    headers.update(overrides)
    return list(headers.items())


def random_bytes(seed: int) -> bytes:
    """Bytes that are never a decimal number (so never a valid ``rmq.born_ts``)."""
    return b"\xff" + random.Random(seed).randbytes(15)


def test_poison_records_on_every_half_partition_do_not_stop_200_transactions_behind_them(
    broker, make_topic, unique
):
    prefix = unique("p").replace("-", "")
    topic = make_topic("poison", partitions=2)
    group = unique("pg")
    partitions = FAST["half_partitions"]
    # Every transaction is committed: the good ones inline, the forged ones when checked.
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    conf = broker.conf()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=group,
            listener=listener,
            topic_prefix=prefix,
            half_partitions=partitions,
        ) as producer,
    ):
        raw = RawProducer(conf)
        for p in range(partitions):
            raw.produce(
                f"{prefix}_half",
                f"null-{p}".encode(),
                partition=p,
                headers=[("app", None), *forged_half(f"null-{p}", topic, group)],
            )
            raw.produce(
                f"{prefix}_half",
                f"part-{p}".encode(),
                partition=p,
                headers=forged_half(f"part-{p}", topic, group, **{H.REAL_PARTITION: b"7"}),
            )
            raw.produce(
                f"{prefix}_half",
                f"sys-{p}".encode(),
                partition=p,
                headers=forged_half(f"sys-{p}", f"{prefix}_op", group),
            )
            raw.produce(
                f"{prefix}_half",
                f"rand-{p}".encode(),
                partition=p,
                headers=[
                    ("junk", random_bytes(p)),
                    *forged_half(f"rand-{p}", topic, group, **{H.BORN_TS: random_bytes(p)}),
                ],
            )
        assert raw.flush(10) == 0
        results = producer.send_messages_in_transaction(
            [Message(topic, f"good-{i}".encode(), key=f"k{i}") for i in range(GOOD)]
        )
        assert {r.local_transaction_state for r in results} == {S.COMMIT_MESSAGE}

        def settled() -> bool:
            assert coordinator.thread.is_alive(), "the coordinator stopped"
            return no_pending(coordinator, partitions)

        wait_for(settled, 120, "every transaction to be promoted or discarded")
        health = coordinator.server.health()
        assert health["status"] == "ok", health
        discarded = {t.txn_id: t.reason for t in list_discarded(conf, prefix)}

    values = Counter(m.value() for m in read_to_end(conf, topic, 2))
    expected = {f"good-{i}".encode() for i in range(GOOD)} | {
        f"null-{p}".encode() for p in range(partitions)
    }
    assert set(values) == expected
    assert max(values.values()) == 1
    null_headers = [
        dict(m.headers()) for m in read_to_end(conf, topic, 2) if m.value().startswith(b"null-")
    ]
    assert all(h["app"] is None for h in null_headers)
    assert not [
        m for m in read_to_end(conf, f"{prefix}_op", partitions) if m.value().startswith(b"sys-")
    ]
    assert discarded == {
        **{f"part-{p}": "unknown_partition" for p in range(partitions)},
        **{f"sys-{p}": "system_topic" for p in range(partitions)},
        **{f"rand-{p}": "malformed" for p in range(partitions)},
    }


def _sample(coordinator, name: str, **labels: str) -> float:
    return coordinator.server.metrics.registry.get_sample_value(name, labels) or 0.0


def test_records_kafka_refuses_are_discarded_after_an_abort_and_the_batch_goes_on(
    broker, make_topic, unique
):
    """The broker refuses a promotion only when it is written: the delivery report names
    the record, the transaction is aborted, and the replay sets that record aside."""
    prefix = unique("r").replace("-", "")
    small, compacted = unique("small"), unique("compacted")
    ensure_topics(
        broker.conf(),
        {small: (1, {"max.message.bytes": "2000"}), compacted: (1, {"cleanup.policy": "compact"})},
    )
    topic = make_topic("fine")
    listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
    conf = broker.conf()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, half_partitions=1) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=1,
        ) as producer,
    ):
        # send_message_in_transaction refuses it at send time now: what an older client,
        # or a max.message.bytes lowered after the send, leaves for the coordinator.
        writer = MemberWriter(conf, prefix, unique("old-client"), 1)
        big_txn, _partition, _offsets = writer.send([Message(small, b"x" * 5000)], EndState.COMMIT)
        writer.close()
        # A compacted topic refuses a record without a key: not a reason of its own, so
        # it is replayed replay_max times, then set aside.
        keyless = producer.send_message_in_transaction(Message(compacted, b"no key"))
        producer.send_message_in_transaction(Message(topic, b"behind"))

        def settled() -> bool:
            assert coordinator.thread.is_alive(), "the coordinator stopped"
            return no_pending(coordinator, 1)

        wait_for(settled, 90, "every transaction to be promoted or discarded")
        discarded = {t.txn_id: t.reason for t in list_discarded(conf, prefix)}
        assert _sample(coordinator, "rmq_discarded_total", reason="too_large") == 1
        assert _sample(coordinator, "rmq_discarded_total", reason="replay_limit") == 1
    assert discarded == {big_txn: "too_large", keyless.transaction_id: "replay_limit"}
    assert [m.value() for m in read_to_end(conf, topic, 1)] == [b"behind"]
    assert read_to_end(conf, small, 1) == [] and read_to_end(conf, compacted, 1) == []


def test_a_late_commit_is_listed_and_redrive_refuses_what_it_must(broker, make_topic, unique):
    prefix = unique("l").replace("-", "")
    topic = make_topic("late")
    group = unique("pg")
    answer = {"check": S.UNKNOW}
    listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: answer["check"])
    conf = broker.conf()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, half_partitions=1, check_max=1) as coordinator,
        TransactionProducer(
            conf, producer_group=group, listener=listener, topic_prefix=prefix, half_partitions=1
        ) as producer,
    ):
        raw = RawProducer(conf)
        raw.produce(
            f"{prefix}_half",
            b"malformed",
            partition=0,
            headers=forged_half("bad-1", topic, group, **{H.BORN_TS: b"soon"}),
        )
        assert raw.flush(10) == 0
        result = producer.send_message_in_transaction(Message(topic, b"too-late"))
        wait_for(
            lambda: (
                {t.txn_id for t in list_discarded(conf, prefix)} >= {"bad-1", result.transaction_id}
            ),
            60,
            "the discards",
        )

        late = EndRequest(
            result.transaction_id,
            group,
            result.half_partition,
            result.half_offset,
            EndState.COMMIT,
            False,
            0,
            0,
        )
        raw.produce(f"{prefix}_op", encode(late), partition=result.half_partition)
        assert raw.flush(10) == 0
        listed = wait_for(
            lambda: [
                t
                for t in list_discarded(conf, prefix)
                if t.txn_id == result.transaction_id and t.late_commit
            ],
            60,
            "the late commit to be listed",
        )
        assert listed[0].status == "check_max, late_commit"
        assert _sample(coordinator, "rmq_conflicting_decisions_total", kind="late_commit") == 1

        with pytest.raises(ConfigError, match=r"malformed.*cannot be re-driven"):
            redrive(conf, "bad-1", prefix)
        answer["check"] = S.COMMIT_MESSAGE
        redrive(conf, result.transaction_id, prefix)
        wait_for(lambda: read_to_end(conf, topic, 1), 60, "the re-driven promotion")
        wait_for(lambda: no_pending(coordinator, 1), 60, "the redrive to be settled")
        with pytest.raises(ConfigError, match="already promoted"):
            redrive(conf, result.transaction_id, prefix)
    assert [m.value() for m in read_to_end(conf, topic, 1)] == [b"too-late"]
