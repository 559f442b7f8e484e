"""One campaign run, phase by phase, every wait bounded by a deadline.

1. the cluster: a 3-node EmbeddedCluster of its own in the out dir, or one it is handed
   (``tests/cluster/test_campaign.py`` reuses the session's);
2. the workload's topics, two coordinators with shortened horizons, the consumer
   processes, then the producer processes;
3. the load for ``load_s`` while the nemesis acts; then heal;
4. drain: producers stop sending and keep answering back-checks until ``txn pending`` is
   empty (or the settle deadline); then they stop;
5. the final reads (Apache Kafka's Java client, ``txn pending``/``txn discarded``), the
   consumers given time to process what is visible, then stopped; the coordinators stopped;
6. the checkers over the history, the databases and the final reads; a summary; the exit
   code (0 PASS, 1 FAIL) with the seed and the history to replay.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from rmq_semantics.kafka_cluster import EmbeddedCluster
from rmq_semantics.tools.admin import list_pending
from tests.campaign import final_read
from tests.campaign._stubs import (
    CheckResult,
    Nemesis,
    Recorder,
    RunData,
    SmokeNemesis,
    read_history,
    run_checkers,
)
from tests.campaign.config import (
    HEARTBEAT_MS,
    SESSION_TIMEOUT_MS,
    CampaignConfig,
    ConsumerSpec,
)
from tests.campaign.processes import Coordinator, Targets, WorkerProcess
from tests.campaign.workload import committed_rows, create_topics, push_dead_letter_expected

log = logging.getLogger("campaign")

BROKERS = 3
COORDINATORS = 2
READY_TIMEOUT_S = 120.0     # a worker's imports, group join and topic creation
SETTLE_TIMEOUT_S = 180.0    # drain: every transaction decided
DRAIN_TIMEOUT_S = 90.0      # a producer's operations in flight end (a send times out in 30)
CATCH_UP_TIMEOUT_S = 120.0  # consumers process what the final read saw
POLL_S = 2.0
BROKERS_BACK_S = 120.0      # every node registered again after heal


def wait_for_brokers(cluster: EmbeddedCluster, timeout_s: float) -> None:
    """Until the cluster's metadata shows every broker again."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if len(admin.list_topics(timeout=5).brokers) >= cluster.brokers:
                return
        except KafkaException:
            pass
        time.sleep(1)
    raise RuntimeError(f"the cluster did not show {cluster.brokers} brokers within "
                       f"{timeout_s:.0f} s after heal")


@dataclass(frozen=True)
class Options:
    seed: int
    load_s: float
    short: bool
    out_dir: Path
    stub_faults: bool = False  # _stubs.SmokeNemesis until nemesis.py lands


def plan_config(opts: Options, bootstrap: str) -> CampaignConfig:
    run_id = f"cw{opts.seed}x{uuid.uuid4().hex[:4]}"
    consumers = (ConsumerSpec("push", f"{run_id}-push", 1),
                 ConsumerSpec("orderly-partition", f"{run_id}-orderly", 2),
                 ConsumerSpec("orderly-key", f"{run_id}-keyed", 1))
    return CampaignConfig(
        seed=opts.seed, run_id=run_id, bootstrap=bootstrap, out_dir=str(opts.out_dir),
        topic_prefix=f"__{run_id}", topics=tuple(f"{run_id}-t{i}" for i in range(3)),
        partitions=3, load_s=opts.load_s,
        producers=("sync", "sync", "async") if opts.short else ("sync", "sync", "async",
                                                                "async"),
        consumers=consumers, ops_per_s=4.0 if opts.short else 6.0,
        new_topics_per_producer=1 if opts.short else 2)


