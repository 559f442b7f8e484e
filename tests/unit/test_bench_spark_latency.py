"""The spark_latency case's bookkeeping without a broker or a JVM: a record on the output topic
counts once per (rmq.txn_id, rmq.promoted_from) and is timed at its first copy; samples pair
decisions with sightings by transaction id; the triggers take turns going first; the page
shows both triggers and the promoted topic beside them, and nothing for results from
before the case."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.collector import note_record
from benchmarks.common import BenchSettings, aggregate
from benchmarks.readme import render_block
from benchmarks.spark_latency import INPUT_PARTITIONS, MASTER, trigger_order
from benchmarks.txn import commit_to_visible
from tests.unit.test_bench_cases import FIXTURE


def _headers(txn: bytes, promoted_from: bytes) -> list[tuple[str, bytes | None]]:
    return [("rmq.txn_id", txn), ("rmq.promoted_from", promoted_from), ("rmq.tags", b"A")]


def test_an_at_least_once_topic_counts_each_record_once_at_its_first_copy():
    visible: dict[bytes | None, float] = {}
    seen: set[tuple[bytes | None, bytes | None]] = set()
    noted = [
        note_record(_headers(b"t1", b"half-0@5"), 1.0, visible, seen),
        note_record(_headers(b"t2", b"half-1@7"), 2.0, visible, seen),
        note_record(_headers(b"t1", b"half-0@5"), 3.0, visible, seen),  # a copy: a replay
        # A second record of t2's transaction: a record of its own, not a copy.
        note_record(_headers(b"t2", b"half-1@8"), 4.0, visible, seen),
    ]
    assert noted == [True, True, False, True]
    assert visible == {b"t1": 1.0, b"t2": 2.0}


def test_an_exactly_once_topic_counts_every_record_and_times_a_txn_at_its_last():
    visible: dict[bytes | None, float] = {}
    assert note_record(_headers(b"t1", b"half-0@5"), 1.0, visible, None)
    assert note_record(_headers(b"t1", b"half-0@6"), 2.0, visible, None)
    assert note_record([("other", b"x")], 3.0, visible, None)  # counted, times nothing
    assert visible == {b"t1": 2.0}


def test_samples_pair_each_decision_with_its_sighting_in_ms():
    decided = {"t1": 10.0, "t2": 10.5, "never-seen": 11.0}
    visible = {b"t1": 10.025, b"t2": 10.6, b"other": 12.0}
    assert commit_to_visible(decided, visible) == pytest.approx([25.0, 100.0])


def test_the_triggers_take_turns_going_first_on_as_many_cores_as_partitions():
    assert [trigger_order(n)[0] for n in (1, 2, 3, 4)] == [
        "microbatch",
        "realtime",
        "microbatch",
        "realtime",
    ]
    assert set(trigger_order(2)) == {"microbatch", "realtime"}
    assert f"local[{INPUT_PARTITIONS}]" == MASTER


def test_the_case_is_a_default_case_run_through_its_bench(monkeypatch):
    from benchmarks import spark_latency
    from benchmarks.cases import CASE_RUNS, CASES, BenchContext

    made = []

    class FakeBench:
        def __init__(self, conf, prefix, s, work, log):
            made.append((conf, prefix))

        def run(self):
            return {"spark_realtime_commit_to_visible_ms": {"samples": [1.0]}}

    monkeypatch.setattr(spark_latency, "SparkLatencyBench", FakeBench)
    ctx = BenchContext({"bootstrap.servers": "b"}, "b", "__rmqx", BenchSettings(), Path("."))
    assert "spark_latency" in CASES
    CASE_RUNS["spark_latency"](ctx)
    CASE_RUNS["spark_latency"](ctx)
    assert made == [({"bootstrap.servers": "b"}, "__rmqx")]  # one bench (one session)


def _run(micro: list[float], realtime: list[float], promoted: list[float]) -> dict:
    side = {"offered_msgs_per_s": 1000, "threads": 16, "input_partitions": 2}
    return {
        "spark_microbatch_commit_to_visible_ms": {
            "samples": micro,
            "achieved_msgs_per_s": 1000.0,
            **side,
        },
        "spark_realtime_commit_to_visible_ms": {
            "samples": realtime,
            "achieved_msgs_per_s": 990.0,
            "batch_s": 10,
            **side,
        },
        "spark_microbatch_input_commit_to_visible_ms": {"samples": promoted},
        "spark_realtime_input_commit_to_visible_ms": {"samples": [p + 1 for p in promoted]},
    }


def test_the_page_shows_both_triggers_beside_the_promoted_topic():
    runs = aggregate([_run([200.0, 400.0], [20.0, 30.0], [10.0, 12.0])])
    block = render_block({**FIXTURE, **runs})
    lines = block.splitlines()
    micro = next(line for line in lines if line.startswith("| Spark job, micro-batch"))
    assert "at 1,000 msgs/s offered by 16 threads" in micro
    assert "| p50 200" in micro and "calls made at 1,000/s" in micro
    realtime = next(line for line in lines if line.startswith("| Spark job, Real-time Mode"))
    assert "(10 s batches)" in realtime and "| p50 20.0" in realtime
    # Each trigger beside the promoted topic of its own query: what Spark adds.
    assert "; promoted topic p50 10.0" in micro and "; promoted topic p50 11.0" in realtime
    # Said once, below the table: what the two triggers are and what the batch duration is.
    note = next(line for line in lines if line.startswith("The Spark job's rows"))
    assert "2 partitions" in note and "checkpoint interval" in note and "(10 s," in note
    assert lines.index(note) > lines.index(realtime)


def test_results_from_before_the_case_render_no_spark_latency_row():
    block = render_block(FIXTURE)
    assert "Real-time Mode" not in block and "The Spark job's rows" not in block
