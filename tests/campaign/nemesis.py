"""The campaign's nemesis: seeded faults on the 3-node cluster and the workload's processes.

    cluster = EmbeddedCluster(dir, brokers=3, node_prefix=namespaces.node_prefix)
    nemesis = Nemesis(seed, cluster, targets, duration_s=600, group=topics.coordinator_group)
    nemesis.prepare()             # before cluster.start(): the disk-full node's tmpfs
    cluster.start()
    nemesis.start()               # ... the workload runs ...
    events = nemesis.stop()       # heals everything; the fault events for the history
    counts = nemesis.observations(coordinator_logs=[...])

The plan (``nemesis.plan``) is drawn from ``random.Random(seed)`` up front, so a seed replays
the same faults on the same targets in the same order. It has two lanes, each one fault at a
time: the cluster lane (broker pause/kill, all brokers paused, controller kill, group
coordinator kill, disk full, partition: at most one node down at once, the all-paused fault
short) and the process lane (coordinator and consumer pause/kill, clock skew). The
``short`` plan has every kind once per lane, with short holds, in about three minutes.
Partition and disk full need the campaign's namespaces (``tests.campaign.namespaces``);
outside them they are left out and listed in ``nemesis.skipped``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rmq_semantics.kafka_cluster import EmbeddedCluster
from tests.campaign import namespaces
from tests.campaign.clock import ClockSkew
from tests.campaign.fault_watch import (
    FENCE_PATTERNS,
    GroupWatch,
    LeaderWatch,
    controller_elections,
    count_log_lines,
)
from tests.campaign.faultkit import (
    AllBrokersPaused,
    BrokerKill,
    BrokerPause,
    ControllerKill,
    Fault,
    GroupCoordinatorKill,
    ProcessKill,
    ProcessPause,
    ProcTarget,
    active_controller,
    await_healthy,
    restart_node,
)

__all__ = [
    "ALL_KINDS",
    "BROKER_KINDS",
    "PROCESS_KINDS",
    "SHORT",
    "Nemesis",
    "Step",
    "Timing",
    "make_plan",
]

log = logging.getLogger(__name__)

BROKER_KINDS = (
    "broker_pause",
    "broker_kill",
    "all_brokers_paused",
    "controller_kill",
    "group_coordinator_kill",
    "disk_full",
    "partition",
)
PROCESS_KINDS = (
    "coordinator_pause",
    "coordinator_kill",
    "consumer_pause",
    "consumer_kill",
    "clock_skew",
)
ALL_KINDS = BROKER_KINDS + PROCESS_KINDS
NAMESPACE_KINDS = ("disk_full", "partition")


@dataclass(frozen=True)
class Timing:
    """How long each fault is held, and the quiet gap before the next of its lane. The
    pauses must outlast what they target: broker.session.timeout.ms (9 s) and the clients'
    request.timeout.ms for a broker, the coordinators' session timeout or the consumers'
    lease for a process; ``rebalance_wait_s`` past the coordinators' session timeout."""

    broker_pause_s: float = 35.0
    all_paused_s: float = 8.0
    partition_s: float = 25.0
    disk_full_s: float = 10.0
    kill_down_s: float = 5.0  # a killed node or process stays down this long before heal
    process_pause_s: float = 20.0
    clock_skew_s: float = 30.0
    gap_s: float = 10.0
    rebalance_wait_s: float = 30.0
    settle_s: float = 90.0  # before a cluster fault: wait (at most) for full ISRs again
    skew_s: tuple[int, int] = (60, 300)  # |offset| drawn from this range, ahead or behind


SHORT = Timing(
    broker_pause_s=14.0,
    all_paused_s=5.0,
    partition_s=14.0,
    disk_full_s=4.0,
    kill_down_s=2.0,
    # A paused consumer's queues change hands only after its session (6 s) and lease (6 s)
    # end and the rebalance is done: 10 s left a window of 2-4 s, which a lock-service
    # rebalance after a healed partition (about 12 s) can cover whole (a CI run, seed 30).
    process_pause_s=16.0,
    clock_skew_s=10.0,
    gap_s=3.0,
    rebalance_wait_s=15.0,
)
# What a step costs besides its hold, for planning: a node's restart, a rebalance.
RESTART_S = 15.0


