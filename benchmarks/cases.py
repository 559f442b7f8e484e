"""Every bench case as one run (``CASE_RUNS[name](ctx) -> dict``), and the figures derived
from several cases once their runs are merged. A run's dict holds floats (figures), lists of
samples (latencies, given as ``{"samples": [...], ...constants}``) and constants; see
:func:`benchmarks.common.aggregate` for how runs become figures."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import BenchSettings, ratio_figure, scaled_figure
from benchmarks.txn import (
    CHECK_TIMEOUT_MS,
    bench_baseline,
    bench_check_lateness,
    bench_latency,
    bench_txn,
)

__all__ = ["CASES", "CASE_PREPARES", "CASE_RUNS", "KNOWN_CASES", "BenchContext", "derive"]

# The txn case's first run is preceded by a smaller one (the coordinator's first batches).
TXN_WARM_COUNT = 2000


@dataclass
class BenchContext:
    """What the cases of one bench run share: the broker, the main coordinator's prefix and
    process, and what one case leaves for another (the promoted topic the Spark case reads)."""

    conf: dict
    bootstrap: str
    prefix: str
    s: BenchSettings
    work: Path
    coordinator_pid: int | None = None
    broker_pid: int | None = None  # the embedded broker's, for its CPU share; None if external
    cluster: Any = None  # the EmbeddedCluster of --brokers N (N > 1), for the failover case
    log: Callable[[str], None] = print
    promoted_topic: str = ""
    warmed: set[str] = field(default_factory=set)
    spark: Any = None
    spark_latency: Any = None
    # What a case keeps from its first run for the next ones (the keys case's topics).
    kept: dict[str, dict] = field(default_factory=dict)

    def first_run(self, case: str) -> bool:
        """True once per case: its first run is preceded by an unmeasured warm-up run."""
        first = case not in self.warmed
        self.warmed.add(case)
        return first

    def close(self) -> None:
        for bench in (self.spark, self.spark_latency):
            if bench is not None:
                bench.stop()


def _baseline(ctx: BenchContext) -> dict:
    if ctx.first_run("baseline"):
        bench_baseline(ctx.conf, ctx.s)
    return {"baseline_msgs_per_s": bench_baseline(ctx.conf, ctx.s)}


def _txn(ctx: BenchContext) -> dict:
    if ctx.first_run("txn"):
        bench_txn(ctx.conf, ctx.prefix, ctx.s, min(ctx.s.count, TXN_WARM_COUNT))
    rate, latencies, ctx.promoted_topic = bench_txn(ctx.conf, ctx.prefix, ctx.s, ctx.s.count)
    return {"txn_msgs_per_s": rate, "commit_to_visible_saturation_ms": {"samples": latencies}}


def _multi(ctx: BenchContext) -> dict:
    from benchmarks.multi import bench_multi

    return bench_multi(ctx.conf, ctx.prefix, ctx.s, ctx.s.count)


def _aio(ctx: BenchContext) -> dict:
    from benchmarks.aio import bench_aio

    return bench_aio(ctx.conf, ctx.prefix, ctx.s)


def _tracing(ctx: BenchContext) -> dict:
    from benchmarks.tracing_cost import bench_tracing

    return bench_tracing(ctx.conf, ctx.prefix, ctx.s)


def _latency(ctx: BenchContext) -> dict:
    latencies, achieved = bench_latency(ctx.conf, ctx.prefix, ctx.s)
    return {
        "commit_to_visible_ms": {
            "samples": latencies,
            "offered_msgs_per_s": ctx.s.rate,
            "achieved_msgs_per_s": achieved,
            "threads": ctx.s.latency_threads,
        }
    }


def _check(ctx: BenchContext) -> dict:
    return {
        "check_lateness_ms": {
            "samples": bench_check_lateness(ctx.conf, ctx.bootstrap, ctx.s),
            "transaction_timeout_ms": CHECK_TIMEOUT_MS,
        }
    }


def _timers(ctx: BenchContext) -> dict:
    from benchmarks.timers import bench_timers

    return bench_timers(ctx.conf, ctx.prefix, ctx.s)


def _threads(ctx: BenchContext) -> dict:
    from benchmarks.threads import bench_threads

    one = dataclasses.replace(ctx.s, repeat=1)
    counts = bench_threads(ctx.conf, ctx.prefix, one, ctx.log, ctx.coordinator_pid, ctx.broker_pid)[
        "threads"
    ]
    return {"threads": {n: case["runs"][0] for n, case in counts.items()}}


def _rocketmq(ctx: BenchContext) -> dict:
    from benchmarks.rocketmq import COMPARED_THREADS, bench_rocketmq, prepare_rocketmq

    kept = ctx.kept.setdefault("rocketmq", {})
    if "tools" not in kept:
        kept["tools"] = prepare_rocketmq()
        if COMPARED_THREADS not in ctx.s.thread_counts:
            ctx.log(
                f"  rocketmq: the threads case has no {COMPARED_THREADS}-thread row "
                f"(--threads): RocketMQ is measured, the ratio is not"
            )
    return bench_rocketmq(ctx.s, ctx.work, kept["tools"], ctx.log)


def _prepare_rocketmq() -> None:
    from benchmarks.rocketmq import prepare_rocketmq

    prepare_rocketmq()


def _copier(ctx: BenchContext) -> dict:
    from benchmarks.copier import copier_latency, copier_throughput

    return {
        "copier_msgs_per_s": copier_throughput(ctx.conf, ctx.s),
        "copier_latency_ms": {
            "samples": copier_latency(ctx.conf, ctx.s),
            "offered_msgs_per_s": ctx.s.rate,
        },
    }


def _coordinators(ctx: BenchContext) -> dict:
    from benchmarks.coordinators import bench_coordinators

    return {"coordinators": bench_coordinators(ctx.conf, ctx.bootstrap, ctx.s)}


def _orderly(ctx: BenchContext) -> dict:
    from benchmarks.orderly import bench_orderly

    return bench_orderly(ctx.conf, ctx.bootstrap, ctx.prefix, dataclasses.replace(ctx.s, repeat=1))


def _keys(ctx: BenchContext) -> dict:
    from benchmarks.keys import bench_keys

    return bench_keys(ctx.conf, ctx.prefix, ctx.s, ctx.kept.setdefault("keys", {}), ctx.log)


def _push(ctx: BenchContext) -> dict:
    from benchmarks.push import bench_push

    # One run per call: the runner takes the runs in turns and makes the figures.
    run = bench_push(ctx.conf, dataclasses.replace(ctx.s, repeat=1))
    return {k: v for k, v in run.items() if k not in ("push_runs", "push_plain_runs")}


def _simple(ctx: BenchContext) -> dict:
    from benchmarks.simple import bench_simple, prepare_simple

    # The topics are filled once, by the first run; every run reads them with new groups.
    kept = ctx.kept.setdefault("simple", {})
    if "topics" not in kept:
        kept["topics"] = prepare_simple(ctx.conf, ctx.s)
    return bench_simple(ctx.conf, ctx.s, kept["topics"])


def _stall(ctx: BenchContext) -> dict:
    from benchmarks.stall import bench_stall

    return {
        "stall_no_restart_s": bench_stall(ctx.conf, ctx.bootstrap, ctx.s, restart=False),
        "stall_restart_s": bench_stall(ctx.conf, ctx.bootstrap, ctx.s, restart=True),
    }


def _failover(ctx: BenchContext) -> dict:
    from benchmarks.failover import bench_failover

    if ctx.cluster is None:
        ctx.log("failover: nothing to fail over to on one broker (run it with --brokers 3)")
        return {}
    return {
        "failover_kill_ms": bench_failover(ctx.conf, ctx.prefix, ctx.s, ctx.cluster, kill=True),
        "failover_stop_ms": bench_failover(ctx.conf, ctx.prefix, ctx.s, ctx.cluster, kill=False),
    }


def _spark(ctx: BenchContext) -> dict:
    from benchmarks.spark import SparkBench

    if not ctx.promoted_topic:  # the txn case did not run: make a promoted topic
        _, _, ctx.promoted_topic = bench_txn(ctx.conf, ctx.prefix, ctx.s, ctx.s.count)
    if ctx.spark is None:
        ctx.spark = SparkBench(ctx.bootstrap, ctx.s, ctx.work)
    return ctx.spark.run(ctx.promoted_topic)


def _spark_latency(ctx: BenchContext) -> dict:
    from benchmarks.spark_latency import SparkLatencyBench

    if ctx.spark_latency is None:
        ctx.spark_latency = SparkLatencyBench(ctx.conf, ctx.prefix, ctx.s, ctx.work, ctx.log)
    return ctx.spark_latency.run()


#: Every case and its one run, in the order a full run takes them; ``--cases`` picks some.
CASE_RUNS: dict[str, Callable[[BenchContext], dict]] = {
    "baseline": _baseline,
    "txn": _txn,
    "multi": _multi,
    "aio": _aio,
    "tracing": _tracing,
    "latency": _latency,
    "check": _check,
    "timers": _timers,
    "threads": _threads,
    "rocketmq": _rocketmq,
    "copier": _copier,
    "coordinators": _coordinators,
    "orderly": _orderly,
    "keys": _keys,
    "push": _push,
    "simple": _simple,
    "stall": _stall,
    "spark": _spark,
    "spark_latency": _spark_latency,
    "failover": _failover,
}
#: What a case needs before any broker starts (tools, jars): run once by the runner, so a
#: missing one fails the run at once, in one line, not after the cases before it.
CASE_PREPARES: dict[str, Callable[[], None]] = {"rocketmq": _prepare_rocketmq}
KNOWN_CASES = tuple(CASE_RUNS)
#: A full run's cases: failover needs a cluster (``--brokers 3 --cases failover``).
CASES = tuple(c for c in KNOWN_CASES if c != "failover")


def _get(results: dict, *path: str) -> dict | None:
    node: Any = results
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) and "runs" in node else None


def derive(results: dict) -> dict:
    """The figures of two cases together (ratios, the sizing figure), from ``results``
    merged with earlier runs; a figure whose sources are missing is left out."""
    ratios = {
        "txn_ratio": (("txn_msgs_per_s",), ("baseline_msgs_per_s",)),
        "txn_vs_copier": (("txn_msgs_per_s",), ("copier_msgs_per_s",)),
        "latency_vs_copier_p99": (("commit_to_visible_ms", "p99"), ("copier_latency_ms", "p99")),
        # Against RocketMQ taken in the same bench run (the rocketmq case), run by run.
        "threads32_vs_rocketmq": (("threads", "32", "confirmed_per_s"), ("rocketmq_txn_per_s",)),
        "latency_vs_rocketmq_p99": (
            ("commit_to_visible_ms", "p99"),
            ("rocketmq_commit_to_visible_ms", "p99"),
        ),
    }
    derived = {}
    for name, (top, bottom) in ratios.items():
        a, b = _get(results, *top), _get(results, *bottom)
        if a is not None and b is not None:
            derived[name] = ratio_figure(a, b)
    cpu = _get(results, "coordinators", "1", "coordinator_cpu_s_per_1000")
    if cpu is not None:
        # CPU s per 1,000 messages x 10 = CPU s per 10,000 messages = cores at 10,000/s.
        derived["coordinator_cores_per_10k_msgs_per_s"] = scaled_figure(cpu, 10)
    return derived
