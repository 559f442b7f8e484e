"""The coordinator's process shell without a broker: signal capture, health, and the metrics
settings (kwargs, CLI flags, env)."""

from __future__ import annotations

import signal
import socket
import threading

import pytest

from coordinator.server import HANDLED_SIGNALS, Server
from coordinator.settings import CoordinatorSettings
from rmq_semantics.cli import build_parser
from rmq_semantics.errors import ConfigError
from rmq_semantics.settings import load

CONF = {"bootstrap.servers": "127.0.0.1:1"}


@pytest.fixture
def own_handlers():
    """Known handlers before each test, the original ones back after it."""
    calls: list[int] = []

    def previous(signum, _frame):
        calls.append(signum)

    saved = {sig: signal.signal(sig, previous) for sig in HANDLED_SIGNALS}
    yield previous, calls
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_capture_signals_routes_real_signals_and_restores_the_previous_handlers(own_handlers):
    previous, calls = own_handlers
    server = Server(CONF)
    with server.capture_signals():
        assert all(signal.getsignal(sig) == server.handle_exit for sig in HANDLED_SIGNALS)
        signal.raise_signal(signal.SIGTERM)  # delivered to this (the main) thread
        assert server.stop_event.is_set() and not server.force_exit
    assert all(signal.getsignal(sig) is previous for sig in HANDLED_SIGNALS)
    signal.raise_signal(signal.SIGINT)
    assert calls == [signal.SIGINT]  # the restored handler got it, not the server


def test_a_second_sigint_forces_and_a_repeated_sigterm_does_not(own_handlers):
    server = Server(CONF)
    with server.capture_signals():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        assert server.stop_event.is_set() and not server.force_exit
        signal.raise_signal(signal.SIGINT)
        assert server.force_exit


def test_capture_signals_outside_the_main_thread_leaves_handlers_alone(own_handlers):
    previous, _ = own_handlers
    server = Server(CONF)
    seen: list[object] = []

    def in_thread():
        with server.capture_signals():
            seen.extend(signal.getsignal(sig) for sig in HANDLED_SIGNALS)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(10)
    assert seen == [previous, previous]


def test_a_metrics_port_in_use_fails_startup_and_restores_the_handlers(own_handlers):
    previous, _ = own_handlers
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        server = Server(CONF, metrics_port=taken.getsockname()[1])
        with pytest.raises(ConfigError, match="--metrics-port"):
            server.run()
    assert all(signal.getsignal(sig) is previous for sig in HANDLED_SIGNALS)
    assert server.health()["services"] == {
        "transactions": "not started",
        "locks": "not started",
        "timers": "not started",
    }


def test_health_covers_every_service():
    status = Server(CONF).health()
    assert status["status"] == "unhealthy"
    assert set(status["services"]) == {"transactions", "locks", "timers"}


def test_a_blocked_timer_service_leaves_the_coordinator_healthy():
    """Issue 44, item 3: timer topics a tenant made unusable stop timer messages only; a
    restart would not help, so /healthz stays ok and says which service is blocked."""
    server, done = Server(CONF), threading.Event()
    for name, ready in (
        ("rmq-transactions", server.transactions.ready),
        ("rmq-locks", server.locks.ready),
        ("rmq-timers", threading.Event()),
    ):
        server._threads[name] = threading.Thread(target=done.wait, args=(30,), daemon=True)
        server._threads[name].start()
        ready.set()
    assert server.timers is not None
    server.timers.blocked.set()
    try:
        status = server.health()
        assert status["status"] == "ok" and status["services"]["timers"] == "blocked"
    finally:
        done.set()


def test_the_timer_service_can_be_turned_off():
    server = Server(CONF, timer_service=False)
    assert server.timers is None
    assert set(server.health()["services"]) == {"transactions", "locks"}


def test_server_takes_settings_or_setting_kwargs_not_both():
    assert Server(CONF, metrics_port=0).settings.metrics_port == 0
    with pytest.raises(ConfigError, match="not both"):
        Server(CONF, CoordinatorSettings(), metrics_port=9400)


def test_metrics_settings_default_to_off_on_loopback():
    settings = load(CoordinatorSettings, {}, env={})
    assert (settings.metrics_port, settings.metrics_host) == (None, "127.0.0.1")


def test_metrics_settings_from_kwargs_env_and_flags():
    s = load(CoordinatorSettings, {"metrics_port": 9400, "metrics_host": "0.0.0.0"}, env={})
    assert (s.metrics_port, s.metrics_host) == (9400, "0.0.0.0")
    s = load(
        CoordinatorSettings, {}, env={"RMQ_METRICS_PORT": "9401", "RMQ_METRICS_HOST": "10.0.0.1"}
    )
    assert (s.metrics_port, s.metrics_host) == (9401, "10.0.0.1")
    args = build_parser().parse_args(
        [
            "coordinator",
            "--bootstrap-servers",
            "b:9092",
            "--metrics-port",
            "9402",
            "--metrics-host",
            "::1",
        ]
    )
    s = load(CoordinatorSettings, args, env={"RMQ_METRICS_PORT": "1"})
    assert (s.metrics_port, s.metrics_host) == (9402, "::1")  # a flag wins over env


@pytest.mark.parametrize(
    "values, message",
    [
        ({"metrics_port": 70000}, "metrics_port must be a port number"),
        ({"metrics_port": "x"}, "metrics_port='x'"),
        ({"metrics_host": ""}, "metrics_host must be a non-empty address"),
    ],
)
def test_bad_metrics_settings_name_the_field(values, message):
    with pytest.raises(ConfigError, match=message):
        load(CoordinatorSettings, values, env={})
