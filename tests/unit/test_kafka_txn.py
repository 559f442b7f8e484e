"""The coordinator's one Kafka-transaction helper: librdkafka's error triage, the transaction
flow on a scripted producer, and the main loop both services share."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from coordinator import kafka_txn
from coordinator.kafka_txn import (
    RETRY_BACKOFF_MS,
    TRANSACTION_TIMEOUT_MS,
    KafkaTransactions,
    TxnErrorKind,
    transactional_loop,
    triage,
)
from rmq_semantics.errors import (
    FatalKafkaError,
    KafkaOperationError,
    RmqTimeoutError,
    TransactionAborted,
)
from tests.unit.stops import RecordingStop

K = TxnErrorKind


def kafka_exc(code: int = KafkaError._TIMED_OUT, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, **flags))


@pytest.mark.parametrize(
    "flags, kind",
    [
        ({"fatal": True}, K.FATAL),
        ({"fatal": True, "retriable": True, "txn_requires_abort": True}, K.FATAL),
        ({"txn_requires_abort": True}, K.ABORT),
        ({"txn_requires_abort": True, "retriable": True}, K.ABORT),
        ({"retriable": True}, K.RETRY),
        ({}, K.ABORT),  # any other error of a transaction: abort and replay
    ],
)
def test_triage_sorts_fatal_then_abortable_then_retriable(flags, kind):
    assert triage(KafkaError(KafkaError._TIMED_OUT, **flags)) is kind


class ScriptedProducer:
    """Stands in for confluent_kafka.Producer: each method raises its scripted errors in
    turn, then succeeds; every call is recorded."""

    script: dict[str, list[BaseException]] = {}

    def __init__(self, conf: dict) -> None:
        self.conf = conf
        self.calls: list[str] = []
        self.errors = {name: list(errors) for name, errors in self.script.items()}

    def _do(self, name: str) -> None:
        self.calls.append(name)
        if self.errors.get(name):
            raise self.errors[name].pop(0)

    def init_transactions(self, timeout: float) -> None:
        self._do("init")

    def begin_transaction(self) -> None:
        self._do("begin")

    def produce(self, topic: str, value: bytes, **kwargs: object) -> None:
        self._do("produce")

    def send_offsets_to_transaction(self, offsets: list, metadata: object, timeout: float) -> None:
        self._do("offsets")

    def commit_transaction(self, timeout: float) -> None:
        self._do("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._do("abort")

    def flush(self, timeout: float) -> int:
        return 0

    def purge(self, **_kwargs: bool) -> None:
        self.calls.append("purge")


@pytest.fixture
def make_txn(monkeypatch):
    real_retrying = kafka_txn.retrying
    # The shared policy, without its pauses: these tests count calls, not seconds.
    monkeypatch.setattr(
        kafka_txn,
        "retrying",
        lambda deadline_s, stop=None: real_retrying(deadline_s, stop).copy(sleep=lambda _s: None),
    )

    def make(**script: list[BaseException]) -> KafkaTransactions:
        monkeypatch.setattr(ScriptedProducer, "script", script)
        monkeypatch.setattr(kafka_txn.confluent_kafka, "Producer", ScriptedProducer)
        return KafkaTransactions({"bootstrap.servers": "b:9092"}, "tid-1", who="test")

    return make


OFFSETS = [TopicPartition("t", 0, 5)]
NOT_COORDINATOR = KafkaError.NOT_COORDINATOR


def run_one(txn: KafkaTransactions, body=None) -> list[str]:
    with txn.transaction(OFFSETS, object()) as producer:
        (body or (lambda p: p.produce("t", b"v")))(producer)
    return txn.producer.calls


def test_conf_keeps_the_callers_settings_and_forces_the_transactional_ones(make_txn):
    txn = make_txn()
    conf = txn.producer.conf
    assert conf["bootstrap.servers"] == "b:9092" and conf["transactional.id"] == "tid-1"
    assert conf["transaction.timeout.ms"] == TRANSACTION_TIMEOUT_MS
    assert conf["retry.backoff.ms"] == RETRY_BACKOFF_MS == 2
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"


def test_a_clean_transaction_is_begin_produce_offsets_commit(make_txn):
    assert run_one(make_txn()) == ["begin", "produce", "offsets", "commit"]


def test_retriable_commit_errors_retry_the_commit_only(make_txn):
    txn = make_txn(commit=[kafka_exc(NOT_COORDINATOR, retriable=True)] * 2)
    assert run_one(txn) == ["begin", "produce", "offsets", "commit", "commit", "commit"]


def test_retriable_send_offsets_errors_retry_the_same_call(make_txn):
    txn = make_txn(offsets=[kafka_exc(NOT_COORDINATOR, retriable=True)])
    assert run_one(txn) == ["begin", "produce", "offsets", "offsets", "commit"]


def test_a_timed_out_send_offsets_aborts_at_once(make_txn):
    # The abort's own timeout then tells sooner whether the transaction coordinator is gone.
    txn = make_txn(offsets=[kafka_exc(retriable=True)])
    with pytest.raises(TransactionAborted):
        run_one(txn)
    assert txn.producer.calls == ["begin", "produce", "offsets", "abort"]


def test_an_abortable_error_aborts_and_raises_transaction_aborted(make_txn):
    txn = make_txn(offsets=[kafka_exc(txn_requires_abort=True)])
    with pytest.raises(TransactionAborted):
        run_one(txn)
    assert txn.producer.calls == ["begin", "produce", "offsets", "abort"]


def test_a_retriable_error_past_its_deadline_aborts(make_txn, monkeypatch):
    monkeypatch.setattr(kafka_txn, "RETRY_DEADLINE_S", 0.0)
    txn = make_txn(commit=[kafka_exc(NOT_COORDINATOR, retriable=True)] * 3)
    with pytest.raises(TransactionAborted):
        run_one(txn)
    assert txn.producer.calls[-1] == "abort" and "commit" in txn.producer.calls


def test_a_fatal_error_raises_fatal_without_aborting(make_txn):
    txn = make_txn(commit=[kafka_exc(KafkaError._FENCED, fatal=True)])
    with pytest.raises(FatalKafkaError, match="tid-1"):
        run_one(txn)
    assert "abort" not in txn.producer.calls


def test_a_failed_abort_is_fatal_and_a_retriable_one_is_retried(make_txn):
    txn = make_txn(
        offsets=[kafka_exc(txn_requires_abort=True)],
        abort=[kafka_exc(NOT_COORDINATOR, retriable=True)],
    )
    with pytest.raises(TransactionAborted):
        run_one(txn)
    assert txn.producer.calls[-2:] == ["abort", "abort"]

    # A failed abort leaves the transaction's state unknown: only a new epoch is safe, and a
    # new producer gives one (a twin fencing us would have failed it with _FENCED).
    txn = make_txn(
        offsets=[kafka_exc(txn_requires_abort=True)], abort=[kafka_exc(KafkaError._STATE)]
    )
    with pytest.raises(TransactionAborted, match="re-created"):
        run_one(txn)
    txn = make_txn(
        offsets=[kafka_exc(txn_requires_abort=True)],
        abort=[kafka_exc(KafkaError._FENCED, fatal=True)],
    )
    with pytest.raises(FatalKafkaError, match="aborting"):
        run_one(txn)


def test_a_timed_out_commit_re_creates_the_producer_and_replays(make_txn, caplog):
    # librdkafka #5423: only a new epoch fences the timed-out transaction's late requests.
    txn = make_txn(commit=[kafka_exc(retriable=True)])
    old = txn.producer
    with pytest.raises(TransactionAborted, match="re-created"):
        run_one(txn)
    assert old.calls == ["begin", "produce", "offsets", "commit", "purge"]  # no retry/abort
    # Initialised by the next body, not here: an init can wait out the old abort's markers.
    assert txn.producer is not old and txn.producer.calls == []
    assert txn.renewals == 1
    txn.producer.errors["commit"] = []
    assert run_one(txn)[:2] == ["init", "begin"]
    assert "re-creating transactional producer tid-1" in caplog.text


def test_an_abortable_timeout_of_a_record_aborts_on_the_same_producer(make_txn):
    txn = make_txn(commit=[kafka_exc(txn_requires_abort=True)])
    old = txn.producer
    with pytest.raises(TransactionAborted):
        run_one(txn)
    assert txn.producer is old and old.calls[-1] == "abort" and txn.renewals == 0


def test_a_timed_out_abort_re_creates_the_producer_instead_of_stopping(make_txn):
    txn = make_txn(offsets=[kafka_exc(txn_requires_abort=True)], abort=[kafka_exc(retriable=True)])
    old = txn.producer
    with pytest.raises(TransactionAborted):
        run_one(txn)
    assert old.calls[-2:] == ["abort", "purge"] and txn.producer is not old and txn.renewals == 1


def test_a_re_created_producer_whose_init_failed_is_initialised_by_the_next_body(make_txn):
    txn = make_txn(commit=[kafka_exc(retriable=True)], init=[kafka_exc(KafkaError.INVALID_CONFIG)])
    txn.producer.errors["init"] = []  # the first producer initialises; its successor fails
    with pytest.raises(TransactionAborted):
        run_one(txn)
    txn.producer.errors["commit"] = []
    with pytest.raises(KafkaOperationError):  # the next body's init: the loop replays
        run_one(txn)
    assert run_one(txn) == ["init", "init", "begin", "produce", "offsets", "commit"]


def test_a_full_local_queue_aborts_and_replays(make_txn):
    txn = make_txn(produce=[BufferError("queue full")])
    with pytest.raises(TransactionAborted):
        run_one(txn)
    assert txn.producer.calls == ["begin", "produce", "abort"]


def test_a_bug_in_the_body_aborts_and_surfaces(make_txn):
    txn = make_txn()

    def broken(_producer):
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        run_one(txn, broken)
    assert txn.producer.calls == ["begin", "abort"]


def test_init_retries_retriable_errors_and_sorts_the_rest(make_txn):
    txn = make_txn(init=[kafka_exc(retriable=True)])
    txn.init()
    assert txn.producer.calls == ["init", "init"]

    with pytest.raises(FatalKafkaError):
        make_txn(init=[kafka_exc(KafkaError._FENCED, fatal=True)]).init()
    with pytest.raises(KafkaOperationError) as caught:
        make_txn(init=[kafka_exc(KafkaError.INVALID_CONFIG)]).init()
    assert not isinstance(caught.value, FatalKafkaError)


def test_the_loop_replays_after_an_abort_at_once_and_after_other_errors_after_a_pause():
    stop = RecordingStop()
    events: list[str] = []
    outcomes = [TransactionAborted("x"), None, RmqTimeoutError("slow"), None]

    def step():
        events.append("step")
        outcome = outcomes.pop(0)
        if not outcomes:
            stop.set()
        if outcome is not None:
            raise outcome

    transactional_loop("test", step, lambda: events.append("replay"), stop)
    assert events == ["step", "replay", "step", "step", "replay", "step"]
    assert stop.waits == [kafka_txn.RETRY_PAUSE_S]


def test_the_loop_stops_on_a_fatal_error_and_on_any_stop_flag():
    def fenced():
        raise FatalKafkaError("fenced")

    with pytest.raises(FatalKafkaError):
        transactional_loop("test", fenced, lambda: None, threading.Event())

    halt = threading.Event()
    halt.set()
    transactional_loop("test", fenced, lambda: None, threading.Event(), halt)


def test_close_after_a_fatal_error_drops_the_queue_and_never_raises(make_txn):
    # A flush of a fenced producer can only fail, and an error raised while closing would
    # replace the one that ended the service in the exit line.
    txn = make_txn(commit=[kafka_exc(KafkaError._FENCED, fatal=True)])
    with pytest.raises(FatalKafkaError):
        run_one(txn)
    txn.producer.flush = None  # would raise TypeError if called
    txn.close()
    assert txn.producer.calls[-1] == "purge"


def test_a_fence_of_a_transaction_that_outlived_its_timeout_re_creates_the_producer(
    make_txn, monkeypatch, caplog
):
    # The broker aborted the transaction itself and bumped the epoch: a slow cluster, not a
    # twin with our transactional id; the process must not exit over it.
    monkeypatch.setattr(kafka_txn, "TRANSACTION_TIMEOUT_MS", -1)
    txn = make_txn(
        offsets=[kafka_exc(KafkaError._STATE)], abort=[kafka_exc(KafkaError._FENCED, fatal=True)]
    )
    old = txn.producer
    with pytest.raises(TransactionAborted, match="re-created"):
        run_one(txn)
    assert txn.producer is not old and txn.renewals == 1
    assert "failed after the transaction outlived its -1 ms timeout" in caplog.text
    txn.producer.errors = {}
    assert run_one(txn)[:2] == ["init", "begin"]

    # Whatever the fatal error: an invalid state after the broker's abort is no twin either.
    txn = make_txn(
        offsets=[kafka_exc(KafkaError._STATE)],
        abort=[kafka_exc(KafkaError.INVALID_TXN_STATE, fatal=True)],
    )
    with pytest.raises(TransactionAborted, match="re-created"):
        run_one(txn)


def test_a_fence_of_a_fresh_transaction_still_stops_the_process(make_txn):
    txn = make_txn(
        abort=[kafka_exc(KafkaError._FENCED, fatal=True)], offsets=[kafka_exc(KafkaError._STATE)]
    )
    with pytest.raises(FatalKafkaError, match="aborting"):
        run_one(txn)


def test_a_commit_stuck_past_its_timeout_is_abandoned_for_a_new_producer(make_txn, monkeypatch):
    # librdkafka #5456/#5511: send_offsets_to_transaction can wait forever for a group
    # coordinator that left the cluster.
    monkeypatch.setattr(kafka_txn, "WEDGED_AFTER_S", 0.0)
    txn = make_txn()
    release = threading.Event()
    txn.producer.send_offsets_to_transaction = lambda *_args: release.wait(30)
    committer = kafka_txn.CommitThread()
    with txn.body() as producer:
        producer.produce("t", b"v")
    commit = committer.submit(txn.finish, OFFSETS, object())
    assert committer.wait(commit, txn) is False
    successor = txn.abandon()
    assert txn.abandoned and successor.transactional_id == "tid-1"
    release.set()  # the stuck call returns: the abandoned object touches nothing more
    with pytest.raises(TransactionAborted):
        commit.result(10)
    assert txn.producer.calls == ["begin", "produce"]
    committer.close(10)
    assert run_one(successor)[:2] == ["init", "begin"]


def test_a_call_stuck_in_a_transaction_past_its_timeout_is_wedged_before_the_call_timeout(
    make_txn, monkeypatch
):
    # The broker aborts a transaction older than transaction.timeout.ms whatever a stuck
    # call returns: waiting for WEDGED_AFTER_S would only lengthen a failover.
    monkeypatch.setattr(kafka_txn, "DOOMED_CALL_MIN_S", 0.0)
    monkeypatch.setattr(kafka_txn, "TRANSACTION_TIMEOUT_MS", 0)
    monkeypatch.setattr(kafka_txn, "DOOMED_MARGIN_S", 0.0)
    txn = make_txn()
    release = threading.Event()
    txn.producer.send_offsets_to_transaction = lambda *_args: release.wait(30)
    committer = kafka_txn.CommitThread()
    with txn.body() as producer:
        producer.produce("t", b"v")
    commit = committer.submit(txn.finish, OFFSETS, object())
    assert committer.wait(commit, txn) is False  # long before WEDGED_AFTER_S (45 s)
    txn.abandon()
    release.set()
    with pytest.raises(TransactionAborted):
        commit.result(10)
    committer.close(10)


def test_a_slow_call_outside_a_transaction_is_not_wedged(make_txn, monkeypatch):
    # After a commit no transaction is open: only WEDGED_AFTER_S can abandon a call then
    # (an init may legitimately wait for a loading coordinator).
    monkeypatch.setattr(kafka_txn, "DOOMED_CALL_MIN_S", 0.0)
    monkeypatch.setattr(kafka_txn, "TRANSACTION_TIMEOUT_MS", 0)
    monkeypatch.setattr(kafka_txn, "DOOMED_MARGIN_S", 0.0)
    txn = make_txn()
    run_one(txn)
    txn._busy_since = time.monotonic() - 1.0  # a call running for a second
    assert txn.wedged() is False


def test_a_renewed_idle_producer_is_initialised_by_its_next_transaction(make_txn, caplog):
    # A sibling's wedge: this producer is idle but likely holds the same stale coordinator.
    txn = make_txn()
    run_one(txn)
    old = txn.producer
    txn.renew("its sibling's call wedged")
    assert txn.producer is not old and txn.renewals == 1
    assert run_one(txn)[:2] == ["init", "begin"]
    assert "its sibling's call wedged; re-creating transactional producer tid-1" in caplog.text


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError._GAPLESS_GUARANTEE,
        KafkaError.UNKNOWN_PRODUCER_ID,
    ],
)
def test_a_producer_that_broke_but_was_not_fenced_is_re_created_and_the_batch_replayed(
    make_txn, code
):
    """The fault campaign (seed 2, long run): a produce to the Op topic failed with a
    sequence desynchronization after a broker was cut off; librdkafka made it fatal and the
    coordinator exited. Only a twin with the same transactional id (fenced) must stop it:
    a broken producer is replaced (its new epoch fences its own late requests)."""
    txn = make_txn(commit=[kafka_exc(code, fatal=True)])
    old = txn.producer
    with pytest.raises(TransactionAborted, match="re-created"):
        run_one(txn)
    assert txn.producer is not old
    txn.producer.errors["commit"] = []
    assert run_one(txn) == ["init", "begin", "produce", "offsets", "commit"]
