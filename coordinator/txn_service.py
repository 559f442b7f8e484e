"""The transactional side of the coordinator: owns half/op partition pairs through a
consumer group, feeds records into :class:`PartitionState`, and writes what it decides
with one :class:`TransactionWriter` per promotion set (:mod:`coordinator.promotion_sets`).

Over 500 physical lines only since ``ruff format`` (one argument a line; under 500 as the
layering test counts them), and kept whole: ownership, recovery and the read loop share the
consumer, the partition states and the in-flight batch; promotion (``promote.py``), takeover
(``takeover.py``) and the horizon (``horizon.py``) are modules of their own."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from coordinator.blocked import Blockage, BlockProbe
from coordinator.destinations import Destinations
from coordinator.kafka_txn import transactional_loop
from coordinator.marker_auth import MarkerKey, MarkerVerifier, is_marker
from coordinator.marker_keys import (
    configured_key,
    keys_topic_spec,
    load_verifier,
    tenancy_watermarks,
)
from coordinator.metrics import CoordinatorMetrics, publish_partition_counters
from coordinator.poison import PoisonLedger
from coordinator.promote import TransactionWriter
from coordinator.promotion_sets import PromotionSets, set_transactional_id
from coordinator.settings import CoordinatorSettings
from coordinator.state import EndRequest, PartitionState
from coordinator.takeover import Takeover
from coordinator.tenancy import tenant_guard
from rmq_semantics.clientconf import client_conf, shared_conf
from rmq_semantics.consumed import headers_of, offset_of, partition_of, topic_of
from rmq_semantics.errors import (
    FatalKafkaError,
    IllegalStateError,
    KafkaOperationError,
    MalformedRecordError,
    RmqError,
    TransactionAborted,
)
from rmq_semantics.records import txn as wire
from rmq_semantics.records.codec import SystemRecord, decode
from rmq_semantics.records.half import parse_half, unparsed_half
from rmq_semantics.records.reasons import DiscardReason
from rmq_semantics.retry import retrying
from rmq_semantics.topics import (
    ADMIN_TIMEOUT_S,
    SystemTopics,
    ensure_topics,
    is_system_topic,
    require_copartitioned,
    topic_partition_count,
    txn_topic_specs,
)

__all__ = ["TransactionService", "system_topic_specs"]

log = logging.getLogger(__name__)

# First poll waits this long for a record, so due checks fire at most this late.
POLL_WAIT_S = 0.05
# Records read per step (CoordinatorSettings.max_batch, default 4000), so per Kafka
# transaction at most. A transaction's round trips (AddOffsetsToTxn, TxnOffsetCommit, EndTxn)
# cost the same whatever its size: under load bigger batches amortise them
# (docs/design/measurements.md). Idle, a batch is whatever has arrived. A multi-message
# transaction is promoted once all its members are read, whatever batches they came in.
MAX_BATCH: int = CoordinatorSettings.max_batch  # the default, which the bench copier mirrors
# Fewer records than this read while a commit ran: read again once it has settled.
REREAD_BELOW = 200
# Several promotion sets, none free with work: the consumer is polled this long at a time
# until a commit ends (a record wakes the poll at once; a commit's end cannot).
AWAIT_COMMIT_SLICE_S = 0.002
STARTUP_DEADLINE_S = 120.0
GAUGE_INTERVAL_S = 1.0


def system_topic_specs(settings: CoordinatorSettings) -> dict[str, tuple[int, dict[str, str]]]:
    """The client library's specs (``TransactionProducer.start()`` creates the same)."""
    horizon = check_horizon_ms(settings)
    return {
        **txn_topic_specs(
            SystemTopics(settings.topic_prefix),
            settings.half_partitions,
            settings.check_partitions,
            horizon_ms=horizon,
        ),
        **keys_topic_spec(settings),
    }


def check_horizon_ms(settings: CoordinatorSettings) -> int:
    """The age by which a half message is decided, or discarded as ``check_max``, if its
    producer group answers its checks."""
    return settings.transaction_timeout_ms + settings.check_max * settings.check_interval_ms


def _now_ms() -> int:
    return int(time.time() * 1000)


