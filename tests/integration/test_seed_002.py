"""Seed 002's sample, ported line for line: a TransactionMQProducer whose
TransactionListenerImpl answers UNKNOW and rotates its back-check answers (UNKNOW, COMMIT,
ROLLBACK by ``transactionIndex % 3``), and a DefaultMQPushConsumer whose
MessageListenerConcurrently returns RECONSUME_LATER when decoding a body fails.

Run on the real broker with a coordinator, then checked against a small model of
RocketMQ: only the transactions the check committed are delivered, each exactly once with
CONSUME_SUCCESS; a message the listener cannot decode is redelivered with reconsume times
0..max through the delay levels and then lands in the DLQ. One deliberate change: short
delay levels and max_reconsume_times (the broker's 10 s .. 2 h and 16 would outlast a test);
the sample's sleeps are shortened the same way.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from itertools import count

import pytest

from rmq_semantics import (
    ConsumeConcurrentlyStatus,
    LocalTransactionState,
    Message,
    MessageListenerConcurrently,
    PushConsumer,
    TransactionListener,
    TransactionProducer,
)
from rmq_semantics.records.headers import H
from tests.group_protocol import group_conf
from tests.integration.push_helpers import read_all
from tests.integration.txn_helpers import FAST, ThreadCoordinator, no_pending, wait_for

pytestmark = pytest.mark.integration

MAX_RECONSUME = 2
LEVELS = (0.2, 0.4)
POISON = b"\xff\xfe not UTF-8"


# -- the sample, line for line ---------------------------------------------------------------
class TransactionListenerImpl(TransactionListener):
    def __init__(self) -> None:
        self.transaction_index = count()  # AtomicInteger transactionIndex = new AtomicInteger(0)
        self.local_trans: dict[str, int] = {}  # ConcurrentHashMap<String, Integer> localTrans

    # 执行本地业务 设置本地事务状态 (run the local transaction, record its status)
    def execute_local_transaction(self, msg, arg):
        value = next(self.transaction_index)
        status = value % 3
        self.local_trans[msg.transaction_id] = status
        return LocalTransactionState.UNKNOW

    # 回查事务 (the back-check)
    def check_local_transaction(self, msg):
        status = self.local_trans.get(msg.transaction_id)
        if status is not None:
            if status == 0:
                return LocalTransactionState.UNKNOW
            if status == 1:
                return LocalTransactionState.COMMIT_MESSAGE
            if status == 2:
                return LocalTransactionState.ROLLBACK_MESSAGE
        return LocalTransactionState.COMMIT_MESSAGE


class ConcurrentlyListener(MessageListenerConcurrently):
    """The consumer's anonymous MessageListenerConcurrently; records what it printed."""

    def __init__(self) -> None:
        self.printed: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def consume_message(self, param_list, context):
        try:
            for msg in param_list:
                msgbody = msg.value.decode("utf-8")  # new String(msg.getBody(), "utf-8")
                with self.lock:
                    self.printed.append((msgbody, msg.reconsume_times))  # System.out.println
        except Exception:
            with self.lock:
                self.printed.append(("<undecodable>", param_list[0].reconsume_times))
            return ConsumeConcurrentlyStatus.RECONSUME_LATER  # 稍后再试 (try again later)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS  # 消费成功 (consumed)


# -- the model of RocketMQ's process -----------------------------------------------------------
def rocketmq_model(
    bodies: list[bytes], check_answer: dict[int, str], max_reconsume: int
) -> tuple[Counter, set[bytes]]:
    """(deliveries as (body, reconsume_times) counts, DLQ bodies): a transaction whose check
    said COMMIT is delivered; CONSUME_SUCCESS ends it, RECONSUME_LATER redelivers it with
    reconsume_times + 1 until max_reconsume, then it goes to %DLQ%."""
    deliveries: Counter = Counter()
    dead: set[bytes] = set()
    for index, body in enumerate(bodies):
        if check_answer[index % 3] != "COMMIT":
            continue  # UNKNOW forever: discarded after the last check; ROLLBACK: dropped
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            deliveries.update(("<undecodable>", n) for n in range(max_reconsume + 1))
            dead.add(body)
            continue
        deliveries[(text, 0)] += 1
    return deliveries, dead


def test_seed_002_transactional_producer_and_concurrent_consumer(broker, make_topic, unique):
    prefix = unique("s2").replace("-", "")
    topic = make_topic("TranTest", partitions=4)
    group = unique("consumer_test_clustering")
    conf = broker.conf()
    transaction_listener = TransactionListenerImpl()
    listener = ConcurrentlyListener()
    tags = ["TagA", "TagB", "TagC", "TagD", "TagE"]
    bodies = [f"Hello RocketMQ {i}".encode() for i in range(10)] + [POISON]
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("please_rename_unique_group_name"),
            listener=transaction_listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
    ):
        consumer = PushConsumer(
            group_conf({**conf, "group.id": group, "auto.offset.reset": "earliest"}),
            listener=listener,
            topic_prefix=prefix,
            max_reconsume_times=MAX_RECONSUME,
            delay_levels=LEVELS,
        )
        consumer.subscribe([topic], "*")
        consumer.start()
        try:
            for i, body in enumerate(bodies):
                msg = Message(topic, body, key="KEY" + str(i), tags=tags[i % len(tags)])
                result = producer.send_message_in_transaction(msg, None)
                assert result.local_transaction_state is LocalTransactionState.UNKNOW
                time.sleep(0.01)  # Thread.sleep(10)
            wait_for(
                lambda: no_pending(coordinator, FAST["half_partitions"]),
                90,
                "every transaction checked to its end",
            )
            expected, dead = rocketmq_model(
                bodies, {0: "UNKNOW", 1: "COMMIT", 2: "ROLLBACK"}, MAX_RECONSUME
            )
            wait_for(
                lambda: (
                    Counter(listener.printed) == expected and consumer.counts["dead"] == len(dead)
                ),
                60,
                "the model's deliveries",
                details=lambda: str(listener.printed),
            )
        finally:
            consumer.shutdown()
    assert Counter(listener.printed) == expected
    assert {b for b, _ in expected} == {
        "Hello RocketMQ 1",
        "Hello RocketMQ 4",
        "Hello RocketMQ 7",
        "<undecodable>",
    }
    dlq = read_all(conf, f"{prefix}_dlq_{group}")
    assert [r.value() for r in dlq] == [POISON]
    headers = dict(dlq[0].headers())
    assert headers[H.DLQ_RECONSUME_TIMES] == str(MAX_RECONSUME).encode()
    assert headers[H.TAGS] == tags[10 % len(tags)].encode()
    assert headers[H.DLQ_ORIGINAL_TOPIC] == topic.encode()
