"""The back-check workers and the check consumer's offsets, without a broker: a hung check is
answered UNKNOW after its timeout while the others go on, a request that cannot be asked is
skipped without killing a worker, and offsets are committed only below the first check not
yet answered."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import TopicPartition

from rmq_semantics.check_pool import CheckJob, CheckPool
from rmq_semantics.checks import CheckResponder
from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.topics import SystemTopics
from rmq_semantics.transaction_api import LocalTransactionState as S


def check(txn_id: str, seq: int = 1, offset: int = 0) -> CheckRequest:
    return CheckRequest(txn_id, "pg", 0, offset, seq, 0, "orders", None, None, b"v", [], 0)


def job(txn_id: str, offset: int, partition: int = 0) -> CheckJob:
    return CheckJob(check(txn_id, offset=offset), "__rmq_check", partition, offset)


class Recorder:
    def __init__(self) -> None:
        self.replies: list[tuple[str, S]] = []
        self.done: list[int] = []
        self.cv = threading.Condition()

    def reply(self, c: CheckRequest, state: S) -> None:
        with self.cv:
            self.replies.append((c.txn_id, state))
            self.cv.notify_all()

    def finished(self, j: CheckJob) -> None:
        with self.cv:
            self.done.append(j.offset)
            self.cv.notify_all()

    def wait_for(self, count: int) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: len(self.done) >= count, timeout=30), self.replies


def test_a_hung_check_is_answered_unknow_and_the_others_go_on():
    release = threading.Event()
    rec = Recorder()

    def ask(c: CheckRequest) -> S:
        if c.txn_id == "hung":
            release.wait(60)
            return S.COMMIT_MESSAGE
        return S.COMMIT_MESSAGE

    pool = CheckPool(
        threads=1,
        timeout_s=0.3,
        queue_size=10,
        ask=ask,
        reply=rec.reply,
        done=rec.finished,
        name="pg",
    )
    pool.start()
    try:
        assert pool.submit(job("hung", 0))
        for n in range(1, 4):
            assert pool.submit(job(f"t{n}", n))
        rec.wait_for(4)  # one thread only: the others ran on the hung one's replacement
        assert sorted(rec.replies) == [("hung", S.UNKNOW)] + [
            (f"t{n}", S.COMMIT_MESSAGE) for n in (1, 2, 3)
        ]
        assert pool.timed_out == 1 and pool.answered == 4
        release.set()  # the late answer is dropped: UNKNOW was sent for that check
    finally:
        pool.stop(5)
    assert ("hung", S.COMMIT_MESSAGE) not in rec.replies


def test_a_request_that_cannot_be_asked_is_skipped_and_the_worker_lives():
    rec = Recorder()

    def ask(c: CheckRequest) -> S:
        if c.txn_id == "bad":
            raise ValueError("partition must be >= 0")
        return S.ROLLBACK_MESSAGE

    pool = CheckPool(
        threads=1,
        timeout_s=30,
        queue_size=10,
        ask=ask,
        reply=rec.reply,
        done=rec.finished,
        name="pg",
    )
    pool.start()
    try:
        pool.submit(job("bad", 0))
        pool.submit(job("good", 1))
        rec.wait_for(2)
    finally:
        pool.stop(5)
    assert rec.replies == [("good", S.ROLLBACK_MESSAGE)] and rec.done == [0, 1]
    assert pool.skipped == 1


class CommitRecorder:
    def __init__(self) -> None:
        self.commits: list[list[tuple[int, int]]] = []

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        self.commits.append([(tp.partition, tp.offset) for tp in offsets])


@pytest.fixture
def responder() -> CheckResponder:
    r = CheckResponder(
        {"bootstrap.servers": "127.0.0.1:1"},
        SystemTopics("__rmq"),
        "pg",
        instance_id="i1",
        ask=lambda c: S.UNKNOW,
        reply=lambda c, s: None,
    )
    r._on_assign(None, [TopicPartition("__rmq_check", 0), TopicPartition("__rmq_check", 1)])
    return r


def test_offsets_are_committed_below_the_first_unanswered_check(responder):
    consumer = CommitRecorder()
    jobs = [job(f"t{o}", o) for o in range(5)]
    with responder._offsets_lock:
        responder._read_to[0] = 5
        responder._unfinished[0].update(range(5))
        responder._read_to[1] = 7  # read, nothing to answer there
    responder._done(jobs[0])
    responder._done(jobs[2])
    responder._commit(consumer)
    assert consumer.commits == [[(0, 1), (1, 7)]]
    responder._done(jobs[1])
    responder._commit(consumer)
    assert consumer.commits[-1] == [(0, 3)]  # 3 is the first not answered
    responder._commit(consumer)
    assert len(consumer.commits) == 2  # nothing moved: nothing sent
    for j in jobs[3:]:
        responder._done(j)
    responder._commit(consumer)
    assert consumer.commits[-1] == [(0, 5)]


def test_a_revoked_partition_is_committed_then_forgotten(responder):
    consumer = CommitRecorder()
    with responder._offsets_lock:
        responder._read_to[1] = 4
        responder._unfinished[1].add(2)
    responder._on_revoke(consumer, [TopicPartition("__rmq_check", 1)])
    assert consumer.commits == [[(1, 2)]]
    responder._done(job("late", 2, partition=1))  # a check finishing after the revoke
    responder._commit(consumer)
    assert consumer.commits == [[(1, 2)]]


def test_hung_checks_leave_a_bounded_number_of_threads_and_are_answered_unknow():
    release = threading.Event()
    rec = Recorder()

    def ask(c: CheckRequest) -> S:
        release.wait(60)  # the database hangs
        return S.COMMIT_MESSAGE

    def threads() -> int:
        return sum(t.name.startswith("rmq-check-worker-hang-") for t in threading.enumerate())

    pool = CheckPool(
        threads=1,
        timeout_s=0.2,
        queue_size=20,
        ask=ask,
        reply=rec.reply,
        done=rec.finished,
        name="hang",
    )
    pool.start()
    try:
        for n in range(8):
            assert pool.submit(job(f"t{n}", n))
        rec.wait_for(8)  # every check answered, none by a thread started for it
        assert sorted(rec.replies) == [(f"t{n}", S.UNKNOW) for n in range(8)]
        assert threads() <= 2  # one worker and at most one abandoned (max_abandoned=threads)
        assert pool.timed_out + pool.starved == 8 and pool.starved > 0
        release.set()  # the database is back: an abandoned thread works again
        assert pool.submit(job("after", 9))
        rec.wait_for(9)
        assert rec.replies[-1] == ("after", S.COMMIT_MESSAGE)
    finally:
        release.set()
        pool.stop(5)
