"""The bench block of the docs' benchmarks page (``docs/benchmarks.md``; it was the
README's, hence the names), rendered from ``bench/results.json`` so prose and figures cannot
drift apart: the figures with their goals (issue 13), the sizing line, and this product
beside RocketMQ 5.5.0; the keys case's section is :mod:`.readme_keys`, how a figure reads
:mod:`.page_text`. The block between :data:`BEGIN` and :data:`END` is replaced; everything
around it is prose the renderer never touches."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from benchmarks.page_text import (
    DASH,
    TIMES,
    at_least,
    at_most,
    fig,
    judged,
    median,
    ms,
    num,
    pcts,
    rate,
    ratio,
    whole,
)
from benchmarks.readme_keys import keys_block, keys_rows
from benchmarks.readme_simple import simple_note, simple_rows
from benchmarks.readme_timers import timer_memory_block, timers_rows
from benchmarks.summary import BEGIN as SUMMARY_BEGIN
from benchmarks.summary import END as SUMMARY_END
from benchmarks.summary import render_summary

__all__ = ["BEGIN", "END", "has_block", "render_block", "render_readme", "rewrite_readme"]

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
BUSY_MARK = "†"

# RocketMQ 5.5.0 measured beside this product on the same machine kind (issue 13).
RMQ_THREADS32 = (11295, 10568, 13243)  # median, min, max confirmed/s
RMQ_CALL_P50_P99_MS = (2.3, 15.2)
RMQ_VISIBLE_MS = (0.99, 3.1, 33)  # p50, p99, max at 1,000 msgs/s
RMQ_CHECK_S = (22.0, 36.7)  # UNKNOW -> first back-check, p50, p99
RMQ_RAW = 13274  # sync sends from 32 threads
# Goals of issue 13.
GOAL_THREADS, GOAL_THREADS_P50_MS = 11295, 3.0
GOAL_TXN_VS_COPIER, GOAL_LATENCY_VS_COPIER = 0.8, 1.2
GOAL_ORDERLY, GOAL_SPARK = 0.8, 0.9
# Goal of issue 34: 32 threads at least RocketMQ's rate in the same run.
GOAL_VS_ROCKETMQ = 1.0


# -- the figures table --------------------------------------------------------------------
def _threads_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    threads = {"32": {}, **(r.get("threads") or {})}  # the goal's row, even unmeasured
    for n in sorted(threads, key=int):
        t = threads[n]
        result = (
            "not measured"
            if not t
            else (
                f"{fig(t.get('confirmed_per_s'), rate, '/s')} confirmed, "
                f"{fig(t.get('consumed_per_s'), rate, '/s')} consumed; per call "
                f"p50 {fig(t.get('p50_ms'), ms)}, p99 {fig(t.get('p99_ms'), ms)} ms"
            )
        )
        goal = ""
        if n == "32":
            p50 = median(t.get("p50_ms"))
            met = at_least(t.get("confirmed_per_s"), GOAL_THREADS)
            goal = judged(
                f"≥ {GOAL_THREADS:,}/s and p50 ≤ {GOAL_THREADS_P50_MS:g} ms",
                None if met is None or p50 is None else met and p50 <= GOAL_THREADS_P50_MS,
            )
        rows.append(
            (
                "threads",
                f"{n} thread{'s' if n != '1' else ''}, each calling "
                "`send_message_in_transaction` in a loop",
                result,
                goal,
            )
        )
    return rows


def _multi_rows(r: dict) -> list[tuple[str, str, str, str]]:
    if r.get("multi_msgs_per_s") is None:
        return []  # a results file from before the case
    return [
        (
            "multi",
            "`send_transaction`, transactions of 10 messages from 8 threads",
            f"{fig(r.get('multi_msgs_per_s'), rate, ' msgs/s')}, "
            f"{fig(r.get('multi_txns_per_s'), rate, ' transactions/s')}",
            "",
        )
    ]


def _aio_rows(r: dict) -> list[tuple[str, str, str, str]]:
    if r.get("aio_async_calls_per_s") is None:
        return []  # a results file from before the case
    lag = r.get("aio_loop_lag_ms") or {}
    n = r.get("aio_concurrency", "?")
    return [
        (
            "aio",
            f"`AsyncTransactionProducer`, {n} tasks on one loop, against "
            f"`TransactionProducer` with {n} threads",
            f"{fig(r.get('aio_async_calls_per_s'), rate, '/s')} against "
            f"{fig(r.get('aio_sync_calls_per_s'), rate, '/s')} "
            f"({fig(r.get('aio_ratio'), ratio, TIMES)}); loop lag {pcts(lag)}",
            "",
        )
    ]


def _tracing_rows(r: dict) -> list[tuple[str, str, str, str]]:
    if r.get("tracing_hooks_us") is None:
        return []  # a results file from before the case
    return [
        (
            "tracing",
            "the producer's tracing hooks without an OpenTelemetry SDK, per "
            "`send_message_in_transaction`, against the call itself (1 thread)",
            f"{fig(r.get('tracing_hooks_us'), ms, ' µs')} of "
            f"{fig(r.get('tracing_call_us'), rate, ' µs')} "
            f"({fig(r.get('tracing_share_pct'), ms, ' %')})",
            "",
        )
    ]


def _stall_rows(r: dict) -> list[tuple[str, str, str, str]]:
    if r.get("stall_no_restart_s") is None and r.get("stall_restart_s") is None:
        return []  # a results file from before the case
    label = "read_committed reader of a business topic held back by a SIGKILLed coordinator"
    return [
        (
            "stall",
            f"{label}, none started again",
            fig(r.get("stall_no_restart_s"), ratio, " s"),
            "",
        ),
        (
            "stall",
            f"{label}, a new one started at once",
            fig(r.get("stall_restart_s"), ratio, " s"),
            "",
        ),
    ]


SPARK_TRIGGERS = ("microbatch", "realtime")


def _calls_made(f: Any) -> str:
    """``; calls made at R/s`` of a latency figure that measured the achieved rate."""
    if not isinstance(f, dict) or "achieved_msgs_per_s" not in f:
        return ""
    return f"; calls made at {fig(f['achieved_msgs_per_s'], rate, '/s')}"


def _spark_latency_rows(r: dict) -> list[tuple[str, str, str, str]]:
    sides = {t: r.get(f"spark_{t}_commit_to_visible_ms") for t in SPARK_TRIGGERS}
    if not any(sides.values()):
        return []  # a results file from before the case
    one = next(f for f in sides.values() if f)
    load = (
        f"at {num(one.get('offered_msgs_per_s', '?'))} msgs/s offered by "
        f"{one.get('threads', '?')} threads"
    )
    names = {
        "microbatch": "micro-batch",
        "realtime": f"Real-time Mode ({(sides['realtime'] or {}).get('batch_s', '?')} s batches)",
    }
    return [
        (
            "spark_latency",
            f"Spark job, {names[t]}: commit → row on its Kafka sink's topic {load}; and on "
            "the promoted topic it reads (the coordinator's part), in the same run",
            f"{pcts(sides[t])}{_calls_made(sides[t])}; promoted topic "
            f"{pcts(r.get(f'spark_{t}_input_commit_to_visible_ms'))}",
            "",
        )
        for t in SPARK_TRIGGERS
    ]


def _spark_latency_note(r: dict) -> list[str]:
    micro, realtime = (r.get(f"spark_{t}_commit_to_visible_ms") for t in SPARK_TRIGGERS)
    if not micro and not realtime:
        return []
    side = micro or realtime or {}
    return [
        f"The Spark job's rows: `rmq-semantics spark --sink kafka` on a `local[2]` session "
        f"reads a promoted topic of {side.get('input_partitions', '?')} partitions and writes "
        "each row to a topic of its own; a row is timed at its first copy there (the sink "
        "delivers at least once; copies are dropped by (`rmq.txn_id`, `rmq.promoted_from`)). "
        "Micro-batch, the job's default trigger, starts each batch as soon as the last one "
        "ended; Real-time Mode (`--trigger realtime`) holds one long-running task per input "
        "partition and writes each record as it is read. Its batch duration "
        f"({(realtime or {}).get('batch_s', '?')} s, `--realtime-batch-s`) is the checkpoint "
        "interval, not a latency bound: a restart re-emits at most the interrupted batch.",
        "",
    ]


def _rows(r: dict) -> list[tuple[str, str, str, str]]:
    """(case, label, result, goal) for every figure in ``r``."""
    g = r.get
    visible, copier = g("commit_to_visible_ms") or {}, g("copier_latency_ms") or {}
    rows = [
        (
            "baseline",
            "raw idempotent producer → consumer",
            fig(g("baseline_msgs_per_s"), rate, "/s"),
            "",
        ),
        (
            "txn",
            "batch API, `send_messages_in_transaction` batches of 500",
            f"{fig(g('txn_msgs_per_s'), rate, '/s')}, {fig(g('txn_ratio'), ratio, TIMES)} raw",
            "",
        ),
        *_multi_rows(r),
        *_aio_rows(r),
        *_tracing_rows(r),
        (
            "copier",
            "bare exactly-once copier (consume → produce in Kafka transactions)",
            fig(g("copier_msgs_per_s"), rate, "/s"),
            "",
        ),
        (
            "copier",
            "batch API against the copier",
            fig(g("txn_vs_copier"), ratio, TIMES),
            judged(
                f"≥ {GOAL_TXN_VS_COPIER}{TIMES}", at_least(g("txn_vs_copier"), GOAL_TXN_VS_COPIER)
            ),
        ),
        *_threads_rows(r),
        (
            "latency",
            f"commit → visible at {num(visible.get('offered_msgs_per_s', '?'))} msgs/s "
            f"offered by {visible.get('threads', '?')} threads",
            pcts(visible) + _calls_made(visible),
            "",
        ),
        (
            "copier",
            f"copier input → visible at {num(copier.get('offered_msgs_per_s', '?'))} msgs/s",
            pcts(copier),
            "",
        ),
        (
            "latency",
            "commit → visible p99 against the copier's p99",
            fig(g("latency_vs_copier_p99"), ratio, TIMES),
            judged(
                f"≤ {GOAL_LATENCY_VS_COPIER}{TIMES}",
                at_most(g("latency_vs_copier_p99"), GOAL_LATENCY_VS_COPIER),
            ),
        ),
        *_spark_latency_rows(r),
        (
            "txn",
            "commit → visible at saturation (queueing)",
            pcts(g("commit_to_visible_saturation_ms"), ("p50", "p99")),
            "",
        ),
        (
            "check",
            "back-check lateness (deadline → check reaches the producer)",
            pcts(g("check_lateness_ms"), ("p50", "p99")),
            "",
        ),
        *timers_rows(r),
    ]
    for n, c in sorted((g("coordinators") or {}).items()):
        rows.append(
            (
                "coordinators",
                f"batch API through {n} coordinator process{'es' if n != '1' else ''}",
                f"{fig(c.get('msgs_per_s'), rate, '/s')}; CPU s per 1,000: "
                f"coordinator{'s' if n != '1' else ''} "
                f"{fig(c.get('coordinator_cpu_s_per_1000'), ms)}, producer "
                f"{fig(c.get('producer_cpu_s_per_1000'), ms)}",
                "",
            )
        )
    rows += [
        (
            "orderly",
            "plain consumer, same listener, batches of 32",
            fig(g("plain_consumer_msgs_per_s"), rate, "/s"),
            "",
        ),
        (
            "orderly",
            "OrderlyConsumer, lock-checked commits",
            f"{fig(g('orderly_msgs_per_s'), rate, '/s')}, {fig(g('orderly_ratio'), ratio, TIMES)} "
            "plain",
            judged(f"≥ {GOAL_ORDERLY}{TIMES} plain", at_least(g("orderly_ratio"), GOAL_ORDERLY)),
        ),
        (
            "orderly",
            "takeover after SIGKILL of the lock holder",
            fig(g("takeover_s"), ratio, " s"),
            "",
        ),
        *_stall_rows(r),
        *keys_rows(r),
        (
            "push",
            f"PushConsumer, {fig(g('push_workers'), whole)} workers, a "
            f"{fig(g('listener_io_ms'), whole, ' ms')} I/O listener, against a plain "
            "consumer taking one message at a time",
            f"{fig(g('push_msgs_per_s'), rate, '/s')} against "
            f"{fig(g('push_plain_msgs_per_s'), rate, '/s')}: "
            f"{fig(g('push_ratio'), ratio, TIMES)}",
            "",
        ),
        *simple_rows(r),
        (
            "spark",
            "Spark job on a promoted topic against a plain one",
            fig(g("spark_ratio"), ratio, TIMES),
            judged(
                f"≥ {GOAL_SPARK}{TIMES} every run",
                at_least(g("spark_ratio"), GOAL_SPARK, every_run=True),
            ),
        ),
    ]
    return rows


def _machine_line(r: dict) -> str:
    m, s = r.get("machine", {}), r.get("settings", {})
    kafka = str(m.get("kafka", "?"))
    kafka = (
        "an external Kafka broker"
        if kafka.startswith("external")
        else f"Apache Kafka {kafka} embedded"
    )
    return (
        f"Machine: {m.get('cores', '?')} cores, {m.get('platform', '?')}, Python "
        f"{m.get('python', '?')}, {kafka}, confluent-kafka {m.get('confluent_kafka', '?')} "
        f"(librdkafka {m.get('librdkafka', '?')}); broker, coordinator, producer and "
        f"consumers share the cores. Settings: {num(s.get('size', '?'))} B values, "
        f"{s.get('partitions', '?')} partitions, {num(s.get('count', '?'))} messages per "
        f"throughput run, {num(s.get('rate', '?'))} msgs/s offered for "
        f"{num(s.get('latency_seconds', '?'))} s in the latency cases, "
        f"{s.get('repeat', '?')} runs per case taken in turns. Every figure is the median "
        f"of the runs (min{DASH}max).{_linger(m)}"
    )


def _linger(m: dict) -> str:
    linger = m.get("linger_ms")
    if not linger:  # a results file from before the producers' linger was written out
        return ""
    return " Producers' `linger.ms`: " + ", ".join(f"{k} {v}" for k, v in linger.items()) + "."


def _sizing_line(r: dict) -> str:
    cores = r.get("coordinator_cores_per_10k_msgs_per_s")
    if cores is None:
        return "Sizing: not measured (the `coordinators` case)."
    one = (r.get("coordinators") or {}).get("1", {})
    return (
        f"Sizing: one coordinator spends {fig(one.get('coordinator_cpu_s_per_1000'), ms)}"
        f" CPU s per 1,000 promoted messages (the producer "
        f"{fig(one.get('producer_cpu_s_per_1000'), ms)}): **"
        f"{fig(cores, ratio)} coordinator cores per 10,000 transactional msgs/s**."
    )


# -- RocketMQ in the same run (the rocketmq case) -------------------------------------------
def _p50_p99(f: Any, keys: tuple[str, str] = ("p50", "p99")) -> str:
    if not isinstance(f, dict) or all(median(f.get(k)) is None for k in keys):
        return "not measured"
    return " / ".join(fig(f.get(k), ms) for k in keys) + " ms"


def _same_run(r: dict) -> list[str]:
    """RocketMQ measured by the bench's own case beside this product, with the ratios."""
    t32 = (r.get("threads") or {}).get("32", {})
    ours, theirs = r.get("commit_to_visible_ms") or {}, r.get("rocketmq_commit_to_visible_ms") or {}
    offered = num(theirs.get("offered_msgs_per_s", ours.get("offered_msgs_per_s", "?")))
    rows = [
        (
            "32 threads, each calling `sendMessageInTransaction` / "
            "`send_message_in_transaction` in a loop, confirmed/s",
            fig(r.get("rocketmq_txn_per_s"), rate, "/s"),
            fig(t32.get("confirmed_per_s"), rate, "/s"),
            fig(r.get("threads32_vs_rocketmq"), ratio, TIMES),
            judged(
                f"≥ {GOAL_VS_ROCKETMQ:.1f}{TIMES}",
                at_least(r.get("threads32_vs_rocketmq"), GOAL_VS_ROCKETMQ),
            ),
        ),
        (
            "one call at 32 threads, p50 / p99",
            _p50_p99(r.get("rocketmq_call_ms")),
            _p50_p99(t32, ("p50_ms", "p99_ms")),
            "",
            "",
        ),
        (
            f"commit → visible at {offered} msgs/s offered, p50 / p99 (ratio of the p99s)",
            _p50_p99(theirs),
            _p50_p99(ours),
            fig(r.get("latency_vs_rocketmq_p99"), ratio, TIMES),
            "",
        ),
    ]
    return [
        "### RocketMQ in the same run",
        "",
        "| workload | RocketMQ 5.5.0 | this product | this product ÷ RocketMQ | goal |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows),
        "",
        "RocketMQ's side is the `rocketmq` case (`benchmarks/rocketmq.py`): a name server and "
        "one broker of RocketMQ 5.5.0 started by the bench on 127.0.0.1, 8 queues, "
        "`TxBench.java` on its remoting client; the ratios are taken run by run against the "
        "`threads` and `latency` cases of the same bench run.",
        "",
    ]


