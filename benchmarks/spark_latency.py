"""The ``spark_latency`` case: commit → row visible downstream of the Spark job, at ``s.rate``
msgs/s, once with the micro-batch trigger and once in Spark's Real-time Mode.

One run, per trigger (which goes first alternates from run to run): a promoted topic of
:data:`INPUT_PARTITIONS` partitions and an output topic, both new; the job started as a
streaming query through :func:`spark.job.run_job` (``sink="kafka"``, the CLI's entry point)
on a ``local[2]`` session, Real-time Mode holding one core per input partition;
``send_message_in_transaction`` called on the latency case's schedule
(:func:`benchmarks.txn.offer_load`) through the bench's coordinator. Two measuring consumers
time each transaction from its local decision to its record on the output topic (the
Kafka sink delivers at least once: copies are dropped by (``rmq.txn_id``,
``rmq.promoted_from``)) and to its record on the promoted topic (the coordinator's part)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.collector import Collector
from benchmarks.common import CASE_TIMEOUT_S, WARM_UP, BenchSettings
from benchmarks.txn import (
    NoopListener,
    commit_to_visible,
    latency_producer,
    offer_load,
    warm_paths,
)
from rmq_semantics.topics import ensure_topics
from spark.settings import TRIGGERS

__all__ = ["INPUT_PARTITIONS", "MASTER", "SparkLatencyBench", "trigger_order"]

# Real-time Mode runs one long-running task per input partition for the whole batch: the
# input's partitions may not outnumber the session's cores (spark.sinks.check_realtime_cores).
INPUT_PARTITIONS = 2
MASTER = f"local[{INPUT_PARTITIONS}]"
# How long a stopped query may take to end (spark.job stops it within its own timeout).
JOB_STOP_S = 90.0


def trigger_order(run: int) -> tuple[str, ...]:
    """The triggers in the order run ``run`` (from 1) takes them: each goes first every
    other run, so neither always gets the warmer JVM or the quieter broker."""
    return TRIGGERS if run % 2 else TRIGGERS[::-1]


class SparkLatencyBench:
    """One Spark session for every run of the case (a session takes seconds to start);
    :meth:`run` is one run, :meth:`stop` ends the session."""

    def __init__(
        self,
        conf: dict,
        prefix: str,
        s: BenchSettings,
        work: Path,
        log: Callable[[str], None] = print,
    ) -> None:
        self.conf, self.prefix, self.s, self.work, self.log = conf, prefix, s, work, log
        self._spark: Any = None
        self._runs = 0

    def run(self) -> dict:
        """One run: per trigger, commit → visible on the output topic and on the promoted
        topic the query reads."""
        from spark.job import build_session

        if self._spark is None:
            self._spark = build_session(MASTER)
        self._runs += 1
        results: dict[str, Any] = {}
        for trigger in trigger_order(self._runs):
            downstream, promoted = self._one(trigger)
            results[f"spark_{trigger}_commit_to_visible_ms"] = downstream
            # The same transactions on the promoted topic: the coordinator's part, taken
            # while this query ran (its CPU is the machine's too).
            results[f"spark_{trigger}_input_commit_to_visible_ms"] = {"samples": promoted}
        return results

    def _one(self, trigger: str) -> tuple[dict[str, Any], list[float]]:
        """One query with ``trigger``: the figure of commit → visible (ms) on the output
        topic, and the samples of commit → visible on the promoted topic."""
        from spark.job import JobSettings, run_job

        tag = uuid.uuid4().hex[:8]
        source, sink = f"bench-sparklat-in-{tag}", f"bench-sparklat-out-{tag}"
        ensure_topics(self.conf, {source: (INPUT_PARTITIONS, {}), sink: (INPUT_PARTITIONS, {})})
        count = int(self.s.rate * self.s.latency_seconds)
        promoted = Collector(self.conf, source, INPUT_PARTITIONS, count, warm_up=WARM_UP)
        output = Collector(self.conf, sink, INPUT_PARTITIONS, count, warm_up=WARM_UP, distinct=True)
        settings = JobSettings(
            bootstrap_servers=self.conf["bootstrap.servers"],
            topics=source,
            sink="kafka",
            output_topic=sink,
            checkpoint=str(self.work / f"spark-latency-{trigger}-{tag}.checkpoint"),
            trigger=trigger,
            topic_prefix=self.prefix,
        )
        stop = threading.Event()
        failed: list[BaseException] = []

        def job() -> None:
            try:
                run_job(settings, spark=self._spark, stop_event=stop)
            except BaseException as exc:  # reported by the run, not lost in a thread
                failed.append(exc)

        query = threading.Thread(target=job, daemon=True, name=f"bench-spark-{trigger}")
        listener = NoopListener()
        # Text values, as a job decoding strings would get them (random bytes are not text).
        value = os.urandom(self.s.size // 2).hex().encode()
        promoted.start()
        output.start()
        query.start()
        try:
            with latency_producer(self.conf, self.prefix, self.s, listener) as producer:
                warm_paths(producer, source, value, self.s)
                # The warm-up records through the job: the query has started and compiled.
                _wait_warm(promoted, query, failed)
                _wait_warm(output, query, failed)
                listener.decided.clear()
                achieved = offer_load(producer, source, value, self.s)
                producer.flush(60)
                promoted.join(CASE_TIMEOUT_S)
                output.join(CASE_TIMEOUT_S)
        finally:
            stop.set()
            query.join(JOB_STOP_S)
        if failed:
            raise RuntimeError(f"spark_latency: the {trigger} query failed: {failed[0]!r}")
        if query.is_alive():
            self.log(f"spark_latency: the {trigger} query did not stop within {JOB_STOP_S:.0f} s")
        figure: dict[str, Any] = {
            "samples": commit_to_visible(listener.decided, output.visible),
            "offered_msgs_per_s": self.s.rate,
            "achieved_msgs_per_s": achieved,
            "threads": self.s.latency_threads,
            "input_partitions": INPUT_PARTITIONS,
        }
        if trigger == "realtime":
            figure["batch_s"] = settings.realtime_batch_s  # the checkpoint interval
        return figure, commit_to_visible(listener.decided, promoted.visible)

    def stop(self) -> None:
        from pyspark import SparkContext

        # The spark case holds the same session (getOrCreate) and may have stopped it.
        active = SparkContext._active_spark_context is not None  # noqa: SLF001 (no public probe)
        if self._spark is not None and active:
            self._spark.stop()
        self._spark = None


def _wait_warm(collector: Collector, query: threading.Thread, failed: list[BaseException]) -> None:
    """Wait for ``collector``'s warm-up records while the query runs (a query that failed
    to start would otherwise hold the run for the whole case timeout)."""
    deadline = time.monotonic() + CASE_TIMEOUT_S
    while not collector.warmed.wait(1.0):
        if failed or not query.is_alive():
            raise RuntimeError(
                f"spark_latency: the query ended before the warm-up records came: {failed[0]!r}"
                if failed
                else "spark_latency: the query ended before the warm-up records came"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {collector.warm_up} warm-up records never arrived")
