"""The coordinator image as a sidecar container next to the Kafka container, for the suite.

Runs ``rmq-semantics-coordinator:<version>`` (built by ``make images``) with testcontainers'
``DockerContainer`` on the network shared with Kafka. The container is removed on leaving,
also when a test fails; Ryuk (pulled from a registry) is disabled by the suite's conftest.
"""

from __future__ import annotations

import contextlib
import re
import time
import tomllib
from pathlib import Path

from testcontainers.core.container import DockerContainer

from rmq_semantics.settings import flag_name

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0
# The image's own HEALTHCHECK runs every 15 s; the tests check every second (nanoseconds).
FAST_HEALTHCHECK = {
    "test": ["CMD", "python", "-m", "coordinator.healthcheck"],
    "interval": 1_000_000_000,
    "timeout": 5_000_000_000,
    "retries": 3,
    "start_period": 60_000_000_000,
}
PARTITIONS_LINE = re.compile(r"(assigned|revoked) half/op partitions \[([0-9, ]*)\]")


def coordinator_image() -> str:
    with open(REPO / "pyproject.toml", "rb") as f:
        return f"rmq-semantics-coordinator:{tomllib.load(f)['project']['version']}"


class CoordinatorContainer:
    """One coordinator replica; ``settings`` are CoordinatorSettings fields (CLI flags)."""

    def __init__(
        self, network, kafka: str, name: str, env: dict[str, str] | None = None, **settings: object
    ) -> None:
        args = ["--bootstrap-servers", kafka]
        for key, value in settings.items():
            args += [flag_name(key), str(value)]
        self.name = name
        self.container = (
            DockerContainer(coordinator_image())
            .with_name(name)
            .with_network(network)
            .with_command(args)
            .with_kwargs(healthcheck=FAST_HEALTHCHECK)
        )
        for key, value in (env or {}).items():
            self.container.with_env(key, value)

    def __enter__(self) -> CoordinatorContainer:
        self.container.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    @property
    def wrapped(self):
        return self.container.get_wrapped_container()

    def logs(self) -> str:
        return self.wrapped.logs().decode(errors="replace")

    def wait_log(self, pattern: str, timeout_s: float = START_TIMEOUT_S) -> str:
        """Poll the container's log until ``pattern`` (a regex) appears; fail if it exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.logs()
            if re.search(pattern, text):
                return text
            self.wrapped.reload()
            if self.wrapped.status == "exited":
                break
            time.sleep(0.2)
        raise AssertionError(
            f"{self.name}: no log line /{pattern}/ within {timeout_s:.0f} s "
            f"(status {self.wrapped.status}):\n{self.logs()[-3000:]}"
        )

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.wrapped.reload()
            health = self.wrapped.attrs["State"].get("Health", {}).get("Status")
            if health == "healthy":
                return
            if self.wrapped.status == "exited":
                break
            time.sleep(0.2)
        raise AssertionError(f"{self.name} did not turn healthy:\n{self.logs()[-3000:]}")

    def owned_partitions(self) -> set[int]:
        """The half/op partitions this replica holds now, from its assign/revoke log lines."""
        owned: set[int] = set()
        for kind, numbers in PARTITIONS_LINE.findall(self.logs()):
            parts = {int(n) for n in numbers.split(",") if n.strip()}
            owned = owned | parts if kind == "assigned" else owned - parts
        return owned

    def kill(self) -> None:
        self.wrapped.kill()
        self.wrapped.wait(timeout=60)

    def stop(self, grace_s: int) -> int:
        """``docker stop -t grace_s``: SIGTERM, SIGKILL after the grace. The exit code."""
        self.wrapped.stop(timeout=grace_s)
        return self.wrapped.wait(timeout=grace_s + 30)["StatusCode"]

    def remove(self) -> None:
        with contextlib.suppress(Exception):  # never started, or gone already
            self.wrapped.remove(force=True)


class OtlpReceiverContainer(CoordinatorContainer):
    """An OTLP/HTTP receiver on port 4318 of the shared network (``otlp_receiver_main.py`` in
    a container of the coordinator image): ``wait_log(r"span promote <trace id>")``."""

    def __init__(self, network, name: str) -> None:
        self.name = name
        script = (Path(__file__).parent / "otlp_receiver_main.py").read_text()
        self.container = (
            DockerContainer(coordinator_image())
            .with_name(name)
            .with_network(network)
            .with_kwargs(entrypoint=["python", "-c", script], healthcheck={"test": ["NONE"]})
        )
