"""What every bench case shares: its settings and timeouts, percentiles, filling a topic, and
how runs become figures (a median with min-max and every run, issue 13)."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import confluent_kafka

from rmq_semantics.message import produce_headers

__all__ = [
    "CASE_TIMEOUT_S",
    "TXN_BATCH",
    "WARM_UP",
    "BenchSettings",
    "aggregate",
    "figure",
    "fill",
    "percentile",
    "pooled_samples",
    "ratio_figure",
    "scaled_figure",
    "sketch",
]

# Any single case that has not finished by then is broken, not slow.
CASE_TIMEOUT_S = 300.0
TXN_BATCH = 500
# Records sent through each path before its clock starts (connections, metadata, JIT).
WARM_UP = 200
# Points kept of a latency distribution for the plots (quantiles, so its shape survives).
SKETCH_POINTS = 1000


@dataclass(frozen=True)
class BenchSettings:
    size: int = 1024
    count: int = 100000
    partitions: int = 4
    rate: int = 1000
    latency_seconds: float = 10.0
    repeat: int = 5
    check_messages: int = 300
    # The threads case: how many caller threads, and how many calls each makes per run.
    thread_counts: tuple[int, ...] = (1, 8, 32, 128)
    calls_per_thread: int = 300
    # The latency case's caller threads, each offering rate / latency_threads per second.
    latency_threads: int = 16
    # Seconds of /proc/stat sampled before and after each case run (the machine's load).
    load_sample_s: float = 1.0
    # The stall case's kills per run until one finds a transaction open.
    stall_attempts: int = 5
    # The keys case: records per mode (Parallel Consumer's table has 10,000).
    keys_count: int = 10000
    # The rocketmq case: seconds of its 32-thread window (after a 5 s warm-up).
    rocketmq_seconds: int = 20

    @classmethod
    def quick(cls) -> BenchSettings:
        return cls(
            count=20000,
            latency_seconds=5.0,
            repeat=2,
            check_messages=100,
            thread_counts=(1, 8),
            calls_per_thread=20,
            load_sample_s=0.5,
            stall_attempts=1,
            keys_count=1000,
            rocketmq_seconds=5,
        )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def fill(
    conf: dict,
    topic: str,
    count: int,
    size: int,
    key: Callable[[int], str],
    headers: Callable[[int], list[tuple[str, bytes]]] | None = None,
) -> None:
    """Write ``count`` random values of ``size`` bytes, record ``i`` keyed ``key(i)`` (and
    with the headers ``headers(i)``)."""
    producer = confluent_kafka.Producer({**conf, "linger.ms": 5})
    value = os.urandom(size)
    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key=key(i).encode(),
                    headers=produce_headers(headers(i)) if headers else None,
                )
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def started_rate(consumer: Any, topic: str, listener: Any, count: int) -> float:
    """Subscribe ``consumer`` (an orderly or push consumer) to ``topic``, start it, wait until
    ``listener`` counted ``count`` messages (or the case timeout), shut it down; its rate."""
    consumer.subscribe([topic])
    consumer.start()
    deadline = time.monotonic() + CASE_TIMEOUT_S
    try:
        while listener.seen < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return listener.rate()
    finally:
        consumer.shutdown()


# -- figures ------------------------------------------------------------------------------
def _finite(value: Any) -> float | None:
    """A run's value as a float, None when it is not a number (NaN: nothing measured)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def figure(runs: list[float | None]) -> dict:
    """``{"median", "min", "max", "runs"}``: every run kept, the spread over the measured
    ones (a run that measured nothing is None and left out of the spread)."""
    kept = [_finite(r) for r in runs]
    measured = [r for r in kept if r is not None]
    if not measured:
        return {"median": None, "min": None, "max": None, "runs": kept}
    return {
        "median": statistics.median(measured),
        "min": min(measured),
        "max": max(measured),
        "runs": kept,
    }


def aggregate(runs: list[Any]) -> Any:
    """The figures of a case from its runs' results, by the type of each value:
    floats become a :func:`figure`; lists of samples (latencies) give each run's
    p50/p99/max, each a figure over the runs; dicts are aggregated key by key; anything
    else (ints such as batch sizes, strings, settings) is a constant: the last run's."""
    if all(isinstance(r, float) for r in runs):
        return figure(runs)
    if all(isinstance(r, list) for r in runs):
        return {
            "p50": figure([percentile(r, 50) for r in runs]),
            "p99": figure([percentile(r, 99) for r in runs]),
            "max": figure([max(r, default=float("nan")) for r in runs]),
            "n": sum(len(r) for r in runs),
        }
    if all(isinstance(r, dict) for r in runs):
        keys = dict.fromkeys(k for r in runs for k in r)
        out = {k: aggregate([r[k] for r in runs if k in r]) for k in keys}
        # {"samples": [...], "offered_msgs_per_s": 1000}: the percentiles beside the constants
        samples = out.pop("samples", None)
        return {**samples, **out} if isinstance(samples, dict) else out
    return runs[-1]


def pooled_samples(runs: list[Any], path: str = "") -> dict[str, list[float]]:
    """Every ``{"samples": [...]}`` in the runs' results, by its key path (``a.b``), the
    runs' samples pooled: the distributions the plots show."""
    found: dict[str, list[float]] = {}
    dicts = [r for r in runs if isinstance(r, dict)]
    if not dicts:
        return found
    if any(isinstance(r.get("samples"), list) for r in dicts):
        found[path] = [v for r in dicts for v in r.get("samples", [])]
    for key in dict.fromkeys(k for r in dicts for k in r if k != "samples"):
        found.update(
            pooled_samples([r[key] for r in dicts if key in r], f"{path}.{key}" if path else key)
        )
    return found


def ratio_figure(numerator: dict, denominator: dict) -> dict:
    """Run i of one figure over run i of another (runs are taken in turns, so run i of
    every case saw the same machine); the ratio's median and spread are over those pairs."""
    pairs = zip(numerator.get("runs", []), denominator.get("runs", []), strict=False)
    return figure([a / b if a is not None and b else None for a, b in pairs])


def scaled_figure(source: dict, factor: float) -> dict:
    return figure([None if r is None else r * factor for r in source.get("runs", [])])


def sketch(samples: list[float], points: int = SKETCH_POINTS) -> list[float]:
    """At most ``points`` evenly spaced quantiles of ``samples``: a histogram of them has
    the distribution's shape, in a file of a few kilobytes."""
    ordered = sorted(samples)
    if len(ordered) <= points:
        return [round(v, 3) for v in ordered]
    step = (len(ordered) - 1) / (points - 1)
    return [round(ordered[round(i * step)], 3) for i in range(points)]
