"""The bench's rocketmq case without RocketMQ: TxBench's RESULT lines and samples become the
run's figures, the ratios against the product are taken run by run and rendered with the
goal, and a missing Java or Maven stops the run before any broker starts, in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.cases import CASE_RUNS, CASES, BenchContext, derive
from benchmarks.common import BenchSettings, aggregate, figure
from benchmarks.readme import render_block
from benchmarks.rocketmq import (
    LoopbackNamespace,
    RocketMQBenchError,
    parse_result,
    prepare_rocketmq,
    read_samples,
    rocketmq_version,
    run_figures,
)
from rmq_semantics.errors import RmqError

TPUT = """\
  t= 10s sent_ok=95123 recv=95000 fail=0
tput-tx: threads=32 size=1024 window=20.0s sent_ok/s=9512 recv/s=9500 fail_in_window=0
  send RT in window: p50=2.31ms p99=15.20ms max=40.10ms
RESULT mode=tput-tx send_per_s=9512 recv_per_s=9500 e2e_per_s=9400 sent_ok=238000 recv=238000 \
missing=0 fail=0 rt_p50_ms=2.31 rt_p99_ms=15.20
"""
LATENCY = """\
latency: offered=1000/s achieved=1000/s senders=16 max_schedule_lag=3.1ms measured=10000
RESULT mode=latency offered=1000 achieved=998 n=10000 missing=0 p50_ms=0.99 p90_ms=1.80 \
p99_ms=3.10 p999_ms=9.00 max_ms=33.00 mean_ms=1.20
"""


def test_a_result_line_becomes_numbers_by_key():
    tput = parse_result(TPUT, "tput-tx")
    assert tput["send_per_s"] == 9512.0 and tput["rt_p99_ms"] == 15.2
    assert "mode" not in tput
    assert parse_result(LATENCY, "latency")["achieved"] == 998.0
    # Another mode's line is not this mode's; a value that is no number is left out.
    assert parse_result(TPUT + "RESULT mode=latency achieved=5 note=x\n", "latency") == {
        "achieved": 5.0
    }


def test_output_without_the_result_line_is_an_error_naming_what_txbench_printed():
    with pytest.raises(RocketMQBenchError, match=r"TxBench latency printed no RESULT line.*p50"):
        parse_result(TPUT, "latency")
    with pytest.raises(RmqError, match=r"\(no output\)"):
        parse_result("", "tput-tx")


def test_the_samples_file_is_one_latency_in_ms_a_line():
    assert read_samples("0.512\n1.250\n33.000\n") == [0.512, 1.25, 33.0]
    assert read_samples("") == []


def _run(txn_per_s: float, p99: float) -> dict:
    tput = parse_result(TPUT.replace("send_per_s=9512", f"send_per_s={txn_per_s}"), "tput-tx")
    return run_figures(tput, parse_result(LATENCY, "latency"), [1.0, 2.0, p99], BenchSettings())


def test_runs_become_figures_and_ratios_against_the_product_run_by_run():
    figures = aggregate([_run(10000.0, 4.0), _run(8000.0, 5.0)])
    assert figures["rocketmq_txn_per_s"]["runs"] == [10000.0, 8000.0]
    assert figures["rocketmq_call_ms"]["p99"]["median"] == 15.2
    visible = figures["rocketmq_commit_to_visible_ms"]
    assert visible["p99"]["runs"] == [4.0, 5.0]
    assert visible["offered_msgs_per_s"] == 1000 and visible["achieved_msgs_per_s"]["min"] == 998
    results = {
        **figures,
        "threads": {"32": {"confirmed_per_s": figure([5000.0, 8000.0])}},
        "commit_to_visible_ms": {"p99": figure([40.0, 25.0])},
    }
    derived = derive(results)
    assert derived["threads32_vs_rocketmq"]["runs"] == [0.5, 1.0]
    assert derived["latency_vs_rocketmq_p99"]["runs"] == [10.0, 5.0]
    assert "threads32_vs_rocketmq" not in derive({**figures, "threads": {"8": {}}})


def test_the_page_shows_rocketmq_beside_the_product_with_the_ratio_and_the_goal():
    results = {
        "machine": {},
        "settings": {},
        **aggregate([_run(10000.0, 4.0)]),
        "threads": {"32": {"confirmed_per_s": figure([12000.0])}},
        "threads32_vs_rocketmq": figure([1.2]),
    }
    lines = render_block(results).splitlines()
    row = next(line for line in lines if "in a loop, confirmed/s |" in line)
    assert row.endswith("| 10,000/s | 12,000/s | 1.20\u00d7 | ≥ 1.0\u00d7 — **met** |")
    visible = next(line for line in lines if line.startswith("| commit → visible at 1,000"))
    assert "| 2.00 / 4.00 ms | not measured | not measured |  |" in visible
    before = render_block({"machine": {}, "settings": {}}).splitlines()
    row = next(line for line in before if "in a loop, confirmed/s |" in line)
    assert row.endswith(
        "| not measured | not measured | not measured | ≥ 1.0\u00d7 — not measured |"
    )


def test_the_case_is_a_default_case_and_prepares_its_tools_once(monkeypatch, tmp_path):
    from benchmarks import rocketmq

    prepared, runs = [], []
    monkeypatch.setattr(rocketmq, "prepare_rocketmq", lambda: prepared.append(1) or "tools")
    monkeypatch.setattr(
        rocketmq,
        "bench_rocketmq",
        lambda s, work, tools, log: runs.append((work, tools)) or _run(9000.0, 3.0),
    )
    ctx = BenchContext({}, "b", "__rmqx", BenchSettings(), tmp_path)
    assert "rocketmq" in CASES and rocketmq_version() == "5.5.0"
    assert CASE_RUNS["rocketmq"](ctx)["rocketmq_txn_per_s"] == 9000.0
    CASE_RUNS["rocketmq"](ctx)
    assert prepared == [1] and runs == [(tmp_path, "tools"), (tmp_path, "tools")]


def _path_of(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only stand-ins for ``tools`` (never run: only looked up)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    return str(bin_dir)


def test_without_java_the_bench_stops_before_any_broker_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", _path_of(tmp_path, "mvn"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    out = tmp_path / "results.json"
    assert bench_main(["--cases", "threads,rocketmq", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "python -m benchmarks: error: the rocketmq case needs Java 17 or newer: "
        "no 'java' on PATH and no JAVA_HOME"
    ]
    assert not out.exists()


def test_without_maven_the_first_use_names_maven_and_the_jars(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", _path_of(tmp_path, "java"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("RMQ_CACHE_DIR", str(tmp_path / "cache"))  # nothing resolved yet
    with pytest.raises(RmqError) as info:
        prepare_rocketmq()
    message = str(info.value)
    assert "Maven ('mvn') is not on PATH" in message and "Apache RocketMQ 5.5.0 jars" in message
    assert os.linesep not in message


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root (CI has it)")
def test_the_servers_namespace_has_only_a_loopback_and_is_gone_after_close():
    netns = LoopbackNamespace()
    try:
        links = subprocess.run(
            netns.prefix(["ip", "-o", "link"]), capture_output=True, text=True, timeout=30
        )
        up = subprocess.run(
            netns.prefix(["ip", "-o", "-4", "addr"]), capture_output=True, text=True, timeout=30
        )
    finally:
        netns.close()
    assert [line.split(":")[1].strip() for line in links.stdout.splitlines()] == ["lo"]
    assert "127.0.0.1/8" in up.stdout  # up: a server can bind and a client connect
    netns.close()  # idempotent
    with pytest.raises(AssertionError, match="closed"):
        netns.prefix(["true"])
