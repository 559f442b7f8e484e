"""Ordered consumption with queue locks on a real broker: key order and exclusive partitions
across rebalances, takeover after SIGKILL only once the lease ended, no work by a consumer
paused (SIGSTOP) past its lease, suspend/DLQ, a lock-service restart, and the consumer's
security settings (oauth_cb, TLS verification) reaching its lock client and DLQ producer."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, TopicPartition

from coordinator.lock_service import LockService
from coordinator.settings import CoordinatorSettings
from rmq_semantics import Producer
from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.lock_client import LockClient
from rmq_semantics.orderly import (
    DLQ_ORIGINAL_OFFSET,
    DLQ_ORIGINAL_PARTITION,
    DLQ_ORIGINAL_TOPIC,
    DLQ_RECONSUME_TIMES,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
    OrderlyConsumer,
)
from rmq_semantics.records.codec import decode_lock_state
from rmq_semantics.topics import SystemTopics, ensure_topics
from tests.group_protocol import group_conf

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# The broker-default minimum session timeout, so the tests run against any cluster.
SESSION_TIMEOUT_MS = 6000
LEASE_MS, RENEW_MS = 3000, 1000
SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    """Poll ``condition`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


# -- the lock service ------------------------------------------------------------------------
class LockServiceRunner:
    """A LockService in a background thread, restartable (a new instance each time)."""

    def __init__(self, conf: dict, settings: CoordinatorSettings) -> None:
        self.conf = conf
        self.settings = settings
        self.prefix = settings.topic_prefix
        self.service: LockService | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LockService:
        self._stop = threading.Event()
        self.service = LockService(self.conf, self.settings)
        self._thread = threading.Thread(
            target=self.service.run, args=(self._stop,), name="test-lock-service", daemon=True
        )
        self._thread.start()
        service = self.service
        wait_for(
            lambda: len(service.owned_partitions()) == self.settings.half_partitions,
            60,
            "the lock service to own every request partition",
        )
        return service

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        if self.service is not None:
            self.service.close()

    def restart(self) -> LockService:
        self.stop()
        return self.start()


@pytest.fixture
def lock_service(broker, unique):
    runners: list[LockServiceRunner] = []

    def start(lease_ms: int = LEASE_MS, renew_ms: int = RENEW_MS) -> LockServiceRunner:
        prefix = unique("rmqo").replace("-", "")
        runner = LockServiceRunner(
            broker.conf(),
            CoordinatorSettings(
                topic_prefix=prefix,
                lock_lease_ms=lease_ms,
                lock_renew_ms=renew_ms,
                half_partitions=2,
            ),
        )
        runners.append(runner)
        runner.start()
        return runner

    yield start
    for runner in runners:
        runner.stop()


# -- recording what listeners did -----------------------------------------------------------
@dataclass(frozen=True)
class Row:
    consumer: str
    partition: int
    offset: int
    value: str
    epoch: int
    reconsume: int
    start: float  # time.monotonic()
    end: float
    wall: float  # time.time() at start


class Journal:
    """Every listener call of in-process consumers, in one thread-safe list."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[Row] = []

    def listener(
        self,
        name: str,
        work_s: float = 0.0,
        decide: Callable[[Row], ConsumeOrderlyStatus] | None = None,
    ):
        def listen(msgs, context):
            wall, start = time.time(), time.monotonic()
            if work_s:
                time.sleep(work_s)  # simulated work, so calls have a duration
            end = time.monotonic()
            rows = [
                Row(
                    name,
                    m.partition,
                    m.offset,
                    (m.value or b"").decode(),
                    context.lock_epoch,
                    m.reconsume_times,
                    start,
                    end,
                    wall,
                )
                for m in msgs
            ]
            with self._lock:
                self.rows.extend(rows)
            return decide(rows[0]) if decide else SUCCESS

        return listen

    def snapshot(self) -> list[Row]:
        with self._lock:
            return list(self.rows)

    def by_partition(self) -> dict[int, list[Row]]:
        out: dict[int, list[Row]] = defaultdict(list)
        for row in sorted(self.snapshot(), key=lambda r: (r.start, r.offset)):
            out[row.partition].append(row)
        return out


def orderly_conf(broker, group: str) -> dict:
    return group_conf(
        broker.conf(
            **{
                "group.id": group,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 500,
            }
        )
    )


def start_consumer(
    broker,
    group: str,
    topic: str,
    prefix: str,
    listener,
    name: str,
    lease_ms: int = LEASE_MS,
    renew_ms: int = RENEW_MS,
    **kwargs,
) -> OrderlyConsumer:
    consumer = OrderlyConsumer(
        orderly_conf(broker, group),
        listener=listener,
        lock_lease_ms=lease_ms,
        lock_renew_ms=renew_ms,
        topic_prefix=prefix,
        client_id=f"{name}-{uuid.uuid4().hex[:6]}",
        **kwargs,
    )
    consumer.subscribe([topic])
    consumer.start()
    return consumer


def locked(*consumers: OrderlyConsumer) -> dict[int, tuple[str, int]]:
    """partition -> (client id, epoch) of every queue some consumer holds right now."""
    out = {}
    for consumer in consumers:
        for (_, partition), st in consumer.status().items():
            if st.locked:
                out[partition] = (consumer.client_id, st.epoch)
    return out


def assert_in_order(seen: list[tuple[int, int]], count: int, what: str) -> None:
    """``seen`` = (sequence number, lock epoch) in processing order. Ordered processing:
    consecutive under one lock epoch; a step back only when a new holder (epoch) replays
    from the committed offset; nothing skipped; everything up to ``count - 1`` done."""
    assert seen and seen[0][0] == 0, (what, seen)
    for (before, epoch_before), (after, epoch) in itertools.pairwise(seen):
        assert after == before + 1 or (after <= before and epoch > epoch_before), (
            what,
            before,
            after,
            seen,
        )
    assert max(n for n, _ in seen) == count - 1, (what, seen)


def assert_keys_in_order_and_partitions_exclusive(
    journal: Journal, keys: list[str], count: int
) -> dict[int, list[Row]]:
    """Over every listener call of ``"key:seq"`` values: each key's ``count`` messages in
    order (:func:`assert_in_order`), no partition processed by two consumers at once, and
    each lock epoch held by one consumer. Returns the rows by partition."""
    rows = journal.by_partition()
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for partition_rows in rows.values():
        for row in partition_rows:
            key, seq = row.value.split(":")
            per_key[key].append((int(seq), row.epoch))
    for key in keys:
        assert_in_order(per_key[key], count, key)
    for partition, partition_rows in rows.items():
        for before, after in itertools.pairwise(partition_rows):
            assert before.end <= after.start, (
                f"partition {partition} processed by {before.consumer} and {after.consumer} "
                "at the same time"
            )
        owners = defaultdict(set)
        for row in partition_rows:
            owners[row.epoch].add(row.consumer)
        assert all(len(names) == 1 for names in owners.values()), owners
    return rows


# -- Kafka helpers ---------------------------------------------------------------------------
def committed(broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = confluent_kafka.Consumer(broker.conf(**{"group.id": group}))
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def end_offsets(broker, topic: str, partitions: int) -> dict[int, int]:
    consumer = confluent_kafka.Consumer(broker.conf(**{"group.id": "end-offsets"}))
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def read_all(broker, topic: str, partitions: int) -> list[confluent_kafka.Message]:
    """Every committed record of ``topic`` (read_committed, to the end)."""
    consumer = confluent_kafka.Consumer(
        broker.conf(
            **{
                "group.id": "reader",
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
    )
    out, eof = [], set()
    try:
        consumer.assign(
            [TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)]
        )
        deadline = time.monotonic() + 30
        while len(eof) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                eof.add(msg.partition())
                continue
            out.append(msg)
    finally:
        consumer.close()
    assert len(eof) == partitions, f"did not reach the end of {topic}"
    return out


def produce(broker, topic: str, records: list[tuple[bytes | None, bytes, int | None]]) -> None:
    """(key, value, partition or None) in order; waits for every acknowledgement."""
    with Producer(broker.conf()) as producer:
        for key, value, partition in records:
            kwargs = {"key": key} if partition is None else {"key": key, "partition": partition}
            producer.produce(topic, value, **kwargs)
        assert producer.flush(30) == 0


# -- a consumer in a subprocess --------------------------------------------------------------
class Worker:
    """tests/integration/orderly_worker.py in a subprocess, and what it wrote."""

    def __init__(
        self,
        broker,
        tmp_path: Path,
        name: str,
        *,
        prefix: str,
        group: str,
        topic: str,
        lease_ms: int = LEASE_MS,
        renew_ms: int = RENEW_MS,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.client_id = f"{name}-{uuid.uuid4().hex[:6]}"
        self.path = tmp_path / f"{name}.jsonl"
        self.path.touch()
        self._stderr = open(tmp_path / f"{name}.stderr", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.orderly_worker",
                "--bootstrap-servers",
                broker.bootstrap,
                "--topic-prefix",
                prefix,
                "--group",
                group,
                "--topic",
                topic,
                "--result",
                str(self.path),
                "--client-id",
                self.client_id,
                "--lock-lease-ms",
                str(lease_ms),
                "--lock-renew-ms",
                str(renew_ms),
                "--session-timeout-ms",
                str(SESSION_TIMEOUT_MS),
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )

    def lines(self) -> list[dict]:
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written right now
                break
        return out

    def events(self, name: str, lines: list[dict] | None = None) -> list[dict]:
        return [
            x
            for x in (lines if lines is not None else self.lines())
            if x["kind"] == "event" and x["event"] == name
        ]

    def is_stopped(self) -> bool:
        """The process is in state T (stopped by a signal)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()


@pytest.fixture
def workers():
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


# -- (a) order and exclusivity across rebalances --------------------------------------------
def test_three_consumers_keep_key_order_and_never_process_a_partition_together(
    broker, make_topic, unique, lock_service
):
    service = lock_service()
    topic, group = make_topic("orderly", partitions=6), unique("g")
    keys = [f"key-{i:02d}" for i in range(30)]
    journal = Journal()

    def send(seqs: range) -> None:
        produce(
            broker, topic, [(k.encode(), f"{k}:{s}".encode(), None) for s in seqs for k in keys]
        )

    def processed() -> int:
        return len({r.value for r in journal.snapshot()})

    consumers: dict[str, OrderlyConsumer] = {}

    def join(name: str) -> None:
        consumers[name] = start_consumer(
            broker, group, topic, service.prefix, journal.listener(name, work_s=0.003), name
        )

    try:
        join("c1")
        send(range(0, 5))
        wait_for(lambda: processed() >= 60, 60, "c1 to get going")
        join("c2")  # rebalance while c1 has a backlog
        send(range(5, 10))
        wait_for(lambda: processed() >= 200, 60, "progress after c2 joined")
        join("c3")
        send(range(10, 15))
        wait_for(lambda: processed() >= 330, 60, "progress after c3 joined")
        consumers.pop("c1").shutdown()  # leaves: its partitions move, in-flight work commits
        send(range(15, 20))
        wait_for(lambda: processed() >= 600, 90, "all 600 messages")
    finally:
        for consumer in consumers.values():
            consumer.shutdown()

    rows = assert_keys_in_order_and_partitions_exclusive(journal, keys, 20)
    for partition_rows in rows.values():  # and epochs only grow
        epochs = [r.epoch for r in partition_rows]
        assert epochs == sorted(epochs)
    assert {r.consumer for r in journal.snapshot()} == {"c1", "c2", "c3"}


# -- (b) SIGKILL: takeover only after the lease, from the committed offset ----------------
def test_killed_consumers_partitions_are_taken_over_after_its_lease_at_the_committed_offset(
    broker, make_topic, unique, lock_service, workers, tmp_path
):
    # A lease well past the session timeout: the group hands the victim's partitions over
    # while its lease is still live, so the survivor is denied until the lease ends.
    lease_ms, renew_ms = 12000, 3000
    service = lock_service(lease_ms, renew_ms)
    topic, group = make_topic("kill", partitions=4), unique("g")
    victim = Worker(
        broker,
        tmp_path,
        "victim",
        prefix=service.prefix,
        group=group,
        topic=topic,
        lease_ms=lease_ms,
        renew_ms=renew_ms,
    )
    workers.append(victim)
    wait_for(
        lambda: {e["partition"] for e in victim.events("lock_granted")} == {0, 1, 2, 3},
        60,
        "the victim to lock all partitions",
    )
    journal = Journal()
    survivor = start_consumer(
        broker,
        group,
        topic,
        service.prefix,
        journal.listener("survivor"),
        "survivor",
        lease_ms=lease_ms,
        renew_ms=renew_ms,
    )
    try:
        mine = wait_for(
            lambda: set(locked(survivor)) if len(locked(survivor)) == 2 else None,
            60,
            "the survivor to hold two partitions",
        )
        victims = sorted({0, 1, 2, 3} - mine)
        records = [(None, f"n-{p}-{i}".encode(), p) for p in range(4) for i in range(5)]
        for p in victims:
            records += [(None, f"slow-{p}".encode(), p)]
            records += [(None, f"after-{p}-{i}".encode(), p) for i in range(5)]
        produce(broker, topic, records)
        wait_for(
            lambda: any(
                x["kind"] == "start" and x["value"].startswith("slow") for x in victim.lines()
            ),
            60,
            "the victim to start a slow message",
        )
        victim.proc.kill()  # SIGKILL, mid-listener
        victim.proc.wait(10)
        at_kill = committed(broker, group, topic, 4)
        ends = end_offsets(broker, topic, 4)
        wait_for(
            lambda: all(
                any(r.offset == ends[p] - 1 for r in journal.by_partition()[p]) for p in victims
            ),
            90,
            "the survivor to finish the victim's queues",
        )
    finally:
        survivor.shutdown()

    assert service.service.counts["held_by_other"] > 0  # the survivor had to wait
    victim_lines = victim.lines()
    states = [
        (m.partition(), decode_lock_state(m.key(), m.value()))
        for m in read_all(broker, SystemTopics(service.prefix).lock, 2)
    ]
    for p in victims:
        rows = [r for r in journal.by_partition()[p] if r.consumer == "survivor"]
        start = max(at_kill[p], 0)
        # Resumes exactly at the committed offset, in order, to the end.
        assert [r.offset for r in rows] == list(range(start, ends[p])), p
        history = [e for _, e in states if (e.key.topic, e.key.partition) == (topic, p)]
        last_victim = [e for e in history if e.client_id == victim.client_id][-1]
        first_survivor = next(e for e in history if e.client_id == survivor.client_id)
        # Granted only after the victim's lease ended, with the next epoch.
        assert first_survivor.acquired_at_ms >= last_victim.expires_at_ms
        assert first_survivor.epoch == last_victim.epoch + 1
        assert rows[0].wall * 1000 >= last_victim.expires_at_ms
        assert rows[0].epoch == first_survivor.epoch
        # The victim committed nothing the survivor had not started from.
        victim_commits = [
            e["offset"] for e in victim.events("committed", victim_lines) if e["partition"] == p
        ]
        assert max(victim_commits, default=-1) <= start


# -- (c) SIGSTOP past the lease: no processing, no commit for what it lost ------------------
def test_consumer_paused_past_its_lease_neither_processes_nor_commits_after_resuming(
    broker, make_topic, unique, lock_service, workers, tmp_path
):
    service = lock_service()
    topic, group = make_topic("pause", partitions=2), unique("g")
    paused = Worker(broker, tmp_path, "paused", prefix=service.prefix, group=group, topic=topic)
    workers.append(paused)
    produce(broker, topic, [(None, f"b1-{p}-{i}".encode(), p) for p in (0, 1) for i in range(5)])
    wait_for(
        lambda: committed(broker, group, topic, 2) == {0: 5, 1: 5},
        60,
        "the worker to process and commit batch 1",
    )
    # A slow message on partition 0 with more behind it; partition 1 stays idle.
    produce(
        broker, topic, [(None, b"slow-0", 0)] + [(None, f"b2-0-{i}".encode(), 0) for i in range(5)]
    )
    marker = wait_for(
        lambda: next(
            (x for x in paused.lines() if x["kind"] == "start" and x["value"] == "slow-0"), None
        ),
        60,
        "the worker to start the slow message",
    )
    paused.proc.send_signal(signal.SIGSTOP)
    wait_for(paused.is_stopped, 10, "the worker to be stopped")
    frozen = len(paused.lines())  # everything it wrote before the pause
    old_epoch = {
        p: max(e["epoch"] for e in paused.events("lock_granted") if e["partition"] == p)
        for p in (0, 1)
    }
    journal = Journal()
    other = start_consumer(broker, group, topic, service.prefix, journal.listener("other"), "other")
    try:
        before_batch3 = ends = end_offsets(broker, topic, 2)
        # The group evicts the paused worker (session timeout); its leases lapse; the other
        # consumer takes both partitions over and finishes them.
        wait_for(
            lambda: committed(broker, group, topic, 2) == ends,
            90,
            "the other consumer to take over and commit everything",
        )
        paused.proc.send_signal(signal.SIGCONT)
        wait_for(
            lambda: any(
                e["partition"] == 0 and e["offset"] == marker["offset"] + 1
                for e in paused.events("commit_skipped")
            ),
            60,
            "the resumed worker to refuse committing its in-flight batch",
        )
        produce(
            broker, topic, [(None, f"b3-{p}-{i}".encode(), p) for p in (0, 1) for i in range(5)]
        )
        ends = end_offsets(broker, topic, 2)
        wait_for(
            lambda: committed(broker, group, topic, 2) == ends,
            60,
            "batch 3 to be processed and committed",
        )
        paused.stop()
    finally:
        other.shutdown()

    after_resume = paused.lines()[frozen:]
    for x in after_resume:
        if x["kind"] == "start" or (x["kind"] == "event" and x["event"] == "committed"):
            # Anything it did after resuming ran under a lock granted afresh.
            assert x["epoch"] > old_epoch[x["partition"]], x
    # Until batch 3 each message was processed once, except the slow one both started:
    # the other consumer resumed exactly where the paused one had committed.
    starts = [(x["partition"], x["offset"]) for x in paused.lines() if x["kind"] == "start"]
    starts += [(r.partition, r.offset) for r in journal.snapshot()]
    counts = defaultdict(int)
    for where in starts:
        counts[where] += 1
    repeated = {w: n for w, n in counts.items() if n != 1 and w[1] < before_batch3[w[0]]}
    assert repeated == {(0, marker["offset"]): 2}
    assert sorted(counts) == [(p, o) for p in (0, 1) for o in range(ends[p])]
    assert committed(broker, group, topic, 2) == ends


# -- (d) suspend retries in order; then the DLQ ---------------------------------------------
def test_suspended_messages_retry_in_order_then_go_to_the_dlq_with_their_origin(
    broker, make_topic, unique, lock_service
):
    service = lock_service()
    topic, group = make_topic("suspend"), unique("g")
    values = ["m0", "flaky", "m2", "poison", "m4", "m5"]
    produce(broker, topic, [(f"k{i}".encode(), v.encode(), 0) for i, v in enumerate(values)])
    calls: list[tuple[str, int]] = []

    class Listener(MessageListenerOrderly):
        def consume_message(self, msgs, context):
            [m] = msgs
            context.suspend_ms = 50
            value = m.value.decode()
            calls.append((value, m.reconsume_times))
            if value == "flaky" and m.reconsume_times == 0:
                raise RuntimeError("a listener that raises counts as SUSPEND")
            if value == "flaky" and m.reconsume_times == 1:
                return SUSPEND
            return SUSPEND if value == "poison" else SUCCESS

    with OrderlyConsumer(
        orderly_conf(broker, group),
        listener=Listener(),
        max_reconsume_times=2,
        lock_lease_ms=LEASE_MS,
        lock_renew_ms=RENEW_MS,
        topic_prefix=service.prefix,
    ) as consumer:
        consumer.subscribe([topic])
        consumer.start()
        wait_for(
            lambda: committed(broker, group, topic, 1) == {0: 6},
            60,
            "every message to be consumed or dead-lettered",
        )
        status = consumer.status()[(topic, 0)]
        assert (status.committed_offset, status.lag, status.locked) == (6, 0, True)

    assert calls == [
        ("m0", 0),
        ("flaky", 0),
        ("flaky", 1),
        ("flaky", 2),
        ("m2", 0),
        ("poison", 0),
        ("poison", 1),
        ("poison", 2),
        ("m4", 0),
        ("m5", 0),
    ]
    [dead] = read_all(broker, SystemTopics(service.prefix).dlq(group), 1)
    headers = dict(dead.headers())
    assert (dead.key(), dead.value()) == (b"k3", b"poison")
    assert (
        headers[DLQ_ORIGINAL_TOPIC],
        headers[DLQ_ORIGINAL_PARTITION],
        headers[DLQ_ORIGINAL_OFFSET],
        headers[DLQ_RECONSUME_TIMES],
    ) == (topic.encode(), b"0", b"3", b"2")


# -- (e) the lock service restarts: locks survive, epochs keep growing --------------------
def test_lock_service_restart_keeps_locks_and_epochs_keep_growing(
    broker, make_topic, unique, lock_service
):
    service = lock_service()
    topic, group = make_topic("restart", partitions=4), unique("g")
    journal = Journal()
    a = start_consumer(broker, group, topic, service.prefix, journal.listener("a"), "a")
    b = start_consumer(broker, group, topic, service.prefix, journal.listener("b"), "b")
    try:
        before = wait_for(
            lambda: (
                lambda held: (
                    held if len(held) == 4 and len({c for c, _ in held.values()}) == 2 else None
                )
            )(locked(a, b)),
            60,
            "a and b to hold two partitions each",
        )
        produce(broker, topic, [(None, f"x-{i}".encode(), i % 4) for i in range(40)])
        new = service.restart()
        wait_for(
            lambda: new.counts["renewed"] >= 4,
            30,
            "the consumers to renew at the new lock-service instance",
        )
        wait_for(lambda: len(locked(a, b)) == 4, 30, "every partition locked again")
        # Same holders, same epochs: the locks survived the restart.
        assert locked(a, b) == before
        with LockClient(broker.conf(), service.prefix, "intruder") as intruder:
            grants = intruder.lock(group, [(topic, p) for p in range(4)], LEASE_MS)
        assert {p: (g.granted, g.epoch) for (_, p), g in grants.items()} == {
            p: (False, epoch) for p, (_, epoch) in before.items()
        }
        produce(broker, topic, [(None, f"y-{i}".encode(), i % 4) for i in range(40)])
        a.shutdown()  # a's partitions move to b with new grants
        after = wait_for(
            lambda: (lambda held: held if len(held) == 4 else None)(locked(b)),
            60,
            "b to hold every partition",
        )
        ends = end_offsets(broker, topic, 4)
        wait_for(lambda: committed(broker, group, topic, 4) == ends, 60, "all work committed")
    finally:
        a.shutdown()
        b.shutdown()

    for p, (holder, epoch) in before.items():
        if holder == a.client_id:
            assert after[p][1] > epoch  # released, then granted again: next epoch
        else:
            assert after[p] == (b.client_id, epoch)
    for partition, rows in journal.by_partition().items():
        assert_in_order([(r.offset, r.epoch) for r in rows], ends[partition], partition)


# -- (f) security settings reach every client the consumer creates --------------------------
class OAuthTlsKafka(EmbeddedKafka):
    """The embedded broker plus a second listener, SASL_SSL with OAUTHBEARER (Kafka's
    unsecured JWT validator) and a self-signed certificate: a client connects there only
    with ``oauth_cb`` and ``enable.ssl.certificate.verification=false``. Test helpers
    (``conf()``) use the PLAIN listener."""

    tls_port: int = 0
    keystore: Path | None = None

    @property
    def tls_bootstrap(self) -> str:
        return f"127.0.0.1:{self.tls_port}"

    def conf(self, **extra: object) -> dict:
        return {**self.client_conf(), **extra}

    def _write_properties(self, controller_port: int) -> Path:
        path = super()._write_properties(controller_port)
        props = dict(line.split("=", 1) for line in path.read_text().splitlines() if line)
        plain, tls = (
            f"SASL_PLAINTEXT://127.0.0.1:{self.port}",
            f"SASL_SSL://127.0.0.1:{self.tls_port}",
        )
        props["listeners"] = f"{plain},{tls},CONTROLLER://127.0.0.1:{controller_port}"
        props["advertised.listeners"] = f"{plain},{tls}"
        props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
        props["listener.name.sasl_ssl.sasl.enabled.mechanisms"] = "OAUTHBEARER"
        props["listener.name.sasl_ssl.oauthbearer.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
        )
        props["listener.name.sasl_ssl.ssl.keystore.type"] = "PEM"
        props["listener.name.sasl_ssl.ssl.keystore.location"] = str(self.keystore)
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path


@pytest.fixture(scope="module")
def oauth_tls_broker() -> Iterator[OAuthTlsKafka]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs openssl for the broker's self-signed certificate")
    data_dir = Path(tempfile.mkdtemp(prefix="rmq-test-oauth-kafka-"))
    key, cert = data_dir / "key.pem", data_dir / "cert.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    broker = OAuthTlsKafka(
        data_dir / "kafka", port=free_port(), sasl_users={"admin": "admin-secret"}
    )
    broker.tls_port = free_port()
    broker.keystore = data_dir / "keystore.pem"
    broker.keystore.write_text(key.read_text() + cert.read_text())
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def unsecured_jwt_cb(principal: str) -> Callable[[str], tuple[str, float, str]]:
    """An ``oauth_cb`` handing out the unsigned token Kafka's default validator accepts."""

    def part(claims: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()

    def oauth_cb(_config: str) -> tuple[str, float, str]:
        now = time.time()
        token = (
            part({"alg": "none"})
            + "."
            + part({"sub": principal, "iat": int(now), "exp": int(now) + 3600})
            + "."
        )
        return token, now + 3600, principal

    return oauth_cb


def test_lock_client_and_dlq_producer_connect_with_the_consumers_oauth_cb_and_tls_settings(
    oauth_tls_broker, unique
):
    broker = oauth_tls_broker
    prefix = unique("rmqs").replace("-", "")
    service = LockServiceRunner(
        broker.conf(),
        CoordinatorSettings(
            topic_prefix=prefix, lock_lease_ms=LEASE_MS, lock_renew_ms=RENEW_MS, half_partitions=2
        ),
    )
    topic, group = unique("secure-orderly"), unique("g")
    ensure_topics(broker.conf(), {topic: (1, {})})
    produce(broker, topic, [(b"k0", b"fine", 0), (b"k1", b"poison", 0)])
    security = {
        "bootstrap.servers": broker.tls_bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "OAUTHBEARER",
        "oauth_cb": unsecured_jwt_cb("alice"),
        "enable.ssl.certificate.verification": "false",
    }
    # The listener refuses a client that misses either setting (as the lock client and the
    # DLQ producer did when their confs were filtered by a shorter key list).
    for missing in ("oauth_cb", "enable.ssl.certificate.verification"):
        probe = confluent_kafka.Producer({k: v for k, v in security.items() if k != missing})
        with pytest.raises(confluent_kafka.KafkaException):
            probe.list_topics(timeout=3)
    seen: list[str] = []

    def listener(msgs, context):
        seen.extend(m.value.decode() for m in msgs)
        return SUSPEND if msgs[0].value == b"poison" else SUCCESS

    service.start()
    try:
        # Processing needs the queue lock (the lock client's producer and consumer); the
        # poison message needs the DLQ producer; the commits need the consumer.
        with OrderlyConsumer(
            group_conf(
                {
                    **security,
                    "group.id": group,
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": SESSION_TIMEOUT_MS,
                    "heartbeat.interval.ms": 500,
                }
            ),
            listener=listener,
            max_reconsume_times=0,
            lock_lease_ms=LEASE_MS,
            lock_renew_ms=RENEW_MS,
            topic_prefix=prefix,
        ) as consumer:
            consumer.subscribe([topic])
            consumer.start()
            wait_for(
                lambda: committed(broker, group, topic, 1) == {0: 2},
                90,
                "both messages to be consumed or dead-lettered over SASL_SSL",
            )
            assert consumer.status()[(topic, 0)].locked
    finally:
        service.stop()

    assert seen == ["fine", "poison"]
    [dead] = read_all(broker, SystemTopics(prefix).dlq(group), 1)
    assert (dead.value(), dict(dead.headers())[DLQ_ORIGINAL_OFFSET]) == (b"poison", b"1")
