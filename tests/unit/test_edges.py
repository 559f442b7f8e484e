"""Validation at the client edges and the small rules of issue 12, without a broker: system
topics are never a destination, a partition is checked before the half write, stale lock
requests are refused, a capped lease is said, a producer clock running ahead does not delay
checks, the transactional topics have one spec, listener answers and suspend_ms are checked."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import fastavro
import pytest

from coordinator.lock import LeaseCeiling, stale_lock_request
from coordinator.settings import CoordinatorSettings
from coordinator.state import IssueCheck, PartitionState
from coordinator.txn_service import system_topic_specs
from rmq_semantics import (
    ConfigError,
    ConsumeOrderlyContext,
    LocalTransactionState,
    Message,
    Producer,
    SystemTopicError,
    TransactionListener,
    TransactionProducer,
    UnknownPartitionError,
    transaction_api,
)
from rmq_semantics import topics as topics_module
from rmq_semantics import transaction as transaction_module
from rmq_semantics.errors import KafkaOperationError
from rmq_semantics.lock_client import LockClient
from rmq_semantics.producer import METADATA_MAX_TOPICS, PartitionCache
from rmq_semantics.records.codec import MAGIC, RecordType, decode, decode_as, encode, schema
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.locks import LockRequest, QueueRef, RequestKind
from rmq_semantics.topics import (
    WEEK_MS,
    SystemTopics,
    is_system_topic,
    refuse_system_destination,
    require_copartitioned,
    txn_topic_specs,
)

NOWHERE = {"bootstrap.servers": "127.0.0.1:1"}
T0 = 1_700_000_000_000


# -- fakes -----------------------------------------------------------------------------------
class FakeMetadataClient:
    """``list_topics(topic, timeout)`` from a dict of partition counts; counts the calls."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.calls: list[tuple[str, float]] = []

    def list_topics(self, topic: str, timeout: float):
        self.calls.append((topic, timeout))
        n = self.counts.get(topic)
        meta = (
            None
            if n is None
            else SimpleNamespace(error=None, partitions={p: None for p in range(n)})
        )
        return SimpleNamespace(topics={topic: meta} if meta else {})


class RecordingProducer:
    """Stands in for the TransactionProducer's confluent_kafka.Producer."""

    def __init__(self) -> None:
        self.produced: list[str] = []

    def produce(self, topic, *args, **kwargs) -> None:
        self.produced.append(topic)

    def poll(self, timeout=0) -> int:
        return 0


class CountingListener(TransactionListener):
    def __init__(self) -> None:
        self.executed: list[Message] = []

    def execute_local_transaction(self, msg, arg):
        self.executed.append(msg)
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def started_txn_producer(counts: dict[str, int], prefix: str = "__rmq"):
    """A TransactionProducer wired to fakes, as start() would leave it."""
    listener = CountingListener()
    producer = TransactionProducer(
        NOWHERE, producer_group="pg", listener=listener, topic_prefix=prefix, send_timeout_s=0.5
    )
    fake = RecordingProducer()
    producer._producer = fake
    producer._partitions = PartitionCache(FakeMetadataClient(counts))
    producer._started = True
    return producer, fake, listener


# -- system topics are never a destination ---------------------------------------------------
@pytest.mark.parametrize(
    "topic", ["app_half", "app_op", "app_lock_request", "__rmq_op", "__rmq_dlq_billing"]
)
def test_a_system_topic_of_the_prefix_or_the_default_one_is_refused(topic):
    assert is_system_topic(topic, "app")
    with pytest.raises(SystemTopicError, match=repr(topic).replace("[", r"\[")):
        refuse_system_destination(topic, "app")


@pytest.mark.parametrize("topic", ["orders", "app", "apphalf", "other_half", "__rmqx"])
def test_business_topics_pass(topic):
    refuse_system_destination(topic, "app")


def test_the_plain_producer_refuses_system_topics_in_send_and_in_the_drop_in_produce():
    producer = Producer(NOWHERE, topic_prefix="app")
    try:
        with pytest.raises(SystemTopicError, match="app_op"):
            producer.send(Message("app_op", b"v"), timeout=0.1)
        with pytest.raises(SystemTopicError, match="__rmq_half"):
            producer.produce("__rmq_half", b"v")
        with pytest.raises(SystemTopicError, match="app_half"):
            producer.produce(topic="app_half", value=b"v")
        producer.produce("orders", b"v")  # a business topic is queued as before
    finally:
        producer.purge()
        producer.close(timeout=0)


def test_the_transaction_producer_refuses_a_system_topic_before_any_half_write():
    producer, fake, listener = started_txn_producer({"orders": 2})
    with pytest.raises(SystemTopicError, match="__rmq_op"):
        producer.send_message_in_transaction(Message("__rmq_op", b"forged"))
    with pytest.raises(SystemTopicError, match="__rmq_check"):
        producer.send_messages_in_transaction(
            [Message("orders", b"ok"), Message("__rmq_check", b"forged")]
        )
    assert fake.produced == [] and listener.executed == []


