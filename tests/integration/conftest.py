"""The integration suites' own session fixtures (the plain broker is tests/conftest.py's)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_semantics.embedded import EmbeddedKafka, free_port
from tests.integration.tenancy_helpers import ADVERSARIES, USERS, denied_principals


@pytest.fixture(scope="session")
def secured_broker() -> Iterator[tuple[EmbeddedKafka, Path]]:
    """One SASL broker with Kafka's ACL authorizer (as Kafka ships it: what no ACL allows is
    denied) for every tenancy file: (broker, a folder for the tenants files). Each
    deployment on it has a topic prefix of its own."""
    data_dir = Path(tempfile.mkdtemp(prefix="rmq-test-tenancy-kafka-"))
    broker = EmbeddedKafka(data_dir / "kafka", port=free_port(), sasl_users=USERS, acls=True)
    try:
        broker.start()
        yield broker, data_dir
        # After every tenancy file: the broker refused nothing to a principal that runs a
        # product class under its generated ACLs; only the adversary's attacks.
        denied = {
            p: lines[:3] for p, lines in denied_principals(broker).items() if p not in ADVERSARIES
        }
        assert denied == {}, f"the broker denied legitimate principals: {denied}"
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
