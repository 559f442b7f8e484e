"""Time in the campaign's checkers: the cluster faults' intervals on the monotonic clock of
the events, and a deadline measured in up-time (the horizon does not run while the cluster
is not whole). Shared by checkers.py and timer_checks.py."""

from __future__ import annotations

import math

from tests.campaign.history import History, Kind
from tests.campaign.nemesis import BROKER_KINDS

__all__ = ["CLUSTER_FAULTS", "cluster_fault_intervals", "overlaps", "up_deadline"]


#: The nemesis's cluster-lane faults: while one is on, the cluster is not whole and the
#: liveness horizon does not run (see check_liveness).
CLUSTER_FAULTS = frozenset(BROKER_KINDS)


def cluster_fault_intervals(history: History) -> list[tuple[float, float]]:
    """The [start, heal) periods of cluster faults, on the monotonic clock of the events
    (a fault event is recorded at its heal: its wall-clock times map through the event's)."""
    out = []
    for e in history.of(Kind.FAULT):
        if e["fault"] not in CLUSTER_FAULTS or e.get("start_ms") is None:
            continue
        to_mono = e.mono_s - e.wall_ms / 1000
        end = e.get("end_ms")
        out.append(
            (e["start_ms"] / 1000 + to_mono, math.inf if end is None else end / 1000 + to_mono)
        )
    return out


def up_deadline(start: float, horizon_s: float, down: list[tuple[float, float]]) -> float:
    """The moment ``horizon_s`` of up-time has passed since ``start``."""
    t, left = start, horizon_s
    for lo, hi in sorted(down):
        if hi <= t:
            continue
        if lo > t:
            if lo - t >= left:
                return t + left
            left -= lo - t
        t = max(t, hi)
    return t + left


def overlaps(intervals: list[tuple[float, float]], lo: float, hi: float) -> bool:
    """Whether any [start, end) of ``intervals`` meets [lo, hi]."""
    return any(start <= hi and end >= lo for start, end in intervals)
