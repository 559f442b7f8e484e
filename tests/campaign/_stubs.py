"""Thin local stand-ins for history.py, checkers.py and nemesis.py (built in parallel);
delete this file once those land and import them instead.

The interface the workload and the runner expect from them:

- ``Recorder(path, process)``: ``record(kind, **fields)`` appends one JSON line (thread-safe,
  flushed per line) with ``kind``, ``proc``, ``pid``, ``t`` (wall clock, skewed in a faked
  process) and ``mono`` (CLOCK_MONOTONIC: not faked, one clock for every process of the
  host, so it orders events across processes); ``close()``.
- ``read_history(paths)``: every event of those files (a torn last line is skipped).
- ``run_checkers(run) -> list[CheckResult]`` over a :class:`RunData` (see below), each
  result ``(name, passed, detail)``, one printed line each.
- ``Nemesis(seed, targets, recorder)`` (targets: ``processes.Targets``): ``run(until_mono)``
  acts until then, recording each fault as ``fault`` events (``fault``, ``target``,
  ``phase`` start/end); ``heal()`` undoes every fault in force (SIGCONT, restarts, mounts,
  rules), bounded in time. The runner then restarts and SIGCONTs whatever is still down or
  paused, and notes it (a failed run).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Recorder:
    """One process's history: JSON lines, one event each."""

    def __init__(self, path: Path | str, process: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.process = process
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def record(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, "proc": self.process, "pid": os.getpid(),
                           "t": time.time(), "mono": time.monotonic(), **fields},
                          default=str)
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_history(paths: Iterable[Path]) -> list[dict]:
    events = []
    for path in paths:
        for line in Path(path).read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a process killed mid-line
    return events


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class RunData:
    """What the checkers get: the history, the ground truth and the final reads."""

    events: list[dict]
    committed: dict[str, dict]        # message id -> its row (txn_id, topic, key, ...)
    visible: list[dict]               # final read_committed records (topic, partition, ...)
    pending: list[dict] = field(default_factory=list)
    discarded: list[dict] = field(default_factory=list)
    dead_letters: dict[str, list[dict]] = field(default_factory=dict)  # group -> DLQ records


def run_checkers(run: RunData) -> list[CheckResult]:
    """The stub's one checker: every committed row visible exactly once, nothing else."""
    seen = Counter(r["mid"] for r in run.visible if r.get("mid"))
    lost = sorted(set(run.committed) - set(seen))
    dups = sorted(m for m, n in seen.items() if n > 1)
    phantom = sorted(set(seen) - set(run.committed))
    misplaced = sorted(r["mid"] for r in run.visible if r.get("mid") in run.committed
                       and r["topic"] != run.committed[r["mid"]]["topic"])
    unreadable = [r for r in run.visible if not r.get("mid")]
    passed = not (lost or dups or phantom or misplaced or unreadable)
    detail = (f"{len(run.committed)} committed, {sum(seen.values())} visible; lost "
              f"{len(lost)} {lost[:5]}, duplicated {len(dups)} {dups[:5]}, not committed "
              f"{len(phantom)} {phantom[:5]}, wrong topic {len(misplaced)}, unreadable "
              f"{len(unreadable)}")
    results = [CheckResult("committed-visible-once", passed, detail)]
    settled = not run.pending and not run.discarded
    results.append(CheckResult("nothing-pending-or-discarded", settled,
                               f"{len(run.pending)} pending, {len(run.discarded)} discarded"))
    results += consumer_checks(run, set(seen))
    return results


def consumer_checks(run: RunData, visible: set[str]) -> list[CheckResult]:
    """Every visible record processed by every group; the push group's planned dead
    letters on its DLQ, and no other."""
    from tests.campaign.workload import push_dead_letter_expected

    processed: dict[tuple[str, str], set[str]] = {}
    for e in run.events:
        if e["kind"] == "process" and e.get("mid"):
            processed.setdefault((e["role"], e["group"]), set()).add(e["mid"])
    results = []
    for (role, group), mids in sorted(processed.items()):
        missing = sorted(visible - mids)
        results.append(CheckResult(f"{role}-processed-all", not missing,
                                   f"{group}: {len(visible) - len(missing)}/{len(visible)} "
                                   f"processed; missing {missing[:5]}"))
    for group, records in sorted(run.dead_letters.items()):
        got = Counter(r["mid"] for r in records)
        want = {m for m in visible if push_dead_letter_expected(m)}
        wrong = sorted(set(got) ^ want)
        results.append(CheckResult("push-dead-letters", not wrong,
                                   f"{group}: {len(want)} planned, {sum(got.values())} on the "
                                   f"DLQ; differing {wrong[:5]}"))
    return results


class Nemesis:
    """No faults: calm weather."""

    def __init__(self, seed: int, targets: Any, recorder: Recorder) -> None:
        self.seed, self.targets, self.recorder = seed, targets, recorder

    def run(self, until_mono: float) -> None:
        while time.monotonic() < until_mono:
            time.sleep(min(1.0, max(0.0, until_mono - time.monotonic())))

    def heal(self) -> None:
        return None


FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


class SmokeNemesis(Nemesis):
    """A fixed handful of faults, one after another, to exercise the workload and the runner
    until nemesis.py lands (``--stub-faults``): a producer SIGKILLed and restarted, an
    orderly consumer paused past its lease, a broker SIGKILLed and restarted, a coordinator
    SIGKILLed and restarted, the async producer restarted with its clock 20 s ahead
    (libfaketime), a coordinator paused past its session timeout (a zombie)."""

    def run(self, until_mono: float) -> None:
        t = self.targets
        by_name = {w.name: w for w in t.workers()}
        steps = [
            ("kill producer", lambda: self._kill_restart(by_name["producer-0"], 3)),
            ("pause consumer", lambda: self._pause(by_name["orderly-partition-0"], 9)),
            ("kill broker", lambda: self._kill_broker(2, 10)),
            ("kill coordinator", lambda: self._kill_restart(t.coordinators[1], 2)),
            ("skew producer clock", lambda: self._skew(by_name["producer-2"], "+20s")),
            ("pause coordinator", lambda: self._pause(t.coordinators[0], 10)),
        ]
        gap = max(5.0, (until_mono - time.monotonic()) / (len(steps) + 1))
        for name, step in steps:
            if time.monotonic() + gap >= until_mono:
                break
            time.sleep(gap / 2)
            self.recorder.record("fault", fault=name, phase="start")
            step()
            self.recorder.record("fault", fault=name, phase="end")
            time.sleep(gap / 2)
        super().run(until_mono)

    def _kill_restart(self, proc: Any, down_s: float) -> None:
        proc.kill()
        time.sleep(down_s)
        proc.restart()

    def _pause(self, proc: Any, pause_s: float) -> None:
        import signal

        proc.signal(signal.SIGSTOP)
        time.sleep(pause_s)
        proc.signal(signal.SIGCONT)

    def _kill_broker(self, node_id: int, down_s: float) -> None:
        self.targets.cluster.stop(node_id, kill=True)
        time.sleep(down_s)
        self.targets.cluster.start_node(node_id)

    def _skew(self, proc: Any, offset: str) -> None:
        proc.kill()
        proc.restart(env={"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": offset,
                          "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
