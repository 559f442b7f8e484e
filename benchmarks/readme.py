"""The bench block of the docs' benchmarks page (``docs/benchmarks.md``; it was the
README's, hence the names), rendered from ``bench/results.json`` so prose and figures cannot
drift apart: the figures with their goals (issue 13), the sizing line, and this product
beside RocketMQ 5.5.0. The block between :data:`BEGIN` and :data:`END` is replaced;
everything around it is prose the renderer never touches.

Over 500 physical lines only since ``ruff format`` (one argument a line, about 15 %
longer; under 500 as the layering test counts them): its split along its seams is
issue 32's house step."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["BEGIN", "END", "render_block", "render_readme", "rewrite_readme"]

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
BUSY_MARK = "†"
# Written as escapes: the linter reads the characters as look-alikes of "-" and "x".
DASH, TIMES = "\u2013", "\u00d7"

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
# Parallel Consumer's published table (10,000 messages of 0-5 ms, 1 partition, 16 threads),
# seconds per mode of the keys case; "unordered" is its UNORDERED mode.
PC_SECONDS = {
    "partition": 22.2,
    "key_1": 26.7,
    "key_20": 2.24,
    "key_10000": 2.13,
    "unordered": 2.83,
}
# Goals of issue 16: key order with 20 keys at least 10x partition order and at least
# Parallel Consumer's ratio; 1 key within 20 % of partition order; the rest below.
GOAL_KEY20_SPEEDUP = max(10.0, PC_SECONDS["partition"] / PC_SECONDS["key_20"])
GOAL_KEY1_VS_PARTITION, GOAL_ZIPF_VS_BOUND, GOAL_FAILING_KEY = 1.2, 0.8, 0.9
KEY_MODE_LABELS = {
    "partition": "partition order",
    "key_1": "key order, 1 key",
    "key_5": "key order, 5 keys",
    "key_20": "key order, 20 keys",
    "key_10000": "key order, 10,000 keys",
    "zipf": "key order, Zipf(1.1) over 1,000 keys",
    "unordered": "every record its own key (unordered)",
    "failing_key": "20 keys, one always failing: the other 19",
}


# -- numbers ------------------------------------------------------------------------------
def _rate(v: float) -> str:
    if v >= 1000:  # three significant figures: the runs' spread is wider than that
        return f"{round(v, 2 - math.floor(math.log10(v))):,.0f}"
    return f"{v:,.0f}"


def _ms(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 100 else f"{v:,.0f}"


def _int(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:g}" if isinstance(v, float) else str(v)


def _x(v: float) -> str:
    return f"{v:.2f}"


def _whole(v: float) -> str:
    return f"{v:.0f}"


def _fig(f: Any, fmt: Callable[[float], str], unit: str = "") -> str:
    """``median (min-max)`` of a figure; a bare number (an older results file) as is."""
    if isinstance(f, (int, float)):
        return f"{fmt(f)}{unit}"
    if not isinstance(f, dict) or f.get("median") is None:
        return "not measured"
    low, high = fmt(f["min"]), fmt(f["max"])
    if low == high:  # one run, or runs alike at the precision shown
        return f"{fmt(f['median'])}{unit}"
    return f"{fmt(f['median'])}{unit} ({low}{DASH}{high})"


def _median(f: Any) -> float | None:
    if isinstance(f, (int, float)):
        return float(f)
    return f.get("median") if isinstance(f, dict) else None


def _pcts(f: Any, keys: tuple[str, ...] = ("p50", "p99", "max")) -> str:
    if not isinstance(f, dict):
        return "not measured"
    return ", ".join(f"{k} {_fig(f.get(k), _ms)}" for k in keys) + " ms"


def _goal(text: str, met: bool | None) -> str:
    verdict = "not measured" if met is None else "**met**" if met else "**missed**"
    return f"{text} — {verdict}"


def _at_least(f: Any, goal: float, every_run: bool = False) -> bool | None:
    """Whether the median (``every_run``: the worst run) reaches ``goal``; None: unknown."""
    value = (f.get("min") if every_run else f.get("median")) if isinstance(f, dict) else _median(f)
    return None if value is None else value >= goal


def _at_most(f: Any, goal: float) -> bool | None:
    value = _median(f)
    return None if value is None else value <= goal


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
                f"{_fig(t.get('confirmed_per_s'), _rate, '/s')} confirmed, "
                f"{_fig(t.get('consumed_per_s'), _rate, '/s')} consumed; per call "
                f"p50 {_fig(t.get('p50_ms'), _ms)}, p99 {_fig(t.get('p99_ms'), _ms)} ms"
            )
        )
        goal = ""
        if n == "32":
            p50 = _median(t.get("p50_ms"))
            met = _at_least(t.get("confirmed_per_s"), GOAL_THREADS)
            goal = _goal(
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
            f"{_fig(r.get('multi_msgs_per_s'), _rate, ' msgs/s')}, "
            f"{_fig(r.get('multi_txns_per_s'), _rate, ' transactions/s')}",
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
            f"{_fig(r.get('aio_async_calls_per_s'), _rate, '/s')} against "
            f"{_fig(r.get('aio_sync_calls_per_s'), _rate, '/s')} "
            f"({_fig(r.get('aio_ratio'), _x, TIMES)}); loop lag {_pcts(lag)}",
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
            f"{_fig(r.get('tracing_hooks_us'), _ms, ' µs')} of "
            f"{_fig(r.get('tracing_call_us'), _rate, ' µs')} "
            f"({_fig(r.get('tracing_share_pct'), _ms, ' %')})",
            "",
        )
    ]


def _stall_rows(r: dict) -> list[tuple[str, str, str, str]]:
    if r.get("stall_no_restart_s") is None and r.get("stall_restart_s") is None:
        return []  # a results file from before the case
    label = "read_committed reader of a business topic held back by a SIGKILLed coordinator"
    return [
        ("stall", f"{label}, none started again", _fig(r.get("stall_no_restart_s"), _x, " s"), ""),
        (
            "stall",
            f"{label}, a new one started at once",
            _fig(r.get("stall_restart_s"), _x, " s"),
            "",
        ),
    ]


def _keys_rows(r: dict) -> list[tuple[str, str, str, str]]:
    """The keys case's goals (issue 16); none before the case was first run."""
    k = r.get("keys")
    if not isinstance(k, dict):
        return []
    modes, g = k.get("modes") or {}, k.get
    zipf, unordered = modes.get("zipf") or {}, modes.get("unordered") or {}
    speedup_met = _at_least(g("key20_speedup"), GOAL_KEY20_SPEEDUP)
    ratio_met = _at_least(g("failing_key_ratio"), GOAL_FAILING_KEY)
    dlq = g("failing_key_dlq_records")
    dlq_low = dlq.get("min") if isinstance(dlq, dict) else None
    failing_met = (
        None
        if ratio_met is None or dlq_low is None
        else ratio_met and dlq_low == g("failing_key_records")
    )
    pc = PC_SECONDS["partition"] / PC_SECONDS["key_20"]
    return [
        (
            "keys",
            "key order, 20 keys, against partition order (speed-up)",
            _fig(g("key20_speedup"), _x, TIMES),
            _goal(f"≥ 10{TIMES} and ≥ Parallel Consumer's {pc:.1f}{TIMES}", speedup_met),
        ),
        (
            "keys",
            "key order, 1 key, against partition order (seconds)",
            _fig(g("key1_vs_partition"), _x, TIMES),
            _goal(
                f"≤ {GOAL_KEY1_VS_PARTITION}{TIMES} (within 20 %)",
                _at_most(g("key1_vs_partition"), GOAL_KEY1_VS_PARTITION),
            ),
        ),
        (
            "keys",
            "Zipf(1.1) keys over 1,000: critical-path bound / measured",
            f"{_fig(g('zipf_vs_bound'), _x, TIMES)} (bound {_fig(g('zipf_bound_s'), _x, ' s')}, "
            f"measured {_fig(zipf.get('seconds'), _x, ' s')}; unordered "
            f"{_fig(unordered.get('seconds'), _x, ' s')})",
            _goal(
                f"≥ {GOAL_ZIPF_VS_BOUND}{TIMES}", _at_least(g("zipf_vs_bound"), GOAL_ZIPF_VS_BOUND)
            ),
        ),
        (
            "keys",
            "one key always failing: the other keys' rate against 20 healthy keys",
            f"{_fig(g('failing_key_ratio'), _x, TIMES)}; in the DLQ "
            f"{_fig(dlq, _int)} of its {_int(g('failing_key_records') or '?')} records",
            _goal(f"≥ {GOAL_FAILING_KEY}{TIMES}, all of them in the DLQ", failing_met),
        ),
    ]


