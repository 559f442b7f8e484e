"""Fixtures of the monitoring tests: ``monitored_run``, a real coordinator (a subprocess of
this checkout serving /metrics on 127.0.0.1) scraped every second by a real Prometheus of the
module's own (tests/monitoring/prometheus.py) that evaluates docker/prometheus/alerts.yml,
while traffic provokes every event the dashboard shows.

No prometheus binary: the tests skip with one reason, or fail when ``RMQ_REQUIRE`` names
``prometheus``. ``RMQ_TEST_DASHBOARD_PNG=path`` also draws the dashboard from the run's data
(rmq_semantics/tools/dashboard_plots.py), as docs/dashboard.png was made.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer as RawProducer

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, Producer, TransactionProducer
from rmq_semantics.embedded import free_port
from rmq_semantics.lock_client import LockClient
from rmq_semantics.records.codec import encode
from rmq_semantics.records.timer import DEFAULT_MAX_DELAY_MS, DEFAULT_TIMER_PARTITIONS
from rmq_semantics.records.txn import EndRequest, EndState
from rmq_semantics.tools import dashboard_plots
from rmq_semantics.topics import SystemTopics, ensure_topics, timer_topic_specs
from tests.integration.txn_helpers import (
    FAST,
    REPO,
    CoordinatorProcess,
    MemberWriter,
    ScriptedListener,
    wait_for,
)
from tests.monitoring.prometheus import JOB, PrometheusServer, PrometheusUnavailable, binaries
from tests.require import missing

ALERTS = REPO / "docker" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "docker" / "grafana" / "rmq-semantics.json"
# Seconds of traffic; every event is provoked more than once within it (see _traffic).
TRAFFIC_S = float(os.environ.get("RMQ_TEST_MONITORING_S", "30"))
LEASE_MS = 1000  # the lapsing lock's lease: taken over 1.5 s later


@pytest.fixture(scope="module")
def prometheus_binaries() -> tuple[str, str]:
    try:
        return binaries()
    except PrometheusUnavailable as exc:
        missing("prometheus", str(exc))
        raise  # not reached: missing() skips or fails


@dataclass
class Run:
    """What the traffic left: Prometheus to ask, the window it ran in, the coordinator."""

    prometheus: PrometheusServer
    start: float
    end: float
    coordinator: CoordinatorProcess
    metrics_url: str

    def scrape(self) -> dict[str, float]:
        """The coordinator's /metrics as {sample with labels: value}."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        return {
            m.group(1): float(m.group(2)) for m in re.finditer(r"^(rmq_\S+) (\S+)$", text, re.M)
        }


def _sample(samples: dict[str, float], name: str, **labels: str) -> float:
    key = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    return samples.get(key, 0.0)


# Every event of the dashboard, as the coordinator's own /metrics counts it.
EVENTS = [
    ("rmq_promotions_total", {}),
    ("rmq_rollbacks_total", {}),
    ("rmq_checks_issued_total", {}),
    ("rmq_checks_answered_total", {"state": "commit"}),
    ("rmq_checks_answered_total", {"state": "unknown"}),
    ("rmq_discarded_total", {"reason": "check_max"}),
    ("rmq_discarded_total", {"reason": "too_large"}),
    ("rmq_rejected_requests_total", {"reason": "mismatch"}),
    ("rmq_transactions_aborted_total", {}),
    ("rmq_lock_events_total", {"event": "granted"}),
    ("rmq_lock_events_total", {"event": "taken_over"}),
    ("rmq_timer_scheduled_total", {}),
    ("rmq_timer_delivered_total", {}),
    ("rmq_timer_cancelled_total", {}),
    ("rmq_timer_discarded_total", {"reason": "malformed"}),
]
# Timer messages per round and when they are due: half 1.5 s later (through level 1, then
# the due-heap), half 0.9 s later (held in memory from the intake on, so rmq_timer_held is
# above 0 for most of each second, whenever Prometheus scrapes).
TIMERS_PER_ROUND, TIMER_AFTER_MS = 10, (1500, 900)


