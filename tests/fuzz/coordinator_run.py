"""The fuzzer through a real coordinator: ``python -m coordinator`` on a broker, bad records
written straight to its system topics among good transactions and lock calls.

Invariants checked (:meth:`Report.violations`): the coordinator never exits (and stops with
code 0 on SIGTERM, without a traceback in its log); every good COMMIT (inline or answered
on its back-check) is promoted exactly once and no ROLLBACK is; every good lock call is
granted and released; no half record that must never be promoted is; no stale lock
request is held; every record of a counted category moved a bad-input counter. Timer
messages (issue 35): every good one (sent through ``Producer.send``) and every valid one the
adversary wrote is delivered to its real topic exactly once, not before its time, with one
``rmq.promoted_from`` of the coordinator's; every bad timer record has exactly one copy in the
discard topic with the reason it is owed and is written nowhere else.
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

from rmq_semantics import LocalTransactionState, Message, Producer, TransactionListener
from rmq_semantics.embedded import free_port
from rmq_semantics.errors import RmqError
from rmq_semantics.lock_client import LockClient
from rmq_semantics.records.headers import H
from rmq_semantics.tools.coordinator_process import CoordinatorProcess
from rmq_semantics.topics import SystemTopics, ensure_topics, timer_topic_specs
from rmq_semantics.transaction import TransactionProducer
from tests.fuzz.categories import (
    DELIVERED,
    KNOWN_BAD,
    TIMER,
    TIMER_CANCEL,
    TIMER_LEVEL,
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
# The timer service on 2 partitions with an 8 s maximum delay: 4 level topics of 2 partitions.
TIMER_SETTINGS = {"timer_partitions": 2, "max_delay_ms": 8000}
CHUNK = 50  # bad cases written between two batches of good transactions
# Good timer messages per chunk, through Producer.send: (deliver_after_ms, delay_time_level)
# one of each is drawn; the longer ones are still pending when the chunk's cases are made
# (what cancels of another group aim at).
TIMERS_PER_CHUNK = 3
GOOD_DELAYS = ((0, None), (400, None), (1500, None), (2500, None), (None, 1))
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
    # Timer records by value: (DELIVERED or a discard reason, earliest due ms), the topic
    # (short name) each was written to, and what became of them.
    timers: dict[bytes, tuple[str, int]] = field(default_factory=dict)
    timer_written_to: dict[bytes, str] = field(default_factory=dict)
    timer_delivered: Counter = field(default_factory=Counter)
    timer_discarded: dict[bytes, list[str]] = field(default_factory=dict)
    timer_problems: list[str] = field(default_factory=list)
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
        out += self.timer_violations()
        return out

    def timer_violations(self) -> list[str]:
        wrong = []
        for value, (outcome, _) in self.timers.items():
            delivered = self.timer_delivered[value]
            reasons = self.timer_discarded.get(value, [])
            if outcome == DELIVERED and (delivered != 1 or reasons):
                wrong.append(f"{value!r} delivered {delivered} times, discarded as {reasons}")
            elif outcome != DELIVERED and (delivered or reasons != [outcome]):
                wrong.append(
                    f"{value!r} owed one discard as {outcome}: delivered {delivered} times, "
                    f"discarded as {reasons}"
                )
        out = self.timer_problems[:5]
        if wrong:
            out.append(f"{len(wrong)} timer records not handled as owed, e.g. {wrong[:3]}")
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
        if self.timers:
            owed_discards = Counter(o for o, _ in self.timers.values() if o != DELIVERED)
            lines.append(
                f"timer records: {sum(o == DELIVERED for o, _ in self.timers.values())} owed a "
                f"delivery, {sum(self.timer_delivered.values())} delivered; owed discards "
                f"{dict(sorted(owed_discards.items()))}"
            )
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
            settings={
                **FAST,
                **TIMER_SETTINGS,
                "topic_prefix": self.prefix,
                "instance_id": self.prefix,
            },
            env={"PYTHONPATH": str(REPO)},
        )
        self.ctx = Ctx(
            prefix=self.prefix,
            partitions=FAST["half_partitions"],
            group=f"{self.prefix}-pg",
            real_topic=f"{self.prefix}-sink",
            missing_topic=f"{self.prefix}-missing",
            lock_group=f"{self.prefix}-lg",
            timer_partitions=TIMER_SETTINGS["timer_partitions"],
            timer_topic=f"{self.prefix}-timed",
            timer_group=f"{self.prefix}-tg",
            timer_max_delay_ms=TIMER_SETTINGS["max_delay_ms"],
        )
        # Timer topics and messages only when a timer category runs (the timer service
        # stays idle until its intake topic exists).
        self.timers = any(c.topic in (TIMER, TIMER_LEVEL, TIMER_CANCEL) for c in categories)
        self.cases: list[Case] = []
        self.baseline: dict[str, float] = {}
        self.latest: dict[str, float] = {}

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> Report:
        started = time.monotonic()
        ensure_topics(self.conf, {self.topic: (2, {}), self.ctx.real_topic: (1, {})})
        if self.timers:
            specs = timer_topic_specs(
                SystemTopics(self.prefix),
                TIMER_SETTINGS["timer_partitions"],
                TIMER_SETTINGS["max_delay_ms"],
            )
            ensure_topics(self.conf, {**specs, self.ctx.timer_topic: (1, {})})
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
                timed = Producer(
                    self.conf,
                    topic_prefix=self.prefix,
                    producer_group=self.ctx.timer_group,
                    delay_levels="1s 5s",  # RocketMQ 4's table is over the 8 s maximum
                    **TIMER_SETTINGS,
                )
                try:
                    self._write(producer, locks, timed)
                    self._settle()
                    if self.timers:
                        self._settle_timers()
                finally:
                    timed.close()
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
            timers = status.get("services", {}).get("timers") == "ok" or not self.timers
            if (
                status.get("owned_partitions") == want
                and status.get("owned_lock_partitions") == want
                and timers
            ):
                return
            time.sleep(0.2)
        raise RmqError(f"the coordinator did not take every partition; see {self.report.log_path}")

    def _write(self, producer: TransactionProducer, locks: LockClient, timed: Producer) -> None:
        raw = confluent_kafka.Producer({**self.conf, "linger.ms": 5})
        goods_per_chunk = max(2, CHUNK // 5)
        written = 0
        try:
            while written < self.records and self._alive():
                targets = self._send_good(producer, goods_per_chunk)
                pending = self._send_timers(timed) if self.timers else ()
                ctx = replace(
                    self.ctx,
                    targets=targets,
                    timer_targets=pending,
                    now_ms=int(time.time() * 1000),
                )
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

    def _send_timers(self, timed: Producer) -> tuple[str, ...]:
        """Good timer messages as a user sends them; the ids of those still pending."""
        pending = []
        for _ in range(TIMERS_PER_CHUNK):
            after, level = pick(self.rng, GOOD_DELAYS)
            value = f"good-timer:{uuid.uuid4().hex}".encode()
            # The producer reads its clock after this: its deliver_at is no earlier.
            due = int(time.time() * 1000) + (1000 if level else after)
            msg = Message(
                self.ctx.timer_topic,
                value,
                key=value,
                deliver_after_ms=after,
                delay_time_level=level,
            )
            result = timed.send(msg)
            self.report.timers[value] = (DELIVERED, due)
            if (after or 0) >= 1500 and result.message_id:
                pending.append(result.message_id)
        return tuple(pending)

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
            self.report.timers.update(case.timer_outcomes)
            self.report.timer_written_to.update(dict.fromkeys(case.timer_outcomes, case.topic))
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

    def _settle_timers(self) -> None:
        """Read the timer messages' real topic and the discard topic until every timer record
        is delivered or set aside as owed (or time is up), a little more for duplicates."""
        report = self.report
        discard = SystemTopics(self.prefix).discard
        consumer = confluent_kafka.Consumer(
            {
                **self.conf,
                "group.id": f"fuzz-timers-{self.prefix}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(self.ctx.timer_topic, 0, 0), TopicPartition(discard, 0, 0)])
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        quiet_until = None
        try:
            while time.monotonic() < deadline and self._alive():
                msgs = [m for m in consumer.consume(1000, 0.2) if m.error() is None]
                for msg in msgs:
                    if msg.topic() == discard:
                        self._timer_discard(msg)
                    else:
                        self._timer_delivery(msg)
                if msgs:
                    quiet_until = None
                if not report.timer_violations():
                    quiet_until = quiet_until or time.monotonic() + QUIET_S
                    if time.monotonic() >= quiet_until:
                        break
        finally:
            consumer.close()

    def _timer_delivery(self, msg) -> None:
        value, report = msg.value(), self.report
        report.timer_delivered[value] += 1
        headers = msg.headers() or []
        origins = [v for k, v in headers if k == H.PROMOTED_FROM]
        delivered_at = [v for k, v in headers if k == H.DELIVERED_AT]
        where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
        if len(origins) != 1 or not (origins[0] or b"").startswith(b"timer:"):
            report.timer_problems.append(f"{where}: {H.PROMOTED_FROM} {origins}")
        owed = report.timers.get(value)
        if owed is not None and (len(delivered_at) != 1 or int(delivered_at[0] or b"0") < owed[1]):
            report.timer_problems.append(
                f"{where}: {H.DELIVERED_AT} {delivered_at}, due at {owed[1]} (before its time)"
            )

    def _timer_discard(self, msg) -> None:
        headers = msg.headers() or []
        topic = next((v for k, v in headers if k == H.ORIGINAL_TOPIC), None) or b""
        if not topic.startswith(f"{self.prefix}_{TIMER}".encode()):
            return  # a half record's
        reason = next((v for k, v in headers if k == H.DISCARD_REASON), None) or b""
        self.report.timer_discarded.setdefault(msg.value(), []).append(reason.decode())

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
        discard = SystemTopics(self.prefix).discard
        for topic in (self.ctx.real_topic, *self.ctx.system_topics()):
            for msg in _read_all(self.conf, topic):
                txn = _txn(msg)
                if txn in forbidden and _promoted(msg):
                    report.forbidden.append(
                        f"{forbidden[txn]} txn {txn} promoted to {msg.topic()}[{msg.partition()}]"
                    )
                # A bad timer record is nowhere but where it was written and the discard topic.
                owed = report.timers.get(msg.value() or b"")
                written = report.timer_written_to.get(msg.value() or b"")
                if (
                    owed is not None
                    and owed[0] != DELIVERED
                    and topic not in (discard, f"{self.prefix}_{written}")
                ):
                    report.forbidden.append(
                        f"timer record {msg.value()!r} ({owed[0]}) written to {topic}"
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
