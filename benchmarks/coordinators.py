"""The ``coordinators`` case: the batch API through one coordinator process, then through two
sharing the half partitions (one consumer group), with the CPU seconds each side spends per
1,000 promoted messages: what sizing a deployment needs (issue 13)."""

from __future__ import annotations

import re
import time
import uuid

from benchmarks.common import BenchSettings
from benchmarks.machine import process_cpu_s
from benchmarks.txn import bench_txn, coordinator_process
from rmq_semantics.tools.coordinator_process import CoordinatorProcess

__all__ = ["bench_coordinators"]

# What the transaction service logs on a rebalance (coordinator/txn_service.py _on_assign,
# _on_revoke): the bench reads it to start the clock only once every partition has an owner.
ASSIGNMENT_LINE = re.compile(r"(assigned|revoked) half/op partitions \[([0-9, ]*)\]")
ASSIGNMENT_TIMEOUT_S = 120.0


def _held(log: str) -> set[int]:
    """The half partitions a coordinator holds now, replayed from its log."""
    held: set[int] = set()
    for match in ASSIGNMENT_LINE.finditer(log):
        partitions = {int(p) for p in match.group(2).split(",") if p.strip()}
        held = held | partitions if match.group(1) == "assigned" else held - partitions
    return held


def _wait_assigned(coordinators: list[CoordinatorProcess], partitions: int) -> None:
    """Until each coordinator holds some half partitions, none twice, all of them in all:
    the rebalance that the last one's join started is over."""
    deadline = time.monotonic() + ASSIGNMENT_TIMEOUT_S
    while time.monotonic() < deadline:
        held = []
        for coordinator in coordinators:
            coordinator.require_running()
            held.append(_held(coordinator.log))
        every = set().union(*held)
        if all(held) and sum(map(len, held)) == len(every) == partitions:
            return
        time.sleep(0.1)
    raise RuntimeError(
        f"the {len(coordinators)} coordinators did not share the "
        f"{partitions} half partitions within {ASSIGNMENT_TIMEOUT_S:.0f} s; "
        f"see {[str(c.log_path) for c in coordinators]}"
    )


def _measure(
    conf: dict, prefix: str, s: BenchSettings, coordinators: list[CoordinatorProcess]
) -> dict:
    cpu: dict[bool, tuple[float, float]] = {}

    def on_clock(starting: bool) -> None:
        cpu[starting] = (process_cpu_s(None), sum(process_cpu_s(c.pid) for c in coordinators))

    rate, _, _ = bench_txn(conf, prefix, s, s.count, on_clock=on_clock)
    per_1000 = 1000 / s.count
    return {
        "msgs_per_s": rate,
        "producer_cpu_s_per_1000": (cpu[False][0] - cpu[True][0]) * per_1000,
        "coordinator_cpu_s_per_1000": (cpu[False][1] - cpu[True][1]) * per_1000,
    }


def bench_coordinators(conf: dict, bootstrap: str, s: BenchSettings) -> dict:
    """``{"1": {msgs_per_s, producer_cpu_s_per_1000, coordinator_cpu_s_per_1000}, "2": ...}``
    for one run. Each measurement starts after its warm-up batch was promoted (bench_txn)
    and after the coordinators' rebalance settled."""
    prefix = f"__rmqbenchco{uuid.uuid4().hex[:6]}"
    first = coordinator_process(bootstrap, prefix, "-1", half_partitions=s.partitions)
    second = coordinator_process(bootstrap, prefix, "-2", half_partitions=s.partitions)
    try:
        first.start()
        first.wait_ready()
        _wait_assigned([first], s.partitions)
        one = _measure(conf, prefix, s, [first])
        second.start()
        second.wait_ready()
        _wait_assigned([first, second], s.partitions)
        two = _measure(conf, prefix, s, [first, second])
    finally:
        second.stop()
        first.stop()
    return {"1": one, "2": two}
