"""Session fixtures: one real Kafka broker for the whole run, and factories with unique names.

Broker choice, in order: ``RMQ_BOOTSTRAP_SERVERS`` (an existing cluster); when a Docker engine
answers, the project's Kafka image under testcontainers (tests/kafka_container.py; when no
image can be had, one line says why); else the embedded Apache Kafka on a free port. The path
taken is printed when the broker starts ("kafka broker: ...").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rmq_semantics.embedded import EmbeddedKafka, free_port, kafka_version
from rmq_semantics.topics import ensure_topics
from tests.group_protocol import GROUP_PROTOCOL
from tests.kafka_container import docker_answers, ensure_kafka_image, kafka_container
from tests.model import profiles

# Spark's Python workers must be this interpreter (the venv has fastavro); the driver binds
# to loopback only.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The model-based tests' Hypothesis profile: HYPOTHESIS_PROFILE, else ci (tests/model).
profiles.load()


class Broker:
    """What tests need to know about the broker; ``restart`` only for the embedded one."""

    def __init__(self, bootstrap: str, kind: str, embedded: EmbeddedKafka | None = None):
        self.bootstrap = bootstrap
        self.kind = kind
        self.embedded = embedded

    def conf(self, **extra: object) -> dict:
        conf: dict = {"bootstrap.servers": self.bootstrap}
        if self.embedded is not None:
            conf = self.embedded.client_conf()
        conf.update(extra)
        return conf


_BROKER_KIND = "none"


def pytest_report_header(config: pytest.Config) -> list[str]:
    protocol = f"user consumer groups: group.protocol={GROUP_PROTOCOL}"
    if os.environ.get("RMQ_BOOTSTRAP_SERVERS"):
        return [
            f"kafka broker: existing cluster at {os.environ['RMQ_BOOTSTRAP_SERVERS']}",
            protocol,
        ]
    return [
        "kafka broker: testcontainers (the project's Kafka image) if a Docker engine "
        "answers, else embedded Apache Kafka",
        protocol,
    ]


def _announce(request: pytest.FixtureRequest, line: str) -> None:
    """Into the test log even while pytest captures output (the broker is chosen lazily)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(line, flush=True)


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    if os.environ.get("RMQ_BOOTSTRAP_SERVERS"):
        yield Broker(os.environ["RMQ_BOOTSTRAP_SERVERS"], "existing")
        return
    # The version matrix (make test-matrix) runs the embedded jars of the version it names
    # (not RMQ_KAFKA_*: those env vars are Kafka client options of the coordinator).
    version = os.environ.get("RMQ_TEST_KAFKA_VERSION") or None
    if version is None and docker_answers():
        image, why_not = ensure_kafka_image(lambda line: _announce(request, line))
        if image is not None:
            with kafka_container(image) as bootstrap:
                _announce(request, f"\nkafka broker: testcontainers ({image} at {bootstrap})")
                yield Broker(bootstrap, "testcontainers")
            return
        _announce(
            request,
            f"\nkafka broker: a Docker engine answers but no Kafka image: "
            f"{why_not}; using the embedded broker",
        )
    data_dir = Path(tempfile.mkdtemp(prefix="rmq-test-kafka-"))
    embedded = EmbeddedKafka(data_dir, port=free_port(), version=version)
    try:
        embedded.start()
        _announce(
            request,
            f"\nkafka broker: embedded Apache Kafka "
            f"{version or kafka_version()} at {embedded.bootstrap}",
        )
        yield Broker(embedded.bootstrap, "embedded", embedded)
    finally:
        embedded.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique names for topics, groups and prefixes, so tests never see each other's data."""

    def make(stem: str) -> str:
        return f"{stem}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def make_topic(broker: Broker, unique: Callable[[str], str]) -> Callable[..., str]:
    def make(stem: str = "t", partitions: int = 1, name: str | None = None) -> str:
        topic = name or unique(stem)
        ensure_topics(broker.conf(), {topic: (partitions, {})})
        return topic

    return make
