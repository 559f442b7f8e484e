"""The coordinator's transaction service without Kafka: its real ``_step`` and replay, its
real ``TransactionWriter``, ``PartitionState`` and codecs, over in-memory topics.

Only the Kafka clients are stand-ins: :class:`FakeConsumer` serves records in a random
interleaving of the half and Op partitions (with the end-of-partition events the service
needs to finish recovery), and :class:`FakeProducer` applies a transaction's records and
offsets at commit, all or nothing, refusing what the broker would refuse (an unknown topic
or partition) with an abortable error. The clock is the simulation's. A restart is a new
service reading from the committed offsets, as a new process would.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from unittest import mock

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from coordinator import kafka_txn
from coordinator.marker_auth import MarkerKey, MarkerVerifier
from coordinator.promote import TransactionWriter
from coordinator.promotion_sets import PromotionSets, set_transactional_id
from coordinator.settings import CoordinatorSettings
from coordinator.txn_service import TransactionService
from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.records.codec import decode, encode
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import CheckRequest, EndEntry, EndRequest, EndRequests, EndState
from tests.fuzz.categories import HALF, OP, Case, Category, uncounted
from tests.fuzz.generators import Ctx, Raw, pick, valid_half, valid_members

REAL_TOPIC = "orders"
SIM_CONF = {"bootstrap.servers": "sim:9092"}
SIM_KEY = MarkerKey(b"the simulated coordinators' key")
# Settings of the tests' coordinators (tests/integration/txn_helpers.FAST).
SETTINGS = {"transaction_timeout_ms": 1500, "check_interval_ms": 2500, "check_max": 3}
# Rounds of 20 steps a run may take after the last record to settle.
SETTLE_ROUNDS = 50
# ... and stops early when this many rounds in a row (half a minute of its clock) decided nothing
# (a replay loop, or what only a fix will decide).
STUCK_ROUNDS = 3
# Members of the good transactions: mostly one, some multi-message (issue 18).
GOOD_SIZES = (1, 1, 1, 2, 4)


class Message:
    """A consumed record, as much of ``confluent_kafka.Message`` as the service reads."""

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        raw: Raw | None,
        timestamp_ms: int,
        error: KafkaError | None = None,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._raw, self._ts, self._error = raw, timestamp_ms, error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError | None:
        return self._error

    def key(self) -> bytes | None:
        return self._raw.key if self._raw else None

    def value(self) -> bytes | None:
        return self._raw.value if self._raw else None

    def headers(self) -> list | None:
        return self._raw.headers if self._raw and self._raw.headers else None

    def timestamp(self) -> tuple[int, int]:
        return 1, self._ts


@dataclass
class Cluster:
    """In-memory topics (name -> partitions -> records) and the coordinator's commits."""

    topics: dict[str, int]  # name -> partition count
    clock_ms: int = 1_700_000_000_000
    logs: dict[tuple[str, int], list[Raw]] = field(default_factory=lambda: defaultdict(list))
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    #: Set to make the next commit fail with an abortable error.
    fail_next_commit: bool = False

    def append(self, topic: str, raw: Raw) -> tuple[int, int]:
        partition = raw.partition if raw.partition is not None and raw.partition >= 0 else 0
        log = self.logs[(topic, partition)]
        log.append(raw)
        return partition, len(log) - 1


