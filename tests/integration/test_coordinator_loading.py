"""The coordinator through a group coordinator that is still loading ``__consumer_offsets``.

Reported: on a freshly started one-node broker the coordinator stopped with
COORDINATOR_LOAD_IN_PROGRESS while reading committed offsets at its start, instead of
retrying. librdkafka flags only transactional errors as retriable; a committed-offset
read's error carries the code alone, so the startup's retry policy let it through.

The adversary is a proxy in front of the broker that answers every OffsetFetch with
COORDINATOR_LOAD_IN_PROGRESS while armed, as a group coordinator does after a start or a
leader move.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.topics import ensure_topics
from tests.integration.kafka_proxy import (
    COORDINATOR_LOAD_IN_PROGRESS,
    OFFSET_FETCH,
    ProxiedKafka,
    RequestHold,
    proxied_kafka,
)
from tests.integration.txn_helpers import ScriptedListener, ThreadCoordinator, read_to_end, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def loading(tmp_path: Path) -> Iterator[tuple[ProxiedKafka, RequestHold]]:
    with proxied_kafka(
        tmp_path / "kafka", OFFSET_FETCH, error_code=COORDINATOR_LOAD_IN_PROGRESS
    ) as both:
        yield both


def test_a_coordinator_started_while_offsets_load_retries_then_promotes(loading, unique, caplog):
    _kafka, proxy = loading
    caplog.set_level(logging.WARNING)
    conf = {"bootstrap.servers": f"127.0.0.1:{proxy.port}"}
    prefix, topic = unique("loading").replace("-", ""), unique("loading")
    ensure_topics(conf, {topic: (1, {})})
    coordinator = ThreadCoordinator(conf, topic_prefix=prefix, half_partitions=1)
    proxy.arm()

    def retries_logged() -> list[str]:
        # Ours, not librdkafka's own lines (it retries some requests itself).
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING
            and r.name != "rmq_semantics.librdkafka"
            and "COORDINATOR_LOAD_IN_PROGRESS" in r.getMessage()
        ]

    coordinator.thread.start()
    try:
        # Armed until the coordinator has met the error where librdkafka does not retry it.
        wait_for(
            lambda: retries_logged() or coordinator.exit_code is not None,
            60,
            "the coordinator to read committed offsets while they load",
        )
        proxy.disarm()
        wait_for(
            lambda: (
                coordinator.server.transactions.ready.is_set() or coordinator.exit_code is not None
            ),
            60,
            "the coordinator to start once the offsets are loaded",
        )
        assert coordinator.exit_code is None, "the coordinator stopped:\n" + "\n".join(
            r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
        )
        assert proxy.held, "no OffsetFetch was answered with the error"
        listener = ScriptedListener(lambda v: S.COMMIT_MESSAGE, lambda v: S.COMMIT_MESSAGE)
        with TransactionProducer(
            conf,
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=1,
        ) as producer:
            producer.send_message_in_transaction(Message(topic, b"after-loading"))
            records: list = []
            wait_for(
                lambda: records.extend(read_to_end(conf, topic, 1)) or records,
                60,
                "the transaction to be promoted",
            )
        assert [m.value() for m in records] == [b"after-loading"]
        assert coordinator.exit_code is None
    finally:
        proxy.disarm()
        coordinator.server.stop()
        coordinator.thread.join(60)
    assert not coordinator.thread.is_alive(), "coordinator did not stop"
    assert coordinator.exit_code == 0
