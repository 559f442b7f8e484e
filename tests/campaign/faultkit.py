"""The nemesis's faults: each ``apply()`` / ``heal()`` (or ``with fault:``), logging when it
started and ended and giving the history an event ``{kind, target, start_ms, end_ms, seed,
detail}`` (wall-clock milliseconds, as the workload's records carry).

Broker faults take a node id of an :class:`EmbeddedCluster`; process faults take a
:class:`ProcTarget` (a name, a role and a callable giving the pid now, so a restarted
process is found again). Faults that need the campaign's namespaces (a partition, a full
disk) are in ``tests.campaign.namespaces``; the clock skew in ``tests.campaign.clock``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.embedded import port_free
from rmq_semantics.kafka_cluster import EmbeddedCluster

__all__ = [
    "AllBrokersPaused",
    "BrokerKill",
    "BrokerPause",
    "ControllerKill",
    "Fault",
    "GroupCoordinatorKill",
    "GroupProbe",
    "MetadataReader",
    "ProcTarget",
    "ProcessKill",
    "ProcessPause",
    "active_controller",
    "await_healthy",
    "cluster_healthy",
    "group_coordinator",
    "group_snapshot",
    "now_ms",
    "restart_node",
]

log = logging.getLogger(__name__)

QUORUM_STATE = Path("logs") / "__cluster_metadata-0" / "quorum-state"
# A group "in a rebalance": the classic protocol's and KIP-848's in-between states.
REBALANCING = {"PREPARING_REBALANCE", "COMPLETING_REBALANCE", "ASSIGNING", "RECONCILING"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Fault:
    """One fault. ``apply`` once; ``heal`` is idempotent and a no-op before ``apply``."""

    kind: ClassVar[str] = "fault"

    def __init__(self, target: str, seed: int | None = None) -> None:
        self.target = target
        self.seed = seed
        self.start_ms: int | None = None
        self.end_ms: int | None = None
        self.detail: dict[str, Any] = {}

    @property
    def active(self) -> bool:
        return self.start_ms is not None and self.end_ms is None

    def apply(self) -> None:
        if self.start_ms is not None:
            raise RuntimeError(f"{self.kind} on {self.target} was applied already")
        self.start_ms = now_ms()
        log.info("nemesis: %s on %s starts", self.kind, self.target)
        try:
            self._apply()
        except BaseException as exc:
            self.detail["error"] = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                self._heal()
            self.end_ms = now_ms()
            raise

    def heal(self) -> None:
        if not self.active:
            return
        try:
            self._heal()
        except BaseException as exc:
            self.detail["heal_error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.end_ms = now_ms()
            log.info(
                "nemesis: %s on %s ends after %.1f s",
                self.kind,
                self.target,
                (self.end_ms - (self.start_ms or self.end_ms)) / 1000,
            )

    def event(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "seed": self.seed,
            "detail": dict(self.detail),
        }

    def __enter__(self) -> Fault:
        self.apply()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()

    def _apply(self) -> None:
        raise NotImplementedError

    def _heal(self) -> None:
        raise NotImplementedError


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, timeout_s: float = 15.0) -> None:
    """Until ``pid`` is dead or a zombie (its parent reaps it and reads its status)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return
        time.sleep(0.05)


def _node_pid(cluster: EmbeddedCluster, node_id: int) -> int:
    pid = cluster.node(node_id).pid
    if pid is None:
        raise RuntimeError(f"node {node_id} is not running")
    return pid


def restart_node(cluster: EmbeddedCluster, node_id: int, timeout_s: float = 30.0) -> float:
    """Start a stopped node again; returns the seconds it took to answer. A JVM that
    halted may still be exiting (its cmdline already gone) with its ports open: wait."""
    started = time.monotonic()
    spec = cluster._layout["nodes"][node_id - 1]
    while not (port_free(spec["port"]) and port_free(spec["controller_port"])):
        if time.monotonic() - started > timeout_s:
            break  # start_node says which port is taken
        time.sleep(0.2)
    cluster.start_node(node_id)
    return round(time.monotonic() - started, 1)


