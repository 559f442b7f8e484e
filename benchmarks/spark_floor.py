"""Where the Spark job's promoted/plain gap goes: ``python -m benchmarks.spark_floor``.

The ``spark`` case compares the job on a promoted topic with the same job on a plain topic of
records without headers. This splits the difference by running, in one session and in
rotating order, the job on four inputs of the same ``--rows`` records (1 KiB values):

- ``promoted``: records with the headers the coordinator writes (``rmq.txn_id``,
  ``rmq.promoted_from``, ``rmq.promoted_at``), the guard on, the default columns;
- ``plain``: no headers, the guard off (the ``spark`` case's baseline);
- ``promoted, no metadata``: as ``promoted`` but ``_txn_id`` and ``_promoted_from`` written
  as nulls (what those two columns cost);
- ``plain with headers``: the same headers but ``rmq.promoted_from``, the guard off (what
  reading headers at all costs).

It prints rows/s per input and each input's ratio to ``plain``, run by run. The columns are
switched off by replacing :func:`spark.transforms.header_value` in this process only: the
job's settings have no such option. docs/benchmarks.md reports its figures."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import Column
from pyspark.sql import functions as F

import spark.transforms as transforms
from benchmarks.common import fill
from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.records.headers import H
from rmq_semantics.topics import ensure_topics
from spark.job import JobSettings, build_session, run_job

PARTITIONS = 8
VALUE_SIZE = 1024
PROMOTED_AT = b"1796000000000"


def _headers(promoted: bool) -> Callable[[int], list[tuple[str, bytes]]]:
    def of(i: int) -> list[tuple[str, bytes]]:
        out = [(H.TXN_ID, uuid.uuid4().hex.encode())]
        if promoted:
            out.append((H.PROMOTED_FROM, f"3:{i}".encode()))
        return [*out, (H.PROMOTED_AT, PROMOTED_AT)]

    return of


@contextmanager
def _no_header_columns(off: bool) -> Iterator[None]:
    """With ``off``, the header-derived columns are nulls (the guard still reads headers)."""
    original = transforms.header_value

    def null_column(name: str, headers: str | Column = "headers") -> Column:
        return F.lit(None).cast("string")

    if off:
        transforms.header_value = null_column
    try:
        yield
    finally:
        transforms.header_value = original


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_floor")
    parser.add_argument("--rows", type=int, default=300_000, help="records per input")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rmq-spark-floor-") as tmp:
        work = Path(tmp)
        kafka = EmbeddedKafka(work / "kafka", port=free_port())
        conf = {"bootstrap.servers": kafka.start()}
        try:
            _measure(conf, work, args.rows, args.rounds)
        finally:
            kafka.stop()


def _measure(conf: dict, work: Path, rows: int, rounds: int) -> None:
    tag = uuid.uuid4().hex[:6]
    topics = {name: f"floor-{name}-{tag}" for name in ("promoted", "plain", "headers")}
    ensure_topics(conf, {t: (PARTITIONS, {}) for t in topics.values()})
    fill(conf, topics["promoted"], rows, VALUE_SIZE, key=str, headers=_headers(True))
    fill(conf, topics["plain"], rows, VALUE_SIZE, key=str)
    fill(conf, topics["headers"], rows, VALUE_SIZE, key=str, headers=_headers(False))
    # name -> (topic, guard on, header columns off)
    inputs = {
        "promoted": (topics["promoted"], True, False),
        "plain": (topics["plain"], False, False),
        "promoted, no metadata": (topics["promoted"], True, True),
        "plain with headers": (topics["headers"], False, False),
    }
    session = build_session("local[2]")
    jobs = 0

    def rate(topic: str, guard: bool, columns_off: bool) -> float:
        nonlocal jobs
        jobs += 1
        settings = JobSettings(
            bootstrap_servers=conf["bootstrap.servers"],
            topics=topic,
            output=str(work / f"out-{jobs}"),
            available_now=True,
            require_promoted=guard,
        )
        with _no_header_columns(columns_off):
            started = time.monotonic()
            result = run_job(settings, spark=session)
            elapsed = time.monotonic() - started
        if result.rows_written != rows:
            raise RuntimeError(f"{topic}: {result.rows_written} rows written, not {rows}")
        return rows / elapsed

    try:
        for spec in inputs.values():  # compile and load once per input: not measured
            rate(*spec)
        names = list(inputs)
        rates: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                rates[name].append(rate(*inputs[name]))
        print(f"{rows:,} records per input, {PARTITIONS} partitions, local[2], {rounds} rounds")
        for name in names:
            ratios = [a / b for a, b in zip(rates[name], rates["plain"], strict=True)]
            print(
                f"{name:>22}: {statistics.median(rates[name]):>9,.0f} rows/s median; "
                f"÷ plain {statistics.median(ratios):.3f} "
                f"(runs {', '.join(f'{x:.3f}' for x in ratios)})"
            )
    finally:
        session.stop()


if __name__ == "__main__":
    main()