def _listener() -> ScriptedListener:
    inline = {
        b"commit": S.COMMIT_MESSAGE,
        b"rollback": S.ROLLBACK_MESSAGE,
        b"check": S.UNKNOW,
        b"unknown": S.UNKNOW,
        b"big": S.COMMIT_MESSAGE,
    }
    checked = {b"check": S.COMMIT_MESSAGE, b"unknown": S.UNKNOW}
    return ScriptedListener(
        lambda v: inline[v.split(b"-")[0]],
        lambda v: checked.get(v.split(b"-")[0], S.COMMIT_MESSAGE),
    )


def _forge_mismatch(conf: dict, prefix: str, result) -> None:
    """An end request naming a pending half message with another transaction id."""
    body = {
        "txn_id": f"forged-{uuid.uuid4().hex[:6]}",
        "producer_group": result.producer_group,
        "half_partition": result.half_partition,
        "half_offset": result.half_offset,
        "state": "COMMIT",
        "from_check": False,
        "check_seq": 0,
        "ts": 0,
    }
    producer = RawProducer(conf)
    producer.produce(
        f"{prefix}_op", encode(EndRequest.from_body(body)), partition=body["half_partition"]
    )
    assert producer.flush(10) == 0


def _forge_timer(conf: dict, prefix: str) -> None:
    """A record on the timer intake topic without the timer headers."""
    producer = RawProducer(conf)
    producer.produce(f"{prefix}_timer", b"no headers", partition=0)
    assert producer.flush(10) == 0


