"""``rmq-semantics bench``: what the semantics cost, side by side with raw Kafka, a bare
exactly-once copier and (on the benchmarks page) RocketMQ.

Every case runs against one broker (embedded unless ``--bootstrap``), ``repeat`` times, the
cases taken in turns (run 1 of every case, then run 2...) so that run i of two cases saw the
same machine and their ratio is taken per run. Every figure is a median with min-max and
every run (:func:`.common.figure`); the machine's load is sampled before and after each
case run. Results are merged into one JSON file, the pooled latency samples into a file
beside it (for the plots), and the docs' bench block is rendered from the JSON
(:mod:`.readme`). Benchmarks are scripts, not tests: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cases import CASE_PREPARES, CASE_RUNS, CASES, KNOWN_CASES, BenchContext, derive
from benchmarks.common import BenchSettings, aggregate, pooled_samples, sketch
from benchmarks.console import BenchConsole
from benchmarks.machine import BUSY_FRACTION, load_sample, machine_info
from benchmarks.txn import coordinator_process
from rmq_semantics.embedded import EmbeddedKafka, free_port, kafka_version
from rmq_semantics.errors import ConfigError
from rmq_semantics.kafka_cluster import EmbeddedCluster

__all__ = ["CASES", "BenchSettings", "register_cli", "run_bench"]

# Figures under these keys are merged key by key (a run of some thread counts keeps the
# others); every other key of a run replaces the earlier one.
MERGED_BY_KEY = ("threads", "cases")
# Keys of results files older than the figures with runs; a merge drops them.
OBSOLETE = ("baseline_runs", "txn_runs")


def samples_path(out: Path) -> Path:
    """Where the pooled latency samples of ``out``'s runs are kept (for the plots)."""
    return out.with_name(f"{out.stem}-samples.json")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _merge_into(out: Path, results: dict) -> dict:
    """The figures of earlier runs in ``out`` with this run's on top, so a run of some
    cases does not erase the others."""
    if not out.exists():
        return results
    previous = _read_json(out)
    merged = {k: v for k, v in {**previous, **results}.items() if k not in OBSOLETE}
    for key in MERGED_BY_KEY:
        if isinstance(previous.get(key), dict) and isinstance(results.get(key), dict):
            merged[key] = {**previous[key], **results[key]}
    return merged


def _case_record(s: BenchSettings, loads: list[dict], seconds: float) -> dict:
    """How a case was taken: its runs, the load before and after each, whether the machine
    was already busy before one of them, its duration and settings."""
    busy = any((load["before"].get("cpu_busy") or 0) > BUSY_FRACTION for load in loads)
    return {
        "runs": len(loads),
        "busy": busy,
        "load": loads,
        "elapsed_s": round(seconds, 1),
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": s.__dict__,
    }


def _run_cases(
    ctx: BenchContext,
    cases: tuple[str, ...],
    screen: BenchConsole,
    runs: dict[str, list[dict]],
    loads: dict[str, list[dict]],
    seconds: dict[str, float],
) -> None:
    s = ctx.s
    for n in range(s.repeat):
        for case in cases:
            before = load_sample(s.load_sample_s)
            screen.begin(case, n, s.repeat, before)
            started = time.monotonic()
            run = CASE_RUNS[case](ctx)
            took = time.monotonic() - started
            seconds[case] = seconds.get(case, 0.0) + took
            runs[case].append(run)
            loads[case].append({"before": before, "after": load_sample(s.load_sample_s)})
            screen.done(case, n, s.repeat, run, took)