class MetadataReader:
    """Cluster metadata from whichever node answers: one client per node, asked in turn. A
    client of all three keeps asking the node it is connected to, which a pause or a
    partition leaves silent (its TCP connection stays up)."""

    def __init__(self, cluster: EmbeddedCluster, timeout_s: float = 1.5) -> None:
        self.admins = [
            AdminClient(shared_conf({"bootstrap.servers": node.bootstrap}))
            for node in cluster.nodes()
        ]
        self.timeout_s = timeout_s
        self._next = 0

    def metadata(self) -> Any | None:
        """A ClusterMetadata, None when no node answered."""
        for _ in self.admins:
            admin = self.admins[self._next]
            self._next = (self._next + 1) % len(self.admins)
            try:
                return admin.list_topics(timeout=self.timeout_s)
            except KafkaException:
                continue
        return None


def cluster_healthy(reader: MetadataReader, brokers: int) -> str | None:
    """None when every broker is registered and every partition (internal topics too) has
    a leader and its full ISR; else what is not."""
    meta = reader.metadata()
    if meta is None:
        return "no node answers a metadata request"
    if len(meta.brokers) < brokers:
        return f"{len(meta.brokers)} of {brokers} brokers registered"
    short = [
        f"{t}[{n}] leader {p.leader} isr {p.isrs}"
        for t, topic in meta.topics.items()
        for n, p in topic.partitions.items()
        if p.leader < 0 or len(p.isrs) < len(p.replicas)
    ]
    return f"{len(short)} partitions short: {', '.join(short[:3])}" if short else None


def await_healthy(cluster: EmbeddedCluster, timeout_s: float = 90.0) -> str | None:
    """Wait until :func:`cluster_healthy`; returns None, or what was still wrong."""
    reader = MetadataReader(cluster)
    deadline = time.monotonic() + timeout_s
    while True:
        problem = cluster_healthy(reader, cluster.brokers)
        if problem is None or time.monotonic() >= deadline:
            return problem
        time.sleep(0.5)


# -- where things are ----------------------------------------------------------------------
def active_controller(cluster: EmbeddedCluster) -> tuple[int, int]:
    """``(node id, epoch)`` of the KRaft quorum's leader (the active controller), from the
    quorum-state file each voter keeps: the highest epoch's leader. Raises when no file
    names a leader yet."""
    best = (-1, -1)
    for node in cluster.nodes():
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((node.data_dir / QUORUM_STATE).read_text())
            leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
            if leader > 0 and epoch > best[1]:
                best = (leader, epoch)
    if best[0] < 0:
        raise RuntimeError(f"no node of {cluster.data_dir} names a KRaft leader yet")
    return best


# Describes a group in a child process: librdkafka aborts the whole process when a
# DescribeGroups request times out while the group's coordinator is down (librdkafka #4605,
# seen with 2.16), exactly what the nemesis makes happen.
PROBE = """
import json, sys
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
for line in sys.stdin:
    try:
        d = admin.describe_consumer_groups([line.strip()], request_timeout=3.0)[
            line.strip()].result(timeout=6)
        out = {"state": d.state.name, "members": sorted(m.member_id for m in d.members),
               "coordinator": d.coordinator.id}
    except Exception as exc:
        out = {"error": str(exc)}
    print(json.dumps(out), flush=True)
"""


class GroupProbe:
    """Consumer group descriptions from a child process, started again when it died."""

    def __init__(self, bootstrap: str, timeout_s: float = 10.0) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def describe(self, group: str) -> dict[str, Any] | None:
        """``{state, members, coordinator}`` of ``group``, None when it could not be read."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                proc = self._proc = subprocess.Popen(
                    [sys.executable, "-c", PROBE, self.bootstrap],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    bufsize=1,
                )
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(group + "\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
                line = proc.stdout.readline() if ready else ""
            except OSError:
                line = ""
            if not line:
                self._close(proc)
                return None
        answer = json.loads(line)
        return None if "error" in answer else answer

    def _close(self, proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait(10)
        self._proc = None

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._close(self._proc)


def group_coordinator(probe: GroupProbe, group: str, timeout_s: float = 30.0) -> int:
    """The node id coordinating consumer group ``group`` (Admin DescribeGroups)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = probe.describe(group)
        if answer is not None:
            return int(answer["coordinator"])
        if time.monotonic() >= deadline:
            raise RuntimeError(f"group {group}: no coordinator found in {timeout_s:.0f} s")
        time.sleep(0.5)


