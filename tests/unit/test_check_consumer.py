"""The transaction producer's check consumer backs off on errors and stops on fatal ones."""

from __future__ import annotations

import logging
import threading

from confluent_kafka import KafkaError, KafkaException

from rmq_semantics import TransactionListener, TransactionProducer


class RecordingStop(threading.Event):
    """A stop flag whose waits return at once and are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


class FailingConsumer:
    """consume() raises the scripted errors in turn; ``then`` runs when they are used up."""

    def __init__(self, errors: list[KafkaError], then=None) -> None:
        self.errors = list(errors)
        self.then = then
        self.calls = 0

    def consume(self, num_messages: int, timeout: float) -> list:
        self.calls += 1
        if self.errors:
            raise KafkaException(self.errors.pop(0))
        if self.then is not None:
            self.then()
        return []


def producer_with(consumer: FailingConsumer) -> TransactionProducer:
    producer = TransactionProducer({"bootstrap.servers": "127.0.0.1:1"}, producer_group="pg",
                                   listener=TransactionListener())
    producer._check_consumer = consumer
    producer._stop = RecordingStop()
    return producer


def test_retriable_consume_errors_back_off_with_growing_pauses():
    consumer = FailingConsumer([KafkaError(KafkaError._TRANSPORT, retriable=True)] * 4)
    producer = producer_with(consumer)
    consumer.then = producer._stop.set
    producer._consume_checks()
    pauses = producer._stop.waits
    assert consumer.calls == 5 and len(pauses) == 4
    assert pauses == sorted(pauses) and pauses[0] > 0 and pauses[-1] > pauses[0]


def test_a_fatal_consume_error_stops_the_thread_with_one_error_line(caplog):
    consumer = FailingConsumer([KafkaError(KafkaError._FENCED, fatal=True)])
    producer = producer_with(consumer)
    with caplog.at_level(logging.WARNING, logger="rmq_semantics"):
        producer._consume_checks()
    assert consumer.calls == 1 and producer._stop.waits == []
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "stopped" in errors[0].getMessage()
    assert not producer._stop.is_set()  # the producer itself keeps running


def test_a_shutdown_during_back_off_ends_the_thread_quietly(caplog):
    consumer = FailingConsumer([KafkaError(KafkaError._TRANSPORT, retriable=True)] * 100)
    producer = producer_with(consumer)
    stop = producer._stop

    def wait(timeout: float | None = None) -> bool:  # shutdown arrives during the 2nd pause
        stop.waits.append(timeout or 0.0)
        if len(stop.waits) == 2:
            stop.set()
        return stop.is_set()

    stop.wait = wait
    with caplog.at_level(logging.ERROR, logger="rmq_semantics"):
        producer._consume_checks()
    assert len(stop.waits) == 2 and consumer.calls <= 3  # at most one call after the stop
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
