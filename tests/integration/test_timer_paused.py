"""The timer service through a group coordinator that does not answer an offset fetch.

Fault campaign (CI, seed 30): during broker restarts the timer service's read of its
committed offsets failed on assignment, so it assigned its partitions paused, to be replayed
by the loop. librdkafka keeps a partition's pause through a new assignment, a revocation and
the next rebalance, and the cancel partitions were never resumed: their cancels were never
read, so no lane of theirs ever started and 54 timer messages were never delivered.

When the member had lost its partitions meanwhile, the replay found none to recover and
never cleared its due flag: every step raised again before it polled, so the consumer never
rejoined its group.

The adversary is a proxy in front of the broker that does not answer OffsetFetch requests
while armed, as a group coordinator would that is stuck: the read of the committed offsets
times out.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator import timer_service
from rmq_semantics.records.timer import timer_partition
from rmq_semantics.topics import ensure_topics
from tests.integration.kafka_proxy import OFFSET_FETCH, ProxiedKafka, RequestHold, proxied_kafka
from tests.integration.test_timer_service import (
    TIMER,
    TimerSender,
    VisibleAt,
    _assert_each_once_never_early,
    _prefix,
)
from tests.integration.txn_helpers import ThreadCoordinator, wait_for


def _ids() -> Iterator[str]:
    return (uuid.uuid4().hex for _ in itertools.count())


@pytest.fixture(params=["lost", pytest.param("held", marks=pytest.mark.faults)])
def proxied(request, tmp_path: Path) -> Iterator[tuple[ProxiedKafka, RequestHold]]:
    """``lost``: the offset fetches alone go unanswered, the member keeps its partitions;
    ``held``: nothing on that connection is answered any more, heartbeats included, so the
    member loses its partitions too before the read fails (in ``make test-timer-faults``:
    CI's minutes go to the case the campaign met)."""
    with proxied_kafka(tmp_path / "kafka", OFFSET_FETCH, drop=request.param == "lost") as both:
        yield both


def test_timer_partitions_assigned_while_their_offsets_cannot_be_read_are_all_served(
    proxied, unique, caplog, monkeypatch
):
    _kafka, proxy = proxied
    # The in-process coordinator gives up on the unanswered read sooner than its 20 s.
    monkeypatch.setattr(timer_service, "COMMITTED_TIMEOUT_S", 5.0)
    caplog.set_level(logging.WARNING, logger="coordinator.timer_service")
    conf = {"bootstrap.servers": f"127.0.0.1:{proxy.port}"}
    prefix, topic = _prefix(unique), unique("paused")
    ensure_topics(conf, {topic: (1, {})})

    def failed_reads() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "coordinator.timer_service" and "committed offsets" in r.getMessage()
        ]

    with ThreadCoordinator(conf, topic_prefix=prefix, **TIMER):
        proxy.arm()
        try:
            sender = TimerSender(conf, prefix)  # the intake topic: the timer service starts
            # A cancel in each timer partition: its lanes wait until the cancels are read.
            for p in range(TIMER["timer_partitions"]):
                sender.cancel(next(i for i in _ids() if timer_partition(i, sender.partitions) == p))
            sender.flush()
            wait_for(failed_reads, 120, "the timer service's offset read to fail")
            assert proxy.held, "no OffsetFetch was held: the fault missed the assignment"
        finally:
            proxy.disarm()
        for i in range(8):
            sender.schedule(topic, f"m{i}".encode(), 1000)
        sender.flush()
        reader = VisibleAt(conf, topic, 1)
        reader.read_until(lambda r: len(r) >= 8, 120, "every timer message once offsets are read")
        reader.settle(1.0)
    _assert_each_once_never_early(reader, sender, {f"m{i}".encode() for i in range(8)})
    reader.close()