def trusted_marker(
    verifier: MarkerVerifier | None,
    metrics: CoordinatorMetrics,
    partition: int,
    offset: int,
    record: SystemRecord,
) -> bool:
    """Whether a done or check marker was written by a coordinator; a forged one is counted
    and logged, and the caller ignores it (its transaction stays pending)."""
    if verifier is None:
        raise IllegalStateError("the transaction service is not running (call run())")
    verdict = verifier.verdict(partition, offset, record)
    if verdict.accepted:
        return True
    metrics.forged_markers.labels(verdict.value).inc()
    entries = getattr(record, "entries", None) or [record]
    txns = ",".join(e.txn_id for e in entries[:3]) + (",..." if len(entries) > 3 else "")
    log.warning(
        "%s[%d]@%d txn=%s ignored: %s not written by a coordinator (%s)",
        verifier.op_topic,
        partition,
        offset,
        txns,
        type(record).__name__,
        verdict,
    )
    return False


def new_partition_state(
    partition: int, s: CoordinatorSettings, retention_ms: int | None
) -> PartitionState:
    return PartitionState(
        partition,
        s.transaction_timeout_ms,
        s.check_interval_ms,
        s.check_max,
        retention_ms,
        reappend_horizon_ms=s.reappend_after_ms,
        max_deferred_ends=s.max_deferred_ends,
    )


def reread_half_end(consumer: confluent_kafka.Consumer, topic: str, partition: int) -> None:
    """Seek ``topic[partition]`` to its position: librdkafka reports a partition's end once,
    and a COMMIT waiting for members needs an end read after it (the fetch starts now)."""
    try:
        [tp] = consumer.position([TopicPartition(topic, partition)])
        if tp.offset >= 0:
            consumer.seek(tp)
    except KafkaException as exc:  # asked again a grace period later
        log.warning(
            "%s[%d]: could not read to its end again: %s", topic, partition, exc.args[0].str()
        )


