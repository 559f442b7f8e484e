"""``rmq-semantics bench``: what the semantics cost, side by side with raw Kafka.

Every case runs against one embedded broker, after a warm-up, repeated (median). Results go
to one JSON file (with the machine's cores and versions) and PNG plots beside it.
Benchmarks are scripts, not tests: nothing here asserts a timing. This module holds the
transactional and Spark cases and the run; the orderly case and the plots have their own.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from rmq_semantics.embedded import EmbeddedKafka, free_port, kafka_version
from rmq_semantics.message import Message
from rmq_semantics.records.headers import H
from rmq_semantics.tools.bench.common import (
    CASE_TIMEOUT_S,
    TXN_BATCH,
    WARM_UP,
    BenchSettings,
    fill,
    percentile,
)
from rmq_semantics.tools.bench.orderly import bench_orderly
from rmq_semantics.tools.bench.plots import plot
from rmq_semantics.tools.bench.threads import bench_threads
from rmq_semantics.tools.coordinator_process import CoordinatorProcess
from rmq_semantics.topics import ensure_topics
from rmq_semantics.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
)

__all__ = ["BenchSettings", "register_cli", "run_bench"]


def _consumer(conf: dict, topic: str, partitions: int) -> confluent_kafka.Consumer:
    consumer = confluent_kafka.Consumer({
        **conf, "group.id": f"bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "fetch.wait.max.ms": 10,
        "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                     for p in range(partitions)])
    return consumer


def _collect(conf: dict, topic: str, partitions: int, want: int, warm_up: int,
             warmed: Any, results: Any) -> None:
    """The collector process: consume until ``want`` records came; send back the count, when
    it finished and when each txn id became visible (CLOCK_MONOTONIC is system-wide)."""
    consumer = _consumer(conf, topic, partitions)
    count, visible = 0, {}
    deadline = time.monotonic() + CASE_TIMEOUT_S
    try:
        while count < want and time.monotonic() < deadline:
            # Wait for one record, then take what is queued without waiting for more.
            first = consumer.poll(0.05)
            if first is None:
                continue
            for msg in [first, *consumer.consume(999, 0)]:
                if msg.error() is not None:
                    continue
                now = time.monotonic()
                count += 1
                if count == warm_up:
                    warmed.set()
                for name, value in msg.headers() or []:
                    if name == H.TXN_ID:
                        visible[value] = now
        results.send((count, time.monotonic(), visible))
    finally:
        consumer.close()


class Collector:
    """Consumes ``topic`` until ``warm_up + want`` records came, in a process of its own (as
    a real consumer would be: in the producer's process it competed with the producer for
    the GIL and measured itself). The clock starts once the ``warm_up`` records came: then
    every client on the path is connected and knows the topic."""

    def __init__(self, conf: dict, topic: str, partitions: int, want: int,
                 warm_up: int = 1) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # never fork a process with librdkafka
        self.warm_up = max(1, warm_up)
        self.warmed = ctx.Event()
        self._results, child_end = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_collect, daemon=True,
            args=(conf, topic, partitions, self.warm_up + want, self.warm_up, self.warmed,
                  child_end))
        self.count = 0
        self.done_at: float | None = None
        self.visible: dict[bytes, float] = {}

    def start(self) -> None:
        self._process.start()

    def wait_warm(self) -> None:
        if not self.warmed.wait(CASE_TIMEOUT_S):
            raise RuntimeError(f"the {self.warm_up} warm-up records never arrived")

    def join(self, timeout: float) -> None:
        if self._results.poll(timeout):
            self.count, self.done_at, self.visible = self._results.recv()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()

    @property
    def measured(self) -> int:
        return max(0, self.count - self.warm_up)


def bench_baseline(conf: dict, s: BenchSettings) -> float:
    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    collector = Collector(conf, topic, s.partitions, s.count, warm_up=WARM_UP)
    collector.start()
    producer = confluent_kafka.Producer({**conf, "enable.idempotence": True, "acks": "all",
                                         "linger.ms": 5})
    value = os.urandom(s.size)
    for _ in range(WARM_UP):
        producer.produce(topic, value)
    producer.flush(60)
    collector.wait_warm()
    start = time.monotonic()
    for i in range(s.count):
        while True:
            try:
                producer.produce(topic, value, key=str(i % 1000).encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    collector.join(CASE_TIMEOUT_S)
    return collector.measured / ((collector.done_at or time.monotonic()) - start)


class NoopListener(TransactionListener):
    """Commits everything; records when each decision was taken and each check came."""

    def __init__(self, answer: LocalTransactionState = LocalTransactionState.COMMIT_MESSAGE):
        self.answer = answer
        self.decided: dict[str, float] = {}
        self.checked: dict[str, float] = {}

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        self.decided[msg.transaction_id or ""] = time.monotonic()
        return self.answer

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        self.checked[msg.transaction_id or ""] = time.time()
        return LocalTransactionState.COMMIT_MESSAGE


def _coordinator(bootstrap: str, prefix: str, **settings: object) -> CoordinatorProcess:
    log_path = Path(tempfile.gettempdir()) / f"rmq-bench-{prefix}.log"
    return CoordinatorProcess(bootstrap, log_path, settings={"topic_prefix": prefix, **settings})


def bench_txn(conf: dict, prefix: str, s: BenchSettings, count: int,
              rate: int | None = None) -> tuple[float, list[float], str]:
    """Throughput (msgs/s) and commit-to-visible latencies (ms); ``rate`` paces the sends."""
    topic = f"bench-txn-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    listener = NoopListener()
    collector = Collector(conf, topic, s.partitions, count, warm_up=WARM_UP)
    collector.start()
    value = os.urandom(s.size)
    with TransactionProducer({**conf, "linger.ms": 1}, producer_group="bench",
                             listener=listener, topic_prefix=prefix,
                             half_partitions=s.partitions) as producer:
        producer.send_messages_in_transaction([Message(topic, value) for _ in range(WARM_UP)])
        collector.wait_warm()
        listener.decided.clear()
        start = time.monotonic()
        if rate is None:
            for i in range(0, count, TXN_BATCH):
                producer.send_messages_in_transaction(
                    [Message(topic, value, key=str(j % 1000)) for j in range(i, min(count,
                                                                                 i + TXN_BATCH))])
        else:
            batch = max(1, rate // 100)  # a batch every 10 ms
            for i in range(0, count, batch):
                due = start + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                producer.send_messages_in_transaction(
                    [Message(topic, value, key=str(j % 1000)) for j in range(i, min(count,
                                                                                 i + batch))])
        producer.flush(60)
        collector.join(CASE_TIMEOUT_S)
    elapsed = (collector.done_at or time.monotonic()) - start
    latencies = [(collector.visible[t.encode()] - at) * 1000
                 for t, at in listener.decided.items() if t.encode() in collector.visible]
    return collector.measured / elapsed, latencies, topic


def bench_check_lateness(conf: dict, bootstrap: str, s: BenchSettings) -> list[float]:
    prefix = f"__rmqbenchchk{uuid.uuid4().hex[:6]}"
    timeout_ms = 1000
    topic = f"bench-chk-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (s.partitions, {})})
    listener = NoopListener(LocalTransactionState.UNKNOW)
    born: dict[str, float] = {}
    with _coordinator(bootstrap, prefix, transaction_timeout_ms=timeout_ms,
                      check_interval_ms=60000, half_partitions=s.partitions) as coordinator, \
            TransactionProducer(conf, producer_group="bench-check", listener=listener,
                                topic_prefix=prefix, half_partitions=s.partitions) as producer:
        for _ in range(0, s.check_messages, 10):
            sent_at = time.time()
            for r in producer.send_messages_in_transaction(
                    [Message(topic, b"x") for _ in range(10)]):
                born[r.transaction_id] = sent_at
            time.sleep(0.05)  # spread deadlines over time, as real traffic would
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while len(listener.checked) < len(born) and time.monotonic() < deadline:
            coordinator.require_running()
            time.sleep(0.1)
    return [(listener.checked[t] - (b + timeout_ms / 1000)) * 1000
            for t, b in born.items() if t in listener.checked]


def bench_spark(bootstrap: str, promoted_topic: str, s: BenchSettings,
                work: Path) -> dict[str, float]:
    from spark.job import JobSettings, build_session, run_job

    conf = {"bootstrap.servers": bootstrap}
    plain = f"bench-plain-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {plain: (s.partitions, {})})
    fill(conf, plain, s.count, s.size, key=str)
    spark = build_session("local[2]")
    rates: dict[str, list[float]] = {"promoted": [], "plain": []}
    try:
        run_job(JobSettings(bootstrap_servers=bootstrap, topics=plain, output=work / "warm",
                            available_now=True, require_promoted=False), spark=spark)
        for n in range(s.repeat):
            for name, topic, promoted in (("promoted", promoted_topic, True),
                                          ("plain", plain, False)):
                out = work / f"{name}-{n}"
                started = time.monotonic()
                result = run_job(JobSettings(bootstrap_servers=bootstrap, topics=topic,
                                             output=out, available_now=True,
                                             require_promoted=promoted), spark=spark)
                rates[name].append(result.rows_written / (time.monotonic() - started))
    finally:
        spark.stop()
    promoted_rate = statistics.median(rates["promoted"])
    plain_rate = statistics.median(rates["plain"])
    return {"spark_promoted_rows_per_s": promoted_rate, "spark_plain_rows_per_s": plain_rate,
            "spark_ratio": promoted_rate / plain_rate}


def _median_of(fn: Callable[[], float], repeat: int) -> tuple[float, list[float]]:
    fn()  # warm-up
    runs = [fn() for _ in range(repeat)]
    return statistics.median(runs), runs


#: Every case, in the order a full run takes them; ``--cases`` picks some.
CASES = ("baseline", "txn", "latency", "check", "orderly", "spark", "threads")


def _merge_into(out: Path, results: dict) -> dict:
    """The figures of earlier runs in ``out`` with this run's on top, so a run of some
    cases does not erase the others."""
    if out.exists():
        try:
            previous = json.loads(out.read_text())
        except ValueError:
            previous = {}
        if isinstance(previous, dict):
            merged = {**previous, **results}
            # A run of some thread counts keeps the figures of the others.
            if isinstance(previous.get("threads"), dict) and "threads" in results:
                merged["threads"] = {**previous["threads"], **results["threads"]}
            return merged
    return results


def run_bench(out: Path, s: BenchSettings, log: Callable[[str], None] = print,
              cases: tuple[str, ...] = CASES, bootstrap: str | None = None) -> dict:
    """Run ``cases`` against ``bootstrap`` (an embedded broker if None); merge into ``out``."""
    import confluent_kafka as ck

    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"unknown bench cases {unknown}; known: {', '.join(CASES)}")
    work = Path(tempfile.mkdtemp(prefix="rmq-bench-"))
    broker = None if bootstrap else EmbeddedKafka(work / "kafka", port=free_port())
    if broker is not None:
        bootstrap = broker.start()
    conf = {"bootstrap.servers": bootstrap}
    prefix = f"__rmqbench{uuid.uuid4().hex[:6]}"
    results: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(),
                    "kafka": kafka_version() if broker is not None else f"external {bootstrap}",
                    "confluent_kafka": importlib.metadata.version("confluent-kafka"),
                    "librdkafka": ck.libversion()[0]},
        "settings": s.__dict__,
    }
    coordinator = _coordinator(bootstrap, prefix, half_partitions=s.partitions)
    started = time.monotonic()
    fixed_latency: list[float] | None = None
    saturation_latency: list[float] = []
    lateness: list[float] | None = None
    promoted_topic = ""
    try:
        coordinator.start()
        coordinator.wait_ready()
        if "baseline" in cases:
            log("baseline: raw idempotent producer -> consumer")
            results["baseline_msgs_per_s"], results["baseline_runs"] = _median_of(
                lambda: bench_baseline(conf, s), s.repeat)
        if "txn" in cases or "spark" in cases:
            log("transactional messages through the layer (saturation)")
            txn_runs = []
            bench_txn(conf, prefix, s, min(s.count, 2000))  # warm-up
            for _ in range(s.repeat if "txn" in cases else 1):
                rate, saturation_latency, promoted_topic = bench_txn(conf, prefix, s, s.count)
                txn_runs.append(rate)
            if "txn" in cases:
                results["txn_msgs_per_s"] = statistics.median(txn_runs)
                results["txn_runs"] = txn_runs
                if "baseline_msgs_per_s" in results:
                    results["txn_ratio"] = (results["txn_msgs_per_s"]
                                            / results["baseline_msgs_per_s"])
                results["commit_to_visible_saturation_ms"] = {
                    "p50": percentile(saturation_latency, 50),
                    "p99": percentile(saturation_latency, 99),
                    "max": max(saturation_latency, default=0)}
        if "latency" in cases:
            log(f"commit-to-visible latency at {s.rate} msgs/s")
            _, fixed_latency, _ = bench_txn(conf, prefix, s, int(s.rate * s.latency_seconds),
                                            rate=s.rate)
            results["commit_to_visible_ms"] = {
                "offered_msgs_per_s": s.rate, "p50": percentile(fixed_latency, 50),
                "p99": percentile(fixed_latency, 99), "max": max(fixed_latency, default=0)}
        if "check" in cases:
            log("back-check lateness")
            lateness = bench_check_lateness(conf, bootstrap, s)
            results["check_lateness_ms"] = {"p50": percentile(lateness, 50),
                                            "p99": percentile(lateness, 99),
                                            "max": max(lateness, default=0), "n": len(lateness)}
        if "threads" in cases:
            log(f"threads: {s.thread_counts} threads calling send_message_in_transaction")
            results.update(bench_threads(conf, prefix, s, log, coordinator.pid,
                                         broker.running_pid() if broker else None))
        if "orderly" in cases:
            log("orderly consumer vs plain consumer")
            results.update(bench_orderly(conf, bootstrap, prefix, s))
        if "spark" in cases:
            log("Spark job: promoted topic vs plain topic")
            results.update(bench_spark(bootstrap, promoted_topic, s, work))
    finally:
        coordinator.stop()
        if broker is not None:
            broker.stop()
    results["elapsed_s"] = time.monotonic() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    if fixed_latency is not None and lateness is not None:
        results["plots"] = plot(results, {f"offered {s.rate} msgs/s": fixed_latency,
                                          "saturation (as fast as it goes)":
                                          saturation_latency}, lateness, out.parent)
    results = _merge_into(out, results)
    out.write_text(json.dumps(results, indent=2, default=str))
    return results


def _cmd_bench(args: argparse.Namespace) -> int:
    base = BenchSettings.quick() if args.quick else BenchSettings()
    overrides = {k: v for k, v in (("size", args.size), ("count", args.count),
                                   ("partitions", args.partitions), ("rate", args.rate),
                                   ("repeat", args.repeat)) if v is not None}
    if args.threads:
        overrides["thread_counts"] = tuple(int(n) for n in args.threads.split(","))
    settings = BenchSettings(**{**base.__dict__, **overrides})
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip()) if args.cases \
        else CASES
    results = run_bench(Path(args.out), settings, cases=cases, bootstrap=args.bootstrap)
    keys = ("baseline_msgs_per_s", "txn_msgs_per_s", "txn_ratio", "commit_to_visible_ms",
            "check_lateness_ms", "orderly_msgs_per_s", "plain_consumer_msgs_per_s",
            "orderly_ratio", "takeover_s", "spark_ratio", "elapsed_s")
    results = {**results, "threads": {n: {k: v for k, v in r.items() if k != "runs"}
                                      for n, r in results.get("threads", {}).items()}}
    keys = (*keys, "threads")
    print(json.dumps({k: results.get(k) for k in keys}, indent=2, default=str))
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure the layer against raw Kafka")
    bench.add_argument("--out", default="bench/results.json")
    bench.add_argument("--quick", action="store_true", help="smaller run (about a minute)")
    bench.add_argument("--size", type=int, help="value size in bytes (default 1024)")
    bench.add_argument("--count", type=int, help="messages per throughput run")
    bench.add_argument("--partitions", type=int, help="partitions of every topic")
    bench.add_argument("--rate", type=int, help="offered load for the latency case (msgs/s)")
    bench.add_argument("--repeat", type=int, help="repetitions per case (median)")
    bench.add_argument("--cases", help=f"comma-separated cases to run (default all: "
                       f"{','.join(CASES)}); merged into --out")
    bench.add_argument("--bootstrap", help="an existing broker to use instead of an "
                       "embedded one")
    bench.add_argument("--threads", help="thread counts of the threads case, e.g. 1,8,32")
    bench.set_defaults(func=_cmd_bench)
