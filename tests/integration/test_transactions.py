"""Transactional messages end to end on a real broker (issue: half topic, Op markers,
exactly-once promotion, back-check, discard)."""

from __future__ import annotations

from collections import Counter

import pytest

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from tests.integration.txn_helpers import (
    FAST,
    ScriptedListener,
    ThreadCoordinator,
    no_pending,
    read_to_end,
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
    checked = {0: S.ROLLBACK_MESSAGE, 1: S.COMMIT_MESSAGE, 2: S.COMMIT_MESSAGE,
               3: S.ROLLBACK_MESSAGE, 4: S.UNKNOW}
    listener = ScriptedListener(lambda v: inline[_case(v)], lambda v: checked[_case(v)])
    conf = broker.conf()
    with ThreadCoordinator(conf, topic_prefix=prefix) as coordinator, TransactionProducer(
            conf, producer_group=unique("pg"), listener=listener, topic_prefix=prefix,
            half_partitions=FAST["half_partitions"]) as producer:
        results = [producer.send_message_in_transaction(
            Message(topic, f"msg-{i}".encode(), key=f"k{i}", headers={"app": f"h{i}"},
                    tags="TagA", keys=f"order-{i}"))
            for i in range(120)]
        wait_for(lambda: no_pending(coordinator, FAST["half_partitions"]), 90,
                 "every transaction to be resolved or discarded")

    assert [r.local_transaction_state for r in results[:5]] == [
        S.COMMIT_MESSAGE, S.ROLLBACK_MESSAGE, S.UNKNOW, S.UNKNOW, S.UNKNOW]
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
        f"{results[10].half_partition}:{results[10].half_offset}".encode())
    assert not any(h.startswith(("rmq.real_", "rmq.producer_group", "rmq.born_ts"))
                   for h, _ in sample.headers())
    checks = Counter(listener.checked)
    # Decided inline: never checked. Always UNKNOWN: checked exactly check_max times.
    assert not [v for v in checks if _case(v) in (0, 1)]
    assert {checks[f"msg-{i}".encode()] for i in range(120) if i % 5 == 4} == {FAST["check_max"]}
