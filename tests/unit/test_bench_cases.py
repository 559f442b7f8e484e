"""The bench's bookkeeping without a broker: `--cases` refuses unknown cases and merges a run
into the results file; runs become figures (median, min-max, every run); ratios are taken
run by run; the README's bench block is rendered from the results and is the rendering of
the committed `bench/results.json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.cases import derive
from benchmarks.common import BenchSettings, aggregate, figure, pooled_samples
from benchmarks.coordinators import _held
from benchmarks.machine import load_sample
from benchmarks.readme import (
    BEGIN,
    END,
    current_block,
    render_block,
    render_readme,
)
from benchmarks.runner import _merge_into, run_bench
from benchmarks.summary import BEGIN as SUMMARY_BEGIN
from benchmarks.summary import END as SUMMARY_END
from rmq_semantics.errors import ConfigError
from rmq_semantics.message import Message

REPO = Path(__file__).resolve().parents[2]


def test_an_unknown_case_is_refused_before_any_broker_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown bench cases.*'nope'"):
        run_bench(tmp_path / "r.json", BenchSettings.quick(), cases=("threads", "nope"))
    assert not (tmp_path / "r.json").exists()


def test_an_unknown_case_on_the_command_line_is_one_error_line(tmp_path, capsys):
    assert bench_main(["--cases", "nope", "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m benchmarks: error: unknown bench cases")


def test_a_partial_run_keeps_the_other_cases_and_thread_counts(tmp_path):
    out = tmp_path / "results.json"
    out.write_text(
        json.dumps(
            {
                "txn_msgs_per_s": 100.0,
                "threads": {"1": "old"},
                "cases": {"txn": "old"},
                "txn_runs": [1.0],
            }
        )
    )
    merged = _merge_into(
        out, {"threads": {"32": "new"}, "cases": {"threads": "new"}, "elapsed_s": 3}
    )
    assert merged == {
        "txn_msgs_per_s": 100.0,
        "threads": {"1": "old", "32": "new"},
        "cases": {"txn": "old", "threads": "new"},
        "elapsed_s": 3,
    }
    assert _merge_into(tmp_path / "absent.json", {"a": 1}) == {"a": 1}


def test_runs_become_figures_by_the_type_of_each_value():
    runs = [
        {
            "rate": 10.0,
            "batch": 32,
            "lat": {"samples": [1.0, 2.0, 9.0], "offered": 1000},
            "threads": {"8": {"p50_ms": 3.0}},
        },
        {
            "rate": 30.0,
            "batch": 32,
            "lat": {"samples": [2.0, 3.0, 4.0], "offered": 1000},
            "threads": {"8": {"p50_ms": 5.0}},
        },
        {
            "rate": 20.0,
            "batch": 32,
            "lat": {"samples": [], "offered": 1000},
            "threads": {"8": {"p50_ms": 4.0}},
        },
    ]
    figures = aggregate(runs)
    assert figures["rate"] == {"median": 20.0, "min": 10.0, "max": 30.0, "runs": [10.0, 30.0, 20.0]}
    assert figures["batch"] == 32  # a constant, not a figure
    # Each run's percentiles, then their median and spread; a run without samples is None.
    assert figures["lat"]["p50"] == {
        "median": 2.5,
        "min": 2.0,
        "max": 3.0,
        "runs": [2.0, 3.0, None],
    }
    assert figures["lat"]["max"]["runs"] == [9.0, 4.0, None]
    assert figures["lat"]["offered"] == 1000 and figures["lat"]["n"] == 6
    assert figures["threads"]["8"]["p50_ms"]["median"] == 4.0
    assert pooled_samples(runs) == {"lat": [1.0, 2.0, 9.0, 2.0, 3.0, 4.0]}


def test_ratios_are_taken_run_by_run_and_the_sizing_figure_is_derived():
    results = {
        "txn_msgs_per_s": figure([10.0, 20.0, 30.0]),
        "copier_msgs_per_s": figure([10.0, 40.0, 30.0]),
        "commit_to_visible_ms": {"p99": figure([30.0, 20.0])},
        "copier_latency_ms": {"p99": figure([20.0, 20.0])},
        "coordinators": {"1": {"coordinator_cpu_s_per_1000": figure([0.05, 0.04])}},
    }
    derived = derive(results)
    assert derived["txn_vs_copier"]["runs"] == [1.0, 0.5, 1.0]
    assert derived["txn_vs_copier"]["median"] == 1.0
    assert derived["latency_vs_copier_p99"]["runs"] == [1.5, 1.0]
    assert derived["coordinator_cores_per_10k_msgs_per_s"]["runs"] == pytest.approx([0.5, 0.4])
    assert "txn_ratio" not in derived  # no baseline measured


def test_the_coordinators_case_reads_who_holds_which_partitions_from_the_log():
    log = (
        "assigned half/op partitions [0, 1, 2, 3]; recovering their pending state\n"
        "revoked half/op partitions [0, 1, 2, 3]\n"
        "assigned half/op partitions [2, 3]; recovering their pending state\n"
    )
    assert _held(log) == {2, 3}
    assert _held("transaction service x running") == set()


def test_a_load_sample_has_the_busy_share_and_the_load_averages():
    sample = load_sample(0.01)
    assert 0.0 <= sample["cpu_busy"] <= 1.0 and len(sample["loadavg"]) == 3


FIXTURE = {
    "machine": {
        "cores": 2,
        "python": "3.11.7",
        "platform": "Linux-x",
        "kafka": "4.1.1",
        "confluent_kafka": "2.16.1",
        "librdkafka": "2.16.0",
    },
    "settings": {
        "size": 1024,
        "count": 100000,
        "partitions": 4,
        "rate": 1000,
        "latency_seconds": 10.0,
        "repeat": 3,
    },
    "txn_msgs_per_s": figure([24000.0, 25000.0, 26000.0]),
    "copier_msgs_per_s": figure([30000.0, 30000.0, 31000.0]),
    "txn_vs_copier": figure([0.8, 0.83, 0.84]),
    "threads": {
        "32": {
            "confirmed_per_s": figure([11000.0, 12000.0, 13000.0]),
            "consumed_per_s": figure([11000.0, 11900.0, 13000.0]),
            "p50_ms": figure([2.5, 2.8, 3.1]),
            "p99_ms": figure([14.0, 15.0]),
        }
    },
    "commit_to_visible_ms": {
        "p50": figure([10.0]),
        "p99": figure([25.0, 30.0]),
        "max": figure([35.0]),
        "offered_msgs_per_s": 1000,
        "threads": 16,
    },
    "check_lateness_ms": {
        "p50": figure([150.0]),
        "p99": figure([250.0]),
        "transaction_timeout_ms": 1000,
    },
    "spark_ratio": figure([0.95, 0.89]),
    "coordinators": {
        "1": {
            "msgs_per_s": figure([25000.0]),
            "coordinator_cpu_s_per_1000": figure([0.05]),
            "producer_cpu_s_per_1000": figure([0.03]),
        }
    },
    "coordinator_cores_per_10k_msgs_per_s": figure([0.5]),
    "cases": {"threads": {"busy": True}, "txn": {"busy": False}},
}


def test_the_bench_block_is_rendered_from_the_results():
    block = render_block(FIXTURE)
    assert block.startswith(BEGIN) and block.endswith(END)
    lines = block.splitlines()
    row = next(line for line in lines if line.startswith("| 32 threads, each calling"))
    # Busy mark, median (min-max), and the goal: 12,000/s >= 11,295 and p50 2.8 <= 3 ms.
    assert "† |" in row and "12,000/s (11,000\u201313,000) confirmed" in row
    assert row.endswith("≥ 11,295/s and p50 ≤ 3 ms — **met** |")
    assert (
        "| batch API against the copier | 0.83\u00d7 (0.80\u20130.84) | ≥ 0.8\u00d7 — **met** |"
    ) in lines
    spark = next(line for line in lines if line.startswith("| Spark job"))
    assert spark.endswith("every run — **missed** |")  # 0.89 in one run
    assert any("p99 27.5 (25.0\u201330.0)" in line for line in lines)
    assert any(
        line.startswith("| commit → visible p99 against") and "not measured" in line
        for line in lines
    )
    assert any(
        "**0.50 coordinator cores per 10,000 transactional msgs/s**" in line for line in lines
    )
    assert any("6.15 / 6.25 s (the default 6 s timeout" in line for line in lines)
    assert any(line.startswith("Machine: 2 cores") and "3 runs per case" in line for line in lines)
    assert "† taken on a busy machine" in block and "threads." in block
    readme = f"intro\n{BEGIN}\nstale\n{END}\nprose\n"
    assert render_readme(readme, FIXTURE) == f"intro\n{block}\nprose\n"


def test_the_readme_block_is_the_rendering_of_the_committed_results():
    """Prose and figures cannot drift apart: `make bench` renders the benchmarks page's block from
    bench/results.json (`rmq-semantics bench --render`)."""
    readme = (REPO / "docs" / "benchmarks.md").read_text()
    results = json.loads((REPO / "bench" / "results.json").read_text())
    assert current_block(readme) == render_block(results)


def test_the_readme_summary_is_the_rendering_of_the_committed_results():
    """The README quotes the same run as the benchmarks page: `make bench` renders its summary
    block from bench/results.json too."""
    readme = (REPO / "README.md").read_text()
    results = json.loads((REPO / "bench" / "results.json").read_text())
    assert render_readme(readme, results) == readme


def test_the_summary_quotes_rocketmq_of_the_same_run_and_leaves_the_prose_alone():
    results = {
        "machine": {"cores": 2},
        "cases": {"threads": {"taken_at": "2026-11-27T19:00:00Z"}},
        "threads": {"32": {"confirmed_per_s": figure([4000.0, 5000.0, 4500.0])}},
        "rocketmq_txn_per_s": figure([9000.0]),
        "threads32_vs_rocketmq": figure([0.5]),
    }
    page = f"intro\n{SUMMARY_BEGIN}\nstale\n{SUMMARY_END}\nprose\n"
    text = render_readme(page, results)
    assert text.startswith("intro\n" + SUMMARY_BEGIN) and text.endswith(SUMMARY_END + "\nprose\n")
    assert "4,500/s (4,000\u20135,000) confirmed, RocketMQ 5.5.0 in the same run 9,000/s" in text
    assert "(taken 2026-11-27)" in text and "stale" not in text
    assert "commit → visible at 1,000 msgs/s p50 / p99 not measured" in text


def test_a_run_of_latency_cases_only_plots_without_rates(tmp_path):
    from benchmarks.plots import plot

    samples = {"commit_to_visible_ms": [5.0, 9.0, 30.0], "copier_latency_ms": [4.0, 8.0]}
    files = plot({"settings": {}}, samples, tmp_path)
    assert files == ["latency.png"] and (tmp_path / "latency.png").stat().st_size > 0


def test_the_multi_case_is_a_default_case_reporting_msgs_and_transactions_per_s(monkeypatch):
    from benchmarks import multi
    from benchmarks.cases import CASE_RUNS, CASES, BenchContext

    calls = []

    def fake(conf, prefix, s, count):
        calls.append((conf, prefix, count))
        return {"multi_msgs_per_s": 1000.0, "multi_txns_per_s": 100.0}

    monkeypatch.setattr(multi, "bench_multi", fake)
    ctx = BenchContext(
        {"bootstrap.servers": "b"}, "b", "__rmqx", BenchSettings(count=500), Path(".")
    )
    assert "multi" in CASES and multi.MULTI_SIZE == 10
    assert CASE_RUNS["multi"](ctx) == {"multi_msgs_per_s": 1000.0, "multi_txns_per_s": 100.0}
    assert calls == [({"bootstrap.servers": "b"}, "__rmqx", 500)]
    block = render_block(
        {
            **FIXTURE,
            "multi_msgs_per_s": figure([900.0, 1000.0, 1100.0]),
            "multi_txns_per_s": figure([90.0, 100.0, 110.0]),
        }
    )
    assert (
        "| `send_transaction`, transactions of 10 messages from 8 threads | 1,000 msgs/s "
        "(900\u20131,100), 100 transactions/s (90\u2013110) |  |"
    ) in block.splitlines()
    assert "send_transaction" not in render_block(FIXTURE)  # results from before the case


def test_the_aio_case_is_a_default_case_reporting_both_rates_and_the_loop_lag(monkeypatch):
    from benchmarks import aio
    from benchmarks.cases import CASE_RUNS, CASES, BenchContext

    calls = []

    def fake(conf, prefix, s):
        calls.append((conf, prefix))
        return {
            "aio_sync_calls_per_s": 900.0,
            "aio_async_calls_per_s": 1800.0,
            "aio_ratio": 2.0,
            "aio_loop_lag_ms": {"samples": [0.1, 0.2], "tick_ms": 5.0},
            "aio_concurrency": aio.AIO_CONCURRENCY,
        }

    monkeypatch.setattr(aio, "bench_aio", fake)
    ctx = BenchContext({"bootstrap.servers": "b"}, "b", "__rmqx", BenchSettings(), Path("."))
    assert "aio" in CASES
    assert CASE_RUNS["aio"](ctx)["aio_ratio"] == 2.0
    assert calls == [({"bootstrap.servers": "b"}, "__rmqx")]
    runs = aggregate([CASE_RUNS["aio"](ctx), CASE_RUNS["aio"](ctx)])
    block = render_block({**FIXTURE, **runs})
    row = next(line for line in block.splitlines() if line.startswith("| `AsyncTransaction"))
    assert row.startswith(
        "| `AsyncTransactionProducer`, 32 tasks on one loop, against "
        "`TransactionProducer` with 32 threads | 1,800/s against 900/s (2.00"
    )
    assert "loop lag p50 " in row
    assert "AsyncTransactionProducer" not in render_block(FIXTURE)  # results from before


def test_the_tracing_case_times_the_hooks_without_an_sdk_against_a_call():
    from opentelemetry import trace

    from benchmarks import tracing_cost
    from benchmarks.cases import CASES

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert "tracing" in CASES
    tracing_cost._one_call_of_hooks(Message("orders", b"v"), "half", "op")  # runs with no SDK
    runs = aggregate(
        [{"tracing_hooks_us": 2.0, "tracing_call_us": 800.0, "tracing_share_pct": 0.25}]
    )
    row = next(
        line
        for line in render_block({**FIXTURE, **runs}).splitlines()
        if line.startswith("| the producer's tracing hooks")
    )
    assert "| 2.00 µs of 800 µs (0.25 %) |" in row
    assert "tracing hooks" not in render_block(FIXTURE)  # results from before the case


def test_a_page_to_render_that_cannot_be_is_one_error_line_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "r.json"
    plain = tmp_path / "plain.md"
    plain.write_text("# no bench block here\n")
    for args, why in (
        (["--render", "--page", str(tmp_path / "missing.md")], "no such file"),
        (["--cases", "threads", "--page", str(plain)], "no bench block"),
        (["--render", "--out", str(out)], "no results at"),
    ):
        assert bench_main(["--out", str(out), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
    assert not out.exists()


def test_the_timers_case_is_a_default_case_with_its_goal_on_the_page(monkeypatch):
    from benchmarks import timers
    from benchmarks.cases import CASE_RUNS, CASES, BenchContext

    calls = []

    def fake(conf, prefix, s):
        calls.append((conf, prefix, s.rate))
        late = {"samples": [20.0, 30.0, 90.0], "due_msgs_per_s": s.rate, "lead_ms": 3000}
        return {"timer_lateness_ms": {**late, "scheduled_msgs_per_s": 1000.0, "threads": 16}}

    monkeypatch.setattr(timers, "bench_timers", fake)
    ctx = BenchContext({"bootstrap.servers": "b"}, "b", "__rmqx", BenchSettings(), Path("."))
    assert "timers" in CASES
    runs = aggregate([CASE_RUNS["timers"](ctx), CASE_RUNS["timers"](ctx)])
    assert calls == [({"bootstrap.servers": "b"}, "__rmqx", 1000)] * 2
    row = next(
        line
        for line in render_block({**FIXTURE, **runs}).splitlines()
        if line.startswith("| timer messages: due → visible")
    )
    assert "at 1,000 due msgs/s, all scheduled with `Producer.send` from 16 threads" in row
    assert "each at least 3,000 ms ahead |" in row
    assert "| p50 30.0, p99 90.0, max 90.0 ms; scheduled at 1,000/s |" in row
    assert row.endswith("| p99 ≤ 100 ms — **met** |")
    assert "timer messages" not in render_block(FIXTURE)  # results from before the case


def test_timer_messages_fall_due_at_the_rate_and_their_lateness_is_read_from_the_header():
    from benchmarks.timers import DUE_HEADER, due_schedule, lateness_ms

    dues = due_schedule(1_000_000, 1000, 2.0, lead_ms=3000)
    assert len(dues) == 2000 and dues[0] == 1_003_000 and dues[-1] == 1_004_999
    assert dues == sorted(dues) and dues[1000] == 1_004_000
    assert lateness_ms([("k", b"x"), (DUE_HEADER, b"1003000")], 1_003_012.5) == 12.5
    assert lateness_ms([("k", b"x")], 5.0) is None  # a warm-up message
    assert lateness_ms([(DUE_HEADER, b"soon")], 5.0) is None


def test_the_million_message_figures_render_as_their_own_section_with_the_goal():
    from benchmarks.timer_memory import spread_dues

    memory = {
        "base_count": 1000,
        "count": 1_000_000,
        "horizon_h": 24.0,
        "fire_count": 30000,
        "fire_rate": 1000,
        "rss_mib_base": 140.0,
        "rss_mib_full": 180.5,
        "rss_mib_firing": 210.0,
        "schedule_s": 40.0,
        "taken_s": 300.0,
        "fire_lateness_ms": {"p50": 15.0, "p99": 80.0, "max": 120.0},
        "smoke": True,
        "taken_at": "2026-11-27T20:00:00Z",
    }
    block = render_block({**FIXTURE, "timer_memory": memory}).splitlines()
    assert "### Timer messages: the coordinator's memory" in block
    assert "| 1,000,000 scheduled over the next 24 h | 180 MiB |" in block
    assert "| growth over the 1,000-message figure | 70 MiB: ≤ 100 MiB — **met** |" in block
    prose = next(line for line in block if line.startswith("`make bench-timers-million`"))
    assert "a smoke figure" in prose and "p50 15.0, p99 80.0, max 120 ms" in prose
    worse = render_block({**FIXTURE, "timer_memory": {**memory, "rss_mib_firing": 300.0}})
    assert "| 160 MiB: ≤ 100 MiB — **missed** |" in worse
    assert "coordinator's memory" not in render_block(FIXTURE)
    dues = list(spread_dues(0, 4, 1000, 5000))
    assert dues == [1000, 2000, 3000, 4000]


def test_the_simple_case_fills_its_topics_once_and_renders_both_variants(monkeypatch):
    from benchmarks import simple
    from benchmarks.cases import CASE_RUNS, CASES, BenchContext

    prepared, runs = [], []

    def fake_prepare(conf, s):
        prepared.append(conf)
        return {"unordered": "t-u", "fifo": "t-f"}

    def fake_bench(conf, s, topics):
        runs.append(topics)
        variant = {
            "plain_msgs_per_s": 1_000_000.0,
            "simple_msgs_per_s": 40_000.0,
            "ratio": 0.04,
            "receive_ms": {"samples": [0.5, 0.6, 3.0]},
            "ack_us": {"samples": [4.0, 5.0]},
            "redelivered": 0.0,
        }
        return {
            "simple_messages": 100_000,
            "simple_batch": 32,
            "simple_unordered": dict(variant),
            "simple_fifo": {**variant, "simple_msgs_per_s": 36_000.0, "groups": 100},
        }

    monkeypatch.setattr(simple, "prepare_simple", fake_prepare)
    monkeypatch.setattr(simple, "bench_simple", fake_bench)
    ctx = BenchContext({"bootstrap.servers": "b"}, "b", "__rmqx", BenchSettings(), Path("."))
    assert "simple" in CASES
    figures = aggregate([CASE_RUNS["simple"](ctx), CASE_RUNS["simple"](ctx)])
    assert len(prepared) == 1 and runs == [{"unordered": "t-u", "fifo": "t-f"}] * 2
    assert figures["simple_unordered"]["ratio"]["median"] == 0.04
    assert figures["simple_unordered"]["receive_ms"]["p50"]["median"] == 0.6
    lines = render_block({**FIXTURE, **figures}).splitlines()
    rows = [line for line in lines if line.startswith("| SimpleConsumer, `receive(32)`")]
    assert len(rows) == 2
    assert "100,000 records without a message group are acked" in rows[0]
    assert "| 40,000/s against 1,000,000/s: 0.040\u00d7; one `receive(32)` p50 0.60" in rows[0]
    assert "records of 100 message groups (FIFO" in rows[1] and "36,000/s" in rows[1]
    note = next(line for line in lines if line.startswith("The SimpleConsumer's rows"))
    assert "about 25 µs, the plain consumer 1.00 µs" in note
    assert "at its p50 19 µs a record, 75% of it. An `ack` (4.00 µs at its p50)" in note
    assert "SimpleConsumer" not in render_block(FIXTURE)  # results from before the case
