"""`rmq-semantics bench --quick` runs every case (the rocketmq case aside) and writes the
JSON, plots and README block it promises, every figure a median with min-max and its runs.
No timing is asserted: speed is what the benchmark reports, not what the tests check. Tiny
counts and one run per case keep it short (about a minute on a quiet machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.cases import CASES
from benchmarks.console import flat_figures
from benchmarks.readme import BEGIN, END, render_block
from tests.integration.txn_helpers import REPO

pytestmark = pytest.mark.integration

# The rocketmq case resolves RocketMQ's jars from Maven Central and runs its own broker (about
# a minute more): tests/unit/test_bench_rocketmq.py covers its figures without it.
RUN_CASES = tuple(c for c in CASES if c != "rocketmq")

# Every figure of a full run (key paths), the derived ones included.
FIGURES = (
    "baseline_msgs_per_s",
    "txn_msgs_per_s",
    "multi_msgs_per_s",
    "multi_txns_per_s",
    "txn_ratio",
    "commit_to_visible_saturation_ms.p99",
    "commit_to_visible_ms.p50",
    "commit_to_visible_ms.p99",
    "commit_to_visible_ms.max",
    "commit_to_visible_ms.achieved_msgs_per_s",
    "check_lateness_ms.p50",
    "check_lateness_ms.p99",
    "timer_lateness_ms.p50",
    "timer_lateness_ms.p99",
    "timer_lateness_ms.scheduled_msgs_per_s",
    "threads.1.confirmed_per_s",
    "threads.1.consumed_per_s",
    "threads.1.p50_ms",
    "threads.2.p99_ms",
    "copier_msgs_per_s",
    "copier_latency_ms.p50",
    "copier_latency_ms.p99",
    "txn_vs_copier",
    "latency_vs_copier_p99",
    "coordinators.1.msgs_per_s",
    "coordinators.1.coordinator_cpu_s_per_1000",
    "coordinators.2.msgs_per_s",
    "coordinators.2.producer_cpu_s_per_1000",
    "coordinator_cores_per_10k_msgs_per_s",
    "plain_consumer_msgs_per_s",
    "orderly_msgs_per_s",
    "orderly_ratio",
    "takeover_s",
    "simple_unordered.plain_msgs_per_s",
    "simple_unordered.simple_msgs_per_s",
    "simple_unordered.ratio",
    "simple_unordered.receive_ms.p50",
    "simple_fifo.simple_msgs_per_s",
    "simple_fifo.ratio",
    "spark_ratio",
    "spark_microbatch_commit_to_visible_ms.p99",
    "spark_realtime_commit_to_visible_ms.p99",
    "spark_microbatch_input_commit_to_visible_ms.p99",
    "spark_realtime_input_commit_to_visible_ms.p99",
)


def test_quick_bench_writes_every_case_figure_plot_and_the_readme_block(broker, tmp_path):
    out = tmp_path / "results.json"
    # The session's broker, not one more embedded broker (that would add its start-up).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "bench",
            "--quick",
            "--repeat",
            "1",
            "--count",
            "2000",
            "--latency-seconds",
            "1",
            "--check-messages",
            "20",
            "--threads",
            "1,2",
            "--calls-per-thread",
            "10",
            "--cases",
            ",".join(RUN_CASES),
            "--load-sample",
            "0.1",
            "--out",
            str(out),
            "--bootstrap",
            broker.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())

    figures = dict(flat_figures(results))
    assert set(FIGURES) <= set(figures), set(FIGURES) - set(figures)
    for name, fig in figures.items():
        assert set(fig) == {"median", "min", "max", "runs"} and len(fig["runs"]) == 1, name
        assert fig["min"] <= fig["median"] <= fig["max"], name
    for name in FIGURES:
        assert figures[name]["median"] > 0, name
    assert results["commit_to_visible_ms"]["offered_msgs_per_s"] == 1000
    assert results["timer_lateness_ms"]["due_msgs_per_s"] == 1000
    assert results["timer_lateness_ms"]["n"] == results["timer_lateness_ms"]["expected"]

    assert set(results["cases"]) == set(RUN_CASES)
    for case, info in results["cases"].items():
        assert info["runs"] == 1 and isinstance(info["busy"], bool), case
        [load] = info["load"]
        assert set(load) == {"before", "after"} and len(load["before"]["loadavg"]) == 3, case
    assert results["machine"]["cores"] >= 1 and results["settings"]["count"] == 2000
    for plot in results["plots"]:
        assert (tmp_path / plot).stat().st_size > 0
    assert json.loads((tmp_path / "results-samples.json").read_text())["copier_latency_ms"]

    readme = tmp_path / "README.md"
    readme.write_text(f"# bench\n{BEGIN}\n{END}\nprose\n")
    render = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "bench",
            "--render-readme",
            "--out",
            str(out),
            "--readme",
            str(readme),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert render.returncode == 0, render.stderr[-3000:]
    assert readme.read_text() == f"# bench\n{render_block(results)}\nprose\n"


def test_the_multi_case_alone_reports_msgs_and_transactions_per_s(broker, tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "bench",
            "--quick",
            "--repeat",
            "1",
            "--cases",
            "multi",
            "--count",
            "300",
            "--load-sample",
            "0.1",
            "--out",
            str(out),
            "--bootstrap",
            broker.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["cases"]) == {"multi"}
    msgs, txns = results["multi_msgs_per_s"], results["multi_txns_per_s"]
    assert msgs["median"] > 0 and txns["median"] == pytest.approx(msgs["median"] / 10)
    assert "transactions of 10 messages" in render_block(results)


def test_the_simple_case_alone_acks_every_record_of_both_variants(broker, tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_semantics",
            "bench",
            "--repeat",
            "1",
            "--cases",
            "simple",
            "--count",
            "500",
            "--load-sample",
            "0.1",
            "--out",
            str(out),
            "--bootstrap",
            broker.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["cases"]) == {"simple"} and results["simple_messages"] == 500
    for variant in ("simple_unordered", "simple_fifo"):
        figures = results[variant]
        assert figures["simple_msgs_per_s"]["median"] > 0, variant
        assert figures["ratio"]["median"] > 0 and figures["redelivered"]["median"] == 0, variant
    assert results["simple_fifo"]["groups"] == 100
    assert "records of 100 message groups (FIFO" in render_block(results)
