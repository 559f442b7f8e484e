"""The container suite's stack: a user-defined Docker network, the project's Kafka image on
it (alias ``kafka``, also published on a loopback port for the test process) and the
coordinator image, checked once. No engine: skipped, unless RMQ_REQUIRE=docker (CI), where
it is a failure. Everything started here is removed on leaving, also on failure."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from tests.containers.coordinator_container import coordinator_image
from tests.kafka_container import docker_answers, ensure_kafka_image, kafka_container
from tests.require import missing

os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"


class Stack:
    def __init__(self, network, bootstrap: str) -> None:
        self.network = network
        self.bootstrap = bootstrap
        self.kafka_inside = "kafka:9092"

    def conf(self, **extra: object) -> dict:
        return {"bootstrap.servers": self.bootstrap, **extra}


def _no_engine(why: str) -> None:
    missing("docker", why)


@pytest.fixture
def announce(request: pytest.FixtureRequest):
    """Print into the test log even while pytest captures output."""

    def say(line: str) -> None:
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(line, flush=True)

    return say


def _require_images(*names: str) -> str:
    """Fail (no engine is a failure here) unless ``names`` are built; return the Kafka image."""
    import docker

    client = docker.from_env(timeout=10)
    try:
        for name in names:
            try:
                client.images.get(name)
            except docker.errors.ImageNotFound:
                _no_engine(f"no image {name} (make images builds it)")
    finally:
        client.close()
    kafka, why_not = ensure_kafka_image()
    if kafka is None:
        _no_engine(why_not)
    return kafka


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    if not docker_answers():
        _no_engine("no Docker engine answers (make test-docker sets one up)")
    from testcontainers.core.network import Network

    image = _require_images(coordinator_image())
    network = Network().create()
    try:
        with kafka_container(image, network=network) as bootstrap:
            capture = request.config.pluginmanager.get_plugin("capturemanager")
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                print(
                    f"\nkafka broker: testcontainers ({image} at {bootstrap}, "
                    f"kafka:9092 on network {network.name}); coordinator image "
                    f"{coordinator_image()}",
                    flush=True,
                )
            yield Stack(network, bootstrap)
    finally:
        with contextlib.suppress(Exception):
            network.remove()


@pytest.fixture(scope="session")
def compose_images() -> dict[str, str]:
    """The images docker/compose.yaml runs here (``make test-docker-full`` builds them), and
    a compose plugin; skipped without them, a failure under RMQ_REQUIRE=docker."""
    import subprocess

    if not docker_answers():
        _no_engine("no Docker engine answers (make test-docker-full sets one up)")
    try:
        version = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _no_engine(f"`docker compose version` failed: {exc}")
    if version.returncode != 0:
        _no_engine("no docker compose plugin (docker/engine.sh ensure builds it)")
    images = {
        "coordinator": coordinator_image(),
        "spark": coordinator_image().replace("-coordinator:", "-spark:"),
    }
    return {**images, "kafka": _require_images(*images.values())}