# -- this product and RocketMQ ------------------------------------------------------------
def _default_timeout_s() -> float:
    from coordinator.settings import CoordinatorSettings

    fields: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(CoordinatorSettings)}
    return float(fields["transaction_timeout_ms"]) / 1000


def _comparison(r: dict) -> list[str]:
    t32, t1 = (r.get("threads") or {}).get("32", {}), (r.get("threads") or {}).get("1", {})
    check = r.get("check_lateness_ms") or {}
    timeout = _default_timeout_s()
    p50, p99 = (median(check.get(k)) for k in ("p50", "p99"))
    back_check = (
        "not measured"
        if p50 is None or p99 is None
        else (
            f"{timeout + p50 / 1000:.2f} / {timeout + p99 / 1000:.2f} s (the default "
            f"{timeout:g} s timeout + the check lateness, {p50 / 1000:.2f} / {p99 / 1000:.2f} s, "
            f"measured with a {check.get('transaction_timeout_ms', 1000) / 1000:g} s timeout; "
            "a per-record schedule)"
        )
    )
    rmq = RMQ_THREADS32
    rows = [
        (
            "32 threads, each calling `sendMessageInTransaction` / `send_message_in_transaction`"
            " in a loop (one request = one transaction), confirmed/s",
            f"**{rmq[0]:,}/s** ({rmq[1]:,}{DASH}{rmq[2]:,})",
            f"**{fig(t32.get('confirmed_per_s'), rate, '/s')}** (1 thread: "
            f"{fig(t1.get('confirmed_per_s'), rate, '/s')})",
        ),
        (
            "one call: half send + local transaction + end, p50 / p99",
            f"{RMQ_CALL_P50_P99_MS[0]} / {RMQ_CALL_P50_P99_MS[1]} ms",
            "; ".join(
                f"{n}: {fig(t.get('p50_ms'), ms)} / {fig(t.get('p99_ms'), ms)} ms"
                if t
                else f"{n}: not measured"
                for n, t in (("32 threads", t32), ("1 thread", t1))
            ),
        ),
        ("batch API, batches of 500", "—", fig(r.get("txn_msgs_per_s"), rate, "/s")),
        (
            "commit → visible to a consumer, 1,000 msgs/s offered, p50 / p99 / max",
            f"**{' / '.join(f'{v:g}' for v in RMQ_VISIBLE_MS)} ms**",
            " / ".join(
                fig((r.get("commit_to_visible_ms") or {}).get(k), ms) for k in ("p50", "p99", "max")
            )
            + " ms (exactly-once)",
        ),
        (
            "UNKNOW → first back-check, default settings, p50 / p99",
            f"{RMQ_CHECK_S[0]} / {RMQ_CHECK_S[1]} s (a 30 s scan)",
            back_check,
        ),
        (
            "raw produce → consume on the same broker",
            f"{RMQ_RAW:,}/s (sync sends, 32 threads)",
            f"{fig(r.get('baseline_msgs_per_s'), rate, '/s')} (async, batched)",
        ),
        (
            "exactly-once copier on the same broker (the limit of the design)",
            "—",
            f"{fig(r.get('copier_msgs_per_s'), rate, '/s')}; input → visible p99 "
            f"{fig((r.get('copier_latency_ms') or {}).get('p99'), ms)} ms at 1,000 msgs/s",
        ),
    ]
    return [
        "### This product and RocketMQ",
        "",
        "| workload | RocketMQ 5.5.0 | this product |",
        "| --- | --- | --- |",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
        "How RocketMQ was run, to repeat it: RocketMQ 5.5.0 from the Maven Central jars "
        "(namesrv, one broker, clients) on a machine of the same kind, one topic of 8 "
        "queues, 1 KiB messages, a local transaction that always answers COMMIT, "
        "`transactionTimeOut=6000` and `transactionCheckInterval=30000` in the broker "
        "conf, 32 producer threads each calling `sendMessageInTransaction` in a loop; "
        f"the median of 3 runs (min{DASH}max). Its figures are constants of the renderer; "
        "this product's are read from `bench/results.json`.",
    ]