class FakeProducer:
    """``confluent_kafka.Producer`` for :class:`kafka_txn.KafkaTransactions`."""

    cluster: Cluster  # set by :func:`running`

    def __init__(self, conf: dict) -> None:
        self.conf = conf
        self._records: list[tuple[str, Raw]] | None = None
        self._offsets: list[TopicPartition] = []
        self._reports: list = []  # each record's on_delivery (None: not asked for)

    def init_transactions(self, timeout: float) -> None:
        pass

    def begin_transaction(self) -> None:
        self._records, self._offsets, self._reports = [], [], []

    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | None = None,
        partition: int = -1,
        headers: list | None = None,
        on_delivery=None,
        **_: object,
    ) -> None:
        # What librdkafka refuses at once: the same exceptions, raised here.
        if not -(2**31) <= partition < 2**31:
            raise OverflowError("signed integer is greater than maximum")
        if value is not None and not isinstance(value, bytes | str):
            raise TypeError(f"a bytes-like object is required, not {type(value).__name__}")
        for name, header_value in headers or []:
            if not isinstance(name, str) or not isinstance(header_value, bytes | str | None):
                raise TypeError(f"header {name!r}: bytes, str or None expected")
        if self._records is None:
            raise KafkaException(KafkaError(KafkaError._STATE))
        self._records.append((topic, Raw(value, key, list(headers or []), partition)))
        self._reports.append(on_delivery)

    def send_offsets_to_transaction(self, offsets: list, metadata: object, timeout: float) -> None:
        self._offsets = list(offsets)

    def commit_transaction(self, timeout: float) -> None:
        records, self._records = self._records or [], None
        cluster = self.cluster
        bad = []
        # As librdkafka does: a record the broker refuses gets a failed delivery report
        # during the commit, which then fails with an abortable error.
        for (t, raw), report in zip(records, self._reports, strict=True):
            if t not in cluster.topics:
                error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            elif (
                raw.partition is not None
                and raw.partition != -1
                and not 0 <= raw.partition < cluster.topics[t]
            ):
                error = KafkaError(KafkaError._UNKNOWN_PARTITION)
            else:
                continue
            bad.append(t)
            if report is not None:
                report(error, None)
        if bad or cluster.fail_next_commit:
            cluster.fail_next_commit = False
            code = KafkaError.UNKNOWN_TOPIC_OR_PART if bad else KafkaError._TIMED_OUT
            raise KafkaException(
                KafkaError(code, f"sim: cannot write {bad}", txn_requires_abort=True)
            )
        for topic, raw in records:
            cluster.append(topic, raw)
        for tp in self._offsets:
            cluster.committed[(tp.topic, tp.partition)] = tp.offset

    def abort_transaction(self, timeout: float) -> None:
        self._records = None

    def flush(self, timeout: float = 0) -> int:
        return 0

    def poll(self, timeout: float = 0) -> int:
        return 0

    def purge(self, **_flags: bool) -> None:
        self._records = None


class FakeConsumer:
    """The coordinator's consumer over the half and Op partitions, in a random interleaving."""

    def __init__(
        self, cluster: Cluster, topics: list[str], partitions: int, rng: random.Random
    ) -> None:
        self.cluster, self.rng = cluster, rng
        self.tps = [(t, p) for t in topics for p in range(partitions)]
        self._at = {tp: cluster.committed.get(tp, 0) for tp in self.tps}
        self.eof_due = set(self.tps)

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self.tps]

    def committed(self, tps: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.cluster.committed.get((tp.topic, tp.partition), -1001)
            )
            for tp in tps
        ]

    def seek(self, tp: TopicPartition) -> None:
        self._at[(tp.topic, tp.partition)] = max(tp.offset, 0)
        self.eof_due.add((tp.topic, tp.partition))

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self._at[(tp.topic, tp.partition)]) for tp in tps
        ]

    def consumer_group_metadata(self) -> str:
        return "sim-group-metadata"

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple:
        # No transactions in the simulated log: its high watermark is its stable end.
        return 0, len(self.cluster.logs[(tp.topic, tp.partition)])

    def _next(self) -> Message | None:
        ready = [tp for tp in self.tps if self._at[tp] < len(self.cluster.logs[tp])]
        if ready:
            tp = self.rng.choice(ready)
            offset = self._at[tp]
            self._at[tp] = offset + 1
            self.eof_due.add(tp)
            return Message(*tp, offset, self.cluster.logs[tp][offset], self.cluster.clock_ms)
        if self.eof_due:
            tp = self.eof_due.pop()
            return Message(
                *tp,
                self._at[tp],
                None,
                self.cluster.clock_ms,
                KafkaError(KafkaError._PARTITION_EOF),
            )
        return None

    def poll(self, timeout: float = 0) -> Message | None:
        return self._next()

    def consume(self, num_messages: int = 1, timeout: float = 0) -> list[Message]:
        out = []
        for _ in range(min(num_messages, self.rng.randrange(1, 500))):
            msg = self._next()
            if msg is None:
                break
            out.append(msg)
        return out


