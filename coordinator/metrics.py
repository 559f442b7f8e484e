"""Prometheus metrics of the coordinator (families ``rmq_*``), one registry per server."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.reasons import DiscardReason

if TYPE_CHECKING:
    from coordinator.state import PartitionState
    from rmq_semantics.topics import SystemTopics

__all__ = ["CoordinatorMetrics", "MetricsServer", "publish_partition_counters"]

log = logging.getLogger(__name__)

# Label values created at 0 when the registry is made: a counter series that first appears
# already at 1 has no increase() to Prometheus, so the first discard would never alert.
REJECT_REASONS = (
    "mismatch",
    "no_such_offset",
    "not_half",
    "wrong_partition",
    "deferred_full",
    "unauthenticated",
)
CHECK_ANSWERS = ("commit", "rollback", "unknown")
LOCK_EVENTS = (
    "granted",
    "renewed",
    "taken_over",
    "released",
    "held_by_other",
    "stale",
    "unauthenticated",
)
SERVICES = ("transactions", "locks", "timers")
# Why the timer service waits instead of serving (coordinator/timer_service.py).
TIMER_BLOCKED = ("topic_partitions",)
# Why a cancel record is not held (coordinator/timer_service.py).
CANCEL_REFUSALS = ("over_bound", "future")


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.promotions = Counter("rmq_promotions", "Committed half messages promoted", registry=r)
        self.rollbacks = Counter("rmq_rollbacks", "Half messages rolled back", registry=r)
        self.checks_issued = Counter("rmq_checks_issued", "Back-check requests sent", registry=r)
        self.checks_answered = Counter(
            "rmq_checks_answered",
            "Back-check answers read, by the state answered",
            ["state"],
            registry=r,
        )
        self.check_horizon = Gauge(
            "rmq_check_horizon_seconds",
            "Age by which a half message is decided or discarded "
            "(transaction_timeout_ms + check_max x check_interval_ms) if its checks are "
            "answered",
            registry=r,
        )
        self.partitions = Gauge(
            "rmq_partitions",
            "Partitions of the half topic (transactions), the lock-request topic (locks) or "
            "every timer topic (timers)",
            ["service"],
            registry=r,
        )
        self.owned_partitions = Gauge(
            "rmq_owned_partitions", "Of those, the ones this instance owns", ["service"], registry=r
        )
        self.takeover_waiting = Gauge(
            "rmq_takeover_waiting_partitions",
            "Half/op partitions taken over whose recovery "
            "waits for a transaction open there at the takeover (a previous owner's)",
            registry=r,
        )
        self.discarded = Counter("rmq_discarded", "Half messages discarded", ["reason"], registry=r)
        self.rejected = Counter(
            "rmq_rejected_requests", "End requests rejected", ["reason"], registry=r
        )
        self.conflicting = Counter(
            "rmq_conflicting_decisions",
            "Decisions after the first final one, ignored",
            ["kind"],
            registry=r,
        )
        self.malformed = Counter(
            "rmq_malformed_records", "Records skipped as malformed", ["topic"], registry=r
        )
        self.forged_markers = Counter(
            "rmq_forged_markers",
            "Done/check markers on the Op topic that no coordinator signed, ignored",
            ["reason"],
            registry=r,
        )
        self.duplicate_halves = Counter(
            "rmq_duplicate_halves",
            "Copies of a half record already read (its transaction id "
            "at another offset): rolled back, never promoted",
            registry=r,
        )
        self.aborted = Counter(
            "rmq_transactions_aborted",
            "Coordinator Kafka transactions aborted and replayed",
            registry=r,
        )
        self.pending = Gauge(
            "rmq_pending_transactions", "Pending half messages", ["partition"], registry=r
        )
        self.tracked = Gauge(
            "rmq_tracked_transactions",
            "Transactions held in memory (pending, recently decided, "
            "deferred), bounded by about one re-append horizon of traffic",
            ["partition"],
            registry=r,
        )
        self.reappended = Counter(
            "rmq_reappended",
            "Pending half messages written again past the re-append horizon",
            registry=r,
        )
        self.oldest_pending_age = Gauge(
            "rmq_oldest_pending_age_seconds",
            "Age of the oldest pending half message",
            ["partition"],
            registry=r,
        )
        self.promotion_latency = Histogram(
            "rmq_promotion_latency_seconds",
            "Half message born -> promoted",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.promotion_blocked = Gauge(
            "rmq_promotion_blocked",
            "1 while promotion is blocked for this reason (the last "
            "Kafka transaction aborted with records not taken in time); 0 once one commits",
            ["reason"],
            registry=r,
        )
        # Timer messages (coordinator/timer_service.py).
        self.timer_scheduled = Counter(
            "rmq_timer_scheduled", "Timer messages taken from the intake topic", registry=r
        )
        self.timer_delivered = Counter(
            "rmq_timer_delivered", "Timer messages delivered to their real topic", registry=r
        )
        self.timer_cancelled = Counter(
            "rmq_timer_cancelled",
            "Timer messages dropped, cancelled by their own group before their time",
            registry=r,
        )
        self.timer_cancel_too_late = Counter(
            "rmq_timer_cancel_too_late",
            "Cancels read after their message was delivered (among the last deliveries)",
            registry=r,
        )
        self.timer_skipped = Counter(
            "rmq_timer_skipped",
            "Timer records read again after their delivery committed (the broker lost that "
            "transaction's offsets), not delivered again",
            registry=r,
        )
        self.timer_reappended = Counter(
            "rmq_timer_reappended", "Timer records written again to a lower level", registry=r
        )
        self.timer_held = Gauge(
            "rmq_timer_held",
            "Timer messages held in memory, due within 1.25 s (the due-heap)",
            registry=r,
        )
        self.timer_lateness = Histogram(
            "rmq_timer_lateness_seconds",
            "Timer message due -> its delivery committed (visible to read_committed readers)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.timer_discarded = Counter(
            "rmq_timer_discarded",
            "Timer messages set aside in the discard topic",
            ["reason"],
            registry=r,
        )
        self.timer_cancels_held = Gauge(
            "rmq_timer_cancels_held",
            "Cancels (recalls) held in memory, at most timer_cancels_max per timer partition",
            registry=r,
        )
        self.timer_cancels_refused = Counter(
            "rmq_timer_cancels_refused",
            "Cancel records not held: past timer_cancels_max in their window (over_bound; the "
            "producer's recall_message raised) or written ahead of this clock (future)",
            ["reason"],
            registry=r,
        )
        self.timer_blocked = Gauge(
            "rmq_timer_blocked",
            "1 while the timer service cannot serve for this reason (its topics' partition "
            "counts differ) and waits; transactions and locks go on",
            ["reason"],
            registry=r,
        )
        self.timer_topic_problems = Counter(
            "rmq_timer_topic_problems",
            "Times the timer service found its topics unusable (each new state once)",
            ["reason"],
            registry=r,
        )
        self.lock_events = Counter(
            "rmq_lock_events", "Queue-lock grants/expiries/denials", ["event"], registry=r
        )
        for family, values in (
            (self.discarded, [str(d) for d in DiscardReason]),
            (self.rejected, REJECT_REASONS),
            (self.checks_answered, CHECK_ANSWERS),
            (self.lock_events, LOCK_EVENTS),
            (self.timer_discarded, [str(d) for d in DiscardReason]),
            (self.timer_blocked, TIMER_BLOCKED),
            (self.timer_topic_problems, TIMER_BLOCKED),
            (self.timer_cancels_refused, CANCEL_REFUSALS),
        ):
            for value in values:
                family.labels(value)

    def watch_partitions(
        self, service: str, total: Callable[[], int], owned: Callable[[], int]
    ) -> None:
        """``rmq_partitions`` / ``rmq_owned_partitions`` of ``service``, read at each scrape."""
        self.partitions.labels(service).set_function(total)
        self.owned_partitions.labels(service).set_function(owned)

    def forget_partition(self, partition: int) -> None:
        """Drop the per-partition gauges of a half/op partition this instance gave up."""
        for gauge in (self.pending, self.oldest_pending_age, self.tracked):
            with contextlib.suppress(KeyError):
                gauge.remove(str(partition))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        log.debug("metrics http: " + format, *args)


class MetricsServer:
    """Serves ``/metrics`` and ``/healthz`` on host:port (loopback by default) in a daemon
    thread. A port in use is a :class:`ConfigError`."""

    def __init__(
        self,
        metrics: CoordinatorMetrics,
        port: int,
        health: Callable[[], dict],
        host: str = "127.0.0.1",
    ) -> None:
        metrics_app = make_wsgi_app(metrics.registry)

        def app(environ: dict, start_response: Callable) -> list[bytes]:
            if environ.get("PATH_INFO") == "/healthz":
                status = health()
                ok = status.get("status") == "ok"
                start_response(
                    "200 OK" if ok else "503 Service Unavailable",
                    [("Content-Type", "application/json")],
                )
                return [json.dumps(status).encode()]
            return metrics_app(environ, start_response)

        try:
            self._server: WSGIServer = make_server(host, port, app, handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port {port}: cannot listen on {host}:{port} "
                f"({exc.strerror or exc}); pick a free port"
            ) from exc
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="rmq-metrics",
            daemon=True,
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def publish_partition_counters(
    metrics: CoordinatorMetrics,
    topics: SystemTopics,
    states: Mapping[int, PartitionState],
    age_due: bool,
) -> None:
    """Move what each partition's pure state counted since the last step into the metrics
    (and log its rejections); the oldest-pending age only when ``age_due`` (it scans)."""
    now = time.time()
    for p, state in states.items():
        for request, reason in state.rejections:
            log.warning(
                "%s[%d]@%d txn=%s rejected (half offset %d): %s",
                topics.op,
                p,
                request.op_offset,
                request.txn_id,
                request.half_offset,
                reason,
            )
        state.rejections.clear()
        for copy, first, txn_id in state.copies.read:
            log.warning(
                "%s[%d]@%d txn=%s: a copy of the half record at offset %d; rolled "
                "back, never promoted",
                topics.half,
                p,
                copy,
                txn_id,
                first,
            )
        state.copies.read.clear()
        metrics.duplicate_halves.inc(state.counters.get("duplicate_half", 0))
        for name, count in state.counters.items():
            if name.startswith("rejected_"):
                metrics.rejected.labels(name.removeprefix("rejected_")).inc(count)
            elif name.startswith("checks_answered_"):
                metrics.checks_answered.labels(name.removeprefix("checks_answered_")).inc(count)
            elif name in (
                "duplicate_decisions",
                "conflicting_decisions",
                "late_unknown",
                "unknown_ignored",
            ):
                metrics.conflicting.labels(name).inc(count)
        # Half records the parse accepted but the state could not: bad re-append headers, a
        # member contradicting the other members of its transaction.
        metrics.malformed.labels(topics.half).inc(
            state.counters.pop("malformed_reappend", 0) + state.counters.pop("malformed_member", 0)
        )
        state.counters.clear()
        metrics.pending.labels(str(p)).set(len(state.pending))
        metrics.tracked.labels(str(p)).set(state.tracked)
        if not state.pending:
            metrics.oldest_pending_age.labels(str(p)).set(0)
        elif age_due:
            oldest = min(e.half.born_ts for e in state.pending.values())
            metrics.oldest_pending_age.labels(str(p)).set(max(0.0, now - oldest / 1000))