@dataclass(frozen=True)
class Step:
    """One planned fault: ``target`` a node id, a process name, or None (chosen when applied:
    the controller, the group's coordinator, all nodes)."""

    lane: str
    kind: str
    target: int | str | None
    hold_s: float
    gap_s: float
    at_s: float  # planned start from the run's start (drifts with restarts)
    extra: dict[str, Any] = field(default_factory=dict)


def _cost(kind: str, hold_s: float, gap_s: float) -> float:
    restarts = kind in ("broker_kill", "controller_kill", "group_coordinator_kill", "disk_full")
    return hold_s + gap_s + (RESTART_S if restarts else 0.0)


def _hold(kind: str, t: Timing) -> float:
    return {
        "broker_pause": t.broker_pause_s,
        "all_brokers_paused": t.all_paused_s,
        "partition": t.partition_s,
        "disk_full": t.disk_full_s,
        "clock_skew": t.clock_skew_s,
    }.get(kind, t.process_pause_s if kind.endswith("_pause") else t.kill_down_s)


def make_plan(
    seed: int,
    kinds: Iterable[str],
    duration_s: float,
    nodes: Sequence[int],
    procs: Sequence[ProcTarget],
    timing: Timing,
    short: bool = False,
    disk_node: int | None = None,
) -> list[Step]:
    """The faults of a run, drawn from ``seed``. Each lane first takes every kind it has
    once (shuffled), then (unless ``short``) random kinds until ``duration_s`` is used."""
    rng = random.Random(seed)
    kinds = list(dict.fromkeys(kinds))
    plan: list[Step] = []
    for lane, lane_kinds in (("cluster", BROKER_KINDS), ("process", PROCESS_KINDS)):
        mine = [k for k in kinds if k in lane_kinds]
        order = rng.sample(mine, len(mine))
        at = 0.0
        while mine:
            if not order:
                if short or at >= duration_s:
                    break
                order = [rng.choice(mine)]
            kind = order.pop(0)
            hold = _hold(kind, timing)
            target, extra = _target(rng, kind, nodes, procs, timing, disk_node)
            plan.append(Step(lane, kind, target, hold, timing.gap_s, round(at, 1), extra))
            at += _cost(kind, hold, timing.gap_s)
    return plan


def _target(
    rng: random.Random,
    kind: str,
    nodes: Sequence[int],
    procs: Sequence[ProcTarget],
    timing: Timing,
    disk_node: int | None,
) -> tuple[int | str | None, dict]:
    if kind in ("broker_pause", "broker_kill", "partition"):
        return rng.choice(list(nodes)), {}
    if kind == "disk_full":
        return disk_node or max(nodes), {}
    if kind in ("all_brokers_paused", "controller_kill"):
        return None, {}
    if kind == "group_coordinator_kill":
        members = [p.name for p in procs if p.role == "coordinator"]
        return None, {"trigger": rng.choice(members) if members else None}
    if kind == "clock_skew":
        skewable = [p.name for p in procs if p.clock_file is not None]
        offset = rng.randint(*timing.skew_s) * rng.choice((-1, 1))
        return rng.choice(skewable), {"offset": f"{offset:+d}s"}
    role = kind.rsplit("_", 1)[0]
    mine = [p for p in procs if p.role == role]
    if kind == "consumer_pause":
        # A pause past the lease is a takeover only where a peer can take the queues.
        mine = [p for p in mine if p.handover] or mine
    return rng.choice([p.name for p in mine]), {}


def _available(kind: str, procs: Sequence[ProcTarget], group: str | None) -> str | None:
    """Why ``kind`` cannot run here, or None."""
    if kind in NAMESPACE_KINDS and not namespaces.inside():
        return "not inside the campaign's namespaces"
    if kind == "group_coordinator_kill" and group is None:
        return "no group given"
    if kind == "clock_skew" and not any(p.clock_file for p in procs):
        return "no process with a clock_file"
    if kind in PROCESS_KINDS and kind != "clock_skew":
        role = kind.rsplit("_", 1)[0]
        if not any(p.role == role for p in procs):
            return f"no {role} process"
    return None


