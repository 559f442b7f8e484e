"""The barrier end to end on the real broker and coordinator, on each database: a check that
comes before the local transaction rolls it back and nothing is promoted; N transactions with
random delays before and inside their local transactions, and back-checks throughout, promote
exactly the transactions whose rows committed (N from RMQ_TEST_BARRIER_N: 150 by default,
1,000 in ``make test-barrier``)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from rmq_semantics import LocalTransactionState, Message, TransactionProducer
from rmq_semantics.barrier import BarrierTransactionListener
from tests.integration.txn_helpers import ThreadCoordinator, no_pending, read_to_end, wait_for

pytestmark = pytest.mark.integration

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
WAIT_S = 60.0
N = int(os.environ.get("RMQ_TEST_BARRIER_N", "150"))
SENDERS = 16
PARTITIONS = 4
# Checks come 1 s after a half write and every 1 s after that; many answered UNKNOW (a check
# past the barrier's lock timeout) must not discard a committed transaction.
RACE_COORDINATOR = {
    "transaction_timeout_ms": 1000,
    "check_interval_ms": 1000,
    "check_max": 30,
    "half_partitions": PARTITIONS,
    "check_partitions": 2,
}


def _txn_ids(records) -> Counter:
    return Counter(dict(m.headers())["rmq.txn_id"].decode() for m in records)


class CheckFirst(BarrierTransactionListener):
    """Begins each local transaction only after the back-check of its transaction answered."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.checked = threading.Event()
        self.answers: list[LocalTransactionState] = []

    def execute_local_transaction(self, msg, arg):
        if not self.checked.wait(WAIT_S):
            raise TimeoutError("no back-check came")
        return super().execute_local_transaction(msg, arg)

    def check_local_transaction(self, msg):
        state = super().check_local_transaction(msg)
        self.answers.append(state)
        self.checked.set()
        return state


def test_a_check_before_the_local_transaction_rolls_it_back_and_nothing_is_promoted(
    db, broker, make_topic, unique
):
    prefix = unique("b").replace("-", "")
    topic = make_topic("barrier-first", partitions=2)
    conf = broker.conf()
    listener = CheckFirst(
        db.barrier(),
        connect=db.connect,
        business=lambda cursor, msg, arg: db.insert_order(cursor, msg),
    )
    with (
        ThreadCoordinator(conf, topic_prefix=prefix) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=4,
        ) as producer,
    ):
        result = producer.send_message_in_transaction(Message(topic, b"order-1", key="c1"))
        producer.flush(30)
        wait_for(lambda: no_pending(coordinator, 4), WAIT_S, "the transaction to be resolved")
    assert listener.answers[:1] == [ROLLBACK]
    assert result.local_transaction_state == ROLLBACK
    assert db.committed() == set()
    assert read_to_end(conf, topic, 2) == []


@dataclass(frozen=True)
class Plan:
    """One transaction of the race: waits before and inside its local transaction, and how
    it ends (commit; commit then answer UNKNOW, as if crashed; or the body raises)."""

    before_s: float
    inside_s: float
    outcome: str


def _plans(rng: random.Random, n: int, kind: str) -> list[Plan]:
    timeout_s = RACE_COORDINATOR["transaction_timeout_ms"] / 1000
    plans = []
    for _ in range(n):
        r = rng.random()
        # None, less or more than the check's delay: the check comes after, or before, or
        # while the local transaction runs.
        before = (
            0.0
            if r < 0.4
            else rng.uniform(0, timeout_s)
            if r < 0.7
            else rng.uniform(timeout_s, 2.5 * timeout_s)
        )
        # SQLite runs one local transaction at a time (its write lock): keep those short.
        inside = rng.uniform(0, timeout_s) if kind == "postgres" else rng.uniform(0, 0.02)
        outcome = rng.choices(["commit", "unknown", "fail"], [0.7, 0.15, 0.15])[0]
        plans.append(Plan(before, inside, outcome))
    return plans


class RaceListener(BarrierTransactionListener):
    """Runs each message's plan: its value is the plan's index."""

    def __init__(self, barrier, db, plans: list[Plan]) -> None:
        super().__init__(barrier, connect=db.connect, business=self._business_of_plan)
        self.db = db
        self.plans = plans
        self.checks = Counter()
        self._lock = threading.Lock()

    def _plan(self, msg) -> Plan:
        return self.plans[int(msg.value)]

    def execute_local_transaction(self, msg, arg):
        time.sleep(self._plan(msg).before_s)  # the race itself: a check may come first
        return super().execute_local_transaction(msg, arg)

    def _business_of_plan(self, cursor, msg, arg):
        plan = self._plan(msg)
        self.db.insert_order(cursor, msg)
        time.sleep(plan.inside_s)  # the race itself: a check may come meanwhile
        if plan.outcome == "fail":
            raise RuntimeError("planned failure of the business")
        return UNKNOW if plan.outcome == "unknown" else None

    def check_local_transaction(self, msg):
        state = super().check_local_transaction(msg)
        with self._lock:
            self.checks[state] += 1
        return state


def test_n_transactions_racing_checks_promote_exactly_the_committed_rows(
    db, broker, make_topic, unique
):
    seed = int(os.environ.get("RMQ_TEST_BARRIER_SEED", random.randrange(1 << 30)))
    plans = _plans(random.Random(seed), N, db.kind)
    prefix = unique("b").replace("-", "")
    topic = make_topic("barrier-race", partitions=PARTITIONS)
    conf = broker.conf()
    barrier = db.barrier(lock_timeout_s=5.0)
    listener = RaceListener(barrier, db, plans)
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, **RACE_COORDINATOR) as coordinator,
        TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=PARTITIONS,
        ) as producer,
        ThreadPoolExecutor(SENDERS) as senders,
    ):
        sent = [
            senders.submit(
                producer.send_message_in_transaction,
                Message(topic, str(i).encode(), key=f"k{i % 17}"),
            )
            for i in range(N)
        ]
        results = [f.result(WAIT_S + 10) for f in sent]
        producer.flush(30)
        wait_for(
            lambda: no_pending(coordinator, PARTITIONS), 300, "every transaction to be resolved"
        )
    promoted = _txn_ids(read_to_end(conf, topic, PARTITIONS))
    committed = db.committed()
    refused = db.query(f"SELECT count(*) FROM {db.barrier_table} WHERE reason = 'rollback'")
    about = (
        f"seed={seed} N={N} answers={Counter(r.local_transaction_state.name for r in results)}"
        f" checks={dict(listener.checks)} waited={barrier.waited_checks} "
        f"rollback_rows={refused[0][0]}"
    )
    assert max(promoted.values(), default=1) == 1, about
    assert set(promoted) == committed, (
        f"{about} promoted-not-committed="
        f"{sorted(set(promoted) - committed)[:5]} "
        f"committed-not-promoted="
        f"{sorted(committed - set(promoted))[:5]}"
    )
    assert sum(listener.checks.values()) > 0, about  # the race had back-checks in it