def group_snapshot(probe: GroupProbe, group: str) -> tuple[str, frozenset[str], int] | None:
    """``(state, member ids, coordinator)`` of ``group`` now, None when it cannot be read."""
    answer = probe.describe(group)
    if answer is None:
        return None
    return answer["state"], frozenset(answer["members"]), int(answer["coordinator"])


# -- broker faults -------------------------------------------------------------------------
class BrokerPause(Fault):
    """SIGSTOP node N (a long GC pause, a frozen VM) for as long as the fault is on: past
    broker.session.timeout.ms its leaderships move; past request.timeout.ms clients' calls
    to it fail. Heal: SIGCONT."""

    kind = "broker_pause"

    def __init__(self, cluster: EmbeddedCluster, node_id: int, seed: int | None = None) -> None:
        super().__init__(f"node-{node_id}", seed)
        self.cluster = cluster
        self.node_id = node_id
        self.pid: int | None = None

    def _apply(self) -> None:
        self.pid = _node_pid(self.cluster, self.node_id)
        self.detail["pid"] = self.pid
        os.kill(self.pid, signal.SIGSTOP)

    def _heal(self) -> None:
        if self.pid is not None:
            _signal(self.pid, signal.SIGCONT)


class BrokerKill(Fault):
    """SIGKILL node N; heal starts it again (same data dir and ports)."""

    kind = "broker_kill"

    def __init__(
        self, cluster: EmbeddedCluster, node_id: int | None, seed: int | None = None
    ) -> None:
        super().__init__(f"node-{node_id}" if node_id else "node-?", seed)
        self.cluster = cluster
        self.node_id = node_id

    def _pick(self) -> int:
        assert self.node_id is not None
        return self.node_id

    def _apply(self) -> None:
        self.node_id = self._pick()
        self.target = f"node-{self.node_id}"
        pid = _node_pid(self.cluster, self.node_id)
        self.detail["pid"] = pid
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)

    def _heal(self) -> None:
        if self.node_id is not None and self.cluster.node(self.node_id).pid is None:
            self.detail["restart_s"] = restart_node(self.cluster, self.node_id)


class ControllerKill(BrokerKill):
    """SIGKILL the active KRaft controller (found when applied); heal restarts it."""

    kind = "controller_kill"

    def __init__(self, cluster: EmbeddedCluster, seed: int | None = None) -> None:
        super().__init__(cluster, None, seed)

    def _pick(self) -> int:
        node_id, epoch = active_controller(self.cluster)
        self.detail["epoch"] = epoch
        return node_id