class Campaign:
    def __init__(self, opts: Options, cluster: EmbeddedCluster | None = None,
                 owns_cluster: bool = False) -> None:
        self.opts = opts
        self.out = opts.out_dir
        self.out.mkdir(parents=True, exist_ok=True)
        self.rec = Recorder(self.out / "history" / "runner.jsonl", "runner")
        self.cluster = cluster
        self.owns_cluster = owns_cluster
        self.cfg: CampaignConfig | None = None
        self.targets: Targets | None = None
        self.notes: list[str] = []
        self.unexpected_exits: list[str] = []
        self.exited: set[str] = set()
        self.dead_letters: dict[str, list[dict]] = {}

    # -- phases ---------------------------------------------------------------------------
    def phase(self, name: str, **fields: object) -> None:
        log.info("campaign: %s", name)
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
        self.rec.record("phase", name=name, **fields)

    def start_cluster(self) -> str:
        if self.cluster is None:
            self.cluster = EmbeddedCluster(self.out / "cluster", brokers=BROKERS)
            self.owns_cluster = True
            self.phase("cluster start", data_dir=str(self.cluster.data_dir))
            self.cluster.start()
        return self.cluster.bootstrap

    def start_processes(self, cfg: CampaignConfig) -> Targets:
        assert self.cluster is not None
        targets = Targets(cfg.bootstrap, self.cluster)
        self.targets = targets
        config_file = cfg.write(self.out)
        create_topics(cfg.bootstrap, list(cfg.topics), cfg.partitions)
        self.phase("coordinators start")
        options = [f"session.timeout.ms={SESSION_TIMEOUT_MS}",
                   f"heartbeat.interval.ms={HEARTBEAT_MS}"]
        for i in range(COORDINATORS):
            name = f"{cfg.run_id}-coord{i}"
            targets.coordinators.append(Coordinator(
                name, cfg.bootstrap, self.out / "logs" / f"coordinator-{i}.log",
                {**cfg.coordinator, "topic_prefix": cfg.topic_prefix}, options))
        for c in targets.coordinators:
            c.start(wait=False)
        for c in targets.coordinators:
            assert c.process is not None
            c.process.wait_ready()
        self.phase("consumers start")
        for spec in cfg.consumers:
            for i in range(spec.count):
                name = f"{spec.role}-{i}"
                targets.consumers.append(WorkerProcess(
                    name, "tests.campaign.consumer_worker",
                    ["--config", str(config_file), "--role", spec.role, "--group", spec.group,
                     "--instance", str(i)], self.out / "logs" / f"{name}.log", spec.role).start())
        self.await_ready(targets.consumers)
        self.phase("producers start")
        for i, api in enumerate(cfg.producers):
            targets.producers.append(WorkerProcess(
                f"producer-{i}", "tests.campaign.producer_worker",
                ["--config", str(config_file), "--index", str(i), "--api", api],
                self.out / "logs" / f"producer-{i}.log", f"producer-{api}").start())
        self.await_ready(targets.producers)
        return targets

    def histories(self) -> list[dict]:
        return read_history(sorted((self.out / "history").glob("*.jsonl")))

    def await_ready(self, workers: list[WorkerProcess]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = {e["proc"] for e in self.histories() if e["kind"] == "ready"}
            dead = [w.name for w in workers if not w.alive()]
            if dead:
                raise RuntimeError(f"workers exited while starting: {dead}; see "
                                   f"{self.out / 'logs'}")
            if all(w.name in ready for w in workers):
                return
            time.sleep(0.5)
        raise RuntimeError(f"workers not ready within {READY_TIMEOUT_S:.0f} s; see "
                           f"{self.out / 'logs'}")

    def load(self, cfg: CampaignConfig, nemesis: Nemesis) -> None:
        self.phase("load", seconds=cfg.load_s)
        until = time.monotonic() + cfg.load_s
        nemesis.run(until)
        self.watch_exits()
        self.phase("heal")
        nemesis.heal()
        self.heal_leftovers()
        self.watch_exits()

    def heal_leftovers(self) -> None:
        """Whatever the nemesis left down or paused is brought back (and noted): every node
        of the cluster, the processes it killed, SIGCONT to every process we own."""
        assert self.targets is not None and self.cluster is not None
        down = [n.node_id for n in self.cluster.nodes() if n.running_pid() is None]
        if down:
            self.notes.append(f"nodes {down} still down after heal")
            for node_id in down:
                self.cluster.start_node(node_id)
        for node in self.cluster.nodes():
            pid = node.running_pid()
            if pid is not None:
                os.kill(pid, signal.SIGCONT)
        for p in [*self.targets.coordinators, *self.targets.workers()]:
            if p.expected_down and not p.alive():
                self.notes.append(f"{p.name} still down after heal")
                p.restart()
            p.signal(signal.SIGCONT)
        wait_for_brokers(self.cluster, BROKERS_BACK_S)

    def watch_exits(self, coordinators_only: bool = False) -> None:
        """A worker or coordinator that exited on its own (not killed by the nemesis, which
        restarts what it kills) is noted once: a failed run, whatever the checkers say."""
        assert self.targets is not None
        workers = [] if coordinators_only else self.targets.workers()
        for w in [*workers, *self.targets.coordinators]:
            if not w.alive() and not w.expected_down and w.name not in self.exited:
                self.exited.add(w.name)
                code = (w.proc.returncode if isinstance(w, WorkerProcess) and w.proc
                        else w.process.poll() if isinstance(w, Coordinator) and w.process
                        else None)
                self.unexpected_exits.append(f"{w.name} (exit {code})")
                self.rec.record("unexpected_exit", name=w.name, code=code)

    def drain(self, cfg: CampaignConfig) -> None:
        assert self.targets is not None
        self.phase("drain")
        for p in self.targets.producers:
            p.signal(signal.SIGUSR1)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            drained = {e["proc"] for e in self.histories() if e["kind"] == "drained"}
            if all(p.name in drained or not p.alive() for p in self.targets.producers):
                break
            time.sleep(POLL_S)
        else:
            self.notes.append(f"producers not drained within {DRAIN_TIMEOUT_S:.0f} s")
        self.phase("settle")
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        conf = {"bootstrap.servers": cfg.bootstrap}
        pending: list = []
        while time.monotonic() < deadline:
            try:
                pending = list_pending(conf, cfg.topic_prefix)
            except Exception as exc:  # the cluster is still recovering: ask again
                self.rec.record("settle_error", error=repr(exc)[:300])
                pending = [exc]
            if not pending:
                break
            time.sleep(POLL_S)
        self.rec.record("settled", pending=len(pending))
        if pending:
            self.notes.append(f"{len(pending)} transactions still pending after "
                              f"{SETTLE_TIMEOUT_S:.0f} s")
        self.watch_exits()
        self.phase("producers stop")
        for p in self.targets.producers:
            p.stop()

    def committed(self) -> dict[str, dict]:
        """The ground truth: every business row whose local transaction committed, from
        every producer's database (read once the producers stopped)."""
        committed: dict[str, dict] = {}
        for db in sorted((self.out / "db").glob("*.sqlite")):
            committed.update(committed_rows(db))
        return {m: r for m, r in committed.items() if r["barrier"] == "msg"}

    def final_reads(self, cfg: CampaignConfig) -> tuple[list[dict], list[dict], list[dict]]:
        self.phase("final read")
        created = sorted({e["topic"] for e in self.histories() if e["kind"] == "topic_created"})
        topics = [*cfg.topics, *created]
        expected: dict[str, int] = {}
        committed = self.committed()
        for row in committed.values():
            expected[row["topic"]] = expected.get(row["topic"], 0) + 1
        push_dlqs = {f"{cfg.topic_prefix}_dlq_{s.group}": s.group for s in cfg.consumers
                     if s.role == "push"}
        for dlq in push_dlqs:
            expected[dlq] = sum(1 for m in committed if push_dead_letter_expected(m))
        reads = final_read.read_topics(cfg.bootstrap, [*topics, *push_dlqs],
                                       self.out / "final", expected)
        for r in reads:
            if r.error or r.exit_code not in (0, None):
                self.notes.append(f"final read of {r.topic}: exit {r.exit_code} {r.error}")
            if r.processed is not None and r.processed != len(r.records):
                self.notes.append(f"final read of {r.topic}: tool counted {r.processed}, "
                                  f"parsed {len(r.records)}")
        visible = [rec for r in reads if r.topic not in push_dlqs for rec in r.records]
        self.dead_letters = {push_dlqs[r.topic]: r.records for r in reads
                             if r.topic in push_dlqs}
        pending, error = final_read.txn_listing(cfg.bootstrap, cfg.topic_prefix, "pending",
                                                self.out / "final")
        discarded, error2 = final_read.txn_listing(cfg.bootstrap, cfg.topic_prefix,
                                                   "discarded", self.out / "final")
        self.notes += [e for e in (error, error2) if e]
        return visible, pending, discarded

    def catch_up(self, cfg: CampaignConfig, visible: list[dict]) -> None:
        """Let every consumer group process what the final read saw, then stop them."""
        assert self.targets is not None
        self.phase("consumers catch up")
        wanted = {r["mid"] for r in visible if r.get("mid")}
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        missing: dict[str, int] = {}
        while time.monotonic() < deadline:
            done: dict[str, set] = {s.group: set() for s in cfg.consumers}
            for e in self.histories():
                if e["kind"] == "process" and e.get("mid"):
                    done.setdefault(e["group"], set()).add(e["mid"])
            missing = {g: len(wanted - mids) for g, mids in done.items() if wanted - mids}
            if not missing:
                break
            time.sleep(POLL_S)
        self.rec.record("caught_up", missing=missing)
        self.phase("consumers stop")
        for c in self.targets.consumers:
            c.stop()

    def stop_coordinators(self) -> None:
        assert self.targets is not None
        self.watch_exits(coordinators_only=True)
        self.phase("coordinators stop")
        for c in self.targets.coordinators:
            code = c.stop()
            self.rec.record("coordinator_stopped", name=c.name, code=code)

    # -- the whole run ----------------------------------------------------------------------
    def run(self) -> int:
        started = time.monotonic()
        results: list[CheckResult] = []
        try:
            bootstrap = self.start_cluster()
            cfg = self.cfg = plan_config(self.opts, bootstrap)
            self.rec.record("run_start", seed=cfg.seed, run_id=cfg.run_id, short=self.opts.short)
            targets = self.start_processes(cfg)
            nemesis = (SmokeNemesis if self.opts.stub_faults else Nemesis)(cfg.seed, targets,
                                                                           self.rec)
            self.load(cfg, nemesis)
            self.drain(cfg)
            visible, pending, discarded = self.final_reads(cfg)
            self.catch_up(cfg, visible)
            self.stop_coordinators()
            results = self.check(cfg, visible, pending, discarded)
        except Exception as exc:  # a phase failed: the run fails with its reason
            log.exception("campaign: the run failed")
            results.append(CheckResult("run-completed", False, f"{type(exc).__name__}: {exc}"))
        finally:
            self.teardown()
        return self.report(results, time.monotonic() - started)

    def check(self, cfg: CampaignConfig, visible: list[dict], pending: list[dict],
              discarded: list[dict]) -> list[CheckResult]:
        self.phase("check")
        committed = self.committed()
        (self.out / "final" / "committed.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in committed.values()))
        run = RunData(self.histories(), committed, visible, pending, discarded,
                      self.dead_letters)
        results = run_checkers(run)
        results.append(CheckResult("no-unexpected-exit", not self.unexpected_exits,
                                   ", ".join(self.unexpected_exits) or "none"))
        results.append(CheckResult("run-completed", not self.notes,
                                   "; ".join(self.notes) or "every phase within its deadline"))
        return results

    def teardown(self) -> None:
        """Stop whatever is still running, by pid; the owned cluster last."""
        if self.targets is not None:
            for w in self.targets.workers():
                w.stop(10)
            for c in self.targets.coordinators:
                c.stop(20)
        if self.cluster is not None and self.owns_cluster:
            self.cluster.stop(kill=False)
        self.rec.close()

    def report(self, results: list[CheckResult], elapsed_s: float) -> int:
        events = self.histories()
        counts: dict[str, int] = {}
        for e in events:
            if e["kind"] in ("send", "sent", "send_failed", "check", "process",
                             "topic_created"):
                counts[e["kind"]] = counts.get(e["kind"], 0) + 1
        passed = all(r.passed for r in results)
        lines = [f"campaign seed {self.opts.seed}: {'PASS' if passed else 'FAIL'} in "
                 f"{elapsed_s:.0f} s (out: {self.out})",
                 "events: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
        lines += [f"  {'PASS' if r.passed else 'FAIL'}  {r.name}: {r.detail}" for r in results]
        if not passed:
            lines.append(f"replay: python -m tests.campaign --seed {self.opts.seed} "
                         f"--duration {self.opts.load_s:.0f}"
                         f"{' --short' if self.opts.short else ''}; history in "
                         f"{self.out / 'history'}")
        text = "\n".join(lines)
        print(text, flush=True)
        (self.out / "summary.txt").write_text(text + "\n")
        (self.out / "summary.json").write_text(json.dumps(
            {"seed": self.opts.seed, "passed": passed, "elapsed_s": elapsed_s,
             "counts": counts, "checks": [r.__dict__ for r in results]}, indent=1))
        return 0 if passed else 1


def default_out(seed: int) -> Path:
    return Path("/tmp") / f"rmq-campaign-{seed}-{time.strftime('%Y%m%d-%H%M%S')}-" \
                          f"{random.randrange(1 << 16):04x}"
