"""The machine a bench ran on: what it is (cores, versions) and how loaded it was around each
case (a /proc/stat sample and the load average), and a process's CPU time for sizing."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import resource
import time

from coordinator.kafka_txn import LINGER_MS as COORDINATOR_LINGER_MS
from rmq_semantics.lock_client import LINGER_MS as LOCK_CLIENT_LINGER_MS
from rmq_semantics.producer import BATCH_LINGER_MS, CALL_LINGER_MS

__all__ = ["BUSY_FRACTION", "load_sample", "machine_info", "process_cpu_s"]

# A case is marked as taken on a busy machine when more than this share of the CPU was
# already busy in the sample just before it started (the bench itself was idle then).
BUSY_FRACTION = 0.25


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user time
    return total - idle, total


def load_sample(seconds: float) -> dict:
    """The share of all CPUs busy over the next ``seconds``, and the load averages."""
    try:
        busy0, total0 = _cpu_times()
        time.sleep(seconds)
        busy1, total1 = _cpu_times()
        with open("/proc/loadavg") as loadavg:
            averages = [float(v) for v in loadavg.read().split()[:3]]
    except OSError:  # not Linux: the load is unknown, not zero
        return {"cpu_busy": None, "loadavg": None}
    return {"cpu_busy": round((busy1 - busy0) / max(1, total1 - total0), 3), "loadavg": averages}


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) ``pid`` spent so far, from /proc; this process if None."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_info(kafka: str) -> dict:
    import confluent_kafka

    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kafka": kafka,
        "confluent_kafka": importlib.metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        # Every producer's linger.ms is set, not left to the client's default (issue 34).
        "linger_ms": {
            "batching producers": BATCH_LINGER_MS,
            "per-call path": CALL_LINGER_MS,
            "coordinator": COORDINATOR_LINGER_MS,
            "lock client": LOCK_CLIENT_LINGER_MS,
        },
    }
