"""Key mode across processes: four consumer processes (tests/integration/orderly_worker.py
with ``--ordering key``) join, leave, are SIGKILLed, and one is SIGSTOPped past its lease,
while records of many keys stream in. Asserted from what every process wrote:

- per key, processing order is offset order (a step back only when a new lock epoch
  replays from the committed offset);
- no key is ever in two processes' listener calls at once (calls cut off by the kill, and
  the stopped process's calls across its pause, excepted: they ran under a lock it lost);
- nothing is lost: every record completed, every partition committed to its end;
- duplicates only of records that were not committed done: a record that a commit marked
  done (below the committed offset, or in its metadata) is never started again.

The default run is short; ``make test-keys`` (RMQ_TEST_KEYS_LONG=1) streams more records
through more kill/pause rounds.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import defaultdict

import pytest

from rmq_semantics import Producer
from rmq_semantics.orderly.offsets import OffsetTracker
from tests.integration.test_orderly import (
    Worker,
    committed,
    end_offsets,
    wait_for,
)
from tests.integration.test_orderly_keys import committed_metadata, lock_service_of

pytestmark = pytest.mark.integration

LONG = os.environ.get("RMQ_TEST_KEYS_LONG") == "1"
PARTITIONS = 4
KEYS = 60
WAVE = 1500 if LONG else 300  # records per wave
ROUNDS = 3 if LONG else 1  # kill/pause rounds
WORK_MS = 5.0  # each call works 0..5 ms


class Stream:
    """Records ``key:seq`` keyed by ``key`` (the default partitioner keeps a key on one
    partition), produced in waves."""

    def __init__(self, broker, topic: str) -> None:
        self.broker, self.topic = broker, topic
        self.seq: dict[str, int] = defaultdict(int)
        self.values: set[str] = set()

    def send(self, n: int) -> None:
        with Producer(self.broker.conf()) as producer:
            for i in range(n):
                key = f"k{(i * 7 + len(self.values)) % KEYS:02d}"
                value = f"{key}:{self.seq[key]}"
                self.seq[key] += 1
                self.values.add(value)
                producer.produce(self.topic, value.encode(), key=key.encode())
            assert producer.flush(30) == 0


def lines_of(all_workers: list[Worker]) -> list[dict]:
    return [x for w in all_workers for x in w.lines()]


def completed(all_workers: list[Worker]) -> set[str]:
    return {x["value"] for x in lines_of(all_workers) if x["kind"] == "end"}


def holds_a_lock(worker: Worker) -> bool:
    """Whether the last lock event of some partition in ``worker``'s lines is a grant: a
    victim of the scenario must hold a lock, or there is nothing to take over (under load a
    new member may still be waiting for a dead one's lease to lapse)."""
    last: dict[int, str] = {}
    for x in worker.lines():
        if x["kind"] == "event" and x["event"] in ("lock_granted", "lock_lost"):
            last[x["partition"]] = x["event"]
    return "lock_granted" in last.values()


def done_snapshot(broker, group: str, topic: str) -> tuple[float, dict[int, OffsetTracker]]:
    """(a time, per partition the tracker of the group's commit): what the group had
    committed as done by that time (taken after the reads, so no call after it can have
    started before the commit)."""
    trackers = {}
    for p in range(PARTITIONS):
        tp = committed_metadata(broker, group, topic, p)
        trackers[p] = OffsetTracker.restore(tp.offset, tp.metadata)
    return time.time(), trackers


def spawn(broker, tmp_path, name: str, service, group: str, topic: str) -> Worker:
    return Worker(
        broker,
        tmp_path,
        name,
        prefix=service.prefix,
        group=group,
        topic=topic,
        extra=("--ordering", "key", "--max-workers", "4", "--work-ms", str(WORK_MS)),
    )


@pytest.fixture
def locks(broker, unique):
    with lock_service_of(broker, unique) as runner:
        yield runner


@pytest.fixture
def started():
    """Worker processes of a test, stopped (SIGCONT, SIGTERM) at its end."""
    processes: list[Worker] = []
    yield processes
    for worker in processes:
        worker.stop()


def test_four_processes_joining_leaving_killed_and_paused_keep_per_key_order(
    broker, make_topic, unique, locks, started, tmp_path
):
    topic, group = make_topic("keys-procs", partitions=PARTITIONS), unique("g")
    stream = Stream(broker, topic)
    names = itertools.count(1)
    everyone: list[Worker] = []
    killed: set[str] = set()
    kill_times: dict[str, float] = {}
    pauses: list[tuple[str, float, float]] = []  # (client, stopped at, resumed at)
    snapshots: list[tuple[float, dict[int, OffsetTracker]]] = []

    def start() -> Worker:
        worker = spawn(broker, tmp_path, f"w{next(names)}", locks, group, topic)
        started.append(worker)
        everyone.append(worker)
        wait_for(
            lambda: any(x["kind"] == "ready" for x in worker.lines()),
            60,
            f"{worker.client_id} to start",
        )
        return worker

    def alive() -> list[Worker]:
        return [w for w in everyone if w.proc.poll() is None and w.client_id not in killed]

    def a_holder(what: str) -> Worker:
        return wait_for(lambda: next((w for w in alive() if holds_a_lock(w)), None), 60, what)

    def progress(count: int, what: str) -> None:
        wait_for(lambda: len(completed(everyone)) >= count, 120, what)

    for _ in range(2):
        start()
    for round_no in range(ROUNDS):
        stream.send(WAVE)
        while len(alive()) < 4:
            start()  # join while there is work
        progress(len(stream.values) - WAVE // 2, f"round {round_no}: progress with 4 members")
        stream.send(WAVE)
        victim = a_holder("a live worker holding a lock to kill")
        victim.proc.kill()  # SIGKILL, with calls in flight
        victim.proc.wait(10)
        killed.add(victim.client_id)
        kill_times[victim.client_id] = time.time()
        snapshots.append(done_snapshot(broker, group, topic))
        progress(len(stream.values) - WAVE // 2, f"round {round_no}: progress after the kill")
        paused = a_holder("a live worker holding a lock to pause")
        paused.proc.send_signal(signal.SIGSTOP)
        wait_for(paused.is_stopped, 10, "the worker to be stopped")
        stopped_at = time.time()
        snapshots.append(done_snapshot(broker, group, topic))
        stream.send(WAVE)
        # The others take its partitions over once its session and lease end.
        progress(
            len(stream.values), f"round {round_no}: everything so far, without the paused worker"
        )
        paused.proc.send_signal(signal.SIGCONT)
        pauses.append((paused.client_id, stopped_at, time.time()))
        leaving = alive()[-1]
        leaving.stop()  # SIGTERM: a clean leave
    stream.send(WAVE)
    start()
    progress(len(stream.values), "every record")
    ends = end_offsets(broker, topic, PARTITIONS)
    wait_for(
        lambda: committed(broker, group, topic, PARTITIONS) == ends,
        60,
        "every partition committed to its end",
    )
    snapshots.append(done_snapshot(broker, group, topic))
    for worker in everyone:
        worker.stop()

    lines = lines_of(everyone)
    assert {x["value"] for x in lines if x["kind"] == "end"} == stream.values  # nothing lost
    # The scenario happened: a killed and a paused worker's partitions were taken over.
    grants = [x for x in lines if x["kind"] == "event" and x["event"] == "lock_granted"]
    for victim, since in [
        *((c, kill_times[c]) for c in killed),
        *((c, stopped) for c, stopped, _ in pauses),
    ]:
        held = {x["partition"] for x in grants if x["client"] == victim and x["t"] < since}
        assert any(
            x["partition"] in held and x["client"] != victim and x["t"] > since for x in grants
        ), (victim, held)

    starts = sorted((x for x in lines if x["kind"] == "start"), key=lambda x: x["t"])
    # Per key: offset order, a step back only under a new lock epoch.
    per_key: dict[str, list[dict]] = defaultdict(list)
    for x in starts:
        per_key[x["value"].split(":")[0]].append(x)
    for key, runs in per_key.items():
        for before, after in itertools.pairwise(runs):
            assert after["offset"] > before["offset"] or after["epoch"] > before["epoch"], (
                key,
                before,
                after,
            )

    # No key in two processes' calls at once.
    calls = call_intervals(lines, pauses)
    for key, intervals in calls.items():
        intervals.sort()
        for (s1, e1, c1), (s2, _e2, c2) in itertools.pairwise(intervals):
            assert c1 == c2 or e1 <= s2, (key, c1, c2, s1, e1, s2)

    # A record committed as done is never started again.
    for taken_at, trackers in snapshots:
        again = [
            x for x in starts if x["t"] > taken_at and trackers[x["partition"]].is_done(x["offset"])
        ]
        assert again == []
    # Duplicates only where a killed or paused process had started the record.
    victims = killed | {client for client, _, _ in pauses}
    by_value: dict[str, list[dict]] = defaultdict(list)
    for x in starts:
        by_value[x["value"]].append(x)
    for value, runs in by_value.items():
        if len(runs) > 1:
            assert any(r["client"] in victims for r in runs[:-1]), (value, runs)


def call_intervals(
    lines: list[dict], pauses: list[tuple[str, float, float]]
) -> dict[str, list[tuple]]:
    """Per key, (start, end, client) of each completed call (a killed process's last
    calls never ended), except calls of a paused process that spanned its pause (it lost
    the lock meanwhile)."""
    open_calls: dict[tuple, list[float]] = defaultdict(list)
    out: dict[str, list[tuple]] = defaultdict(list)
    for x in sorted(lines, key=lambda x: x["t"]):
        if x["kind"] not in ("start", "end"):
            continue
        where = (x["client"], x["partition"], x["offset"])
        if x["kind"] == "start":
            open_calls[where].append(x["t"])
            continue
        started = open_calls[where].pop(0)
        if any(
            client == x["client"] and started < resumed and x["t"] > stopped
            for client, stopped, resumed in pauses
        ):
            continue
        out[x["value"].split(":")[0]].append((started, x["t"], x["client"]))
    return out
