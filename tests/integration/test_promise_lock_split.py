"""A consumer holding very many queues still gets its locks (issue 29): the lock service
refuses a request whose reply could pass its limit, so ``LockClient`` splits a big call
into requests the service answers."""

from __future__ import annotations

import pytest

from rmq_semantics.lock_client import LockClient
from tests.integration.txn_helpers import ThreadCoordinator

pytestmark = pytest.mark.integration


def test_four_thousand_queues_on_one_lock_partition_are_all_granted(broker, unique):
    prefix = unique("ls").replace("-", "")
    conf = broker.conf()
    group = unique("g")
    # The service checks names and partition numbers, not that the topics exist: 4 topics
    # of 30 characters with 1,000 queues each, all on the one request partition.
    queues = [(unique(f"orders-{t}").ljust(30, "x"), p) for t in range(4) for p in range(1000)]
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, half_partitions=1) as coordinator,
        LockClient(conf, topic_prefix=prefix) as client,
    ):
        grants = client.lock(group, queues, 60000, timeout=30)
        assert coordinator.server.locks.counts["invalid_request"] == 0
        assert len(grants) == 4000 and all(g.granted for g in grants.values())
        released = client.unlock(group, queues, timeout=30)
        assert all(released.values())
