"""What the runner observes of the cluster for "the faults took effect", as history events.

- ``Watcher``: a thread polling every second: partition leaders of the run's topics by
  AdminClient (a leader that moved to another broker = ``leader_change``), and whether each
  producer group is up (its process alive and not stopped: ``group_state``, which pauses
  the liveness horizon);
- ``lock_history``: the lock service's own record, the ``<prefix>_lock`` topic (one entry
  per grant, renewal and release, written in the service's Kafka transactions), as
  ``lock_grant``/``lock_release`` events, and a grant to a new holder as ``lock_takeover``;
- ``log_drafts``: the processes' log lines since the load began that show a
  rebalance (half/op partitions assigned) or a fenced producer.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.kafka_cluster import EmbeddedCluster
from rmq_semantics.records.codec import decode_lock_state
from rmq_semantics.records.locks import LockEntry, LockState
from tests.campaign import events as ev
from tests.campaign.history import Draft, Kind, Recorder
from tests.campaign.processes import WorkerProcess

log = logging.getLogger("campaign.observe")

POLL_S = 1.0
ADMIN_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
# Log lines of a coordinator that count as a rebalance it took part in, or a fenced producer.
REBALANCE_LINE = re.compile(
    r"assigned half/op partitions|lock service \S+ assigned request "
    r"partitions"
)
FENCED_LINE = re.compile(r"fenced|FENCED")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def stopped(pid: int | None) -> bool:
    """Whether the process is stopped (SIGSTOP): state T in /proc/<pid>/stat."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")


class LeaderTracker:
    """Leader changes per partition: a move from one known leader to another (a partition
    without a leader for a while, then back on the same broker, is no change)."""

    def __init__(self) -> None:
        self.leaders: dict[tuple[str, int], int] = {}

    def update(self, leaders: dict[tuple[str, int], int]) -> list[str]:
        changes = []
        for tp, leader in sorted(leaders.items()):
            if leader < 0:
                continue
            before = self.leaders.get(tp)
            if before is not None and before != leader:
                changes.append(f"{tp[0]}[{tp[1]}] {before}->{leader}")
            self.leaders[tp] = leader
        return changes


class Watcher(threading.Thread):
    """Polls leaders and producer groups every second until ``stop()``."""

    def __init__(
        self,
        bootstrap: str,
        rec: Recorder,
        wanted: Callable[[str], bool],
        producers: Callable[[], list[tuple[str, WorkerProcess]]],
    ) -> None:
        super().__init__(name="campaign-watcher", daemon=True)
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.rec, self.wanted, self.producers = rec, wanted, producers
        self.leaders = LeaderTracker()
        self.up: dict[str, bool] = {}
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(ADMIN_TIMEOUT_S * 2)

    def run(self) -> None:
        while not self._halt.wait(POLL_S):
            self.poll_groups()
            self.poll_leaders()

    def poll_leaders(self) -> None:
        try:
            md = self.admin.list_topics(timeout=ADMIN_TIMEOUT_S)
        except KafkaException:
            return  # the cluster is down or electing: asked again in a second
        leaders = {
            (name, p): part.leader
            for name, t in md.topics.items()
            if self.wanted(name)
            for p, part in t.partitions.items()
        }
        for change in self.leaders.update(leaders):
            self.rec.emit(ev.observed(Kind.LEADER_CHANGE, detail=change))

    def poll_groups(self) -> None:
        for group, proc in self.producers():
            up = proc.alive() and not stopped(proc.pid)
            if self.up.get(group) != up:
                self.up[group] = up
                self.rec.emit(ev.group_state(group, up))


def lock_drafts(
    entries: Iterable[LockEntry], since_ms: int = 0, until_ms: int | None = None
) -> list[Draft]:
    """LockEntry records in topic order as lock_grant / lock_release events. A grant to
    another holder while the queue's last entry was still HELD by the previous one (its
    lease lapsed: no release, no handover) within ``[since_ms, until_ms)`` is also a
    lock_takeover."""
    drafts: list[Draft] = []
    last: dict[str, LockEntry] = {}
    for e in entries:
        queue = str(e.key)
        before = last.get(queue)
        last[queue] = e
        if e.state is LockState.HELD:
            drafts.append(
                ev.lock_grant(queue, e.client_id, e.epoch, e.updated_at_ms, e.expires_at_ms)
            )
            if (
                before is not None
                and before.state is LockState.HELD
                and before.client_id != e.client_id
                and since_ms <= e.updated_at_ms
                and (until_ms is None or e.updated_at_ms < until_ms)
            ):
                drafts.append(
                    ev.observed(
                        Kind.LOCK_TAKEOVER,
                        detail=f"{queue}: {before.client_id} -> {e.client_id} (epoch {e.epoch})",
                    )
                )
        elif e.state is LockState.RELEASED:
            drafts.append(ev.lock_release(queue, e.client_id, e.epoch, e.updated_at_ms))
    return drafts


def read_lock_topic(bootstrap: str, topic: str) -> tuple[list[LockEntry], list[str]]:
    """Every committed record of the lock topic, each partition to its end: (entries in
    order per partition, one line per record set aside)."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"campaign-lock-reader-{time.time_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    entries: list[LockEntry] = []
    skipped: list[str] = []
    try:
        md = consumer.list_topics(topic, timeout=READ_TIMEOUT_S).topics.get(topic)
        if md is None or md.error is not None:
            return [], [f"{topic}: {md.error if md else 'not found'}"]
        parts = sorted(md.partitions)
        consumer.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in parts])
        left = set(parts)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while left and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    left.discard(msg.partition())
                continue
            try:
                entries.append(decode_lock_state(msg.key(), msg.value()))
            except MalformedRecordError as exc:
                skipped.append(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {exc}")
        if left:
            skipped.append(
                f"{topic}: partitions {sorted(left)} not read to their end in "
                f"{READ_TIMEOUT_S:.0f} s"
            )
    finally:
        consumer.close()
    return entries, skipped


def log_time_ms(line: str) -> int | None:
    """The wall ms of a ``%(asctime)s`` log line (local time), None if it has none."""
    m = LOG_TIME.match(line)
    if m is None:
        return None
    when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    return int(when.timestamp() * 1000) + int(m.group(2))


def log_drafts(logs: dict[str, Path], since_ms: int, until_ms: int | None = None) -> list[Draft]:
    """Rebalance lines (coordinators) and fenced-producer lines (any process) of each log
    within ``[since_ms, until_ms)`` (the load and its aftermath, not the start or the
    harness stopping the coordinators)."""
    drafts: list[Draft] = []
    for name, path in sorted(logs.items()):
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            at = log_time_ms(line)
            if at is None or at < since_ms or (until_ms is not None and at >= until_ms):
                continue
            if REBALANCE_LINE.search(line):
                drafts.append(ev.observed(Kind.REBALANCE, detail=f"{name}: {line[24:200]}"))
            if FENCED_LINE.search(line):
                drafts.append(ev.observed(Kind.FENCED_PRODUCER, detail=f"{name}: {line[24:200]}"))
    return drafts


def wait_for_brokers(cluster: EmbeddedCluster, timeout_s: float) -> None:
    """Until the cluster's metadata shows every broker again."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if len(admin.list_topics(timeout=5).brokers) >= cluster.brokers:
                return
        except KafkaException:
            pass
        time.sleep(1)
    raise RuntimeError(
        f"the cluster did not show {cluster.brokers} brokers within {timeout_s:.0f} s after heal"
    )
