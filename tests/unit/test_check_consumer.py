"""The transaction producer's check consumer backs off on errors and stops on fatal ones."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException

from rmq_semantics.checks import CheckResponder
from rmq_semantics.topics import SystemTopics
from rmq_semantics.transaction_api import LocalTransactionState as S
from tests.unit.stops import RecordingStop


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


def producer_with(consumer: FailingConsumer) -> CheckResponder:
    """The check side of a TransactionProducer, with a scripted consumer."""
    responder = CheckResponder(
        {"bootstrap.servers": "127.0.0.1:1"},
        SystemTopics("__rmq"),
        "pg",
        instance_id="i1",
        ask=lambda check: S.UNKNOW,
        reply=lambda check, state: None,
    )
    responder._consumer = consumer
    responder._stop = RecordingStop()
    return responder


def test_retriable_consume_errors_back_off_with_growing_pauses():
    consumer = FailingConsumer([KafkaError(KafkaError._TRANSPORT, retriable=True)] * 4)
    producer = producer_with(consumer)
    consumer.then = producer._stop.set
    producer._consume()
    pauses = producer._stop.waits
    assert consumer.calls == 5 and len(pauses) == 4
    assert pauses == sorted(pauses) and pauses[0] > 0 and pauses[-1] > pauses[0]


def test_a_fatal_consume_error_stops_the_thread_with_one_error_line(caplog):
    consumer = FailingConsumer([KafkaError(KafkaError._FENCED, fatal=True)])
    producer = producer_with(consumer)
    with caplog.at_level(logging.WARNING, logger="rmq_semantics"):
        producer._consume()
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
        producer._consume()
    assert len(stop.waits) == 2 and consumer.calls <= 3  # at most one call after the stop
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
