"""The fuzzer through a real coordinator: ``python -m coordinator`` on a broker, bad records
written straight to its system topics among good transactions and lock calls.

Invariants checked (:meth:`Report.violations`): the coordinator never exits (and stops with
code 0 on SIGTERM, without a traceback in its log); every good COMMIT (inline or answered
on its back-check) is promoted exactly once and no ROLLBACK is; every good lock call is
granted and released; no half record that must never be promoted is; no stale lock
request is held; every record of a counted category moved a bad-input counter.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import confluent_kafka
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from rmq_semantics import LocalTransactionState, Message, TransactionListener
from rmq_semantics.embedded import free_port
from rmq_semantics.errors import RmqError
from rmq_semantics.lock_client import LockClient
from rmq_semantics.records.headers import H
from rmq_semantics.tools.coordinator_process import CoordinatorProcess
from rmq_semantics.topics import ensure_topics
from rmq_semantics.transaction import TransactionProducer
from tests.fuzz.categories import (
    KNOWN_BAD,
    Case,
    Category,
    bad_input,
    owed_by_topic,
    uncounted,
)
from tests.fuzz.generators import Ctx, Raw, pick

REPO = Path(__file__).resolve().parents[2]
# The tests' coordinator settings (tests/integration/txn_helpers.FAST): checks within seconds.
FAST = {
    "transaction_timeout_ms": 1500,
    "check_interval_ms": 2500,
    "check_max": 3,
    "half_partitions": 4,
    "check_partitions": 2,
}
CHUNK = 50  # bad cases written between two batches of good transactions
HTTP_TIMEOUT_S = 5.0
START_TIMEOUT_S = 120.0
# After the last record: every good transaction promoted (checks take ~2 s), and the bad
# half records checked check_max times and discarded (~10 s).
SETTLE_TIMEOUT_S = 60.0
QUIET_S = 3.0  # reading on this long after the last promotion shows a duplicate
LOCK_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0


@dataclass
class Report:
    seed: int
    prefix: str
    log_path: Path
    sent: Counter = field(default_factory=Counter)  # category -> records
    owed: Counter = field(default_factory=Counter)  # topic -> records of counted categories
    good: dict[str, str] = field(default_factory=dict)  # txn id -> COMMIT | ROLLBACK | UNKNOWN
    promoted: Counter = field(default_factory=Counter)  # good txn id -> times
    counts: dict[str, float] = field(default_factory=dict)  # bad-input counters (delta)
    uncounted: list[str] = field(default_factory=list)
    exited: int | None = None  # exit code if the coordinator exited during the run
    stop_code: int | None = None
    log_problems: list[str] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)
    lock_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def violations(self) -> list[str]:
        out = []
        if self.exited is not None:
            out.append(f"the coordinator exited with code {self.exited} during the run")
        elif self.stop_code not in (0, None):
            out.append(f"the coordinator stopped with code {self.stop_code} on SIGTERM")
        out += [f"log: {line}" for line in self.log_problems[:5]]
        want = {t: 0 if s == "ROLLBACK" else 1 for t, s in self.good.items()}
        wrong = {t: self.promoted[t] for t in want if self.promoted[t] != want[t]}
        if wrong:
            lost = sum(1 for t, n in wrong.items() if n < want[t])
            out.append(
                f"{len(wrong)} good transactions not promoted exactly once "
                f"({lost} lost or short, {len(wrong) - lost} extra), e.g. "
                f"{[(t, self.good[t], n) for t, n in list(wrong.items())[:3]]}"
            )
        out += self.forbidden[:5] + self.lock_failures[:5]
        out += self.uncounted
        return out

    def text(self) -> str:
        lines = [
            f"fuzz run: seed {self.seed}, prefix {self.prefix}, {sum(self.sent.values())} "
            f"bad records, {len(self.good)} good transactions, {self.seconds:.0f} s; "
            f"coordinator log {self.log_path}",
            "bad records sent, per category:",
        ]
        for name, n in sorted(self.sent.items()):
            flag = f"   [known bad: {KNOWN_BAD[name]}]" if name in KNOWN_BAD else ""
            lines.append(f"  {name:32} {n:6}{flag}")
        owed = ", ".join(f"{t} {n}" for t, n in sorted(self.owed.items())) or "none"
        lines.append(f"counted by the coordinator, per reason (owed a count: {owed}):")
        lines += [f"  {k:60} {v:8.0f}" for k, v in sorted(self.counts.items())]
        problems = self.violations()
        lines.append("violations:" if problems else "violations: none")
        lines += [f"  - {p}" for p in problems]
        return "\n".join(lines)


class _Listener(TransactionListener):
    """Decides by the message value; any message it does not know is UNKNOW."""

    def execute_local_transaction(self, msg, arg):
        return _STATE.get((msg.value or b"").split(b":")[0], LocalTransactionState.UNKNOW)

    def check_local_transaction(self, msg):
        kind = (msg.value or b"").split(b":")[0]
        if kind == b"good-unknown":
            return LocalTransactionState.COMMIT_MESSAGE
        return _STATE.get(kind, LocalTransactionState.UNKNOW)


_STATE = {
    b"good-commit": LocalTransactionState.COMMIT_MESSAGE,
    b"good-rollback": LocalTransactionState.ROLLBACK_MESSAGE,
}
_KINDS = {b"good-commit": "COMMIT", b"good-rollback": "ROLLBACK", b"good-unknown": "UNKNOWN"}


def _counters(port: int) -> dict[str, float] | None:
    """``name{label=value}`` -> value of every counter the coordinator serves; None if down."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=HTTP_TIMEOUT_S
        ) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if family.type == "counter" and s.name.endswith("_total"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _health(port: int) -> dict:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/healthz", timeout=HTTP_TIMEOUT_S
        ) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return {}


