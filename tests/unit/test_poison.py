"""Poison records without a broker: the classification of one action's failure, the ledger
that keeps blame across replays, the state machine's set-aside records and late commits,
the vetting of a batch, and the transaction writer on a scripted producer."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from coordinator import kafka_txn
from coordinator.destinations import Destinations
from coordinator.marker_auth import MarkerKey
from coordinator.metrics import CoordinatorMetrics
from coordinator.poison import (
    FailureKind,
    PoisonLedger,
    Verdict,
    after_replays,
    classify,
)
from coordinator.promote import STUB_HEADERS, TransactionWriter
from coordinator.state import (
    Discard,
    EndRequest,
    Finish,
    IssueCheck,
    LateCommit,
    PartitionState,
    TxnState,
)
from rmq_semantics.errors import FatalKafkaError, TransactionAborted
from rmq_semantics.records.codec import decode
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.headers import H
from rmq_semantics.records.reasons import NOT_REDRIVABLE, DiscardReason
from rmq_semantics.records.txn import DoneEntry, DoneMarkers, Outcome
from rmq_semantics.topics import SystemTopics

K, R = FailureKind, DiscardReason
T0 = 1_000_000


# -- classification ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "failure, kind, reason",
    [
        # Raised by produce() at once.
        (KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION)), K.DISCARD, R.UNKNOWN_PARTITION),
        (KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)), K.DISCARD, R.TOO_LARGE),
        (KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC)), K.DISCARD, R.UNKNOWN_TOPIC),
        (KafkaException(KafkaError(KafkaError._QUEUE_FULL)), K.RETRY, None),
        (BufferError("queue full"), K.RETRY, None),
        # Delivery reports: a bare error code, no flags.
        (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), K.DISCARD, R.UNAUTHORIZED),
        (KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), K.DISCARD, R.UNKNOWN_TOPIC),
        (KafkaError(KafkaError.RECORD_LIST_TOO_LARGE), K.DISCARD, R.TOO_LARGE),
        (KafkaError(KafkaError._MSG_TIMED_OUT), K.RETRY, None),
        (KafkaError(KafkaError.NOT_ENOUGH_REPLICAS), K.RETRY, None),
        (KafkaError(KafkaError._PURGE_QUEUE), K.IGNORE, None),
        (KafkaError(KafkaError._PURGE_INFLIGHT), K.IGNORE, None),
        (KafkaError(KafkaError.INVALID_RECORD), K.REPLAY, None),
        # A commit's abortable error naming the refusal (AddPartitionsToTxn and an ACL).
        (
            KafkaException(
                KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, txn_requires_abort=True)
            ),
            K.DISCARD,
            R.UNAUTHORIZED,
        ),
        (KafkaError(KafkaError._INCONSISTENT, txn_requires_abort=True), K.REPLAY, None),
        # Flags decide for codes no table knows.
        (KafkaError(KafkaError._FENCED, fatal=True), K.FATAL, None),
        (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, fatal=True), K.FATAL, None),
        (KafkaError(KafkaError._FAIL, retriable=True), K.RETRY, None),
        (KafkaError(KafkaError._FAIL), K.REPLAY, None),
        # Not Kafka's: the record's content broke our own code.
        (TypeError("can't concat NoneType to bytearray"), K.REPLAY, None),
        (ValueError("bad"), K.REPLAY, None),
    ],
    ids=repr,
)
def test_every_failure_of_one_action_is_sorted_once(failure, kind, reason):
    verdict = classify(failure)
    assert (verdict.kind, verdict.reason) == (kind, reason)
    assert verdict.detail


def test_a_replayed_failure_is_permanent_from_replay_max_on():
    replay = Verdict(K.REPLAY, detail="INVALID_RECORD")
    assert after_replays(replay, 2, 3) == replay
    final = after_replays(replay, 3, 3)
    assert (final.kind, final.reason) == (K.DISCARD, R.REPLAY_LIMIT)
    assert "3 aborted transactions" in final.detail and "INVALID_RECORD" in final.detail
    discard = Verdict(K.DISCARD, R.TOO_LARGE)
    assert after_replays(discard, 1, 3) == discard


def test_reasons_are_the_designs_words_and_two_of_them_cannot_be_redriven():
    assert {r.value for r in R} >= {
        "malformed",
        "unknown_partition",
        "unauthorized",
        "too_large",
        "unknown_topic",
        "system_topic",
        "check_max",
        "retention",
        "late_commit",
    }
    assert {R.MALFORMED, R.SYSTEM_TOPIC} == NOT_REDRIVABLE


# -- the ledger ----------------------------------------------------------------------------
def test_the_ledger_blames_a_record_until_it_must_be_set_aside():
    ledger = PoisonLedger(replay_max=2)
    replay = Verdict(K.REPLAY, detail="TypeError")
    assert ledger.blame((0, 5), replay).replays == 1
    assert ledger.discarding((0, 5)) is None
    blame = ledger.blame((0, 5), replay)
    assert (blame.replays, blame.reason) == (2, R.REPLAY_LIMIT)
    assert ledger.discarding((0, 5)) is blame
    assert ledger.blame((1, 0), Verdict(K.DISCARD, R.TOO_LARGE, "x")).reason is R.TOO_LARGE


@pytest.mark.parametrize("kind", [K.RETRY, K.IGNORE, K.FATAL])
def test_what_is_not_the_records_fault_is_not_blamed(kind):
    ledger = PoisonLedger(1)
    assert ledger.blame((0, 1), Verdict(kind)) is None
    assert len(ledger) == 0


def test_a_failed_discard_copy_asks_for_a_stub_and_settled_records_are_forgotten():
    ledger = PoisonLedger(3)
    ledger.blame((0, 1), Verdict(K.DISCARD, R.TOO_LARGE), discard_copy=True)
    ledger.blame((1, 2), Verdict(K.REPLAY))
    ledger.blame((1, 3), Verdict(K.REPLAY))
    assert ledger.stub((0, 1)) and not ledger.stub((1, 2))
    assert ledger.discarding((0, 1)) is None  # it is being discarded already
    ledger.settle([(0, 1)])
    ledger.forget_partition(1)
    assert len(ledger) == 0


# -- the state machine ---------------------------------------------------------------------
def half(offset: int, topic: str = "orders", partition: int | None = None) -> HalfMessage:
    return HalfMessage(
        0,
        offset,
        T0,
        f"t{offset}",
        "pg",
        topic,
        partition,
        T0,
        None,
        b"k",
        b"v",
        [("app", None), (H.TXN_ID, f"t{offset}".encode())],
    )


def end(op: int, offset: int, state: str) -> EndRequest:
    return EndRequest(op, f"t{offset}", "pg", offset, state, False, 0, T0)


def live() -> PartitionState:
    st = PartitionState(0, 6000, 60000, 1)
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    return st


def test_a_poison_half_is_set_aside_once_recovery_is_over_and_refuses_decisions():
    st = PartitionState(0, 6000, 60000, 3)
    assert st.on_poison_half(0, half(0), R.MALFORMED, T0) == []
    assert st.due(T0) == []  # recovering: its done marker may still come
    assert st.half_commit == 0
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    assert st.on_end_request(end(0, 0, "COMMIT"), T0) == []
    assert st.counters["rejected_not_half"] == 1
    [action] = st.due(T0)
    assert isinstance(action, Discard) and action.reason is R.MALFORMED
    assert st.half_commit == 1 and st.due(T0 + 10**9) == []


def test_a_poison_half_whose_done_marker_is_read_back_is_not_set_aside_again():
    st = PartitionState(0, 6000, 60000, 3)
    st.on_poison_half(0, half(0), R.SYSTEM_TOPIC, T0)
    st.on_done_marker(0, 0, TxnState.DISCARDED)
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    assert st.due(T0) == [] and st.half_commit == 1
    # Read again after a replay: decided, nothing to do.
    assert st.on_poison_half(0, half(0), R.SYSTEM_TOPIC, T0) == [] and st.due(T0) == []


def test_a_promotion_set_aside_is_discarded_and_a_later_commit_is_a_late_commit():
    st = live()
    st.on_half(3, half(3, partition=9), T0)
    [finish] = st.on_end_request(end(0, 3, "COMMIT"), T0)
    discard = st.set_aside(finish, R.UNKNOWN_PARTITION, "partition 9")
    assert (discard.half, discard.reason, discard.detail) == (
        finish.half,
        R.UNKNOWN_PARTITION,
        "partition 9",
    )
    assert st.decided[3][1] is TxnState.DISCARDED
    [late] = st.on_end_request(end(7, 3, "COMMIT"), T0)
    assert late == LateCommit(0, 3, "t3", "pg", 7)
    assert st.on_end_request(end(8, 3, "ROLLBACK"), T0) == []


def test_a_check_set_aside_discards_the_pending_record():
    st = live()
    st.on_half(0, half(0), T0)
    [check] = st.due(T0 + 6000)
    assert isinstance(check, IssueCheck)
    discard = st.set_aside(check, R.TOO_LARGE, "check request too large")
    assert discard.reason is R.TOO_LARGE and 0 not in st.pending and st.half_commit == 1


def test_a_commit_after_check_max_is_a_late_commit_and_discards_carry_their_reason_word():
    st = live()
    st.on_half(0, half(0), T0)
    st.due(T0 + 6000)
    [discard] = st.on_end_request(EndRequest(1, "t0", "pg", 0, "UNKNOWN", True, 1, T0), T0)
    assert discard.reason == "check_max" and "1 checks answered UNKNOWN" in discard.detail
    assert st.on_end_request(end(2, 0, "COMMIT"), T0) == [LateCommit(0, 0, "t0", "pg", 2)]


def test_an_end_request_for_a_half_set_aside_as_forged_is_unauthenticated_never_late():
    """No group signed a forged record: whoever commits it, before or after its discard, is
    rejected as unauthenticated (issue 44), never noted as a late commit."""
    st = live()
    st.on_poison_half(4, half(4), R.FORGED, T0, "no valid rmq.group_mac")
    assert st.on_end_request(end(1, 4, "COMMIT"), T0) == []  # still waiting to be set aside
    [discard] = st.due(T0)
    assert discard.reason is R.FORGED
    intruder = EndRequest(9, "t4", "gb", 4, "COMMIT", False, 0, T0)
    assert st.on_end_request(end(8, 4, "COMMIT"), T0) == []
    assert st.on_end_request(intruder, T0) == []
    assert st.counters["rejected_unauthenticated"] == 3
    assert [reason for _, reason in st.rejections] == [
        "the half record at that offset was set aside as forged: no group signed it"
    ] * 3


def test_a_late_commit_of_another_transaction_or_group_is_a_mismatch_not_noted():
    st = live()
    st.on_half(0, half(0), T0)
    st.due(T0 + 6000)
    st.on_end_request(EndRequest(1, "t0", "pg", 0, "UNKNOWN", True, 1, T0), T0)  # check_max
    assert st.on_end_request(EndRequest(2, "t0", "gb", 0, "COMMIT", False, 0, T0), T0) == []
    assert st.on_end_request(EndRequest(3, "t9", "pg", 0, "COMMIT", False, 0, T0), T0) == []
    assert st.counters["rejected_mismatch"] == 2
    assert st.on_end_request(end(4, 0, "COMMIT"), T0) == [LateCommit(0, 0, "t0", "pg", 4)]


def test_a_discard_known_only_from_its_done_marker_notes_no_late_commit():
    """After a restart that re-read the done marker but not the record (below the committed
    half offset), who wrote the record is unknown: a COMMIT is a conflicting decision."""
    st = PartitionState(0, 6000, 60000, 1)
    st.start_at(6, 0)
    st.on_op_marker(0, DoneMarkers((DoneEntry(5, "t5", Outcome.DISCARDED, 1),), T0))
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    assert st.on_end_request(end(1, 5, "COMMIT"), T0) == []
    assert st.counters["conflicting_decisions"] == 1


@pytest.mark.parametrize("forged", [False, True])
def test_a_discard_whose_record_is_read_again_after_its_done_marker_is_judged_by_it(forged):
    st = PartitionState(0, 6000, 60000, 1)
    st.start_at(5, 0)  # the record at 5 is read again
    st.on_op_marker(0, DoneMarkers((DoneEntry(5, "t5", Outcome.DISCARDED, 1),), T0))
    if forged:
        st.on_poison_half(5, half(5), R.FORGED, T0)
    else:
        st.on_half(5, half(5), T0)
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    late = st.on_end_request(end(1, 5, "COMMIT"), T0)
    assert late == ([] if forged else [LateCommit(0, 5, "t5", "pg", 1)])
    assert st.counters["rejected_unauthenticated"] == forged


# -- vetting a batch -----------------------------------------------------------------------
class FakeAdmin:
    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics
        self.listed = 0

    def list_topics(self, timeout: float):
        self.listed += 1
        meta = type("Topic", (), {"error": None})
        return type(
            "Meta",
            (),
            {
                "topics": {
                    name: type("T", (meta,), {"partitions": dict.fromkeys(range(n))})()
                    for name, n in self.topics.items()
                }
            },
        )()


def test_vetting_discards_promotions_to_missing_topics_or_partitions_and_blamed_records(
    monkeypatch,
):
    # Missing from the first read on (the grace a lagging broker gets: test_destinations).
    monkeypatch.setattr("coordinator.destinations.MISSING_GRACE_S", 0.0)
    admin = FakeAdmin({"orders": 2})
    ledger = PoisonLedger(3)
    destinations = Destinations(lambda: admin, ledger)
    st = live()
    for offset, topic, partition in [
        (0, "orders", 1),
        (1, "orders", 2),
        (2, "gone", None),
        (3, "orders", None),
    ]:
        st.on_half(offset, half(offset, topic, partition), T0)
    actions = [a for o in range(4) for a in st.on_end_request(end(o, o, "COMMIT"), T0)]
    ledger.blame((0, 3), Verdict(K.DISCARD, R.UNAUTHORIZED, "ACL"))
    vetted = destinations.vet(actions, {0: st})
    assert vetted[0] is actions[0]
    assert [(a.reason, a.half.offset) for a in vetted[1:]] == [
        (R.UNKNOWN_PARTITION, 1),
        (R.UNKNOWN_TOPIC, 2),
        (R.UNAUTHORIZED, 3),
    ]
    assert admin.listed == 1  # metadata is read again at most once a second


# -- the transaction writer ----------------------------------------------------------------
class FakeProducer:
    """confluent_kafka.Producer for the writer: ``raises[topic]`` are raised by produce()
    in turn; a topic in ``fails`` gets that delivery error while committing, and the commit
    then fails abortably; ``commit_error`` fails a commit without naming a record."""

    raises: dict[str, list[BaseException]] = {}
    fails: dict[str, KafkaError] = {}
    commit_error: KafkaError | None = None

    def __init__(self, conf: dict) -> None:
        self.conf = conf
        self.raises = {t: list(e) for t, e in self.raises.items()}
        self.committed: list[tuple] = []
        self.polls = 0

    def init_transactions(self, timeout: float) -> None:
        pass

    def begin_transaction(self) -> None:
        self.pending: list[tuple] = []
        self.failing: list[tuple] = []

    def produce(self, topic: str, value: bytes | None = None, **kwargs: object) -> None:
        if self.raises.get(topic):
            raise self.raises[topic].pop(0)
        self.pending.append((topic, value, kwargs))
        if topic in self.fails:
            self.failing.append((kwargs.get("on_delivery"), self.fails[topic]))

    def send_offsets_to_transaction(self, offsets: list, metadata: object, timeout: float) -> None:
        pass

    def commit_transaction(self, timeout: float) -> None:
        for callback, err in self.failing:
            callback(err, None)
        if self.failing:
            raise KafkaException(KafkaError(KafkaError._INCONSISTENT, txn_requires_abort=True))
        if self.commit_error is not None:
            raise KafkaException(self.commit_error)
        self.committed.extend(self.pending)

    def abort_transaction(self, timeout: float) -> None:
        self.pending = []

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        self.listed = [*getattr(self, "listed", []), topic]
        return object()

    def flush(self, timeout: float) -> int:
        return 0


TOPICS = SystemTopics("tp")


@pytest.fixture
def make_writer(monkeypatch):
    def make(probe=None, **script) -> TransactionWriter:
        for name, value in script.items():
            monkeypatch.setattr(FakeProducer, name, value)
        monkeypatch.setattr(kafka_txn.confluent_kafka, "Producer", FakeProducer)
        return TransactionWriter(
            {"bootstrap.servers": "b:9092"},
            TOPICS,
            "tid",
            CoordinatorMetrics(),
            PoisonLedger(2),
            marker_key=MarkerKey(b"k" * 32),
            unwritable=probe,
        )

    return make


def write(writer: TransactionWriter, *actions) -> None:
    writer.write(list(actions), [TopicPartition(TOPICS.half, 0, 1)], object())


def promote(offset: int = 4, topic: str = "orders") -> Finish:
    return Finish(half(offset, topic), TxnState.COMMITTED)


def test_the_writer_asks_for_failed_deliveries_only(make_writer):
    assert make_writer().producer.conf["delivery.report.only.error"] is True


def test_a_refused_delivery_names_its_record_and_aborts(make_writer):
    writer = make_writer(fails={"orders": KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)})
    with pytest.raises(TransactionAborted):
        write(writer, promote(4), Finish(half(5, "other"), TxnState.COMMITTED))
    assert writer.ledger.discarding((0, 4)).reason is R.TOO_LARGE
    assert writer.ledger.discarding((0, 5)) is None
    assert writer.metrics.aborted._value.get() == 1


def test_an_error_raised_by_produce_is_blamed_before_the_abort(make_writer):
    writer = make_writer(
        raises={"orders": [KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))]}
    )
    with pytest.raises(TransactionAborted, match=r"tp_half\[0\]@4 txn=t4"):
        write(writer, promote())
    assert writer.ledger.discarding((0, 4)).reason is R.TOO_LARGE


def test_any_exception_is_replayed_then_set_aside_and_never_escapes(make_writer):
    writer = make_writer(raises={"orders": [TypeError("null"), TypeError("null")]})
    for _ in range(2):
        with pytest.raises(TransactionAborted):
            write(writer, promote())
    assert writer.ledger.discarding((0, 4)).reason is R.REPLAY_LIMIT


def test_a_full_queue_is_retried_in_place(make_writer):
    writer = make_writer(raises={"orders": [BufferError(), BufferError()]})
    write(writer, promote())
    assert writer.producer.polls == 2 and len(writer.ledger) == 0
    assert [t for t, _, _ in writer.producer.committed] == ["orders", TOPICS.op]


def test_a_fatal_produce_error_stops_the_writer(make_writer):
    writer = make_writer(
        raises={"orders": [KafkaException(KafkaError(KafkaError._FENCED, fatal=True))]}
    )
    with pytest.raises(FatalKafkaError):
        write(writer, promote())


def test_a_refusal_naming_no_record_is_traced_to_its_real_topic(make_writer):
    asked = []

    def probe(topics: set[str]) -> dict:
        asked.append(topics)
        return {"secret": R.UNAUTHORIZED}

    writer = make_writer(
        probe,
        commit_error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, txn_requires_abort=True),
    )
    with pytest.raises(TransactionAborted):
        write(writer, promote(4, "orders"), promote(5, "secret"))
    assert asked == [{"orders", "secret"}]
    assert writer.ledger.discarding((0, 5)).reason is R.UNAUTHORIZED
    assert writer.ledger.discarding((0, 4)) is None


def test_a_discard_copy_that_fails_is_written_as_a_stub_next_time(make_writer):
    writer = make_writer(fails={TOPICS.discard: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)})
    discard = Discard(half(4), R.TOO_LARGE, 0)
    with pytest.raises(TransactionAborted):
        write(writer, discard)
    for producer in writer.producers:
        producer.fails = {}
    write(writer, discard)
    [(topic, value, kwargs), (op, marker, _)] = writer.producer.committed
    assert (topic, value, kwargs["key"], op) == (TOPICS.discard, None, None, TOPICS.op)
    names = [k for k, _ in kwargs["headers"]]
    assert set(names) <= set(STUB_HEADERS) | {
        H.HALF_PARTITION,
        H.HALF_OFFSET,
        H.CHECK_COUNT,
        H.DISCARD_REASON,
        H.DISCARDED_TS,
    }
    assert (H.DISCARD_REASON, b"too_large") in kwargs["headers"]
    assert decode(marker).entries[0].outcome == "DISCARDED"
    assert isinstance(decode(marker), DoneMarkers) and len(writer.ledger) == 0


def test_transactions_take_turns_on_two_producers_one_open_at_a_time(make_writer):
    writer = make_writer()
    first, second = writer.producers
    write(writer, promote(4))
    write(writer, promote(5))
    write(writer, promote(6))
    assert [len(first.committed), len(second.committed)] == [4, 2]  # each: record + marker
    assert writer.producer is first and not writer.in_flight


def test_a_null_header_is_promoted_checked_and_discarded_as_null(make_writer):
    writer = make_writer()
    record = half(4)
    write(
        writer,
        Finish(record, TxnState.COMMITTED),
        IssueCheck(half(5), 1, 1, 0, 0, T0),
        Discard(half(6), R.CHECK_MAX, 3),
    )
    by_topic = {t: (v, kw) for t, v, kw in writer.producer.committed}
    assert ("app", None) in by_topic["orders"][1]["headers"]
    assert decode(by_topic[TOPICS.check][0]).headers[0] == ("app", None)
    assert ("app", None) in by_topic[TOPICS.discard][1]["headers"]


def test_a_late_commit_is_noted_in_the_discard_topic_and_counted(make_writer):
    writer = make_writer()
    write(writer, LateCommit(0, 3, "t3", "pg", 7))
    [(topic, value, kwargs)] = writer.producer.committed
    assert (topic, value) == (TOPICS.discard, None)
    headers = dict(kwargs["headers"])
    assert headers[H.DISCARD_REASON] == b"late_commit" and headers[H.TXN_ID] == b"t3"
    assert (headers[H.HALF_PARTITION], headers[H.HALF_OFFSET]) == (b"0", b"3")
    assert writer.metrics.conflicting.labels("late_commit")._value.get() == 1


def test_the_commit_that_caused_a_discard_read_again_by_a_replay_is_not_late():
    st = PartitionState(0, 6000, 60000, 3)  # a new owner replays from committed offsets
    st.on_half(3, half(3, partition=9), T0)
    st.on_end_request(end(5, 3, "COMMIT"), T0)  # the COMMIT its promotion failed for
    st.on_done_marker(9, 3, TxnState.DISCARDED)  # the discard's done marker
    st.on_end_request(end(12, 3, "COMMIT"), T0)  # a COMMIT after the discard
    st.on_eof("half", T0)
    assert st.on_eof("op", T0) == [LateCommit(0, 3, "t3", "pg", 12)]
    assert st.counters["conflicting_decisions"] == 1


def test_only_size_or_our_own_exceptions_blame_a_record_for_a_system_topic_write():
    from coordinator.poison import on_system_topic

    acl = Verdict(K.DISCARD, R.UNAUTHORIZED, "check topic ACL")
    assert on_system_topic(acl).kind is K.RETRY
    for verdict in (Verdict(K.DISCARD, R.TOO_LARGE), Verdict(K.REPLAY, detail="TypeError")):
        assert on_system_topic(verdict) == verdict


def test_a_check_request_the_check_topic_refuses_blames_no_record_unless_too_large(make_writer):
    writer = make_writer(fails={TOPICS.check: KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)})
    check = IssueCheck(half(5), 1, 1, 0, 0, T0)
    with pytest.raises(TransactionAborted):
        write(writer, check)
    assert len(writer.ledger) == 0
    for producer in writer.producers:
        producer.fails = {TOPICS.check: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)}
    with pytest.raises(TransactionAborted):
        write(writer, check)
    assert writer.ledger.discarding((0, 5)).reason is R.TOO_LARGE


class FakeMessage:
    def __init__(self, topic: str, offset: int, headers: list | None = None) -> None:
        self._topic, self._offset, self._headers = topic, offset, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, T0)

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list | None:
        return self._headers


def test_any_exception_from_one_records_handling_makes_it_a_poison_record(monkeypatch):
    from coordinator.settings import CoordinatorSettings
    from coordinator.txn_service import TransactionService

    service = TransactionService(
        {"bootstrap.servers": "b:9092"}, CoordinatorSettings(topic_prefix="tp")
    )
    service.states[0] = live()

    def broken(msg, now):
        raise TypeError("a bug, or an input nobody foresaw")

    monkeypatch.setattr(service, "_dispatch", broken)
    half_msg = FakeMessage(TOPICS.half, 4, [(H.TXN_ID, b"t4"), ("app", None)])
    assert service._dispatch_guarded(half_msg, T0) == []
    assert service._dispatch_guarded(FakeMessage(TOPICS.op, 9), T0) == []
    [discard] = service.states[0].due(T0)
    assert (discard.reason, discard.half.txn_id, discard.half.offset) == (R.MALFORMED, "t4", 4)
    assert service.states[0].op_position == 10
    malformed = service.metrics.malformed
    assert malformed.labels(TOPICS.half)._value.get() == malformed.labels(TOPICS.op)._value.get()


def test_a_half_record_for_a_system_topic_is_set_aside_at_intake():
    from coordinator.settings import CoordinatorSettings
    from coordinator.txn_service import TransactionService

    service = TransactionService(
        {"bootstrap.servers": "b:9092"}, CoordinatorSettings(topic_prefix="tp")
    )
    service.states[0] = live()
    headers = [
        (H.TXN_ID, b"t1"),
        (H.REAL_TOPIC, TOPICS.op.encode()),
        (H.PRODUCER_GROUP, b"pg"),
        (H.BORN_TS, b"1"),
    ]
    service._dispatch_guarded(FakeMessage(TOPICS.half, 1, headers), T0)
    [discard] = service.states[0].due(T0)
    assert (discard.reason, discard.half.real_topic) == (R.SYSTEM_TOPIC, TOPICS.op)


def test_a_partition_the_producer_does_not_know_yet_is_read_again_not_blamed(make_writer):
    writer = make_writer(
        raises={"orders": [KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))]}
    )
    write(writer, promote())
    assert writer.producer.listed == ["orders"]  # its metadata read again, then produced
    assert [c[0] for c in writer.producer.committed if c[0] == "orders"] == ["orders"]
    assert len(writer.ledger) == 0


def test_an_unknown_topic_in_a_delivery_report_is_replayed_not_blamed(make_writer):
    stale: list[str] = []
    writer = make_writer(fails={"orders": KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)})
    writer.stale = stale.append
    with pytest.raises(TransactionAborted):
        write(writer, promote())
    assert len(writer.ledger) == 0 and stale == ["orders"]
