"""The timer service: delivers timer messages at their time, exactly once, through the
timing wheel of :mod:`coordinator.timer_wheel` over the timer topics.

One consumer group (``<prefix>_timer``; classic protocol, range assignment, so timer
partition p of every timer topic goes to one member) reads the intake topic, the level
topics and the cancel topic, read_committed. Per timer partition a :class:`PartitionWheel`
decides; each step's actions (deliveries, re-appends, discards) and the lanes' offsets are
one Kafka transaction of the service's own transactional producer, its offsets sent with the
group's metadata (KIP-447), so a zombie owner is fenced and through a crash, a rebalance or
a broker restart each record is acted on once (``docs/design/contract.md``).

On assignment the lanes are paused while the cancel partition is read from two maximum delays
back to its end; then the wheel resumes the lanes whose head is released, from their
committed offsets (the done offsets above them in the commit metadata are skipped). A lane
whose head is not released stays paused, so memory holds heads and the due-heap only.

Cancels are not committed: they are read again from the window on every assignment. A bad
cancel (undecodable, or unsigned under tenant isolation) is counted and logged with
``topic[partition]@offset`` and skipped, as a bad Op record is; a bad timer record goes to
the discard topic with a reason. At most ``timer_cancels_max`` cancels per partition and
window are held, counted from offsets as the producer's ``recall_message`` counts them (one
past it raised ``TimerRecallRefused`` there), and none of an id already delivered.

Timer topics of unequal partition counts block this service only: it says so (log, metric,
/healthz) and looks again until an operator has fixed them (``_usable_topics``).

Over 500 lines because the loop, assignment and recovery, the topics' start-up checks and
the vetting of records and cancels share one consumer and the wheels; the decisions already
live in :mod:`coordinator.timer_wheel` and each step's transaction in
:mod:`coordinator.timer_writer`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid

import confluent_kafka
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from tenacity import retry_if_exception

from coordinator.destinations import Destinations
from coordinator.kafka_txn import TRANSACTION_TIMEOUT_MS, KafkaTransactions, transactional_loop
from coordinator.marker_keys import tenancy_watermarks
from coordinator.metrics import CoordinatorMetrics
from coordinator.poison import PoisonLedger
from coordinator.settings import CoordinatorSettings
from coordinator.tenancy import tenant_guard
from coordinator.timer_wheel import (
    INTAKE,
    Action,
    Cancels,
    Delivered,
    Incoming,
    PartitionWheel,
    Step,
    TimerEntry,
    once_per_step,
)
from coordinator.timer_writer import TimerWriter, lane_key
from rmq_semantics.clientconf import client_conf, shared_conf
from rmq_semantics.consumed import headers_of, offset_of, partition_of, topic_of
from rmq_semantics.errors import (
    FatalKafkaError,
    IllegalStateError,
    KafkaOperationError,
    RmqError,
)
from rmq_semantics.records.codec import decode_timer_cancel
from rmq_semantics.records.headers import H
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.records.timer import (
    CANCEL_KEEP_DELAYS,
    TimerRecord,
    cancel_window_start,
    max_level,
    parse_timer,
    unparsed_timer,
)
from rmq_semantics.retry import is_retriable, retrying
from rmq_semantics.topics import (
    SystemTopics,
    TopicSpecs,
    ensure_topics,
    is_system_topic,
    list_topics,
    timer_topic_specs,
    txn_topic_specs,
)

__all__ = ["TimerService", "timer_specs"]

log = logging.getLogger(__name__)

# The first wait for a record; a due record or a released lane shortens it.
POLL_WAIT_S = 0.05
MAX_BATCH = 2000
STARTUP_DEADLINE_S = 120.0
# How often an idle service looks for the intake topic: the first timer message of a prefix
# waits at most this long (plus the level topics' creation) before the wheel starts.
INTAKE_POLL_S = 2.0
# Stable committed offsets wait for a zombie's open transaction (at most its timeout).
COMMITTED_TIMEOUT_S = 2 * TRANSACTION_TIMEOUT_MS / 1000
METADATA_TIMEOUT_S = 10.0
# librdkafka pre-fetches up to 64 MiB (queued.max.messages.kbytes) and 50 MiB a fetch
# (fetch.max.bytes) by default: records of lanes the wheel pauses at their head are fetched
# and then dropped, so a low limit keeps the process's memory flat and the waste small.
QUEUED_MAX_KBYTES = 4096
FETCH_MAX_BYTES = 4 * 1024 * 1024
# A crashed owner's timer partitions wait this long for the group to notice (librdkafka's
# default of 45 s would make every message due meanwhile that late); as the lock clients'.
SESSION_TIMEOUT_MS = 10000
# Reading one earlier delivery back (Delivered) waits this long for its transaction's end.
READ_BACK_TIMEOUT_S = 10.0
# The last deliveries per partition: never delivered again (a broker can lose a committed
# transaction's offsets: coordinator.timer_wheel.Delivered), and a cancel of one is counted
# as too late.
RECENT_DELIVERIES = 10_000
# A cancel written further ahead of this clock than this is not held: its window would
# be one no producer in step with the cluster's clocks counts (a forged timestamp).
CANCEL_AHEAD_MS = 300_000
# Windows' first offsets remembered (one look-up per window step and cancel partition).
WINDOWS_KEPT = 4096
# A refused cancel is logged at the first and then every this many per partition.
REFUSALS_LOGGED_EVERY = 1000
# How often a blocked service (timer topics of unequal partition counts) looks again.
TOPICS_RECHECK_S = 2.0
TOPIC_PARTITIONS = "topic_partitions"  # the rmq_timer_blocked reason


def timer_specs(settings: CoordinatorSettings, partitions: int | None = None) -> TopicSpecs:
    """The timer topics (``partitions`` each, else ``timer_partitions``), and the discard
    topic the service writes (the same spec as the transaction service's)."""
    topics = SystemTopics(settings.topic_prefix)
    discard = txn_topic_specs(topics, settings.half_partitions, settings.check_partitions)
    count = settings.timer_partitions if partitions is None else partitions
    return {
        **timer_topic_specs(topics, count, settings.max_delay_ms),
        topics.discard: discard[topics.discard],
    }


def _now_ms() -> int:
    return int(time.time() * 1000)


class TimerService:
    """Timer partitions owned through the ``<prefix>_timer`` group, their wheels, and one
    transaction per step. ``run(stop)`` blocks until ``stop`` is set.

    Over 300 lines because ownership, recovery, the dispatch of three kinds of record, the
    lanes' pauses and the step share one consumer and the partitions' wheels."""

    def __init__(
        self, conf: dict, settings: CoordinatorSettings, metrics: CoordinatorMetrics | None = None
    ) -> None:
        self.conf = dict(conf)
        self.settings = settings
        self.metrics = metrics or CoordinatorMetrics()
        self.topics = SystemTopics(settings.topic_prefix)
        self.levels = max_level(settings.max_delay_ms)
        self.instance_id = settings.instance_id or uuid.uuid4().hex[:12]
        self.guard = tenant_guard(settings)
        self.ledger = PoisonLedger(settings.replay_max)
        self.destinations = Destinations(self._admin_client, self.ledger)
        self.wheels: dict[int, PartitionWheel] = {}
        self.cancels: dict[int, Cancels] = {}
        self.partition_count = 0  # of every timer topic, read at startup
        self._lanes = {self.topics.timer: INTAKE} | {
            self.topics.timer_level(level): level for level in range(1, self.levels + 1)
        }
        self._loading: dict[int, int] = {}  # cancel partition -> end to read to
        self._window_firsts: dict[tuple[int, int], int] = {}  # (partition, start) -> offset
        self._refused: dict[int, int] = {}  # cancel partition -> cancels not held
        self._delivered: dict[int, Delivered] = {}
        self._sent: dict[tuple[str, int], tuple[int, str]] = {}
        self._assigned: set[int] = set()
        self._recover_due = False
        self._admin: AdminClient | None = None
        self._consumer: confluent_kafka.Consumer | None = None
        self._txn: KafkaTransactions | None = None
        self._writer: TimerWriter | None = None
        self._reader: confluent_kafka.Consumer | None = None  # reads deliveries back
        self._stop = threading.Event()
        self.ready = threading.Event()
        # Set while no timer topic exists yet and the service waits for one (healthy).
        self.idle = threading.Event()
        # Set while the timer topics cannot be served (see _usable_topics).
        self.blocked = threading.Event()
        self._problem: str | None = None

    def lane_topic(self, lane: int) -> str:
        return self.topics.timer if lane == INTAKE else self.topics.timer_level(lane)

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            raise IllegalStateError("the timer service is not running (call run())")
        return self._admin

    # -- life ----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set; the transaction in progress always completes. Until a
        producer has created the intake topic (its first timer message) the service only
        waits for it: a prefix that never schedules a message gets no timer topics."""
        self._stop = stop
        if not self._wait_for_intake(stop):
            return
        count = self._usable_topics(stop)
        if count is None:
            return
        self.partition_count = count
        if self.guard is not None:  # records of before isolation: trusted below these
            for attempt in retrying(STARTUP_DEADLINE_S, stop):
                with attempt:
                    self.guard.watermarks(
                        tenancy_watermarks(self.conf, self.settings, self.instance_id)
                    )
        self._admin = AdminClient(shared_conf(self.conf))
        txn = KafkaTransactions(
            self.conf,
            f"{self.topics.timer_group}-{self.instance_id}",
            who="timer service",
            every_delivery=True,  # where each delivery landed: see Delivered
        )
        self._txn = txn
        try:
            txn.init(stop)
            self._writer = TimerWriter(
                txn,
                self.topics,
                self.lane_topic,
                self.metrics,
                self.ledger,
                resign=None if self.guard is None else self.guard.resign_timer,
            )
            consumer = confluent_kafka.Consumer(
                client_conf(
                    self.conf,
                    who="coordinator",
                    forced={
                        "group.id": self.topics.timer_group,
                        # Range gives partition p of every timer topic to one member.
                        "group.protocol": "classic",
                        "partition.assignment.strategy": "range",
                        "session.timeout.ms": SESSION_TIMEOUT_MS,
                        "enable.auto.commit": False,
                        "enable.partition.eof": True,
                        "isolation.level": "read_committed",
                        "auto.offset.reset": "earliest",
                        "fetch.wait.max.ms": 10,
                        "queued.max.messages.kbytes": QUEUED_MAX_KBYTES,
                        "fetch.max.bytes": FETCH_MAX_BYTES,
                    },
                )
            )
            self._consumer = consumer
            consumer.subscribe(
                [*self._lanes, self.topics.timer_cancel],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )
            self.ready.set()
            log.info(
                "timer service %s running (prefix %s, %d partitions, %d levels)",
                self.instance_id,
                self.settings.topic_prefix,
                self.partition_count,
                self.levels,
            )
            try:
                transactional_loop(
                    "timer service",
                    lambda: self._step(consumer),
                    lambda: self._replay(consumer),
                    stop,
                )
            finally:
                self.ready.clear()
                consumer.close()
                if self._reader is not None:
                    self._reader.close()
                    self._reader = None
        finally:
            if self._writer is not None:
                self._writer.close()
            else:
                txn.close()
            log.info("timer service %s stopped", self.instance_id)

    def _wait_for_intake(self, stop: threading.Event) -> bool:
        """Wait, idle, until the intake topic exists; False if ``stop`` came first."""
        self.idle.set()
        try:
            while not stop.is_set():
                try:
                    if self.topics.timer in list_topics(self.conf).topics:
                        return True
                except RmqError as exc:  # an unreachable broker: the other services say so
                    log.debug("timer service: looking for %s: %s", self.topics.timer, exc)
                stop.wait(INTAKE_POLL_S)
            return False
        finally:
            self.idle.clear()

    def _usable_topics(self, stop: threading.Event) -> int | None:
        """The partition count every timer topic shares, the missing ones created with the
        intake's count. Producers may create the intake and cancel topics (a tenant too):
        while the counts differ the service is blocked, says so once (log, metric, /healthz)
        and looks again every TOPICS_RECHECK_S; the other services go on. None: stopped."""
        # The first timer message can come at any time, a broker restart too: a KRaft broker
        # fenced while it starts refuses a topic (INVALID_REPLICATION_FACTOR), which must not
        # stop the coordinator's other services. The transaction service created its topics
        # with the same factor, so here the refusal is transient; it is retried.
        policy = retrying(STARTUP_DEADLINE_S, stop).copy(retry=retry_if_exception(_transient))
        while not stop.is_set():
            for attempt in policy:
                with attempt:
                    counts = self._created_counts()
            problem = _copartitioning_problem(counts, self.topics.timer)
            self._report_topics(problem)
            if problem is None:
                return counts[self.topics.timer]
            stop.wait(TOPICS_RECHECK_S)
        return None

    def _created_counts(self) -> dict[str, int]:
        """Each timer topic's partition count (0: none), after creating the missing ones
        with the intake's count (else the coordinator's ``timer_partitions``)."""
        names = [*self._lanes, self.topics.timer_cancel]
        meta = list_topics(self.conf).topics
        counts = {t: len(meta[t].partitions) if t in meta else 0 for t in names}
        partitions = counts[self.topics.timer] or None
        if counts[self.topics.timer_cancel] not in (0, counts[self.topics.timer]):
            return counts  # none made while the producers' two differ: the fix stays small
        specs = timer_specs(self.settings, partitions)
        missing = {t: spec for t, spec in specs.items() if t not in meta}
        if missing:
            ensure_topics(
                self.conf,
                missing,
                replicated=True,
                replication_factor=self.settings.system_replication_factor,
            )
            meta = list_topics(self.conf).topics
        return {t: len(meta[t].partitions) if t in meta else 0 for t in names}

    def _report_topics(self, problem: str | None) -> None:
        """The blocked state for ``problem`` (None: cleared); logged once per change."""
        gauge = self.metrics.timer_blocked.labels(TOPIC_PARTITIONS)
        if problem is None:
            if self.blocked.is_set():
                log.info("timer service: the timer topics are co-partitioned now; starting")
            self.blocked.clear()
            gauge.set(0)
            self._problem = None
            return
        if problem != self._problem:
            log.error(
                "timer service blocked: %s; transactions and queue locks go on, timer messages "
                "wait (looked at again every %.0f s)",
                problem,
                TOPICS_RECHECK_S,
            )
            self.metrics.timer_topic_problems.labels(TOPIC_PARTITIONS).inc()
            self._problem = problem
        gauge.set(1)
        self.blocked.set()

    # -- ownership -----------------------------------------------------------------------
    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        parts = sorted({tp.partition for tp in partitions})
        self._assigned.update(parts)
        try:
            starts = self._recover(consumer, parts)
        except KafkaOperationError as exc:
            # Assigned with no wheel, all paused, at a start given (else librdkafka fetches
            # the committed offsets itself, and one failed fetch leaves the partitions
            # unfetched for good): the loop's replay recovers them and assigns them again.
            log.warning("timer service: %s; recovering once the loop runs", exc)
            starts = [
                TopicPartition(tp.topic, tp.partition, confluent_kafka.OFFSET_BEGINNING)
                for tp in partitions
            ]
            self._recover_due = True
            consumer.assign(starts)
            consumer.pause(starts)
            return
        self._assign(consumer, starts)
        log.info("assigned timer partitions %s; reading their cancels", parts)

    def _assign(self, consumer: confluent_kafka.Consumer, starts: list[TopicPartition]) -> None:
        """Assign ``starts``: the lanes paused (their wheels resume them), the cancel
        partitions fetching. librdkafka keeps a partition's pause through a new assignment,
        a revocation included, so the cancels are resumed each time, never assumed to be."""
        consumer.assign(starts)
        consumer.pause([tp for tp in starts if tp.topic != self.topics.timer_cancel])
        consumer.resume([tp for tp in starts if tp.topic == self.topics.timer_cancel])

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        # Between transactions: the step writes before it polls again.
        for p in {tp.partition for tp in partitions}:
            self._forget(p)
        log.info("revoked timer partitions %s", sorted({tp.partition for tp in partitions}))

    def _forget(self, p: int) -> None:
        self._assigned.discard(p)
        self.wheels.pop(p, None)
        self.cancels.pop(p, None)
        self._loading.pop(p, None)
        self._delivered.pop(p, None)
        for key in [k for k in self._sent if k[1] == p]:
            del self._sent[key]

    def _recover(self, consumer: confluent_kafka.Consumer, parts: list[int]) -> list:
        """New wheels for ``parts`` from their committed offsets; the TopicPartitions to
        assign (lanes at their committed offsets, cancels two maximum delays back)."""
        lanes = [TopicPartition(t, p) for p in parts for t in self._lanes]
        try:
            committed = consumer.committed(lanes, timeout=COMMITTED_TIMEOUT_S)
            keep_ms = CANCEL_KEEP_DELAYS * self.settings.max_delay_ms
            since = [
                TopicPartition(self.topics.timer_cancel, p, _now_ms() - keep_ms) for p in parts
            ]
            cancel_starts = consumer.offsets_for_times(since, timeout=METADATA_TIMEOUT_S)
            ends = {
                tp.partition: consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT_S)[1]
                for tp in since
            }
        except KafkaException as exc:
            raise KafkaOperationError.wrap(
                f"reading the committed offsets of timer partitions {parts}", exc.args[0]
            ) from exc
        failed = next((tp.error for tp in [*committed, *cancel_starts] if tp.error), None)
        if failed is not None:  # never guess a start: a cancel skipped could deliver
            raise KafkaOperationError.wrap(f"recovering timer partitions {parts}", failed)
        for p in parts:
            cancels = self.cancels.setdefault(p, Cancels(keep_ms))
            delivered = self._delivered.setdefault(p, Delivered(RECENT_DELIVERIES))
            self.wheels[p] = PartitionWheel(
                p, self.levels, self.settings.max_delay_ms, cancels, delivered
            )
        for tp in committed:
            self.wheels[tp.partition].start(self._lanes[tp.topic], tp.offset, tp.metadata)
        starts = [
            TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else -2)
            for tp in committed
        ]
        for tp in cancel_starts:
            end = ends[tp.partition]
            start = tp.offset if 0 <= tp.offset < end else end
            starts.append(TopicPartition(tp.topic, tp.partition, start))
            if start >= end:
                self.wheels[tp.partition].ready = True
            else:
                self._loading[tp.partition] = end
        return starts

    def _replay(self, consumer: confluent_kafka.Consumer) -> None:
        """After an aborted transaction or a failed step: every wheel again from the
        committed offsets (cancels are kept: no transaction of ours writes them)."""
        if self._writer is not None:  # a re-created producer, before any read
            self._writer.txn.ensure_initialised(self._stop)
        self._sent.clear()
        self._recover_due = False  # even with nothing left: revoked meanwhile
        parts = sorted(self._assigned)
        if not parts:
            return
        loading, known = dict(self._loading), set(self.wheels)
        try:
            starts = self._recover(consumer, parts)
            # Assigned again, each partition at a start given: a seek fails (_STATE) on a
            # partition librdkafka is not fetching, e.g. after its own committed-offset fetch
            # failed, and only an assignment starts it again. The cancel partitions go on
            # from where they are (see below).
            where = {
                (tp.topic, tp.partition): tp.offset
                for tp in consumer.position(
                    [tp for tp in starts if tp.topic == self.topics.timer_cancel]
                )
            }
            self._assign(
                consumer,
                [
                    TopicPartition(tp.topic, tp.partition, at)
                    if (at := where.get((tp.topic, tp.partition), -1)) >= 0
                    and tp.partition in known
                    else tp
                    for tp in starts
                ],
            )
        except KafkaException as exc:
            raise KafkaOperationError.wrap("replaying timer partitions", exc.args[0]) from exc
        for p, wheel in self.wheels.items():
            # The cancel partitions are not moved: one still loading goes on to its old end,
            # one loaded stays loaded; one never recovered (a failed assignment) reads from
            # its start to the end _recover found.
            if p in loading:
                wheel.ready, self._loading[p] = False, loading[p]
            elif p in known:
                wheel.ready = True
                self._loading.pop(p, None)

    # -- the loop ------------------------------------------------------------------------
    def _step(self, consumer: confluent_kafka.Consumer) -> None:
        if self._recover_due:
            raise KafkaOperationError("timer partitions assigned without their state")
        try:
            msgs = consumer.consume(MAX_BATCH, self._wait_s())
        except KafkaException as exc:
            raise KafkaOperationError.wrap("consuming timer records", exc.args[0]) from exc
        now = _now_ms()
        actions: list[Action] = []
        for msg in msgs:
            actions += self._dispatch_guarded(msg, now)
        now = _now_ms()
        for wheel in self.wheels.values():
            actions += wheel.due(now)
            wheel.cancels.expire(now)
        self._move_lanes(consumer, now)
        self._write(consumer, actions)
        self.metrics.timer_held.set(sum(w.held for w in self.wheels.values()))
        self.metrics.timer_cancels_held.set(sum(len(c) for c in self.cancels.values()))

    def _wait_s(self) -> float:
        """The poll's wait: short enough for the next held record or released lane."""
        times = [t for w in self.wheels.values() for t in (w.next_due(), w.next_release()) if t]
        if not times:
            return POLL_WAIT_S
        return max(0.0, min(POLL_WAIT_S, (min(times) - _now_ms()) / 1000))

    def _move_lanes(self, consumer: confluent_kafka.Consumer, now: int) -> None:
        """Pause the lanes the wheels blocked; seek and resume the ones they released (a
        failed seek is a replay: reading on past a blocked head would skip it)."""
        pause: list[TopicPartition] = []
        resume: list[TopicPartition] = []
        for p, wheel in self.wheels.items():
            pause += [TopicPartition(self.lane_topic(lane), p) for lane in wheel.to_pause()]
            for lane, offset in wheel.to_resume(now):
                resume.append(
                    TopicPartition(self.lane_topic(lane), p, -2 if offset is None else offset)
                )
        try:
            if pause:
                consumer.pause(pause)
            for tp in resume:
                consumer.seek(tp)
            if resume:
                consumer.resume([TopicPartition(tp.topic, tp.partition) for tp in resume])
        except KafkaException as exc:
            raise KafkaOperationError.wrap("pausing or resuming timer lanes", exc.args[0]) from exc

    def _write(self, consumer: confluent_kafka.Consumer, actions: list[Action]) -> None:
        offsets: list[TopicPartition] = []
        sent: dict[tuple[str, int], tuple[int, str]] = {}
        for p, wheel in self.wheels.items():
            for lane, (offset, metadata) in wheel.offsets().items():
                topic = self.lane_topic(lane)
                sent[(topic, p)] = (offset, metadata)
                offsets.append(TopicPartition(topic, p, offset, metadata=metadata))
        if not actions and sent == self._sent:
            return
        actions = self._vet(once_per_step(actions))
        writer = self._writer
        if writer is None:
            raise IllegalStateError("the timer service is not running (call run())")
        writer.write(actions, offsets, consumer.consumer_group_metadata())
        self._sent = sent
        for action in actions:
            if not isinstance(action.payload, TimerRecord):
                continue
            if action.step is Step.DELIVER:
                self._note_delivered(action.payload, writer)
            elif action.step is Step.SKIP:
                log.warning(
                    "%s id=%s: delivered before by this service, not again (the broker lost "
                    "the offsets of the transaction that delivered it)",
                    self._where(action),
                    action.payload.timer_id,
                )

    def _vet(self, actions: list[Action]) -> list[Action]:
        """Skips of records whose earlier delivery is not visible, as deliveries; deliveries
        with nowhere to go, or blamed for earlier aborts, as discards."""
        decided_at = time.monotonic()
        out = []
        for action in map(self._confirmed_skip, actions):
            record = action.payload
            if action.step is not Step.DELIVER or not isinstance(record, TimerRecord):
                out.append(action)
                continue
            reason: DiscardReason | None = None
            blame = self.ledger.discarding(lane_key(record.partition, action.lane, action.offset))
            if blame is not None:
                reason = blame.reason
            else:
                count = self.destinations.partition_count(
                    record.real_topic, record.real_partition, decided_at
                )
                if count is None:
                    reason = DiscardReason.UNKNOWN_TOPIC
                elif record.real_partition is not None and record.real_partition >= count:
                    reason = DiscardReason.UNKNOWN_PARTITION
            if reason is None:
                out.append(action)
            else:
                log.warning("%s to be set aside: %s", self._where(action), reason)
                out.append(_discarding(action, str(reason)))
        return out

    def _confirmed_skip(self, action: Action) -> Action:
        """``action``, or a delivery instead of a skip whose earlier delivery cannot be read
        back: a broker that lost a commit's markers everywhere aborted it (see Delivered)."""
        record = action.payload
        if action.step is not Step.SKIP or not isinstance(record, TimerRecord):
            return action
        delivered = self._delivered.get(record.partition)
        entry = action.entry
        if delivered is None or entry is None or not delivered.before(entry):
            return action  # a second copy due in the same step (once_per_step)
        where = delivered.where(entry)
        visible = None if where is None else self._visible(where, record.timer_id)
        if visible:
            return action
        at = "unknown" if where is None else f"{where[0]}[{where[1]}]@{where[2]}"
        why = (
            "is not visible"
            if visible is False
            else f"is still undecided after {READ_BACK_TIMEOUT_S:.0f} s: a transaction left "
            "open there by the broker (kafka-transactions.sh describe-producers shows it, "
            "abort --start-offset ends it) hides it and this copy until it is aborted"
        )
        log.warning(
            "%s id=%s: delivered before by this service, but that delivery (%s) %s: "
            "delivered again",
            self._where(action),
            record.timer_id,
            at,
            why,
        )
        if delivered is not None:
            delivered.forget(record.timer_id, record.producer_group or "")
        return Action(Step.DELIVER, action.lane, action.offset, action.entry, 0, "", record)

    def _visible(self, where: tuple[str, int, int], timer_id: str) -> bool | None:
        """Whether read_committed readers see the delivery of ``timer_id`` at ``where``:
        None while its transaction is still open after READ_BACK_TIMEOUT_S (the service's
        own transactions are all decided by then: one still open is one the broker lost
        the markers of); KafkaOperationError (a replay) when it cannot be read."""
        topic, partition, offset = where
        if self._reader is None:
            self._reader = confluent_kafka.Consumer(
                client_conf(
                    self.conf,
                    who="coordinator",
                    internal=True,
                    forced={
                        "group.id": f"{self.topics.timer_group}-reader",  # never joined
                        "enable.auto.commit": False,
                        "enable.partition.eof": True,
                        "isolation.level": "read_committed",
                    },
                )
            )
        reader = self._reader
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        try:
            reader.assign([TopicPartition(topic, partition, offset)])
            while time.monotonic() < deadline:
                for msg in reader.consume(16, 0.2):
                    err = msg.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        continue
                    at = msg.offset()  # an end of partition's is the end's
                    if err is None and at == offset:
                        return dict(headers_of(msg)).get(H.TIMER_ID) == timer_id.encode()
                    if at is not None and at > offset:
                        return False  # read past it: aborted (or never there)
                    if err is not None and self._log_end(topic, partition) <= offset:
                        return False  # the log ends below it: the broker truncated it
        except KafkaException as exc:
            where_ = f"reading back {topic}[{partition}]@{offset}"
            raise KafkaOperationError.wrap(where_, exc.args[0]) from exc
        except TimeoutError as exc:  # the log end not answered in time
            raise KafkaOperationError(
                f"reading back {topic}[{partition}]@{offset}: its log end timed out"
            ) from exc
        finally:
            with contextlib.suppress(KafkaException, RuntimeError):
                reader.unassign()
        return None

    def _log_end(self, topic: str, partition: int) -> int:
        """The high watermark of ``topic[partition]`` (read_uncommitted: a read_committed
        consumer's watermark is the last stable offset, below an open transaction)."""
        if self._admin is None:
            self._admin = AdminClient(shared_conf(self.conf))
        tp = TopicPartition(topic, partition)
        futures = self._admin.list_offsets(
            {tp: OffsetSpec.latest()},
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=METADATA_TIMEOUT_S,
        )
        return int(futures[tp].result(timeout=METADATA_TIMEOUT_S).offset)

    def _note_delivered(self, record: TimerRecord, writer: TimerWriter) -> None:
        delivered = self._delivered.get(record.partition)
        if delivered is not None:
            key = (record.timer_id, record.producer_group or "")
            delivered.add(*key, writer.landed.get(key))

    # -- records -------------------------------------------------------------------------
    def _dispatch_guarded(self, msg: confluent_kafka.Message, now: int) -> list[Action]:
        """A record's content never raises here (a bad one is set aside or skipped); a bug
        that does is a replay, never a record skipped (its lane would pass it as done)."""
        try:
            return self._dispatch(msg, now)
        except (FatalKafkaError, KafkaOperationError):
            raise
        except Exception as exc:
            log.exception("%s[%s]@%s: could not handle", msg.topic(), msg.partition(), msg.offset())
            raise KafkaOperationError(
                f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: handling failed: {exc!r}"
            ) from exc

    def _dispatch(self, msg: confluent_kafka.Message, now: int) -> list[Action]:
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise FatalKafkaError.wrap("consuming timer records", err)
            eof_partition = msg.partition()
            if err.code() == KafkaError._PARTITION_EOF:
                if msg.topic() == self.topics.timer_cancel and eof_partition is not None:
                    self._loaded(eof_partition)
            else:
                log.warning("timer consumer: %s[%s]: %s", msg.topic(), msg.partition(), err.str())
            return []
        topic, p, offset = topic_of(msg), partition_of(msg), offset_of(msg)
        wheel = self.wheels.get(p)
        if wheel is None:
            return []
        if topic == self.topics.timer_cancel:
            self._on_cancel(msg, topic, p, offset)
            end = self._loading.get(p)
            if end is not None and offset + 1 >= end:
                self._loaded(p)
            return []
        lane = self._lanes[topic]
        if not wheel.wants(lane, offset):
            return []  # fetched past a blocked head: read, parsed and counted on resume
        return wheel.on_record(self._incoming(msg, topic, lane, p, offset, now), now)

    def _loaded(self, p: int) -> None:
        if self._loading.pop(p, None) is not None and p in self.wheels:
            self.wheels[p].ready = True
            log.info("timer partition %d: cancels read (%d held)", p, len(self.cancels[p]))

    def _incoming(
        self, msg: confluent_kafka.Message, topic: str, lane: int, p: int, offset: int, now: int
    ) -> Incoming:
        ts = msg.timestamp()[1]
        raw = (lane, p, offset, ts, msg.key(), msg.value(), headers_of(msg))
        try:
            record = parse_timer(*raw)
        except Exception as exc:  # MalformedRecordError, or anything its content caused
            self.metrics.malformed.labels(topic).inc()
            log.warning("%s[%d]@%d malformed, to be set aside: %s", topic, p, offset, exc)
            return Incoming(lane, offset, ts, problem="malformed", payload=unparsed_timer(*raw))
        problem = self._refusal(record, topic)
        if problem is not None:
            return Incoming(lane, offset, ts, problem=problem, payload=record)
        entry = TimerEntry(
            record.timer_id, record.producer_group or "", record.deliver_at_ms, record
        )
        return Incoming(lane, offset, ts, entry=entry, payload=record)

    def _refusal(self, record: TimerRecord, topic: str) -> str | None:
        """Why ``record`` must be set aside (logged here), or None."""
        reason: str | None = None
        detail = ""
        if is_system_topic(record.real_topic, self.settings.topic_prefix):
            reason, detail = DiscardReason.SYSTEM_TOPIC, f"its real topic {record.real_topic!r}"
        elif record.level == INTAKE and record.exceeds(self.settings.max_delay_ms):
            reason = DiscardReason.TOO_FAR
            detail = (
                f"due {record.deliver_at_ms - record.born_ts} ms after its birth, over "
                f"max_delay_ms={self.settings.max_delay_ms}"
            )
        elif self.guard is not None and (refused := self.guard.judge_timer(record)) is not None:
            reason, detail = refused
        if reason is not None:
            log.warning(
                "%s[%d]@%d id=%s to be set aside as %s: %s",
                topic,
                record.partition,
                record.offset,
                record.timer_id,
                reason,
                detail,
            )
        return None if reason is None else str(reason)

    def _on_cancel(self, msg: confluent_kafka.Message, topic: str, p: int, offset: int) -> None:
        try:
            cancel = decode_timer_cancel(msg.key(), msg.value())
        except Exception as exc:  # MalformedRecordError, or anything its content caused
            self.metrics.malformed.labels(topic).inc()
            log.warning("%s[%d]@%d skipped: %s", topic, p, offset, exc)
            return
        group = cancel.producer_group or ""
        if self.guard is not None:
            refused = self.guard.cancel_refusal(
                topic, p, group, msg.value(), headers_of(msg), offset=offset
            )
            if refused is not None:
                self.metrics.rejected.labels("unauthenticated").inc()
                log.warning(
                    "%s[%d]@%d id=%s rejected: %s", topic, p, offset, cancel.timer_id, refused
                )
                return
        if (cancel.timer_id, group) in self._delivered.get(p, ()):
            self.metrics.timer_cancel_too_late.inc()  # nothing to hold it for
            log.info(
                "%s[%d]@%d id=%s: cancel after its delivery", topic, p, offset, cancel.timer_id
            )
            return
        # Its body's time, which the producer counted from too (the record's own timestamp
        # is the broker's on a cancel topic made with LogAppendTime).
        written = cancel.ts
        refused = self._cancel_refusal(p, offset, written)
        if refused is not None:
            self.metrics.timer_cancels_refused.labels(refused).inc()
            count = self._refused[p] = self._refused.get(p, 0) + 1
            if count == 1 or count % REFUSALS_LOGGED_EVERY == 0:  # a flood logs a few lines
                log.warning(
                    "%s[%d]@%d id=%s not held (%s): over timer_cancels_max=%d in its window, "
                    "or written ahead of this clock; %d refused on this partition so far",
                    topic,
                    p,
                    offset,
                    cancel.timer_id,
                    refused,
                    self.settings.timer_cancels_max,
                    count,
                )
            return
        self.cancels[p].add(cancel.timer_id, group, written)

    def _cancel_refusal(self, p: int, offset: int, written: int) -> str | None:
        """Why the cancel record at ``offset`` of cancel partition ``p`` is not held, or
        None: the producer's recall_message counts the same (TimerWrites.cancel_refusal)."""
        if written > _now_ms() + CANCEL_AHEAD_MS:
            return "future"
        start = cancel_window_start(written, self.settings.max_delay_ms)
        first = self._window_firsts.get((p, start))
        if first is None:
            where = f"looking up {self.topics.timer_cancel}[{p}] at {start}"
            if self._consumer is None:
                raise IllegalStateError("the timer service is not running (call run())")
            try:
                [tp] = self._consumer.offsets_for_times(
                    [TopicPartition(self.topics.timer_cancel, p, start)],
                    timeout=METADATA_TIMEOUT_S,
                )
            except KafkaException as exc:  # a replay
                raise KafkaOperationError.wrap(where, exc.args[0]) from exc
            if tp.error is not None:
                raise KafkaOperationError.wrap(where, tp.error)
            if tp.offset < 0:  # none at or after it yet: this one is the first
                return None
            first = tp.offset
            self._window_firsts[(p, start)] = first
            while len(self._window_firsts) > WINDOWS_KEPT:
                del self._window_firsts[next(iter(self._window_firsts))]
        return "over_bound" if offset - first >= self.settings.timer_cancels_max else None

    def _where(self, action: Action) -> str:
        record = action.payload
        p = record.partition if isinstance(record, TimerRecord) else "?"
        return f"{self.lane_topic(action.lane)}[{p}]@{action.offset}"

    # -- inspection ------------------------------------------------------------------------
    def owned_partitions(self) -> list[int]:
        """Timer partitions this instance owns."""
        return sorted(self.wheels)


def _copartitioning_problem(counts: dict[str, int], intake: str) -> str | None:
    """Why timer topics of these partition counts cannot be served, or None."""
    if len(set(counts.values())) == 1 and counts[intake]:
        return None
    found = {t: n for t, n in counts.items() if n}  # the levels wait for the other two
    return (
        f"the timer topics must have the same partition count, got {found}: add partitions "
        "to the smaller ones (kafka-topics --alter --partitions)"
    )


def _transient(exc: BaseException) -> bool:
    """Retriable, or a topic refused while every broker is fenced (see ``run``)."""
    if is_retriable(exc):
        return True
    err = getattr(exc, "kafka_error", None)
    return isinstance(err, KafkaError) and err.code() == KafkaError.INVALID_REPLICATION_FACTOR


def _discarding(action: Action, reason: str) -> Action:
    return Action(Step.DISCARD, action.lane, action.offset, action.entry, 0, reason, action.payload)
