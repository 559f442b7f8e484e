"""The real nemesis (tests/campaign/nemesis.py) behind the runner's nemesis interface
(``run(until_mono)``, ``heal()``): the runner's processes as ``ProcTarget``s, a ``Timing``
from the run's shortened session timeouts and leases, the fault events into the history as
they end, the nemesis's own observations as a note, and the fault kinds it had to skip.

One producer (``SKEWED_PRODUCER``) is started with a faketime clock file, the target of
``clock_skew``. A clock set *ahead* that way freezes librdkafka, not the product: its timed
waits take an absolute deadline from the faked wall clock, which the kernel's real clock
reaches ``offset`` later (a ``poll(1.0)`` under ``+10`` takes 11 s; ``-15`` changes nothing),
so heartbeats stop and the check consumer's session times out (seen: 'session timed out
after 20199 ms' under +20 s). The liveness horizon therefore counts that producer's group as
down from the skew's start until ``offset`` + a session timeout after its end (a clock
behind counts as up throughout: nothing freezes).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from rmq_semantics.kafka_cluster import EmbeddedCluster
from tests.campaign import events as ev
from tests.campaign import namespaces
from tests.campaign.config import SESSION_TIMEOUT_MS, CampaignConfig
from tests.campaign.faultkit import ProcTarget
from tests.campaign.history import Recorder
from tests.campaign.nemesis import ALL_KINDS, SHORT, Nemesis, Timing, with_timing
from tests.campaign.processes import Coordinator, Targets, WorkerProcess, note_end
from tests.campaign.producer_worker import names as producer_names

__all__ = [
    "MINIMUMS",
    "SKEWED_PRODUCER",
    "RealNemesis",
    "prepare_cluster",
    "proc_targets",
    "timing_for",
]

SKEWED_PRODUCER = "producer-2"  # the async producer: its wall clock is the nemesis's to move
# What a short run with every fault kind reliably causes, and every kind applied at least
# once. Fenced producers are counted, not required: seed 30 saw 5, 1 and 0 in three runs.
MINIMUMS = {
    "leader_change": 1,
    "lock_takeover": 1,
    "rebalance": 1,
    **{f"fault:{kind}": 1 for kind in ALL_KINDS},
}
EXTRA_S = 240.0  # past the load: the plan's last faults still run (every kind once)
POLL_S = 0.5


def timing_for(cfg: CampaignConfig, short: bool) -> Timing:
    """Pauses past the coordinators' session timeout and the consumers' lease; a rebalance
    wait past the session timeout (the short holds otherwise)."""
    base = SHORT if short else Timing()
    session_s = SESSION_TIMEOUT_MS / 1000
    lease_s = max(cfg.consumer_lease_ms, cfg.coordinator["lock_lease_ms"]) / 1000
    timing = with_timing(
        base,
        process_pause_s=max(base.process_pause_s, session_s + 4, lease_s + 4),
        rebalance_wait_s=max(base.rebalance_wait_s, session_s + 9),
    )
    # A short run's skews stay short: a clock ahead takes its group out of the liveness
    # horizon for about the offset (the module's doc).
    return replace(timing, skew_s=(15, 40)) if short else timing


def prepare_cluster(data_dir: Path, brokers: int) -> EmbeddedCluster:
    """The campaign's own cluster: inside the namespaces, each node under its own group id
    (partitions) and the last node's log dir on a tmpfs (disk full), before it starts."""
    if not namespaces.inside():
        return EmbeddedCluster(data_dir, brokers=brokers)
    cluster = EmbeddedCluster(data_dir, brokers=brokers, node_prefix=namespaces.node_prefix)
    namespaces.TmpfsLogDir(cluster, cluster.brokers).install()
    return cluster


def _restart_after_kill(p: WorkerProcess | Coordinator) -> None:
    """The nemesis SIGKILLed ``p`` by its pid: its end is the nemesis's, then it restarts."""
    if not p.alive() and not p.expected_down:
        p.expected_down = True
        code = (
            p.proc.poll()
            if isinstance(p, WorkerProcess) and p.proc
            else (p.process.poll() if isinstance(p, Coordinator) and p.process else None)
        )
        note_end(p.ended, code, killed=True)
    p.restart()


def proc_targets(targets: Targets, clock_files: dict[str, Path]) -> list[ProcTarget]:
    out = [
        ProcTarget(
            c.name,
            "coordinator",
            lambda c=c: c.pid if c.alive() else None,
            lambda c=c: _restart_after_kill(c),
        )
        for c in targets.coordinators
    ]
    peers = Counter(w.kind for w in targets.consumers)
    out += [
        ProcTarget(
            w.name,
            "consumer",
            lambda w=w: w.pid if w.alive() else None,
            lambda w=w: _restart_after_kill(w),
            handover=w.kind.startswith("orderly") and peers[w.kind] > 1,
        )
        for w in targets.consumers
    ]
    out += [
        ProcTarget(
            w.name,
            "producer",
            lambda w=w: w.pid if w.alive() else None,
            lambda w=w: _restart_after_kill(w),
            clock_files.get(w.name),
        )
        for w in targets.producers
    ]
    return out


