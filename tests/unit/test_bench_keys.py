"""The keys bench case without a broker (issue 16): the seeded waits and keys every mode
shares, the Zipf critical-path bound, the listener that times a run and parks a failing key,
one run's figures, and the README's table beside Parallel Consumer's published figures."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.cases import CASES
from benchmarks.common import BenchSettings, aggregate
from benchmarks.keys import (
    FAILING_RECONSUME_TIMES,
    FAILING_SUSPEND_MS,
    KEY_MODES,
    _TimedListener,
    critical_path_bound,
    key_figures,
    mode_keys,
    waits,
)
from benchmarks.readme import render_block
from rmq_semantics.orderly import ConsumeOrderlyContext, ConsumeOrderlyStatus, OrderlyMessage


def test_the_keys_case_is_in_a_full_run_and_small_in_a_quick_one():
    assert "keys" in CASES
    assert BenchSettings().keys_count == 10000 and BenchSettings.quick().keys_count == 1000


def test_every_mode_waits_the_same_seeded_0_to_5_ms_per_record():
    sleeps = waits(10000)
    assert sleeps == waits(10000) and len(sleeps) == 10000
    assert min(sleeps) >= 0.0 and max(sleeps) <= 0.005
    assert sum(sleeps) == pytest.approx(25.0, rel=0.05)  # a mean of 2.5 ms


def test_the_keys_of_each_mode():
    assert len(set(mode_keys("key_20", 10000))) == 20
    assert mode_keys("key_5", 7) == [
        "key_5-0",
        "key_5-1",
        "key_5-2",
        "key_5-3",
        "key_5-4",
        "key_5-0",
        "key_5-1",
    ]
    assert mode_keys("partition", 100) == mode_keys("failing_key", 100) == mode_keys("key_20", 100)
    assert (
        len(set(mode_keys("unordered", 10000))) == len(set(mode_keys("key_10000", 10000))) == 10000
    )
    zipf = mode_keys("zipf", 10000)
    assert zipf == mode_keys("zipf", 10000)  # seeded
    counts = Counter(zipf)
    # Zipf(1.1) over 1,000 keys: the hottest has about 18 % of the records.
    assert 0.15 < counts.most_common(1)[0][1] / 10000 < 0.21
    assert len(counts) > 300 and all(k.startswith("zipf-") for k in counts)


def test_the_critical_path_bound_is_the_workers_share_or_the_hottest_key():
    assert critical_path_bound([1.0, 1.0, 1.0, 1.0], ["a", "a", "a", "b"], 2) == 3.0
    assert critical_path_bound([1.0, 1.0, 1.0, 1.0], ["a", "b", "c", "d"], 2) == 2.0
    sleeps = waits(10000)
    bound = critical_path_bound(sleeps, mode_keys("zipf", 10000), 16)
    assert bound > sum(sleeps) / 16  # the hot key, not the workers, bounds a Zipf run


def _msg(offset: int, key: bytes, reconsume_times: int = 0) -> OrderlyMessage:
    return OrderlyMessage("t", 0, offset, key, b"", (), 0, reconsume_times)


def test_the_listener_times_the_run_and_parks_the_failing_key():
    listener = _TimedListener([0.0] * 3, succeed=2, failing=b"bad", fail=1)
    context = ConsumeOrderlyContext("t", 0)
    assert listener([_msg(0, b"good")], context) is ConsumeOrderlyStatus.SUCCESS
    suspended = listener([_msg(1, b"bad")], context)
    assert suspended is ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
    assert context.suspend_ms == FAILING_SUSPEND_MS and listener.parked == 0
    listener([_msg(1, b"bad", FAILING_RECONSUME_TIMES)], context)  # the DLQ's next
    assert listener.parked == 1 and not listener.finished.is_set()
    listener([_msg(2, b"good")], context)
    assert listener.finished.is_set() and listener.succeeded == 2
    assert listener.seconds(listener.last_success) >= 0.0


def _run(scale: float, dlq: float) -> dict:
    seconds = {
        "partition": 25.0,
        "key_1": 26.0,
        "key_5": 5.2,
        "key_20": 2.0,
        "key_10000": 1.8,
        "zipf": 5.0,
        "unordered": 1.8,
        "failing_key": 1.9,
    }
    return key_figures(
        {m: t * scale for m, t in seconds.items()},
        {"records": 500, "dlq": dlq, "parked_s": 12.0},
        10000,
        4.5,
    )


def test_one_runs_figures():
    keys = _run(1.0, 500.0)["keys"]
    assert set(keys["modes"]) == set(KEY_MODES)
    assert keys["key20_speedup"] == pytest.approx(12.5)
    assert keys["key1_vs_partition"] == pytest.approx(1.04)
    assert keys["zipf_vs_bound"] == pytest.approx(0.9)
    assert keys["modes"]["failing_key"]["msgs_per_s"] == pytest.approx(9500 / 1.9)
    assert keys["failing_key_ratio"] == pytest.approx((9500 / 1.9) / 5000)


def test_the_readme_shows_every_mode_beside_parallel_consumer_and_the_goals():
    results = {
        "machine": {},
        "settings": {},
        "cases": {"keys": {"busy": False}},
        **aggregate([_run(1.0, 500.0), _run(1.1, 499.0)]),
    }
    lines = render_block(results).splitlines()
    head = lines.index("### Key-ordered consumption and Parallel Consumer")
    assert lines[head + 2].startswith("| mode | seconds: median (min\u2013max) |")
    row = next(line for line in lines if line.startswith("| key order, 20 keys |"))
    assert row == (
        "| key order, 20 keys | 2.10 s (2.00\u20132.20) | 12.50\u00d7 | 2.24 s (9.91\u00d7) |"
    )
    assert any(
        line.startswith("| key order, 5 keys |") and line.endswith("| — |") for line in lines
    )
    assert (
        "| partition order | 26.25 s (25.00\u201327.50) | 1.00\u00d7 | 22.2 s (1.00\u00d7) |"
        in lines
    )
    goals = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    assert goals["| key order, 20 keys, against partition order (speed-up)"].endswith(
        "≥ 10\u00d7 and ≥ Parallel Consumer's 9.9\u00d7 — **met** |"
    )
    assert goals["| key order, 1 key, against partition order (seconds)"].endswith(
        "(within 20 %) — **met** |"
    )
    zipf = goals["| Zipf(1.1) keys over 1,000: critical-path bound / measured"]
    assert "0.86\u00d7 (0.82\u20130.90) (bound 4.50 s" in zipf and zipf.endswith("**met** |")
    # One run left a failing record out of the DLQ: the goal is missed whatever the rate.
    failing = goals["| one key always failing: the other keys' rate against 20 healthy keys"]
    assert "in the DLQ 499.5 (499\u2013500) of its 500 records" in failing
    assert failing.endswith("— **missed** |")
    assert any(
        line.startswith("Each mode consumes 10,000 records of one partition with 16 workers")
        for line in lines
    )


def test_a_results_file_without_the_keys_case_renders_no_keys_table():
    block = render_block({"machine": {}, "settings": {}})
    assert "Key-ordered consumption" not in block and "key order, 20 keys" not in block