def _keys_table(r: dict) -> list[str]:
    """Every mode of the keys case beside Parallel Consumer's published seconds."""
    k = r.get("keys")
    if not isinstance(k, dict):
        return []
    modes, s = k.get("modes") or {}, k.get("settings") or {}
    pc_partition = PC_SECONDS["partition"]
    lines = [
        "### Key-ordered consumption and Parallel Consumer",
        "",
        f"| mode | seconds: median (min{DASH}max) | speed-up against partition order "
        "| Parallel Consumer (published) |",
        "| --- | --- | --- | --- |",
    ]
    for mode, label in KEY_MODE_LABELS.items():
        m = modes.get(mode) or {}
        pc = PC_SECONDS.get(mode)
        theirs = "—" if pc is None else f"{pc:g} s ({_x(pc_partition / pc)}{TIMES})"
        lines.append(
            f"| {label} | {_fig(m.get('seconds'), _x, ' s')} | "
            f"{_fig(m.get('speedup'), _x, TIMES)} | {theirs} |"
        )
    lines += [
        "",
        f"Each mode consumes {_int(s.get('messages', '?'))} records of one partition "
        f"with {s.get('workers', '?')} workers; the listener sleeps a seeded random "
        f"0{DASH}{s.get('max_wait_ms', '?')} ms per record, the same in every mode, and "
        "a mode is timed from its first call to its last completion. The failing key "
        f"is suspended for {s.get('failing_suspend_ms', '?')} ms each time and parks "
        f"to the DLQ after {s.get('failing_max_reconsume_times', '?')} retries; its row "
        "times the other keys. Parallel Consumer's figures are those of its README "
        f"(10,000 messages of 0{DASH}5 ms, 1 partition, 16 threads), not re-measured.",
        "",
    ]
    return lines