class GroupCoordinatorKill(BrokerKill):
    """SIGKILL the node coordinating ``group`` while the group rebalances. ``trigger`` (e.g.
    a :class:`ProcessPause` of one member, past its session timeout) is applied first and
    healed after the kill; the kill comes when the group is seen in a rebalance (a state of
    REBALANCING, or its members changed), or after ``rebalance_wait_s`` regardless
    (``detail['rebalance_seen']`` tells which)."""

    kind = "group_coordinator_kill"

    def __init__(
        self,
        cluster: EmbeddedCluster,
        group: str,
        trigger: Fault | None = None,
        rebalance_wait_s: float = 30.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(cluster, None, seed)
        self.group = group
        self.trigger = trigger
        self.rebalance_wait_s = rebalance_wait_s
        self.probe = GroupProbe(cluster.bootstrap)

    def _pick(self) -> int:
        before = group_snapshot(self.probe, self.group)
        node_id = before[2] if before else group_coordinator(self.probe, self.group)
        if self.trigger is not None:
            try:
                self.trigger.apply()
            except RuntimeError as exc:  # its process is down: wait for a rebalance anyway
                self.detail["trigger_error"] = str(exc)
        self.detail["rebalance_seen"] = self._await_rebalance(before)
        self.detail["group"] = self.group
        return node_id

    def _await_rebalance(self, before: tuple[str, frozenset[str], int] | None) -> bool:
        deadline = time.monotonic() + self.rebalance_wait_s
        while time.monotonic() < deadline:
            now = group_snapshot(self.probe, self.group)
            if now is not None and (
                now[0] in REBALANCING or (before is not None and now[1] != before[1])
            ):
                self.detail["state"] = now[0]
                return True
            time.sleep(0.1)
        return False

    def _apply(self) -> None:
        try:
            super()._apply()
        finally:
            self.probe.close()
            if self.trigger is not None:
                self.trigger.heal()
                self.detail["trigger"] = self.trigger.event()


class AllBrokersPaused(Fault):
    """SIGSTOP every node at once (keep it short: nothing answers meanwhile); heal SIGCONTs
    them all."""

    kind = "all_brokers_paused"

    def __init__(self, cluster: EmbeddedCluster, seed: int | None = None) -> None:
        super().__init__("all", seed)
        self.cluster = cluster
        self.pids: list[int] = []

    def _apply(self) -> None:
        self.pids = [p for p in (n.pid for n in self.cluster.nodes()) if p is not None]
        self.detail["pids"] = list(self.pids)
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)

    def _heal(self) -> None:
        for pid in self.pids:
            _signal(pid, signal.SIGCONT)


# -- process faults ------------------------------------------------------------------------
@dataclass
class ProcTarget:
    """A workload process the nemesis may hit. ``role``: coordinator, consumer or producer
    (the fault kinds are ``<role>_pause`` / ``<role>_kill``); ``pid()`` gives its pid now
    (None: not running); ``restart()`` starts it again after a kill (None: the runner
    restarts it itself); ``clock_file``: a skewed producer's faketime file
    (tests.campaign.clock); ``handover``: a queue-lock holder with a peer in its group, so
    a pause past its lease hands its queues to another holder (a lock takeover)."""

    name: str
    role: str
    pid: Callable[[], int | None]
    restart: Callable[[], object] | None = None
    clock_file: Path | None = None
    handover: bool = False


class ProcessPause(Fault):
    """SIGSTOP a process (past its session timeout or lease: a zombie that wakes up), then
    SIGCONT."""

    def __init__(self, target: ProcTarget, seed: int | None = None) -> None:
        super().__init__(target.name, seed)
        self.proc = target
        self.pid: int | None = None

    @property
    def kind(self) -> str:  # type: ignore[override]
        return f"{self.proc.role}_pause"

    def _apply(self) -> None:
        self.pid = self.proc.pid()
        if self.pid is None:
            raise RuntimeError(f"{self.proc.name} is not running")
        self.detail["pid"] = self.pid
        os.kill(self.pid, signal.SIGSTOP)

    def _heal(self) -> None:
        if self.pid is not None:
            _signal(self.pid, signal.SIGCONT)


class ProcessKill(Fault):
    """SIGKILL a process; heal calls its ``restart`` (if any)."""

    def __init__(self, target: ProcTarget, seed: int | None = None) -> None:
        super().__init__(target.name, seed)
        self.proc = target

    @property
    def kind(self) -> str:  # type: ignore[override]
        return f"{self.proc.role}_kill"

    def _apply(self) -> None:
        pid = self.proc.pid()
        if pid is None:
            raise RuntimeError(f"{self.proc.name} is not running")
        self.detail["pid"] = pid
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)

    def _heal(self) -> None:
        if self.proc.restart is not None:
            self.proc.restart()
            self.detail["restarted_pid"] = self.proc.pid()
