"""The ``spark`` case: the Spark job reading a promoted topic against the same job reading a
plain topic of the same records (what the promoted-only filter and the decode cost)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import WARM_UP, BenchSettings, fill
from rmq_semantics.topics import ensure_topics

__all__ = ["SparkBench"]


class SparkBench:
    """One Spark session and one plain topic for every run of the case (a session takes
    seconds to start); :meth:`run` is one run, :meth:`stop` ends the session."""

    def __init__(self, bootstrap: str, s: BenchSettings, work: Path) -> None:
        self.bootstrap, self.s, self.work = bootstrap, s, work
        self._spark: Any = None
        self._plain = ""
        self._runs = 0

    def _start(self, promoted_topic: str) -> None:
        from spark.job import build_session

        conf = {"bootstrap.servers": self.bootstrap}
        self._plain = f"bench-plain-{uuid.uuid4().hex[:8]}"
        ensure_topics(conf, {self._plain: (self.s.partitions, {})})
        # As many records as the promoted topic holds (the txn case's warm-up included).
        fill(conf, self._plain, self.s.count + WARM_UP, self.s.size, key=str)
        self._spark = build_session("local[2]")
        # A first job on each side compiles and loads what later jobs reuse: not measured.
        self._rate("warm-promoted", promoted_topic, True)
        self._rate("warm-plain", self._plain, False)

    def _rate(self, name: str, topic: str, promoted: bool) -> float:
        from spark.job import JobSettings, run_job

        started = time.monotonic()
        result = run_job(
            JobSettings(
                bootstrap_servers=self.bootstrap,
                topics=topic,
                output=str(self.work / f"spark-{name}-{self._runs}"),
                available_now=True,
                require_promoted=promoted,
            ),
            spark=self._spark,
        )
        return result.rows_written / (time.monotonic() - started)

    def run(self, promoted_topic: str) -> dict[str, float]:
        """One run: rows/s on ``promoted_topic`` and on the plain topic, and their ratio."""
        if self._spark is None:
            self._start(promoted_topic)
        self._runs += 1
        # Alternate which side goes first, so neither always gets the warmer JVM.
        if self._runs % 2:
            promoted = self._rate("promoted", promoted_topic, True)
            plain = self._rate("plain", self._plain, False)
        else:
            plain = self._rate("plain", self._plain, False)
            promoted = self._rate("promoted", promoted_topic, True)
        return {
            "spark_promoted_rows_per_s": promoted,
            "spark_plain_rows_per_s": plain,
            "spark_ratio": promoted / plain,
        }

    def stop(self) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None