class Nemesis:
    """Runs a seeded fault plan in two threads; :meth:`stop` heals everything and returns
    the events (``{kind, target, start_ms, end_ms, seed, detail}``, by start)."""

    def __init__(
        self,
        seed: int,
        cluster: EmbeddedCluster,
        targets: Sequence[ProcTarget] = (),
        kinds: Iterable[str] = ALL_KINDS,
        duration_s: float = 600.0,
        group: str | None = None,
        timing: Timing | None = None,
        short: bool = False,
        disk_node: int | None = None,
        tmpfs_mb: int = namespaces.DEFAULT_TMPFS_MB,
        watch_topics: Iterable[str] = (),
    ) -> None:
        self.seed = seed
        self.cluster = cluster
        self.targets = {p.name: p for p in targets}
        self.group = group
        self.timing = timing or (SHORT if short else Timing())
        self.disk_node = disk_node or cluster.brokers
        wanted = list(dict.fromkeys(kinds))
        unknown = [k for k in wanted if k not in ALL_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(ALL_KINDS)}")
        self.skipped = {
            k: why for k in wanted if (why := _available(k, list(targets), group)) is not None
        }
        for kind, why in self.skipped.items():
            log.warning("nemesis: no %s faults: %s", kind, why)
        self.kinds = [k for k in wanted if k not in self.skipped]
        self.plan = make_plan(
            seed,
            self.kinds,
            duration_s,
            range(1, cluster.brokers + 1),
            list(targets),
            self.timing,
            short,
            self.disk_node,
        )
        self.tmpfs = (
            namespaces.TmpfsLogDir(cluster, self.disk_node, tmpfs_mb)
            if "disk_full" in self.kinds
            else None
        )
        self._events: list[Fault] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._leaders = LeaderWatch(cluster, watch_topics)
        self._group_watch = GroupWatch(cluster, group) if group else None
        self._epoch0: int | None = None

    @classmethod
    def short(
        cls, seed: int, cluster: EmbeddedCluster, targets: Sequence[ProcTarget] = (), **kwargs: Any
    ) -> Nemesis:
        """Every kind at least once, short holds: about three minutes."""
        return cls(seed, cluster, targets, short=True, **kwargs)

    # -- lifecycle -------------------------------------------------------------------------
    def prepare(self) -> None:
        """Put the disk-full node's log dir on its tmpfs: before ``cluster.start()`` it
        costs nothing, on a running node a restart."""
        if self.tmpfs is not None:
            self.tmpfs.install()

    def start(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._epoch0 = active_controller(self.cluster)[1]
        self._leaders.start()
        if self._group_watch is not None:
            self._group_watch.start()
        for lane in ("cluster", "process"):
            steps = [s for s in self.plan if s.lane == lane]
            thread = threading.Thread(
                target=self._run_lane, args=(steps,), daemon=True, name=f"nemesis-{lane}"
            )
            self._threads.append(thread)
            thread.start()

    def done(self) -> bool:
        """Whether every planned fault has run (a run may stop the nemesis earlier)."""
        return bool(self._threads) and not any(t.is_alive() for t in self._threads)

    def wait(self, timeout_s: float | None = None) -> bool:
        for thread in self._threads:
            thread.join(timeout_s)
        return self.done()

    def stop(self) -> list[dict[str, Any]]:
        """Stop after healing the faults on now; then make sure every node runs and every
        process the nemesis stopped goes on. Returns the events."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
        self.heal_all()
        self._leaders.stop()
        if self._group_watch is not None:
            self._group_watch.stop()
        return self.events()

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            faults = list(self._events)
        return sorted((f.event() for f in faults), key=lambda e: e["start_ms"] or 0)

    def heal_all(self) -> None:
        """Whatever a crashed step may have left: rules, the filler, stopped processes and
        nodes."""
        with self._lock:
            faults = list(self._events)
        for fault in faults:
            with contextlib.suppress(Exception):
                fault.heal()
        namespaces.heal_partitions()
        if self.tmpfs is not None and self.tmpfs.mounted():
            (self.tmpfs.log_dir / namespaces.DiskFull.FILLER).unlink(missing_ok=True)
        for node in self.cluster.nodes():
            if node.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGCONT)
            else:
                with contextlib.suppress(Exception):
                    restart_node(self.cluster, node.node_id)

    # -- the lanes -------------------------------------------------------------------------
    def _run_lane(self, steps: list[Step]) -> None:
        for step in steps:
            if self._stop.wait(step.gap_s):
                return
            if step.lane == "cluster":
                # The last fault healed, but a node may still be catching up: one more down
                # now would leave partitions below min ISR for longer than planned.
                problem = await_healthy(self.cluster, self.timing.settle_s)
                if problem is not None:
                    log.warning("nemesis: cluster not healthy before %s: %s", step.kind, problem)
            fault = self._fault(step)
            with self._lock:
                self._events.append(fault)
            try:
                fault.apply()
            except Exception as exc:  # recorded in the event; the run goes on
                log.warning("nemesis: %s on %s failed: %s", fault.kind, fault.target, exc)
                continue
            self._stop.wait(step.hold_s)
            try:
                fault.heal()
            except Exception as exc:
                log.warning("nemesis: healing %s on %s failed: %s", fault.kind, fault.target, exc)
                self.heal_all()

    def _fault(self, step: Step) -> Fault:
        seed, cluster = self.seed, self.cluster
        if step.kind == "broker_pause":
            fault: Fault = BrokerPause(cluster, int(step.target or 1), seed)
        elif step.kind == "broker_kill":
            fault = BrokerKill(cluster, int(step.target or 1), seed)
        elif step.kind == "all_brokers_paused":
            fault = AllBrokersPaused(cluster, seed)
        elif step.kind == "controller_kill":
            fault = ControllerKill(cluster, seed)
        elif step.kind == "group_coordinator_kill":
            trigger = step.extra.get("trigger")
            fault = GroupCoordinatorKill(
                cluster,
                str(self.group),
                ProcessPause(self.targets[trigger], seed) if trigger else None,
                rebalance_wait_s=self.timing.rebalance_wait_s,
                seed=seed,
            )
        elif step.kind == "disk_full":
            assert self.tmpfs is not None
            fault = namespaces.DiskFull(self.tmpfs, seed)
        elif step.kind == "partition":
            fault = namespaces.Partition(cluster, int(step.target or 1), seed)
        elif step.kind == "clock_skew":
            fault = ClockSkew(self.targets[str(step.target)], step.extra["offset"], seed)
        elif step.kind.endswith("_pause"):
            fault = ProcessPause(self.targets[str(step.target)], seed)
        else:
            fault = ProcessKill(self.targets[str(step.target)], seed)
        fault.detail["planned_hold_s"] = step.hold_s
        return fault

    # -- did the faults take effect --------------------------------------------------------
    def observations(
        self, coordinator_logs: Iterable[Path | str] = (), broker_logs: bool = True
    ) -> dict[str, int]:
        """Counts for the summary's minimums: leader changes seen, KRaft elections,
        rebalances and coordinator moves of ``group``, fenced or re-created transactional
        producers in ``coordinator_logs``, and fault kinds applied."""
        counts = {
            "leader_changes": self._leaders.changes,
            "coordinator_rebalances": getattr(self._group_watch, "rebalances", 0),
            "group_coordinator_moves": getattr(self._group_watch, "coordinator_moves", 0),
            "fenced_producers": count_log_lines(coordinator_logs, FENCE_PATTERNS),
            "faults_applied": sum(1 for e in self.events() if "error" not in e["detail"]),
        }
        with contextlib.suppress(RuntimeError):
            if self._epoch0 is not None:
                counts["controller_elections"] = controller_elections(self.cluster, self._epoch0)
        if broker_logs:
            counts["broker_disk_errors"] = count_log_lines(
                (n.data_dir / "broker.log" for n in self.cluster.nodes()),
                [r"No space left on device"],
            )
        return counts


def with_timing(timing: Timing, **changes: float) -> Timing:
    """A copy of ``timing`` with some holds changed (e.g. the run's session timeout)."""
    return replace(timing, **changes)
