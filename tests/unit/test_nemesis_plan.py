"""The nemesis's plan (tests/campaign/nemesis.py): drawn from its seed alone, every kind in
the short plan, one fault at a time per lane, targets that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.campaign.faultkit import Fault, ProcTarget
from tests.campaign.nemesis import ALL_KINDS, BROKER_KINDS, SHORT, Timing, make_plan

PROCS = [
    ProcTarget("coordinator-1", "coordinator", lambda: None),
    ProcTarget("coordinator-2", "coordinator", lambda: None),
    ProcTarget("consumer-1", "consumer", lambda: None),
    ProcTarget("producer-skewed", "producer", lambda: None, clock_file=Path("/x")),
]


def _plan(seed: int, short: bool = False, duration_s: float = 600.0):
    return make_plan(
        seed,
        ALL_KINDS,
        duration_s,
        [1, 2, 3],
        PROCS,
        SHORT if short else Timing(),
        short=short,
        disk_node=3,
    )


def test_a_seed_replays_the_same_plan_and_another_seed_differs():
    assert _plan(7) == _plan(7)
    assert _plan(7) != _plan(8)


def test_the_short_plan_has_every_kind_once_within_three_minutes_per_lane():
    plan = _plan(11, short=True)
    assert sorted(s.kind for s in plan) == sorted(ALL_KINDS)
    for lane in ("cluster", "process"):
        last = max((s for s in plan if s.lane == lane), key=lambda s: s.at_s)
        assert last.at_s + last.hold_s <= 180, (lane, last)


def test_the_long_plan_fills_its_duration_with_every_kind_and_more():
    plan = _plan(3, duration_s=600)
    kinds = [s.kind for s in plan]
    assert set(kinds) == set(ALL_KINDS)
    assert len(kinds) >= 20
    cluster = [s for s in plan if s.lane == "cluster"]
    assert all(s.kind in BROKER_KINDS for s in cluster)
    # One fault at a time per lane: planned starts are increasing.
    assert [s.at_s for s in cluster] == sorted(s.at_s for s in cluster)


def test_targets_exist_and_skews_go_both_ways():
    names = {p.name for p in PROCS}
    offsets = set()
    for seed in range(20):
        for step in _plan(seed, short=True):
            if step.kind in ("broker_pause", "broker_kill", "partition", "disk_full"):
                assert step.target in (1, 2, 3)
            elif step.kind == "group_coordinator_kill":
                assert step.extra["trigger"] in ("coordinator-1", "coordinator-2")
            elif step.kind == "clock_skew":
                assert step.target == "producer-skewed"
                offsets.add(step.extra["offset"][0])
            elif step.target is not None:
                assert step.target in names
                assert str(step.target).startswith(step.kind.rsplit("_", 1)[0])
    assert offsets == {"+", "-"}


class _Flaky(Fault):
    kind = "flaky"

    def __init__(self) -> None:
        super().__init__("x", seed=5)
        self.healed = 0

    def _apply(self) -> None:
        raise RuntimeError("no such process")

    def _heal(self) -> None:
        self.healed += 1


def test_a_fault_that_fails_to_apply_is_recorded_with_its_error_and_healed():
    fault = _Flaky()
    with pytest.raises(RuntimeError):
        fault.apply()
    event = fault.event()
    assert event["kind"] == "flaky" and event["seed"] == 5
    assert event["end_ms"] >= event["start_ms"]
    assert "no such process" in event["detail"]["error"]
    assert fault.healed == 1
    fault.heal()  # idempotent
    assert fault.healed == 1


def test_a_consumer_pause_hits_a_lock_holder_with_a_peer_so_its_queues_change_hands():
    procs = [
        *PROCS,
        ProcTarget("push-0", "consumer", lambda: None),
        ProcTarget("orderly-0", "consumer", lambda: None, handover=True),
    ]
    for seed in range(20):
        plan = make_plan(seed, ALL_KINDS, 600, [1, 2, 3], procs, SHORT, short=True, disk_node=3)
        assert [s.target for s in plan if s.kind == "consumer_pause"] == ["orderly-0"]