# -- partition range before the half write ---------------------------------------------------
def test_a_partition_the_topic_lacks_fails_the_send_before_the_half_write():
    producer, fake, listener = started_txn_producer({"orders": 2})
    with pytest.raises(UnknownPartitionError, match=r"'orders' has no partition 2: it has 2"):
        producer.send_message_in_transaction(Message("orders", b"v", partition=2))
    with pytest.raises(UnknownPartitionError) as refused:
        producer.send_messages_in_transaction(
            [Message("orders", b"a", partition=1), Message("orders", b"b", partition=7)]
        )
    assert refused.value.code == "unknown_partition" and isinstance(refused.value, ConfigError)
    assert fake.produced == [] and listener.executed == []


def test_a_missing_topic_with_a_partition_fails_the_send_with_a_kafka_error():
    producer, fake, _ = started_txn_producer({})
    with pytest.raises(KafkaOperationError, match="'gone' is not available"):
        producer.send_message_in_transaction(Message("gone", b"v", partition=0))
    assert fake.produced == []


def test_partition_counts_are_cached_bounded_and_reread_before_refusing():
    client = FakeMetadataClient({"orders": 2})
    cache = PartitionCache(client)
    assert cache.partitions("orders", 1.5) == [0, 1]
    cache.require("orders", 1, 1.5)
    assert client.calls == [("orders", 1.5)]  # the second look came from the cache
    client.counts["orders"] = 4  # partitions were added since
    cache.require("orders", 3, 1.5)
    assert len(client.calls) == 2
    with pytest.raises(UnknownPartitionError):
        cache.require("orders", 4, 1.5)
    for i in range(METADATA_MAX_TOPICS + 10):
        client.counts[f"t{i}"] = 1
        cache.partitions(f"t{i}", 1.0)
    assert len(cache._entries) == METADATA_MAX_TOPICS


# -- stale lock requests ----------------------------------------------------------------------
def lock_request(
    sent_at_ms: int, wait_ms: int = 0, kind: RequestKind = RequestKind.LOCK, lease_ms: int = 60000
) -> LockRequest:
    return LockRequest(kind, "r", "c", "g", 0, (QueueRef("t", 0),), lease_ms, sent_at_ms, wait_ms)


@pytest.mark.parametrize(
    "request_, now, appended, stale",
    [
        (lock_request(T0, wait_ms=5000), T0 + 5000, None, None),  # at the end of the wait
        (lock_request(T0, wait_ms=5000), T0 + 5001, None, 5001),  # its client stopped waiting
        (lock_request(T0, wait_ms=5000), T0 + 10**6, T0 + 10**6 - 10, None),  # client clock behind
        (lock_request(T0 + 10**6, wait_ms=5000), T0 + 10**6, T0, 10**6),  # client clock ahead
        (lock_request(T0), T0 + 59000, None, None),  # v1: no wait said, the lease bounds it
        (lock_request(T0), T0 + 60001, None, 60001),
        (lock_request(T0, kind=RequestKind.UNLOCK, wait_ms=1), T0 + 10**6, None, None),
        (lock_request(0, wait_ms=5000), T0, None, None),  # no send time: nothing to measure
    ],
    ids=[
        "fresh",
        "stale",
        "append-time-wins",
        "append-time-wins-2",
        "v1-fresh",
        "v1-stale",
        "unlock-never",
        "no-time",
    ],
)
def test_a_lock_request_older_than_its_clients_wait_is_stale(request_, now, appended, stale):
    assert stale_lock_request(request_, 60000, now, appended) == stale


def test_version_1_lock_requests_still_read_with_no_wait():
    v1 = lock_request(T0).to_body()
    del v1["wait_ms"]
    out = io.BytesIO()
    out.write(bytes((MAGIC, RecordType.LOCK_REQUEST, 1)))
    fastavro.schemaless_writer(out, schema(RecordType.LOCK_REQUEST, 1), v1)
    assert decode(out.getvalue()) == lock_request(T0, wait_ms=0)
    fresh = lock_request(T0, wait_ms=2500)
    assert encode(fresh)[2] == 3 and decode_as(LockRequest, encode(fresh)) == fresh
    assert decode_as(LockRequest, encode(fresh, 2)) == fresh  # v2: all but a MAC


def test_the_lock_client_names_its_wait_in_the_request():
    client = LockClient(NOWHERE, topic_prefix="app", client_id="me")
    sent: list[LockRequest] = []
    client._producer = SimpleNamespace(
        produce=lambda topic, value, **kw: sent.append(decode_as(LockRequest, value)),
        flush=lambda timeout: 0,
    )
    client._consumer = SimpleNamespace(consume=lambda n, timeout: [])
    client._request_partitions, client.reply_partition = 4, 1
    grants = client.lock("g", [("t", 0)], 30000, timeout=0.05)
    assert grants[("t", 0)].granted is False  # nobody answered
    [request] = sent
    assert (request.wait_ms, request.lease_ms, request.client_id) == (50, 30000, "me")