class RealNemesis:
    """The runner's nemesis: ``Nemesis`` (short plan with ``short``) over ``targets``."""

    def __init__(
        self,
        cfg: CampaignConfig,
        targets: Targets,
        recorder: Recorder,
        clock_files: dict[str, Path],
        short: bool,
        notes: list[str],
    ) -> None:
        assert targets.cluster is not None
        self.cfg, self.targets, self.rec = cfg, targets, recorder
        self.nemesis = Nemesis(
            cfg.seed,
            targets.cluster,
            proc_targets(targets, clock_files),
            duration_s=cfg.load_s,
            group=f"{cfg.topic_prefix}_coordinator",
            timing=timing_for(cfg, short),
            short=short,
            watch_topics=[*cfg.topics, f"{cfg.topic_prefix}_half"],
        )
        self.skipped = dict(self.nemesis.skipped)
        if self.skipped and namespaces.inside():  # every kind runs there, or the run fails
            notes.append(f"fault kinds skipped inside the namespaces: {self.skipped}")
        self.recorded: set[tuple] = set()
        self.frozen: dict[tuple, float | None] = {}  # a skew ahead: its group up again at
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.rec.emit(
            ev.note(
                "nemesis plan",
                skipped=self.skipped,
                plan=[
                    {
                        "lane": s.lane,
                        "kind": s.kind,
                        "target": s.target,
                        "hold_s": s.hold_s,
                        "at_s": s.at_s,
                        **s.extra,
                    }
                    for s in self.nemesis.plan
                ],
            )
        )

    def run(self, until_mono: float) -> None:
        """Faults until the load's end, and on until the plan is through (every kind once),
        at most EXTRA_S longer."""
        self.nemesis.start()
        while time.monotonic() < until_mono + EXTRA_S:
            self.record_ended()
            if time.monotonic() >= until_mono and self.nemesis.done() and not self.frozen:
                break
            time.sleep(POLL_S)
        self.record_ended()

    def record_ended(self) -> None:
        """Each fault's event once it has ended (its times are its own, wall-clock)."""
        for e in self.nemesis.events():
            if e["kind"] == "clock_skew" and e["start_ms"] is not None:
                self._frozen_clock(e)
            if e["end_ms"] is not None:
                self._emit(e)

    def _frozen_clock(self, e: dict[str, Any]) -> None:
        """A producer's clock ahead: its group down (see the module's doc) until due."""
        offset = float(str(e["detail"].get("offset", "0")).rstrip("s") or 0)
        key = (str(e["target"]), e["start_ms"])
        if offset <= 0 or key in self.recorded:
            return
        group = producer_names(self.cfg, int(key[0].rsplit("-", 1)[1]))[1]
        if key not in self.frozen:
            self.frozen[key] = None
            self.rec.emit(
                ev.note("clock ahead: liveness counts the group down", group=group, offset_s=offset)
            )
            self.rec.emit(ev.group_state(group, False))
        if e["end_ms"] is not None and self.frozen[key] is None:
            self.frozen[key] = time.monotonic() + offset + SESSION_TIMEOUT_MS / 1000
        due = self.frozen[key]
        if due is not None and time.monotonic() >= due:
            del self.frozen[key]
            self.recorded.add(key)
            self.rec.emit(ev.group_state(group, True))

    def _emit(self, e: dict[str, Any]) -> None:
        key = (e["kind"], str(e["target"]), e["start_ms"])
        if key in self.recorded:
            return
        self.recorded.add(key)
        self.rec.emit(
            ev.fault(
                e["kind"],
                str(e["target"]),
                e["start_ms"],
                end_ms=e["end_ms"],
                seed=e["seed"],
                detail=json.dumps(e["detail"], default=str),
            )
        )

    def heal(self) -> None:
        for e in self.nemesis.stop():
            self._emit(e)
        for target, _start in list(self.frozen):  # the load ended first: up from now
            self.rec.emit(
                ev.group_state(producer_names(self.cfg, int(target.rsplit("-", 1)[1]))[1], True)
            )
        self.frozen.clear()
        logs = sorted(Path(self.cfg.out_dir, "logs").glob("coordinator-*.log"))
        self.rec.emit(ev.note("nemesis observations", **self.nemesis.observations(logs)))
