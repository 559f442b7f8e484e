"""The runner's wiring of the real nemesis (tests/campaign/wire.py): the Timing it derives
from the run's timeouts, and the liveness window of a producer whose clock runs ahead."""

from __future__ import annotations

from pathlib import Path

from tests.campaign import wire
from tests.campaign.config import SESSION_TIMEOUT_MS
from tests.campaign.history import Kind, Recorder, load
from tests.campaign.runner import Options, plan_config


def _cfg(tmp_path: Path):
    return plan_config(Options(30, 150.0, True, tmp_path), "127.0.0.1:9")


def test_short_timing_outlasts_the_session_timeout_and_the_leases(tmp_path):
    cfg = _cfg(tmp_path)
    timing = wire.timing_for(cfg, short=True)
    assert timing.process_pause_s > SESSION_TIMEOUT_MS / 1000
    assert timing.process_pause_s > cfg.consumer_lease_ms / 1000
    assert timing.process_pause_s > cfg.coordinator["lock_lease_ms"] / 1000
    assert timing.rebalance_wait_s > SESSION_TIMEOUT_MS / 1000
    assert timing.skew_s == (15, 40)


class _Plan:
    def __init__(self) -> None:
        self.list: list[dict] = []

    def events(self) -> list[dict]:
        return list(self.list)


def _wired(tmp_path: Path, clock: list[float], monkeypatch) -> tuple[wire.RealNemesis, _Plan]:
    nem = object.__new__(wire.RealNemesis)
    nem.cfg, nem.rec = _cfg(tmp_path), Recorder(tmp_path / "h" / "runner.jsonl", "runner")
    nem.recorded, nem.frozen = set(), {}
    nem.nemesis = _Plan()  # type: ignore[assignment]
    monkeypatch.setattr(wire.time, "monotonic", lambda: clock[0])
    return nem, nem.nemesis  # type: ignore[return-value]


def _states(nem: wire.RealNemesis, tmp_path: Path) -> list[tuple[str, bool]]:
    nem.rec.flush()
    return [(e["group"], e["up"]) for e in load(tmp_path / "h").of(Kind.GROUP_STATE)]


def test_a_clock_ahead_takes_its_group_down_until_offset_and_a_session_past_its_end(
    tmp_path, monkeypatch
):
    clock = [100.0]
    nem, plan = _wired(tmp_path, clock, monkeypatch)
    group = f"{nem.cfg.run_id}-pg2"
    skew = {
        "kind": "clock_skew",
        "target": "producer-2",
        "start_ms": 1,
        "end_ms": None,
        "seed": 30,
        "detail": {"offset": "+20"},
    }
    plan.list.append(skew)
    nem.record_ended()
    assert _states(nem, tmp_path) == [(group, False)]
    skew["end_ms"] = 2
    clock[0] = 110.0
    nem.record_ended()
    clock[0] = 110.0 + 20 + SESSION_TIMEOUT_MS / 1000 - 1
    nem.record_ended()
    assert _states(nem, tmp_path) == [(group, False)]
    clock[0] += 2
    nem.record_ended()
    nem.record_ended()
    assert _states(nem, tmp_path) == [(group, False), (group, True)]
    assert [e["fault"] for e in load(tmp_path / "h").of(Kind.FAULT)] == ["clock_skew"]


def test_a_clock_behind_leaves_its_group_up(tmp_path, monkeypatch):
    nem, plan = _wired(tmp_path, [100.0], monkeypatch)
    plan.list.append(
        {
            "kind": "clock_skew",
            "target": "producer-2",
            "start_ms": 1,
            "end_ms": 2,
            "seed": 30,
            "detail": {"offset": "-20"},
        }
    )
    nem.record_ended()
    assert _states(nem, tmp_path) == []