def _rows(r: dict) -> list[tuple[str, str, str, str]]:
    """(case, label, result, goal) for every figure in ``r``."""
    g = r.get
    visible, copier = g("commit_to_visible_ms") or {}, g("copier_latency_ms") or {}
    rows = [
        (
            "baseline",
            "raw idempotent producer → consumer",
            _fig(g("baseline_msgs_per_s"), _rate, "/s"),
            "",
        ),
        (
            "txn",
            "batch API, `send_messages_in_transaction` batches of 500",
            f"{_fig(g('txn_msgs_per_s'), _rate, '/s')}, {_fig(g('txn_ratio'), _x, TIMES)} raw",
            "",
        ),
        *_multi_rows(r),
        *_aio_rows(r),
        *_tracing_rows(r),
        (
            "copier",
            "bare exactly-once copier (consume → produce in Kafka transactions)",
            _fig(g("copier_msgs_per_s"), _rate, "/s"),
            "",
        ),
        (
            "copier",
            "batch API against the copier",
            _fig(g("txn_vs_copier"), _x, TIMES),
            _goal(
                f"≥ {GOAL_TXN_VS_COPIER}{TIMES}", _at_least(g("txn_vs_copier"), GOAL_TXN_VS_COPIER)
            ),
        ),
        *_threads_rows(r),
        (
            "latency",
            f"commit → visible at {_int(visible.get('offered_msgs_per_s', '?'))} msgs/s "
            f"offered by {visible.get('threads', '?')} threads",
            _pcts(visible)
            + (
                f"; calls made at {_fig(visible['achieved_msgs_per_s'], _rate, '/s')}"
                if "achieved_msgs_per_s" in visible
                else ""
            ),
            "",
        ),
        (
            "copier",
            f"copier input → visible at {_int(copier.get('offered_msgs_per_s', '?'))} msgs/s",
            _pcts(copier),
            "",
        ),
        (
            "latency",
            "commit → visible p99 against the copier's p99",
            _fig(g("latency_vs_copier_p99"), _x, TIMES),
            _goal(
                f"≤ {GOAL_LATENCY_VS_COPIER}{TIMES}",
                _at_most(g("latency_vs_copier_p99"), GOAL_LATENCY_VS_COPIER),
            ),
        ),
        (
            "txn",
            "commit → visible at saturation (queueing)",
            _pcts(g("commit_to_visible_saturation_ms"), ("p50", "p99")),
            "",
        ),
        (
            "check",
            "back-check lateness (deadline → check reaches the producer)",
            _pcts(g("check_lateness_ms"), ("p50", "p99")),
            "",
        ),
    ]
    for n, c in sorted((g("coordinators") or {}).items()):
        rows.append(
            (
                "coordinators",
                f"batch API through {n} coordinator process{'es' if n != '1' else ''}",
                f"{_fig(c.get('msgs_per_s'), _rate, '/s')}; CPU s per 1,000: "
                f"coordinator{'s' if n != '1' else ''} "
                f"{_fig(c.get('coordinator_cpu_s_per_1000'), _ms)}, producer "
                f"{_fig(c.get('producer_cpu_s_per_1000'), _ms)}",
                "",
            )
        )
    rows += [
        (
            "orderly",
            "plain consumer, same listener, batches of 32",
            _fig(g("plain_consumer_msgs_per_s"), _rate, "/s"),
            "",
        ),
        (
            "orderly",
            "OrderlyConsumer, lock-checked commits",
            f"{_fig(g('orderly_msgs_per_s'), _rate, '/s')}, {_fig(g('orderly_ratio'), _x, TIMES)} "
            "plain",
            _goal(f"≥ {GOAL_ORDERLY}{TIMES} plain", _at_least(g("orderly_ratio"), GOAL_ORDERLY)),
        ),
        (
            "orderly",
            "takeover after SIGKILL of the lock holder",
            _fig(g("takeover_s"), _x, " s"),
            "",
        ),
        *_stall_rows(r),
        *_keys_rows(r),
        (
            "push",
            f"PushConsumer, {_fig(g('push_workers'), _whole)} workers, a "
            f"{_fig(g('listener_io_ms'), _whole, ' ms')} I/O listener, against a plain "
            "consumer taking one message at a time",
            f"{_fig(g('push_msgs_per_s'), _rate, '/s')} against "
            f"{_fig(g('push_plain_msgs_per_s'), _rate, '/s')}: "
            f"{_fig(g('push_ratio'), _x, TIMES)}",
            "",
        ),
        (
            "spark",
            "Spark job on a promoted topic against a plain one",
            _fig(g("spark_ratio"), _x, TIMES),
            _goal(
                f"≥ {GOAL_SPARK}{TIMES} every run",
                _at_least(g("spark_ratio"), GOAL_SPARK, every_run=True),
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
        f"consumers share the cores. Settings: {_int(s.get('size', '?'))} B values, "
        f"{s.get('partitions', '?')} partitions, {_int(s.get('count', '?'))} messages per "
        f"throughput run, {_int(s.get('rate', '?'))} msgs/s offered for "
        f"{_int(s.get('latency_seconds', '?'))} s in the latency cases, "
        f"{s.get('repeat', '?')} runs per case taken in turns. Every figure is the median "
        f"of the runs (min{DASH}max)."
    )


def _sizing_line(r: dict) -> str:
    cores = r.get("coordinator_cores_per_10k_msgs_per_s")
    if cores is None:
        return "Sizing: not measured (the `coordinators` case)."
    one = (r.get("coordinators") or {}).get("1", {})
    return (
        f"Sizing: one coordinator spends {_fig(one.get('coordinator_cpu_s_per_1000'), _ms)}"
        f" CPU s per 1,000 promoted messages (the producer "
        f"{_fig(one.get('producer_cpu_s_per_1000'), _ms)}): **"
        f"{_fig(cores, _x)} coordinator cores per 10,000 transactional msgs/s**."
    )


# -- this product and RocketMQ ------------------------------------------------------------
def _default_timeout_s() -> float:
    from coordinator.settings import CoordinatorSettings

    fields: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(CoordinatorSettings)}
    return float(fields["transaction_timeout_ms"]) / 1000


def _comparison(r: dict) -> list[str]:
    t32, t1 = (r.get("threads") or {}).get("32", {}), (r.get("threads") or {}).get("1", {})
    check = r.get("check_lateness_ms") or {}
    timeout = _default_timeout_s()
    p50, p99 = (_median(check.get(k)) for k in ("p50", "p99"))
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
            f"**{_fig(t32.get('confirmed_per_s'), _rate, '/s')}** (1 thread: "
            f"{_fig(t1.get('confirmed_per_s'), _rate, '/s')})",
        ),
        (
            "one call: half send + local transaction + end, p50 / p99",
            f"{RMQ_CALL_P50_P99_MS[0]} / {RMQ_CALL_P50_P99_MS[1]} ms",
            "; ".join(
                f"{n}: {_fig(t.get('p50_ms'), _ms)} / {_fig(t.get('p99_ms'), _ms)} ms"
                if t
                else f"{n}: not measured"
                for n, t in (("32 threads", t32), ("1 thread", t1))
            ),
        ),
        ("batch API, batches of 500", "—", _fig(r.get("txn_msgs_per_s"), _rate, "/s")),
        (
            "commit → visible to a consumer, 1,000 msgs/s offered, p50 / p99 / max",
            f"**{' / '.join(f'{v:g}' for v in RMQ_VISIBLE_MS)} ms**",
            " / ".join(
                _fig((r.get("commit_to_visible_ms") or {}).get(k), _ms)
                for k in ("p50", "p99", "max")
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
            f"{_fig(r.get('baseline_msgs_per_s'), _rate, '/s')} (async, batched)",
        ),
        (
            "exactly-once copier on the same broker (the limit of the design)",
            "—",
            f"{_fig(r.get('copier_msgs_per_s'), _rate, '/s')}; input → visible p99 "
            f"{_fig((r.get('copier_latency_ms') or {}).get('p99'), _ms)} ms at 1,000 msgs/s",
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


def _keys_block(results: dict) -> list[str]:
    table = _keys_table(results)
    return ["", *table[:-1]] if table else []


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
    lines += [_sizing_line(results), "", *_comparison(results), *_keys_block(results), END]
    return "\n".join(lines)


def render_readme(readme: str, results: dict) -> str:
    """``readme`` with its bench block replaced by the rendering of ``results``."""
    head, found, rest = readme.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    return head + render_block(results) + tail


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
