"""What every bench case shares: its settings and timeouts, percentiles, filling a topic."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import confluent_kafka

__all__ = ["CASE_TIMEOUT_S", "TXN_BATCH", "WARM_UP", "BenchSettings", "fill", "percentile"]

# Any single case that has not finished by then is broken, not slow.
CASE_TIMEOUT_S = 300.0
TXN_BATCH = 500
# Records sent through each path before its clock starts (connections, metadata, JIT).
WARM_UP = 200


@dataclass(frozen=True)
class BenchSettings:
    size: int = 1024
    count: int = 100000
    partitions: int = 4
    rate: int = 1000
    latency_seconds: float = 10.0
    repeat: int = 3
    check_messages: int = 300
    # The threads case: how many caller threads, and how many calls each makes per run.
    thread_counts: tuple[int, ...] = (1, 8, 32)
    calls_per_thread: int = 300

    @classmethod
    def quick(cls) -> BenchSettings:
        return cls(count=20000, latency_seconds=5.0, repeat=3, check_messages=100,
                   thread_counts=(1, 8), calls_per_thread=20)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def fill(conf: dict, topic: str, count: int, size: int, key: Callable[[int], str]) -> None:
    """Write ``count`` random values of ``size`` bytes, record ``i`` keyed ``key(i)``."""
    producer = confluent_kafka.Producer({**conf, "linger.ms": 5})
    value = os.urandom(size)
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, key=key(i).encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