def read_retention(admin: AdminClient, topic: str) -> int | None:
    """``retention.ms`` of ``topic``, None if unlimited or unreadable (then no message is
    discarded for outliving it)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource])[resource].result(ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        log.warning(
            "could not read retention of %s (%s); retention discard is off",
            topic,
            exc.args[0].str(),
        )
        return None
    value = int(configs["retention.ms"].value)
    return None if value < 0 else value


class TransactionService:
    """Half/op partition pairs read, decided and written, through one consumer group.

    Over 300 lines because the rebalance callbacks, the dispatch of every record kind, the
    step and the replay all share one consumer, the partition states and the offsets sent."""

    def __init__(
        self, conf: dict, settings: CoordinatorSettings, metrics: CoordinatorMetrics | None = None
    ) -> None:
        self.conf = dict(conf)
        self.settings = settings
        self.metrics = metrics or CoordinatorMetrics()
        self.topics = SystemTopics(settings.topic_prefix)
        self.instance_id = settings.instance_id or uuid.uuid4().hex[:12]
        # Refused here, before any I/O: security on and no marker key is one clear line.
        self._marker_key = configured_key(settings, self.conf)
        self._markers: MarkerVerifier | None = None
        self.guard = tenant_guard(settings)  # tenant isolation, if a tenants file is given
        self.states: dict[int, PartitionState] = {}
        self.half_partition_count = 0  # read at startup
        self.metrics.check_horizon.set(check_horizon_ms(settings) / 1000)
        self._committed: dict[int, tuple[int, int]] = {}
        self._retention_ms: int | None = None
        # Survives replays: which half records made a Kafka transaction abort, and why.
        self.ledger = PoisonLedger(settings.replay_max)
        self.destinations = Destinations(self._admin_client, self.ledger)
        self.takeover = Takeover(self.metrics.takeover_waiting, lambda: self._stop)
        self._gauges_at = 0.0
        self._admin: AdminClient | None = None
        self._consumer: confluent_kafka.Consumer | None = None
        # The promotion sets' writers, each set's pending actions and the offsets of its last
        # transaction submitted (committed once it settles); and a commit failure met
        # inside a rebalance callback, raised by the next step.
        self._sets: PromotionSets | None = None
        self._settle_error: RmqError | None = None
        self._stop = threading.Event()  # run()'s, once it runs
        self.ready = threading.Event()

    # -- setup ---------------------------------------------------------------------------
    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            raise IllegalStateError("the transaction service is not running (call run())")
        return self._admin

    # -- rebalance -----------------------------------------------------------------------
    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        try:
            self._recover(consumer, partitions)
        except KafkaOperationError as exc:
            # Its partitions have no state: their records are dropped, never committed,
            # until the next step raises this and the loop replays from committed offsets.
            log.warning("transaction service: %s; replaying once the loop runs", exc)
            self._settle_error = self._settle_error or exc

    def _recover(self, consumer: confluent_kafka.Consumer, partitions: list) -> list:
        """Pending state of ``partitions`` rebuilt from their committed offsets (returned)."""
        committed = self.takeover.read(consumer, partitions)
        for tp in committed:
            state = self.states.setdefault(
                tp.partition, new_partition_state(tp.partition, self.settings, self._retention_ms)
            )
            offset = max(tp.offset, 0)
            state.start_at(*((offset, 0) if tp.topic == self.topics.half else (0, offset)))
        for p in {tp.partition for tp in partitions}:
            st = self.states[p]
            self._committed[p] = (st.half_position, st.op_position)
        log.info(
            "assigned half/op partitions %s; recovering their pending state",
            sorted({tp.partition for tp in partitions}),
        )
        return committed

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        self._settle_quietly("a revoke")
        self.takeover.forget(partitions)
        if self._sets is not None:  # decided for partitions lost: never written by us
            self._sets.forget({tp.partition for tp in partitions})
        for p in {tp.partition for tp in partitions}:
            self.states.pop(p, None)
            self._committed.pop(p, None)
            self.ledger.forget_partition(p)
            self.metrics.forget_partition(p)
        log.info("revoked half/op partitions %s", sorted({tp.partition for tp in partitions}))

    # -- records -------------------------------------------------------------------------
    def _dispatch(self, msg: confluent_kafka.Message, now: int) -> list:
        # An error event may name no partition (a client-wide error): no state then.
        topic, partition = msg.topic(), msg.partition()
        state = self.states.get(partition) if partition is not None else None
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF and state is not None:
                if state.recovering and not self._at_end(msg):
                    return []  # an earlier owner's transaction may hide decisions
                return state.on_eof("half" if topic == self.topics.half else "op", now)
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error on %s[%s]: %s", topic, partition, err.str())
            return []
        if state is None:
            return []
        topic, partition, offset = topic_of(msg), partition_of(msg), offset_of(msg)
        if topic == self.topics.half:
            try:
                half = parse_half(
                    partition, offset, msg.timestamp()[1], msg.key(), msg.value(), headers_of(msg)
                )
            except MalformedRecordError as exc:
                return self._set_aside_malformed(state, msg, exc, now)
            if is_system_topic(half.real_topic, self.settings.topic_prefix):
                return state.on_poison_half(offset, half, DiscardReason.SYSTEM_TOPIC, now)
            if self.guard and (refused := self.guard.judge_half(half, topic)) is not None:
                return state.on_poison_half(offset, half, refused[0], now, refused[1])
            return state.on_half(offset, half, now)
        try:
            record = decode(msg.value())
        except MalformedRecordError as exc:
            self.metrics.malformed.labels(topic).inc()
            log.warning("%s[%s]@%s skipped: %s", topic, partition, offset, exc)
            state.on_malformed_op(offset)
            return []
        if self.guard and not self.guard.trusted_end(msg, record, self.metrics.rejected):
            state.on_malformed_op(offset)
            return []
        if isinstance(record, wire.EndRequest):
            return self._on_end(
                state,
                offset,
                record.half_partition,
                EndRequest(
                    offset,
                    record.txn_id,
                    record.producer_group,
                    record.half_offset,
                    record.state,
                    record.from_check,
                    record.check_seq,
                    now,
                ),
                now,
            )
        if isinstance(record, wire.EndRequests):
            group, half_partition = record.producer_group, record.half_partition
            actions: list = []
            for entry in record.entries:
                actions.extend(
                    self._on_end(
                        state,
                        offset,
                        half_partition,
                        EndRequest(
                            offset,
                            entry.txn_id,
                            group,
                            entry.half_offset,
                            entry.state,
                            False,
                            0,
                            now,
                        ),
                        now,
                    )
                )
            return actions
        if is_marker(record) and not trusted_marker(
            self._markers, self.metrics, partition, offset, record
        ):
            state.on_malformed_op(offset)
            return []
        if not state.on_op_marker(offset, record):
            self.metrics.malformed.labels(topic).inc()
            log.warning(
                "%s[%s]@%s skipped: %s does not belong on the op topic",
                topic,
                partition,
                offset,
                type(record).__name__,
            )
            state.on_malformed_op(offset)
        return []

    def _at_end(self, msg: confluent_kafka.Message) -> bool:
        topic, partition = topic_of(msg), partition_of(msg)
        tp = TopicPartition(topic, partition)
        high = self._consumer.get_watermark_offsets(tp, cached=True) if self._consumer else None
        return self.takeover.at_end(topic, partition, offset_of(msg), high[1] if high else -1)

    def _dispatch_guarded(self, msg: confluent_kafka.Message, now: int) -> list:
        """Any exception from one record's handling makes it a poison record (set aside
        or skipped, counted, logged), never a process exit."""
        try:
            return self._dispatch(msg, now)
        except Exception as exc:  # an input (or a bug) nobody foresaw
            partition = msg.partition()
            state = self.states.get(partition) if partition is not None else None
            if state is None or msg.error() is not None:
                log.exception(
                    "%s[%s]: could not handle a consumer event", msg.topic(), msg.partition()
                )
                return []
            if msg.topic() == self.topics.half:
                return self._set_aside_malformed(state, msg, exc, now)
            self.metrics.malformed.labels(msg.topic()).inc()
            log.warning("%s[%s]@%s skipped: %r", msg.topic(), msg.partition(), msg.offset(), exc)
            state.on_malformed_op(offset_of(msg))
            return []

    def _set_aside_malformed(
        self, state: PartitionState, msg: confluent_kafka.Message, exc: Exception, now: int
    ) -> list:
        topic, partition, offset = topic_of(msg), partition_of(msg), offset_of(msg)
        self.metrics.malformed.labels(topic).inc()
        half = unparsed_half(
            partition, offset, msg.timestamp()[1], msg.key(), msg.value(), headers_of(msg)
        )
        log.warning(
            "%s[%s]@%s txn=%s malformed, to be set aside: %s",
            topic,
            partition,
            offset,
            half.txn_id or "?",
            exc,
        )
        return state.on_poison_half(offset, half, DiscardReason.MALFORMED, now)

    def _on_end(
        self, state: PartitionState, offset: int, half_partition: int, request: EndRequest, now: int
    ) -> list:
        where = f"{self.topics.op}[{state.partition}]@{offset}"
        if half_partition != state.partition:
            self.metrics.rejected.labels("wrong_partition").inc()
            log.warning(
                "%s txn=%s rejected: names half partition %d", where, request.txn_id, half_partition
            )
            state.on_malformed_op(offset)
            return []
        # A COMMIT to a missing topic is discarded when the batch is vetted, in any order.
        return state.on_end_request(request, now)

    def _publish_counters(self) -> None:
        # The oldest-pending age scans every pending entry: once a second is fresh enough.
        if age_due := time.monotonic() - self._gauges_at >= GAUGE_INTERVAL_S:
            self._gauges_at = time.monotonic()
        publish_partition_counters(self.metrics, self.topics, self.states, age_due)

    def committed_offsets(self, partition: int) -> tuple[int, int] | None:
        """(half, op) offsets last committed for ``partition`` by this instance."""
        return self._committed.get(partition)

    def _offsets(self, sets: PromotionSets, k: int) -> tuple[list[TopicPartition], bool]:
        """Offsets to commit for every owned partition of set ``k``, and whether any moved
        (each set commits its own partitions' offsets only)."""
        changed, out = False, []
        sent = sets.sent[k]
        for p, state in self.states.items():
            if sets.set_of(p) != k:
                continue
            pair = (state.half_commit, state.op_commit)
            changed |= sent.get(p, self._committed.get(p)) != pair
            out.append(TopicPartition(self.topics.half, p, pair[0]))
            out.append(TopicPartition(self.topics.op, p, pair[1]))
        return out, changed

    def _replay(self, consumer: confluent_kafka.Consumer, sets: PromotionSets) -> None:
        """After an aborted transaction (of any set) or a failed step: every set's commit in
        flight settles, then all state is re-read from the committed offsets."""
        self._settle_quietly("a replay")
        self._settle_error = None  # this replay is what it asked for
        sets.prepare()
        self.states.clear()
        self._committed.clear()
        sets.clear()
        try:
            assignment = consumer.assignment()
            if not assignment:
                return
            for tp in self._recover(consumer, assignment):  # raises: replayed again
                offset = tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        except KafkaException as exc:  # the loop pauses and replays again
            raise KafkaOperationError.wrap("replaying from committed offsets", exc.args[0]) from exc

    # -- main loop -----------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set; the transaction in progress always completes."""
        self._stop = stop
        # A broker that is still starting is waited for; a wrong setting fails at once.
        for attempt in retrying(STARTUP_DEADLINE_S, stop):
            with attempt:
                specs = system_topic_specs(self.settings)
                ensure_topics(
                    self.conf,
                    {**specs, **(self.guard.topic_specs(specs) if self.guard else {})},
                    replicated=True,
                    replication_factor=self.settings.system_replication_factor,
                )
                if self.guard:
                    self.guard.watermarks(
                        tenancy_watermarks(self.conf, self.settings, self.instance_id)
                    )
                markers = load_verifier(
                    self.conf, self.settings, self._marker_key, self.instance_id
                )
                self._markers = markers
        self.half_partition_count = require_copartitioned(
            self.conf, self.topics.half, self.topics.op
        )
        self._admin = AdminClient(shared_conf(self.conf))
        self._retention_ms = read_retention(self._admin, self.topics.half)
        sets = PromotionSets(self._writers(markers.key))
        self._sets = sets
        sets.start(stop)
        consumer = confluent_kafka.Consumer(
            client_conf(
                self.conf,
                who="coordinator",
                forced={
                    "group.id": self.topics.coordinator_group,
                    # Range assignment gives half p and op p to the same member: classic protocol.
                    "group.protocol": "classic",
                    "partition.assignment.strategy": "range",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    # End requests are latency-critical: no fetch lingers when data is there.
                    "fetch.wait.max.ms": 10,
                },
            )
        )
        self._consumer = consumer
        consumer.subscribe(
            [self.topics.half, self.topics.op],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        self.ready.set()
        log.info(
            "transaction service %s running (prefix %s, promotion sets %d)",
            self.instance_id,
            self.settings.topic_prefix,
            len(sets),
        )
        try:
            transactional_loop(
                "transaction service",
                lambda: self._step(consumer, sets),
                lambda: self._replay(consumer, sets),
                stop,
            )
        finally:
            # The transaction in flight completes before the consumer leaves the group.
            try:
                self._settle_quietly("shutdown")
            finally:
                consumer.close()
                sets.close()
            log.info("transaction service %s stopped", self.instance_id)

    def _writers(self, marker_key: MarkerKey) -> list[TransactionWriter]:
        """One writer per promotion set, each with its own transactional ids (rule 8 of
        docs/design/contract.md); one Blockage, as one promotion_blocked gauge."""
        base = f"{self.topics.coordinator_group}-{self.instance_id}"
        blockage = Blockage(BlockProbe(self._admin_client), self.metrics.promotion_blocked)
        check_partitions = topic_partition_count(self.conf, self.topics.check) or 0
        count = self.settings.promotion_sets
        return [
            TransactionWriter(
                self.conf,
                self.topics,
                set_transactional_id(base, k, count),
                self.metrics,
                self.ledger,
                marker_key=marker_key,
                unwritable=self.destinations.unwritable,
                blockage=blockage,
                check_partitions=check_partitions,
                stale=self.destinations.stale,
                guard=self.guard,
            )
            for k in range(count)
        ]

    def _step(self, consumer: confluent_kafka.Consumer, sets: PromotionSets) -> None:
        """One batch: read and decide it while the sets' transactions commit, then write each
        free set's decisions as its next transaction. A set whose commit is still running
        keeps what it decided for a later step. If any commit fails, the replay forgets
        every set's decisions."""
        self._raise_settle_error()
        # With a commit in flight, take what is there and go wait for the commit.
        waited = sets.in_flight
        most = self.settings.max_batch
        actions, read = self._read(consumer, most, 0 if waited else POLL_WAIT_S)
        sets.route(actions)
        if waited:
            self._settle_done(sets)
            if len(sets) > 1:
                read += self._await_commit(consumer, sets, most - read)
            else:  # one set: wait for its commit, as one writer always did
                sets.wait_first()
                self._settle_done(sets)
            if read < REREAD_BELOW:
                # What arrived meanwhile joins this transaction, not one a whole commit later
                # (a light load; under a heavy one, reading now would not overlap any commit).
                sets.route(self._read(consumer, most - read, 0)[0])
        now = _now_ms()
        for state in self.states.values():
            sets.route(state.due(now))
            if state.wants_half_end(now):
                reread_half_end(consumer, self.topics.half, state.partition)
        self._publish_counters()
        metadata = None
        for k, writer in enumerate(sets.writers):
            if writer.in_flight:
                continue
            # Vetted first: a promotion set aside may move its partition's offsets.
            actions, sets.pending[k] = sets.pending[k], []
            actions = self.destinations.vet(actions, self.states) if actions else actions
            offsets, moved = self._offsets(sets, k)
            if not actions and not moved:
                continue
            metadata = metadata or consumer.consumer_group_metadata()
            writer.submit(actions, offsets, metadata)
            sets.sent[k] = {
                p: (state.half_commit, state.op_commit)
                for p, state in self.states.items()
                if sets.set_of(p) == k
            }

    def _await_commit(
        self, consumer: confluent_kafka.Consumer, sets: PromotionSets, most: int
    ) -> int:
        """Several sets and none free with work: read in short slices until a set is (a
        record for an idle set) or a commit ends. Returns the records read."""
        read = 0
        while read < most and not sets.free_with_work():
            if not any(w.in_flight for w in sets.writers):
                break
            if any(w.in_flight and w.commit_done for w in sets.writers):
                self._settle_done(sets)
                break
            actions, n = self._read(consumer, most - read, AWAIT_COMMIT_SLICE_S)
            sets.route(actions)
            read += n
        return read

    def _read(
        self, consumer: confluent_kafka.Consumer, most: int, wait_s: float
    ) -> tuple[list, int]:
        """Up to ``most`` records (waiting ``wait_s`` for the first), dispatched."""
        first = consumer.poll(wait_s)
        self._raise_settle_error()
        msgs = [first, *consumer.consume(most - 1, 0)] if first is not None else []
        now = _now_ms()
        return [a for msg in msgs for a in self._dispatch_guarded(msg, now)], len(msgs)

    def _settle(self, sets: PromotionSets, k: int) -> None:
        """Wait for set ``k``'s transaction in flight; its offsets are then the committed ones."""
        sets.writers[k].settle()
        self._committed.update(sets.sent[k])

    def _settle_done(self, sets: PromotionSets) -> None:
        """Settle every set whose commit has ended (or wedged), waiting for none."""
        for k, writer in enumerate(sets.writers):
            if writer.in_flight and writer.commit_done:
                self._settle(sets, k)

    def _settle_all(self, sets: PromotionSets) -> None:
        """Wait for every set's transaction in flight; the first failure is raised once all
        have settled."""
        failure: RmqError | None = None
        for k, writer in enumerate(sets.writers):
            if not writer.in_flight:
                continue
            try:
                self._settle(sets, k)
            except FatalKafkaError:
                raise
            except (TransactionAborted, KafkaOperationError) as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _settle_quietly(self, why: str) -> None:
        """Wait for every set's commit in flight before the partitions or the offsets they
        cover change hands (a revoke, a replay). A failure is kept for the loop, which
        replays."""
        sets = self._sets
        if sets is None or not sets.in_flight:
            return
        try:
            self._settle_all(sets)
        except FatalKafkaError:
            raise
        except (TransactionAborted, KafkaOperationError) as exc:
            log.warning("transaction service: the transaction in flight at %s failed: %s", why, exc)
            self._settle_error = self._settle_error or exc

    def _raise_settle_error(self) -> None:
        error, self._settle_error = self._settle_error, None
        if error is not None:
            raise error
