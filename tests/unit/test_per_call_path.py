"""The one-message transactional path (issue 13): its own producer, whose delivery reports a
thread of its own serves while each caller sleeps on its own waiter. No timing is asserted."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError

from rmq_semantics.errors import KafkaOperationError, RmqTimeoutError
from rmq_semantics.message import Message
from rmq_semantics.producer import DeliveryPoller, SignalledWaiter
from tests.unit.test_edges import started_txn_producer


class ReportingProducer:
    """Answers every produce at once with ``error`` (or a delivery at offset 7)."""

    def __init__(self, error: KafkaError | None = None) -> None:
        self.error = error
        self.produced: list[str] = []
        self.polls = 0

    def produce(self, topic, value=None, *, on_delivery=None, **kwargs) -> None:
        self.produced.append(topic)
        record = type(
            "Rec",
            (),
            {"partition": lambda _s: 0, "offset": lambda _s: 7, "topic": lambda _s: topic},
        )()
        on_delivery(self.error, record)

    def poll(self, timeout=0) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout=0) -> int:
        return 0


def per_call_producer(error: KafkaError | None = None):
    producer, main, listener = started_txn_producer({"orders": 2})
    call = ReportingProducer(error)
    producer._call.producer = call  # as CallProducer.get leaves it, without a broker
    return producer, main, call, listener


def test_a_failed_half_write_raises_and_never_runs_the_local_transaction():
    producer, main, call, listener = per_call_producer(KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KafkaOperationError, match=r"half message.*a ROLLBACK of txn"):
        producer.send_message_in_transaction(Message("orders", b"v"))
    # The ROLLBACK by txn id (issue 29): should the half message land anyway, it is dropped.
    assert listener.executed == [] and call.produced == [producer.topics.half, producer.topics.op]
    assert main.produced == []


def test_the_half_and_the_end_request_go_through_the_per_call_producer():
    producer, main, call, listener = per_call_producer()
    result = producer.send_message_in_transaction(Message("orders", b"v"))
    assert (result.half_partition, result.half_offset) == (0, 7)
    assert call.produced == [producer.topics.half, producer.topics.op]
    assert len(listener.executed) == 1 and main.produced == []
    assert call.polls == 0  # its delivery thread serves it, never the caller


def test_a_signalled_waiter_times_out_with_our_error():
    with pytest.raises(RmqTimeoutError, match="no delivery report"):
        SignalledWaiter().wait(None, "writing", 0.01)


def test_the_delivery_poller_survives_a_raising_callback_and_stops_idempotently():
    served = threading.Event()

    class Raising:
        calls = 0

        def poll(self, timeout):
            Raising.calls += 1
            if Raising.calls == 1:
                raise RuntimeError("a callback raised")
            served.set()
            return 0

    poller = DeliveryPoller(Raising(), "test-poller").start()
    assert served.wait(5)
    poller.stop(5)
    poller.stop(5)
    assert not poller._thread.is_alive()


def test_shutdown_flushes_the_per_call_producer_and_joins_its_thread():
    producer, _, call, _ = per_call_producer()
    poller = DeliveryPoller(call, "test-poller").start()
    producer._call._poller = poller
    producer._checks.stop = lambda timeout: None  # never started here
    main = producer._producer
    main.flush = lambda timeout: 0
    producer.shutdown(timeout=5)
    producer.shutdown(timeout=5)
    assert not poller._thread.is_alive()
