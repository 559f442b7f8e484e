"""The sidecar process, shaped like uvicorn's server: settings -> ``Server.run()``
(``startup()``, ``main_loop()``, ``shutdown()``) -> CLI.

Three services run in threads: the transaction service, the queue-lock service and (unless
``timer_service`` is off) the timer service. SIGTERM or
SIGINT sets the stop flag and the Kafka transaction in progress completes; a second SIGINT
forces an exit. A fatal error is one log line and exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from coordinator.lock_service import LockService
from coordinator.metrics import CoordinatorMetrics, MetricsServer
from coordinator.otel import configure_from_env
from coordinator.settings import CoordinatorSettings
from coordinator.timer_service import TimerService
from coordinator.txn_service import TransactionService
from rmq_semantics.errors import ConfigError, RmqError
from rmq_semantics.settings import add_arguments, add_kafka_arguments, kafka_conf_from_args, load

__all__ = ["HANDLED_SIGNALS", "Server", "register_cli"]

log = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long shutdown waits for the service threads to finish their current transaction.
JOIN_TIMEOUT_S = 60.0
# The main thread's wait slice: how late it notices a failed service (signals are at once).
TICK_S = 0.2
# A forced exit (second SIGINT) is an interrupted process.
FORCED_EXIT_CODE = 130


class Server:
    """Runs the transaction service, the queue-lock service and the timer service until
    stopped.

    ``run()`` is the whole life; ``startup()``, ``main_loop()`` and ``shutdown()`` are its
    steps. Settings come as a :class:`CoordinatorSettings` or as its fields' kwargs (the
    metrics server too: ``metrics_port``, ``metrics_host``).
    """

    def __init__(
        self, conf: dict, settings: CoordinatorSettings | None = None, **setting_values: Any
    ) -> None:
        if "bootstrap.servers" not in conf:
            raise ConfigError("conf needs 'bootstrap.servers'")
        if settings is not None and setting_values:
            raise ConfigError(
                f"Server: pass settings or setting kwargs, not both (got {sorted(setting_values)})"
            )
        self.conf = dict(conf)
        self.settings = settings or load(CoordinatorSettings, setting_values, env={})
        self.metrics = CoordinatorMetrics()
        self.stop_event = threading.Event()
        #: Set by a second SIGINT: shutdown stops waiting for the services.
        self.force_exit = False
        self.transactions = TransactionService(self.conf, self.settings, self.metrics)
        self.locks = LockService(self.conf, self.settings, metrics=self.metrics)
        self.timers: TimerService | None = None
        if self.settings.timer_service:
            self.timers = TimerService(self.conf, self.settings, self.metrics)
            timers = self.timers
            self.metrics.watch_partitions(
                "timers", lambda: timers.partition_count, lambda: len(timers.wheels)
            )
        txns = self.transactions
        self.metrics.watch_partitions(
            "transactions", lambda: txns.half_partition_count, lambda: len(txns.states)
        )
        self.metrics.watch_partitions(
            "locks",
            lambda: self.locks.request_partitions,
            lambda: len(self.locks.owned_partitions()),
        )
        self._errors: list[BaseException] = []
        self._threads: dict[str, threading.Thread] = {}
        self._http: MetricsServer | None = None

    # -- the life of the process -------------------------------------------------------------
    def run(self) -> int:
        """Start, serve until stopped, shut down; return the process exit code. From the main
        thread, SIGINT/SIGTERM are captured meanwhile (see :meth:`capture_signals`)."""
        with self.capture_signals():
            try:
                self.startup()
                self.main_loop()
            finally:
                self.shutdown()
        if self.force_exit:
            return FORCED_EXIT_CODE
        if self._errors:
            exc = self._errors[0]
            log.error("coordinator stopped: %s", exc if isinstance(exc, RmqError) else repr(exc))
            return 1
        log.info("coordinator stopped")
        return 0

    def startup(self) -> None:
        """Serve metrics (a port in use is a ConfigError, raised here) and start the services."""
        port, host = self.settings.metrics_port, self.settings.metrics_host
        if port is not None:
            self._http = MetricsServer(self.metrics, port, self.health, host=host)
            self._http.start()
            log.info("metrics on http://%s:%d/metrics, health on /healthz", host, self._http.port)
        self._start_service("rmq-transactions", self.transactions.run)
        self._start_service("rmq-locks", self.locks.run)
        if self.timers is not None:
            self._start_service("rmq-timers", self.timers.run)

    def main_loop(self) -> None:
        """Wait until a signal, :meth:`stop` or a failed service sets the stop flag."""
        while not self.stop_event.wait(TICK_S):
            pass

    def shutdown(self) -> None:
        """Stop every service after its current transaction, then the metrics server.
        A second SIGINT stops the waiting. Idempotent; safe after a failed startup."""
        self.stop()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for thread in self._threads.values():
            while thread.is_alive() and not self.force_exit and time.monotonic() < deadline:
                thread.join(TICK_S)
        # Each service releases its Kafka clients as its run() returns.
        if self._http is not None:
            self._http.close()
            self._http = None

    def stop(self) -> None:
        """Ask every service to stop after its current transaction. Idempotent."""
        self.stop_event.set()

    # -- signals (uvicorn's capture_signals / handle_exit) -----------------------------------
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Inside, SIGINT/SIGTERM go to :meth:`handle_exit`; on leaving, the previous handlers
        are back. Only the main thread may set handlers: elsewhere this does nothing.

        Unlike uvicorn, a captured signal is not raised again on leaving: a graceful stop
        is exit code 0, which Docker, systemd and the tests expect.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                # None: a handler set outside Python, which cannot be put back; use default.
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def handle_exit(self, signum: int, _frame: FrameType | None) -> None:
        """First SIGINT/SIGTERM: stop after the current transaction. SIGINT while already
        stopping: force (shutdown stops waiting for the services)."""
        if signum == signal.SIGINT and self.stop_event.is_set():
            self.force_exit = True
            log.error("second interrupt: exiting without finishing the transaction")
            return
        log.info(
            "signal %s: finishing the current transaction, then stopping",
            signal.Signals(signum).name,
        )
        self.stop()

    # -- services ------------------------------------------------------------------------------
    def _start_service(self, name: str, target: Callable[[threading.Event], None]) -> None:
        def body() -> None:
            try:
                target(self.stop_event)
            except BaseException as exc:  # reported by run(); the process must stop
                self._errors.append(exc)
                self.stop_event.set()

        thread = threading.Thread(target=body, name=name, daemon=True)
        self._threads[name] = thread
        thread.start()

    def _service_status(
        self,
        name: str,
        ready: threading.Event,
        idle: threading.Event | None = None,
        blocked: threading.Event | None = None,
    ) -> str:
        thread = self._threads.get(name)
        if thread is None:
            return "not started"
        if not thread.is_alive():
            return "stopped"
        if idle is not None and idle.is_set():
            return "idle"
        if blocked is not None and blocked.is_set():
            return "blocked"
        return "ok" if ready.is_set() else "starting"

    def health(self) -> dict:
        """/healthz: ``ok`` only while every service runs and is ready."""
        services = {
            "transactions": self._service_status("rmq-transactions", self.transactions.ready),
            "locks": self._service_status("rmq-locks", self.locks.ready),
        }
        if self.timers is not None:
            services["timers"] = self._service_status(
                "rmq-timers", self.timers.ready, self.timers.idle, self.timers.blocked
            )
        # An idle timer service (no timer topic yet) is healthy: nothing is scheduled. A
        # blocked one (its topics unusable) too: a restart would not help and would stop the
        # others; rmq_timer_blocked says it.
        ok = all(s in ("ok", "idle", "blocked") for s in services.values()) and not self._errors
        return {
            "status": "ok" if ok else "unhealthy",
            "services": services,
            "instance_id": self.transactions.instance_id,
            "owned_partitions": sorted(self.transactions.states),
            "owned_lock_partitions": self.locks.owned_partitions(),
        }

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cmd_coordinator(args: argparse.Namespace) -> int:
    server = Server(kafka_conf_from_args(args), load(CoordinatorSettings, args))
    tracer_provider = configure_from_env()  # the [otel] extra and OTEL_* only
    # Everything imported so far lives as long as the process: frozen, it is no longer
    # scanned by full collections, whose pauses on the promotion path it shortens
    # (docs/design/measurements.md).
    gc.freeze()
    code = server.run()
    if tracer_provider is not None:
        tracer_provider.shutdown()  # exports the spans still batched
    if server.force_exit:
        # Do not wait for librdkafka to tear down clients still inside a call.
        logging.shutdown()
        os._exit(code)
    return code


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "coordinator",
        help="run the sidecar coordinator (transactions, queue locks and timer messages)",
    )
    add_kafka_arguments(parser)
    add_arguments(parser, CoordinatorSettings)
    parser.set_defaults(func=_cmd_coordinator)
