"""Stand-in nemeses until tests/campaign/nemesis.py lands: ``Calm`` (no faults) and
``SmokeNemesis`` (``--stub-faults``: a fixed handful of faults to exercise the runner).

The interface the runner expects of a nemesis: ``Nemesis(seed, targets, recorder)``
(targets: ``processes.Targets``, recorder: ``history.Recorder``); ``run(until_mono)`` acts
until then, recording each fault as a ``fault`` event (events.fault); ``heal()`` undoes
every fault in force, bounded in time. The runner then restarts and SIGCONTs whatever is
still down or paused, and notes it (a failed run).
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from tests.campaign import events as ev
from tests.campaign.history import Recorder
from tests.campaign.processes import Targets

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
# What the faults must have caused (checkers.OBSERVATIONS), unless the nemesis class says
# (its MINIMUMS); the smoke faults' own; none in calm weather.
FAULT_MINIMUMS = {"leader_change": 1, "lock_takeover": 1, "rebalance": 1, "fenced_producer": 1}
SMOKE_MINIMUMS = {"leader_change": 1, "lock_takeover": 1, "rebalance": 1}


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Calm:
    """No faults: calm weather."""

    def __init__(self, seed: int, targets: Targets, recorder: Recorder) -> None:
        self.seed, self.targets, self.recorder = seed, targets, recorder

    def run(self, until_mono: float) -> None:
        while time.monotonic() < until_mono:
            time.sleep(min(1.0, max(0.0, until_mono - time.monotonic())))

    def heal(self) -> None:
        return None


class SmokeNemesis(Calm):
    """A fixed handful of faults, one after another: a producer SIGKILLed and restarted, an
    orderly consumer paused past its lease, a broker SIGKILLed and restarted, a coordinator
    SIGKILLed and restarted, the async producer restarted with its clock 20 s ahead
    (libfaketime), a coordinator paused past its session timeout (a zombie)."""

    def run(self, until_mono: float) -> None:
        t = self.targets
        by_name = {w.name: w for w in t.workers()}
        steps: list[tuple[str, str, Callable[[], None]]] = [
            ("process_sigkill", "producer-0", lambda: self._kill_restart(by_name["producer-0"], 3)),
            (
                "consumer_sigstop",
                "orderly-partition-0",
                lambda: self._pause(by_name["orderly-partition-0"], 9),
            ),
            ("broker_sigkill", "broker-2", lambda: self._kill_broker(2, 10)),
            (
                "coordinator_sigkill",
                t.coordinators[1].name,
                lambda: self._kill_restart(t.coordinators[1], 2),
            ),
            ("clock_skew", "producer-2", lambda: self._skew(by_name["producer-2"], "+20s")),
            (
                "coordinator_sigstop",
                t.coordinators[0].name,
                lambda: self._pause(t.coordinators[0], 10),
            ),
        ]
        # The steps themselves take about 40 s (downs and pauses): the gaps share the rest,
        # so every step runs in a short load too.
        gap = max(5.0, (until_mono - time.monotonic() - 40.0) / (len(steps) + 1))
        for fault, target, step in steps:
            if time.monotonic() + gap >= until_mono:
                break
            time.sleep(gap / 2)
            start = wall_ms()
            step()
            self.recorder.emit(ev.fault(fault, target, start, end_ms=wall_ms(), seed=self.seed))
            time.sleep(gap / 2)
        super().run(until_mono)

    def _kill_restart(self, proc: Any, down_s: float) -> None:
        proc.kill()
        time.sleep(down_s)
        proc.restart()

    def _pause(self, proc: Any, pause_s: float) -> None:
        proc.signal(signal.SIGSTOP)
        time.sleep(pause_s)
        proc.signal(signal.SIGCONT)

    def _kill_broker(self, node_id: int, down_s: float) -> None:
        assert self.targets.cluster is not None
        self.targets.cluster.stop(node_id, kill=True)
        time.sleep(down_s)
        self.targets.cluster.start_node(node_id)

    def _skew(self, proc: Any, offset: str) -> None:
        proc.kill()
        proc.restart(
            env={
                "LD_PRELOAD": FAKETIME_LIB,
                "FAKETIME": offset,
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        )


def real_nemesis() -> type | None:
    """tests.campaign.nemesis.Nemesis once it lands (None until then; an error in it is
    raised, not taken for its absence)."""
    if importlib.util.find_spec("tests.campaign.nemesis") is None:
        return None
    return getattr(importlib.import_module("tests.campaign.nemesis"), "Nemesis", None)


def pick_nemesis(
    calm: bool, stub_faults: bool, minimums: Mapping[str, int] | None
) -> tuple[type, dict[str, int]]:
    """The nemesis class and the minimums of what its faults must cause (``minimums``
    given: those)."""
    if calm:
        chosen, least = Calm, {}
    elif stub_faults:
        chosen, least = SmokeNemesis, dict(SMOKE_MINIMUMS)
    else:
        real = real_nemesis()
        chosen, least = (
            (Calm, {}) if real is None else (real, dict(getattr(real, "MINIMUMS", FAULT_MINIMUMS)))
        )
    return chosen, dict(minimums) if minimums is not None else least
