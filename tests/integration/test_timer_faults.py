"""Timer messages through repeated broker faults (``make test-timer-faults``, not in CI: CI
runs the one-restart test of test_timer_service.py): four restarts of the only broker at
random moments, one in three a SIGKILL, while 300 timer messages fall due over 25 s. Each is
delivered once and never before its time.

It found two defects of the timer service: a replay after a broker restart whose partitions
librdkafka had stopped fetching (every seek failed with ``_STATE``, replay after replay), and
the service's lazy start stopping the whole coordinator when a broker, fenced while it
started, refused the level topics (INVALID_REPLICATION_FACTOR).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest

from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.topics import ensure_topics
from tests.integration.test_timer_service import (
    TIMER,
    TimerSender,
    VisibleAt,
    _assert_each_once_never_early,
    _prefix,
)
from tests.integration.txn_helpers import ThreadCoordinator, read_to_end

pytestmark = pytest.mark.faults

RESTARTS = 4
TOTAL = 300


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_timer_messages_through_four_broker_restarts_arrive_once_never_early(
    tmp_path: Path, unique, seed: int
) -> None:
    rng = random.Random(seed)
    kafka = EmbeddedKafka(tmp_path / "kafka", port=free_port())
    kafka.start()
    try:
        prefix, topic = _prefix(unique), unique("faults")
        conf = kafka.client_conf()
        ensure_topics(conf, {topic: (2, {})})
        with ThreadCoordinator(conf, topic_prefix=prefix, **TIMER):
            sender = TimerSender(conf, prefix)
            for i in range(TOTAL):
                sender.schedule(topic, f"m{i}".encode(), 500 + (i * 97) % 25_000)
            sender.flush()
            for _ in range(RESTARTS):
                # The faults land at random moments of the stream: that is the test.
                time.sleep(rng.uniform(0.5, 4.0))
                kafka.stop(timeout_s=rng.choice([60.0, 60.0, 0.5]))  # 0.5: then SIGKILL
                kafka.start()
            reader = VisibleAt(conf, topic, 2)
            reader.read_until(lambda r: len(r) >= TOTAL, 240, "every delivery")
            reader.settle(2.0)
            reader.close()
        _assert_each_once_never_early(reader, sender, {f"m{i}".encode() for i in range(TOTAL)})
        counts = Counter(m.value() for m in read_to_end(conf, topic, 2))
        assert len(counts) == TOTAL and set(counts.values()) == {1}
    finally:
        kafka.stop()
