"""Authenticated Op markers on a real broker: a done or check marker that a plain producer
writes to ``__rmq_op`` settles nothing (issue 12, point 4)."""

from __future__ import annotations

import io
import threading
import time
from collections import Counter

import fastavro
import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition

from coordinator.marker_auth import MarkerKey, MarkerVerifier
from coordinator.marker_keys import load_verifier
from coordinator.settings import CoordinatorSettings
from coordinator.txn_service import system_topic_specs
from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.errors import ConfigError
from rmq_semantics.records.codec import MAGIC, RecordType, SystemRecord, encode, schema
from rmq_semantics.records.half import parse_half
from rmq_semantics.records.txn import CheckMarker, DoneEntry, DoneMarkers, Outcome
from rmq_semantics.topics import ensure_topics
from tests.integration.txn_helpers import (
    ScriptedListener,
    ThreadCoordinator,
    no_pending,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration

DAY_MS = 24 * 3600 * 1000
# The first back-check comes this long after a half message is born: long enough for the
# coordinator to read the forged markers first (the test waits until it has).
FIRST_CHECK_MS = 6000


def _sample(coordinator: ThreadCoordinator, name: str, **labels: str) -> float:
    return coordinator.server.metrics.registry.get_sample_value(name, labels) or 0.0


def _forge(conf: dict, prefix: str, partition: int, record: SystemRecord | bytes) -> int:
    """Write ``record`` to the Op partition with a plain producer; returns its offset."""
    offsets: list[int] = []
    producer = RawProducer(conf)
    producer.produce(
        f"{prefix}_op",
        record if isinstance(record, bytes) else encode(record),
        partition=partition,
        on_delivery=lambda err, msg: offsets.append(msg.offset()),
    )
    assert producer.flush(10) == 0
    return offsets[0]


def test_forged_done_and_check_markers_settle_nothing(broker, make_topic, unique, caplog):
    """A forged DONE_MARKERS{COMMITTED} would drop a pending transaction without promoting
    it, a forged CHECK_MARKER would put its next check a day away: both are ignored, and
    each transaction is checked and promoted exactly once. So is a marker signed with a key
    that is not the coordinators'."""
    prefix = unique("fm").replace("-", "")
    topic = make_topic("forged-markers")
    listener = ScriptedListener(lambda v: S.UNKNOW, lambda v: S.COMMIT_MESSAGE)
    conf = broker.conf()
    with (
        ThreadCoordinator(
            conf, topic_prefix=prefix, transaction_timeout_ms=FIRST_CHECK_MS
        ) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer,
    ):
        done = producer.send_message_in_transaction(Message(topic, b"forged-done"))
        check = producer.send_message_in_transaction(Message(topic, b"forged-check"))
        other = producer.send_message_in_transaction(Message(topic, b"other-key"))
        now = int(time.time() * 1000)
        op = f"{prefix}_op"
        wrong_key = MarkerKey(b"not the coordinators' key")
        forged = [
            (
                done.half_partition,
                _forge(
                    conf,
                    prefix,
                    done.half_partition,
                    DoneMarkers(
                        (DoneEntry(done.half_offset, done.transaction_id, Outcome.COMMITTED, 0),),
                        now,
                    ),
                ),
            ),
            (
                check.half_partition,
                _forge(
                    conf,
                    prefix,
                    check.half_partition,
                    CheckMarker(
                        check.half_offset, check.transaction_id, 1000, 0, 0, now + DAY_MS, now
                    ),
                ),
            ),
            (
                other.half_partition,
                _forge(
                    conf,
                    prefix,
                    other.half_partition,
                    wrong_key.sign(
                        op,
                        other.half_partition,
                        DoneMarkers(
                            (
                                DoneEntry(
                                    other.half_offset, other.transaction_id, Outcome.COMMITTED, 0
                                ),
                            ),
                            now,
                        ),
                    ),
                ),
            ),
        ]
        states = coordinator.server.transactions.states
        wait_for(
            lambda: all(p in states and states[p].op_position > offset for p, offset in forged),
            60,
            "the coordinator to read the forged markers",
        )
        wait_for(
            lambda: (
                no_pending(coordinator, 4) and _sample(coordinator, "rmq_promotions_total") == 3
            ),
            60,
            "every transaction to be checked and promoted",
        )
        assert _sample(coordinator, "rmq_forged_markers_total", reason="unsigned") == 2
        assert _sample(coordinator, "rmq_forged_markers_total", reason="bad_mac") == 1
    everyone = {b"forged-done": 1, b"forged-check": 1, b"other-key": 1}
    assert Counter(m.value() for m in read_to_end(conf, topic, 1)) == everyone
    assert Counter(listener.checked) == everyone
    ignored = {
        r.getMessage() for r in caplog.records if "not written by a coordinator" in r.getMessage()
    }
    for (partition, offset), result in zip(forged, (done, check, other), strict=True):
        assert any(
            m.startswith(f"{op}[{partition}]@{offset} txn={result.transaction_id} ")
            for m in ignored
        ), ignored


# -- upgrades ----------------------------------------------------------------------------
def _encode_v1(record: DoneMarkers | CheckMarker) -> bytes:
    """A marker as coordinators before the MAC wrote it: schema version 1, no mac field."""
    record_type = (
        RecordType.DONE_MARKERS if isinstance(record, DoneMarkers) else RecordType.CHECK_MARKER
    )
    body = record.to_body()
    del body["mac"]
    out = io.BytesIO()
    out.write(bytes((MAGIC, record_type, 1)))
    fastavro.schemaless_writer(out, schema(record_type, 1), body)
    return out.getvalue()


def _decide_as_an_old_coordinator(
    conf: dict, prefix: str, topic: str, results: dict[bytes, object]
) -> None:
    """What a coordinator of the previous version leaves behind (its promote.py): in one
    Kafka transaction the promoted records and unsigned v1 markers (a check marker of the
    pending transaction after one answered UNKNOWN, one done marker record for the decided
    ones), then the group's offsets: half at the pending transaction, op at its markers."""
    halves = {
        m.offset(): parse_half(0, m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())
        for m in read_to_end(conf, f"{prefix}_half", 1)
    }
    pending = results[b"pending"]
    now = int(time.time() * 1000)
    entries = []
    producer = RawProducer({**conf, "transactional.id": f"{prefix}-old-coordinator"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value, result in results.items():
        half = halves[result.half_offset]
        if value.startswith(b"decided"):
            producer.produce(topic, half.value, key=half.key, headers=half.promoted_headers())
            entries.append(DoneEntry(half.offset, half.txn_id, Outcome.COMMITTED, 0))
        elif value.startswith(b"rolled"):
            entries.append(DoneEntry(half.offset, half.txn_id, Outcome.ROLLED_BACK, 0))
    first_marker: list[int] = []
    producer.produce(
        f"{prefix}_op",
        _encode_v1(CheckMarker(pending.half_offset, pending.transaction_id, 1, 1, 1, now, now)),
        partition=0,
        on_delivery=lambda err, msg: first_marker.append(msg.offset()),
    )
    producer.produce(f"{prefix}_op", _encode_v1(DoneMarkers(tuple(entries), now)), partition=0)
    producer.commit_transaction(30)
    committer = RawConsumer(
        {**conf, "group.id": f"{prefix}_coordinator", "enable.auto.commit": False}
    )
    committer.commit(
        offsets=[
            TopicPartition(f"{prefix}_half", 0, pending.half_offset),
            TopicPartition(f"{prefix}_op", 0, first_marker[0]),
        ],
        asynchronous=False,
    )
    committer.close()


def test_markers_of_older_coordinators_are_trusted_below_the_upgrade_watermark(
    broker, make_topic, unique
):
    """Transactions decided and left pending by the previous version: the new coordinator
    records the watermark, keeps the decided ones decided (any re-check would answer COMMIT
    and promote them again) and still checks and promotes the pending one, once."""
    prefix = unique("up").replace("-", "")
    topic = make_topic("upgrade")
    conf = broker.conf()
    inline = {
        b"pending": S.UNKNOW,
        b"decided-1": S.COMMIT_MESSAGE,
        b"decided-2": S.COMMIT_MESSAGE,
        b"rolled-back": S.ROLLBACK_MESSAGE,
    }
    listener = ScriptedListener(lambda v: inline[v], lambda v: S.COMMIT_MESSAGE)
    with TransactionProducer(
        conf, producer_group=unique("pg"), listener=listener, topic_prefix=prefix, half_partitions=1
    ) as producer:
        results = {v: producer.send_message_in_transaction(Message(topic, v)) for v in inline}
        assert [r.half_offset for r in results.values()] == [0, 1, 2, 3]
        _decide_as_an_old_coordinator(conf, prefix, topic, results)
        _low, op_end = RawConsumer({**conf, "group.id": "unused"}).get_watermark_offsets(
            TopicPartition(f"{prefix}_op", 0), timeout=10
        )
        with ThreadCoordinator(conf, topic_prefix=prefix, half_partitions=1) as coordinator:
            wait_for(
                lambda: (
                    no_pending(coordinator, 1) and _sample(coordinator, "rmq_promotions_total") >= 1
                ),
                60,
                "the pending transaction to be checked and promoted",
            )
            assert _sample(coordinator, "rmq_promotions_total") == 1
            verifier = coordinator.server.transactions._markers
            assert verifier is not None and verifier.watermarks == {0: op_end}
            assert _sample(coordinator, "rmq_forged_markers_total", reason="unsigned") == 0
    assert listener.checked == [b"pending"]
    assert Counter(m.value() for m in read_to_end(conf, topic, 1)) == {
        b"decided-1": 1,
        b"decided-2": 1,
        b"pending": 1,
    }


# -- the key and the watermarks ------------------------------------------------------------
def test_coordinators_starting_together_agree_on_one_key_and_the_first_watermarks(broker, unique):
    prefix = unique("keys").replace("-", "")
    conf = broker.conf()
    settings = CoordinatorSettings(topic_prefix=prefix, half_partitions=2)
    ensure_topics(conf, system_topic_specs(settings))
    _forge(conf, prefix, 1, b"an end request of a producer")
    # An older release's coordinator read it (its committed progress): an upgrade.
    committer = RawConsumer(
        {**conf, "group.id": f"{prefix}_coordinator", "enable.auto.commit": False}
    )
    committer.commit(offsets=[TopicPartition(f"{prefix}_op", 1, 1)], asynchronous=False)
    committer.close()
    start = threading.Barrier(2)
    verifiers: list[MarkerVerifier] = []

    def starting(instance: str) -> None:
        start.wait(30)
        verifiers.append(load_verifier(conf, settings, None, instance))

    threads = [threading.Thread(target=starting, args=(f"c{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(verifiers) == 2
    one, two = verifiers
    assert one.key == two.key and one.watermarks == two.watermarks == {0: 0, 1: 1}

    # Later starts read the same key and watermarks, wherever the Op partitions are now.
    _forge(conf, prefix, 0, b"another end request")
    again = load_verifier(conf, settings, None, "c3")
    assert again.key == one.key and again.watermarks == {0: 0, 1: 1}
    with pytest.raises(ConfigError, match="differs from the one the coordinators"):
        load_verifier(conf, settings, MarkerKey(b"a key of its own, 32 bytes long"), "c4")