def run_bench(
    out: Path,
    s: BenchSettings,
    log: Callable[[str], None] | None = None,
    cases: tuple[str, ...] = CASES,
    bootstrap: str | None = None,
    screen: BenchConsole | None = None,
    brokers: int = 1,
) -> dict:
    """Run ``cases`` against ``bootstrap`` (if None an embedded broker, or a cluster of
    ``brokers`` embedded nodes); merge into ``out``."""
    unknown = sorted(set(cases) - set(KNOWN_CASES))
    if unknown:
        raise ConfigError(f"unknown bench cases {unknown}; known: {', '.join(KNOWN_CASES)}")
    cases = tuple(c for c in KNOWN_CASES if c in cases)  # a full run's order, each case once
    for case in cases:
        if case in CASE_PREPARES:
            CASE_PREPARES[case]()
    screen = screen or BenchConsole(len(cases) * s.repeat)
    work = Path(tempfile.mkdtemp(prefix="rmq-bench-"))
    cluster = (
        EmbeddedCluster(work / "cluster", brokers=brokers)
        if brokers > 1 and not bootstrap
        else None
    )
    broker = (
        EmbeddedKafka(work / "kafka", port=free_port())
        if cluster is None and not bootstrap
        else None
    )
    if cluster is not None:
        bootstrap = cluster.start()
    elif broker is not None:
        bootstrap = broker.start()
    if bootstrap is None:
        raise ValueError("no broker to run against")
    prefix = f"__rmqbench{uuid.uuid4().hex[:6]}"
    ctx = BenchContext(
        {"bootstrap.servers": bootstrap},
        bootstrap,
        prefix,
        s,
        work,
        log=log or screen.log,
        cluster=cluster,
    )
    machine = machine_info(
        f"{kafka_version()}, {brokers} embedded nodes"
        if cluster
        else kafka_version()
        if broker is not None
        else f"external {bootstrap}"
    )
    coordinator = coordinator_process(bootstrap, prefix, half_partitions=s.partitions)
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    loads: dict[str, list[dict]] = {c: [] for c in cases}
    seconds: dict[str, float] = {}
    started = time.monotonic()
    try:
        with screen:
            coordinator.start()
            coordinator.wait_ready()
            ctx.coordinator_pid = coordinator.pid
            ctx.broker_pid = broker.running_pid() if broker is not None else None
            _run_cases(ctx, cases, screen, runs, loads, seconds)
    finally:
        ctx.close()
        coordinator.stop()
        if broker is not None:
            broker.stop()
        if cluster is not None:
            cluster.stop()
    results: dict[str, Any] = {"machine": machine, "settings": s.__dict__}
    for case in cases:
        results.update(aggregate(runs[case]))
    results["cases"] = {c: _case_record(s, loads[c], seconds.get(c, 0.0)) for c in cases}
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results = _merge_into(out, results)
    results.update(derive(results))
    out.parent.mkdir(parents=True, exist_ok=True)
    samples = {
        **_read_json(samples_path(out)),
        **{k: sketch(v) for c in cases for k, v in pooled_samples(runs[c]).items()},
    }
    samples_path(out).write_text(json.dumps(samples))
    results["plots"] = _plot(results, samples, out.parent, screen.log)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    screen.table(results, {c for c in cases if results["cases"][c]["busy"]})
    return results


def _plot(results: dict, samples: dict, out_dir: Path, log: Callable[[str], None]) -> list:
    try:
        from benchmarks.plots import plot
    except ImportError:  # matplotlib is a dev dependency
        log("no plots: matplotlib is not installed")
        return results.get("plots", [])
    return plot(results, samples, out_dir)


def _settings(args: argparse.Namespace) -> BenchSettings:
    base = BenchSettings.quick() if args.quick else BenchSettings()
    overrides = {
        k: v
        for k, v in (
            ("size", args.size),
            ("count", args.count),
            ("partitions", args.partitions),
            ("rate", args.rate),
            ("repeat", args.repeat),
        )
        if v is not None
    }
    if args.threads:
        overrides["thread_counts"] = tuple(int(n) for n in args.threads.split(","))
    for name in (
        "calls_per_thread",
        "latency_seconds",
        "check_messages",
        "load_sample_s",
        "keys_count",
        "rocketmq_seconds",
    ):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    return BenchSettings(**{**base.__dict__, **overrides})


