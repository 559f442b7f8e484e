"""Running the coordinator as an operator would: the real process, its Prometheus metrics,
its health endpoint, SIGTERM, and a metrics port that is taken."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import confluent_kafka.admin
import pytest

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.embedded import free_port
from tests.integration.ops_helpers import (
    START_TIMEOUT_S,
    CoordinatorProcess,
    health,
    http_get,
    samples,
    value,
)
from tests.integration.txn_helpers import FAST, REPO, ScriptedListener, read_to_end, wait_for

pytestmark = pytest.mark.integration


def test_coordinator_process_serves_metrics_and_health_and_stops_on_sigterm(
    broker, make_topic, unique, tmp_path
):
    prefix = unique("ops").replace("-", "")
    topic = make_topic("ops")
    port = free_port()
    inline = {
        b"c1": S.COMMIT_MESSAGE,
        b"c2": S.COMMIT_MESSAGE,
        b"c3": S.COMMIT_MESSAGE,
        b"r1": S.ROLLBACK_MESSAGE,
        b"u1": S.UNKNOW,
    }
    listener = ScriptedListener(lambda v: inline[v], lambda v: S.COMMIT_MESSAGE)
    coordinator = CoordinatorProcess(
        broker.bootstrap,
        tmp_path / "coordinator.log",
        "--metrics-port",
        str(port),
        topic_prefix=prefix,
    )
    try:
        status = wait_for(lambda: health(coordinator, port), START_TIMEOUT_S, "/healthz to say ok")
        assert status["status"] == "ok" and status["instance_id"]
        # No timer message was ever sent on this prefix: its timer service waits, healthy,
        # and has created none of the 20 timer topics.
        assert status["services"]["timers"] == "idle"
        topics = confluent_kafka.admin.AdminClient(broker.conf()).list_topics(timeout=30).topics
        assert not [t for t in topics if t.startswith(f"{prefix}_timer")]
        wait_for(
            lambda: (
                (health(coordinator, port) or {}).get("owned_partitions")
                == list(range(FAST["half_partitions"]))
            ),
            START_TIMEOUT_S,
            "every half partition assigned",
        )
        check = subprocess.run(
            [sys.executable, "-m", "coordinator.healthcheck", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert check.returncode == 0, check.stdout + check.stderr

        with TransactionProducer(
            broker.conf(),
            producer_group=unique("pg"),
            listener=listener,
            topic_prefix=prefix,
            half_partitions=FAST["half_partitions"],
        ) as producer:
            for v in inline:
                producer.send_message_in_transaction(Message(topic, v, key=v))
            # u1 is promoted after its back-check (transaction_timeout_ms=1500 here).
            wait_for(
                lambda: value(samples(port), "rmq_promotions_total") == 4,
                60,
                "3 inline commits and 1 checked commit to be promoted",
            )
        metrics = samples(port)
        assert value(metrics, "rmq_rollbacks_total") == 1
        assert value(metrics, "rmq_checks_issued_total") >= 1
        assert value(metrics, "rmq_promotion_latency_seconds_count") == 4
        pending = {
            labels: v for (name, labels), v in metrics.items() if name == "rmq_pending_transactions"
        }
        assert len(pending) == FAST["half_partitions"] and sum(pending.values()) == 0
        assert {name for name, _ in metrics if name == "rmq_oldest_pending_age_seconds"}
        status, text = http_get(port, "/metrics")
        for family in (
            "rmq_discarded",
            "rmq_rejected_requests",
            "rmq_conflicting_decisions",
            "rmq_malformed_records",
            "rmq_lock_events",
        ):
            assert f"# TYPE {family}_total counter" in text.decode(), family
    finally:
        code = coordinator.stop()
    log = coordinator.log
    assert code == 0, log
    assert "finishing the current transaction" in log and "coordinator stopped" in log
    assert "Traceback" not in log
    assert sorted(m.value() for m in read_to_end(broker.conf(), topic, 1)) == [
        b"c1",
        b"c2",
        b"c3",
        b"u1",
    ]


def test_metrics_port_in_use_is_one_error_line_and_a_non_zero_exit(broker, tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "coordinator",
                "--bootstrap-servers",
                broker.bootstrap,
                "--metrics-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("rmq-semantics: error: --metrics-port")
    assert "in use" in lines[0]
