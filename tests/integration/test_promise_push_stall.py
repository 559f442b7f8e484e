"""PushConsumer through a transaction coordinator that does not answer a commit in time.

Fault campaign (issue 35, all brokers paused): the push consumer's ``commit_transaction``
timed out (librdkafka's retriable "retry call to resume": the commit goes on in the
background), the abort that followed was refused while that commit was pending
(``_CONFLICT``), and so was every round after (4,291 times): 81 records never processed.

A SIGSTOP of the broker lands on the commit's EndTxn only by chance (paused earlier, the
offsets' request fails first and the abort that follows resumes fine), so the adversary here
is a proxy in front of the broker that holds every EndTxn request while armed, as a frozen
transaction coordinator would, past the commit's 30 s timeout. The promise: once it answers
again, every record is processed, each retry copy is written once, and consuming goes on.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_semantics.push import ConsumeConcurrentlyStatus, PushConsumer
from rmq_semantics.topics import SystemTopics, ensure_topics
from tests.group_protocol import group_conf
from tests.integration.kafka_proxy import END_TXN, ProxiedKafka, RequestHold, proxied_kafka
from tests.integration.push_helpers import committed_ends, produce_numbers, read_all
from tests.integration.txn_helpers import wait_for

LEVELS = (0.2, 0.4)
BLOCKER = 10  # the record whose listener call is running when the proxy is armed


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[ProxiedKafka, RequestHold]]:
    with proxied_kafka(tmp_path / "kafka", END_TXN) as both:
        yield both


def test_a_commit_the_transaction_coordinator_does_not_answer_in_time_stalls_no_push_consumer(
    proxied, unique, caplog
):
    _kafka, proxy = proxied
    caplog.set_level(logging.WARNING, logger="rmq_semantics.push")
    conf = {"bootstrap.servers": f"127.0.0.1:{proxy.port}"}
    topic, group, prefix = unique("stall"), unique("stall-g"), unique("__rmqp")
    ensure_topics(conf, {topic: (1, {})})
    retry_topic = SystemTopics(prefix).retry(group, 1)
    blocked, release = threading.Event(), threading.Event()
    lock = threading.Lock()
    done: Counter[int] = Counter()

    def listener(msgs, context):
        for m in msgs:
            n = int(m.value)
            if n == BLOCKER and m.reconsume_times == 0 and not release.is_set():
                blocked.set()
                release.wait(120)
            if n % 2 == 0 and m.reconsume_times == 0:
                return ConsumeConcurrentlyStatus.RECONSUME_LATER  # a retry copy to write
            with lock:
                done[n] += 1
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def transactional_warnings() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name.startswith("rmq_semantics.push")
            and ("transaction" in r.getMessage() or "abort" in r.getMessage())
        ]

    produce_numbers(conf, topic, range(30))
    consumer = PushConsumer(
        group_conf({**conf, "group.id": group, "auto.offset.reset": "earliest"}),
        listener=listener,
        topic_prefix=prefix,
        max_workers=1,
        max_reconsume_times=2,
        delay_levels=LEVELS,
    )
    consumer.subscribe([topic])
    consumer.start()
    try:
        wait_for(blocked.is_set, 120, f"the listener call of record {BLOCKER}")
        proxy.arm()
        try:
            # The call returns: its retry copy and offset go into a transaction whose commit
            # the transaction coordinator does not answer within the call's 30 s timeout.
            release.set()
            wait_for(transactional_warnings, 120, "a failed transaction reported")
            assert proxy.held, "no EndTxn was held: the fault missed the commit"
        finally:
            proxy.disarm()
        wait_for(
            lambda: set(done) >= set(range(30)),
            120,
            "every record processed once the coordinator answers again",
            details=lambda: (
                f"missing {sorted(set(range(30)) - set(done))}; "
                f"counts {consumer.counts}; last warnings {transactional_warnings()[-3:]}"
            ),
        )
        # Still consuming: records sent after the recovery are processed too.
        produce_numbers(conf, topic, range(31, 41, 2))
        wait_for(lambda: set(done) >= set(range(31, 41, 2)), 60, "the records sent after")
        wait_for(
            lambda: operator.eq(*committed_ends(conf, group, topic)),
            60,
            "the commits after the recovery",
        )
        assert consumer.poll_error is None
    finally:
        release.set()
        consumer.shutdown()
    aborts = [w for w in transactional_warnings() if "abort failed" in w]
    assert len(aborts) <= 2, (len(aborts), aborts[:3])
    # The transaction is all or nothing: each even record's one retry copy, once.
    copies = Counter(int(r.value()) for r in read_all(conf, retry_topic))
    assert copies == Counter(range(0, 30, 2)), copies