@dataclass
class Good:
    """A good transaction: its local decision and its check answer."""

    txn_id: str
    partition: int
    offset: int
    inline: EndState | None  # None: UNKNOW until its back-check
    size: int = 1  # members (issue 18): a COMMIT promotes every one, once

    @property
    def final(self) -> EndState:
        return self.inline or EndState.COMMIT


class Simulation:
    """A coordinator, its producers, good transactions and fuzz cases, on one clock."""

    def __init__(
        self, rng: random.Random, partitions: int = 2, prefix: str = "sim", sets: int = 1
    ) -> None:
        self.rng = rng
        self.settings = CoordinatorSettings(
            topic_prefix=prefix,
            half_partitions=partitions,
            check_partitions=1,
            promotion_sets=sets,
            **SETTINGS,
        )
        self.ctx = Ctx(prefix=prefix, partitions=partitions, real_topic=REAL_TOPIC)
        topics = {f"{prefix}_{t}": partitions for t in ("half", "op")}
        topics |= {f"{prefix}_{t}": 1 for t in ("check", "discard")}
        self.cluster = Cluster({**topics, REAL_TOPIC: 1})
        self.good: dict[str, Good] = {}
        self.cases: list[Case] = []
        self.answered_checks = 0
        self._checks_read = 0
        self.steps = 0
        self.restarts = 0
        self._service: TransactionService | None = None
        self._counts: Counter[str] = Counter()  # metrics of the coordinators that are gone

    # -- the coordinator -------------------------------------------------------------------
    def _start(self) -> None:
        self._service = service = TransactionService(SIM_CONF, self.settings)
        # What run() would load from the keys topic and read from the cluster's metadata.
        service._markers = MarkerVerifier(SIM_KEY, service.topics.op, {})
        service.destinations.partition_count = lambda topic, partition=None, decided_at=None: (
            self.cluster.topics.get(topic)
        )
        topics = [service.topics.half, service.topics.op]
        self._consumer = FakeConsumer(self.cluster, topics, self.settings.half_partitions, self.rng)
        service._consumer = self._consumer  # type: ignore[assignment]
        writers = [
            TransactionWriter(
                SIM_CONF,
                service.topics,
                set_transactional_id("sim-writer", k, self.settings.promotion_sets),
                service.metrics,
                service.ledger,
                marker_key=SIM_KEY,
            )
            for k in range(self.settings.promotion_sets)
        ]
        self._sets = service._sets = PromotionSets(writers)
        self._sets.start()
        self._service._on_assign(self._consumer, self._consumer.assignment())
        self._steps_left = 0
        self._stop = threading.Event()

    @property
    def service(self) -> TransactionService:
        if self._service is None:
            self._start()
        return self._service  # type: ignore[return-value]

    def restart(self) -> None:
        """A new coordinator process: it reads on from the committed offsets."""
        self.restarts += 1
        if self._service is not None:
            self._counts += counter_values(self._service.metrics.registry)
        self._service = None

    def run(self, steps: int, tick_ms: tuple[int, int] = (20, 400)) -> None:
        """``steps`` steps of the service's own loop (aborts replay as in production), the
        clock moving between them, the producers answering checks after each."""
        service = self.service

        def step() -> None:
            self.cluster.clock_ms += self.rng.randrange(*tick_ms)
            self.steps += 1
            service._step(self._consumer, self._sets)
            # Deterministic: each step's transaction commits before the clock moves on.
            service._settle_all(self._sets)
            self._answer_checks()
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._stop.set()

        self._steps_left, self._stop = steps, threading.Event()
        kafka_txn.transactional_loop(
            "sim", step, lambda: service._replay(self._consumer, self._sets), self._stop
        )

    # -- producers ---------------------------------------------------------------------------
    def send_good(self, inline: EndState | None, size: int = 1) -> Good:
        """A transaction as ``TransactionProducer`` sends it (``size`` > 1: its members as
        ``send_transaction`` does, then one end request for member 0); ``inline`` None is
        UNKNOW."""
        ctx = Ctx(
            prefix=self.ctx.prefix,
            partitions=self.ctx.partitions,
            real_topic=REAL_TOPIC,
            now_ms=self.cluster.clock_ms,
        )
        if size > 1:
            raws, txn = valid_members(self.rng, ctx, size)
        else:
            raw, txn = valid_half(self.rng, ctx)
            raws = [raw]
        partition, offset = self.cluster.append(f"{ctx.prefix}_{HALF}", raws[0])
        for raw in raws[1:]:
            self.cluster.append(f"{ctx.prefix}_{HALF}", raw)
        good = self.good[txn] = Good(txn, partition, offset, inline, size)
        if inline is not None:
            self.cluster.append(
                f"{ctx.prefix}_{OP}",
                Raw(
                    encode(
                        EndRequests(
                            ctx.group, partition, (EndEntry(txn, offset, inline),), ctx.now_ms
                        )
                    ),
                    partition=partition,
                ),
            )
        return good

    def send_case(self, case: Case) -> None:
        self.cases.append(case)
        first = None
        for raw in case.records:
            where = self.cluster.append(f"{self.ctx.prefix}_{case.topic}", raw)
            first = first or where
        if case.then is not None and first is not None:
            for topic, raw in case.then(*first):
                self.cluster.append(f"{self.ctx.prefix}_{topic}", raw)

    def targets(self) -> tuple[tuple[int, int, str], ...]:
        """Good transactions still waiting for their back-check (forged records aim here)."""
        return tuple(
            (g.partition, g.offset, g.txn_id) for g in self.good.values() if g.inline is None
        )

    def _answer_checks(self) -> None:
        log = self.cluster.logs[(f"{self.ctx.prefix}_check", 0)]
        for raw in log[self._checks_read :]:
            try:
                check = decode(raw.value)
            except MalformedRecordError:
                continue
            if not isinstance(check, CheckRequest) or check.producer_group != self.ctx.group:
                continue
            good = self.good.get(check.txn_id)
            state = good.final if good else EndState.UNKNOWN
            self.answered_checks += 1
            self.cluster.append(
                f"{self.ctx.prefix}_{OP}",
                Raw(
                    encode(
                        EndRequest(
                            check.txn_id,
                            check.producer_group,
                            check.half_partition,
                            check.half_offset,
                            state,
                            True,
                            check.check_seq,
                            self.cluster.clock_ms,
                        )
                    ),
                    partition=check.half_partition,
                ),
            )
        self._checks_read = len(log)

    # -- outcomes ----------------------------------------------------------------------------
    def counts(self) -> Counter[str]:
        """Every counter of every coordinator of the run, summed: ``name{label=value}``."""
        live = counter_values(self._service.metrics.registry) if self._service else Counter()
        return self._counts + live

    def promoted(self) -> Counter[str]:
        """Txn ids of the records promoted to the real topic."""
        return Counter(_txn_of(raw) for raw in self.cluster.logs[(REAL_TOPIC, 0)])

    def promoted_forbidden(self) -> list[str]:
        """Where a half record that must never be promoted was promoted to (any topic)."""
        forbidden = {c.txn_id: c.category for c in self.cases if c.never_promoted}
        return [
            f"{forbidden[txn]} txn {txn} promoted to {topic}[{p}]"
            for (topic, p), log in self.cluster.logs.items()
            for raw in log
            if (txn := _txn_of(raw)) in forbidden
            and any(k == H.PROMOTED_FROM for k, _ in raw.headers or [])
        ]

    def undecided(self) -> list[Good]:
        """Good transactions not promoted exactly once (COMMIT) or promoted (ROLLBACK)."""
        promoted = self.promoted()
        want = {EndState.COMMIT: 1, EndState.ROLLBACK: 0}  # times each member
        return [g for g in self.good.values() if promoted[g.txn_id] != want[g.final] * g.size]

    def violations(self, *, counts: bool = True) -> list[str]:
        """The invariants this run broke (checked after it ran); ``counts``: also that every
        record of a counted category moved a counter (restarts re-count, so only then)."""
        out = [
            f"good txn {g.txn_id} ({g.final.value}) promoted {self.promoted()[g.txn_id]} times"
            for g in self.undecided()
        ]
        out += self.promoted_forbidden()
        if not counts:
            return out
        out += uncounted(self.counts(), self.ctx.prefix, self.cases)
        return out

    # -- stand-ins in place while the simulation runs ----------------------------------------
    def __enter__(self) -> Simulation:
        cluster = self.cluster

        class Producer(FakeProducer):
            def __init__(self, conf: dict) -> None:
                super().__init__(conf)
                self.cluster = cluster

        def now() -> int:
            return cluster.clock_ms

        self._patches = contextlib.ExitStack()
        for patch in (
            mock.patch.object(kafka_txn.confluent_kafka, "Producer", Producer),
            mock.patch("coordinator.txn_service._now_ms", now),
            mock.patch("coordinator.promote._now_ms", now),
            mock.patch.object(kafka_txn, "RETRY_PAUSE_S", 0.0),
        ):
            self._patches.enter_context(patch)
        return self

    def __exit__(self, *exc: object) -> None:
        self._patches.close()