#: The page whose block `--render` rewrites: the docs' benchmarks page (the README links it).
BENCH_PAGE = "docs/benchmarks.md"


def _page_to_render(args: argparse.Namespace, out: Path) -> Path | None:
    """The page whose block this run re-renders, checked before anything runs."""
    from benchmarks.readme import BEGIN, END, has_block

    if not (args.render or args.page):
        return None
    page = Path(args.page or BENCH_PAGE)
    if not page.is_file():
        raise ConfigError(f"--page {page}: no such file")
    if not has_block(page.read_text()):
        raise ConfigError(
            f"--page {page}: no bench block ({BEGIN} ... {END}) or summary block to re-render"
        )
    if args.render and not out.is_file():
        raise ConfigError(f"--render: no results at {out} (--out) to render from")
    return page


def _cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.readme import rewrite_readme

    out = Path(args.out)
    page = _page_to_render(args, out)
    if not args.render:
        # The bench's own lines are its output; the library's INFO lines (topics created,
        # coordinators started) would scroll the progress away.
        logging.getLogger("rmq_semantics").setLevel(logging.WARNING)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        cases = (
            tuple(c.strip() for c in args.cases.split(",") if c.strip()) if args.cases else CASES
        )
        run_bench(out, _settings(args), cases=cases, bootstrap=args.bootstrap, brokers=args.brokers)
    if page is not None:
        changed = rewrite_readme(page, out)
        print(
            f"{page}: bench block {'re-rendered' if changed else 'already current'} from {out}",
            flush=True,
        )
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure the layer against raw Kafka and a copier")
    bench.add_argument("--out", default="bench/results.json")
    bench.add_argument("--quick", action="store_true", help="smaller run (a few minutes)")
    bench.add_argument("--size", type=int, help="value size in bytes (default 1024)")
    bench.add_argument("--count", type=int, help="messages per throughput run")
    bench.add_argument("--partitions", type=int, help="partitions of every topic")
    bench.add_argument("--rate", type=int, help="offered load of the latency cases (msgs/s)")
    bench.add_argument(
        "--latency-seconds",
        dest="latency_seconds",
        type=float,
        help="how long the latency cases offer their load",
    )
    bench.add_argument("--repeat", type=int, help="runs per case (default 5; median, min-max)")
    bench.add_argument(
        "--cases",
        help=f"comma-separated cases to run (default all: "
        f"{','.join(CASES)}; also: failover); merged into --out",
    )
    bench.add_argument("--bootstrap", help="an existing broker to use instead of an embedded one")
    bench.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="without --bootstrap: run on "
        "a cluster of this many embedded nodes (the failover case needs 2+)",
    )
    bench.add_argument("--threads", help="thread counts of the threads case, e.g. 1,8,32")
    bench.add_argument(
        "--calls-per-thread",
        dest="calls_per_thread",
        type=int,
        help="calls each thread of the threads case makes per run",
    )
    bench.add_argument(
        "--check-messages",
        dest="check_messages",
        type=int,
        help="UNKNOW transactions of the check case per run",
    )
    bench.add_argument(
        "--keys-count",
        dest="keys_count",
        type=int,
        help="records per mode of the keys case (default 10,000)",
    )
    bench.add_argument(
        "--rocketmq-seconds",
        dest="rocketmq_seconds",
        type=int,
        help="seconds of the rocketmq case's 32-thread window (default 20)",
    )
    bench.add_argument(
        "--load-sample",
        dest="load_sample_s",
        type=float,
        help="seconds of /proc/stat sampled before and after each case run",
    )
    # --readme and --render-readme: their names from when the block was in the README.
    bench.add_argument(
        "--page",
        "--readme",
        dest="page",
        help=f"after the run, re-render this page's bench block from --out (default {BENCH_PAGE})",
    )
    bench.add_argument(
        "--render",
        "--render-readme",
        dest="render",
        action="store_true",
        help="run nothing: re-render the bench block of --page from --out",
    )
    bench.set_defaults(func=_cmd_bench)
