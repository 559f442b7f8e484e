"""A 3-node KRaft cluster for the whole session (make test-cluster).

Its own data dir under tmp and free ports; every node is stopped by the pid in its data dir
in teardown, also when a test or the start failed. ``broker`` is overridden so the shared
factories (``make_topic``) create topics on the cluster, replicated three times.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_semantics.kafka_cluster import EmbeddedCluster
from tests.campaign.namespaces import node_prefix
from tests.conftest import Broker

BROKERS = 3


@pytest.fixture(scope="session")
def cluster() -> Iterator[EmbeddedCluster]:
    data_dir = Path(tempfile.mkdtemp(prefix="rmq-test-cluster-"))
    # Each node under a group id of its own, which the nemesis's partitions match.
    cluster = EmbeddedCluster(data_dir, brokers=BROKERS, node_prefix=node_prefix)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop(kill=False)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def broker(cluster: EmbeddedCluster) -> Broker:
    return Broker(cluster.bootstrap, "cluster")