def test_a_lease_above_the_coordinators_is_capped_and_said_once(caplog):
    ceiling = LeaseCeiling(10000)
    with caplog.at_level(logging.WARNING, logger="coordinator.lock"):
        assert ceiling(lock_request(T0, lease_ms=60000)) == 10000
        assert ceiling(lock_request(T0, lease_ms=60000)) == 10000  # a renewal
        assert ceiling(lock_request(T0, lease_ms=5000)) == 5000
        assert ceiling(lock_request(T0, lease_ms=0)) == 10000  # not said: the default
    [line] = caplog.messages
    assert "ask a 60000 ms lease" in line and "lock_lease_ms=10000" in line


# -- the smaller ones -------------------------------------------------------------------------
def born_at(born_ts: int) -> HalfMessage:
    return HalfMessage(0, 0, born_ts, "t0", "pg", "orders", None, born_ts, None, b"k", b"v", [])


def test_a_producer_clock_running_ahead_never_delays_the_first_check():
    st = PartitionState(0, 6000, 60000, 3)
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    st.on_half(0, born_at(T0 + 3_600_000), T0)  # born an hour "from now"
    assert st.next_due_ms() == T0 + 6000
    [check] = st.due(T0 + 6000)
    assert isinstance(check, IssueCheck) and check.check_seq == 1
    assert born_at(T0 - 10).first_check_ts(6000, T0) == T0 - 10 + 6000  # a sane clock


def test_the_client_and_the_coordinator_create_the_transactional_topics_alike():
    settings = CoordinatorSettings()
    client = txn_topic_specs(SystemTopics(), settings.half_partitions, settings.check_partitions)
    coordinator = system_topic_specs(settings)  # also the coordinators' own keys topic
    assert {topic: coordinator[topic] for topic in client} == client
    assert client["__rmq_half"] == (8, {"retention.ms": str(WEEK_MS)})
    long_horizon = CoordinatorSettings(check_interval_ms=WEEK_MS)
    assert int(system_topic_specs(long_horizon)["__rmq_op"][1]["retention.ms"]) > WEEK_MS


def test_transaction_producer_start_creates_its_topics_with_the_shared_specs(monkeypatch):
    created: dict = {}

    def capture(conf, specs, *, replicated=False, replication_factor=None):
        assert replicated, "system topics are created replicated"
        created.update(specs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(transaction_module, "ensure_topics", capture)
    producer = TransactionProducer(
        NOWHERE,
        producer_group="pg",
        listener=CountingListener(),
        topic_prefix="app",
        half_partitions=3,
        check_partitions=2,
    )
    with pytest.raises(RuntimeError, match="stop here"):
        producer.start()
    specs = txn_topic_specs(SystemTopics("app"), 3, 2)
    assert created == {t: specs[t] for t in ("app_half", "app_op", "app_check")}


def test_unequal_half_and_op_partition_counts_are_one_clear_error(monkeypatch):
    meta = {
        "app_half": SimpleNamespace(partitions=dict.fromkeys(range(8))),
        "app_op": SimpleNamespace(partitions=dict.fromkeys(range(4))),
    }
    monkeypatch.setattr(
        topics_module, "list_topics", lambda conf, timeout_s=30.0: SimpleNamespace(topics=meta)
    )
    with pytest.raises(ConfigError, match="app_half has 8 partitions and app_op has 4"):
        require_copartitioned(NOWHERE, "app_half", "app_op")
    meta["app_op"] = meta["app_half"]
    assert require_copartitioned(NOWHERE, "app_half", "app_op") == 8


@pytest.mark.parametrize(
    "answer, level", [("COMMIT", logging.WARNING), (True, logging.WARNING), (None, logging.DEBUG)]
)
def test_a_listener_answer_that_is_not_a_state_counts_as_unknow_and_is_logged(
    caplog, answer, level
):
    with caplog.at_level(logging.DEBUG, logger="rmq_semantics.transaction"):
        state = transaction_api.as_state(
            answer, "check_local_transaction", "__rmq_half", 2, 17, "abc"
        )
    assert state is LocalTransactionState.UNKNOW
    [record] = caplog.records
    assert record.levelno == level
    assert "__rmq_half[2]@17 txn=abc: check_local_transaction returned" in record.getMessage()


def test_a_listener_answer_that_is_a_state_is_not_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="rmq_semantics.transaction"):
        assert (
            transaction_api.as_state(LocalTransactionState.ROLLBACK_MESSAGE, "m", "h", 0, 0, "t")
            is LocalTransactionState.ROLLBACK_MESSAGE
        )
    assert caplog.records == []


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10"])
def test_suspend_ms_must_be_a_positive_int(value):
    context = ConsumeOrderlyContext("orders", 0)
    with pytest.raises(ConfigError, match="suspend_ms must be an int > 0"):
        context.suspend_ms = value
    context.suspend_ms = 1
    assert context.suspend_ms == 1
