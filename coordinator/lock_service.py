"""The queue-lock service: RocketMQ's broker-side ``RebalanceLockManager`` on Kafka.

Clients (:class:`rmq_semantics.lock_client.LockClient`) write batch lock/unlock requests
to ``<prefix>_lock_request``, partitioned by the lock key ``group/topic/partition``. The
service instances form one consumer group (``<prefix>_lock_coordinator``) over that topic,
so several instances split the partitions. The owner of request partition p keeps the
lock table of every key in p; the table is persisted in the compacted ``<prefix>_lock``
topic, partition p, so a restarted or new owner continues with the same locks and the
epochs keep growing. For each batch of requests the owner writes, in ONE Kafka
transaction, the changed lock entries, one reply per request to ``<prefix>_lock_reply``
(the partition the client named) and its consumer offsets
(``send_offsets_to_transaction`` with the group metadata). A zombie owner is therefore
fenced: its transaction fails once the group has moved on, and its replies, never
committed, are invisible to the clients (who read replies ``read_committed``).

Takeover of a partition: wait for stable committed offsets (librdkafka asks for them when
``isolation.level=read_committed``; a zombie's pending transaction resolves first), read
the lock topic partition to its end, past every transaction open there at the takeover
(:mod:`coordinator.lock_rebuild`), then resume consuming requests. Held leases are
extended to a full lease from the takeover (see :meth:`LockTable.restore`).


The batch's decisions are :mod:`coordinator.lock_requests`; the group, topics and clients
:mod:`coordinator.lock_clients`."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import Counter
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition

from coordinator.kafka_txn import (
    TRANSACTION_TIMEOUT_MS,
    TXN_CALL_TIMEOUT_S,
    CommitThread,
    KafkaTransactions,
    transactional_loop,
)
from coordinator.lock import (
    LeaseCeiling,
    LockTable,
    RequestPoison,
)
from coordinator.lock_auth import lock_guard
from coordinator.lock_clients import (
    LockClients,
    lock_coordinator_group,
    lock_topic_specs,
    open_clients,
)
from coordinator.lock_rebuild import read_tables
from coordinator.lock_requests import Partitions, answer
from coordinator.settings import CoordinatorSettings
from rmq_semantics.consumed import offset_of, partition_of
from rmq_semantics.errors import (
    ConfigError,
    FatalKafkaError,
    KafkaOperationError,
    TransactionAborted,
)
from rmq_semantics.records.codec import encode
from rmq_semantics.records.locks import LockReply
from rmq_semantics.retry import retrying
from rmq_semantics.topics import SystemTopics, ensure_topics, topic_partition_count

__all__ = ["LockService", "lock_coordinator_group", "lock_topic_specs"]

log = logging.getLogger(__name__)

# First wait for a request; bounds how late a stop flag or a rebuild is noticed.
POLL_WAIT_S = 0.05
MAX_BATCH = 500
# A broker that is still starting is waited for this long at startup.
STARTUP_DEADLINE_S = 60.0
# Stable committed offsets wait for a zombie's pending transaction (<= its timeout).
COMMITTED_TIMEOUT_S = 2 * TRANSACTION_TIMEOUT_MS / 1000
# How long close() from another thread waits for run() to finish its transaction.
CLOSE_TIMEOUT_S = TXN_CALL_TIMEOUT_S + 5


def _now_ms() -> int:
    return int(time.time() * 1000)


class LockService:
    """Owns request partitions through a consumer group and answers lock requests.

    ``conf`` holds ``bootstrap.servers`` and any security settings; they are passed to
    every client untouched. ``run(stop)`` blocks until ``stop`` is set; ``close()`` is
    idempotent. ``metrics`` (optional) is a :class:`coordinator.metrics.CoordinatorMetrics`.

    Over 300 lines because ownership, takeover, the batch step, its one transaction and
    the poison handling of its requests share the clients, tables and in-flight partitions.
    """

    def __init__(self, conf: dict, settings: CoordinatorSettings, *, metrics: Any = None) -> None:
        if not isinstance(conf, dict) or "bootstrap.servers" not in conf:
            raise ConfigError("LockService conf must be a dict with 'bootstrap.servers'")
        self.conf = dict(conf)
        self.settings = settings
        self.metrics = metrics
        self.topics = SystemTopics(settings.topic_prefix)
        self.instance_id = settings.instance_id or uuid.uuid4().hex[:12]
        self.group = lock_coordinator_group(settings.topic_prefix)
        self.transactional_id = f"{self.group}-{self.instance_id}"
        #: Set once the service is consuming requests (tests and health checks wait on it).
        self.ready = threading.Event()
        #: Counters: requests, granted, renewed, taken_over, denied, released, malformed, ...
        self.counts: Counter[str] = Counter()
        self._tables: dict[int, LockTable] = {}
        self._assigned: set[int] = set()
        self._unready: set[int] = set()
        self._in_flight: set[int] = set()  # partitions of the batch being processed
        self._poison = RequestPoison(settings.replay_max)  # survives replays
        self._lease = LeaseCeiling(settings.lock_lease_ms)
        self._guard = lock_guard(settings)  # tenant isolation: requests signed per group
        self._request_partitions = 0
        self._reply_partitions = 0
        self._c: LockClients | None = None
        self._halt = threading.Event()
        self._finished = threading.Event()
        self._finished.set()
        self._state_lock = threading.Lock()
        self._runner: threading.Thread | None = None
        self._closed = False
        self._committer = CommitThread(name="rmq-lock-commit")

    # -- lifecycle -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Start, answer requests until ``stop`` is set, then release everything."""
        with self._state_lock:
            if self._closed:
                raise ConfigError("LockService.run: the service is closed; make a new one")
            self._runner = threading.current_thread()
            self._finished.clear()
        try:
            self._startup(stop)
            log.info(
                "lock service %s running (prefix %s, %d request partitions)",
                self.instance_id,
                self.settings.topic_prefix,
                self._request_partitions,
            )
            self.ready.set()
            transactional_loop("lock service", self._step, self._replay, stop, self._halt)
        finally:
            self.ready.clear()
            self._close_clients()
            self._finished.set()
            log.info("lock service %s stopped", self.instance_id)

    def close(self) -> None:
        """Stop (after the transaction in progress) and release the clients. Idempotent."""
        self._halt.set()
        runner = self._runner
        if (
            runner is not None
            and runner is not threading.current_thread()
            and not self._finished.wait(CLOSE_TIMEOUT_S)
        ):
            log.warning(
                "lock service %s did not stop within %.0f s", self.instance_id, CLOSE_TIMEOUT_S
            )
            return
        self._close_clients()

    def _close_clients(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            clients, self._c = self._c, None
        self._committer.close(timeout=0)  # idle by now: run() waits for each commit
        if clients is None:
            return
        for client in (clients.consumer, clients.reader):
            try:
                client.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing lock-service consumer: %s", exc)
        clients.txn.close()

    def _clients(self) -> LockClients:
        if self._c is None:
            raise KafkaOperationError("the lock service is not running (call run())")
        return self._c

    def __enter__(self) -> LockService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- startup ---------------------------------------------------------------------------
    def _startup(self, stop: threading.Event) -> None:
        for attempt in retrying(STARTUP_DEADLINE_S, stop):
            with attempt:
                ensure_topics(
                    self.conf,
                    lock_topic_specs(self.settings),
                    replicated=True,
                    replication_factor=self.settings.system_replication_factor,
                )
        requests = topic_partition_count(self.conf, self.topics.lock_request)
        state = topic_partition_count(self.conf, self.topics.lock)
        replies = topic_partition_count(self.conf, self.topics.lock_reply)
        if not requests or requests != state or not replies:
            raise ConfigError(
                f"{self.topics.lock_request} has {requests} partitions and {self.topics.lock} "
                f"has {state}; they must be co-partitioned (same count) — delete and recreate "
                "them with the same half_partitions"
            )
        if requests != self.settings.half_partitions:
            log.warning(
                "%s has %d partitions (half_partitions=%d); using %d",
                self.topics.lock_request,
                requests,
                self.settings.half_partitions,
                requests,
            )
        self._request_partitions, self._reply_partitions = requests, replies
        clients = open_clients(self.conf, self.group, self.transactional_id, stop)
        with self._state_lock:
            self._c = clients
        clients.consumer.subscribe(
            [self.topics.lock_request],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )

    # -- partition ownership (called from inside consume()) ---------------------------------
    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        consumer.assign(partitions)
        if partitions:
            consumer.pause(partitions)  # until the lock table of each is rebuilt
        for tp in partitions:
            self._assigned.add(tp.partition)
            self._unready.add(tp.partition)
        log.info(
            "lock service %s assigned request partitions %s",
            self.instance_id,
            sorted(tp.partition for tp in partitions),
        )

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        # Between transactions by construction: consume() is only called outside one.
        for tp in partitions:
            self._assigned.discard(tp.partition)
            self._unready.discard(tp.partition)
            self._tables.pop(tp.partition, None)
        log.info(
            "lock service %s gave up request partitions %s",
            self.instance_id,
            sorted(tp.partition for tp in partitions),
        )

    def _rebuild(self) -> None:
        """Load the lock tables of the partitions just taken over, then resume them."""
        clients = self._clients()
        parts = sorted(self._unready)
        request_tps = [TopicPartition(self.topics.lock_request, p) for p in parts]
        try:
            committed = clients.consumer.committed(request_tps, timeout=COMMITTED_TIMEOUT_S)
        except KafkaException as exc:
            raise KafkaOperationError.wrap(
                "reading committed request offsets", exc.args[0]
            ) from exc
        tables, loaded = read_tables(
            clients.reader, self.topics.lock, parts, self.settings.lock_lease_ms, self._count
        )
        for tp in committed:
            if tp.partition in self._unready:
                self._tables[tp.partition] = tables[tp.partition]
                # Replay exactly from the committed offset (matters after an abort).
                start = TopicPartition(
                    tp.topic,
                    tp.partition,
                    tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING,
                )
                try:
                    clients.consumer.seek(start)
                except KafkaException as exc:  # not fetching yet: it starts there anyway
                    log.debug(
                        "seek %s[%d]@%d: %s",
                        tp.topic,
                        tp.partition,
                        start.offset,
                        exc.args[0].str(),
                    )
                self._unready.discard(tp.partition)
        clients.consumer.resume(request_tps)
        log.info(
            "lock service %s took over partitions %s with %d lock records",
            self.instance_id,
            parts,
            loaded,
        )

    # -- the main loop ---------------------------------------------------------------------
    def _step(self) -> None:
        if self._unready:
            self._rebuild()
        try:
            msgs = self._clients().consumer.consume(MAX_BATCH, POLL_WAIT_S)
        except KafkaException as exc:
            raise KafkaOperationError.wrap("consuming lock requests", exc.args[0]) from exc
        batch = []
        for msg in msgs:
            if (err := msg.error()) is not None:
                if err.fatal():
                    raise FatalKafkaError.wrap("consuming lock requests", err)
                log.warning("lock request consumer: %s", err.str())
                continue
            p = msg.partition()
            if p in self._assigned and p not in self._unready:
                batch.append(msg)
        # After an abort, its requests go one per transaction: the one that fails is found.
        alone = self._poison.suspect([(partition_of(m), offset_of(m)) for m in batch])
        for part in [[m] for m in batch] if alone else [batch] if batch else []:
            self._in_flight = {partition_of(msg) for msg in part}
            self._process(part)
            self._in_flight = set()

    def _process(self, batch: list) -> None:
        answered = answer(
            batch,
            self._tables,
            Partitions(self._request_partitions, self._reply_partitions),
            self._lease,
            self._poison,
            _now_ms(),
            self._count,
            self._guard,
        )
        offsets = [
            TopicPartition(self.topics.lock_request, p, off + 1)
            for p, off in sorted(answered.last_offsets.items())
        ]
        requests = [(m.partition(), m.offset()) for m in batch]
        self._write(answered.staged, answered.replies, offsets, requests)
        for p, table in answered.staged.items():
            if p in self._tables:
                self._tables[p].absorb(table)

    def _write(
        self,
        staged: dict[int, LockTable],
        replies: list[tuple[int, LockReply]],
        offsets: list[TopicPartition],
        requests: list[tuple[int, int]],
    ) -> None:
        """One transaction: state changes, replies, offsets (TransactionAborted: replay,
        and ``requests`` are suspects: see :meth:`_blame`)."""
        clients = self._clients()
        txn = clients.txn
        try:
            with txn.body() as producer:
                for p, table in staged.items():
                    for entry in table:
                        producer.produce(
                            self.topics.lock, encode(entry), key=entry.key.record_key(), partition=p
                        )
                for partition, reply in replies:
                    producer.produce(
                        self.topics.lock_reply,
                        encode(reply),
                        key=reply.client_id.encode(),
                        partition=partition,
                    )
            # On its own thread: librdkafka's send_offsets_to_transaction can wait for ever
            # for a group coordinator that left (#5456, #5511), and a frozen lock service
            # freezes every orderly consumer's renewals.
            commit = self._committer.submit(
                txn.finish, offsets, clients.consumer.consumer_group_metadata()
            )
            if not self._committer.wait(commit, txn):
                self._abandon(txn)
                raise TransactionAborted(
                    f"a call stuck for {txn.stuck_for():.0f} s was abandoned; "
                    "the transactional producer was re-created"
                )
            commit.result()
        except TransactionAborted as exc:
            if txn.abandoned:  # the broker's fault, not the requests': no poison suspects
                raise
            self._count("aborted")
            if (poison := self._poison.failed(requests)) is not None:
                self._count("poison")
                log.warning(
                    "%s[%d]@%d lock request set aside, not answered: its transaction "
                    "failed %d times alone (%s)",
                    self.topics.lock_request,
                    *poison,
                    self.settings.replay_max,
                    exc,
                )
            raise
        self._poison.passed(requests)

    def _abandon(self, txn: KafkaTransactions) -> None:
        """Swap ``txn`` (stuck in a call) for its successor and the commit thread it holds
        for a new one; the successor's init, before the replay reads, fences the stuck one."""
        self._count("abandoned")
        successor = txn.abandon()
        with self._state_lock:
            if self._c is not None:
                self._c = dataclasses.replace(self._c, txn=successor)
        self._committer.close(timeout=0)
        self._committer = CommitThread(name="rmq-lock-commit")

    def _replay(self) -> None:
        """After an abort or a failed step: the partitions of the batch in flight go back to
        their committed state (tables rebuilt from the lock topic, requests re-read from the
        committed offsets)."""
        self._clients().txn.ensure_initialised()  # a re-created producer, before any read
        replay = sorted(self._in_flight & self._assigned)
        self._in_flight = set()
        if replay:
            log.info(
                "lock service %s replays request partitions %s from committed offsets",
                self.instance_id,
                replay,
            )
            self._clients().consumer.pause(
                [TopicPartition(self.topics.lock_request, p) for p in replay]
            )
            self._unready.update(replay)

    def _count(self, event: str) -> None:
        self.counts[event] += 1
        family = getattr(self.metrics, "lock_events", None)
        if family is not None:
            family.labels(event).inc()

    # -- inspection ------------------------------------------------------------------------
    @property
    def request_partitions(self) -> int:
        """The lock-request topic's partition count (0 until started)."""
        return self._request_partitions

    def owned_partitions(self) -> list[int]:
        """Request partitions this instance owns and serves."""
        return sorted(self._assigned - self._unready)
