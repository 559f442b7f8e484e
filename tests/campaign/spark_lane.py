"""The Spark job in the long campaign: the product's ``rmq-semantics spark`` streams the
run's promoted topics into Parquet through the faults; once the run settled, the same job
catches up from its checkpoint (``--available-now``) and its output becomes ``spark_row``
events, which ``check_spark`` compares with the committed rows (each once, nothing else).

    lane = SparkLane(cfg, out_dir)
    lane.start()                  # with the load
    drafts = lane.finish()        # after the final read: stop, catch up, read the output
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.campaign import events as ev
from tests.campaign.config import CampaignConfig
from tests.campaign.history import Draft
from tests.campaign.processes import REPO, WorkerProcess
from tests.campaign.workload import parse_body

__all__ = ["SparkLane"]

log = logging.getLogger("campaign.spark")

CATCH_UP_TIMEOUT_S = 300.0
READ_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
# Inside the campaign's network namespace only loopback exists: Spark binds there.
ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}

# Reads the job's Parquet output with Spark itself (the job's own reader, no pyarrow):
# one JSON line per row.
_READ = """
import json, sys
from spark.job import build_session
spark = build_session("local[1]", "campaign-spark-read")
for row in spark.read.parquet(sys.argv[1]).select("value", "_topic", "_partition",
                                                 "_offset").toLocalIterator():
    print(json.dumps(row.asDict()))
spark.stop()
"""


class SparkLane:
    """The Spark job of one run, its output under ``out/spark``."""

    def __init__(self, cfg: CampaignConfig, out: Path) -> None:
        self.cfg = cfg
        self.dir = out / "spark"
        self.output = self.dir / "rows"
        # The run's promoted topics, those made mid-run too; never a system topic.
        self.pattern = cfg.real_topic_pattern
        self.stream: WorkerProcess | None = None
        self.notes: list[str] = []

    def _args(self, *extra: str) -> list[str]:
        return [
            "spark",
            "--bootstrap-servers",
            self.cfg.bootstrap,
            "--topics",
            self.pattern,
            "--output",
            str(self.output),
            "--master",
            "local[1]",
            "--topic-prefix",
            self.cfg.topic_prefix,
            *extra,
        ]

    def start(self) -> None:
        self.stream = WorkerProcess(
            "spark", "rmq_semantics", self._args(), self.dir / "stream.log", "spark"
        ).start(ENV)

    def finish(self) -> list[Draft]:
        """Stop the stream, catch up from its checkpoint, read the output as spark_row
        events (a step that fails is a note, and its rows are missing)."""
        if self.stream is not None:
            code = self.stream.stop(STOP_TIMEOUT_S)
            if code not in (0, None, -signal.SIGTERM):
                self.notes.append(
                    f"spark: the streaming job exited {code} (see {self.dir / 'stream.log'})"
                )
        catch_up = self._run(
            [sys.executable, "-m", "rmq_semantics", *self._args("--available-now")],
            "catch-up",
            CATCH_UP_TIMEOUT_S,
        )
        if catch_up is None:
            return []
        rows = self._run([sys.executable, "-c", _READ, str(self.output)], "read", READ_TIMEOUT_S)
        drafts = []
        for line in (rows or "").splitlines():
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            where = f"{row['_topic']}[{row['_partition']}]@{row['_offset']}"
            mid = parse_body(row.get("value")).get("mid") or f"not a workload record: {where}"
            drafts.append(
                ev.spark_row(
                    mid, topic=row["_topic"], partition=row["_partition"], offset=row["_offset"]
                )
            )
        return drafts

    def _run(self, argv: list[str], what: str, timeout_s: float) -> str | None:
        with open(self.dir / f"{what}.log", "ab") as err:
            try:
                done = subprocess.run(
                    argv,
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    timeout=timeout_s,
                    check=False,
                    env={**os.environ, "PYTHONPATH": str(REPO), **ENV},
                )
            except subprocess.TimeoutExpired:
                self.notes.append(f"spark {what}: no end within {timeout_s:.0f} s")
                return None
        if done.returncode != 0:
            self.notes.append(
                f"spark {what}: exit {done.returncode} (see {self.dir / (what + '.log')})"
            )
            return None
        return done.stdout.decode(errors="replace")