def _read_all(conf: dict, topic: str, timeout_s: float = READ_TIMEOUT_S) -> list:
    """Every read_committed record of ``topic`` up to its end as of now ([] if missing)."""
    consumer = confluent_kafka.Consumer(
        {
            **conf,
            "group.id": f"fuzz-reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        ends = {}
        for p in meta.partitions:
            _, ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        records: list = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            positions = consumer.position([TopicPartition(topic, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions):
                break
            records += [m for m in consumer.consume(1000, 0.2) if m.error() is None]
        return records
    finally:
        consumer.close()


def _txn(msg) -> str | None:
    for k, v in msg.headers() or []:
        if k == H.TXN_ID and v is not None:
            return v.decode(errors="replace")
    return None


def _promoted(msg) -> bool:
    return any(k == H.PROMOTED_FROM for k, _ in msg.headers() or [])


class FuzzRun:
    """One run: a coordinator, a good producer and lock client, and a writer of bad records."""

    def __init__(
        self,
        bootstrap: str,
        conf: dict,
        categories: list[Category],
        records: int,
        seed: int,
        log_dir: Path,
    ) -> None:
        self.conf, self.categories, self.records = conf, categories, records
        self.rng = random.Random(seed)
        self.prefix = f"fuzz{uuid.uuid4().hex[:10]}"
        self.topic = f"{self.prefix}-orders"
        self.port = free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.report = Report(seed, self.prefix, log_dir / f"{self.prefix}-coordinator.log")
        self.coordinator = CoordinatorProcess(
            bootstrap,
            self.report.log_path,
            "--metrics-port",
            str(self.port),
            settings={**FAST, "topic_prefix": self.prefix, "instance_id": self.prefix},
            env={"PYTHONPATH": str(REPO)},
        )
        self.ctx = Ctx(
            prefix=self.prefix,
            partitions=FAST["half_partitions"],
            group=f"{self.prefix}-pg",
            real_topic=f"{self.prefix}-sink",
            missing_topic=f"{self.prefix}-missing",
            lock_group=f"{self.prefix}-lg",
        )
        self.cases: list[Case] = []
        self.baseline: dict[str, float] = {}
        self.latest: dict[str, float] = {}

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> Report:
        started = time.monotonic()
        ensure_topics(self.conf, {self.topic: (2, {}), self.ctx.real_topic: (1, {})})
        self.coordinator.start()
        try:
            self.coordinator.wait_ready(START_TIMEOUT_S)
            self._wait_owned()
            self.baseline = _counters(self.port) or {}
            with TransactionProducer(
                self.conf,
                producer_group=self.ctx.group,
                listener=_Listener(),
                topic_prefix=self.prefix,
                half_partitions=FAST["half_partitions"],
                check_partitions=FAST["check_partitions"],
            ) as producer:
                locks = LockClient(self.conf, topic_prefix=self.prefix)
                try:
                    self._write(producer, locks)
                    self._settle()
                finally:
                    locks.close()
        finally:
            self.latest = _counters(self.port) or self.latest
            self.report.exited = self.coordinator.poll()
            self.report.stop_code = self.coordinator.stop()
        self._inspect()
        self.report.seconds = time.monotonic() - started
        return self.report

    def _alive(self) -> bool:
        if self.coordinator.poll() is not None:
            return False
        self.latest = _counters(self.port) or self.latest
        return True

    def _wait_owned(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        want = list(range(FAST["half_partitions"]))
        while time.monotonic() < deadline and self.coordinator.poll() is None:
            status = _health(self.port)
            if status.get("owned_partitions") == want and (
                status.get("owned_lock_partitions") == want
            ):
                return
            time.sleep(0.2)
        raise RmqError(f"the coordinator did not take every partition; see {self.report.log_path}")

    def _write(self, producer: TransactionProducer, locks: LockClient) -> None:
        raw = confluent_kafka.Producer({**self.conf, "linger.ms": 5})
        goods_per_chunk = max(2, CHUNK // 5)
        written = 0
        try:
            while written < self.records and self._alive():
                targets = self._send_good(producer, goods_per_chunk)
                ctx = replace(self.ctx, targets=targets, now_ms=int(time.time() * 1000))
                n = min(CHUNK, self.records - written)
                batch = [pick(self.rng, self.categories).make(self.rng, ctx) for _ in range(n)]
                self._write_cases(raw, batch)
                written += sum(len(c.records) for c in batch)
                self._lock_round(locks, len(self.cases))
        finally:
            raw.flush(30)

    def _send_good(self, producer: TransactionProducer, n: int) -> tuple:
        kinds = [
            pick(self.rng, [b"good-commit", b"good-commit", b"good-rollback", b"good-unknown"])
            for _ in range(n)
        ]
        msgs = [Message(self.topic, kind + b":" + uuid.uuid4().hex.encode()) for kind in kinds]
        results = producer.send_messages_in_transaction(msgs)
        targets = []
        for kind, result in zip(kinds, results, strict=True):
            self.report.good[result.transaction_id] = _KINDS[kind]
            if kind == b"good-unknown" and result.half_offset >= 0:
                targets.append((result.half_partition, result.half_offset, result.transaction_id))
        producer.flush(30)
        return tuple(targets)

    def _write_cases(self, raw: confluent_kafka.Producer, batch: list[Case]) -> None:
        landed: dict[int, tuple[int, int]] = {}

        def delivered(i: int):
            def on_delivery(err, msg) -> None:
                if err is None:
                    landed[i] = (msg.partition(), msg.offset())

            return on_delivery

        for i, case in enumerate(batch):
            self.cases.append(case)
            self.report.sent[case.category] += len(case.records)
            for j, record in enumerate(case.records):
                self._produce(raw, case.topic, record, delivered(i) if j == 0 else None)
        raw.flush(30)
        for i, case in enumerate(batch):
            if case.then is not None and i in landed:
                for topic, record in case.then(*landed[i]):
                    self._produce(raw, topic, record)
        raw.poll(0)

    def _produce(
        self, raw: confluent_kafka.Producer, topic: str, record: Raw, on_delivery=None
    ) -> None:
        kwargs = {"key": record.key, "headers": record.headers, "on_delivery": on_delivery}
        if record.partition is not None:
            kwargs["partition"] = record.partition
        for _ in range(100):
            try:
                raw.produce(f"{self.prefix}_{topic}", record.value, **kwargs)
                return
            except BufferError:
                raw.poll(0.1)

    def _lock_round(self, locks: LockClient, i: int) -> None:
        """A lock and an unlock of a queue of the good group: granted and released."""
        tp = (self.topic, i % 8)
        try:
            granted = locks.lock(self.ctx.lock_group, [tp], 30_000, timeout=LOCK_TIMEOUT_S)
            if not granted[tp].granted:
                self.report.lock_failures.append(f"lock of {tp} not granted: {granted[tp]}")
                return
            released = locks.unlock(self.ctx.lock_group, [tp], timeout=LOCK_TIMEOUT_S)
            if not released[tp]:
                self.report.lock_failures.append(f"unlock of {tp} not released")
        except RmqError as exc:
            self.report.lock_failures.append(f"lock call failed: {exc}")

    def _settle(self) -> None:
        """Read promotions until every good COMMIT is there (or the coordinator is gone, or
        time is up), a little more for duplicates, then wait for the counts."""
        want = {t for t, s in self.report.good.items() if s != "ROLLBACK"}
        consumer = confluent_kafka.Consumer(
            {
                **self.conf,
                "group.id": f"fuzz-{self.prefix}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(2)])
        promoted = self.report.promoted
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        quiet_until = None
        try:
            while time.monotonic() < deadline:
                msgs = [m for m in consumer.consume(1000, 0.2) if m.error() is None]
                promoted.update(_txn(m) for m in msgs)
                if msgs:
                    quiet_until = None
                if not self._alive():
                    break
                if want <= set(promoted):
                    quiet_until = quiet_until or time.monotonic() + QUIET_S
                    if time.monotonic() >= quiet_until:
                        break
        finally:
            consumer.close()
        while (
            time.monotonic() < deadline
            and self._alive()
            and uncounted(self._delta(), self.prefix, self.cases)
        ):
            time.sleep(0.5)

    def _delta(self) -> dict[str, float]:
        return {k: v - self.baseline.get(k, 0.0) for k, v in self.latest.items()}

    # -- after the run -------------------------------------------------------------------------
    def _inspect(self) -> None:
        report = self.report
        report.counts = bad_input(self._delta())
        report.owed = owed_by_topic(self.cases)
        report.uncounted = uncounted(self._delta(), self.prefix, self.cases)
        log = self.coordinator.log
        report.log_problems = [
            line
            for line in log.splitlines()
            if "Traceback" in line
            or "coordinator stopped:" in line
            or line.startswith(("TypeError", "ValueError", "OverflowError"))
        ]
        forbidden = {c.txn_id: c.category for c in self.cases if c.never_promoted}
        for topic in (self.ctx.real_topic, *self.ctx.system_topics()):
            for msg in _read_all(self.conf, topic):
                txn = _txn(msg)
                if txn in forbidden and _promoted(msg):
                    report.forbidden.append(
                        f"{forbidden[txn]} txn {txn} promoted to {msg.topic()}[{msg.partition()}]"
                    )
        topics = AdminClient(self.conf).list_topics(timeout=10).topics
        if self.ctx.missing_topic in topics:
            report.forbidden.append(f"{self.ctx.missing_topic} was created (by a promotion)")


def run(
    bootstrap: str,
    *,
    records: int,
    categories: list[Category],
    seed: int | None = None,
    conf: dict | None = None,
    log_dir: Path | None = None,
) -> Report:
    """One fuzz run through a real coordinator on ``bootstrap``."""
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "rmq-fuzz"
    return FuzzRun(
        bootstrap, conf or {"bootstrap.servers": bootstrap}, categories, records, seed, log_dir
    ).run()