def render_block(results: dict) -> str:
    """The bench block (markers included) for ``results``."""
    busy = {
        c
        for c, info in (results.get("cases") or {}).items()
        if isinstance(info, dict) and info.get("busy")
    }
    table = [f"| case | result: median (min{DASH}max) | goal |", "| --- | --- | --- |"]
    for case, label, result, goal in _rows(results):
        mark = f" {BUSY_MARK}" if case in busy else ""
        table.append(f"| {label}{mark} | {result} | {goal} |")
    lines = [
        BEGIN,
        "<!-- rendered from bench/results.json by `rmq-semantics bench "
        "--render`: change the bench or the renderer, not this block -->",
        "",
        _machine_line(results),
        "",
        *table,
        "",
    ]
    if busy:
        lines += [
            f"{BUSY_MARK} taken on a busy machine (over a quarter of the CPU busy "
            f"before the case started): {', '.join(sorted(busy))}.",
            "",
        ]
    lines += _spark_latency_note(results)
    lines += simple_note(results)
    lines += [
        _sizing_line(results),
        "",
        *_same_run(results),
        *_comparison(results),
        *keys_block(results),
        *timer_memory_block(results),
        END,
    ]
    return "\n".join(lines)


def has_block(page: str) -> bool:
    """Whether ``page`` has a block the renderer rewrites: the bench block (the benchmarks
    page) or the summary block (the README)."""
    return any(b in page and e in page for b, e in ((BEGIN, END), (SUMMARY_BEGIN, SUMMARY_END)))


def _replace(page: str, begin: str, end: str, block: str) -> str:
    head, found, rest = page.partition(begin)
    _, found_end, tail = rest.partition(end)
    return head + block + tail if found and found_end else page


def render_readme(readme: str, results: dict) -> str:
    """``readme`` with its bench block and its summary block (whichever it has) replaced by
    the rendering of ``results``."""
    if not has_block(readme):
        raise ValueError(f"the page has no {BEGIN} ... {END} or {SUMMARY_BEGIN} block")
    readme = _replace(readme, BEGIN, END, render_block(results))
    return _replace(readme, SUMMARY_BEGIN, SUMMARY_END, render_summary(results))


def current_block(readme: str) -> str:
    """The bench block now in ``readme`` (markers included)."""
    _, _, rest = readme.partition(BEGIN)
    inside, _, _ = rest.partition(END)
    return BEGIN + inside + END


def rewrite_readme(readme_path: Path, results_path: Path) -> bool:
    """Re-render ``readme_path``'s bench block from ``results_path``; True if it changed."""
    import json

    text = readme_path.read_text()
    new = render_readme(text, json.loads(results_path.read_text()))
    if new != text:
        readme_path.write_text(new)
    return new != text
