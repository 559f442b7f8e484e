"""The ``failover`` case (``bench --brokers 3``): commit-to-visible latency while the node
that leads the most half/op partitions fails halfway through the latency case's load, once
SIGKILLed and once stopped cleanly (controlled shutdown moves its leaderships first). The
node is started again after each run. With one broker there is nothing to fail over to, and
the case records nothing."""

from __future__ import annotations

import time
from collections import Counter

from confluent_kafka.admin import AdminClient

from benchmarks.common import BenchSettings
from benchmarks.txn import bench_latency
from rmq_semantics.kafka_cluster import EmbeddedCluster
from rmq_semantics.topics import SystemTopics

__all__ = ["bench_failover"]

# How long the metadata call that picks the victim may take.
METADATA_TIMEOUT_S = 10.0


def _busiest_half_op_leader(conf: dict, prefix: str) -> int:
    topics = SystemTopics(prefix)
    meta = AdminClient(conf).list_topics(timeout=METADATA_TIMEOUT_S).topics
    leaders = Counter(
        p.leader for t in (topics.half, topics.op) for p in meta[t].partitions.values()
    )
    return leaders.most_common(1)[0][0]


def bench_failover(
    conf: dict, prefix: str, s: BenchSettings, cluster: EmbeddedCluster, kill: bool
) -> dict:
    """One latency run with the busiest half/op leader failing halfway: the latency samples
    (ms), which node failed, how long the node took to stop, and the rate achieved."""
    failed: dict[str, float] = {}

    def fault() -> None:
        node = _busiest_half_op_leader(conf, prefix)
        began = time.monotonic()
        cluster.stop(node, kill=kill)
        failed.update(node=node, stop_s=time.monotonic() - began)

    try:
        latencies, achieved = bench_latency(conf, prefix, s, fault=fault)
    finally:
        if "node" in failed:
            cluster.start_node(int(failed["node"]))
    return {
        "samples": latencies,
        "achieved_msgs_per_s": achieved,
        "node_stop_s": round(failed.get("stop_s", 0.0), 2),
    }