def _traffic(conf: dict, prefix: str, topic: str, small: str, settle: Callable[[], None]) -> None:
    """TRAFFIC_S seconds, one round a second: 20 commits and a rollback; every 4th round a
    message committed on its back-check and one answered UNKNOWN until check_max discards
    it; every 10th a message too large for its topic (the Kafka transaction aborts, the
    replay discards it as too_large), a forged end request (rejected as mismatch), and a
    queue lock whose 1 s lease lapses and is taken over by another client. Timer messages:
    TIMERS_PER_ROUND every round (TIMER_AFTER_MS), one recalled every 4th round, and a timer
    record without its headers every 10th (discarded as malformed). Then ``settle``, with
    the producer still there to answer the last back-checks."""
    group = f"locks-{uuid.uuid4().hex[:6]}"
    with (
        TransactionProducer(
            conf,
            producer_group=f"pg-{uuid.uuid4().hex[:6]}",
            listener=_listener(),
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer,
        LockClient(conf, topic_prefix=prefix, client_id="lapsing") as lapsing,
        LockClient(conf, topic_prefix=prefix, client_id="successor") as successor,
        Producer(conf, topic_prefix=prefix) as scheduler,
    ):
        too_large = MemberWriter(
            conf, prefix, f"old-client-{uuid.uuid4().hex[:6]}", FAST["half_partitions"]
        )
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < TRAFFIC_S:
            producer.send_messages_in_transaction(
                [Message(topic, f"commit-{n}-{i}".encode(), key=str(i)) for i in range(20)]
            )
            producer.send_message_in_transaction(Message(topic, f"rollback-{n}".encode()))
            for i in range(TIMERS_PER_ROUND):
                after = TIMER_AFTER_MS[i % len(TIMER_AFTER_MS)]
                scheduler.send(Message(topic, f"timer-{n}-{i}".encode(), deliver_after_ms=after))
            if n % 4 == 0:
                recalled = scheduler.send(Message(topic, b"recalled", deliver_after_ms=3000))
                scheduler.recall_message(recalled.message_id or "")
                producer.send_message_in_transaction(Message(topic, f"check-{n}".encode()))
                producer.send_message_in_transaction(Message(topic, f"unknown-{n}".encode()))
            if n % 10 == 2:
                # Refused at send time now: written as an older client (or a limit lowered
                # after the send) leaves it, for the coordinator to discard as too_large.
                too_large.send([Message(small, b"big-" + b"x" * 5000)], EndState.COMMIT)
                pending = producer.send_message_in_transaction(
                    Message(topic, f"check-forged-{n}".encode())
                )
                _forge_mismatch(conf, prefix, pending)
                _forge_timer(conf, prefix)
                queue = [(f"queue-{n}", 0)]
                assert lapsing.lock(group, queue, LEASE_MS, timeout=30)[queue[0]].granted
            if n % 10 == 4:  # 2 s later: the lapsed lease is expired and taken over
                queue = [(f"queue-{n - 2}", 0)]
                assert successor.lock(group, queue, 30000, timeout=30)[queue[0]].granted
                successor.unlock(group, queue, timeout=30)
            n += 1
            time.sleep(max(0.0, n - (time.monotonic() - started)))
        too_large.close()
        settle()


@pytest.fixture(scope="module")
def monitored_run(prometheus_binaries, broker) -> Iterator[Run]:
    prefix = f"mon{uuid.uuid4().hex[:8]}"
    topic, small = f"orders-{uuid.uuid4().hex[:8]}", f"small-{uuid.uuid4().hex[:8]}"
    conf = broker.conf()
    ensure_topics(conf, {topic: (3, {}), small: (1, {"max.message.bytes": "2000"})})
    # The timer topics as a producer's first scheduled send and the service leave them, so
    # the timer service (idle until they exist) owns its partitions before the run starts.
    ensure_topics(
        conf,
        timer_topic_specs(SystemTopics(prefix), DEFAULT_TIMER_PARTITIONS, DEFAULT_MAX_DELAY_MS),
    )
    port = free_port()
    coordinator = CoordinatorProcess(broker.bootstrap, None, topic_prefix=prefix, metrics_port=port)
    prometheus: PrometheusServer | None = None
    try:
        coordinator.wait_ready()
        run = Run(
            PrometheusServer([f"127.0.0.1:{port}"], [ALERTS]),
            0.0,
            0.0,
            coordinator,
            f"http://127.0.0.1:{port}/metrics",
        )
        prometheus = run.prometheus

        def owned_all() -> bool:
            samples = run.scrape()
            return all(
                0
                < _sample(samples, "rmq_partitions", service=s)
                == _sample(samples, "rmq_owned_partitions", service=s)
                for s in ("transactions", "locks", "timers")
            )

        wait_for(owned_all, 60, "the coordinator to own every partition")
        prometheus.start()
        wait_for(
            lambda: dashboard_plots.query(prometheus.url, f'up{{job="{JOB}"}} == 1'),
            30,
            "Prometheus' first scrape of the coordinator",
            details=lambda: prometheus.log,
        )
        # Before its first scrape, RmqCoordinatorDown's absent(up == 1) held for a moment:
        # the window starts once no alert is left from Prometheus' own start.
        wait_for(
            lambda: not dashboard_plots.query(prometheus.url, "ALERTS"),
            30,
            "no alert pending from Prometheus' start",
        )
        run.start = time.time()
        _traffic_until_every_event(run, conf, prefix, topic, small)
        run.end = time.time()
        png = os.environ.get("RMQ_TEST_DASHBOARD_PNG")
        if png:
            dashboard_plots.render(
                prometheus.url,
                json.loads(DASHBOARD.read_text()),
                run.start,
                run.end,
                Path(png),
                title=f"rmq-semantics coordinator: {TRAFFIC_S:.0f} s of tests/monitoring traffic",
            )
        yield run
    finally:
        if prometheus is not None:
            prometheus.stop()
        coordinator.stop()


def _traffic_until_every_event(run: Run, conf: dict, prefix: str, topic: str, small: str) -> None:
    def counted() -> list[str]:
        samples = run.scrape()
        return [f"{n}{labels or ''}" for n, labels in EVENTS if _sample(samples, n, **labels) < 1]

    # The last UNKNOWN transactions are discarded check_max x check_interval after their
    # first check; then three more scrapes and rule evaluations.
    def settle() -> None:
        wait_for(
            lambda: not counted(),
            60,
            "every event to be counted",
            details=lambda: f"not yet: {counted()}",
        )
        time.sleep(4)

    _traffic(conf, prefix, topic, small, settle)