def counter_values(registry: object) -> Counter[str]:
    """``name{label=value}`` -> value of every counter sample of a Prometheus registry."""
    out: Counter[str] = Counter()
    for family in registry.collect():  # type: ignore[attr-defined]
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] += sample.value
    return out


def _txn_of(raw: Raw) -> str:
    for name, value in raw.headers or []:
        if name == H.TXN_ID and value is not None:
            return value.decode(errors="replace")
    return "?"


def fuzz(
    rng: random.Random,
    categories: list[Category],
    cases: int,
    *,
    good: int,
    chaos: bool,
    sets: int = 1,
) -> tuple[Simulation, list[str]]:
    """``cases`` fuzz cases of ``categories`` among ``good`` good transactions, through one
    simulated coordinator (``chaos``: with restarts and aborted commits); returns the run and
    the invariants it broke (``sets``: promotion sets, each its own Kafka transaction). An
    exception out of the coordinator's loop propagates."""
    sim = Simulation(rng, sets=sets)
    with sim:
        total = cases + good
        for i in range(total):
            if rng.randrange(total - i) < good:
                good -= 1
                sim.send_good(
                    pick(rng, [EndState.COMMIT, EndState.ROLLBACK, None]), pick(rng, GOOD_SIZES)
                )
            else:
                ctx = replace(sim.ctx, targets=sim.targets(), now_ms=sim.cluster.clock_ms)
                sim.send_case(pick(rng, categories).make(rng, ctx))
            if rng.random() < 0.25:
                sim.run(rng.randrange(1, 4))
            if chaos and rng.random() < 0.01:
                sim.restart()
            if chaos and rng.random() < 0.03:
                sim.cluster.fail_next_commit = True
        # Until every good transaction is decided (bounded): every back-check, its answers
        # and the discards after check_max take some 10 s of the simulation's clock.
        stuck, left = 0, len(sim.undecided())
        for _ in range(SETTLE_ROUNDS):
            sim.run(20, (200, 1000))
            recovering = any(s.recovering for s in sim.service.states.values())
            before, left = left, len(sim.undecided())
            stuck = stuck + 1 if left == before else 0
            if (not left and not recovering) or stuck >= STUCK_ROUNDS:
                break
        sim.run(20, (200, 1000))
    return sim, sim.violations(counts=not chaos)
