"""One campaign run, phase by phase, every wait bounded by a deadline.

1. the cluster: a 3-node EmbeddedCluster of its own in the out dir, or one it is handed
   (``tests/cluster/test_campaign.py`` reuses the session's);
2. the workload's topics, two coordinators with shortened horizons, the consumer
   processes, then the producer processes; a watcher records leader changes and whether
   each producer group is up (observe.Watcher);
3. the load for ``load_s`` while the nemesis acts; then heal;
4. drain: producers stop sending and keep answering back-checks until ``txn pending`` is
   empty (or the settle deadline); then they stop;
5. the final read by Apache Kafka's Java client and ``txn pending``/``txn discarded``; the
   consumers given time to process what is visible, then stopped; the push group's DLQ
   read; the coordinators stopped, then Kafka's TransactionsCommand ``find-hanging`` on
   every broker and ``list``;
6. into the history: exits, the lock service's grants (its lock topic), rebalance and
   fenced lines of the logs, the committed rows and the final read; the checkers over it,
   each printing its line, the summary table; the exit code (0 PASS, 1 FAIL) with the seed
   and the history to replay.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rmq_semantics.kafka_cluster import EmbeddedCluster
from rmq_semantics.tools.admin import list_pending
from tests.campaign import events as ev
from tests.campaign import final_read, gather, observe, wire
from tests.campaign.checkers import check_worker_exits, read_topics, run_all, timer_counts
from tests.campaign.clock import clock_file_env, faketime_available
from tests.campaign.config import (
    HEARTBEAT_MS,
    SESSION_TIMEOUT_MS,
    CampaignConfig,
    ConsumerSpec,
)
from tests.campaign.history import History, Kind, Recorder, load
from tests.campaign.processes import Coordinator, Targets, WorkerProcess
from tests.campaign.producer_worker import names as producer_names
from tests.campaign.result import CheckResult, Violation
from tests.campaign.simple_checks import simple_unsettled
from tests.campaign.smoke import pick_nemesis
from tests.campaign.spark_lane import SparkLane
from tests.campaign.summary import render_summary
from tests.campaign.workload import (
    create_topics,
    push_dead_letter_expected,
    simple_dead_letter_expected,
)

log = logging.getLogger("campaign")

BROKERS = 3
COORDINATORS = 2
READY_TIMEOUT_S = 120.0  # a worker's imports, group join and topic creation
SETTLE_TIMEOUT_S = 180.0  # drain: every transaction decided
DRAIN_TIMEOUT_S = 90.0  # a producer's operations in flight end (a send times out in 30)
CATCH_UP_TIMEOUT_S = 120.0  # consumers process what the final read saw
# A SimpleConsumer's poison message is dead-lettered at the next receive after its last
# delivery's invisible duration: this long for that receive and the DLQ's acks=all write.
SIMPLE_DEAD_WAIT_MS = 3000
POLL_S = 2.0
BROKERS_BACK_S = 120.0  # every node registered again after heal
# An UNKNOW transaction is decided within this much up-time of its producer group: a
# check is due transaction_timeout_ms after the half, then every check_interval_ms; a
# coordinator's takeover after a fault adds a session timeout and its recovery read.
HORIZON_S = 60.0
# How far ahead the producers' timer messages are due at most (tests/campaign/workload.py).
TIMER_MAX_SHORT_S = 20.0
TIMER_MAX_LONG_S = 90.0
# Before the final read the runner waits until every timer message is this long past due
# (the timer checker expects each one due that long before the read to be visible), but
# no longer than TIMER_WAIT_MAX_S (a skewed producer's clock ahead puts its times later).
TIMER_GRACE_S = 15.0
TIMER_WAIT_MAX_S = 120.0


@dataclass(frozen=True)
class Options:
    seed: int
    load_s: float
    short: bool
    out_dir: Path
    stub_faults: bool = False  # smoke.SmokeNemesis until nemesis.py lands
    calm: bool = False  # no nemesis at all (else nemesis.py's when it exists)
    minimums: Mapping[str, int] | None = None  # None: by the nemesis (0 in calm weather)
    horizon_s: float = HORIZON_S


def plan_config(opts: Options, bootstrap: str) -> CampaignConfig:
    run_id = f"cw{opts.seed}x{uuid.uuid4().hex[:4]}"
    consumers = (
        ConsumerSpec("push", f"{run_id}-push", 1),
        ConsumerSpec("orderly-partition", f"{run_id}-orderly", 2),
        ConsumerSpec("orderly-key", f"{run_id}-keyed", 1),
        ConsumerSpec("simple", f"{run_id}-simple", 2),
    )
    return CampaignConfig(
        seed=opts.seed,
        run_id=run_id,
        bootstrap=bootstrap,
        out_dir=str(opts.out_dir),
        topic_prefix=f"__{run_id}",
        topics=tuple(f"{run_id}-t{i}" for i in range(3)),
        partitions=3,
        load_s=opts.load_s,
        producers=("sync", "sync", "async") if opts.short else ("sync", "sync", "async", "async"),
        consumers=consumers,
        ops_per_s=4.0 if opts.short else 6.0,
        new_topics_per_producer=1 if opts.short else 2,
        # Short: every timer is due well before the final read; long: minutes ahead too.
        timer_max_s=TIMER_MAX_SHORT_S if opts.short else TIMER_MAX_LONG_S,
    )


class Campaign:
    def __init__(
        self, opts: Options, cluster: EmbeddedCluster | None = None, owns_cluster: bool = False
    ) -> None:
        self.opts = opts
        self.out = opts.out_dir
        self.out.mkdir(parents=True, exist_ok=True)
        self.history_dir = self.out / "history"
        self.rec = Recorder(self.history_dir / "runner.jsonl", "runner")
        self.cluster = cluster
        self.owns_cluster = owns_cluster
        self.cfg: CampaignConfig | None = None
        self.targets: Targets | None = None
        self.watcher: observe.Watcher | None = None
        self.notes: list[str] = []
        self.exited: set[str] = set()
        self.load_started_ms = 0
        self.stopping_ms: int | None = None  # the coordinators are being stopped from here
        self.txn_tools: tuple[str | None, str | None, dict[int, str], str] | None = None
        self.real_nemesis = False  # nemesis.py's: namespaced cluster, a skewable producer
        self.clock_files: dict[str, Path] = {}
        self.spark: SparkLane | None = None  # the long run's Spark job

    # -- phases ---------------------------------------------------------------------------
    def phase(self, name: str, **fields: object) -> None:
        log.info("campaign: %s", name)
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
        self.rec.emit(ev.note(name, **fields))

    def history(self) -> History:
        return load(self.history_dir)

    def start_cluster(self) -> str:
        if self.cluster is None:
            self.cluster = (
                wire.prepare_cluster(self.out / "cluster", BROKERS)
                if self.real_nemesis
                else EmbeddedCluster(self.out / "cluster", brokers=BROKERS)
            )
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
        options = [
            f"session.timeout.ms={SESSION_TIMEOUT_MS}",
            f"heartbeat.interval.ms={HEARTBEAT_MS}",
        ]
        for i in range(COORDINATORS):
            name = f"{cfg.run_id}-coord{i}"
            targets.coordinators.append(
                Coordinator(
                    name,
                    cfg.bootstrap,
                    self.out / "logs" / f"coordinator-{i}.log",
                    {**cfg.coordinator, "topic_prefix": cfg.topic_prefix},
                    options,
                )
            )
        for c in targets.coordinators:
            c.start(wait=False)
        for c in targets.coordinators:
            assert c.process is not None
            c.process.wait_ready()
        self.phase("consumers start")
        for spec in cfg.consumers:
            for i in range(spec.count):
                name = f"{spec.role}-{i}"
                args = ["--config", str(config_file), "--group", spec.group, "--instance", str(i)]
                module = "tests.campaign.simple_worker"
                if spec.role != "simple":
                    module, args = "tests.campaign.consumer_worker", [*args, "--role", spec.role]
                targets.consumers.append(
                    WorkerProcess(
                        name,
                        module,
                        args,
                        self.out / "logs" / f"{name}.log",
                        spec.role,
                    ).start()
                )
        self.await_ready(targets.consumers)
        self.phase("producers start")
        for i, api in enumerate(cfg.producers):
            name, env = f"producer-{i}", None
            if self.real_nemesis and name == wire.SKEWED_PRODUCER and faketime_available() is None:
                self.clock_files[name] = self.out / f"clock-{name}"
                env = clock_file_env(self.clock_files[name])
            targets.producers.append(
                WorkerProcess(
                    name,
                    "tests.campaign.producer_worker",
                    ["--config", str(config_file), "--index", str(i), "--api", api],
                    self.out / "logs" / f"{name}.log",
                    f"producer-{api}",
                ).start(env)
            )
        self.await_ready(targets.producers)
        return targets

    def workers_in(self, state: str) -> set[str]:
        return {e.proc for e in self.history().of(Kind.WORKER) if e["state"] == state}

    def await_ready(self, workers: list[WorkerProcess]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [w.name for w in workers if not w.alive()]
            if dead:
                raise RuntimeError(
                    f"workers exited while starting: {dead}; see {self.out / 'logs'}"
                )
            if {w.name for w in workers} <= self.workers_in("ready"):
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"workers not ready within {READY_TIMEOUT_S:.0f} s; see {self.out / 'logs'}"
        )

    def start_watcher(self, cfg: CampaignConfig, targets: Targets) -> None:
        groups = [(producer_names(cfg, i)[1], p) for i, p in enumerate(targets.producers)]
        self.watcher = observe.Watcher(
            cfg.bootstrap,
            self.rec,
            lambda t: t.startswith((f"{cfg.run_id}-", cfg.topic_prefix)),
            lambda: groups,
        )
        self.watcher.start()

    def load(self, cfg: CampaignConfig, nemesis: object) -> None:
        self.phase("load", seconds=cfg.load_s)
        self.load_started_ms = time.time_ns() // 1_000_000
        if not self.opts.short and not self.opts.calm:
            self.spark = SparkLane(cfg, self.out)
            self.spark.start()
        until = time.monotonic() + cfg.load_s
        nemesis.run(until)  # type: ignore[attr-defined]
        self.watch_exits()
        self.phase("heal")
        nemesis.heal()  # type: ignore[attr-defined]
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
        observe.wait_for_brokers(self.cluster, BROKERS_BACK_S)

    def watch_exits(self) -> None:
        """A worker or coordinator that exited on its own (the nemesis restarts what it
        kills) is noted at once; its exit event is written at the end (record_exits)."""
        assert self.targets is not None
        for w in [*self.targets.workers(), *self.targets.coordinators]:
            if not w.alive() and not w.expected_down and w.name not in self.exited:
                self.exited.add(w.name)
                self.rec.emit(ev.note("unexpected exit", process=w.name))

    def drain(self, cfg: CampaignConfig) -> None:
        assert self.targets is not None
        self.phase("drain")
        for p in self.targets.producers:
            p.signal(signal.SIGUSR1)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            drained = self.workers_in("drained")
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
                self.rec.emit(ev.note("settle: txn pending failed", error=repr(exc)[:300]))
                pending = [exc]
            if not pending:
                break
            time.sleep(POLL_S)
        self.rec.emit(ev.run("settled", params={"pending": len(pending)}))
        if pending:
            self.notes.append(
                f"{len(pending)} transactions still pending after {SETTLE_TIMEOUT_S:.0f} s"
            )
        self.watch_exits()
        self.phase("producers stop")
        for p in self.targets.producers:
            p.stop()

    def await_timers(self) -> None:
        """Wait until every timer message sent is TIMER_GRACE_S past due (its
        ``rmq.deliver_at`` is a time on the coordinators' clock, this one's), at most
        TIMER_WAIT_MAX_S; the settle phase usually covered it."""
        due = [e["deliver_hi_ms"] for e in self.history().of(Kind.TIMER_SENT) if e["ok"]]
        if not due:
            return
        wait_s = (max(due) / 1000 + TIMER_GRACE_S) - time.time()
        if wait_s > 0:
            self.phase("timers due", wait_s=round(min(wait_s, TIMER_WAIT_MAX_S), 1))
            time.sleep(min(wait_s, TIMER_WAIT_MAX_S))

    def final_reads(self, cfg: CampaignConfig) -> list[final_read.TopicRead]:
        """The workload's topics by the Java client, and txn pending/discarded."""
        self.await_timers()
        self.phase("final read")
        expected: dict[str, int] = {}
        for row in gather.committed(self.out / "db").values():
            expected[row["topic"]] = expected.get(row["topic"], 0) + 1
        # The timer messages sent and not recalled land there too (a count that differs
        # only makes a topic be read again, with a longer wait).
        for topic, n in timer_counts(self.history()).items():
            expected[topic] = expected.get(topic, 0) + n
        # Seed 1: a topic whose create call failed (its broker killed) was created and
        # written all the same, with no `topic_created` event: the cluster's list counts.
        created = {e["topic"] for e in self.history().of(Kind.TOPIC_CREATED)}
        created |= set(expected) | final_read.listed_topics(cfg.bootstrap, cfg.real_topic_pattern)
        topics = [*cfg.topics, *sorted(created - set(cfg.topics))]
        reads = final_read.read_topics(cfg.bootstrap, topics, self.out / "final", expected)
        self.note_read_errors(reads)
        pending, error = final_read.txn_listing(
            cfg.bootstrap, cfg.topic_prefix, "pending", self.out / "final"
        )
        discarded, error2 = final_read.txn_listing(
            cfg.bootstrap, cfg.topic_prefix, "discarded", self.out / "final"
        )
        self.notes += [e for e in (error, error2) if e]
        self.txn_tools = (pending, discarded, {}, "")
        return reads

    def note_read_errors(self, reads: list[final_read.TopicRead]) -> None:
        for r in reads:
            if r.error or r.exit_code not in (0, None):
                self.notes.append(f"final read of {r.topic}: exit {r.exit_code} {r.error}")
            if r.processed is not None and r.processed != len(r.records):
                self.notes.append(
                    f"final read of {r.topic}: tool counted {r.processed}, parsed {len(r.records)}"
                )

    def catch_up(self, cfg: CampaignConfig, reads: list[final_read.TopicRead]) -> None:
        """Let every consumer group process what the final read saw (the push group's
        planned dead letters: their last attempt), then stop them."""
        assert self.targets is not None
        self.phase("consumers catch up")
        wanted = {r["mid"] for read in reads for r in read.records if r.get("mid")}
        # The SimpleConsumer group reads the first topics only (its subscription is by name).
        wanted_simple = {
            r["mid"] for read in reads if read.topic in cfg.topics for r in read.records
        } & wanted
        simple = [s.group for s in cfg.consumers if s.role == "simple"]
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        missing: dict[str, int] = {}
        while time.monotonic() < deadline:
            history = self.history()
            done: dict[str, set] = {s.group: set() for s in cfg.consumers if s.group not in simple}
            for e in history.of(Kind.CONSUMED):
                last_try = e.get(
                    "reconsume_times", 0
                ) >= cfg.push_max_reconsume and push_dead_letter_expected(e["msg_id"])
                if e.get("result", "SUCCESS") == "SUCCESS" or last_try:
                    done.setdefault(e["group"], set()).add(e["msg_id"])
            missing = {g: len(wanted - mids) for g, mids in done.items() if wanted - mids}
            for group in simple:
                left = simple_unsettled(
                    history,
                    group,
                    wanted_simple,
                    wait_dead_ms=int(cfg.simple_invisible_s * 1000) + SIMPLE_DEAD_WAIT_MS,
                    now_ms=time.time_ns() // 1_000_000,
                )
                if left:
                    missing[group] = len(left)
            if not missing:
                break
            time.sleep(POLL_S)
        self.rec.emit(ev.note("consumers caught up", missing=missing))
        self.phase("consumers stop")
        for c in self.targets.consumers:
            c.stop()

    def dead_letters(self, cfg: CampaignConfig, reads: list[final_read.TopicRead]) -> list:
        """The push and SimpleConsumer groups' DLQ topics by the Java client, as dlq events."""
        visible = {r["mid"] for read in reads for r in read.records if r.get("mid")}
        planned = {
            "push": sum(1 for m in visible if push_dead_letter_expected(m)),
            "simple": sum(
                1
                for read in reads
                if read.topic in cfg.topics
                for r in read.records
                if r.get("mid") and simple_dead_letter_expected(r["mid"])
            ),
        }
        groups = {
            f"{cfg.topic_prefix}_dlq_{spec.group}": spec
            for spec in cfg.consumers
            if spec.role in planned
        }
        want = {topic: planned[spec.role] for topic, spec in groups.items()}
        dlq = final_read.read_topics(cfg.bootstrap, list(groups), self.out / "final" / "dlq", want)
        self.note_read_errors([r for r in dlq if want[r.topic] or r.exit_code == 0])
        drafts = []
        for read in dlq:
            spec = groups[read.topic]
            drafts += gather.dead_letter_drafts(spec.group, [read], spec.role)
        return drafts

    def stop_coordinators(self, cfg: CampaignConfig) -> None:
        assert self.targets is not None and self.cluster is not None
        self.watch_exits()
        self.phase("coordinators stop")
        self.stopping_ms = time.time_ns() // 1_000_000
        for c in self.targets.coordinators:
            c.stop()
        self.phase("kafka transactions")
        hanging, listing = gather.kafka_transactions(
            cfg.bootstrap, [n.node_id for n in self.cluster.nodes()], self.out / "final"
        )
        assert self.txn_tools is not None
        self.txn_tools = (*self.txn_tools[:2], hanging, listing)

    # -- into the history -------------------------------------------------------------------
    def record_end(
        self, cfg: CampaignConfig, reads: list[final_read.TopicRead], dead: list
    ) -> None:
        """Exits, lock grants, log observations, ground truth and final read as events."""
        assert self.targets is not None
        self.phase("record")
        with Recorder(self.history_dir / "final.jsonl", "final", flush_every=500) as out:
            for role, procs in (
                ("coordinator", self.targets.coordinators),
                ("producer", self.targets.producers),
                ("consumer", self.targets.consumers),
            ):
                for p in procs:
                    for end in p.ended:
                        out.emit(
                            ev.exit_(
                                role,
                                p.name,
                                end.code,
                                killed_by_nemesis=end.killed,
                                stopped=end.stopped,
                            )
                        )
            entries, skipped = observe.read_lock_topic(cfg.bootstrap, f"{cfg.topic_prefix}_lock")
            self.notes += [f"lock topic: {s}" for s in skipped[:5]]
            logs = {p.stem: p for p in sorted((self.out / "logs").glob("*.log"))}
            window = (self.load_started_ms, self.stopping_ms)
            for draft in [
                *observe.lock_drafts(entries, *window),
                *observe.log_drafts(logs, *window),
                *gather.committed_drafts(gather.committed(self.out / "db")),
                *gather.final_read_drafts(reads),
                *dead,
            ]:
                out.emit(draft)
            out.emit(ev.run("end", seed=cfg.seed))

    # -- the whole run ----------------------------------------------------------------------
    def run(self) -> int:
        started = time.monotonic()
        results: list[CheckResult] = []
        nemesis_cls, minimums = pick_nemesis(
            self.opts.calm, self.opts.stub_faults, self.opts.minimums
        )
        if nemesis_cls.__name__ == "Nemesis":
            self.real_nemesis = True
            minimums = dict(self.opts.minimums if self.opts.minimums is not None else wire.MINIMUMS)
        try:
            bootstrap = self.start_cluster()
            cfg = self.cfg = plan_config(self.opts, bootstrap)
            self.rec.emit(
                ev.run(
                    "start",
                    seed=cfg.seed,
                    params={
                        "run_id": cfg.run_id,
                        "short": self.opts.short,
                        "load_s": cfg.load_s,
                        "nemesis": nemesis_cls.__name__,
                        "minimums": minimums,
                        "horizon_s": self.opts.horizon_s,
                    },
                )
            )
            targets = self.start_processes(cfg)
            self.start_watcher(cfg, targets)
            self.load(
                cfg,
                nemesis_cls(cfg.seed, targets, self.rec)
                if not self.real_nemesis
                else wire.RealNemesis(
                    cfg, targets, self.rec, self.clock_files, self.opts.short, self.notes
                ),
            )
            self.drain(cfg)
            reads = self.final_reads(cfg)
            self.catch_up(cfg, reads)
            dead = self.dead_letters(cfg, reads)
            if self.spark is not None:
                self.phase("spark catch up")
                dead += self.spark.finish()  # spark_row events, recorded with the rest
                self.notes += self.spark.notes
            self.stop_coordinators(cfg)
            if self.watcher is not None:
                self.watcher.stop()
                self.watcher = None  # its AdminClient goes before the cluster does
            self.record_end(cfg, reads, dead)
            results = self.check(cfg, minimums)
        except Exception as exc:  # a phase failed: the run fails with its reason
            log.exception("campaign: the run failed")
            results.append(
                CheckResult.of(
                    "run",
                    "the run did not complete",
                    [Violation("phase_failed", f"{type(exc).__name__}: {exc}")],
                )
            )
        finally:
            self.teardown()
        return self.report(results, time.monotonic() - started)

    def check(self, cfg: CampaignConfig, minimums: Mapping[str, int]) -> list[CheckResult]:
        self.phase("check")
        history = self.history()
        assert self.txn_tools is not None
        pending, discarded, hanging, listing = self.txn_tools
        results = run_all(
            history,
            horizon_s=self.opts.horizon_s,
            minimums=minimums,
            pending=pending if pending is not None else "txn pending failed",
            discarded=discarded if discarded is not None else "txn discarded failed",
            find_hanging=hanging,
            txn_list=listing,
            txn_id_prefix=cfg.topic_prefix,
            topic_prefixes=[f"{cfg.run_id}-", cfg.topic_prefix],
            topics=read_topics(history),
            dead_letter_expected=push_dead_letter_expected,
            push_max_reconsume_times=cfg.push_max_reconsume,
            spark_rows=[] if self.spark is not None and not history.of(Kind.SPARK_ROW) else None,
        )
        results.append(check_worker_exits(history))
        results.append(
            CheckResult.of(
                "run",
                "every phase within its deadline"
                if not self.notes
                else f"{len(self.notes)} remarks",
                [Violation("remark", n) for n in self.notes],
            ).print()
        )
        return results

    def teardown(self) -> None:
        """Stop whatever is still running, by pid; the owned cluster last. A step that
        fails is logged and the next one still runs."""
        steps: list = []
        if self.watcher is not None:
            steps.append(self.watcher.stop)
        if self.targets is not None:
            steps += [lambda w=w: w.stop(10) for w in self.targets.workers()]
            steps += [lambda c=c: c.stop(20) for c in self.targets.coordinators]
        if self.cluster is not None and self.owns_cluster:
            steps.append(lambda: self.cluster.stop(kill=False))  # type: ignore[union-attr]
        for step in steps:
            try:
                step()
            except Exception:
                log.exception("campaign: a teardown step failed")
        self.rec.close()

    def report(self, results: list[CheckResult], elapsed_s: float) -> int:
        history = self.history()
        passed = all(r.passed for r in results)
        text = render_summary(
            history, results, seed=self.opts.seed, history_paths=[str(self.history_dir)]
        )
        verdict = (
            f"campaign seed {self.opts.seed}: {'PASS' if passed else 'FAIL'} in "
            f"{elapsed_s:.0f} s (out: {self.out})"
        )
        lines = [r.line() for r in results]
        if not passed:
            lines.append(
                f"replay: python -m tests.campaign --seed {self.opts.seed} "
                f"--duration {self.opts.load_s:.0f}"
                f"{' --short' if self.opts.short else ''}"
                f"{' --stub-faults' if self.opts.stub_faults else ''}"
                f"{' --calm' if self.opts.calm else ''}; history in "
                f"{self.history_dir}"
            )
        print(verdict if passed else "\n".join([verdict, lines[-1]]), flush=True)
        (self.out / "summary.txt").write_text("\n".join([verdict, *lines, text]) + "\n")
        (self.out / "summary.json").write_text(
            json.dumps(
                {
                    "seed": self.opts.seed,
                    "passed": passed,
                    "elapsed_s": elapsed_s,
                    "checks": [
                        {
                            "name": r.name,
                            "status": r.status.value,
                            "summary": r.summary,
                            "violations": [str(v) for v in r.violations[:50]],
                        }
                        for r in results
                    ],
                },
                indent=1,
            )
        )
        return 0 if passed else 1


def default_out(seed: int) -> Path:
    return (
        Path("/tmp") / f"rmq-campaign-{seed}-{time.strftime('%Y%m%d-%H%M%S')}-"
        f"{random.randrange(1 << 16):04x}"
    )
