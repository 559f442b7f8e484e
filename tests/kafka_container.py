"""The testcontainers path of the session broker: the project's own Kafka image.

testcontainers' ``KafkaContainer`` drives Confluent images only, and no registry may be
reachable, so the image is ours (``RMQ_KAFKA_IMAGE``, default ``rmq-semantics-kafka:<the
pinned Kafka version>``, built on demand by ``docker/images.sh kafka``), run with a plain
``DockerContainer``. Ryuk (the reaper) would be pulled from a registry: it is disabled and
the container is removed here, also when the broker never becomes ready.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from rmq_semantics.embedded import free_port, kafka_version

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 180.0
# A cold build makes a Debian base and resolves the Kafka jars first.
BUILD_TIMEOUT_S = 1200.0
# What the embedded broker sets for the tests too: fast group joins, dead transactions
# aborted within a second.
BROKER_ENV = {
    "KAFKA_NUM_PARTITIONS": "1",
    "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "10",
    "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "10",
    "KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
    # As the embedded broker's, for groups under group.protocol=consumer (KIP-848).
    "KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS": "1000",
    "KAFKA_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "6000",
    "KAFKA_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": "500",
    "KAFKA_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
    "KAFKA_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "1000",
}


def docker_answers() -> bool:
    try:
        import docker  # testcontainers' dependency

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def kafka_image_name() -> str:
    return os.environ.get("RMQ_KAFKA_IMAGE") or f"rmq-semantics-kafka:{kafka_version()}"


def ensure_kafka_image(announce: Callable[[str], None] = print) -> tuple[str | None, str]:
    """(image, "") when the Kafka image exists or was just built, else (None, why not)."""
    import docker

    image = kafka_image_name()
    client = docker.from_env(timeout=10)
    try:
        client.images.get(image)
        return image, ""
    except docker.errors.ImageNotFound:
        pass
    finally:
        client.close()
    announce(f"\nkafka image {image} missing: building it (docker/images.sh kafka)")
    env = {**os.environ, "PYTHON": sys.executable, "RMQ_KAFKA_IMAGE": image}
    try:
        proc = subprocess.run(
            [str(REPO / "docker" / "images.sh"), "kafka"],
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None, f"building {image} took over {BUILD_TIMEOUT_S:.0f} s"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return None, f"building {image} failed: {lines[-1] if lines else proc.returncode}"
    return image, ""


def _await_ready(container, bootstrap: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    # Into Python logging (pytest shows it on failure), not a stderr line per refused
    # connection while the broker is still starting.
    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "logger": log, "socket.connection.setup.timeout.ms": 2000}
    )
    wrapped = container.get_wrapped_container()
    while time.monotonic() < deadline:
        wrapped.reload()
        if wrapped.status == "exited":
            tail = wrapped.logs(tail=5).decode(errors="replace").strip()
            raise RuntimeError(f"the Kafka container exited: {tail}")
        try:
            if admin.list_topics(timeout=2.0).brokers:  # blocks up to 2 s: the poll interval
                return
        except KafkaException:
            pass
    raise RuntimeError(f"the Kafka container did not answer within {timeout_s:.0f} s")


@contextlib.contextmanager
def kafka_container(image: str, network=None, alias: str = "kafka") -> Iterator[str]:
    """Run ``image`` as a one-node broker on a free loopback port; yield its bootstrap.
    With ``network`` (a testcontainers ``Network``) other containers on it reach the broker
    as ``<alias>:9092``."""
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from testcontainers.core.container import DockerContainer

    port = free_port()
    # On a shared network the in-container listener is advertised under the alias, which
    # resolves for the broker itself and for its neighbours alike.
    internal = alias if network is not None else "localhost"
    # Two listeners: the broker reaches itself (transaction verification) on PLAINTEXT inside
    # the container; the host's clients on HOST, advertised as the published loopback port.
    container = (
        DockerContainer(image)
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093,HOST://:29092")
        .with_env(
            "KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://{internal}:9092,HOST://127.0.0.1:{port}"
        )
        .with_env(
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,HOST:PLAINTEXT",
        )
        .with_envs(**BROKER_ENV)
    )
    # Published on loopback only (docker-py's (host_ip, port) form; with_bind_ports would
    # publish on every interface). The port is chosen first: the broker advertises it.
    container.ports["29092/tcp"] = ("127.0.0.1", port)
    if network is not None:
        container.with_network(network).with_network_aliases(alias)
    try:
        container.start()
        bootstrap = f"127.0.0.1:{port}"
        _await_ready(container, bootstrap, READY_TIMEOUT_S)
        yield bootstrap
    finally:
        with contextlib.suppress(Exception):  # gone already, or the engine went away
            container.stop()
