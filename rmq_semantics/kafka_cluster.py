"""A multi-node Apache Kafka (KRaft) cluster on 127.0.0.1, from the embedded broker's jars.

Every node is broker and controller, node ids 1..N with a static voter set, each in its own
``node-I`` dir under the cluster's data dir (laid out like a one-node data dir). The file
``cluster.json`` there keeps the node count, version, cluster id and ports; the controller
ports are fixed at creation because they are the voter set, so a stopped node comes back on
the same ones.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.embedded import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    EmbeddedKafka,
    free_port,
    new_cluster_id,
    port_free,
)
from rmq_semantics.errors import EmbeddedKafkaError
from rmq_semantics.kafka_jars import checked_version, kafka_version
from rmq_semantics.topics import replication_for

__all__ = ["CLUSTER_FILE", "ClusterNode", "EmbeddedCluster", "is_cluster_dir"]

CLUSTER_FILE = "cluster.json"
# Three JVMs share 2 cores: 512 MiB each is plenty for test loads (the single node keeps 768m),
# and one GC thread each keeps three collectors from fighting over the cores.
NODE_HEAP = "512m"
NODE_JVM_OPTIONS = ["-XX:ParallelGCThreads=1", "-XX:ConcGCThreads=1"]
# Kafka's defaults (3 network, 8 I/O threads per node) mean 30+ busy threads on 2 cores.
NODE_THREADS = {
    "num.network.threads": "2",
    "num.io.threads": "3",
    "num.replica.fetchers": "1",
    "background.threads": "4",
    "log.cleaner.threads": "1",
    "num.recovery.threads.per.data.dir": "1",
}
METADATA_POLL_S = 2.0


def is_cluster_dir(data_dir: Path) -> bool:
    return (Path(data_dir).expanduser() / CLUSTER_FILE).exists()


@dataclass
class ClusterNode(EmbeddedKafka):
    """One node of an :class:`EmbeddedCluster`: a one-node broker with its cluster's ids,
    voter set, replication defaults and the smaller heap and thread pools."""

    node_id: int = 1
    brokers: int = 1
    controller_port_fixed: int = 0
    voters: str = ""
    cluster_id: str = ""

    def _controller_port(self, state: dict) -> int:
        if not port_free(self.controller_port_fixed):
            raise EmbeddedKafkaError(
                f"controller port {self.controller_port_fixed} of node {self.node_id} is in "
                "use; it is part of the cluster's voter set, so free it first"
            )
        return self.controller_port_fixed

    def _jvm_extra(self) -> list[str]:
        return list(NODE_JVM_OPTIONS)

    def _new_cluster_id(self) -> str:
        return self.cluster_id

    def _properties(self, controller_port: int) -> dict[str, str]:
        lines = super()._properties(controller_port)
        factor, min_isr = (str(n) for n in replication_for(self.brokers))
        lines.update(
            {
                "node.id": str(self.node_id),
                "controller.quorum.voters": self.voters,
                "offsets.topic.replication.factor": factor,
                "transaction.state.log.replication.factor": factor,
                "transaction.state.log.min.isr": min_isr,
                "share.coordinator.state.topic.replication.factor": factor,
                "share.coordinator.state.topic.min.isr": min_isr,
                "default.replication.factor": factor,
                "min.insync.replicas": min_isr,
                **NODE_THREADS,
            }
        )
        return lines

    @property
    def pid(self) -> int | None:
        return self.running_pid()


class EmbeddedCluster:
    """N KRaft nodes in ``data_dir``; ``brokers``/``port``/``version`` matter on creation
    only (later they are read from ``cluster.json``; a contradicting value is an error).

    ``port`` is the first node's listener port (node I listens on ``port + I - 1``); None
    picks free ports. ``start()`` returns the bootstrap list of all nodes.
    ``node_prefix(node_id)`` gives the words put before a node's ``java`` (a fault test runs
    each node under its own group id); None: none.
    """

    def __init__(
        self,
        data_dir: Path | str,
        brokers: int | None = None,
        port: int | None = None,
        version: str | None = None,
        heap: str = NODE_HEAP,
        node_prefix: Callable[[int], Sequence[str]] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.heap = heap
        self.node_prefix = node_prefix
        self._layout = self._load_or_plan(brokers, port, version)

    # -- layout ---------------------------------------------------------------------------
    @property
    def _file(self) -> Path:
        return self.data_dir / CLUSTER_FILE

    def _load_or_plan(self, brokers: int | None, port: int | None, version: str | None) -> dict:
        if self._file.exists():
            try:
                layout = json.loads(self._file.read_text())
            except (OSError, ValueError) as exc:
                raise EmbeddedKafkaError(
                    f"{self._file} is corrupt ({exc}); remove the data "
                    "dir or choose another --data-dir"
                ) from exc
            for name, wanted in (("brokers", brokers), ("version", version)):
                if wanted is not None and wanted != layout[name]:
                    raise EmbeddedKafkaError(
                        f"the cluster in {self.data_dir} has {name}={layout[name]}, not "
                        f"{wanted}; choose another --data-dir for a different cluster"
                    )
            return layout
        if brokers is None or brokers < 1:
            raise EmbeddedKafkaError(
                f"no cluster in {self.data_dir} ({self._file} is "
                "missing); start one with --brokers N"
            )
        ports = (
            [port + i for i in range(brokers)]
            if port is not None
            else [free_port() for _ in range(brokers)]
        )
        return {
            "brokers": brokers,
            "version": checked_version(version or kafka_version()),
            "cluster_id": new_cluster_id(),
            "nodes": [
                {"id": i + 1, "port": p, "controller_port": free_port()}
                for i, p in enumerate(ports)
            ],
        }

    @property
    def brokers(self) -> int:
        return int(self._layout["brokers"])

    @property
    def version(self) -> str:
        return str(self._layout["version"])

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n['port']}" for n in self._layout["nodes"])

    def conf(self, **extra: object) -> dict:
        return {"bootstrap.servers": self.bootstrap, **extra}

    def node(self, node_id: int) -> ClusterNode:
        nodes = self._layout["nodes"]
        if not 1 <= node_id <= len(nodes):
            raise EmbeddedKafkaError(
                f"--node {node_id}: the cluster in {self.data_dir} has nodes 1..{len(nodes)}"
            )
        spec = nodes[node_id - 1]
        voters = ",".join(f"{n['id']}@127.0.0.1:{n['controller_port']}" for n in nodes)
        return ClusterNode(
            self.data_dir / f"node-{node_id}",
            port=spec["port"],
            heap=self.heap,
            version=self.version,
            node_id=node_id,
            brokers=self.brokers,
            controller_port_fixed=spec["controller_port"],
            voters=voters,
            cluster_id=self._layout["cluster_id"],
            command_prefix=tuple(self.node_prefix(node_id) if self.node_prefix else ()),
        )

    def nodes(self) -> list[ClusterNode]:
        return [self.node(i) for i in range(1, self.brokers + 1)]

    # -- start ----------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start every node that is not running (all at once: a lone KRaft node waits for a
        quorum) and return the bootstrap list once every broker is registered."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self._file.exists():
            self._file.write_text(json.dumps(self._layout, indent=1))
        launched = {}
        try:
            for node in self.nodes():
                if node.running_pid() is None:
                    launched[node.node_id] = node.launch()
            self._await_brokers(launched, timeout_s)
        except BaseException:
            for node_id in launched:
                self.node(node_id).kill()
            raise
        return self.bootstrap

    def _await_brokers(self, launched: dict, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        admin = AdminClient(
            {**shared_conf(self.conf()), "socket.connection.setup.timeout.ms": 2000}
        )
        while time.monotonic() < deadline:
            for node_id, proc in launched.items():
                if proc.poll() is not None:
                    raise EmbeddedKafkaError(
                        f"node {node_id} exited with code {proc.returncode}: "
                        f"{self.node(node_id)._last_error_line()}"  # noqa: SLF001 (its owner)
                    )
            try:
                if len(admin.list_topics(timeout=METADATA_POLL_S).brokers) >= self.brokers:
                    return
            except KafkaException:
                pass
        raise EmbeddedKafkaError(
            f"the cluster did not show {self.brokers} brokers within "
            f"{timeout_s:.0f} s; see {self.data_dir}/node-*/broker.log"
        )

    def start_node(self, node_id: int, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start one stopped node of this (running) cluster again; returns its address."""
        if not self._file.exists():
            raise EmbeddedKafkaError(f"no cluster in {self.data_dir}; start one with --brokers N")
        return self.node(node_id).start(timeout_s)

    # -- stop -----------------------------------------------------------------------------
    def stop(
        self, node_id: int | None = None, kill: bool = False, timeout_s: float = STOP_TIMEOUT_S
    ) -> list[int]:
        """Stop one node or all (SIGTERM, or SIGKILL with ``kill``); returns the ids that
        were running. Idempotent."""
        nodes = [self.node(node_id)] if node_id is not None else self.nodes()
        running = [(n, pid) for n in nodes if (pid := n.running_pid()) is not None]
        # Signal all first, then wait: the last nodes' controlled shutdown needs a quorum.
        for _node, pid in running:
            os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        for node, pid in running:
            # The cluster owns its nodes: it signals them all first, then waits for each.
            if not node._wait_exit(pid, timeout_s):  # noqa: SLF001 (their owner)
                node._kill(pid)  # noqa: SLF001 (their owner)
        return [n.node_id for n, _pid in running]

    # -- observation ----------------------------------------------------------------------
    def leader_of(self, topic: str, partition: int, timeout_s: float = 10.0) -> int:
        """The node id leading ``topic[partition]`` now (-1 when it has no leader)."""
        admin = AdminClient(shared_conf(self.conf()))
        meta = admin.list_topics(topic, timeout=timeout_s)
        if topic not in meta.topics or partition not in meta.topics[topic].partitions:
            raise EmbeddedKafkaError(f"{topic}[{partition}] is not in the cluster's metadata")
        return meta.topics[topic].partitions[partition].leader
